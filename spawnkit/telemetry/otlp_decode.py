"""OTLP/HTTP export requests, decoded: a CLI's spans, log records and metric points as rows.

A request is protobuf (``application/x-protobuf``) or JSON, compressed or not;
:func:`decode_traces` and the log and metric readers here turn one into plain dicts with
hex ids, nanosecond times and attribute values, for the receiver of
:mod:`spawnkit.telemetry.otlp` to redact and keep.
"""

from __future__ import annotations

import base64
import json
import logging
import zlib
from collections.abc import (
    Iterable,
    Mapping,
)
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

logger = logging.getLogger(__name__)


SIGNALS = ("traces", "metrics", "logs")
REQUESTS: dict[str, type[Any]] = {
    "traces": ExportTraceServiceRequest,
    "metrics": ExportMetricsServiceRequest,
    "logs": ExportLogsServiceRequest,
}
# Fields of an OTLP tree that are ids or times: never redacted (a base64 id is not text).
OPAQUE_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})
_STATUS = {0: "unset", 1: "ok", 2: "error"}
_STATUS_NAMES = {"STATUS_CODE_UNSET": "unset", "STATUS_CODE_OK": "ok", "STATUS_CODE_ERROR": "error"}
# One export request, decompressed. The largest the real CLIs sent in the end-to-end
# runs was 198 KB (Codex, about 490 spans); a request costs about 0.35 s a megabyte to
# decode and redact, so this bounds one request to about 1.5 s of a worker thread.
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class CliSpan:
    """One span a run's CLI exported, as stored (attributes redacted)."""

    session_id: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    service: str | None
    start_ns: int
    end_ns: int
    status: str
    attributes: dict[str, Any]
    reparented: bool = False


@dataclass(frozen=True)
class CliEvent:
    """One log event or metric point a run's CLI exported, as stored (attributes redacted).

    ``kind`` is ``"log"`` or ``"metric"``; ``time_ns`` the record's (or point's) time;
    ``value`` a metric point's value (a histogram's sum), None for a log event.
    """

    session_id: str
    kind: str
    name: str
    service: str | None
    time_ns: int
    trace_id: str | None
    span_id: str | None
    value: float | None
    attributes: dict[str, Any]


def hex_id(value: str, from_base64: bool) -> str:
    if not value:
        return ""
    return base64.b64decode(value).hex() if from_base64 else value.lower()


def _value(raw: Mapping[str, Any]) -> Any:
    """An OTLP ``AnyValue`` (JSON or proto-JSON shape) as a plain value."""
    if "stringValue" in raw:
        return raw["stringValue"]
    if "intValue" in raw:
        return int(raw["intValue"])
    if "doubleValue" in raw:
        return float(raw["doubleValue"])
    if "boolValue" in raw:
        return bool(raw["boolValue"])
    if "arrayValue" in raw:
        return [_value(v) for v in raw["arrayValue"].get("values", [])]
    if "kvlistValue" in raw:
        return attributes_of(raw["kvlistValue"].get("values", []))
    if "bytesValue" in raw:
        return str(raw["bytesValue"])
    return None


def attributes_of(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {str(item.get("key", "")): _value(item.get("value") or {}) for item in items}


def _status(raw: Mapping[str, Any] | None) -> str:
    code = (raw or {}).get("code", 0)
    if isinstance(code, str):
        return _STATUS_NAMES.get(code, code.lower())
    return _STATUS.get(int(code), str(code))


def parse(body: bytes, content_type: str, signal: str) -> tuple[dict[str, Any], bool]:
    """An export request of ``signal`` as a proto-JSON tree, and whether its ids are base64.

    Raises ``ValueError`` for a body that is neither OTLP protobuf nor OTLP JSON.
    """
    if "json" in content_type:
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not OTLP JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("not an OTLP export request")
        return data, False
    request = REQUESTS[signal]()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise ValueError(f"not OTLP protobuf: {exc}") from None
    return MessageToDict(request), True  # proto3 JSON mapping writes bytes as base64


def spans_of(
    data: Mapping[str, Any], from_base64: bool
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for resource_spans in data.get("resourceSpans", []):
        resource = attributes_of((resource_spans.get("resource") or {}).get("attributes", []))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                found.append(
                    (
                        resource,
                        {
                            "trace_id": hex_id(span.get("traceId", ""), from_base64),
                            "span_id": hex_id(span.get("spanId", ""), from_base64),
                            "parent_span_id": hex_id(span.get("parentSpanId", ""), from_base64)
                            or None,
                            "name": str(span.get("name", "")),
                            "start_ns": int(span.get("startTimeUnixNano", 0)),
                            "end_ns": int(span.get("endTimeUnixNano", 0)),
                            "status": _status(span.get("status")),
                            "attributes": attributes_of(span.get("attributes", [])),
                        },
                    )
                )
    return found


def decode_traces(body: bytes, content_type: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(resource attributes, span)`` pairs of an OTLP export request body.

    Each span is ``{trace_id, span_id, parent_span_id, name, start_ns, end_ns,
    status, attributes}`` with hex ids. Raises ``ValueError`` for a body that is
    neither OTLP protobuf nor OTLP JSON.
    """
    return spans_of(*parse(body, content_type, "traces"))


def _time(raw: Mapping[str, Any], *names: str) -> int:
    for name in names:
        if int(raw.get(name, 0) or 0):
            return int(raw[name])
    return 0


def logs_of(
    data: Mapping[str, Any], from_base64: bool
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(resource attributes, event)`` pairs of a logs request: one per log record."""
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for resource_logs in data.get("resourceLogs", []):
        resource = attributes_of((resource_logs.get("resource") or {}).get("attributes", []))
        for scope_logs in resource_logs.get("scopeLogs", []):
            for record in scope_logs.get("logRecords", []):
                attributes = attributes_of(record.get("attributes", []))
                body = _value(record.get("body") or {})
                # Codex's eventName is the code location; every CLI sets ``event.name``.
                name = attributes.get("event.name") or record.get("eventName") or body or ""
                if body not in (None, "", name):
                    attributes["body"] = body
                if record.get("severityText"):
                    attributes.setdefault("severity", record["severityText"])
                found.append(
                    (
                        resource,
                        {
                            "kind": "log",
                            "name": str(name),
                            "time_ns": _time(record, "timeUnixNano", "observedTimeUnixNano"),
                            "trace_id": hex_id(record.get("traceId", ""), from_base64) or None,
                            "span_id": hex_id(record.get("spanId", ""), from_base64) or None,
                            "value": None,
                            "attributes": attributes,
                        },
                    )
                )
    return found


def _point_value(point: Mapping[str, Any]) -> float | None:
    for name in ("asDouble", "asInt", "sum"):
        if name in point:
            return float(point[name])
    return None


def metrics_of(
    data: Mapping[str, Any], from_base64: bool
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(resource attributes, event)`` pairs of a metrics request: one per data point."""
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for resource_metrics in data.get("resourceMetrics", []):
        resource = attributes_of((resource_metrics.get("resource") or {}).get("attributes", []))
        for scope_metrics in resource_metrics.get("scopeMetrics", []):
            for metric in scope_metrics.get("metrics", []):
                for shape in ("sum", "gauge", "histogram", "exponentialHistogram", "summary"):
                    if shape in metric:
                        break
                else:
                    continue
                for point in (metric.get(shape) or {}).get("dataPoints", []):
                    attributes = attributes_of(point.get("attributes", []))
                    attributes["metric.type"] = shape
                    if metric.get("unit"):
                        attributes["metric.unit"] = metric["unit"]
                    if "count" in point:
                        attributes["metric.count"] = int(point["count"])
                    found.append(
                        (
                            resource,
                            {
                                "kind": "metric",
                                "name": str(metric.get("name", "")),
                                "time_ns": _time(point, "timeUnixNano", "startTimeUnixNano"),
                                "trace_id": None,
                                "span_id": None,
                                "value": _point_value(point),
                                "attributes": attributes,
                            },
                        )
                    )
    return found


@dataclass(frozen=True)
class Decoded:
    """One export request as the receiver keeps it: built in a worker thread, kept on the
    loop. ``over``: spans or events beyond the run's limit, not kept."""

    spans: list[CliSpan]
    events: list[CliEvent]
    over: int
    forward: tuple[str, bytes, str] | None


def decompress(body: bytes, encoding: str) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ValueError(f"unsupported Content-Encoding {encoding!r}")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    out = inflater.decompress(body, MAX_BODY_BYTES + 1)
    if len(out) > MAX_BODY_BYTES:
        raise OverflowError
    return out
