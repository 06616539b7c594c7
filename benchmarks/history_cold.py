"""Cold transcript load, CPU of every process: ccusage, this checkout and another, alternating.

``benchmarks/history.py`` measures one build against ccusage; telling two builds apart on a
shared machine needs them measured in turns within one run. Each round runs ccusage's
``session --json --offline`` on the corpus, then a cold load of the same corpus by each
build (the order swapped every round), each in a fresh child process that makes a warm-up
load first (the parse server's start and imports are not counted: they are paid once per
process) and then counts one cold load's CPU through a cgroup of its own, so the parse
server and its workers count too. The corpus and ccusage are those of ``history.py``.
Every load's token total must equal the first one's. Usage::

    .venv/bin/python benchmarks/history_cold.py --spawnkit-from DIR [--rounds 5] [--size-mb 1000]

``DIR`` holds the baseline's ``spawnkit`` package (for instance ``git archive main spawnkit |
tar -x -C DIR``); results go to ``benchmarks/results/history_cold_ab.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from history import WORK, CpuCounter, ccusage_binary, corpus_of, run_ccusage  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "history_cold_ab.json"


def load_once(corpus: Path) -> dict[str, float]:
    """In the child: a warm-up cold load, then one counted cold load (CPU via a cgroup)."""
    from spawnkit import history
    from spawnkit.history.workers import SERVER

    counter = CpuCounter()
    homes = Path(tempfile.mkdtemp(prefix="spawnkit-history-cold-"))
    try:
        os.environ["SPAWNKIT_HOME"] = tempfile.mkdtemp(dir=homes)
        history.transcripts("claude", root=corpus)
        os.environ["SPAWNKIT_HOME"] = tempfile.mkdtemp(dir=homes)
        before, start = counter.seconds(), time.perf_counter()
        loaded = history.transcripts("claude", root=corpus)
        wall, after = time.perf_counter() - start, counter.seconds()
        tokens = int(loaded.daily()["total_tokens"].sum())
    finally:
        SERVER.stop()  # a cgroup with a process left in it cannot be removed
        counter.close()
        shutil.rmtree(homes, ignore_errors=True)
    cpu = None if before is None or after is None else after - before
    return {"cpu": cpu, "wall": wall, "tokens": tokens}


def run_child(source: Path, corpus: Path) -> dict[str, Any]:
    """One counted cold load by the ``spawnkit`` package under ``source``."""
    code = (
        f"import sys; sys.path[:0] = [{str(source)!r}, {str(ROOT / 'benchmarks')!r}]; "
        "import json, spawnkit, history_cold; from pathlib import Path; "
        f"assert spawnkit.__file__.startswith({str(source)!r}), spawnkit.__file__; "
        f"print(json.dumps(history_cold.load_once(Path({str(corpus)!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=900
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawnkit-from", type=Path, required=True, dest="baseline")
    parser.add_argument("--size-mb", type=float, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    corpus = corpus_of(args.work, args.size_mb)
    binary = ccusage_binary()
    builds = {"baseline": args.baseline.resolve(), "this": ROOT}
    cpu: dict[str, list[float]] = {"ccusage": [], "baseline": [], "this": []}
    tokens: set[int] = set()
    counter = CpuCounter()
    try:
        for n in range(args.rounds):
            before = counter.seconds()
            run_ccusage(binary, corpus, "session")
            after = counter.seconds()
            if before is None or after is None:
                raise SystemExit("no cgroup could be made: CPU cannot be counted")
            cpu["ccusage"].append(after - before)
            for name in ("baseline", "this") if n % 2 == 0 else ("this", "baseline"):
                result = run_child(builds[name], corpus)
                cpu[name].append(result["cpu"])
                tokens.add(result["tokens"])
            print(f"round {n + 1}: ccusage {cpu['ccusage'][-1]:.2f} CPU-s, baseline "
                  f"{cpu['baseline'][-1]:.2f}, this {cpu['this'][-1]:.2f} (load average "
                  f"{os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    finally:
        counter.close()
    if len(tokens) != 1:
        raise SystemExit(f"the builds' token totals differ: {sorted(tokens)}")
    med = statistics.median
    ours, base, theirs = med(cpu["this"]), med(cpu["baseline"]), med(cpu["ccusage"])
    paired = sorted(t / b for t, b in zip(cpu["this"], cpu["baseline"], strict=True))
    report = {
        "rounds": args.rounds,
        "baseline": str(builds["baseline"]),
        "ccusage_cpu_median_s": round(theirs, 3),
        "baseline_cpu_median_s": round(base, 3),
        "this_cpu_median_s": round(ours, 3),
        "baseline_vs_ccusage_cpu_ratio": round(base / theirs, 3),
        "this_vs_ccusage_cpu_ratio": round(ours / theirs, 3),
        "this_vs_baseline_cpu_ratio": round(ours / base, 3),
        "this_vs_baseline_paired": [round(p, 3) for p in paired],
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "tokens": tokens.pop(),
        "samples": cpu,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"CPU vs ccusage: baseline {report['baseline_vs_ccusage_cpu_ratio']:.3f}, this "
          f"{report['this_vs_ccusage_cpu_ratio']:.3f}; this vs baseline "
          f"{report['this_vs_baseline_cpu_ratio']:.3f} (paired {paired[0]:.3f} to "
          f"{paired[-1]:.3f})\nwrote {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
