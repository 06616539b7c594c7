"""What ``%load_ext spawnkit`` costs a kernel, against the same IPython shell without it.

Each round starts two fresh processes, alternating, each with an IPython shell (what a
kernel has before its first cell):

* baseline: the shell alone;
* spawnkit: the shell, then ``%load_ext spawnkit`` (the magics registered, the start-up
  sweep of the store, the stop-signal handlers).

Inside the spawnkit process the extension's own cost is measured around the magic: wall
time, CPU time, the growth of the peak resident set, and the modules it imported. For
contrast, a third process imports what a run needs (``spawnkit.notebook.runner`` and
``.asking``: the views and the MCP server stack), which the extension loaded at once
before it became lazy. The figures are medians; the target is at most 0.3 s and 15 MB.
Usage::

    .venv/bin/python benchmarks/load_ext.py [--rounds 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "load_ext.json"
TARGET_S, TARGET_MB = 0.3, 15.0

PROBE = """
import json, resource, sys, time
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
before = set(sys.modules)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
wall, cpu = time.perf_counter(), time.process_time()
{action}
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "rss_mb": grown,
                   "modules": len(set(sys.modules) - before)}}))
"""
ACTIONS = {
    "baseline": "pass",
    "load_ext": 'ip.run_line_magic("load_ext", "spawnkit")',
    "run machinery": "import spawnkit.notebook.runner, spawnkit.notebook.asking",
}


def once(action: str, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(action=ACTIONS[action])],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{action} failed: {done.stderr[-2000:]}")
    return elapsed, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spawnkit-bench-load-ext-") as scratch:
        env = {**os.environ, "SPAWNKIT_HOME": scratch, "IPYTHONDIR": f"{scratch}/ipython"}
        for action in ACTIONS:
            once(action, env)  # warm-up: files in the page cache
        process: dict[str, list[float]] = {a: [] for a in ACTIONS}
        inside: dict[str, list[dict[str, Any]]] = {a: [] for a in ACTIONS}
        for _ in range(args.rounds):
            for action in ACTIONS:
                elapsed, measured = once(action, env)
                process[action].append(elapsed)
                inside[action].append(measured)
    report: dict[str, Any] = {
        "benchmark": "load_ext", "python": sys.version.split()[0], "cpus": os.cpu_count(),
        "rounds": args.rounds, "target_s": TARGET_S, "target_mb": TARGET_MB, "sides": {},
    }  # fmt: skip
    for action in ACTIONS:
        figures = {
            key: round(statistics.median(m[key] for m in inside[action]), 4)
            for key in ("wall_s", "cpu_s", "rss_mb", "modules")
        }
        figures["process_median_s"] = round(statistics.median(process[action]), 4)
        figures["process_ratio"] = round(
            figures["process_median_s"] / statistics.median(process["baseline"]), 3
        )
        figures["cpu_s_spread"] = [
            round(min(m["cpu_s"] for m in inside[action]), 4),
            round(max(m["cpu_s"] for m in inside[action]), 4),
        ]
        report["sides"][action] = figures
        print(
            f"{action}: {figures['wall_s']:.3f} s wall, {figures['cpu_s']:.3f} s CPU "
            f"(spread {figures['cpu_s_spread']}), +{figures['rss_mb']:.1f} MB, "
            f"{figures['modules']} modules; the whole process x{figures['process_ratio']:.3f} "
            "the shell alone",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
