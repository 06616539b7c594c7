"""Codex's state databases: made once per binary by Codex itself, with no run in them, and
copied into each run's fresh home so that Codex migrates nothing at its start."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest

from spawnkit.notebook.hub import with_runtime
from spawnkit.runtimes import codex_state
from spawnkit.runtimes.codex import template_config
from spawnkit.runtimes.codex_native import native_codex

from .conftest import REPO, shell_output

LAUNCHER = REPO / "node_modules" / ".bin" / "codex"
installed = pytest.mark.skipif(
    not LAUNCHER.exists(), reason="the node CLIs are not installed (npm ci)"
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "spawnkit" / "codex-state"


def build_template() -> Path:
    """The template of the installed Codex's native binary, made now."""
    found = native_codex(LAUNCHER)
    assert found is not None
    folder = codex_state.template_dir(found.binary)
    return codex_state.build(folder, found.binary, found.env(), template_config)


def rows(database: Path, sql: str) -> list[tuple[object, ...]]:
    connection = sqlite3.connect(database)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def processes_in(folder: Path) -> list[int]:
    """Processes whose working folder is inside ``folder``."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cwd = str((proc / "cwd").readlink())
            except OSError:
                continue
            if cwd.startswith(str(folder)):
                found.append(int(proc.name))
    return found


@installed
def test_the_template_is_codexs_schema_with_no_run_in_it(cache: Path) -> None:
    folder = build_template()
    assert folder.parent == cache
    names = sorted(path.name for path in folder.iterdir())
    assert "state_5.sqlite" in names or any(name.startswith("state_") for name in names), names
    assert all(name.endswith(".sqlite") for name in names), "no WAL, no config, no id"
    for database in folder.iterdir():
        assert rows(database, "SELECT count(*) FROM _sqlx_migrations")[0][0] > 0, database.name
        tables = [name for (name,) in rows(database, "SELECT name FROM sqlite_master "
                                                     "WHERE type = 'table'")]  # fmt: skip
        for table in tables:
            if table.startswith(("thread", "logs")):
                assert rows(database, f'SELECT count(*) FROM "{table}"') == [(0,)], table
    assert list(cache.glob(".making-*")) == [], "its scratch home is gone"
    assert processes_in(cache) == [], "the Codex that made it is gone"


@installed
@pytest.mark.e2e
async def test_a_run_gets_the_template_and_codex_migrates_nothing(
    cache: Path, make_butler, store
) -> None:
    folder = build_template()
    state = next(folder.glob("state_*.sqlite"))
    marker = sqlite3.connect(state)  # what only the template has: a table of the test's
    marker.execute("CREATE TABLE made_by_the_test (x)")
    marker.commit()
    marker.close()
    probe = (
        "python3 -c \"import sqlite3, os; c = sqlite3.connect(os.environ['CODEX_HOME'] + "
        f"'/{state.name}'); print('marked', c.execute('SELECT count(*) FROM sqlite_master "
        "WHERE name = \\'made_by_the_test\\'').fetchone()[0]); print('threads', "
        "c.execute('SELECT count(*) FROM threads').fetchone()[0])\""
    )
    seen = await shell_output(with_runtime(make_butler(), "codex"), store, probe)
    assert "marked 1" in seen, f"Codex made its databases itself: {seen}"
    assert "threads 1" in seen, f"Codex keeps its run's thread in the seeded database: {seen}"


def test_a_codex_that_makes_no_databases_leaves_no_template_and_runs_go_on(
    cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = tmp_path / "codex"
    fake.write_text('#!/bin/sh\necho \'{"type":"turn.started"}\'\n')
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="no state_"):
        codex_state.build(codex_state.template_dir(fake), fake, {}, template_config)
    home = tmp_path / "home"
    home.mkdir()
    caplog.set_level(logging.INFO, logger=codex_state.__name__)
    assert codex_state.seed(home, fake, {}, template_config) is False  # making starts
    for thread in threading.enumerate():
        if thread.name == "codex-state":
            thread.join(60)
    assert "no template" in caplog.text
    assert codex_state.seed(home, fake, {}, template_config) is False
    assert not any(thread.name == "codex-state" for thread in threading.enumerate()), (
        "a failure is remembered: not tried again on every run"
    )
    assert list(home.iterdir()) == [] and not codex_state.template_dir(fake).exists()
