"""The agent CLIs that come from npm (Codex, Gemini, the ACP adapters): pinned, and where
``spawnkit install-clis`` puts them.

A pip install of spawnkit brings Claude Code (inside the ``claude-agent-sdk`` wheel) and
no node package. The wheel carries the checkout's ``package.json`` and
``package-lock.json`` (the versions the tests run); ``spawnkit install-clis`` copies both
into ``$SPAWNKIT_HOME/clis`` and runs ``npm ci`` there, so the versions are exactly the
tested ones, and the adapters' lookup (:func:`spawnkit.runtimes.streaming.find_cli`)
searches ``$SPAWNKIT_HOME/clis/node_modules/.bin`` from then on, from any folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import ConfigError, SpawnkitError
from ..home import home_path, spawnkit_home

MANIFESTS = ("package.json", "package-lock.json")
INSTALL_TIMEOUT_S = 1800.0  # ~850 MB from the registry on a slow line


def pinned_manifests() -> Path:
    """The folder with the pinned ``package.json``: the wheel's copy, else the checkout's."""
    package = Path(__file__).resolve().parent.parent
    for folder in (package / "_clis", package.parent):
        if all((folder / name).is_file() for name in MANIFESTS):
            return folder
    raise ConfigError(f"spawnkit's package.json is missing from {package}: reinstall spawnkit")


def pinned_versions() -> dict[str, str]:
    """npm package -> the version spawnkit is tested with."""
    manifest = json.loads((pinned_manifests() / "package.json").read_text())
    return dict(manifest["dependencies"])


def clis_dir() -> Path:
    """Where ``spawnkit install-clis`` installs (``$SPAWNKIT_HOME/clis``), not created."""
    return home_path() / "clis"


def installed_bin() -> Path:
    return clis_dir() / "node_modules" / ".bin"


def install_clis(npm: str | None = None) -> Path:
    """``npm ci`` of the pinned CLIs into :func:`clis_dir`; the folder of their binaries.

    npm's own output goes to this process's stdout and stderr (it is a foreground install a
    person watches); a missing npm or a failed install is one :class:`SpawnkitError`.
    """
    npm = npm or shutil.which("npm")
    if npm is None:
        raise SpawnkitError(
            "npm is not installed: Codex and Gemini are node programs; install Node.js and "
            "npm (e.g. `apt-get install nodejs npm`, or https://nodejs.org), then run "
            "`spawnkit install-clis` again"
        )
    spawnkit_home()
    target = clis_dir()
    target.mkdir(mode=0o700, exist_ok=True)
    source = pinned_manifests()
    for name in MANIFESTS:
        shutil.copyfile(source / name, target / name)
    argv = [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"]
    try:
        done = subprocess.run(argv, cwd=target, timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SpawnkitError(
            f"npm did not finish installing into {target} within {INSTALL_TIMEOUT_S:.0f} s"
        ) from None
    if done.returncode != 0:
        raise SpawnkitError(
            f"npm failed (exit {done.returncode}) installing into {target}: see its output above"
        )
    return installed_bin()


def found_in_installed(name: str) -> Path | None:
    """``name`` in :func:`installed_bin`, when ``spawnkit install-clis`` put it there."""
    path = installed_bin() / name
    return path if path.is_file() and os.access(path, os.X_OK) else None
