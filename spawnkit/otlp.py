"""A run's own OTLP/HTTP receiver: the agent CLI's spans, joined to the run's trace.

With CLI telemetry on (``[butler.telemetry] cli = true`` or ``Spawner(cli_telemetry=
True)``), the spawner starts one :class:`OtlpReceiver` per run on loopback (port 0)
for as long as the run's CLI lives, and tells the CLI to export its traces there
(:class:`CliTelemetry`, which each adapter turns into its own settings). Only a
request carrying the run's secret in the :data:`SECRET_HEADER` header gets in; the
sandbox shares the host's loopback, as it does for the butler's MCP server.

The receiver accepts ``POST /v1/traces`` as protobuf (``application/x-protobuf``) or
JSON, gzip-compressed or not, in one piece or chunked, up to :data:`MAX_BODY_BYTES`.
Metrics and logs (``/v1/metrics``, ``/v1/logs``) are accepted and not kept. Every
span becomes a :class:`CliSpan` row whose attributes have passed the run's redactor
and a redactor of the run's prompt; attributes that hold a command line (Gemini's
``process.command_args`` carries the prompt) are dropped. A CLI that ignores
``TRACEPARENT`` (Gemini) starts traces of its own: spans of another trace that carry
the run's ``spawnkit.session_id`` resource attribute are moved into the run's trace,
their roots under the run's span (``spawnkit.reparented`` says so).
"""

from __future__ import annotations

import base64
import gzip
import hmac
import json
import logging
import secrets
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from . import _asgi
from .redaction import Redactor

logger = logging.getLogger(__name__)

SECRET_HEADER = "x-spawnkit-otlp-secret"
SESSION_ATTRIBUTE = "spawnkit.session_id"
# One export request, decompressed; the CLIs batch far below this.
MAX_BODY_BYTES = 16 * 1024 * 1024
# Spans kept per run (Codex sends about 490 for a short run); the rest are counted.
MAX_SPANS = 20_000
# Attributes that hold a command line, and so the prompt: never stored.
COMMAND_LINE_ATTRIBUTES = frozenset(
    {"process.command_args", "process.command_line", "process.command", "process.argv"}
)
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


def decode_traces(body: bytes, content_type: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(resource attributes, span)`` pairs of an OTLP export request body.

    Each span is ``{trace_id, span_id, parent_span_id, name, start_ns, end_ns,
    status, attributes}`` with hex ids. Raises ``ValueError`` for a body that is
    neither OTLP protobuf nor OTLP JSON.
    """
    if "json" in content_type:
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not OTLP JSON: {exc}") from None
        from_base64 = False
    else:
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise ValueError(f"not OTLP protobuf: {exc}") from None
        data = MessageToDict(request)
        from_base64 = True  # proto3 JSON mapping writes bytes as base64
    if not isinstance(data, dict):
        raise ValueError("not an OTLP export request")
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
    out of every stored attribute, like the run's secrets (``redactor``).
    """

    def __init__(
        self,
        session_id: str,
        redactor: Redactor,
        *,
        prompt: str = "",
        run_trace: tuple[str, str] | None = None,
    ) -> None:
        self.session_id = session_id
        self.redactor = redactor
        self._prompt = Redactor({"PROMPT": prompt}) if prompt.strip() else Redactor()
        self.run_trace = run_trace
        self.secret = secrets.token_urlsafe(24)
        self.spans: list[CliSpan] = []
        self.dropped = 0
        self.refused = 0

    # -- what is kept ------------------------------------------------------------

    def _clean(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        return {
            key: self._prompt.data(self.redactor.data(value))
            for key, value in attributes.items()
            if key not in COMMAND_LINE_ATTRIBUTES
        }

    def accept(self, pairs: Iterable[tuple[dict[str, Any], dict[str, Any]]]) -> int:
        """Keep the decoded spans of one request; returns how many were kept."""
        kept = 0
        for resource, span in pairs:
            if len(self.spans) >= MAX_SPANS:
                self.dropped += 1
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
            self.spans.append(
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
            kept += 1
        return kept

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
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES:
                await _respond(send, 413, b"")
                return
            if not message.get("more_body"):
                break
        content_type = headers.get("content-type", "application/x-protobuf")
        answer = b"{}" if "json" in content_type else b""
        if path != "/v1/traces":
            await _respond(send, 200, answer, content_type)
            return
        try:
            raw = _decompress(bytes(body), headers.get("content-encoding", "").strip().lower())
            self.accept(decode_traces(raw, content_type))
        except OverflowError:
            await _respond(send, 413, b"")
            return
        except (ValueError, zlib.error, gzip.BadGzipFile) as exc:
            logger.warning("OTLP receiver of %s: a bad request: %s", self.session_id, exc)
            await _respond(send, 400, str(exc).encode())
            return
        await _respond(send, 200, answer, content_type)

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[CliTelemetry]:
        """Listen on a free loopback port until the block exits."""
        async with _asgi.serve(self, "127.0.0.1", 0) as address:
            yield CliTelemetry(address.url, self.session_id, self.secret)
        if self.dropped:
            logger.warning("run %s: %d CLI spans over the limit were not kept",
                           self.session_id, self.dropped)  # fmt: skip


async def _respond(send: Send, status: int, body: bytes, content_type: str = "text/plain") -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
