"""What spawnkit's side of CLI telemetry costs per run: a run's receiver, replayed.

``spawn_overhead.py --cli-telemetry`` measures a whole run, where Codex's own exporting and
the noise of a 0.4 CPU-s run hide a few milliseconds either way. This one isolates what
spawnkit does with one run's telemetry: it captures the export requests of one real Codex
run (every signal, through the spawner, against the replay model), then replays them run
after run into a fresh :class:`~spawnkit.telemetry.otlp.OtlpReceiver` each time, the way a
run's receiver lives: started, the requests POSTed over loopback HTTP (a connection each,
as the CLI's exporters open them), stopped, what it kept stored in a SQLite store. Each
choice of signals (``logs``, ``all``...) replays the requests of those signals; the figure is
this process's CPU per run (the median of batches, with their spread), the posting client
included. "Before" is the same command with older code first on ``PYTHONPATH``. Usage::

    .venv/bin/python benchmarks/otlp_receiver.py [--runs 40] [--batches 5] [--choices logs,all]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from spawn_overhead import KEY, PROMPT, ROOT, SCENARIO

from spawnkit._asgi import serve_in_thread
from spawnkit.config.cli_telemetry import CLI_SIGNALS
from spawnkit.config.roster import load_roster
from spawnkit.containment.mcp_access import AccessTable
from spawnkit.redaction import Redactor
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.run import Spawner
from spawnkit.serve.butler_server import ButlerServer
from spawnkit.store import SessionStore
from spawnkit.telemetry import otlp

RESULTS = ROOT / "benchmarks" / "results" / "otlp_receiver.json"
# One captured request: (signal, body, content type).
Request = tuple[str, bytes, str]


def capture(work: Path) -> list[Request]:
    """The export requests of one real Codex run with every signal on."""
    got: list[Request] = []
    decode = otlp.OtlpReceiver._decode

    def keeping(
        self: otlp.OtlpReceiver, signal: str, body: bytes, content_type: str, encoding: str
    ) -> Any:
        got.append((signal, body, content_type))
        return decode(self, signal, body, content_type, encoding)

    base = load_roster(ROOT / "roster")["health"]
    butler = dataclasses.replace(base, runtime=dataclasses.replace(base.runtime, type="codex"))
    store = SessionStore(work / "capture.db")
    replay = ReplayServer(Scenario.from_dict(tomllib.loads(SCENARIO), source="benchmark"))
    access = AccessTable()
    os.environ["OPENAI_API_KEY"] = KEY
    otlp.OtlpReceiver._decode = keeping  # type: ignore[method-assign]
    try:
        with (
            serve_in_thread(replay.app) as model,
            serve_in_thread(ButlerServer(butler, store, access=access).app()) as mcp,
        ):
            spawner = Spawner(butler, store=store, base_url=model.url, mcp_port=mcp.port,
                              mcp_access=access, cli_telemetry="all")  # fmt: skip
            result = asyncio.run(spawner.trigger(PROMPT))
    finally:
        otlp.OtlpReceiver._decode = decode  # type: ignore[method-assign]
    if not result.success or not got:
        raise SystemExit(f"the Codex run to capture failed: {result.error}")
    return got


async def post(endpoint: str, secret: str, request: Request) -> None:
    signal, body, content_type = request
    host, port = endpoint.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /v1/{signal} HTTP/1.1\r\nhost: {host}\r\ncontent-type: {content_type}\r\n"
        f"{otlp.SECRET_HEADER}: {secret}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    answer = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in answer.split(b"\r\n")[0]:
        raise SystemExit(f"the receiver answered {answer[:60]!r}")
    writer.close()
    await writer.wait_closed()


async def one_run(requests: list[Request], signals: frozenset[str], store: SessionStore) -> None:
    """A run's receiver: the run's secrets and prompt to redact, its requests, its rows."""
    redactor = Redactor({"CANARY_TOKEN": "canary-7Hq2Xv9Lp4Rt"})
    for name in ("SPAWNKIT_MCP_SECRET", "SPAWNKIT_RELAY_SECRET"):
        redactor.add_run_secret(name, secrets.token_urlsafe(24))  # type: ignore[arg-type]
    receiver = otlp.OtlpReceiver(
        secrets.token_hex(8), redactor, prompt=PROMPT, run_trace=("ab" * 16, "cd" * 8),
        signals=signals,  # type: ignore[arg-type]
    )  # fmt: skip
    redactor.add_run_secret("SPAWNKIT_OTLP_SECRET", receiver.secret)
    async with receiver.serve() as telemetry:
        for request in requests:
            await post(telemetry.endpoint, receiver.secret, request)
    await asyncio.to_thread(store.record_cli_spans, [s.row() for s in receiver.finished()])
    await asyncio.to_thread(store.record_cli_events, [e.row() for e in receiver.events])


def measure(
    requests: list[Request], choice: str, runs: int, batches: int, work: Path
) -> dict[str, Any]:
    signals = CLI_SIGNALS if choice == "all" else frozenset(choice.split("+"))
    chosen = [r for r in requests if r[0] in signals]
    store = SessionStore(work / f"{choice}.db")

    async def batch(count: int) -> float:
        start = time.process_time()
        for _ in range(count):
            await one_run(chosen, signals, store)
        return (time.process_time() - start) / count

    runner = asyncio.Runner()
    runner.run(batch(5))  # warm-up
    per_run = [runner.run(batch(runs)) for _ in range(batches)]
    runner.close()
    return {
        "requests": len(chosen), "bytes": sum(len(r[1]) for r in chosen),
        "cpu_per_run_ms": round(statistics.median(per_run) * 1000, 2),
        "cpu_per_run_spread_ms": [round(min(per_run) * 1000, 2), round(max(per_run) * 1000, 2)],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="runs per batch")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--choices", default="logs,all")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "benchmark": "otlp_receiver", "python": sys.version.split()[0], "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()], "runs": args.runs,
        "batches": args.batches, "choices": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="otlp-receiver-") as folder:
        work = Path(folder)
        requests = capture(work)
        for choice in args.choices.split(","):
            figures = measure(requests, choice, args.runs, args.batches, work)
            report["choices"][choice] = figures
            low, high = figures["cpu_per_run_spread_ms"]
            print(f"{choice}: {figures['requests']} requests, {figures['bytes']} bytes: "
                  f"{figures['cpu_per_run_ms']} ms of CPU per run ({low}..{high})")  # fmt: skip
    report["load_average"] += [round(x, 2) for x in os.getloadavg()]
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
