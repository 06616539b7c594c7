"""The run's OTLP receiver over real HTTP: secret, protobuf, JSON, gzip, chunked, redaction."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from spawnkit import _asgi
from spawnkit.events import Timing
from spawnkit.redaction import Redactor
from spawnkit.telemetry.otlp import (
    MAX_BODY_BYTES,
    MAX_IN_FLIGHT,
    MAX_SPANS,
    SECRET_HEADER,
    OtlpReceiver,
)
from spawnkit.telemetry.otlp_export import FORWARD_DRAIN_S, OtlpTarget

RUN_TRACE = ("ab" * 16, "cd" * 8)
TELEMETRY_EVENTS = Path(__file__).parent / "fixtures" / "telemetry" / "log_events.json"


def any_value(value: Any) -> AnyValue:
    """A plain attribute value as OTLP sends it (a list as its JSON text)."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=value if isinstance(value, str) else json.dumps(value))


def protobuf_body(trace_id: bytes, session: str) -> bytes:
    span = Span(
        trace_id=trace_id, span_id=b"\x01" * 8, name="llm_request",
        start_time_unix_nano=1_000_000_000, end_time_unix_nano=1_250_000_000,
        attributes=[KeyValue(key="model", value=AnyValue(string_value="replay-model"))],
    )  # fmt: skip
    resource = ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])
    resource.resource.attributes.extend(
        [
            KeyValue(key="spawnkit.session_id", value=AnyValue(string_value=session)),
            KeyValue(key="process.command_args", value=AnyValue(string_value="gemini -p hi")),
        ]
    )
    return ExportTraceServiceRequest(resource_spans=[resource]).SerializeToString()


def json_body(secret_value: str) -> bytes:
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": []},
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "traceId": RUN_TRACE[0],
                                    "spanId": "02" * 8,
                                    "parentSpanId": RUN_TRACE[1],
                                    "name": "tool",
                                    "startTimeUnixNano": "5",
                                    "endTimeUnixNano": "9",
                                    "status": {"code": 2},
                                    "attributes": [
                                        {"key": "out", "value": {"stringValue": secret_value}},
                                        {"key": "n", "value": {"intValue": "3"}},
                                    ],
                                }
                            ]
                        }
                    ],
                }
            ]
        }
    ).encode()


async def chunks(data: bytes, size: int = 7) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def test_receiver_accepts_only_its_secret_in_every_encoding() -> None:
    receiver = OtlpReceiver(
        "s1", Redactor({"TOKEN": "tok-1234567890"}), prompt="say hi please", run_trace=RUN_TRACE
    )
    async with receiver.serve() as telemetry, httpx.AsyncClient() as http:
        url = telemetry.traces_url
        proto = protobuf_body(b"\x07" * 16, "s1")
        refused = await http.post(url, content=proto, headers={SECRET_HEADER: "wrong"})
        assert refused.status_code == 401
        ok = await http.post(
            url,
            content=gzip.compress(proto),
            headers={**telemetry.headers, "content-type": "application/x-protobuf",
                     "content-encoding": "gzip"},
        )  # fmt: skip
        assert ok.status_code == 200
        chunked = await http.post(
            url,
            content=chunks(json_body("value tok-1234567890 and say hi please")),
            headers={**telemetry.headers, "content-type": "application/json"},
        )
        assert chunked.status_code == 200 and chunked.json() == {}
        bad = await http.post(url, content=b"\xff\x00", headers=telemetry.headers)
        assert bad.status_code == 400
    assert receiver.refused == 1
    moved, tool = receiver.finished()
    # The protobuf span: another trace, this session: moved under the run's span.
    assert (moved.trace_id, moved.parent_span_id, moved.reparented) == (*RUN_TRACE, True)
    assert moved.attributes["spawnkit.original_trace_id"] == "07" * 16
    assert moved.attributes["model"] == "replay-model"
    assert "resource.process.command_args" not in moved.attributes
    assert (moved.start_ns, moved.end_ns) == (1_000_000_000, 1_250_000_000)
    # The JSON span: already in the run's trace; its secret and the prompt redacted.
    assert (tool.trace_id, tool.parent_span_id, tool.reparented) == (*RUN_TRACE, False)
    assert (tool.status, tool.attributes["n"]) == ("error", 3)
    assert "tok-1234567890" not in tool.attributes["out"]
    assert "say hi please" not in tool.attributes["out"]


def test_the_users_collector_comes_from_the_standard_variables() -> None:
    assert OtlpTarget.from_env({}) is None
    target = OtlpTarget.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20k,x-a=1",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:9/t",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-t=2",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        }
    )
    assert target is not None
    assert target.urls == {"traces": "http://traces:9/t", "metrics": "http://collector:4318/v1/metrics",
                           "logs": "http://collector:4318/v1/logs"}  # fmt: skip
    assert target.headers["traces"] == {"x-t": "2"}
    assert target.headers["logs"] == {"authorization": "Bearer k", "x-a": "1"}
    assert target.timeout_s == 2.5
    assert "Bearer" not in repr(target)


async def test_forwarded_requests_are_redacted_and_rejoined() -> None:
    collector = OtlpReceiver("collector", Redactor())  # redacts nothing itself
    async with collector.serve() as users, httpx.AsyncClient() as http:
        target = OtlpTarget.from_env(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": users.endpoint,
             "OTEL_EXPORTER_OTLP_HEADERS": f"{SECRET_HEADER}={users.secret}"}
        )  # fmt: skip
        receiver = OtlpReceiver(
            "s1", Redactor({"TOKEN": "tok-1234567890"}), prompt="say hi please",
            run_trace=RUN_TRACE, forward=target,
        )  # fmt: skip
        async with receiver.serve() as telemetry:
            for body, content_type in (
                (protobuf_body(b"\x07" * 16, "s1"), "application/x-protobuf"),
                (json_body("value tok-1234567890 and say hi please"), "application/json"),
            ):
                answer = await http.post(
                    telemetry.traces_url, content=body,
                    headers={**telemetry.headers, "content-type": content_type},
                )  # fmt: skip
                assert answer.status_code == 200
        assert receiver.forwarder is not None and receiver.forwarder.sent == 2
    moved, tool = sorted(collector.spans, key=lambda s: s.span_id)
    # Moved into the run's trace on the way, under the run's span, like the stored one.
    assert (moved.trace_id, moved.parent_span_id) == RUN_TRACE
    assert moved.attributes["spawnkit.original_trace_id"] == "07" * 16
    assert moved.attributes["model"] == "replay-model"
    assert (tool.trace_id, tool.parent_span_id, tool.attributes["n"]) == (*RUN_TRACE, 3)
    assert "tok-1234567890" not in tool.attributes["out"]
    assert "say hi please" not in tool.attributes["out"]


async def test_an_unreachable_collector_does_not_hold_up_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    target = OtlpTarget.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    receiver = OtlpReceiver("s1", Redactor(), run_trace=RUN_TRACE, forward=target)
    started = time.monotonic()
    async with receiver.serve() as telemetry, httpx.AsyncClient() as http:
        for _ in range(3):
            answer = await http.post(
                telemetry.traces_url, content=protobuf_body(b"\x07" * 16, "s1"),
                headers=telemetry.headers,
            )  # fmt: skip
            assert answer.status_code == 200
    assert time.monotonic() - started < FORWARD_DRAIN_S + 2
    assert len(receiver.spans) == 3  # still stored
    assert receiver.forwarder is not None and receiver.forwarder.failed == 3
    assert len([r for r in caplog.records if "could not forward" in r.message]) == 1


async def test_log_events_and_metric_points_are_kept_redacted() -> None:
    logs = {"resourceLogs": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "claude-code"}},
            {"key": "process.command_args", "value": {"stringValue": "claude -p say hi please"}},
        ]},
        "scopeLogs": [{"logRecords": [{
            "timeUnixNano": "7000", "traceId": RUN_TRACE[0], "spanId": RUN_TRACE[1],
            "body": {"stringValue": "claude_code.tool_result"},
            "attributes": [
                {"key": "event.name", "value": {"stringValue": "tool_result"}},
                {"key": "tool_name", "value": {"stringValue": "Bash"}},
                {"key": "output", "value": {"stringValue": "tok-1234567890"}},
            ],
        }]}],
    }]}  # fmt: skip
    point = NumberDataPoint(time_unix_nano=9000, as_int=42)
    point.attributes.append(KeyValue(key="type", value=AnyValue(string_value="input")))
    metrics = ExportMetricsServiceRequest(
        resource_metrics=[ResourceMetrics(scope_metrics=[ScopeMetrics(metrics=[
            Metric(name="claude_code.token.usage", unit="tokens", sum=Sum(data_points=[point])),
            Metric(name="latency", histogram=Histogram(data_points=[
                HistogramDataPoint(time_unix_nano=9500, count=2, sum=3.5)])),
        ])])]
    )  # fmt: skip
    receiver = OtlpReceiver("s1", Redactor({"TOKEN": "tok-1234567890"}), prompt="say hi please")
    async with receiver.serve() as telemetry, httpx.AsyncClient() as http:
        answers = [
            await http.post(telemetry.url("logs"), content=json.dumps(logs).encode(),
                            headers={**telemetry.headers, "content-type": "application/json"}),
            await http.post(telemetry.url("metrics"), content=metrics.SerializeToString(),
                            headers=telemetry.headers),
        ]  # fmt: skip
    assert [a.status_code for a in answers] == [200, 200]
    log, tokens, latency = sorted(receiver.events, key=lambda e: e.time_ns)
    assert (log.kind, log.name, log.service) == ("log", "tool_result", "claude-code")
    assert log.time_ns == 7000
    assert (log.trace_id, log.span_id) == RUN_TRACE
    assert log.attributes["tool_name"] == "Bash"
    assert log.attributes["body"] == "claude_code.tool_result"
    assert "tok-1234567890" not in json.dumps(log.attributes)
    assert "resource.process.command_args" not in log.attributes
    assert (tokens.kind, tokens.name, tokens.value) == ("metric", "claude_code.token.usage", 42.0)
    assert tokens.attributes["type"] == "input" and tokens.attributes["metric.unit"] == "tokens"
    assert (latency.value, latency.attributes["metric.count"]) == (3.5, 2)


async def test_a_hanging_collector_holds_the_run_at_most_the_drain_time() -> None:
    async def hanging(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await asyncio.sleep(60)

    async with _asgi.serve(hanging) as users:
        target = OtlpTarget.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": users.url})
        receiver = OtlpReceiver("s1", Redactor(), forward=target)
        async with httpx.AsyncClient() as http:
            async with receiver.serve() as telemetry:
                answer = await http.post(
                    telemetry.traces_url, content=protobuf_body(b"\x07" * 16, "s1"),
                    headers=telemetry.headers,
                )  # fmt: skip
                assert answer.status_code == 200  # answered at once, forwarding or not
                started = time.monotonic()
            waited = time.monotonic() - started
    assert FORWARD_DRAIN_S - 0.5 < waited < FORWARD_DRAIN_S + 1.5
    assert receiver.forwarder is not None and receiver.forwarder.sent == 0


async def test_request_and_tool_events_become_timings_as_they_arrive() -> None:
    """Gemini's recorded log events, posted in two protobuf requests as Gemini batches
    them: the listener gets a Timing for each request and tool call as each arrives."""
    recorded = json.loads(TELEMETRY_EVENTS.read_text())["gemini"]

    def request(events: list[dict[str, Any]]) -> bytes:
        records = [
            LogRecord(
                time_unix_nano=e["time_ns"],
                attributes=[
                    KeyValue(key=k, value=any_value(v))
                    for k, v in e["attributes"].items()
                    if v is not None
                ],
            )
            for e in events
        ]
        message = ExportLogsServiceRequest(
            resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=records)])]
        )
        return bytes(message.SerializeToString())

    got: list[Timing] = []
    receiver = OtlpReceiver("s1", Redactor(), on_timing=got.append)
    half = len(recorded) // 2
    seen_after_first = 0
    async with receiver.serve() as telemetry, httpx.AsyncClient() as http:
        for i, part in enumerate((recorded[:half], recorded[half:])):
            answer = await http.post(
                telemetry.url("logs"), content=request(part),
                headers={**telemetry.headers, "content-type": "application/x-protobuf"},
            )  # fmt: skip
            assert answer.status_code == 200
            if i == 0:
                seen_after_first = len(got)
    durations = {
        (e["attributes"].get("function_name") or e["attributes"].get("model"),
         float(e["attributes"]["duration_ms"]))
        for e in recorded
        if e["name"] in ("gemini_cli.api_response", "gemini_cli.tool_call")
    }  # fmt: skip
    assert {(t.name, t.duration_ms) for t in got} == durations
    assert 0 < seen_after_first < len(got)  # delivered per request, not at the end
    last = got[-1]
    assert last.requests == 3 and last.p50_ms is not None and last.p90_ms is not None
    assert last.p50_ms <= last.p90_ms
    assert {t.tool for t in last.tools} == {"run_shell_command", "mcp_health_state_get"}
    assert all(t.session_id == "s1" for t in got)


def big_json_body(spans: int, tag: str) -> bytes:
    """A JSON traces request of ``spans`` spans with many small attributes: what costs the
    most to decode and redact per byte."""
    attributes = [
        {"key": f"attr.{i}", "value": {"stringValue": f"{tag} value {i}"}} for i in range(40)
    ]
    span = {"traceId": RUN_TRACE[0], "parentSpanId": RUN_TRACE[1], "name": "tool",
            "startTimeUnixNano": "5", "endTimeUnixNano": "9", "attributes": attributes}  # fmt: skip
    spans_list = [{**span, "spanId": f"{n:016x}"} for n in range(spans)]
    request = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans_list}]}]}
    return json.dumps(request).encode()


POST_FILES = """
import sys, httpx
url, secret, *paths = sys.argv[1:]
with httpx.Client(timeout=120) as http:
    for path in paths:
        answer = http.post(url, content=open(path, "rb").read(),
                           headers={"x-spawnkit-otlp-secret": secret,
                                    "content-type": "application/json"})
        print(answer.status_code)
"""


class _TimedReceiver(OtlpReceiver):
    """A receiver that notes when each decode starts and ends (it runs in any thread)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decodes: list[tuple[float, float]] = []

    def _decode(self, signal: str, body: bytes, content_type: str, encoding: str) -> Any:
        started = time.perf_counter()
        try:
            return super()._decode(signal, body, content_type, encoding)
        finally:
            self.decodes.append((started, time.perf_counter()))


async def test_big_requests_are_decoded_off_the_event_loop(tmp_path: Path) -> None:
    """Another process posts big requests (just under the limit) while a heartbeat task
    ticks on the loop: the loop keeps ticking while each of them is decoded. Decoded on the
    loop (before), no tick could fall inside a decode at all. An ordering, not a timing:
    what is left of a pause (the JSON parser's C call holds the GIL) does not matter here."""
    count = int(0.9 * MAX_BODY_BYTES) // len(big_json_body(1, "tok-1234567890"))
    body = big_json_body(count, "tok-1234567890")
    assert MAX_BODY_BYTES // 2 < len(body) < MAX_BODY_BYTES and 3 * count < MAX_SPANS
    # A butler with a dozen credentials: redacting every string is most of the work.
    keys = {f"KEY_{i}": f"{chr(97 + i)}{i}-k3y-{i * 7919:08d}" for i in range(12)}
    redactor = Redactor({"TOKEN": "tok-1234567890", **keys})
    paths = [tmp_path / f"body{i}.json" for i in range(3)]
    for path in paths:
        path.write_bytes(body)
    receiver = _TimedReceiver("s1", redactor, prompt="say hi please", run_trace=RUN_TRACE)
    ticks: list[float] = []
    async with receiver.serve() as telemetry:
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", POST_FILES, telemetry.traces_url, telemetry.secret,
            *map(str, paths), stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        posting = asyncio.ensure_future(client.communicate())
        while not posting.done():
            await asyncio.sleep(0.005)
            ticks.append(time.perf_counter())
        out, _ = await posting
    assert out.decode().split() == ["200"] * len(paths)
    assert len(receiver.spans) == len(paths) * count
    assert "tok-1234567890" not in receiver.spans[-1].attributes["attr.0"]
    assert len(receiver.decodes) == len(paths)
    inside = [sum(start < t < end for t in ticks) for start, end in receiver.decodes]
    assert all(n >= 2 for n in inside), inside


async def test_a_request_over_the_limit_is_refused_unread() -> None:
    class Counting(OtlpReceiver):
        """The real receiver, counting the requests that reach the decoder."""

        decoded = 0

        def _decode(self, *args: Any) -> Any:
            self.decoded += 1
            return super()._decode(*args)

    spans = MAX_BODY_BYTES // len(big_json_body(1, "x")) * 11 // 10
    body = big_json_body(spans, "x")
    assert len(body) > MAX_BODY_BYTES
    receiver = Counting("s1", Redactor(), run_trace=RUN_TRACE)
    async with receiver.serve() as telemetry, httpx.AsyncClient(timeout=60) as http:
        headers = {**telemetry.headers, "content-type": "application/json"}
        declared = await http.post(telemetry.traces_url, content=body, headers=headers)
        streamed = await http.post(
            telemetry.traces_url, content=chunks(body, 64 * 1024), headers=headers
        )
        gzipped = await http.post(
            telemetry.traces_url, content=gzip.compress(body),
            headers={**headers, "content-encoding": "gzip"},
        )  # fmt: skip
        small = await http.post(telemetry.traces_url, content=json_body("x"), headers=headers)
    statuses = [a.status_code for a in (declared, streamed, gzipped, small)]
    assert statuses == [413, 413, 413, 200]
    assert receiver.decoded == 1 + 1  # the gzipped one: inflated in the worker, then refused
    assert receiver.too_large == 3 and len(receiver.spans) == 1


async def test_a_flood_of_requests_gets_429() -> None:
    """MAX_IN_FLIGHT requests of a run held open (their bodies still coming): the next
    one is refused at once with 429 and Retry-After; the held ones then go through."""
    receiver = OtlpReceiver("s1", Redactor(), run_trace=RUN_TRACE)
    release = asyncio.Event()

    async def held_body() -> AsyncIterator[bytes]:
        body = json_body("x")
        yield body[:10]
        await release.wait()
        yield body[10:]

    async with receiver.serve() as telemetry, httpx.AsyncClient(timeout=60) as http:
        headers = {**telemetry.headers, "content-type": "application/json"}
        held = [
            asyncio.ensure_future(http.post(telemetry.traces_url, content=held_body(),
                                            headers=headers))
            for _ in range(MAX_IN_FLIGHT)
        ]  # fmt: skip
        async with asyncio.timeout(30):
            while receiver.in_flight < MAX_IN_FLIGHT:
                await asyncio.sleep(0.01)
        flood = [
            await http.post(telemetry.traces_url, content=json_body("x"), headers=headers)
            for _ in range(3)
        ]
        release.set()
        answers = await asyncio.gather(*held)
    assert [a.status_code for a in flood] == [429] * 3
    assert flood[0].headers["retry-after"] == "1"
    assert [a.status_code for a in answers] == [200] * MAX_IN_FLIGHT
    assert receiver.limited == 3 and len(receiver.spans) == MAX_IN_FLIGHT


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One answer off a connection: its status line and its body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n")
         if line.lower().startswith(b"content-length:")),
        0,
    )  # fmt: skip
    return head.split(b"\r\n")[0], await reader.readexactly(length)


async def test_a_door_socket_keeps_the_connection_alive_and_answers_bad_heads(
    tmp_path: Path,
) -> None:
    """In a run's own network the receiver listens on its door's unix socket. Requests
    follow each other on one kept-alive connection (as the CLIs' exporters send them), an
    ``Expect: 100-continue`` is answered, a malformed head gets 400 and a closed connection,
    and a connection still open when the receiver stops is ended, not left behind."""
    receiver = OtlpReceiver("s1", Redactor(), run_trace=RUN_TRACE)
    socket_path = tmp_path / "4318.sock"
    body = json_body("x")

    def request(extra: bytes = b"") -> bytes:
        return (
            b"POST /v1/traces HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            + f"x-spawnkit-otlp-secret: {receiver.secret}\r\n".encode()
            + b"content-length: %d\r\n" % len(body) + extra + b"\r\n" + body
        )  # fmt: skip

    async with receiver.serve(socket_path, 4318) as telemetry:
        assert telemetry.endpoint == "http://127.0.0.1:4318"
        assert socket_path.stat().st_mode & 0o777 == 0o600
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        writer.write(request() + request(b"expect: 100-continue\r\n"))
        answers = [await read_answer(reader) for _ in range(3)]
        assert answers == [
            (b"HTTP/1.1 200 OK", b"{}"), (b"HTTP/1.1 100 Continue", b""),
            (b"HTTP/1.1 200 OK", b"{}"),
        ]  # fmt: skip
        bad_reader, bad_writer = await asyncio.open_unix_connection(str(socket_path))
        bad_writer.write(b"NONSENSE\r\n\r\n")
        answer = await bad_reader.read()
        assert answer.startswith(b"HTTP/1.1 400 ") and b"connection: close" in answer
        bad_writer.close()
        # ``writer`` stays open, idle, until the receiver stops.
    async with asyncio.timeout(10):
        assert await reader.read() == b""  # the receiver ended it
    writer.close()
    assert not socket_path.exists()
    assert len(receiver.spans) == 2
