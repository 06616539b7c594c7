"""What a run's path costs in store transactions and thread hops (what runs, never how fast).

A no-op run makes one write when it is accepted, one when its CLI starts (its start and
setup together) and one when it ends (with its workspace removed in the same thread); on a
SQLite store whose write lock is free the first two are made on the event loop, with no
thread woken (tests/test_run_cost.py: a thread when the write would wait). Its record
keeps everything the separate writes kept, and a run that ends before its CLI starts still
records when it started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spawnkit.errors import ConfigError
from spawnkit.run import Spawner
from spawnkit.run.assembly import Assembly
from spawnkit.store import SessionStore

from .conftest import RosterFactory

NOOP = """
[butler.runtime]
type = "command"
command = ["/bin/true"]
output = "text"
[butler.sandbox]
mode = "none"
"""


def _counted_writes(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ops: list[str] = []
    real = store._writes.write

    def write(op: str, session_id: str | None, payload: Any) -> None:
        ops.append(op)
        real(op, session_id, payload)

    monkeypatch.setattr(store._writes, "write", write)
    return ops


async def test_a_run_starts_in_one_write_and_one_thread_hop(
    make_butler: RosterFactory, store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawner = Spawner(make_butler("noop", extra=NOOP), store=store)
    assert (await spawner.trigger("warm up")).success  # the cgroup probe, imports
    ops = _counted_writes(store, monkeypatch)
    loop = asyncio.get_running_loop()
    hops: list[str] = []
    real = loop.run_in_executor

    def run_in_executor(executor: Any, fn: Callable[..., Any], *args: Any) -> Any:
        hops.append(repr(fn))
        return real(executor, fn, *args)

    monkeypatch.setattr(loop, "run_in_executor", run_in_executor)
    result = await spawner.trigger("nothing")
    monkeypatch.undo()
    assert result.success, result.error
    assert ops == ["started_setup", "complete"]
    # Record, start and setup with the CLI's environment on the event loop (once a thread
    # hop each); the end with the workspace's removal in a thread.
    assert len(hops) == 1 and "Recorder._finish" in hops[0], hops
    record = store.get_session(result.session_id)
    assert record is not None
    assert record.status == "success" and record.started_at is not None
    assert record.sandbox == "none" and record.given and record.given["home"]
    assert record.workspace is not None and not record.workspace.exists()


async def test_a_run_that_ends_before_its_cli_starts_still_records_its_start(
    make_butler: RosterFactory, store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise ConfigError("no door could be opened")

    monkeypatch.setattr(Assembly, "prepare", refused)
    result = await Spawner(make_butler("noop", extra=NOOP), store=store).trigger("hi")
    assert not result.success and result.error_kind == "config"
    (record,) = store.list_sessions()
    assert record.status == "failed" and record.started_at is not None
    assert record.workspace is not None and not record.workspace.exists()
    assert record.sandbox is None  # its setup never came


async def test_a_run_that_prints_nothing_makes_no_log_folder(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    quiet = Spawner(make_butler("noop", extra=NOOP), store=store)
    chatty = Spawner(make_butler("echo", extra=NOOP.replace("/bin/true", "/bin/echo")), store=store)
    silent, spoke = await quiet.trigger("hi"), await chatty.trigger("hi")
    assert silent.success and spoke.success, (silent.error, spoke.error)
    records = {r.id: r for r in store.list_sessions()}
    silent_dir = records[silent.session_id].log_dir
    spoke_dir = records[spoke.session_id].log_dir
    assert silent_dir is not None and not silent_dir.exists()
    assert spoke_dir is not None and (spoke_dir / "stdout.log").read_text() == "\n"


def test_a_start_with_its_setup_records_what_the_two_writes_did(
    store: SessionStore, tmp_path: Path
) -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    given = {"tools": ["Bash"], "home": "the run's workspace", "note": "é"}
    for sid in ("apart", "together"):
        store.create_session(
            sid, butler="b", runtime="command", model=None, prompt="p", context=None,
            trigger_source="external",
        )  # fmt: skip
    workspace = tmp_path / "butler_b_1"
    store.mark_started("apart", started_at=at, trace_id="t" * 32, workspace=workspace)
    store.record_setup("apart", sandbox="bwrap", given=given)
    store.mark_started(
        "together", started_at=at, trace_id="t" * 32, workspace=workspace, setup=("bwrap", given)
    )
    apart, together = store.get_session("apart"), store.get_session("together")
    assert apart is not None and together is not None
    same = {"created_at": apart.created_at, "lease_until": apart.lease_until}  # made apart
    assert replace(together, id="apart", **same) == apart
