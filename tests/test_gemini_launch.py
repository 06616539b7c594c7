"""A headless Gemini run starts the node process the CLI would relaunch itself into."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from spawnkit.config.roster import load_roster
from spawnkit.notebook.hub import with_runtime
from spawnkit.runtimes.base import RunSpec
from spawnkit.runtimes.gemini import GeminiAdapter
from spawnkit.runtimes.gemini_launch import direct_command, half_memory_mb

from .conftest import PROCESS_NAMES, REPO, shell_output

GEMINI = REPO / "node_modules" / ".bin" / "gemini"
installed = pytest.mark.skipif(
    not GEMINI.exists(), reason="the node CLIs are not installed (npm ci)"
)


@installed
def test_the_direct_command_is_the_same_cli() -> None:
    direct = direct_command(GEMINI, os.environ["PATH"])
    assert direct is not None
    node, memory, script = direct
    assert Path(node).name == "node" and script == str(GEMINI.resolve())
    assert memory == f"--max-old-space-size={half_memory_mb()}"
    env = {**os.environ, "GEMINI_CLI_NO_RELAUNCH": "true"}
    versions = [
        subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        for argv in ([str(GEMINI), "--version"], [*direct, "--version"])
    ]
    assert versions[0].returncode == versions[1].returncode == 0
    assert versions[0].stdout == versions[1].stdout and versions[0].stdout.strip()


def test_a_cli_that_is_not_a_node_script_or_without_node_is_run_as_it_is(tmp_path: Path) -> None:
    binary = tmp_path / "gemini"
    binary.write_text("#!/bin/sh\n")
    assert direct_command(binary, os.environ["PATH"]) is None
    script = tmp_path / "gemini.js"
    script.write_text("")
    assert direct_command(script, str(tmp_path / "no-node-here")) is None


def test_the_tui_keeps_its_relaunch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A node script by name (so a headless run would start it directly) that sh runs.
    fake = tmp_path / "gemini.js"
    fake.write_text('#!/bin/sh\nenv > "$0.env"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("SPAWNKIT_GEMINI_CLI", str(fake))
    butler = load_roster(REPO / "roster")["health"]
    adapter = GeminiAdapter(dataclasses.replace(butler.runtime, type="gemini"))
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    spec = RunSpec(
        session_id="s", butler="health", prompt="", system_prompt="be brief",
        workspace=workspace, cwd=workspace, mcp_server=None,
        config_file=adapter.build_config_file(workspace, None),
        env={"PATH": os.environ["PATH"]}, max_turns=3,
    )  # fmt: skip
    if direct_command(fake, os.environ["PATH"]) is None:
        pytest.skip("no node on PATH")
    assert adapter.command(spec)[0] != str(fake), "a headless run starts node itself"
    assert adapter.child_env(spec)["GEMINI_CLI_NO_RELAUNCH"] == "true"
    outcome = asyncio.run(adapter.interact(spec))
    assert outcome.exit_code == 0
    seen = dict(
        line.split("=", 1) for line in Path(f"{fake}.env").read_text().splitlines() if "=" in line
    )
    assert seen["GEMINI_CLI_HOME"] == str(workspace)
    assert "GEMINI_CLI_NO_RELAUNCH" not in seen and "NO_COLOR" not in seen


@installed
@pytest.mark.e2e
async def test_a_gemini_run_has_one_node_process(make_butler, store) -> None:
    butler = with_runtime(make_butler(), "gemini")
    seen = (await shell_output(butler, store, PROCESS_NAMES)).split()
    assert seen.count("node") == 1, f"the CLI relaunched itself: {seen}"
