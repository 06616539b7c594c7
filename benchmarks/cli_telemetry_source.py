"""What a CLI's own exporting of its telemetry costs, per signal, before spawnkit reads a byte.

``spawn_overhead.py --cli-telemetry`` counts what the telemetry adds to a run: the CLI's
exporting and spawnkit's receiving together. This one takes spawnkit's side away: the
CLI runs bare (the exact command, files and environment the adapter builds, as
``spawn_overhead.py``'s bare side), exporting to a receiver that reads each request
and answers 200 without decoding it, and its CPU is counted per run (a direct child:
``RUSAGE_CHILDREN``). Each variant is a choice of signals as ``[butler.telemetry] cli``
takes it (``off``, ``all``, ``logs``, ``traces``, ``metrics``, ``logs+metrics``...);
rounds alternate between them, each round starting one later, and the figure is the
median of each round's difference against ``off``, with its spread, plus what each
variant sent (requests and bytes per signal). Usage::

    .venv/bin/python benchmarks/cli_telemetry_source.py [--rounds 12] [--runtime codex]
        [--variants off,all,logs,traces,metrics] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spawn_overhead import KEY, PROMPT, ROOT, SCENARIO

from spawnkit._asgi import serve_in_thread
from spawnkit.config.cli_telemetry import parse_choice
from spawnkit.config.roster import ButlerConfig, load_roster
from spawnkit.config.system_prompt import compose_system_prompt, read_prompt_file
from spawnkit.containment.mcp_access import AccessTable
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.runtimes import get_adapter
from spawnkit.runtimes.base import McpServerSpec, RunSpec
from spawnkit.serve.butler_server import ButlerServer
from spawnkit.store import SessionStore
from spawnkit.telemetry.otlp import CliTelemetry

RESULTS = ROOT / "benchmarks" / "results" / "cli_telemetry_source.json"


class Sink:
    """An OTLP/HTTP receiver that reads each request whole, counts it and decodes nothing."""

    def __init__(self) -> None:
        self.got: collections.Counter[str] = collections.Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        signal = scope["path"].removeprefix("/v1/")
        self.got[f"{signal}_requests"] += 1
        self.got[f"{signal}_bytes"] += size
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"0")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b""})


def bare_run(
    runtime: str, butler: ButlerConfig, urls: dict[str, str], work: Path, secret: str
) -> Callable[[str], float]:
    """One bare run of the CLI exporting ``variant``'s signals to the sink: its CPU seconds."""
    adapter = get_adapter(runtime)(butler.runtime)
    system_prompt = compose_system_prompt(
        butler, read_prompt_file(butler.system_prompt_file, butler.roster_dir)
    )
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "OPENAI_API_KEY": KEY,
           "GEMINI_API_KEY": KEY}  # fmt: skip

    def run(variant: str) -> float:
        workspace = Path(tempfile.mkdtemp(prefix="bare-", dir=work))
        try:
            server = McpServerSpec(butler.name, "http", urls["mcp"], secret)
            telemetry = None
            if variant != "off":
                signals = parse_choice(variant).for_run(runtime)
                telemetry = CliTelemetry(urls["sink"], "bench", "sink-secret", signals)
            spec = RunSpec(
                session_id="bench", butler=butler.name, prompt=PROMPT,
                system_prompt=system_prompt, workspace=workspace, cwd=workspace,
                mcp_server=server, config_file=adapter.build_config_file(workspace, server),
                env=env, max_turns=20, tools=butler.runtime.tools, base_url=urls["replay"],
                telemetry=telemetry,
            )  # fmt: skip
            command = adapter.command(spec)  # type: ignore[attr-defined]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(
                command, env=adapter.child_env(spec), cwd=spec.cwd, capture_output=True,
                timeout=120, input=adapter.stdin(spec),  # type: ignore[attr-defined]
            )  # fmt: skip
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode or b"measurements/weight" not in done.stdout:
                raise SystemExit(f"bare {runtime} ({variant}) failed: {done.stderr[-500:]!r}")
            return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        finally:
            shutil.rmtree(workspace, ignore_errors=True)

    return run


def measure(runtime: str, rounds: int, variants: list[str], work: Path) -> dict[str, Any]:
    base = load_roster(ROOT / "roster")["health"]
    butler = dataclasses.replace(base, runtime=dataclasses.replace(base.runtime, type=runtime))
    store = SessionStore(work / f"{runtime}.db")
    replay = ReplayServer(Scenario.from_dict(tomllib.loads(SCENARIO), source="benchmark"))
    access = AccessTable()
    secret = asyncio.run(access.grant("bench"))
    sink = Sink()
    with (
        serve_in_thread(replay.app) as replay_address,
        serve_in_thread(ButlerServer(butler, store, access=access).app()) as mcp_address,
        serve_in_thread(sink) as sink_address,
    ):
        urls = {"replay": replay_address.url, "sink": sink_address.url,
                "mcp": f"http://localhost:{mcp_address.port}/mcp?session_id=bench"}  # fmt: skip
        run = bare_run(runtime, butler, urls, work, secret)
        sent: dict[str, dict[str, int]] = {}
        for variant in variants:  # warm-up, and what each sends
            sink.got.clear()
            run(variant)
            sent[variant] = dict(sink.got)
        cpu: dict[str, list[float]] = {variant: [] for variant in variants}
        for round_ in range(rounds):
            first = round_ % len(variants)
            for variant in variants[first:] + variants[:first]:
                cpu[variant].append(run(variant))
    report: dict[str, Any] = {"rounds": rounds, "variants": {}}
    for variant in variants:
        figures: dict[str, Any] = {
            "cpu_median_s": round(statistics.median(cpu[variant]), 4),
            "cpu_s": [round(x, 4) for x in cpu[variant]],
            "sent": sent[variant],
        }
        if "off" in cpu:
            extra = [on - off for on, off in zip(cpu[variant], cpu["off"], strict=True)]
            figures["extra_cpu_s"] = round(statistics.median(extra), 4)
            figures["extra_cpu_spread_s"] = [round(min(extra), 4), round(max(extra), 4)]
            figures["share"] = round(statistics.median(extra) / statistics.median(cpu["off"]), 3)
        report["variants"][variant] = figures
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--runtime", default="codex")
    parser.add_argument("--variants", default="off,all,logs,traces,metrics")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spawnkit-bench-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    os.environ["HOME"] = str(work / "home")
    os.environ["SPAWNKIT_HOME"] = str(work / "spawnkit")
    (work / "home").mkdir()
    load = os.getloadavg()
    result = measure(args.runtime, args.rounds, args.variants.split(","), work)
    report = {
        "benchmark": "cli_telemetry_source", "python": sys.version.split()[0],
        "cpus": os.cpu_count(), "runtime": args.runtime,
        "load_average": [round(x, 2) for x in (*load, *os.getloadavg())],
        **result,
    }  # fmt: skip
    for variant, figures in result["variants"].items():
        print(
            f"{args.runtime} {variant}: CPU per run {figures['cpu_median_s']} s"
            + (f", {figures['extra_cpu_s']:+} s over off ({figures['share']:+.1%})"
               if "extra_cpu_s" in figures else "")
            + f"; sent {figures['sent']}",
            flush=True,
        )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
