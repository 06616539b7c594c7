"""Codex's state databases, made once per Codex binary and copied into each run's home.

Every run gets a fresh, empty ``CODEX_HOME``, where Codex first creates six SQLite
databases (``state_5.sqlite``, ``logs_2.sqlite``, ``thread_history_1.sqlite``, ...) and
runs some 80 schema migrations on them: about a fifth of a short run's CPU (measured, 290
against 225 ms a run). A user's own ``~/.codex`` pays that once. spawnkit does the same:
the first run of a Codex binary finds no template and starts one being made, off the
event loop, and later runs get a copy of the migrated, empty databases in their home
(:func:`seed`), so Codex opens them and migrates nothing.

The template is made by Codex itself, never from a run: ``codex exec`` with the prompt
``.`` and a model provider on a local port nothing listens on (refused at once, so no
model ever answers and no tool runs), killed as soon as its turn has started, by which
time its databases exist. Then the rows its thread left (tables ``thread*``, ``logs``)
are deleted, the write-ahead logs folded in and each file checked. So no prompt, answer
or file of any run can reach another through it. It is kept per binary (its path, size
and time) under ``$XDG_CACHE_HOME/spawnkit/codex-state`` (``~/.cache``): what is in it is
Codex's schema and nothing else, and a Codex upgrade gets a template of its own (Codex
refuses a database migrated by a newer version than itself).

Anything that goes wrong while making it (no binary, a Codex that changed its files)
leaves no template, is logged once, and runs go on as before, creating their own.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from .._process import die_with_parent

logger = logging.getLogger(__name__)

# How long making a template may take before it is given up (Codex starts in a second).
BUILD_TIMEOUT_S = 30.0
# What a thread of the template's own run left behind: deleted before the template is kept.
_RUN_TABLE_PREFIXES = ("thread", "logs")
# The databases Codex must have made for a template to be kept.
_REQUIRED = "state_*.sqlite"

# config.toml's text for a model at a base URL.
Configure = Callable[[str], str]

_lock = threading.Lock()
_building: set[Path] = set()
_failed: set[Path] = set()


def cache_root() -> Path:
    """Where templates are kept: ``$XDG_CACHE_HOME/spawnkit/codex-state`` (``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spawnkit" / "codex-state"


def template_dir(binary: Path) -> Path:
    """The template's folder for ``binary``: one per file (path, size, modification time)."""
    return _template_dir(binary, cache_root())


@functools.lru_cache(maxsize=16)
def _template_dir(binary: Path, root: Path) -> Path:
    """Looked up once per binary and cache folder (a stat and a resolve of the binary)."""
    stat = binary.stat()
    key = f"{binary.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return root / hashlib.sha256(key.encode()).hexdigest()[:24]


def seed(home: Path, binary: Path, env: Mapping[str, str], config: Configure) -> bool:
    """Copy the template of ``binary`` into the run's ``CODEX_HOME``, ``home``: whether
    there was one. Without one, start making it in a thread (``env``: what the Codex
    process needs beyond a home, its launcher's variables; ``config``: its config.toml
    for a model at a base URL, the runs' own settings) and return at once."""
    try:
        folder = template_dir(binary)
    except OSError:
        return False
    databases = sorted(folder.glob("*.sqlite"))
    if not databases:
        _start_building(folder, binary, env, config)
        return False
    try:
        for database in databases:
            target = home / database.name
            shutil.copyfile(database, target)
            target.chmod(0o600)
    except OSError as exc:
        logger.debug("cannot copy Codex's state template %s: %s", folder, exc)
        for database in databases:
            with contextlib.suppress(OSError):
                (home / database.name).unlink()
        return False
    return True


def _start_building(folder: Path, binary: Path, env: Mapping[str, str], config: Configure) -> None:
    with _lock:
        if folder in _building or folder in _failed:
            return
        _building.add(folder)
    thread = threading.Thread(
        target=_build_quietly,
        args=(folder, binary, dict(env), config),
        name="codex-state",
        daemon=True,
    )
    thread.start()


def _build_quietly(folder: Path, binary: Path, env: dict[str, str], config: Configure) -> None:
    try:
        build(folder, binary, env, config)
    except Exception as exc:  # noqa: BLE001 - a template is an optimisation: runs go on without
        with _lock:
            _failed.add(folder)
        logger.info("Codex's state databases are made by each run (no template: %s)", exc)
    finally:
        with _lock:
            _building.discard(folder)


def build(folder: Path, binary: Path, env: Mapping[str, str], config: Configure) -> Path:
    """Make the template ``folder`` with ``binary``; its path. Several processes may make
    the same one at once: the first to finish keeps it. RuntimeError if Codex made none."""
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(prefix=".making-", dir=folder.parent) as scratch:
        home = Path(scratch) / "home"
        home.mkdir(mode=0o700)
        _start_codex_once(binary, home, env, config)
        kept = Path(scratch) / "template"
        kept.mkdir(mode=0o700)
        for database in sorted(home.glob("*.sqlite")):
            _empty(database)
            shutil.copyfile(database, kept / database.name)
        if not list(kept.glob(_REQUIRED)):
            raise RuntimeError(f"Codex made no {_REQUIRED} in its home")
        with contextlib.suppress(OSError):  # another process kept its own first: the same
            kept.rename(folder)
    if not list(folder.glob(_REQUIRED)):
        raise RuntimeError(f"no template in {folder}")
    return folder


def _start_codex_once(binary: Path, home: Path, env: Mapping[str, str], config: Configure) -> None:
    """Run ``codex exec .`` in ``home`` against a port that refuses, until its turn has
    started (its thread, and every database, exist by then), then kill it."""
    with socket.socket() as refusing:  # bound, never listening: a connection is refused
        refusing.bind(("127.0.0.1", 0))
        port = refusing.getsockname()[1]
        (home / "config.toml").write_text(config(f"http://127.0.0.1:{port}"), encoding="utf-8")
        child_env = {
            **env, "PATH": os.environ.get("PATH", os.defpath), "HOME": str(home),
            "CODEX_HOME": str(home), "TMPDIR": str(home), "NO_COLOR": "1",
            "OPENAI_API_KEY": "spawnkit-template-no-key",
        }  # fmt: skip
        parent = os.getpid()
        proc = subprocess.Popen(
            [str(binary), "exec", "--json", "--skip-git-repo-check", "-"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=home, env=child_env, start_new_session=True,
            preexec_fn=lambda: die_with_parent(parent),
        )  # fmt: skip
        timer = threading.Timer(BUILD_TIMEOUT_S, _kill_group, args=(proc,))
        timer.start()
        try:
            assert proc.stdin is not None
            assert proc.stdout is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(b".\n")
                proc.stdin.close()
            for line in proc.stdout:  # by its turn's start, every database exists
                if line.startswith((b'{"type":"turn.started"', b'{"type":"error"')):
                    break
        finally:
            timer.cancel()
            _kill_group(proc)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _empty(database: Path) -> None:
    """Delete what the template's own thread left; fold the write-ahead log in; check it."""
    connection = sqlite3.connect(database)
    try:
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        for table in tables:
            if table.startswith(_RUN_TABLE_PREFIXES):
                connection.execute(f'DELETE FROM "{table}"')
        connection.commit()
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (verdict,) = connection.execute("PRAGMA integrity_check").fetchone()
        if verdict != "ok":
            raise RuntimeError(f"{database.name}: {verdict}")
    finally:
        connection.close()


__all__ = ["build", "cache_root", "seed", "template_dir"]
