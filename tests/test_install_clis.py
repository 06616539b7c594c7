"""``spawnkit install-clis``: the pinned npm CLIs into ``$SPAWNKIT_HOME/clis``, found there.

The real install (``npm ci`` of about 850 MB from the registry) takes minutes: it runs only
with ``SPAWNKIT_TEST_NPM=1``. By default, the checkout's ``node_modules`` (``npm ci`` of the
same package-lock.json) is linked where the command installs, and the lookup, ``doctor``
and a run are checked from a folder with no node CLI near it or on PATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spawnkit.runtimes.npm_clis import clis_dir, pinned_versions

from .conftest import REPO

SPAWNKIT = [sys.executable, "-m", "spawnkit"]


def no_node_path() -> str:
    return os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if "node_modules" not in p
    )


def test_the_pinned_versions_are_the_checkouts_package_json() -> None:
    manifest = json.loads((REPO / "package.json").read_text())
    assert pinned_versions() == manifest["dependencies"]
    assert pinned_versions()["@openai/codex"] == "0.169.0"


@pytest.mark.e2e
def test_the_clis_in_spawnkit_home_are_found_from_any_folder(
    isolated_home: Path, tmp_path: Path
) -> None:
    clis_dir().mkdir(parents=True)
    (clis_dir() / "node_modules").symlink_to(REPO / "node_modules")
    env = {**os.environ, "PATH": no_node_path()}
    doctor = subprocess.run(
        [*SPAWNKIT, "doctor", "--json"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    found = {c["runtime"]: c for c in json.loads(doctor.stdout)["runtimes"]}
    bin_dir = str(isolated_home / "clis" / "node_modules" / ".bin")
    assert found["codex"]["path"] == f"{bin_dir}/codex" and found["codex"]["found"]
    assert found["gemini"]["path"] == f"{bin_dir}/gemini"
    assert found["codex"]["version"] == "codex-cli 0.169.0"


def test_without_npm_install_clis_says_so_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    done = subprocess.run(
        [*SPAWNKIT, "install-clis"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "npm is not installed" in line and "Node.js" in line


@pytest.mark.skipif(
    os.environ.get("SPAWNKIT_TEST_NPM") != "1",
    reason="installs about 850 MB from the npm registry (minutes): SPAWNKIT_TEST_NPM=1",
)
def test_install_clis_installs_the_pinned_versions_from_npm(
    isolated_home: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PATH": no_node_path()}
    done = subprocess.run(
        [*SPAWNKIT, "install-clis"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=1800, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    codex = isolated_home / "clis" / "node_modules" / ".bin" / "codex"
    version = subprocess.run([codex, "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == "codex-cli 0.169.0"
