"""``spawnkit.map`` throughput: 40 short runs on 4 slots against 10 single runs, in one run.

With 4 slots, 40 runs are 10 rounds of 4, so the ideal wall time of the batch is 10 times
the time of one run made alone. The baseline is measured in the same process, on the same
butler service, replay scenario and CLI: single runs (one prompt each through
``spawnkit.map``), half before and half after the batch so drift on a shared machine hits
both. The figure is ``batch wall time / (10 x median single run)``; the issue's target is
at most 1.2. On a 2-core machine 4 CLIs at once compete for the CPU, which this measures
too. Usage::

    .venv/bin/python benchmarks/batch.py [--runs 40] [--slots 4] [--singles 8]
        [--runtime codex] [--out benchmarks/results/batch.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "batch.json"
SCENARIO = """
[[script]]
match = "(?i)say (\\\\w+)"
  [[script.turn]]
  delay_ms = {delay_ms}
  text = "{{{{ match.1 }}}}"
  usage = {{ input_tokens = 500, output_tokens = 10 }}
"""
MODELS = {"claude-code": "claude-sonnet-4-5", "codex": "replay-gpt-5", "gemini": "gemini-2.5-flash"}


def measure(
    runtime: str, runs: int, slots: int, singles: int, delay_ms: int, work: Path
) -> dict[str, Any]:
    os.environ["SPAWNKIT_HOME"] = str(work / "home")
    import spawnkit
    from spawnkit.config.roster import load_roster
    from spawnkit.notebook.hub import Hub
    from spawnkit.store import SessionStore

    base = load_roster(ROOT / "roster")["general"].with_runtime(runtime)
    settings = {"max_concurrent_sessions": slots, "max_queued_sessions": runs}
    butler = dataclasses.replace(base, runtime=dataclasses.replace(base.runtime, **settings))
    scenario = work / "say.toml"
    scenario.write_text(SCENARIO.format(delay_ms=delay_ms))
    hub = Hub(SessionStore(work / "sessions.db"))
    options: dict[str, Any] = {
        "replay": scenario,
        "hub": hub,
        "progress": "none",
        "model": MODELS[runtime],
    }

    def single(n: int) -> float:
        start = time.perf_counter()
        frame = spawnkit.map(butler, [f"say single{n}"], **options)
        took = time.perf_counter() - start
        if not frame["success"].all():
            raise SystemExit(f"a single run failed: {frame['error'].tolist()}")
        return took

    try:
        single(0)  # warm-up: the butler's service, the CLI's first start
        times = [single(n) for n in range(1, singles // 2 + 1)]
        start = time.perf_counter()
        frame = spawnkit.map(
            butler, [f"say batch{n}" for n in range(runs)], max_concurrent=slots, **options
        )
        wall = time.perf_counter() - start
        if not frame["success"].all():
            raise SystemExit(f"batch runs failed: {frame['error'].dropna().tolist()[:3]}")
        times += [single(n) for n in range(singles // 2 + 1, singles + 1)]
    finally:
        hub.close()
    median = statistics.median(times)
    rounds = runs / slots
    return {
        "runtime": runtime,
        "runs": runs,
        "slots": slots,
        "model_delay_ms": delay_ms,
        "single_runs": len(times),
        "single_median_s": round(median, 3),
        "batch_wall_s": round(wall, 3),
        "ideal_s": round(rounds * median, 3),
        "ratio": round(wall / (rounds * median), 3),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--singles", type=int, default=8)
    parser.add_argument("--runtime", default="codex")
    parser.add_argument(
        "--model-delay-ms",
        type=int,
        default=2000,
        help="how long the replay model takes to answer (a real model takes seconds)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="spawnkit-batch-bench-") as work:
        report = measure(
            args.runtime, args.runs, args.slots, args.singles, args.model_delay_ms, Path(work)
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{report['runtime']} (model answers in {report['model_delay_ms']} ms): "
        f"{report['runs']} runs on {report['slots']} slots in "
        f"{report['batch_wall_s']:.2f} s; single run median {report['single_median_s']:.3f} s; "
        f"ratio to {report['runs'] // report['slots']} single runs {report['ratio']:.3f} "
        "(target <= 1.2)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
