"""A newcomer's first hour, from the built wheel: a fresh venv, an empty folder, offline.

The wheel is built from this checkout and installed (with the ``notebooks`` extra) into
a new virtual environment with ``uv``, from its local cache when it can. Then, in an
empty folder with a fresh HOME and SPAWNKIT_HOME and without the checkout's node CLIs on
PATH, the installed ``spawnkit`` makes a roster, lists it, runs it on the replay model,
and says exactly how to install the CLIs it cannot find; and JupyterLab and a kernel from
the same install run the quickstart notebook.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.e2e


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed")
    root = tmp_path_factory.mktemp("wheel")
    built = run([uv, "build", "--wheel", "-o", str(root / "dist"), str(REPO)], timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (root / "dist").glob("spawnkit-*.whl")
    venv = root / "venv"
    made = run([uv, "venv", "-q", "-p", "3.11", str(venv)], timeout=300)
    assert made.returncode == 0, made.stderr
    install = [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
               f"{wheel}[notebooks]"]  # fmt: skip
    done = run([*install, "--offline"], timeout=900)
    if done.returncode != 0:  # not everything is in the local cache: use the registry
        done = run(install, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


@pytest.fixture
def newcomer(tmp_path: Path, venv: Path) -> dict[str, str]:
    """A fresh user: empty HOME and SPAWNKIT_HOME, only the venv and the system on PATH."""
    (tmp_path / "home").mkdir()
    system_path = [p for p in os.environ["PATH"].split(os.pathsep) if "node_modules" not in p]
    return {
        "PATH": os.pathsep.join([str(venv / "bin"), *system_path]),
        "HOME": str(tmp_path / "home"),
        "SPAWNKIT_HOME": str(tmp_path / "home" / ".spawnkit"),
        "NO_COLOR": "1",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }


def test_from_an_empty_folder(venv: Path, newcomer: dict[str, str], tmp_path: Path) -> None:
    work = tmp_path / "empty"
    work.mkdir()

    def spawnkit(*args: str) -> subprocess.CompletedProcess[str]:
        return run([str(venv / "bin" / "spawnkit"), *args], cwd=work, env=newcomer, timeout=300)

    where = run(
        [str(venv / "bin" / "python"), "-c", "import spawnkit; print(spawnkit.__file__)"],
        cwd=work, env=newcomer, timeout=60,
    ).stdout  # fmt: skip
    assert where.startswith(str(venv)), "the installed wheel, not the checkout"
    missing = spawnkit("roster")
    assert missing.returncode == 2 and "spawnkit init" in missing.stderr
    made = spawnkit("init")
    assert made.returncode == 0, made.stderr
    listed = spawnkit("roster")
    assert listed.returncode == 0, listed.stderr
    assert "general" in listed.stdout and "1 skill(s)" in listed.stdout
    done = spawnkit(
        "run", "--butler", "general", "--replay", "roster/general/scenarios/assistant.toml",
        "count the words in: the cat sat on the mat",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "words: 6" in done.stdout and "✓ success" in done.stdout
    assert "general" in spawnkit("sessions").stdout
    doctor = spawnkit("doctor")
    assert doctor.returncode == 1, doctor.stdout
    assert "install it with: npm install -g @openai/codex@0.169.0" in doctor.stdout
    assert "install it with: npm install -g @google/gemini-cli@0.61.0" in doctor.stdout
    assert "general      ok" in doctor.stdout  # its MCP server answers


def test_the_notebooks_extra_runs_the_quickstart(
    venv: Path, newcomer: dict[str, str], tmp_path: Path
) -> None:
    lab = run([str(venv / "bin" / "jupyter"), "lab", "--version"], env=newcomer, timeout=120)
    assert lab.returncode == 0, lab.stderr
    out = tmp_path / "quickstart.ipynb"
    executed = run(
        [str(venv / "bin" / "jupyter"), "nbconvert", "--to", "notebook", "--execute",
         "--ExecutePreprocessor.timeout=300", "--output", str(out), "quickstart.ipynb"],
        cwd=REPO / "notebooks", env=newcomer, timeout=900,
    )  # fmt: skip
    assert executed.returncode == 0, executed.stderr[-3000:]
    assert "72.4" in out.read_text()
