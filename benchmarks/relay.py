"""What the run's model relay adds to a streamed model response, against the upstream direct.

Three processes, as in a real run: a model server (an upstream that streams an Anthropic
Messages answer at once), the relay (:func:`spawnkit.containment.relay.open_relay` with a key to
swap, the spawner's part) and the client (the CLI's part, a plain ``http.client`` on one
keep-alive connection, as the CLIs keep theirs). The client reaches the upstream:

* ``direct``: on its TCP port;
* ``relay tcp``: through the relay on 127.0.0.1 TCP (a run without a sandbox);
* ``relay uds``: through the relay serving on a unix socket (a sandboxed run's door);
* ``relay tcp metered``: through a relay that also meters usage (Codex and Gemini runs
  with a token or dollar limit parse every event as it passes);
* ``relay uds metered``: the same on a unix socket, as a sandboxed run with a limit meets it;
* ``door bridge``: through a door bridged to the upstream's TCP port
  (:func:`spawnkit.containment.doors.open_doors`), the way a sandboxed run reaches the
  butler's MCP server: bytes spliced, no HTTP parsed.

Two figures, rounds alternating between the ways so drift on a shared machine hits all
alike: time to first byte of a streamed answer (median of many small requests; the relay's
target is at most 2 ms more than direct), and the throughput of a 10 MB streamed answer
(target: at least 0.9 of direct), with the CPU seconds the relay process spent on it
(beside the upstream's, for scale). On a machine with fewer free cores than the three
processes need, the throughput ratio measures the contention more than the relay: the
relay's CPU per MB is the figure that carries over. Usage::

    .venv/bin/python benchmarks/relay.py [--rounds 5] [--requests 200] [--megabytes 10]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "relay.json"
TTFB_TARGET_MS = 2.0
THROUGHPUT_TARGET = 0.9
CHUNK_TEXT = 4000  # characters of text per streamed delta (about 4 KB an event)
WAYS = ("direct", "relay tcp", "relay uds", "relay tcp metered", "relay uds metered",
        "door bridge")  # fmt: skip
KEY = "sk-ant-api03-" + "k" * 95

# The frames of the model server's answer (also read in this process by `processing`).
FRAMES = r"""
import json

def frame(event):
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()

START = frame({"type": "message_start", "message": {"id": "m", "type": "message",
    "role": "assistant", "model": "m", "content": [], "stop_reason": None,
    "usage": {"input_tokens": 5, "output_tokens": 0}}})
DELTA = frame({"type": "content_block_delta", "index": 0,
    "delta": {"type": "text_delta", "text": "x" * CHUNK_TEXT}})
END = b"".join(frame(e) for e in (
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"}))
BLOCK = frame({"type": "content_block_start", "index": 0,
    "content_block": {"type": "text", "text": ""}})
""".replace("CHUNK_TEXT", str(CHUNK_TEXT))

# The model server: streams `size` bytes of text deltas for POST /v1/messages?size=N.
UPSTREAM = (
    FRAMES
    + r"""
import asyncio, sys
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route
from spawnkit._asgi import serve

async def messages(request):
    await request.body()
    size = int(request.query_params.get("size", "0"))
    async def stream():
        yield START
        yield BLOCK
        sent = 0
        while sent < size:
            yield DELTA
            sent += len(DELTA)
        yield END
    return StreamingResponse(stream(), media_type="text/event-stream")

async def main():
    app = Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])
    async with serve(app) as address:
        print(address.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""
)

# The relay: its URL (with its secret) goes to stdout, a pipe, never a command line.
RELAY = r"""
import asyncio, json, sys
from pathlib import Path
from spawnkit.containment.credentials import KeySwap
from spawnkit.budgets.metering import Meter
from spawnkit.containment.relay import open_relay

async def main():
    upstream, uds, metered, key = json.loads(sys.stdin.readline())
    keys = KeySwap()
    placeholder = keys.hide({"ANTHROPIC_API_KEY": key})["ANTHROPIC_API_KEY"]
    sink = Meter(lambda usage: None) if metered else None
    async with open_relay(upstream, sink=sink, keys=keys, uds=Path(uds) if uds else None) as r:
        print(json.dumps({"url": r.url, "socket": uds, "key": placeholder}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""

# A door bridged to the upstream's port: the path of its socket goes to stdout.
BRIDGE = r"""
import asyncio, json, sys
from pathlib import Path
from spawnkit.containment.doors import open_doors

async def main():
    port, folder = json.loads(sys.stdin.readline())
    async with open_doors(Path(folder), [port]) as doors:
        print(json.dumps({"socket": str(doors.doors[0].socket)}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


class TcpConnection(http.client.HTTPConnection):
    """``http.client`` with Nagle off, as the CLIs' own HTTP clients have it (node's, and
    reqwest's): otherwise delayed ACKs add 40 ms to small requests, on every way alike."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class UnixConnection(http.client.HTTPConnection):
    """``http.client`` over a unix socket (a CLI inside the sandbox reaches a TCP port
    of the sandbox's forwarder; the unix socket is what that forwarder connects to)."""

    def __init__(self, path: str) -> None:
        super().__init__("127.0.0.1")
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        self.sock = sock


@contextmanager
def child(code: str, first_line: str = "") -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A helper process running ``code``; what it prints first. It ends when its stdin does."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        if first_line:
            proc.stdin.write(first_line + "\n")
            proc.stdin.flush()
        yield proc, proc.stdout.readline().strip()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


class Way:
    """One way to the upstream: a keep-alive connection and the path prefix to use."""

    def __init__(self, connection: http.client.HTTPConnection, prefix: str, key: str) -> None:
        self.connection = connection
        self.prefix = prefix
        self.headers = {"x-api-key": key, "content-type": "application/json"}

    def request(self, size: int) -> tuple[float, int]:
        """(seconds to the first body byte, bytes read) of one streamed answer."""
        body = json.dumps({"model": "m", "max_tokens": 1, "stream": True, "messages": []})
        clock = time.perf_counter()
        self.connection.request(
            "POST", f"{self.prefix}/v1/messages?size={size}", body=body, headers=self.headers
        )
        response = self.connection.getresponse()
        first = response.read1(65536)
        ttfb = time.perf_counter() - clock
        total = len(first)
        while chunk := response.read1(65536):
            total += len(chunk)
        if response.status != 200:
            raise SystemExit(f"{self.prefix or 'direct'}: HTTP {response.status}")
        return ttfb, total


def relay_way(port: int, scratch: Path, name: str, stack: list[Any]) -> tuple[Way, int]:
    """Start a relay process for way ``name``; the way through it, and the relay's pid."""
    if name == "door bridge":
        context = child(BRIDGE, json.dumps([port, str(scratch)]))
        proc, line = context.__enter__()
        stack.append(context)
        return Way(UnixConnection(json.loads(line)["socket"]), "", KEY), proc.pid
    uds = str(scratch / f"{name.replace(' ', '-')}.sock") if "uds" in name else ""
    setup = json.dumps([f"http://127.0.0.1:{port}", uds, "metered" in name, KEY])
    context = child(RELAY, setup)
    proc, line = context.__enter__()
    stack.append(context)
    told = json.loads(line)
    url = told["url"].removeprefix("http://")
    address, _, prefix = url.partition("/")
    if uds:
        connection: http.client.HTTPConnection = UnixConnection(uds)
    else:
        host, _, relay_port = address.partition(":")
        connection = TcpConnection(host, int(relay_port))
    return Way(connection, "/" + prefix, told["key"]), proc.pid


def cpu_seconds(pid: int) -> float:
    """The CPU time of process ``pid``'s threads: nanoseconds from ``/proc/PID/schedstat``
    where the kernel keeps it, else ``stat``'s clock ticks (10 ms apart)."""
    try:
        return (
            sum(
                int(Path(task, "schedstat").read_text().split()[0])
                for task in Path(f"/proc/{pid}/task").iterdir()
            )
            / 1e9
        )
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(rounds: int, requests: int, megabytes: float) -> dict[str, Any]:
    size = int(megabytes * 1024 * 1024)
    ttfb: dict[str, list[float]] = {name: [] for name in WAYS}
    rate: dict[str, list[float]] = {name: [] for name in WAYS}
    cpu: dict[str, list[float]] = {name: [] for name in WAYS if name != "direct"}
    cpu_small: dict[str, list[float]] = {name: [] for name in cpu}
    cpu_connection: dict[str, list[float]] = {name: [] for name in cpu}
    upstream_cpu: list[float] = []
    stack: list[Any] = []
    with (
        tempfile.TemporaryDirectory(prefix="spawnkit-bench-relay-") as scratch,
        child(UPSTREAM) as (upstream, port_line),
    ):
        port = int(port_line)
        ways: dict[str, Way] = {"direct": Way(TcpConnection("127.0.0.1", port), "", KEY)}
        pids: dict[str, int] = {}
        try:
            for name in WAYS[1:]:
                ways[name], pids[name] = relay_way(port, Path(scratch), name, stack)
            for way in ways.values():  # warm-up: connections, imports, the relay's client
                for _ in range(5):
                    way.request(0)
                way.request(size)
            for _ in range(rounds):
                for name, way in ways.items():
                    before = cpu_seconds(pids[name]) if name in pids else 0.0
                    ttfb[name] += [way.request(0)[0] for _ in range(requests)]
                    if name in pids:
                        cpu_small[name].append((cpu_seconds(pids[name]) - before) / requests)
                        # A connection a request, as a CLI's MCP client often opens them.
                        before = cpu_seconds(pids[name])
                        for _ in range(requests // 4):
                            way.connection.close()
                            way.request(0)
                        spent = cpu_seconds(pids[name]) - before
                        cpu_connection[name].append(spent / (requests // 4))
                    before = cpu_seconds(pids[name]) if name in pids else 0.0
                    upstream_before = cpu_seconds(upstream.pid)
                    clock = time.perf_counter()
                    _, got = way.request(size)
                    rate[name].append(got / (time.perf_counter() - clock) / 1e6)
                    if name in pids:
                        cpu[name].append(cpu_seconds(pids[name]) - before)
                    else:
                        upstream_cpu.append(cpu_seconds(upstream.pid) - upstream_before)
        finally:
            for context in reversed(stack):
                context.__exit__(None, None, None)
    direct_ttfb = statistics.median(ttfb["direct"]) * 1000
    direct_rate = statistics.median(rate["direct"])
    report: dict[str, Any] = {
        "rounds": rounds, "requests_per_round": requests, "megabytes": megabytes,
        "ttfb_target_added_ms": TTFB_TARGET_MS, "throughput_target_ratio": THROUGHPUT_TARGET,
        "upstream_cpu_s_per_mb": round(statistics.median(upstream_cpu) / megabytes, 4),
        "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
        "ways": {},
    }  # fmt: skip
    for name in WAYS:
        median_ttfb = statistics.median(ttfb[name]) * 1000
        median_rate = statistics.median(rate[name])
        entry: dict[str, Any] = {
            "ttfb_median_ms": round(median_ttfb, 3),
            "ttfb_added_ms": round(median_ttfb - direct_ttfb, 3),
            "throughput_mb_s": round(median_rate, 1),
            "throughput_ratio": round(median_rate / direct_rate, 3),
        }
        # Each round's ratio to direct in the same round: the drift between rounds cancels.
        paired = sorted(a / b for a, b in zip(rate[name], rate["direct"], strict=True))
        entry["throughput_ratio_paired"] = round(statistics.median(paired), 3)
        entry["throughput_ratio_paired_range"] = [round(paired[0], 3), round(paired[-1], 3)]
        if name in cpu:
            entry["relay_cpu_s_per_mb"] = round(statistics.median(cpu[name]) / megabytes, 4)
            entry["relay_cpu_ms_per_request"] = round(statistics.median(cpu_small[name]) * 1e3, 4)
            entry["relay_cpu_ms_per_connection"] = round(
                statistics.median(cpu_connection[name]) * 1e3, 4
            )
        report["ways"][name] = entry
        print(f"{name:<18} ttfb {median_ttfb:6.2f} ms (+{median_ttfb - direct_ttfb:5.2f})  "
              f"{median_rate:7.1f} MB/s  ratio {median_rate / direct_rate:.3f}"
              f" (paired {entry['throughput_ratio_paired']:.3f})"
              + (f"  relay cpu {entry['relay_cpu_s_per_mb'] * 1000:.1f} ms/MB, "
                 f"{entry['relay_cpu_ms_per_request'] * 1000:.0f} us/request, "
                 f"{entry['relay_cpu_ms_per_connection'] * 1000:.0f} us/connection"
                 if name in cpu else ""))  # fmt: skip
    print(f"upstream cpu {report['upstream_cpu_s_per_mb'] * 1000:.1f} ms/MB; "
          f"load average {report['load_average']} on {report['cpus']} CPUs")  # fmt: skip
    return report


def processing(megabytes: float, rounds: int = 5) -> dict[str, float]:
    """CPU per MB of what the relay does to a body in its own code, in this process, without
    sockets: a chunked 10 MB answer (the upstream's frames, each its own chunk) read in the
    relay's read size through its chunked-body scanner, alone (``relay``), with the payload
    taken out and metered as the relay meters (``metered``), and rebuilt whole as record
    mode does (``whole turn``). Unlike the figures through three processes on shared
    cores, these do not depend on where the scheduler puts the processes."""
    from spawnkit import _http1 as wire
    from spawnkit.budgets.metering import Meter
    from spawnkit.replay.server import turn_tap

    answer: dict[str, Any] = {}
    exec(FRAMES, answer)  # the model server's own frames
    delta = answer["DELTA"]
    count = int(megabytes * 1e6 // len(delta))
    frames = [answer["START"], answer["BLOCK"], *[delta] * count, answer["END"]]
    body = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"
    reads = [body[i : i + wire.READ_SIZE] for i in range(0, len(body), wire.READ_SIZE)]
    request = json.dumps({"model": "m", "max_tokens": 1, "stream": True, "messages": []})

    def once(metered: bool, usage_only: bool) -> None:
        scanner = wire._ChunkScanner()
        tap = turn_tap(
            Meter(lambda usage: None), "POST", "/v1/messages", request.encode(), {}, 200,
            "text/event-stream", usage_only=usage_only,
        ) if metered else None  # fmt: skip
        for data in reads:
            _, pieces = scanner.feed(data, payload=metered)
            if tap is not None:
                tap.feed(b"".join(pieces))
        if tap is not None:
            tap.close()
        if not scanner.done:
            raise SystemExit("the scanner did not find the body's end")

    ways = {"relay": (False, True), "metered": (True, True), "whole turn": (True, False)}
    spent: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds + 1):  # the first round warms up
        for name, args in ways.items():
            clock = time.process_time()
            once(*args)
            spent[name].append((time.process_time() - clock) * 1000 / (len(body) / 1e6))
    return {name: round(statistics.median(values[1:]), 3) for name, values in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200, help="small requests a round")
    parser.add_argument("--megabytes", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    report = measure(args.rounds, args.requests, args.megabytes)
    report["in_process_cpu_ms_per_mb"] = done = processing(args.megabytes)
    print("in process, CPU per MB: " + ", ".join(f"{k} {v:.2f} ms" for k, v in done.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
