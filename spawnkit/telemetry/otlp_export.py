"""OTLP going out: the user's own collector, named by the standard
``OTEL_EXPORTER_OTLP_*`` variables.

:class:`OtlpTarget` reads where the collector is; :class:`Forwarder` sends a run's
redacted export requests on to it in the background, bounded; spawnkit's own spans export
there through :func:`tracer_provider_from_env` and :class:`OtlpSpanExporter` (protobuf over
HTTP, encoded by :func:`encode_spans`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import (
    AsyncIterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote

import httpx
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

from .otlp_decode import SIGNALS

logger = logging.getLogger(__name__)


# Forwarding to the user's collector: requests waiting at most, and how long the end of
# a run waits for them to go out.
FORWARD_QUEUE = 256
FORWARD_DRAIN_S = 2.0
# How long spawnkit's own finished spans wait to be exported in a batch.
EXPORT_DELAY_MS = 1000
_PROVIDERS: dict[tuple[str, tuple[tuple[str, str], ...]], SdkTracerProvider] = {}


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
