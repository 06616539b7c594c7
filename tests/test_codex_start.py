"""How spawnkit starts Codex: its native binary, not its npm launcher (a node start on every
run), and in a run that reaches no TLS host, without loading the system's certificate roots."""

from __future__ import annotations

import dataclasses
import platform
import subprocess
from pathlib import Path

import pytest

from spawnkit.notebook.hub import with_runtime
from spawnkit.runtimes.codex_native import PLATFORM_PACKAGES, native_codex, native_codex_acp

from .conftest import PROCESS_NAMES, REPO, shell_output

LAUNCHER = REPO / "node_modules" / ".bin" / "codex"
installed = pytest.mark.skipif(
    not LAUNCHER.exists(), reason="the node CLIs are not installed (npm ci)"
)
TARGET = PLATFORM_PACKAGES.get((platform.system(), platform.machine()))


def layout(root: Path, *, binary_under: Path | None) -> Path:
    """An npm install of the launcher under ``root``; the native binary under
    ``binary_under`` (a platform package folder), if any. The launcher's path."""
    launcher = root / "node_modules" / "@openai" / "codex" / "bin" / "codex.js"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("#!/usr/bin/env node\n")
    if binary_under is not None:
        assert TARGET is not None
        binary = binary_under / "vendor" / TARGET[1] / "bin" / "codex"
        binary.parent.mkdir(parents=True)
        binary.write_text("native")
    return launcher


@installed
def test_the_installed_launcher_leads_to_the_same_codex_natively() -> None:
    native = native_codex(LAUNCHER)
    assert native is not None
    assert native.binary.read_bytes()[:4] == b"\x7fELF"
    assert native.package_root == (REPO / "node_modules" / "@openai" / "codex").resolve()
    versions = [
        subprocess.run([str(cli), "--version"], capture_output=True, text=True, timeout=60)
        for cli in (LAUNCHER, native.binary)
    ]
    assert versions[0].returncode == versions[1].returncode == 0
    assert versions[0].stdout == versions[1].stdout and "codex-cli" in versions[0].stdout


@pytest.mark.skipif(TARGET is None, reason="no Codex platform package for this machine")
def test_the_nearest_platform_package_wins_as_in_node(tmp_path: Path) -> None:
    assert TARGET is not None
    hoisted = tmp_path / "node_modules" / "@openai" / TARGET[0]
    launcher = layout(tmp_path, binary_under=hoisted)
    found = native_codex(launcher)
    assert found is not None and found.binary == hoisted / "vendor" / TARGET[1] / "bin" / "codex"
    nested = launcher.parent.parent / "node_modules" / "@openai" / TARGET[0]
    (nested / "vendor" / TARGET[1] / "bin").mkdir(parents=True)
    (nested / "vendor" / TARGET[1] / "bin" / "codex").write_text("nested")
    native_codex.cache_clear()  # looked up once per path, as a failed run's reset does
    found = native_codex(launcher)
    assert found is not None and found.binary.read_text() == "nested"
    assert found.env() == {
        "CODEX_MANAGED_PACKAGE_ROOT": str(launcher.resolve().parent.parent),
        "CODEX_MANAGED_BY_NPM": "1",
    }


def test_without_a_platform_package_the_launcher_is_run(tmp_path: Path) -> None:
    launcher = layout(tmp_path, binary_under=None)
    assert native_codex(launcher) is None
    # A codex that is not the npm launcher (a native install, a wrapper) is run as it is.
    other = tmp_path / "bin" / "codex"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\n")
    assert native_codex(other) is None


@installed
@pytest.mark.e2e
async def test_a_codex_run_has_no_node_process(make_butler, store) -> None:
    butler = with_runtime(make_butler(), "codex")
    seen = (await shell_output(butler, store, PROCESS_NAMES)).split()
    assert "codex" in seen, seen
    assert "node" not in seen, f"the npm launcher ran: {seen}"


# Codex's own environment (its shell command's parent) and the command's own.
ROOTS_PROBE = (
    "tr '\\0' '\\n' < /proc/$PPID/environ | grep '^SSL_CERT_FILE=' || echo codex:none; "
    'echo "tool:${SSL_CERT_FILE:-none}"'
)


@installed
@pytest.mark.e2e
@pytest.mark.parametrize("network", ["model-only", "host"])
async def test_codex_loads_no_roots_where_it_reaches_no_tls_host(
    make_butler, store, network: str
) -> None:
    butler = make_butler()
    butler = dataclasses.replace(
        butler, sandbox=dataclasses.replace(butler.sandbox, network=network)
    )
    seen = await shell_output(with_runtime(butler, "codex"), store, ROOTS_PROBE)
    assert "tool:none" in seen, "the shell's commands keep the system's roots"
    if network == "model-only":
        assert "SSL_CERT_FILE=" in seen and "trust-nothing.pem" in seen, seen
    else:
        assert "codex:none" in seen, seen


@installed
@pytest.mark.e2e
async def test_a_codex_acp_run_has_no_node_process(make_butler, store) -> None:
    launcher = REPO / "node_modules" / ".bin" / "codex-acp"
    assert native_codex_acp(launcher) is not None, "Zed's platform package is installed"
    butler = make_butler(extra='[butler.runtime]\ntype = "acp"\ncommand = ["codex-acp"]\n')
    seen = (await shell_output(butler, store, PROCESS_NAMES)).split()
    assert "codex-acp" in seen, seen
    assert "node" not in seen, f"Zed's npm launcher ran: {seen}"
