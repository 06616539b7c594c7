"""What a user sees of the CLIs' own telemetry does not change when the receiver gets cheaper.

``fixtures/telemetry/cli_requests.json.gz`` holds every OTLP request the real CLIs sent
for one run of the spawn-overhead benchmark's scenario (Claude Code 2.1.330 and Codex
0.169.0 as protobuf, Gemini 0.61.0 as JSON; captured at the receiver's ``_decode``).
``fixtures/telemetry/cli_kept.json.gz`` holds what the receiver as it was before the
protobuf requests were read straight from their messages (``MessageToDict`` first, every
value redacted each time, ``dataclasses.asdict`` rows) kept of them: the stored spans and
events (the rows behind ``history.spans()``, ``cli_events()``, ``timings()`` and the
waterfall) and the live timings. The same requests, sent over HTTP to today's receiver
and stored as a run stores them, must give exactly those.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from spawnkit import history
from spawnkit.events import Timing
from spawnkit.redaction import Redactor
from spawnkit.store import SessionStore
from spawnkit.telemetry import otlp_decode
from spawnkit.telemetry.otlp import OtlpReceiver

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
REQUESTS = json.loads(gzip.decompress((FIXTURES / "cli_requests.json.gz").read_bytes()))
KEPT = json.loads(gzip.decompress((FIXTURES / "cli_kept.json.gz").read_bytes()))
RUN_TRACE = ("ab" * 16, "cd" * 8)
PROMPT = "What is my weight?"
# A value in the CLIs' attributes (the tool's input), redacted as a run's secret would be.
SECRET = "measurements/weight"
RUNTIMES = sorted(REQUESTS)


async def kept_by_receiver(runtime: str, store: SessionStore) -> dict[str, Any]:
    """The recorded requests of ``runtime`` through a run's receiver, stored as a run
    stores them; what the store and the live timings then hold."""
    recorded = REQUESTS[runtime]
    session_id = recorded["session_id"]
    timings: list[Timing] = []
    receiver = OtlpReceiver(
        session_id, Redactor({"SECRET": SECRET}), prompt=PROMPT, run_trace=RUN_TRACE,
        on_timing=timings.append,
    )  # fmt: skip
    async with receiver.serve() as telemetry, httpx.AsyncClient() as http:
        for request in recorded["requests"]:
            answer = await http.post(
                telemetry.url(request["signal"]),
                content=base64.b64decode(request["body"]),
                headers={**telemetry.headers, "content-type": request["content_type"]},
            )
            assert answer.status_code == 200, answer.text
    spans = [s.row() for s in receiver.finished()]
    events = [e.row() for e in receiver.events]
    assert spans == [asdict(s) for s in receiver.finished()]  # the rows, as asdict had them
    assert events == [asdict(e) for e in receiver.events]
    store.record_cli_spans(spans)
    store.record_cli_events(events)
    return {
        "spans": store.cli_spans(session_id),
        "events": store.cli_events(session_id),
        "timings": [asdict(t) for t in timings],
    }


def as_json(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples as lists), for comparing with the fixture."""
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_the_stored_spans_events_and_timings_are_as_before(
    runtime: str, tmp_path: Path
) -> None:
    with SessionStore(tmp_path / "store.db") as store:
        kept = await kept_by_receiver(runtime, store)
        frames = {
            "spans": history.spans(store=store, session_id=REQUESTS[runtime]["session_id"]),
            "events": history.cli_events(store=store, session_id=REQUESTS[runtime]["session_id"]),
        }
    expected = KEPT[runtime]
    assert len(kept["spans"]) == len(expected["spans"]) > 0
    assert len(kept["events"]) == len(expected["events"]) > 0
    assert as_json(kept) == expected
    # The frames a user reads show every row, redacted.
    assert len(frames["spans"]) == len(expected["spans"])
    assert len(frames["events"]) == len(expected["events"])
    assert SECRET not in json.dumps(kept)
    assert PROMPT not in json.dumps(kept)


@pytest.mark.parametrize("runtime", ["claude-code", "codex"])
def test_a_protobuf_request_reads_the_same_from_its_message_as_from_its_tree(
    runtime: str,
) -> None:
    """The real CLIs' protobuf requests: rows read from the message equal those read from
    its proto-JSON tree (the reading JSON requests still get)."""
    readers = {"traces": otlp_decode.spans_of, "logs": otlp_decode.logs_of,
               "metrics": otlp_decode.metrics_of}  # fmt: skip
    compared = 0
    for request in REQUESTS[runtime]["requests"]:
        body = base64.b64decode(request["body"])
        message = otlp_decode.read(body, request["content_type"], request["signal"])
        from_tree = readers[request["signal"]](MessageToDict(message), True)
        assert otlp_decode.items_of(request["signal"], message) == from_tree
        compared += len(from_tree)
    assert compared > 20


def test_the_message_reading_matches_the_tree_reading_at_the_edges() -> None:
    """Fields the real CLIs seldom send: empty, bytes, nested and numeric values, unknown
    status codes, every metric shape, fields left at their defaults."""
    values = [
        KeyValue(key="empty"), KeyValue(key="bytes", value=AnyValue(bytes_value=b"\x00\xff")),
        KeyValue(key="int", value=AnyValue(int_value=-(2**62))),
        KeyValue(key="zero", value=AnyValue(int_value=0)),
        KeyValue(key="double", value=AnyValue(double_value=-0.0)),
        KeyValue(key="bool", value=AnyValue(bool_value=False)),
        KeyValue(key="text", value=AnyValue(string_value="")),
        KeyValue(key="list", value=AnyValue(array_value=ArrayValue(values=[
            AnyValue(int_value=1), AnyValue(), AnyValue(string_value="x")]))),
        KeyValue(key="map", value=AnyValue(kvlist_value=KeyValueList(values=[
            KeyValue(key="k", value=AnyValue(double_value=1.5))]))),
    ]  # fmt: skip
    spans = [
        Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="a", attributes=values,
             status=Status(code=2)),
        Span(trace_id=b"\x01" * 16, span_id=b"\x03" * 8, parent_span_id=b"\x02" * 8,
             start_time_unix_nano=5, end_time_unix_nano=9, status=Status(code=7)),
    ]  # fmt: skip
    traces = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])]
    )
    logs = ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(
        log_records=[
            LogRecord(observed_time_unix_nano=3, body=AnyValue(kvlist_value=KeyValueList(
                values=[KeyValue(key="k", value=AnyValue(string_value="v"))]))),
            LogRecord(time_unix_nano=4, event_name="named", severity_text="WARN",
                      body=AnyValue(string_value="named"), attributes=values[:3]),
            LogRecord(body=AnyValue()),
            LogRecord(attributes=[KeyValue(key="event.name", value=AnyValue(string_value="e"))],
                      body=AnyValue(int_value=0), trace_id=b"\x04" * 16),
        ])])])  # fmt: skip
    point = {"attributes": values[2:4], "time_unix_nano": 0, "start_time_unix_nano": 8}
    metrics = ExportMetricsServiceRequest(resource_metrics=[m.ResourceMetrics(scope_metrics=[
        m.ScopeMetrics(metrics=[
            m.Metric(name="sum", unit="1", sum=m.Sum(data_points=[
                m.NumberDataPoint(as_int=0, **point), m.NumberDataPoint(as_double=2.5)])),
            m.Metric(name="gauge", gauge=m.Gauge(data_points=[m.NumberDataPoint()])),
            m.Metric(name="histogram", histogram=m.Histogram(data_points=[
                m.HistogramDataPoint(count=0), m.HistogramDataPoint(count=3, sum=0.0)])),
            m.Metric(name="exp", exponential_histogram=m.ExponentialHistogram(data_points=[
                m.ExponentialHistogramDataPoint(count=2, sum=1.0)])),
            m.Metric(name="summary", summary=m.Summary(data_points=[
                m.SummaryDataPoint(count=1, sum=0.0), m.SummaryDataPoint(sum=4.0)])),
            m.Metric(name="no shape"), m.Metric(name="empty", gauge=m.Gauge()),
        ])])])  # fmt: skip
    readers = {"traces": otlp_decode.spans_of, "logs": otlp_decode.logs_of,
               "metrics": otlp_decode.metrics_of}  # fmt: skip
    for signal, message in (("traces", traces), ("logs", logs), ("metrics", metrics)):
        from_tree = readers[signal](MessageToDict(message), True)
        assert repr(otlp_decode.items_of(signal, message)) == repr(from_tree), signal
        assert from_tree


async def test_values_are_redacted_once_as_each_time() -> None:
    """The receiver redacts each distinct value once per request; what it keeps is what
    redacting every value gives: numbers that read as a secret, True apart from 1, -0.0."""
    redactor = Redactor({"PIN": "12345678901"})
    attributes = [
        KeyValue(key="pin", value=AnyValue(int_value=12345678901)),
        KeyValue(key="one", value=AnyValue(int_value=1)),
        KeyValue(key="yes", value=AnyValue(bool_value=True)),
        KeyValue(key="minus zero", value=AnyValue(double_value=-0.0)),
        KeyValue(key="zero", value=AnyValue(double_value=0.0)),
        KeyValue(key="said", value=AnyValue(string_value="pin 12345678901, ask what is up")),
    ]
    spans = [Span(trace_id=b"\x01" * 16, span_id=bytes([i + 1]) * 8, name="what is up",
                  attributes=attributes) for i in range(3)]  # fmt: skip
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])]
    )
    receiver = OtlpReceiver("s1", redactor, prompt="what is up")
    async with receiver.serve() as telemetry, httpx.AsyncClient() as http:
        answer = await http.post(
            telemetry.url("traces"), content=request.SerializeToString(), headers=telemetry.headers
        )
    assert answer.status_code == 200
    assert len(receiver.spans) == 3
    for span in receiver.spans:
        assert span.name == "[redacted:PROMPT]"
        assert span.attributes["pin"] == "[redacted:PIN]"
        assert span.attributes["said"] == "pin [redacted:PIN], ask [redacted:PROMPT]"
        assert span.attributes["one"] == 1 and span.attributes["yes"] is True
        assert json.dumps([span.attributes["minus zero"], span.attributes["zero"]]) == "[-0.0, 0.0]"
