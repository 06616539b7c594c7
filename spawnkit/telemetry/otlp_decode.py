"""OTLP/HTTP export requests, decoded: a CLI's spans, log records and metric points as rows.

A request is protobuf (``application/x-protobuf``) or JSON, compressed or not;
:func:`decode_traces` and the log and metric readers here turn one into plain dicts with
hex ids, nanosecond times and attribute values, for the receiver of
:mod:`spawnkit.telemetry.otlp` to redact and keep.

A protobuf request is read straight from its message (:func:`items_of_message`): turning
it into a proto-JSON tree first (``MessageToDict``) cost a third of spawnkit's CPU for a
Codex run's 500-odd spans, and the tree is only needed to forward the request to a
user's collector (:func:`tree_of`). Both readings give the same rows; the tests compare them.
"""

from __future__ import annotations

import base64
import json
import logging
import zlib
from collections.abc import (
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError, Message
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
# One span, log record or metric point, with the attributes of its resource.
Pair = tuple[dict[str, Any], dict[str, Any]]


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

    def row(self) -> dict[str, Any]:
        """Its fields for the store (``record_cli_spans``): a shallow copy, where
        ``dataclasses.asdict`` deep-copied every attribute (half the cost of storing them)."""
        return dict(vars(self))


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

    def row(self) -> dict[str, Any]:
        """Its fields for the store (``record_cli_events``), a shallow copy."""
        return dict(vars(self))


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


def read(body: bytes, content_type: str, signal: str) -> dict[str, Any] | Message:
    """An export request of ``signal``: an OTLP JSON tree, or the protobuf message.

    Raises ``ValueError`` for a body that is neither OTLP protobuf nor OTLP JSON.
    """
    if "json" in content_type:
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not OTLP JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("not an OTLP export request")
        return data
    request: Message = REQUESTS[signal]()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise ValueError(f"not OTLP protobuf: {exc}") from None
    return request


def tree_of(request: dict[str, Any] | Message) -> tuple[dict[str, Any], bool]:
    """A request as a proto-JSON tree, and whether its ids are base64 (a protobuf one's:
    the proto3 JSON mapping writes bytes so)."""
    if isinstance(request, dict):
        return request, False
    return MessageToDict(request), True


def parse(body: bytes, content_type: str, signal: str) -> tuple[dict[str, Any], bool]:
    """An export request of ``signal`` as a proto-JSON tree, and whether its ids are base64.

    Raises ``ValueError`` for a body that is neither OTLP protobuf nor OTLP JSON.
    """
    return tree_of(read(body, content_type, signal))


def items_of(signal: str, request: dict[str, Any] | Message) -> list[Pair]:
    """``(resource attributes, span or event)`` pairs of a request of ``signal``, read the
    cheapest way: from the message itself when it came as protobuf."""
    if not isinstance(request, dict):
        return items_of_message(signal, request)
    return {"traces": spans_of, "logs": logs_of, "metrics": metrics_of}[signal](request, False)


def spans_of(data: Mapping[str, Any], from_base64: bool) -> list[Pair]:
    found: list[Pair] = []
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


def decode_traces(body: bytes, content_type: str) -> list[Pair]:
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


def logs_of(data: Mapping[str, Any], from_base64: bool) -> list[Pair]:
    """``(resource attributes, event)`` pairs of a logs request: one per log record."""
    found: list[Pair] = []
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


def metrics_of(data: Mapping[str, Any], from_base64: bool) -> list[Pair]:
    """``(resource attributes, event)`` pairs of a metrics request: one per data point."""
    found: list[Pair] = []
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


# -- a protobuf request, read from its message -------------------------------------
# Each reader gives exactly what the proto-JSON reading above gives for the same request:
# a field counts only where ``MessageToDict`` would write it (set, or not its default).

# The proto-JSON name of each metric shape, as ``metric.type`` says it.
_SHAPE_NAMES = {
    "sum": "sum", "gauge": "gauge", "histogram": "histogram",
    "exponential_histogram": "exponentialHistogram", "summary": "summary",
}  # fmt: skip


def _any_value(value: Any) -> Any:
    """An ``AnyValue`` message as a plain value (bytes as base64 text, as proto-JSON has them)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)


def _attributes(items: Iterable[Any]) -> dict[str, Any]:
    return {item.key: _any_value(item.value) for item in items}


def _in_resources(
    groups: Iterable[Any], scopes: str, items: str
) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each item of each scope of ``groups`` (``resource_spans``, ``resource_logs``...),
    with its resource's attributes: one dict per resource, shared by its items."""
    for group in groups:
        resource = _attributes(group.resource.attributes)
        for scope in getattr(group, scopes):
            for item in getattr(scope, items):
                yield resource, item


def _message_spans(request: Any) -> list[Pair]:
    found: list[Pair] = []
    for resource, span in _in_resources(request.resource_spans, "scope_spans", "spans"):
        code = span.status.code
        found.append(
            (
                resource,
                {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex() or None,
                    "name": span.name,
                    "start_ns": span.start_time_unix_nano,
                    "end_ns": span.end_time_unix_nano,
                    "status": _STATUS.get(code, str(code)),
                    "attributes": _attributes(span.attributes),
                },
            )
        )
    return found


def _message_logs(request: Any) -> list[Pair]:
    found: list[Pair] = []
    for resource, record in _in_resources(request.resource_logs, "scope_logs", "log_records"):
        attributes = _attributes(record.attributes)
        body = _any_value(record.body) if record.HasField("body") else None
        # ``event_name`` is newer than the oldest opentelemetry-proto allowed.
        event_name = getattr(record, "event_name", "")
        name = attributes.get("event.name") or event_name or body or ""
        if body not in (None, "", name):
            attributes["body"] = body
        if record.severity_text:
            attributes.setdefault("severity", record.severity_text)
        found.append(
            (
                resource,
                {
                    "kind": "log",
                    "name": str(name),
                    "time_ns": record.time_unix_nano or record.observed_time_unix_nano,
                    "trace_id": record.trace_id.hex() or None,
                    "span_id": record.span_id.hex() or None,
                    "value": None,
                    "attributes": attributes,
                },
            )
        )
    return found


def _message_point_value(point: Any, present: set[str]) -> float | None:
    for name in ("as_double", "as_int", "sum"):
        if name in present:
            return float(getattr(point, name))
    return None


def _message_metrics(request: Any) -> list[Pair]:
    found: list[Pair] = []
    for resource, metric in _in_resources(request.resource_metrics, "scope_metrics", "metrics"):
        shape = metric.WhichOneof("data")
        if shape is None:
            continue
        for point in getattr(metric, shape).data_points:
            # The fields MessageToDict would write: set ones, and scalars off default.
            present = {field.name for field, _ in point.ListFields()}
            attributes = _attributes(point.attributes)
            attributes["metric.type"] = _SHAPE_NAMES[shape]
            if metric.unit:
                attributes["metric.unit"] = metric.unit
            if "count" in present:
                attributes["metric.count"] = point.count
            found.append(
                (
                    resource,
                    {
                        "kind": "metric",
                        "name": metric.name,
                        "time_ns": point.time_unix_nano or point.start_time_unix_nano,
                        "trace_id": None,
                        "span_id": None,
                        "value": _message_point_value(point, present),
                        "attributes": attributes,
                    },
                )
            )
    return found


def items_of_message(signal: str, request: Message) -> list[Pair]:
    """``(resource attributes, span or event)`` pairs of a protobuf request of ``signal``:
    the same as :func:`spans_of`, :func:`logs_of` or :func:`metrics_of` give for its
    proto-JSON tree, without making the tree."""
    reader = {"traces": _message_spans, "logs": _message_logs, "metrics": _message_metrics}
    return reader[signal](request)
