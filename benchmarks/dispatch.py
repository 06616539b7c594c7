"""What running a trigger on a Dask worker adds over running it in-process.

The same butler and one-turn replay scenario (the real Claude Code CLI, in its sandbox)
run both ways, rounds alternating after a warm-up each (the warm-up starts the worker's
butler service: its MCP and replay servers, kept for later runs):

* in-process: ``ButlerService(...).trigger(PROMPT)``;
* dispatched: ``Spawner(..., cluster=Cluster(client, replay=scenario)).trigger(PROMPT)`` on
  a ``LocalCluster`` of one worker process.

A run's wall time is mostly its CLI, whose own time varies by more than the overhead
looked for; so each run's overhead is its wall time minus the duration its record holds
(measured inside the spawner that ran it, on the worker for a dispatched run), and the
figure is the difference of the medians of that, dispatched minus in-process: the time
spent submitting the task, starting it on the worker, streaming the events and bringing
the result back. Usage::

    .venv/bin/python benchmarks/dispatch.py [--rounds 15] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "dispatch.json"
SCENARIO = """
[[turn]]
text = "done"
usage = { input_tokens = 10, output_tokens = 2 }
"""
PROMPT = "Say done."


async def timed(trigger: Any) -> tuple[float, float]:
    """(wall seconds, seconds the run's record holds) of one trigger."""
    clock = time.perf_counter()
    result = await trigger(PROMPT)
    wall = time.perf_counter() - clock
    if not result.success:
        raise SystemExit(f"a run failed: {result.error}")
    return wall, result.duration_ms / 1000


async def measure(rounds: int, client: Any, butler: Any, store: Any) -> dict[str, Any]:
    from spawnkit.replay import Scenario
    from spawnkit.run import Spawner
    from spawnkit.run.dispatch import Cluster
    from spawnkit.serve.service import ButlerService

    scenario = Scenario.from_dict(tomllib.loads(SCENARIO), source="<dispatch benchmark>")
    sides: dict[str, list[tuple[float, float]]] = {"local": [], "dask": []}
    with Cluster(client, replay=scenario) as cluster:
        remote = Spawner(butler, store=store, cluster=cluster)
        async with ButlerService(butler, store=store, replay=scenario) as service:
            await timed(service.trigger)  # warm-ups: servers started, CLI version read
            await timed(remote.trigger)
            for _ in range(rounds):
                sides["local"].append(await timed(service.trigger))
                sides["dask"].append(await timed(remote.trigger))

    def summary(runs: list[tuple[float, float]]) -> dict[str, float]:
        return {
            "wall_median_s": round(statistics.median(w for w, _ in runs), 4),
            "outside_run_median_ms": round(statistics.median(w - d for w, d in runs) * 1000, 1),
        }

    local, dask = summary(sides["local"]), summary(sides["dask"])
    return {
        "rounds": rounds,
        "in_process": local,
        "dask": dask,
        "dispatch_overhead_ms": round(
            dask["outside_run_median_ms"] - local["outside_run_median_ms"], 1
        ),
    }


def _measure_in(home: Path, rounds: int) -> dict[str, Any]:
    """The measurements, with the roster, store and state in ``home``."""
    os.environ["SPAWNKIT_HOME"] = str(home / "state")  # before the workers start
    roster = home / "roster" / "bench"
    roster.mkdir(parents=True)
    (roster / "butler.toml").write_text(
        '[butler]\nname = "bench"\nport = 18999\ndescription = "dispatch benchmark"\n'
    )
    (roster / "CLAUDE.md").write_text("Be brief.")

    import distributed

    from spawnkit.config.roster import load_roster
    from spawnkit.store import SessionStore

    butler = load_roster(home / "roster")["bench"]
    with (
        distributed.LocalCluster(
            processes=True, n_workers=1, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
        SessionStore(home / "sessions.db") as store,
    ):
        report = asyncio.run(measure(rounds, client, butler, store))
    report["distributed"] = distributed.__version__
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="spawnkit-dispatch-bench-"))
    try:
        report = _measure_in(home, args.rounds)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"in-process: {report['in_process']['wall_median_s']:.3f} s a run, "
        f"{report['in_process']['outside_run_median_ms']:.1f} ms outside the run\n"
        f"dask:       {report['dask']['wall_median_s']:.3f} s a run, "
        f"{report['dask']['outside_run_median_ms']:.1f} ms outside the run\n"
        f"dispatch overhead: {report['dispatch_overhead_ms']:.1f} ms a run (median)",
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
