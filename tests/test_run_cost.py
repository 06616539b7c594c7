"""What a run costs spawnkit's own process: which work it does, never how fast.

A run's start and setup are written on the event loop when the store is a SQLite file
whose write lock is free (a thread's wake-up costs more than such a write:
tests/test_run_path.py counts the thread hops of a no-op run), and in a thread when the
write would wait; the command runtime writes only the files its command
line names; the credentials are read once a step; the run's log path makes no folder
until a line comes. Timing is benchmarks/trigger.py's business.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from spawnkit.config.credential_file import CredentialFile
from spawnkit.containment.credentials import CredentialStore
from spawnkit.containment.workspace import files_in
from spawnkit.run import Spawner
from spawnkit.store import SessionStore, WriteWouldWait
from spawnkit.telemetry.runlog import RunLog

from .conftest import RosterFactory

TRUE = shutil.which("true") or "/bin/true"
LS = shutil.which("ls") or "/bin/ls"


def no_op_butler(make_butler: RosterFactory, command: list[str], name: str = "noop") -> Any:
    return make_butler(
        name,
        extra=f"""
        [butler.runtime]
        type = "command"
        command = {json.dumps(command)}
        [butler.sandbox]
        mode = "none"
        """,
    )


async def test_a_write_that_would_wait_goes_to_a_thread_and_the_loop_goes_on(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    spawner = Spawner(no_op_butler(make_butler, [TRUE]), store=store)
    assert store.path is not None
    holder = sqlite3.connect(store.path, isolation_level=None)  # another writer
    holder.execute("BEGIN IMMEDIATE")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    run = asyncio.create_task(spawner.trigger("wait your turn"))
    try:
        await asyncio.sleep(0.3)
        assert not run.done(), "the record was written though another writer held the lock"
        assert ticks > 1, "the event loop was blocked by the waiting write"
        assert store.list_sessions(limit=5) == []
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        ticker.cancel()
    result = await asyncio.wait_for(run, timeout=60)

    assert result.success, result.error
    assert [s.id for s in store.list_sessions(limit=5)] == [result.session_id]


def test_without_waiting_a_held_lock_raises_and_changes_nothing(store: SessionStore) -> None:
    assert store.path is not None and store.writes_at_once
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(WriteWouldWait), store.without_waiting():
            store.create_session("s1", butler="b", runtime="command", model=None,
                                 prompt="p", context=None, trigger_source="external")  # fmt: skip
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.get_session("s1") is None

    # This process's own writer, in another thread, holding its turn: the same.
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._db.transaction():  # type: ignore[attr-defined]
            holding.set()
            release.wait(30)

    other = threading.Thread(target=hold)
    other.start()
    try:
        assert holding.wait(30)
        with pytest.raises(WriteWouldWait), store.without_waiting():
            store.create_session("s2", butler="b", runtime="command", model=None,
                                 prompt="p", context=None, trigger_source="external")  # fmt: skip
    finally:
        release.set()
        other.join(30)

    with store.without_waiting():  # free now: written at once
        store.create_session("s3", butler="b", runtime="command", model=None,
                             prompt="p", context=None, trigger_source="external")  # fmt: skip
    assert store.get_session("s2") is None and store.get_session("s3") is not None


async def test_the_command_runtime_writes_only_the_files_its_command_names(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    listing = await Spawner(no_op_butler(make_butler, [LS, "-A"], "lister"), store=store).trigger(
        "list the workspace"
    )
    cat = no_op_butler(make_butler, ["cat", "{prompt_file}", "{system_prompt_file}"], "reader")
    reading = await Spawner(cat, store=store).trigger("read me")

    assert listing.success and reading.success, (listing.error, reading.error)
    # The MCP configuration is always there (the record names it); no placeholder named
    # the prompt files, so they were not written.
    assert listing.output.split() == ["mcp.json", "tmp"]
    assert reading.output.startswith("read me")  # the prompt, then the system prompt
    assert "You are the reader butler" in reading.output
    record = store.get_session(listing.session_id)
    assert record is not None and record.given is not None
    assert record.given["config_files"] == ["mcp.json"]


def test_pinned_credentials_are_read_once_and_a_new_pin_sees_a_change(tmp_path: Path) -> None:
    credentials = CredentialFile(tmp_path / "credentials.json")
    credentials.set("SOME_TOKEN", "first-value")
    store = CredentialStore(file=credentials, environ={"OTHER": "from-env"})

    pinned = store.pinned()
    assert pinned.resolve("SOME_TOKEN") == "first-value"
    credentials.set("SOME_TOKEN", "second-value")

    assert pinned.resolve("SOME_TOKEN") == "first-value"  # one moment's values
    assert pinned.resolve("OTHER") == "from-env" and pinned.resolve("MISSING") is None
    assert store.pinned().resolve("SOME_TOKEN") == "second-value"
    assert store.resolve("SOME_TOKEN") == "second-value"


def test_a_runs_log_makes_a_missing_home_private_with_its_first_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("SPAWNKIT_HOME", str(home))
    log = RunLog.for_session("abc-123")
    assert not home.exists()  # the path alone makes nothing

    log.stdout("first line")
    log.close()

    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "sessions" / "abc-123").stat().st_mode) == 0o700
    assert (home / "sessions" / "abc-123" / "stdout.log").read_text() == "first line\n"


def test_files_in_lists_what_os_walk_lists(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "deep.txt").write_text("x")
    (tmp_path / "top.json").write_text("{}")
    (tmp_path / "folder-link").symlink_to(tmp_path / "a", target_is_directory=True)
    (tmp_path / "file-link").symlink_to(tmp_path / "top.json")
    (tmp_path / "broken-link").symlink_to(tmp_path / "nowhere")

    walked = sorted(
        str((Path(root) / name).relative_to(tmp_path))
        for root, _dirs, names in os.walk(tmp_path)
        for name in names
    )
    assert files_in(tmp_path) == walked
    assert walked == ["a/b/deep.txt", "broken-link", "file-link", "top.json"]
