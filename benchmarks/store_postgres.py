"""The session store on PostgreSQL against SQLite, in one run.

Three parts, each against a baseline measured in the same run:

* records: what a run writes to its record (create, mark started, complete with three tool
  calls), per run, on a PostgreSQL store against a SQLite store. Rounds alternate between
  the two so drift on a shared machine hits both alike; the ratio is of the medians
  (target: at most 2). Then the same with 2 and 4 threads writing at once (concurrent runs
  write their records from threads of their own), and the floor: a bare round trip to the
  server (a prepared ``SELECT 1``), of which a run's three statements make three. And a
  tool call written live as a run makes it (``record_tool_call``), per write, and a run's
  slot across hosts on PostgreSQL (claimed, taken and given back).
* runs: whole runs, the real Claude Code CLI in its sandbox making one MCP call on the
  replay model, recorded on each store (``--run-rounds`` each, alternating): what the store
  adds to what a user waits for.
* scale: a store of ``--sessions`` sessions with ``--calls`` tool calls each (default 1M
  and 10), on both backends: the latest 20 sessions as ``spawnkit sessions`` reads them
  (``SessionStore.list_sessions(limit=20)``, target under 50 ms; the whole command, a
  fresh process, is timed too), the unfiltered ``history.sessions()`` frame (target
  under 2 s), the same frame of four columns, and the ``history.tool_calls()`` frame. The
  sessions frames are read warm, through the local columnar cache (the normal case for a
  large store), after a first read that builds it; on PostgreSQL also without the cache
  (everything through ADBC) and after 1,000 sessions spread over the history were updated
  (merged into the cached columns). Tool calls are cached on SQLite only.

The server is a throw-away Debian PostgreSQL (``tests/postgres.py``: ``fsync=off``, as the
SQLite store's ``synchronous = NORMAL`` does not fsync a commit either), on loopback TCP.
The stores are generated in bulk by the databases themselves: SQLite as in
``benchmarks/history.py``, PostgreSQL by ``INSERT … SELECT`` over ``generate_series`` with
the same values (faster here than streaming rows in with COPY). Generated files live in
``benchmarks/.work/``; results go to ``benchmarks/results/store_postgres.json``. Usage::

    .venv/bin/python benchmarks/store_postgres.py [--rounds 7] [--runs 200]
        [--sessions 1000000] [--calls 10] [--run-rounds 15]
        [--only records|runs|scale]
        [--backend postgresql|sqlite] [--call-rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from history import make_store  # noqa: E402

from spawnkit import history as frames  # noqa: E402
from spawnkit.result import SpawnerResult, ToolCall, Usage  # noqa: E402
from spawnkit.store import SessionStore  # noqa: E402
from tests.postgres import postgres_server  # noqa: E402

WORK = ROOT / "benchmarks" / ".work"
RESULTS = ROOT / "benchmarks" / "results" / "store_postgres.json"
T0 = datetime(2026, 9, 1, tzinfo=UTC)
# A frame of a few columns (what a notebook plotting cost per butler over time reads).
NARROW = ["session_id", "butler", "created_at", "cost_usd"]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- records: create + start + complete, per run ----------------------------------------------


def _result(session_id: str, at: datetime) -> SpawnerResult:
    calls = [
        ToolCall.start(f"{session_id}-{i}", "mcp__health__state_get" if i else "Bash",
                       {"key": "weight", "i": i}, at).finish("72.4 kg", False, at)
        for i in range(3)
    ]  # fmt: skip
    return SpawnerResult(
        output="Recorded 72.4 kg.", tool_calls=calls, success=True, session_id=session_id,
        duration_ms=1200, usage=Usage(2400, 60, 1800, 0), cost_usd=0.01, num_turns=3,
        model="claude-sonnet-4-5", status="success",
    )  # fmt: skip


def create(store: SessionStore, session_id: str) -> None:
    """A record as a run creates its own (queued)."""
    store.create_session(
        session_id, butler="health", runtime="claude-code", model=None,
        prompt="I weighed 72.4 kg", context=None, trigger_source="external",
    )  # fmt: skip


def record_runs(store: SessionStore, prefix: str, runs: int) -> float:
    """Seconds per run for ``runs`` records written the way a run writes its own."""
    start = time.perf_counter()
    for n in range(runs):
        sid = f"{prefix}-{n}"
        at = datetime.now(UTC)
        create(store, sid)
        store.mark_started(sid, started_at=at, trace_id="0" * 32)
        store.complete_session(sid, _result(sid, at))
    return (time.perf_counter() - start) / runs


def server_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the server's backends ``pids`` used so far (the
    throw-away server runs on this machine: its processes are in /proc)."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def live_calls(store: SessionStore, prefix: str, runs: int) -> float:
    """Seconds per write of a tool call written live (as it starts, then as it ends: each
    a write), in ``runs`` open records of three calls each; only those writes are timed."""
    at = datetime.now(UTC)
    for n in range(runs):
        create(store, f"{prefix}-{n}")
    calls = _result(prefix, at).tool_calls
    started = [ToolCall.start(c.id, c.name, c.input, c.started_at) for c in calls]
    start = time.perf_counter()
    for n in range(runs):
        for seq, (running, ended) in enumerate(zip(started, calls, strict=True)):
            store.record_tool_call(f"{prefix}-{n}", seq, running)
            store.record_tool_call(f"{prefix}-{n}", seq, ended)
    return (time.perf_counter() - start) / (runs * 2 * len(calls))


def slot_cycles_s(store: SessionStore, times: int) -> float:
    """Seconds per run for a butler's slot across hosts (PostgreSQL only): claimed, taken
    and given back, as a run does around its work."""
    start = time.perf_counter()
    for _ in range(times):
        claim = store.slot_claim("health", 3)
        if claim is None or claim.try_acquire() is None:
            raise SystemExit("no slot of the benchmark's butler was free")
        claim.release()
    return (time.perf_counter() - start) / times


def records_at_once(store: SessionStore, prefix: str, runs: int, threads: int) -> float:
    """Seconds per run for ``runs`` records written by ``threads`` threads at once, as
    concurrent runs write theirs (each from a thread of its own: ``asyncio.to_thread``)."""
    workers = [
        threading.Thread(target=record_runs, args=(store, f"{prefix}-{t}", runs // threads))
        for t in range(threads)
    ]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return (time.perf_counter() - start) / (runs // threads * threads)


def round_trip_s(url: str, times: int = 2000) -> float:
    """Seconds for the least a statement costs: a prepared ``SELECT 1`` through libpq."""
    with psycopg.connect(url, autocommit=True) as conn:
        pgconn = conn.pgconn
        pgconn.prepare(b"floor", b"SELECT 1")
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(times // 5):
                pgconn.exec_prepared(b"floor", [])
            samples.append((time.perf_counter() - start) / (times // 5))
    return statistics.median(samples)


def measure_records(url: str, sqlite_path: Path, rounds: int, runs: int) -> dict[str, Any]:
    """Wall time per run, and the CPU a run costs: this process's (client; for SQLite the
    whole store) and, for PostgreSQL, the server backends' too. The CPU figures vary far
    less than wall time with the load of a shared machine. Then the same records written
    by 2 and 4 threads at once (wall time per run), and a bare round trip to the server."""
    pg_s, lite_s, pg_client, pg_server, lite_cpu = [], [], [], [], []
    at_once: dict[int, tuple[list[float], list[float]]] = {2: ([], []), 4: ([], [])}
    with SessionStore(url) as pg, SessionStore(sqlite_path) as lite:
        record_runs(pg, "warm", 20)  # connections made, statements planned
        record_runs(lite, "warm", 20)
        with psycopg.connect(url, autocommit=True) as conn:
            pids = [
                int(row[0]) for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'spawnkit'"
                ).fetchall()
            ]  # fmt: skip
        for r in range(rounds):
            cpu, server = time.process_time(), server_cpu_s(pids)
            pg_s.append(record_runs(pg, f"r{r}", runs))
            pg_client.append((time.process_time() - cpu) / runs)
            pg_server.append((server_cpu_s(pids) - server) / runs)
            cpu = time.process_time()
            lite_s.append(record_runs(lite, f"r{r}", runs))
            lite_cpu.append((time.process_time() - cpu) / runs)
        slot_cycles = [slot_cycles_s(pg, runs // 4) for _ in range(rounds)]
        pg_live, lite_live = [], []
        for r in range(rounds):
            pg_live.append(live_calls(pg, f"live{r}", runs // 4))
            lite_live.append(live_calls(lite, f"live{r}", runs // 4))
        for threads, (pg_at_once, lite_at_once) in at_once.items():
            records_at_once(pg, f"warm{threads}", 4 * threads, threads)  # the pool grown
            for r in range(rounds):
                pg_at_once.append(records_at_once(pg, f"t{threads}r{r}", runs, threads))
                lite_at_once.append(records_at_once(lite, f"t{threads}r{r}", runs, threads))
    med = statistics.median
    pg_cpu = med(pg_client) + med(pg_server)
    trip = round_trip_s(url)
    return {
        "runs_per_round": runs,
        "rounds": rounds,
        "postgresql_backends": len(pids),  # the pool's connections (one thread: one)
        "postgresql_per_run_ms": round(med(pg_s) * 1000, 3),
        "sqlite_per_run_ms": round(med(lite_s) * 1000, 3),
        "ratio": round(med(pg_s) / med(lite_s), 3),
        # Three statements a run: what their round trips alone cost, at the least.
        "round_trip_ms": round(trip * 1000, 3),
        "round_trips_per_run_ms": round(3 * trip * 1000, 3),
        "cpu_per_run_ms": {
            "postgresql_client": round(med(pg_client) * 1000, 3),
            "postgresql_server": round(med(pg_server) * 1000, 3),
            "postgresql": round(pg_cpu * 1000, 3),
            "sqlite": round(med(lite_cpu) * 1000, 3),
            "ratio": round(pg_cpu / med(lite_cpu), 3),
        },
        # PostgreSQL only: SQLite's limits hold in one process, with no server to ask.
        "slot_per_run_ms": round(med(slot_cycles) * 1000, 3),
        "live_tool_call_write_ms": {
            "postgresql": round(med(pg_live) * 1000, 3),
            "sqlite": round(med(lite_live) * 1000, 3),
            "ratio": round(med(pg_live) / med(lite_live), 3),
        },
        "at_once": {
            f"{threads}_threads": {
                "postgresql_per_run_ms": round(med(pg_at_once) * 1000, 3),
                "sqlite_per_run_ms": round(med(lite_at_once) * 1000, 3),
                "ratio": round(med(pg_at_once) / med(lite_at_once), 3),
            }
            for threads, (pg_at_once, lite_at_once) in at_once.items()
        },
        "samples_ms": {
            "postgresql": [round(s * 1000, 3) for s in pg_s],
            "sqlite": [round(s * 1000, 3) for s in lite_s],
        },
    }


# -- whole runs ----------------------------------------------------------------------------------

RUN_SCENARIO = """
[[turn]]
tool = "mcp__*__state_get"
input = { key = "measurements/weight" }
usage = { input_tokens = 10, output_tokens = 2 }

[[turn]]
text = "done"
usage = { input_tokens = 12, output_tokens = 2 }
"""


async def _whole_runs(
    butlers: dict[str, Any], stores: dict[str, SessionStore], rounds: int
) -> dict[str, list[float]]:
    from spawnkit.replay import Scenario
    from spawnkit.serve.service import ButlerService

    scenario = Scenario.from_dict(tomllib.loads(RUN_SCENARIO), source="<store benchmark>")
    walls: dict[str, list[float]] = {name: [] for name in stores}
    async with contextlib.AsyncExitStack() as stack:
        services = {
            name: await stack.enter_async_context(
                ButlerService(butlers[name], store=stores[name], replay=scenario)
            )
            for name in stores
        }
        for service in services.values():  # warm-ups: servers up, the CLI's files cached
            await service.trigger("Say done.")
        for _ in range(rounds):
            for name, service in services.items():
                start = time.perf_counter()
                result = await service.trigger("Say done.")
                walls[name].append(time.perf_counter() - start)
                if not result.success or len(result.tool_calls) != 1:
                    raise SystemExit(f"a run on {name} failed: {result.error}")
    return walls


def measure_whole_runs(url: str, sqlite_path: Path, rounds: int) -> dict[str, Any]:
    """A whole run (the real Claude Code CLI in its sandbox, one MCP tool call, on the
    replay model) recorded on each store, rounds alternating: what the store adds to what a
    user waits for (PostgreSQL also takes the butler's slot across hosts)."""
    roster = Path(os.environ["SPAWNKIT_HOME"]) / "bench-roster"
    for name, port in (("postgresql", 18996), ("sqlite", 18997)):
        folder = roster / f"bench-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "butler.toml").write_text(
            f'[butler]\nname = "bench-{name}"\nport = {port}\ndescription = "store benchmark"\n'
        )
        (folder / "CLAUDE.md").write_text("Be brief.")
    from spawnkit.config.roster import load_roster

    loaded = load_roster(roster)
    butlers = {name: loaded[f"bench-{name}"] for name in ("postgresql", "sqlite")}
    with SessionStore(url) as pg, SessionStore(sqlite_path) as lite:
        walls = asyncio.run(_whole_runs(butlers, {"postgresql": pg, "sqlite": lite}, rounds))
    med = statistics.median
    pg_s, lite_s = med(walls["postgresql"]), med(walls["sqlite"])
    return {
        "rounds": rounds,
        "postgresql_median_s": round(pg_s, 4),
        "sqlite_median_s": round(lite_s, 4),
        "ratio": round(pg_s / lite_s, 3),
        "paired_difference_median_ms": round(
            med(p - q for p, q in zip(walls["postgresql"], walls["sqlite"], strict=True)) * 1000,
            1,
        ),
    }


# -- scale ---------------------------------------------------------------------------------------


def make_server_store(url: str, n_sessions: int, calls_per_session: int) -> None:
    """The same rows as ``history.make_store``, generated by the server itself."""
    SessionStore(url).close()
    stamp = "to_char(to_timestamp({}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS+00:00')"
    t0 = int(T0.timestamp())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET search_path TO spawnkit")
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute(
            f"""INSERT INTO sessions (id, butler, runtime, model, prompt, trigger_source, status,
                success, error, error_kind, output, num_tool_calls, duration_ms, input_tokens,
                output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, num_turns,
                trace_id, runtime_session_id, created_at, started_at, completed_at, owner_host,
                owner_pid, owner_start)
            SELECT lpad(to_hex(i), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(i), 12, '0'),
                (ARRAY['health', 'general', 'relationship', 'finance', 'travel'])[i %% 5 + 1],
                (ARRAY['claude-code', 'codex', 'gemini'])[i %% 3 + 1],
                'claude-sonnet-4-5', 'prompt ' || i, 'external',
                CASE WHEN i %% 11 = 0 THEN 'failed' ELSE 'success' END,
                (i %% 11 <> 0)::int, CASE WHEN i %% 11 = 0 THEN 'boom' END,
                CASE WHEN i %% 11 = 0 THEN 'crash' END, 'output', %s, 500 + (i * 7919) %% 120000,
                1000 + i %% 9000, 10 + i %% 900, i %% 50000, i %% 5000,
                CASE WHEN i %% 5 = 0 THEN NULL ELSE (i %% 100) / 1000.0 END, 1 + i %% 20,
                lpad(to_hex(i), 32, '0'),
                lpad(to_hex(i), 8, '0') || '-1111-4000-8000-' || lpad(to_hex(i), 12, '0'),
                {stamp.format("%s + i * 30")}, {stamp.format("%s + i * 30 + 1")},
                {stamp.format("%s + i * 30 + 10")}, 'host', 1, '1'
            FROM generate_series(0::bigint, %s::bigint - 1) AS i""",
            (calls_per_session, t0, t0, t0, n_sessions),
        )  # fmt: skip
        conn.execute(
            f"""INSERT INTO tool_calls (session_id, seq, call_id, name, server, tool, input,
                output, status, started_at, finished_at, duration_ms)
            SELECT lpad(to_hex(i), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(i), 12, '0'),
                j, 'toolu_' || (i + 1) || '_' || j,
                CASE WHEN j %% 3 = 0 THEN 'Bash' ELSE 'mcp__health__state_get' END,
                CASE WHEN j %% 3 = 0 THEN NULL ELSE 'health' END,
                CASE WHEN j %% 3 = 0 THEN 'Bash' ELSE 'state_get' END,
                '{{"key": "weight", "n": ' || j || '}}', 'result',
                CASE WHEN (i + 1 + j) %% 23 = 0 THEN 'error' ELSE 'ok' END,
                {stamp.format("%s + i * 30 + j")}, {stamp.format("%s + i * 30 + j + 1")}, 35
            FROM generate_series(0::bigint, %s::bigint - 1) AS i, generate_series(0, %s - 1) AS j
            ORDER BY i, j""",
            (t0, t0, n_sessions, calls_per_session),
        )  # fmt: skip
        conn.execute("VACUUM ANALYZE sessions")
        conn.execute("VACUUM ANALYZE tool_calls")


def latest_20(store: SessionStore) -> float:
    return timed(lambda: store.list_sessions(limit=20))


def command(target: str) -> float:
    """``spawnkit sessions`` as a user runs it: a fresh process."""
    env = {**os.environ, "SPAWNKIT_STORE": target}
    argv = [sys.executable, "-m", "spawnkit", "sessions"]
    return timed(lambda: subprocess.run(argv, env=env, check=True, capture_output=True))


def update_scattered(url: str, n_sessions: int, count: int) -> None:
    """``count`` sessions spread over the whole history updated (their cost set again)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """UPDATE spawnkit.sessions SET cost_usd = cost_usd WHERE id IN (
                SELECT lpad(to_hex(i), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(i), 12, '0')
                FROM generate_series(0::bigint, %s::bigint - 1, %s::bigint) AS i)""",
            (n_sessions, max(1, n_sessions // count)),
        )


def cache_mb() -> float:
    folder = Path(os.environ["SPAWNKIT_HOME"]) / "history-cache"
    return round(sum(f.stat().st_size for f in folder.glob("server-*/*.arrow")) / 1e6, 1)


def measure_scale(target: str, rounds: int, call_rounds: int = 2) -> dict[str, Any]:
    med = statistics.median
    server = target.startswith("postgresql")
    with SessionStore(target) as store:
        latest_20(store)
        recent = [latest_20(store) for _ in range(max(rounds, 5) * 3)]
        sessions_count = store.count_sessions()
    commands = [command(target) for _ in range(max(3, rounds // 2))]
    first = timed(lambda: frames.sessions(target))  # builds the columnar cache
    sessions_s = [timed(lambda: frames.sessions(target)) for _ in range(rounds)]
    narrow_s = [timed(lambda: frames.sessions(target, columns=NARROW)) for _ in range(rounds)]
    extra: dict[str, Any] = {}
    if server:
        extra["sessions_frame_uncached_s"] = round(
            timed(lambda: frames.sessions(target, cache=False)), 3
        )
        extra["cache_mb"] = cache_mb()
        # 1,000 old sessions change: merged into the cached columns in memory.
        update_scattered(target, sessions_count, 1000)
        changed = [timed(lambda: frames.sessions(target)) for _ in range(max(3, rounds // 2))]
        extra["sessions_frame_after_1000_updates_median_s"] = round(med(changed), 3)
        extra["samples_after_1000_updates_s"] = changed
    frames.tool_calls(target)  # SQLite: builds the columnar cache
    calls_s = [timed(lambda: frames.tool_calls(target)) for _ in range(call_rounds)]
    n_calls = len(frames.tool_calls(target, columns=["seq"]))
    return {
        **extra,
        "sessions": sessions_count,
        "tool_calls": n_calls,
        "latest_20_median_ms": round(med(recent) * 1000, 2),
        "latest_20_max_ms": round(max(recent) * 1000, 2),
        "sessions_command_median_s": round(med(commands), 3),
        "sessions_frame_first_s": round(first, 3),
        "sessions_frame_median_s": round(med(sessions_s), 3),
        "sessions_frame_4_columns_median_s": round(med(narrow_s), 3),
        "tool_calls_frame_median_s": round(med(calls_s), 3),
        "samples": {
            "latest_20_ms": [round(s * 1000, 2) for s in recent],
            "sessions_frame_s": sessions_s,
            "sessions_frame_4_columns_s": narrow_s,
            "tool_calls_frame_s": calls_s,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=200, help="records per round")
    parser.add_argument("--run-rounds", type=int, default=15, help="whole runs per store")
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=10, help="tool calls per session")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--backend", choices=["postgresql", "sqlite"], help="scale: measure one backend (the "
        "other's figures in --out, if any, are kept)",
    )  # fmt: skip
    parser.add_argument("--call-rounds", type=int, default=2, help="tool_calls() reads timed")
    parser.add_argument(
        "--only", choices=["records", "runs", "scale"], help="run one part (the others' "
        "figures in --out, if any, are kept)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    home = tempfile.mkdtemp(prefix="spawnkit-store-bench-")
    os.environ["SPAWNKIT_HOME"] = home
    try:
        return _run(args)
    finally:
        shutil.rmtree(home, ignore_errors=True)  # its columnar caches: gigabytes at full size


def _run(args: argparse.Namespace) -> int:
    WORK.mkdir(exist_ok=True)
    report: dict[str, Any] = (
        json.loads(args.out.read_text()) if args.only and args.out.exists() else {}
    )
    report.update(
        {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0],
        }
    )
    with postgres_server() as server:
        with server.admin() as conn:
            version = conn.execute("SHOW server_version").fetchone()
        report["postgresql"] = version[0] if version else None
        if args.only in (None, "records"):
            measure_records_into(report, server, args)
        if args.only in (None, "runs"):
            measure_whole_runs_into(report, server, args)
        if args.only in (None, "scale"):
            measure_scale_into(report, server, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def measure_records_into(report: dict[str, Any], server: Any, args: argparse.Namespace) -> None:
    records_db = server.create_database()
    lite = WORK / "store-records.db"
    lite.unlink(missing_ok=True)
    report["records"] = measure_records(server.url(records_db), lite, args.rounds, args.runs)
    report["records"]["date"] = report["date"]  # the run's: kept when another part is rerun
    rec = report["records"]
    cpu = rec["cpu_per_run_ms"]
    print(
        f"records: PostgreSQL {rec['postgresql_per_run_ms']} ms per run, SQLite "
        f"{rec['sqlite_per_run_ms']} ms: ratio {rec['ratio']} (target at most 2); CPU per "
        f"run: PostgreSQL {cpu['postgresql']} ms (client {cpu['postgresql_client']}, server "
        f"{cpu['postgresql_server']}), SQLite {cpu['sqlite']} ms: ratio {cpu['ratio']}; "
        f"a bare round trip {rec['round_trip_ms']} ms"
    )
    live = rec["live_tool_call_write_ms"]
    print(f"a run's slot across hosts (claimed, taken, given back): {rec['slot_per_run_ms']} ms")
    print(
        f"a tool call written live: PostgreSQL {live['postgresql']} ms, SQLite "
        f"{live['sqlite']} ms: ratio {live['ratio']}"
    )
    for threads, found in rec["at_once"].items():
        print(
            f"records, {threads.replace('_', ' ')} at once: PostgreSQL "
            f"{found['postgresql_per_run_ms']} ms per run, SQLite {found['sqlite_per_run_ms']} "
            f"ms: ratio {found['ratio']}"
        )


def measure_whole_runs_into(report: dict[str, Any], server: Any, args: argparse.Namespace) -> None:
    lite = WORK / "store-runs.db"
    lite.unlink(missing_ok=True)
    found = measure_whole_runs(server.url(server.create_database()), lite, args.run_rounds)
    report["runs"] = {"date": report["date"], **found}
    print(
        f"whole runs: PostgreSQL {found['postgresql_median_s']} s, SQLite "
        f"{found['sqlite_median_s']} s: ratio {found['ratio']} (paired difference "
        f"{found['paired_difference_median_ms']} ms)"
    )


def measure_scale_into(report: dict[str, Any], server: Any, args: argparse.Namespace) -> None:
    scale_db = server.create_database()
    url = server.url(scale_db)
    lite_big = WORK / f"store-{args.sessions}-{args.calls}.db"
    generated: dict[str, float] = {}
    if args.backend != "postgresql" and not lite_big.exists():
        generated["sqlite_s"] = round(
            timed(lambda: make_store(lite_big, args.sessions, args.calls)), 1
        )
    if args.backend != "sqlite":
        generated["postgresql_s"] = round(
            timed(lambda: make_server_store(url, args.sessions, args.calls)), 1
        )
    report["generated"] = {**report.get("generated", {}), **generated}
    print(f"generated in {generated}")
    report.setdefault("scale", {})
    for name, target in (("postgresql", url), ("sqlite", str(lite_big))):
        if args.backend not in (None, name):
            continue
        found = {"date": report["date"], **measure_scale(target, args.rounds, args.call_rounds)}
        report["scale"][name] = found
        print(f"{name}: {found['sessions']} sessions, {found['tool_calls']} tool calls; "
              f"latest 20 {found['latest_20_median_ms']} ms (target under 50), "
              f"`spawnkit sessions` {found['sessions_command_median_s']} s, "
              f"sessions() {found['sessions_frame_median_s']} s warm (target under 2; "
              f"first {found['sessions_frame_first_s']} s), "
              f"tool_calls() {found['tool_calls_frame_median_s']} s")  # fmt: skip
    with server.admin(scale_db) as conn:
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    if args.backend != "sqlite":
        report["scale"]["postgresql"]["mb"] = round(size[0] / 1e6, 1) if size else None
    if args.backend != "postgresql":
        report["scale"]["sqlite"]["mb"] = round(lite_big.stat().st_size / 1e6, 1)


if __name__ == "__main__":
    sys.exit(main())
