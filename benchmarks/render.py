"""Cost of the live run view: 10,000 events into one RunView, on spawnkit's background loop.

The view must cost the same per event at the end of a long run as at the
start (the ratio of the CPU time of the last 1,000 events to the first 1,000,
target at most 1.5) and send at most about 20 frontend messages a second.
Messages are captured by a comm that serializes each one to JSON, as the
kernel would, so their cost is counted. The event mix is a busy agent: tool
calls started and finished, streamed text, usage updates, delivered at about
3,000 events a second. For contrast, the same events rendered the naive way
(the whole transcript re-rendered per event) are timed on the first 2,000.

    .venv/bin/python benchmarks/render.py
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spawnkit.events import (
    Finished,
    RunEvent,
    Started,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from spawnkit.notebook.loop import BackgroundLoop
from spawnkit.notebook.view import RunView
from spawnkit.result import SpawnerResult, ToolCall, Usage

RESULTS = Path(__file__).resolve().parent / "results" / "render.json"
SID = "bench-session"


class RecordingComm:
    """Stands in for the kernel comm: serializes each message and remembers when it went."""

    comm_id = "render-benchmark"
    kernel = "recording"  # ipywidgets sends only through a comm with a kernel

    def __init__(self) -> None:
        self.sent: list[tuple[float, int]] = []

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self.sent.append((time.monotonic(), len(json.dumps(data, default=str))))

    def close(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_msg(self, *args: Any, **kwargs: Any) -> None:
        pass


def make_events(n: int) -> list[RunEvent]:
    """``n`` events plus a final Finished."""
    events: list[RunEvent] = [Started(SID, "bench", "claude-code", "replay", "r1")]
    now = datetime.now(UTC)
    i = 0
    while len(events) < n:
        i += 1
        call = ToolCall.start(f"call-{i}", "mcp__bench__state_get", {"key": f"k{i}"}, now)
        events.append(ToolCallStarted(SID, call))
        events.append(TextDelta(SID, f"Looking at item {i}. "))
        events.append(ToolCallFinished(SID, call.finish(f"value {i} " * 20, i % 17 == 0, now)))
        events.append(UsageUpdate(SID, Usage(1000 * i, 50 * i, 900 * i, 0), 0.001 * i, i))
    events = events[:n]
    events.append(Finished(SID, SpawnerResult(output="done", session_id=SID)))
    return events


async def feed(view: RunView, events: list[RunEvent], per_second: int) -> list[float]:
    """Deliver events at the given pace; return the CPU seconds of each 1,000.

    The final Finished event (one closing snapshot, once per run) is not part
    of any chunk: the chunks measure the steady per-event cost.
    """
    chunk_cpu: list[float] = []
    started = time.monotonic()
    cpu = time.thread_time()
    for index, event in enumerate(events, 1):
        if isinstance(event, Finished):
            view.handle(event)
            break
        view.handle(event)
        if index % 100 == 0:
            # Pace the stream; flushes scheduled by the view run during this wait.
            await asyncio.sleep(max(0.0, started + index / per_second - time.monotonic()))
        if index % 1000 == 0:
            now = time.thread_time()
            chunk_cpu.append(now - cpu)
            cpu = now
    return chunk_cpu


def naive_cost(events: list[RunEvent]) -> list[float]:
    """CPU seconds per 1,000 events when each event re-renders the whole transcript."""
    rows: dict[str, str] = {}
    text: list[str] = []
    costs = []
    cpu = time.thread_time()
    for index, event in enumerate(events, 1):
        if isinstance(event, ToolCallStarted | ToolCallFinished):
            rows[event.call.id] = (
                f"<details><summary>{html.escape(event.call.tool)}</summary></details>"
            )
        elif isinstance(event, TextDelta):
            text.append(event.text)
        page = "".join(rows.values()) + html.escape("".join(text))
        json.dumps({"value": page})
        if index % 1000 == 0:
            now = time.thread_time()
            costs.append(now - cpu)
            cpu = now
    return costs


def max_per_window(times: list[float], window: float = 1.0) -> int:
    best, start = 0, 0
    for end in range(len(times)):
        while times[end] - times[start] > window:
            start += 1
        best = max(best, end - start + 1)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=3_000, help="events per second")
    parser.add_argument("--rounds", type=int, default=3, help="fresh views, median reported")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    events = make_events(args.events)
    loop = BackgroundLoop(name="render-bench")

    def schedule(delay: float, callback: Any) -> None:
        loop.loop.call_later(delay, callback)

    async def one_round() -> dict[str, Any]:
        comm = RecordingComm()
        view = RunView(schedule=schedule)
        view.comm = comm
        comm.sent.clear()
        t0 = time.monotonic()
        chunks = await feed(view, events, args.rate)
        await asyncio.sleep(0.1)
        wall = time.monotonic() - t0
        sent_at = [t for t, _ in comm.sent]
        return {
            "wall_s": wall,
            "cpu_total_s": sum(chunks),
            "first": chunks[0],
            "last": chunks[-1],
            "ratio": chunks[-1] / chunks[0],
            "messages": len(sent_at),
            "messages_per_s": len(sent_at) / wall,
            "max_in_1s": max_per_window(sent_at),
            "bytes": sum(size for _, size in comm.sent),
            "rows_kept": len(view.state.items),
        }

    rounds = [loop.submit(one_round()).future.result() for _ in range(args.rounds)]
    loop.stop()
    naive = naive_cost(events[:2000])

    def median(key: str) -> float:
        return float(statistics.median(r[key] for r in rounds))

    report = {
        "benchmark": "render",
        "events": args.events,
        "feed_rate_per_s": args.rate,
        "rounds": args.rounds,
        "wall_s": round(median("wall_s"), 3),
        "cpu_total_s": round(median("cpu_total_s"), 4),
        "cpu_per_event_us": round(median("cpu_total_s") / args.events * 1e6, 1),
        "cpu_first_1000_s": round(median("first"), 4),
        "cpu_last_1000_s": round(median("last"), 4),
        "last_to_first_ratio": round(median("ratio"), 3),
        "ratios": [round(r["ratio"], 3) for r in rounds],
        "messages": int(median("messages")),
        "messages_per_s": round(median("messages_per_s"), 1),
        "max_messages_in_1s": max(r["max_in_1s"] for r in rounds),
        "bytes_sent": int(median("bytes")),
        "rows_kept": rounds[-1]["rows_kept"],
        "naive_first_1000_s": round(naive[0], 4),
        "naive_second_1000_s": round(naive[1], 4),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"render: {args.events} events, {report['cpu_total_s']} s CPU "
        f"({report['cpu_per_event_us']} µs/event), last/first 1000 ratio "
        f"{report['last_to_first_ratio']} (target <= 1.5), {report['messages_per_s']} msgs/s, "
        f"max {report['max_messages_in_1s']} in any second (target <= 20); naive re-render: "
        f"{report['naive_first_1000_s']} s then {report['naive_second_1000_s']} s per 1000 events"
    )


if __name__ == "__main__":
    main()
