"""Runs on a Dask cluster (spawnkit.run.dispatch, spawnkit.cluster.worker), through the real
Claude Code CLI on the replay model: a ``LocalCluster`` of 2 worker processes here, real
``dask scheduler`` and ``dask worker`` processes on TCP in test_cluster_tcp_e2e.py.

Each test starts its own cluster after the test's ``$SPAWNKIT_HOME`` is set, so the workers'
runs live under it and tests/leftovers.py sees their processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import tomllib
from collections.abc import Iterator
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from spawnkit.errors import MissingEnvError, StoreError  # noqa: E402
from spawnkit.events import (  # noqa: E402
    Finished,
    Queued,
    RunEvent,
    Started,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from spawnkit.replay import Scenario  # noqa: E402
from spawnkit.run import Spawner  # noqa: E402
from spawnkit.run.dispatch import WORKER_LOST, Cluster  # noqa: E402
from spawnkit.serve.service import ButlerService  # noqa: E402
from spawnkit.store import SessionStore  # noqa: E402

from .conftest import REPO  # noqa: E402
from .leftovers import SLEEPY, kill_leftovers, sleeper, sleeping_tool, survivors  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# The workers name their host in the records they write.
WORKER_HOST = "dask-worker-host"

WEIGHT = """
[[turn]]
text = "Recording it."
tool = "mcp__*__state_set"
input = { key = "weight", value = "72.4 kg" }
usage = { input_tokens = 100, output_tokens = 20 }
[[turn]]
tool = "mcp__*__state_get"
input = { key = "weight" }
usage = { input_tokens = 120, output_tokens = 10 }
[[turn]]
delay_ms = 600
text = "Your stored weight: {{ last_tool_result }}"
usage = { input_tokens = 140, output_tokens = 15 }
"""


def scenario(text: str) -> Scenario:
    return Scenario.from_dict(tomllib.loads(text), source="<test>")


@contextlib.contextmanager
def local_client(workers: int = 2, threads: int = 2, **env: str) -> Iterator[Any]:
    """A Client of a LocalCluster of ``workers`` processes (each behind a nanny), with
    ``env`` in the workers' environment besides the worker host's name."""
    with (
        distributed.LocalCluster(
            processes=True, n_workers=workers, threads_per_worker=threads,
            dashboard_address=None,
            env={"SPAWNKIT_HOST": WORKER_HOST, **env},
        ) as cluster,
        distributed.Client(cluster) as dask_client,
    ):  # fmt: skip
        yield dask_client


@pytest.fixture
def client(isolated_home: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """2 worker processes (each behind a nanny) on this test's SPAWNKIT_HOME; a test may
    ask for other numbers, (workers, threads each), by indirect parametrization."""
    workers, threads = getattr(request, "param", (2, 2))
    with local_client(workers, threads) as dask_client:
        yield dask_client


def shape(events: list[RunEvent]) -> list[str]:
    """The kinds of events in order, without text fragments and usage ticks (their
    number depends on how the CLI's output was chunked)."""
    return [type(e).__name__ for e in events if not isinstance(e, TextDelta | UsageUpdate)]


async def test_remote_events_stream_in_order_like_a_local_run(make_butler, store, client):
    butler = make_butler()
    arrived: list[tuple[float, RunEvent]] = []
    with Cluster(client, replay=scenario(WEIGHT)) as cluster:
        spawner = Spawner(butler, store=store, cluster=cluster)
        result = await spawner.trigger(
            "Please log my weight",
            on_event=lambda e: arrived.append((time.monotonic(), e)),
        )
        # An id used again is refused, as locally, not taken for a re-run of a lost worker.
        with pytest.raises(StoreError):
            await spawner.trigger("Again", session_id=result.session_id)
    assert result.success, result.error
    assert "72.4 kg" in result.output
    events = [e for _, e in arrived]
    assert all(e.session_id == result.session_id for e in events)
    # Queued as the client accepted it (recorded before it was sent), then the worker's.
    assert isinstance(events[0], Queued) and isinstance(events[1], Started)
    assert isinstance(events[-1], Finished)
    assert events[-1].result == result
    # Each call is seen starting, then finishing, in the order they were made.
    calls = [(type(e).__name__, e.call.tool) for e in events
             if isinstance(e, ToolCallStarted | ToolCallFinished)]  # fmt: skip
    assert calls == [
        ("ToolCallStarted", "state_set"), ("ToolCallFinished", "state_set"),
        ("ToolCallStarted", "state_get"), ("ToolCallFinished", "state_get"),
    ]  # fmt: skip
    # While it happened: the last model turn waits 600 ms after the tool calls.
    first_tool = next(t for t, e in arrived if isinstance(e, ToolCallStarted))
    assert arrived[-1][0] - first_tool >= 0.5

    # The same trigger run locally gives the same events.
    local: list[RunEvent] = []
    async with ButlerService(butler, store=store, replay=scenario(WEIGHT)) as service:
        here = await service.trigger("Please log my weight", on_event=local.append)
        with pytest.raises(StoreError):
            await service.trigger("Again", session_id=here.session_id)
    assert here.success, here.error
    assert shape(events[1:]) == shape(local)

    # One record, written on the worker: its host, its MCP server, the shared store.
    record = store.get_session(result.session_id)
    assert record is not None and record.status == "success"
    assert record.owner_host == WORKER_HOST
    assert record.given is not None and record.given["dispatch"]["worker"].startswith("tcp://")
    assert [c["tool"] for c in store.mcp_calls(result.session_id)] == ["state_set", "state_get"]
    assert store.state_get("health", "weight") == "72.4 kg"
    assert store.count_sessions() == 2  # the remote run and the local one


async def test_a_trigger_the_worker_refuses_raises_like_a_local_one(make_butler, store, client):
    """A required variable the worker lacks: refused there before acceptance, no record."""
    os.environ.pop("SPAWNKIT_TEST_TOKEN", None)  # the workers inherited this environment
    butler = make_butler(extra='[butler.env]\nrequired = ["SPAWNKIT_TEST_TOKEN"]\n')
    with Cluster(client, replay=scenario(WEIGHT)) as cluster:
        spawner = Spawner(butler, store=store, cluster=cluster)
        with pytest.raises(MissingEnvError, match="SPAWNKIT_TEST_TOKEN"):
            await spawner.trigger("hi", session_id="refused-1")
    assert store.get_session("refused-1") is None
    assert spawner.in_flight == [] and spawner.status.active == 0


SHORT = """
[[turn]]
delay_ms = 700
text = "done"
"""


async def test_admission_holds_across_workers_through_the_postgres_slots(
    make_butler, postgres_url, isolated_home
):
    """max_concurrent_sessions = 2 with 2 workers of 2 threads each (4 tasks at once):
    the store's slots, not each worker's own limit, keep the records to 2 at a time. The
    workers know the store with its password from their own setting (a task names it
    without)."""
    butler = make_butler(extra="[butler.runtime]\nmax_concurrent_sessions = 2\n")
    with (
        local_client(SPAWNKIT_STORE=postgres_url) as client,
        SessionStore(postgres_url) as store,
        Cluster(client, replay=scenario(SHORT)) as cluster,
    ):
        spawner = Spawner(butler, store=store, cluster=cluster)
        results = await asyncio.gather(*(spawner.trigger(f"run {n}") for n in range(6)))
        records = [store.get_session(r.session_id) for r in results]
    assert all(r.success for r in results), [r.error for r in results]
    assert all(r is not None and r.owner_host == WORKER_HOST for r in records)
    workers = {r.given["dispatch"]["worker"] for r in records if r is not None and r.given}
    assert len(workers) == 2, "both workers took runs: their own limits would allow 4"
    spans = [(r.started_at, r.completed_at) for r in records if r is not None]
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    print(f"at most {most} of 6 runs at once (limit 2)")
    assert most <= 2


async def wait_mid_call(session_id: str, events: list[Any], timeout: float = 120) -> None:
    """Until the run has started (an event came) and its tool call sleeps."""
    async with asyncio.timeout(timeout):
        while not (any(isinstance(e, Started) for e in events) and sleeping_tool(session_id)):
            await asyncio.sleep(0.05)


async def test_cancel_kills_the_remote_run(make_butler, store, client):
    butler = make_butler(extra=sleeper(sandbox="none"))
    session_id = "cluster-cancel-1"
    started: list[Started] = []
    with Cluster(client, replay=scenario(SLEEPY)) as cluster:
        spawner = Spawner(butler, store=store, cluster=cluster)
        run = asyncio.create_task(
            spawner.trigger(
                "sleep", session_id=session_id,
                on_event=lambda e: started.append(e) if isinstance(e, Started) else None,
            )
        )  # fmt: skip
        try:
            await wait_mid_call(session_id, started)
            clock = time.monotonic()
            assert await spawner.cancel(session_id)
            left = survivors(session_id, within=10)
            stopped_after = time.monotonic() - clock
            result = await run
        finally:
            kill_leftovers(session_id)
    assert left == [], f"processes of the cancelled run still alive: {left}"
    print(f"remote run stopped {stopped_after:.2f} s after the cancel")
    assert result.status == "cancelled" and result.error_kind == "cancelled"
    record = store.get_session(session_id)
    assert record is not None and record.status == "cancelled" and record.completed_at
    assert record.owner_host == WORKER_HOST
    assert spawner.in_flight == []


async def test_a_killed_worker_is_one_crashed_record_and_never_runs_twice(
    make_butler, store, client
):
    """kill -9 of the worker mid-run; the scheduler keeps its default allowed-failures (3),
    so it hands the task to another worker, which refuses to run it again."""
    butler = make_butler(extra=sleeper(sandbox="none"))
    session_id = "cluster-killed-1"
    events: list[RunEvent] = []
    with Cluster(client, replay=scenario(SLEEPY)) as cluster:
        spawner = Spawner(butler, store=store, cluster=cluster)
        run = asyncio.create_task(
            spawner.trigger("sleep", session_id=session_id, on_event=events.append)
        )
        try:
            await wait_mid_call(session_id, events)
            record = store.get_session(session_id)
            assert record is not None and record.given is not None
            worker_pid = client.run(os.getpid)[record.given["dispatch"]["worker"]]
            assert worker_pid != os.getpid()
            os.kill(worker_pid, signal.SIGKILL)
            async with asyncio.timeout(120):
                result = await run
            left = survivors(session_id, within=10)
        finally:
            kill_leftovers(session_id)
    assert result.status == "crashed" and not result.success
    assert result.error is not None and result.error.startswith(WORKER_LOST), result.error
    assert left == [], f"processes of the lost run still alive: {left}"
    records = store.list_sessions(limit=10)
    assert [(r.id, r.status) for r in records] == [(session_id, "crashed")]
    assert (records[0].error or "").startswith(WORKER_LOST)
    # It started once: one Started event, one Finished (the crash), nothing after.
    assert [type(e).__name__ for e in events if isinstance(e, Started | Finished)] == [
        "Started", "Finished"
    ]  # fmt: skip
    assert isinstance(events[-1], Finished) and events[-1].result == result


# The first run holds the only worker thread until the test opens its gate.
GATED = """
[[turn]]
shell = "while [ ! -e {gate} ]; do sleep 0.1; done; echo open"
[[turn]]
text = "through the gate"
"""


@pytest.mark.parametrize("client", [(1, 1)], indirect=True)
async def test_a_trigger_waiting_in_dasks_queue_is_recorded_queued(
    make_butler, store, client, tmp_path
):
    """One worker thread, three triggers: the first runs (held at a gate), the other two
    wait in Dask's queue, each with its ``queued`` record and a ``Queued`` event. One of
    them is cancelled there: one ``cancelled`` record, never run. The others succeed."""
    butler = make_butler(extra=sleeper(sandbox="none"))
    gate = tmp_path / "gate"
    events: dict[str, list[RunEvent]] = {"first": [], "second": [], "dropped": []}
    with Cluster(client, replay=scenario(GATED.format(gate=gate))) as cluster:
        spawner = Spawner(butler, store=store, cluster=cluster)

        def start(name: str) -> asyncio.Task[Any]:
            return asyncio.create_task(
                spawner.trigger(name, session_id=f"q-{name}", on_event=events[name].append)
            )

        first = start("first")
        async with asyncio.timeout(120):
            while not any(isinstance(e, Started) for e in events["first"]):
                await asyncio.sleep(0.05)
        second, dropped = start("second"), start("dropped")
        async with asyncio.timeout(60):
            while not (events["second"] and events["dropped"]):
                await asyncio.sleep(0.05)
        # Accepted, waiting behind the first: recorded and announced, not started.
        for name in ("second", "dropped"):
            assert [type(e) for e in events[name]] == [Queued], events[name]
            record = store.get_session(f"q-{name}")
            assert record is not None and record.status == "queued", record
            assert record.owner_host == store.host and record.started_at is None
        assert store.get_session("q-first").status == "running"  # type: ignore[union-attr]

        assert await spawner.cancel("q-dropped")
        cancelled = await dropped
        gate.touch()
        async with asyncio.timeout(120):
            results = await asyncio.gather(first, second)
    assert all(r.success for r in results), [r.error for r in results]
    assert cancelled.status == "cancelled" and not cancelled.success
    records = {r.id: r for r in store.list_sessions(limit=10)}
    assert {sid: r.status for sid, r in records.items()} == {
        "q-first": "success", "q-second": "success", "q-dropped": "cancelled",
    }  # fmt: skip
    # The worker adopted the queued record: same id, its host now, started there.
    second_record = records["q-second"]
    assert second_record.owner_host == WORKER_HOST and second_record.started_at is not None
    assert "through the gate" in results[1].output
    kinds = [type(e).__name__ for e in events["second"]]
    assert kinds[:2] == ["Queued", "Started"] and kinds[-1] == "Finished"
    # The cancelled one never ran: no start, no worker, closed by its client.
    assert [type(e).__name__ for e in events["dropped"]] == ["Queued", "Finished"]
    dropped_record = records["q-dropped"]
    assert dropped_record.started_at is None and dropped_record.owner_host == store.host
    assert dropped_record.completed_at is not None


DEMO = REPO / "roster" / "health" / "scenarios" / "demo.toml"


def test_spawn_magic_on_dask_uses_the_default_client(client):
    """``%%spawn --on dask`` in a shell whose default distributed client is ``client``."""
    from IPython.core.error import UsageError
    from IPython.testing import globalipapp

    ip = globalipapp.get_ipython()  # the one test shell (test_magics.py uses it too)
    assert ip is not None and distributed.default_client() is client
    ip.run_line_magic("load_ext", "spawnkit")
    ip.run_line_magic("cd", str(REPO))
    try:
        with pytest.raises(UsageError, match="kernel tools"):
            ip.run_cell_magic("spawn", "--butler health --on dask --kernel-tools", "hi")
        result = ip.run_cell_magic(
            "spawn", f"--butler health --replay {DEMO} --on dask", "I weighed 72.4 kg"
        )
        assert result.success, result.error
        with SessionStore() as store:  # the kernel's store, which the workers wrote
            record = store.get_session(result.session_id)
        assert record is not None and record.status == "success"
        assert record.owner_host == WORKER_HOST
    finally:
        ip.run_line_magic("unload_ext", "spawnkit")
