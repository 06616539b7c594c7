"""spawnkit's own cost of a run: no-op triggers against the same child started bare, in one run.

The butler's runtime is the ``command`` runtime running ``true``: the child does nothing, so
what a trigger costs beyond it is spawnkit's (admission, record, workspace, span, assembly,
parsing, the end-of-run reap, cleanup). Sides, alternating round by round after a warm-up:

* bare: ``true`` started with a bare ``asyncio.create_subprocess_exec``, its output read,
  waited for;
* unsandboxed: ``Spawner.trigger`` of a butler with ``[butler.sandbox] mode = "none"``;
* sandboxed: the same butler in its bubblewrap sandbox (skipped where bwrap cannot run).

The figure is the CPU of this process (``RUSAGE_SELF``: every thread of it, not its
children, which ``RUSAGE_CHILDREN`` counts apart) per run, median over rounds, for one run
at a time and for 100 triggered at once (with their wall time), and the wall time from
the call to the child's first instruction (``to_cli_start_ms``: the child is ``date``,
which prints the clock it starts at; one run at a time, 50 ms apart, median of a round's
runs). ``*_own_cpu_ms`` minus the
bare side's is what spawnkit adds. ``--host-processes N`` keeps N more idle processes on
the host while it measures: the end-of-run reap of an unsandboxed run once scanned every
process, so its cost grew with their number. Usage::

    .venv/bin/python benchmarks/trigger.py [--rounds 7] [--batch 20] [--concurrent 100]
        [--host-processes 0] [--no-sandbox]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "trigger.json"
TRUE = shutil.which("true") or "/bin/true"
DATE = shutil.which("date") or "/bin/date"
BUTLER = """
[butler]
name = "{name}"
port = {port}
description = "a no-op butler"
[butler.runtime]
type = "command"
command = {command}
output = "text"
max_concurrent_sessions = {concurrent}
max_queued_sessions = {concurrent}
[butler.sandbox]
mode = "{mode}"
"""


def own_cpu_s() -> float:
    """CPU seconds of this process so far (all its threads; not its children)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def bare() -> None:
    proc = await asyncio.create_subprocess_exec(
        TRUE, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"bare {TRUE} exited {proc.returncode}")


async def bare_start() -> float:
    """Seconds from the call to the child's first instruction (``date`` prints the clock)."""
    asked = time.time()
    proc = await asyncio.create_subprocess_exec(
        DATE, "+%s.%N", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return float(out) - asked


def start_via(spawner: Any) -> Callable[[], Awaitable[float]]:
    """Seconds from ``trigger`` to its CLI's first instruction (a butler running ``date``)."""

    async def trigger() -> float:
        asked = time.time()
        result = await spawner.trigger("what time is it")
        if not result.success:
            raise SystemExit(f"trigger failed: {result.error}")
        return float(result.output.strip()) - asked

    return trigger


def via(spawner: Any) -> Callable[[], Awaitable[None]]:
    async def trigger() -> None:
        result = await spawner.trigger("nothing to do")
        if not result.success:
            raise SystemExit(f"trigger failed: {result.error}")

    return trigger


async def timed(
    run: Callable[[], Awaitable[None]], count: int, at_once: bool
) -> tuple[float, float]:
    """(wall s, own CPU s) of ``count`` runs, one after another or all at once."""
    wall, cpu = time.perf_counter(), own_cpu_s()
    if at_once:
        await asyncio.gather(*(run() for _ in range(count)))
    else:
        for _ in range(count):
            await run()
    return time.perf_counter() - wall, own_cpu_s() - cpu


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}  # fmt: skip


async def measure(
    rounds: int, batch: int, concurrent: int, sides: dict[str, Any], clocks: dict[str, Any]
) -> dict[str, Any]:
    runs = {"bare": bare, **{name: via(spawner) for name, spawner in sides.items()}}
    starts = {"bare": bare_start, **{name: start_via(spawner) for name, spawner in clocks.items()}}
    for run in runs.values():  # warm-up: imports, caches, the sandbox probe
        await timed(run, 2, at_once=False)
    for start in starts.values():
        await start()
    one: dict[str, list[float]] = {side: [] for side in runs}
    many_wall: dict[str, list[float]] = {side: [] for side in runs}
    many_cpu: dict[str, list[float]] = {side: [] for side in runs}
    to_start: dict[str, list[float]] = {side: [] for side in runs}
    for _ in range(rounds):
        for side, run in runs.items():
            _, cpu = await timed(run, batch, at_once=False)
            one[side].append(cpu / batch * 1000)
            wall, cpu = await timed(run, concurrent, at_once=True)
            many_wall[side].append(wall)
            many_cpu[side].append(cpu)
            # One run at a time, a pause before each: the machine as a single run finds it.
            latencies = []
            for _ in range(batch):
                await asyncio.sleep(0.05)
                latencies.append(await starts[side]())
            to_start[side].append(statistics.median(latencies) * 1000)
    report: dict[str, Any] = {}
    for side in runs:
        report[side] = {
            "own_cpu_ms_per_run": spread(one[side]),
            f"concurrent_{concurrent}_wall_s": spread(many_wall[side]),
            f"concurrent_{concurrent}_own_cpu_s": spread(many_cpu[side]),
            "to_cli_start_ms": spread(to_start[side]),
        }
        if side != "bare":
            added = statistics.median(one[side]) - statistics.median(one["bare"])
            report[side]["added_own_cpu_ms_per_run"] = round(added, 3)
    return report


def make_spawners(
    home: Path, concurrent: int, sandboxed: bool, command: tuple[str, ...] = (TRUE,),
    name: str = "roster",
) -> dict[str, Any]:  # fmt: skip
    from spawnkit.config.roster import load_roster
    from spawnkit.run import Spawner
    from spawnkit.store import SessionStore

    roster = home / name
    modes = {"unsandboxed": "none", **({"sandboxed": "bwrap"} if sandboxed else {})}
    for port, (side, mode) in enumerate(modes.items(), start=18901):
        folder = roster / side
        folder.mkdir(parents=True)
        (folder / "butler.toml").write_text(BUTLER.format(
            name=side, port=port, command=json.dumps(list(command)), concurrent=concurrent,
            mode=mode,
        ))  # fmt: skip
        (folder / "CLAUDE.md").write_text(f"You are the {side} butler.")
    butlers = load_roster(roster)
    store = SessionStore(home / "sessions.db")
    return {side: Spawner(butlers[side], store=store) for side in modes}


def sandbox_works() -> bool:
    from spawnkit.containment.sandbox import available_bwrap
    from spawnkit.errors import SandboxUnavailable

    try:
        available_bwrap()
    except SandboxUnavailable as exc:
        print(f"no sandboxed side: {exc}", file=sys.stderr)
        return False
    return True


@contextlib.contextmanager
def idle_processes(count: int) -> Iterator[None]:
    """``count`` sleeping processes on the host for as long as the block runs."""
    sleepers = [subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield
    finally:
        for sleeper in sleepers:
            sleeper.kill()
        for sleeper in sleepers:
            sleeper.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=20, help="runs per round, one at a time")
    parser.add_argument("--concurrent", type=int, default=100, help="runs triggered at once")
    parser.add_argument("--no-sandbox", action="store_true", help="skip the sandboxed side")
    parser.add_argument("--host-processes", type=int, default=0, help="idle processes to add")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    # Each unsandboxed run warns that it has no sandbox: known, and not what is measured.
    logging.getLogger("spawnkit.containment.sandbox").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="spawnkit-trigger-bench-") as tmp:
        home = Path(tmp)
        os.environ["SPAWNKIT_HOME"] = str(home / "home")
        sandboxed = not args.no_sandbox and sandbox_works()
        spawners = make_spawners(home, args.concurrent, sandboxed)
        clocks = make_spawners(home, 1, sandboxed, (DATE, "+%s.%N"), name="clocks")
        with idle_processes(args.host_processes):
            host_processes = sum(1 for entry in Path("/proc").iterdir() if entry.name.isdigit())
            sides = asyncio.run(measure(args.rounds, args.batch, args.concurrent, spawners, clocks))
    result = {
        "benchmark": "trigger", "python": sys.version.split()[0], "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()], "rounds": args.rounds,
        "batch": args.batch, "concurrent": args.concurrent, "host_processes": host_processes,
        "sides": sides,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for side, figures in sides.items():
        many = f"concurrent_{args.concurrent}"
        print(
            f"{side}: {figures['own_cpu_ms_per_run']['median']} ms own CPU a run; "
            f"{args.concurrent} at once: {figures[f'{many}_wall_s']['median']} s wall, "
            f"{figures[f'{many}_own_cpu_s']['median']} CPU-s; "
            f"{figures['to_cli_start_ms']['median']} ms from trigger to the CLI's start"
        )
    print(f"load average {result['load_average']}")


if __name__ == "__main__":
    main()
