"""A run's own OTLP/HTTP receiver: the agent CLI's spans, joined to the run's trace, and its
log events and metrics.

With CLI telemetry on (``[butler.telemetry] cli = true`` or ``Spawner(cli_telemetry=
True)``), the spawner starts one :class:`OtlpReceiver` per run on loopback (port 0)
for as long as the run's CLI lives, and tells the CLI to export its telemetry there
(:class:`CliTelemetry`, which each adapter turns into its own settings). Only a
request carrying the run's secret in the :data:`SECRET_HEADER` header gets in; the
sandbox shares the host's loopback, as it does for the butler's MCP server.

The receiver accepts ``POST /v1/traces`` as protobuf (``application/x-protobuf``) or
JSON, gzip-compressed or not, in one piece or chunked, up to :data:`MAX_BODY_BYTES`
(413 beyond, before any parsing), and ``/v1/logs`` and ``/v1/metrics`` the same way:
each log record and metric data point becomes a :class:`CliEvent` row, redacted like the
spans; a log event that reports a model request or a tool call (:mod:`spawnkit.telemetry.timings`)
also becomes a :class:`~spawnkit.events.Timing` for the run's listeners, at once. Every
span becomes a :class:`CliSpan` row whose attributes have passed the run's redactor
and a redactor of the run's prompt; attributes that hold a command line (Gemini's
``process.command_args`` carries the prompt) are dropped. A CLI that ignores
``TRACEPARENT`` (Gemini) starts traces of its own: spans of another trace that carry
the run's ``spawnkit.session_id`` resource attribute are moved into the run's trace,
their roots under the run's span (``spawnkit.reparented`` says so).

The agent can read the receiver's secret (it is in its CLI's environment or config), so
a request may be hostile. Decoding and redacting a request costs about a third of a
second per megabyte of CPU, which on the event loop would stall every run of the
process: it is done in a worker thread, one request of a run at a time (so what a run
keeps stays in the order its requests arrived), with at most :data:`MAX_IN_FLIGHT`
requests of a run being read or waiting (429 beyond, which the OTLP exporters retry).

When the standard ``OTEL_EXPORTER_OTLP_*`` variables name a collector
(:class:`OtlpTarget`), each request is also forwarded there in the background
(:class:`Forwarder`), redacted and rejoined the same way, and spawnkit's own spans
export there (:func:`tracer_provider_from_env`, :class:`OtlpSpanExporter`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import hmac
import json
import logging
import os
import secrets
import zlib
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    MutableMapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, cast
from urllib.parse import unquote

import httpx
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.proto.trace.v1.trace_pb2 import Status as ProtoStatus
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from .. import _asgi
from ..events import Timing
from ..redaction import Redactor
from .timings import RunTimings, classify

logger = logging.getLogger(__name__)

SECRET_HEADER = "x-spawnkit-otlp-secret"
SESSION_ATTRIBUTE = "spawnkit.session_id"
# One export request, decompressed. The largest the real CLIs sent in the end-to-end
# runs was 198 KB (Codex, about 490 spans); a request costs about 0.35 s a megabyte to
# decode and redact, so this bounds one request to about 1.5 s of a worker thread.
MAX_BODY_BYTES = 4 * 1024 * 1024
# Requests of one run being read, decoded or waiting for their turn; more get 429. The
# CLIs send one request per signal at a time (three at most).
MAX_IN_FLIGHT = 4
# What a 429 asks the exporter to wait before it retries, in seconds.
RETRY_AFTER_S = 1
# Spans, and log events plus metric points, kept per run (Codex sends about 490 spans
# for a short run); the rest are counted.
MAX_SPANS = 20_000
MAX_EVENTS = 20_000
# Attributes that hold a command line, and so the prompt: never stored.
COMMAND_LINE_ATTRIBUTES = frozenset(
    {"process.command_args", "process.command_line", "process.command", "process.argv"}
)
SIGNALS = ("traces", "metrics", "logs")
_REQUESTS: dict[str, type[Any]] = {
    "traces": ExportTraceServiceRequest,
    "metrics": ExportMetricsServiceRequest,
    "logs": ExportLogsServiceRequest,
}
# Forwarding to the user's collector: requests waiting at most, and how long the end of
# a run waits for them to go out.
FORWARD_QUEUE = 256
FORWARD_DRAIN_S = 2.0
# How long spawnkit's own finished spans wait to be exported in a batch.
EXPORT_DELAY_MS = 1000
_PROVIDERS: dict[tuple[str, tuple[tuple[str, str], ...]], SdkTracerProvider] = {}
# Fields of an OTLP tree that are ids or times: never redacted (a base64 id is not text).
_OPAQUE_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})
_STATUS = {0: "unset", 1: "ok", 2: "error"}
_STATUS_NAMES = {"STATUS_CODE_UNSET": "unset", "STATUS_CODE_OK": "ok", "STATUS_CODE_ERROR": "error"}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class CliTelemetry:
    """Where a run's CLI exports its telemetry, and what it must send along.

    ``endpoint`` is the receiver's base URL (``http://127.0.0.1:PORT``; the CLIs
    append ``/v1/traces``); ``secret`` goes in the :data:`SECRET_HEADER` header and is
    kept out of ``repr``.
    """

    endpoint: str
    session_id: str
    secret: str = field(repr=False)

    @property
    def traces_url(self) -> str:
        return f"{self.endpoint}/v1/traces"

    def url(self, signal: str) -> str:
        """The full URL of one signal (``traces``, ``metrics``, ``logs``)."""
        return f"{self.endpoint}/v1/{signal}"

    @property
    def headers(self) -> dict[str, str]:
        return {SECRET_HEADER: self.secret}

    @property
    def resource_attributes(self) -> str:
        """``OTEL_RESOURCE_ATTRIBUTES``: how spans of a CLI that ignores TRACEPARENT are found."""
        return f"{SESSION_ATTRIBUTE}={self.session_id}"


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


def _headers(raw: str) -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_HEADERS``: ``key=value`` pairs, comma-separated, URL-encoded."""
    found = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            found[unquote(key.strip())] = unquote(value.strip())
    return found


@dataclass(frozen=True)
class OtlpTarget:
    """The user's own collector, from the standard ``OTEL_EXPORTER_OTLP_*`` variables.

    ``urls`` maps a signal (``traces``, ``metrics``, ``logs``) to its full URL:
    ``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`` as given, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/<signal>``; headers likewise
    (``..._HEADERS``, kept out of ``repr``); ``timeout_s`` from
    ``OTEL_EXPORTER_OTLP_TIMEOUT`` (milliseconds, 10 s by default).
    """

    urls: dict[str, str]
    headers: dict[str, dict[str, str]] = field(repr=False)
    timeout_s: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OtlpTarget | None:
        """The collector the environment names, or None when it names none."""
        env = os.environ if env is None else env
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip().rstrip("/")
        urls, headers = {}, {}
        for signal in SIGNALS:
            own = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
            url = own or (f"{base}/v1/{signal}" if base else "")
            if url:
                urls[signal] = url
                headers[signal] = _headers(
                    env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_HEADERS")
                    or env.get("OTEL_EXPORTER_OTLP_HEADERS", "")
                )
        if not urls:
            return None
        try:
            timeout_s = float(env.get("OTEL_EXPORTER_OTLP_TIMEOUT", "") or 10_000) / 1000
        except ValueError:
            timeout_s = 10.0
        return cls(urls, headers, max(0.1, timeout_s))


class Forwarder:
    """Sends export requests on to an :class:`OtlpTarget` in the background, bounded.

    :meth:`submit` never waits: a request beyond :data:`FORWARD_QUEUE` waiting is
    dropped. Each POST has the target's timeout; the first failure is logged (as a
    warning, once per forwarder), the rest counted in ``failed``.
    """

    def __init__(self, target: OtlpTarget, label: str) -> None:
        self.target = target
        self.label = label
        self.sent = 0
        self.failed = 0
        self._queue: asyncio.Queue[tuple[str, bytes, str]] = asyncio.Queue(FORWARD_QUEUE)
        self._warned = False

    def submit(self, signal: str, body: bytes, content_type: str) -> None:
        if signal not in self.target.urls:
            return
        try:
            self._queue.put_nowait((signal, body, content_type))
        except asyncio.QueueFull:
            self._failed(f"{FORWARD_QUEUE} requests already waiting")

    def _failed(self, why: str) -> None:
        self.failed += 1
        if not self._warned:
            self._warned = True
            logger.warning("%s: could not forward OTLP to %s: %s (further failures not logged)",
                           self.label, self.target.urls.get("traces") or
                           next(iter(self.target.urls.values())), why)  # fmt: skip

    async def _send(self) -> None:
        async with httpx.AsyncClient(timeout=self.target.timeout_s) as http:
            while True:
                signal, body, content_type = await self._queue.get()
                try:
                    answer = await http.post(
                        self.target.urls[signal], content=body,
                        headers={**self.target.headers[signal], "content-type": content_type},
                    )  # fmt: skip
                    if answer.status_code >= 300:
                        self._failed(f"HTTP {answer.status_code}")
                    else:
                        self.sent += 1
                except httpx.HTTPError as exc:
                    self._failed(f"{type(exc).__name__}: {exc}")
                finally:
                    self._queue.task_done()

    @asynccontextmanager
    async def running(self, drain_s: float = FORWARD_DRAIN_S) -> AsyncIterator[Forwarder]:
        """Forward while the block runs; at its end wait at most ``drain_s`` for the rest."""
        task = asyncio.create_task(self._send())
        try:
            yield self
            drained = asyncio.create_task(self._queue.join())
            await asyncio.wait({drained}, timeout=drain_s)
            drained.cancel()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if waiting := self._queue.qsize():
                self.failed += waiting - 1
                self._failed(f"{waiting} requests still waiting at the run's end")


def _any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list | tuple):
        return AnyValue(array_value=ArrayValue(values=[_any_value(v) for v in value]))
    return AnyValue(string_value=str(value))


def _key_values(attributes: Mapping[str, Any] | None) -> list[KeyValue]:
    return [KeyValue(key=k, value=_any_value(v)) for k, v in (attributes or {}).items()]


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """Finished SDK spans as an OTLP protobuf ``ExportTraceServiceRequest``."""
    groups: dict[tuple[int, str, str], tuple[Resource, InstrumentationScope, list[Span]]] = {}
    for span in spans:
        context = span.get_span_context()
        if context is None:
            continue
        scope = span.instrumentation_scope
        key = (id(span.resource), scope.name if scope else "", scope.version or "" if scope else "")
        if key not in groups:
            groups[key] = (
                Resource(attributes=_key_values(span.resource.attributes)),
                InstrumentationScope(name=key[1], version=key[2]),
                [],
            )
        groups[key][2].append(
            Span(
                trace_id=context.trace_id.to_bytes(16, "big"),
                span_id=context.span_id.to_bytes(8, "big"),
                parent_span_id=span.parent.span_id.to_bytes(8, "big") if span.parent else b"",
                name=span.name,
                kind=cast(
                    Any, span.kind.value + 1
                ),  # the API counts from INTERNAL, OTLP from UNSPECIFIED
                start_time_unix_nano=span.start_time or 0,
                end_time_unix_nano=span.end_time or 0,
                attributes=_key_values(span.attributes),
                events=[
                    Span.Event(
                        time_unix_nano=e.timestamp,
                        name=e.name,
                        attributes=_key_values(e.attributes),
                    )
                    for e in span.events
                ],
                status=ProtoStatus(
                    code=cast(Any, span.status.status_code.value),
                    message=span.status.description or "",
                ),
            )
        )
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(resource=r, scope_spans=[ScopeSpans(scope=s, spans=found)])
            for r, s, found in groups.values()
        ]
    )
    return bytes(request.SerializeToString())


class OtlpSpanExporter(SpanExporter):
    """spawnkit's own spans to the user's collector over OTLP/HTTP protobuf (in the SDK's
    batch thread, with the target's timeout; the first failure is logged)."""

    def __init__(self, target: OtlpTarget) -> None:
        self.target = target
        self._http = httpx.Client(timeout=target.timeout_s)
        self._warned = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            answer = self._http.post(
                self.target.urls["traces"], content=encode_spans(spans),
                headers={**self.target.headers["traces"],
                         "content-type": "application/x-protobuf"},
            )  # fmt: skip
            if answer.status_code < 300:
                return SpanExportResult.SUCCESS
            why = f"HTTP {answer.status_code}"
        except httpx.HTTPError as exc:
            why = f"{type(exc).__name__}: {exc}"
        if not self._warned:
            self._warned = True
            logger.warning("could not export spawnkit's spans to %s: %s (further failures "
                           "not logged)", self.target.urls["traces"], why)  # fmt: skip
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._http.close()


def tracer_provider_from_env(env: Mapping[str, str] | None = None) -> SdkTracerProvider | None:
    """A tracer provider exporting spawnkit's spans where ``OTEL_EXPORTER_OTLP_*`` say,
    batched in the background; None when they name no traces endpoint."""
    target = OtlpTarget.from_env(env)
    if target is None or "traces" not in target.urls:
        return None
    key = (target.urls["traces"], tuple(sorted(target.headers["traces"].items())))
    if key in _PROVIDERS:  # one batch thread per collector, however many spawners
        return _PROVIDERS[key]
    provider = _PROVIDERS[key] = SdkTracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(
            OtlpSpanExporter(target),
            schedule_delay_millis=EXPORT_DELAY_MS,
            export_timeout_millis=int(target.timeout_s * 1000),
        )
    )
    return provider


def _hex_id(value: str, from_base64: bool) -> str:
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
        return _attributes(raw["kvlistValue"].get("values", []))
    if "bytesValue" in raw:
        return str(raw["bytesValue"])
    return None


def _attributes(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {str(item.get("key", "")): _value(item.get("value") or {}) for item in items}


def _status(raw: Mapping[str, Any] | None) -> str:
    code = (raw or {}).get("code", 0)
    if isinstance(code, str):
        return _STATUS_NAMES.get(code, code.lower())
    return _STATUS.get(int(code), str(code))


def _parse(body: bytes, content_type: str, signal: str) -> tuple[dict[str, Any], bool]:
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
    request = _REQUESTS[signal]()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise ValueError(f"not OTLP protobuf: {exc}") from None
    return MessageToDict(request), True  # proto3 JSON mapping writes bytes as base64


def _spans_of(
    data: Mapping[str, Any], from_base64: bool
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for resource_spans in data.get("resourceSpans", []):
        resource = _attributes((resource_spans.get("resource") or {}).get("attributes", []))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                found.append(
                    (
                        resource,
                        {
                            "trace_id": _hex_id(span.get("traceId", ""), from_base64),
                            "span_id": _hex_id(span.get("spanId", ""), from_base64),
                            "parent_span_id": _hex_id(span.get("parentSpanId", ""), from_base64)
                            or None,
                            "name": str(span.get("name", "")),
                            "start_ns": int(span.get("startTimeUnixNano", 0)),
                            "end_ns": int(span.get("endTimeUnixNano", 0)),
                            "status": _status(span.get("status")),
                            "attributes": _attributes(span.get("attributes", [])),
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
    return _spans_of(*_parse(body, content_type, "traces"))


def _time(raw: Mapping[str, Any], *names: str) -> int:
    for name in names:
        if int(raw.get(name, 0) or 0):
            return int(raw[name])
    return 0


def _logs_of(
    data: Mapping[str, Any], from_base64: bool
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(resource attributes, event)`` pairs of a logs request: one per log record."""
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for resource_logs in data.get("resourceLogs", []):
        resource = _attributes((resource_logs.get("resource") or {}).get("attributes", []))
        for scope_logs in resource_logs.get("scopeLogs", []):
            for record in scope_logs.get("logRecords", []):
                attributes = _attributes(record.get("attributes", []))
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
                            "trace_id": _hex_id(record.get("traceId", ""), from_base64) or None,
                            "span_id": _hex_id(record.get("spanId", ""), from_base64) or None,
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


def _metrics_of(
    data: Mapping[str, Any], from_base64: bool
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(resource attributes, event)`` pairs of a metrics request: one per data point."""
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for resource_metrics in data.get("resourceMetrics", []):
        resource = _attributes((resource_metrics.get("resource") or {}).get("attributes", []))
        for scope_metrics in resource_metrics.get("scopeMetrics", []):
            for metric in scope_metrics.get("metrics", []):
                for shape in ("sum", "gauge", "histogram", "exponentialHistogram", "summary"):
                    if shape in metric:
                        break
                else:
                    continue
                for point in (metric.get(shape) or {}).get("dataPoints", []):
                    attributes = _attributes(point.get("attributes", []))
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
class _Decoded:
    """One export request as the receiver keeps it: built in a worker thread, kept on the
    loop. ``over``: spans or events beyond the run's limit, not kept."""

    spans: list[CliSpan]
    events: list[CliEvent]
    over: int
    forward: tuple[str, bytes, str] | None


def _decompress(body: bytes, encoding: str) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ValueError(f"unsupported Content-Encoding {encoding!r}")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    out = inflater.decompress(body, MAX_BODY_BYTES + 1)
    if len(out) > MAX_BODY_BYTES:
        raise OverflowError
    return out


class OtlpReceiver:
    """The receiver of one run: checks its secret, decodes, redacts and keeps the spans.

    ``run_trace`` is ``(trace_id, span_id)`` of the run's span in hex, or None when
    the run has no recording span (then nothing is re-parented). ``prompt`` is kept
    out of every stored attribute, like the run's secrets (``redactor``). ``on_timing``
    gets a :class:`~spawnkit.events.Timing` for each model request and tool call a log
    event reports (:mod:`spawnkit.telemetry.timings`), as the event arrives.
    """

    def __init__(
        self,
        session_id: str,
        redactor: Redactor,
        *,
        prompt: str = "",
        run_trace: tuple[str, str] | None = None,
        forward: OtlpTarget | None = None,
        on_timing: Callable[[Timing], None] | None = None,
    ) -> None:
        self.session_id = session_id
        self.on_timing = on_timing
        self.timings = RunTimings(session_id)
        self.forward = forward
        self.forwarder: Forwarder | None = None
        self.redactor = redactor
        self._prompt = Redactor({"PROMPT": prompt}) if prompt.strip() else Redactor()
        self.run_trace = run_trace
        self.secret = secrets.token_urlsafe(24)
        self.spans: list[CliSpan] = []
        self.events: list[CliEvent] = []
        self.dropped = 0
        self.refused = 0  # requests without the secret
        self.too_large = 0  # requests over MAX_BODY_BYTES (413)
        self.limited = 0  # requests over MAX_IN_FLIGHT (429)
        self._in_flight = 0
        self._turn = asyncio.Lock()

    @property
    def in_flight(self) -> int:
        """Requests being read, decoded or waiting for their turn now."""
        return self._in_flight

    # -- what is kept ------------------------------------------------------------

    def _clean(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        return {
            key: self._prompt.data(self.redactor.data(value))
            for key, value in attributes.items()
            if key not in COMMAND_LINE_ATTRIBUTES
        }

    def _scrub(self, node: Any) -> Any:
        """An OTLP tree with every string redacted and command-line attributes dropped."""
        if isinstance(node, str):
            return self._prompt.text(self.redactor.text(node))
        if isinstance(node, list):
            return [self._scrub(item) for item in node]
        if not isinstance(node, dict):
            return node
        clean: dict[str, Any] = {}
        for key, value in node.items():
            if key in _OPAQUE_KEYS:
                clean[key] = value
                continue
            if key == "attributes" and isinstance(value, list):
                value = [
                    item
                    for item in value
                    if not (isinstance(item, dict) and item.get("key") in COMMAND_LINE_ATTRIBUTES)
                ]
            clean[key] = self._scrub(value)
        return clean

    def _rejoin(self, data: dict[str, Any], from_base64: bool) -> None:
        """Move this session's spans of other traces into the run's trace, in the tree."""
        if self.run_trace is None:
            return

        def encoded(hex_id: str) -> str:
            return base64.b64encode(bytes.fromhex(hex_id)).decode() if from_base64 else hex_id

        trace_id, span_id = (encoded(i) for i in self.run_trace)
        for resource_spans in data.get("resourceSpans", []):
            resource = _attributes((resource_spans.get("resource") or {}).get("attributes", []))
            if resource.get(SESSION_ATTRIBUTE) != self.session_id:
                continue
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    original = _hex_id(span.get("traceId", ""), from_base64)
                    if original == self.run_trace[0]:
                        continue
                    span["traceId"] = trace_id
                    span["parentSpanId"] = span.get("parentSpanId") or span_id
                    span.setdefault("attributes", []).append(
                        {"key": "spawnkit.original_trace_id", "value": {"stringValue": original}}
                    )

    def _forwarded(
        self, signal: str, data: dict[str, Any], from_base64: bool
    ) -> tuple[str, bytes, str] | None:
        """The request for the user's collector, ``(signal, body, content type)``: redacted
        and rejoined like the stored spans, in the encoding it came in; None without one."""
        if self.forward is None or signal not in self.forward.urls:
            return None
        tree = self._scrub(data)
        if signal == "traces":
            self._rejoin(tree, from_base64)
        if not from_base64:
            return signal, json.dumps(tree).encode(), "application/json"
        try:
            body = ParseDict(tree, _REQUESTS[signal]()).SerializeToString()
        except ParseError as exc:  # not expected: the tree came from the same message
            logger.warning("run %s: could not re-encode OTLP %s: %s", self.session_id, signal, exc)
            return None
        return signal, body, "application/x-protobuf"

    def _spans(
        self, pairs: Iterable[tuple[dict[str, Any], dict[str, Any]]], room: int
    ) -> tuple[list[CliSpan], int]:
        """The decoded spans of one request as kept (redacted, rejoined), at most ``room``
        of them; and how many were over."""
        kept: list[CliSpan] = []
        over = 0
        for resource, span in pairs:
            if len(kept) >= room:
                over += 1
                continue
            trace_id, parent, reparented = span["trace_id"], span["parent_span_id"], False
            if (
                self.run_trace is not None
                and trace_id != self.run_trace[0]
                and resource.get(SESSION_ATTRIBUTE) == self.session_id
            ):
                # A CLI that ignored TRACEPARENT: its trace joins the run's, its roots
                # hang under the run's span.
                trace_id, reparented = self.run_trace[0], True
                parent = parent or self.run_trace[1]
            attributes = self._clean(span["attributes"])
            attributes.update(
                {f"resource.{key}": value for key, value in self._clean(resource).items()}
            )
            if reparented:
                attributes["spawnkit.original_trace_id"] = span["trace_id"]
            kept.append(
                CliSpan(
                    session_id=self.session_id,
                    trace_id=trace_id,
                    span_id=span["span_id"],
                    parent_span_id=parent,
                    name=self._prompt.text(self.redactor.text(span["name"])),
                    service=resource.get("service.name"),
                    start_ns=span["start_ns"],
                    end_ns=span["end_ns"],
                    status=span["status"],
                    attributes=attributes,
                    reparented=reparented,
                )
            )
        return kept, over

    def _events(
        self, pairs: Iterable[tuple[dict[str, Any], dict[str, Any]]], room: int
    ) -> tuple[list[CliEvent], int]:
        """The decoded log events or metric points of one request as kept (redacted), at
        most ``room`` of them; and how many were over."""
        kept: list[CliEvent] = []
        over = 0
        for resource, event in pairs:
            if len(kept) >= room:
                over += 1
                continue
            attributes = self._clean(event["attributes"])
            attributes.update(
                {f"resource.{key}": value for key, value in self._clean(resource).items()}
            )
            kept.append(
                CliEvent(
                    session_id=self.session_id,
                    kind=event["kind"],
                    name=self._prompt.text(self.redactor.text(event["name"])),
                    service=resource.get("service.name"),
                    time_ns=event["time_ns"],
                    trace_id=event["trace_id"],
                    span_id=event["span_id"],
                    value=event["value"],
                    attributes=attributes,
                )
            )
        return kept, over

    def _decode(self, signal: str, body: bytes, content_type: str, encoding: str) -> _Decoded:
        """One request as it will be kept and forwarded: all the CPU work, in a worker thread.

        It reads only what does not change while the run lasts (the redactors swap their
        patterns whole), and how much room is left, which only :meth:`_keep` changes, after.
        Raises ``OverflowError`` (inflated past the limit) or ``ValueError`` and the like.
        """
        data, from_base64 = _parse(_decompress(body, encoding), content_type, signal)
        if signal == "traces":
            spans, over = self._spans(_spans_of(data, from_base64), MAX_SPANS - len(self.spans))
            events: list[CliEvent] = []
        else:
            pairs = (_logs_of if signal == "logs" else _metrics_of)(data, from_base64)
            events, over = self._events(pairs, MAX_EVENTS - len(self.events))
            spans = []
        return _Decoded(spans, events, over, self._forwarded(signal, data, from_base64))

    def _keep(self, decoded: _Decoded) -> None:
        """On the event loop: keep one decoded request, tell the listeners, forward it."""
        self.spans.extend(decoded.spans)
        self.events.extend(decoded.events)
        self.dropped += decoded.over
        for event in decoded.events:
            if event.kind == "log":
                self._timing(event)
        if decoded.forward is not None and self.forwarder is not None:
            self.forwarder.submit(*decoded.forward)

    def _timing(self, event: CliEvent) -> None:
        """Hand the model request or tool call a log event reports to ``on_timing``."""
        measured = classify(event.name, event.attributes, event.time_ns)
        if measured is None:
            return
        timing = self.timings.add(measured)
        if self.on_timing is not None:
            self.on_timing(timing)

    def finished(self) -> list[CliSpan]:
        """The kept spans, once the CLI has exited: moved spans whose parent never
        arrived (still open at exit, or over the limit) hang under the run's span."""
        if self.run_trace is None:
            return list(self.spans)
        known = {s.span_id for s in self.spans} | {self.run_trace[1]}
        return [
            replace(
                s,
                parent_span_id=self.run_trace[1],
                attributes={**s.attributes, "spawnkit.original_parent_span_id": s.parent_span_id},
            )
            if s.reparented and s.parent_span_id not in known
            else s
            for s in self.spans
        ]

    # -- HTTP ----------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get(SECRET_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.secret.encode()):
            self.refused += 1
            logger.warning("OTLP receiver of %s: a request without its secret", self.session_id)
            await _respond(send, 401, b"")
            return
        path = scope.get("path", "")
        if scope.get("method") != "POST" or path not in ("/v1/traces", "/v1/metrics", "/v1/logs"):
            await _respond(send, 404, b"")
            return
        if self._in_flight >= MAX_IN_FLIGHT:
            self._limited()
            await _respond(send, 429, b"", headers=[(b"retry-after", b"%d" % RETRY_AFTER_S)])
            return
        self._in_flight += 1
        try:
            await self._export(path.removeprefix("/v1/"), headers, receive, send)
        finally:
            self._in_flight -= 1

    async def _export(
        self, signal: str, headers: dict[str, str], receive: Receive, send: Send
    ) -> None:
        """One export request: read (bounded), decoded in a worker thread, then kept."""
        body = await _read_body(headers, receive)
        if body is None:
            await self._too_large(send)
            return
        content_type = headers.get("content-type", "application/x-protobuf")
        encoding = headers.get("content-encoding", "").strip().lower()
        async with self._turn:  # FIFO: requests are kept in the order they were read
            try:
                decoded = await asyncio.to_thread(
                    self._decode, signal, body, content_type, encoding
                )
            except OverflowError:
                await self._too_large(send)
                return
            except (ValueError, zlib.error, gzip.BadGzipFile) as exc:
                logger.warning("OTLP receiver of %s: a bad request: %s", self.session_id, exc)
                await _respond(send, 400, str(exc).encode())
                return
            self._keep(decoded)
        await _respond(send, 200, b"{}" if "json" in content_type else b"", content_type)

    async def _too_large(self, send: Send) -> None:
        self.too_large += 1
        if self.too_large == 1:
            logger.warning(
                "OTLP receiver of %s: a request over %d bytes; refused with 413 (further "
                "refusals not logged)", self.session_id, MAX_BODY_BYTES,
            )  # fmt: skip
        await _respond(send, 413, b"")

    def _limited(self) -> None:
        self.limited += 1
        if self.limited == 1:
            logger.warning(
                "OTLP receiver of %s: more than %d requests at once; refused with 429 "
                "(further refusals not logged)", self.session_id, MAX_IN_FLIGHT,
            )  # fmt: skip

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[CliTelemetry]:
        """Listen on a free loopback port until the block exits (and forward, with a
        target: what is still waiting then gets at most :data:`FORWARD_DRAIN_S`)."""
        async with contextlib.AsyncExitStack() as stack:
            if self.forward is not None:
                forwarder = Forwarder(self.forward, f"run {self.session_id}")
                self.forwarder = await stack.enter_async_context(forwarder.running())
            async with _asgi.serve(self, "127.0.0.1", 0) as address:
                yield CliTelemetry(address.url, self.session_id, self.secret)
        if self.dropped:
            logger.warning("run %s: %d CLI spans, events or points over the limit were not kept",
                           self.session_id, self.dropped)  # fmt: skip


async def _read_body(headers: Mapping[str, str], receive: Receive) -> bytes | None:
    """The request's body, or None when it is (or says it will be) over :data:`MAX_BODY_BYTES`:
    then it is read no further."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            return None
        if not message.get("more_body"):
            return bytes(body)


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: str = "text/plain",
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
