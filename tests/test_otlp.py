"""The run's OTLP receiver over real HTTP: secret, protobuf, JSON, gzip, chunked, redaction."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from spawnkit.otlp import SECRET_HEADER, OtlpReceiver
from spawnkit.redaction import Redactor

RUN_TRACE = ("ab" * 16, "cd" * 8)


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
