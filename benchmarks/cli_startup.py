"""How long the command line takes to start, against a bare Python start in the same run.

Each command is run as a fresh process, the way a user or an orchestrator polling the
adapter contract runs it, with a private ``SPAWNKIT_HOME`` holding a store of
``--sessions`` recorded runs:

* baseline: ``python -c pass`` (the interpreter alone);
* ``spawnkit --version``, ``spawnkit sessions`` and ``spawnkit adapter claude-code
  check_status ID`` (the commands that must stay under 0.25 s);
* for contrast, ``python -c "import spawnkit.serve.service"``: what every command paid before
  imports became lazy (the MCP server, the agent SDK, OpenTelemetry);
* what a run's process imports (the butler's service, Claude Code's adapter and its SDK),
  and the same with ``jsonschema`` imported first, which builds its IRI parsers at import
  as it did before spawnkit deferred them (:mod:`spawnkit._deferred`).

Rounds alternate between the commands after one warm-up each, so drift on a shared
machine hits all alike; the figures are medians of wall time and of the process's CPU
(``getrusage`` of the waited child), and each command's ratio to the baseline. Usage::

    .venv/bin/python benchmarks/cli_startup.py [--rounds 15] [--out FILE] [--no-warm-up]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spawnkit.result import SpawnerResult
from spawnkit.store import SessionStore

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cli_startup.json"
TARGET_S = 0.25


def commands(session_id: str) -> dict[str, list[str]]:
    python = sys.executable
    cli = [python, "-m", "spawnkit"]
    return {
        "python -c pass": [python, "-c", "pass"],
        "spawnkit --version": [*cli, "--version"],
        "spawnkit sessions": [*cli, "sessions"],
        "adapter check_status": [*cli, "adapter", "claude-code", "check_status", session_id],
        "import spawnkit.serve.service": [python, "-c", "import spawnkit.serve.service"],
        "a run's imports": [python, "-c", RUN_IMPORTS],
        "a run's imports, IRI parsers at import": [
            python,
            "-c",
            f"import jsonschema; {RUN_IMPORTS}",
        ],
    }


RUN_IMPORTS = "import spawnkit.serve.service, spawnkit.runtimes.claude_code"


def fill_store(path: Path, sessions: int) -> str:
    with SessionStore(path) as store:
        for i in range(sessions):
            store.create_session(
                f"bench-{i:05d}", butler="health", runtime="claude-code", model=None,
                prompt=f"prompt {i}", context=None, trigger_source="external",
            )  # fmt: skip
            store.complete_session(f"bench-{i:05d}", SpawnerResult(output="ok", success=True))
    return f"bench-{sessions - 1:05d}"


def time_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and the command's CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode(errors='replace')}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--warm-up",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each command once before the rounds (the tests skip it)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spawnkit-bench-startup-") as scratch:
        home = Path(scratch)
        env = {**os.environ, "SPAWNKIT_HOME": str(home), "NO_COLOR": "1"}
        session_id = fill_store(home / "sessions.db", args.sessions)
        argvs = commands(session_id)
        times: dict[str, list[float]] = {name: [] for name in argvs}
        cpus: dict[str, list[float]] = {name: [] for name in argvs}
        for argv in argvs.values() if args.warm_up else ():
            time_once(argv, env)  # warm-up: the page cache, .pyc files
        for _ in range(args.rounds):
            for name, argv in argvs.items():
                wall, cpu = time_once(argv, env)
                times[name].append(wall)
                cpus[name].append(cpu)
    baseline = statistics.median(times["python -c pass"])
    report: dict[str, object] = {"rounds": args.rounds, "sessions": args.sessions,
                                 "target_s": TARGET_S, "commands": {}}  # fmt: skip
    for name, values in times.items():
        median, cpu = statistics.median(values), statistics.median(cpus[name])
        entry = {
            "median_s": round(median, 4),
            "min_s": round(min(values), 4),
            "ratio_to_baseline": round(median / baseline, 2),
            "cpu_median_s": round(cpu, 4),
        }
        report["commands"][name] = entry  # type: ignore[index]
        print(f"{name:<40} median {median:.3f} s  min {min(values):.3f} s  CPU {cpu:.3f} s  "
              f"ratio to python -c pass {median / baseline:.2f}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
