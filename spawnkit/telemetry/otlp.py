"""A run's own OTLP/HTTP receiver: the agent CLI's spans, joined to the run's trace, and its
log events and metrics.

With CLI telemetry on (``[butler.telemetry] cli = true`` or ``Spawner(cli_telemetry=
True)``; which signals: :mod:`spawnkit.config.cli_telemetry`), the spawner starts one
:class:`OtlpReceiver` per run for as long as the run's CLI lives, and tells the CLI to
export its telemetry there (:class:`CliTelemetry`, which each adapter turns into its own
settings). Only a request carrying the run's secret in the :data:`SECRET_HEADER` header
gets in. Decoding is :mod:`.otlp_decode`'s, forwarding to the user's collector
:mod:`.otlp_export`'s.

The receiver is a plain asyncio server of HTTP/1.1 (the heads and body framing of
:mod:`spawnkit._http1`), on a loopback port, or on its door's unix socket in a run's own
network: a uvicorn server started for each run, bridged to the door, cost more CPU than
decoding a Codex run's log events. It accepts ``POST /v1/traces`` as protobuf
(``application/x-protobuf``) or JSON, gzip-compressed or not, in one piece or chunked, on
kept-alive connections, up to :data:`MAX_BODY_BYTES` (413 beyond, before any parsing),
and ``/v1/logs`` and ``/v1/metrics`` the same way:
each log record and metric data point becomes a :class:`CliEvent` row, redacted like the
spans; a log event that reports a model request or a tool call (:mod:`spawnkit.telemetry.timings`)
also becomes a :class:`~spawnkit.events.Timing` for the run's listeners, at once. Every
span becomes a :class:`CliSpan` row whose attributes have passed the run's redactor
and a redactor of the run's prompt; attributes that hold a command line (Gemini's
``process.command_args`` carries the prompt) are dropped. A CLI that ignores
``TRACEPARENT`` (Gemini) starts traces of its own: spans of another trace that carry
the run's ``spawnkit.session_id`` resource attribute are moved into the run's trace,
their roots under the run's span (``spawnkit.reparented`` says so).

Only the signals the run chose are kept (``cli = "logs"``, :mod:`spawnkit.config.cli_telemetry`);
a request of another is answered and dropped unread. A protobuf request is read straight
from its message, and each distinct string or number is redacted once per request (a
Codex run's 340 KB and 770 spans and events: about 30 ms of CPU).

The agent can read the receiver's secret (it is in its CLI's environment or config), so
a request may be hostile. Decoding and redacting a request can cost up to a third of a
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
import secrets
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from google.protobuf.json_format import ParseDict, ParseError

from .. import _http1 as wire
from ..config.cli_telemetry import CLI_SIGNALS, CliSignal
from ..events import Timing
from ..redaction import Redactor
from .otlp_decode import (
    MAX_BODY_BYTES,
    OPAQUE_KEYS,
    REQUESTS,
    CliEvent,
    CliSpan,
    Decoded,
    Pair,
    attributes_of,
    decompress,
    hex_id,
    items_of,
    read,
    tree_of,
)
from .otlp_export import Forwarder, OtlpTarget
from .timings import RunTimings, classify

logger = logging.getLogger(__name__)


SECRET_HEADER = "x-spawnkit-otlp-secret"
SESSION_ATTRIBUTE = "spawnkit.session_id"
# Requests of one run being read, decoded or waiting for their turn; more get 429. The
# CLIs send one request per signal at a time (three at most).
MAX_IN_FLIGHT = 4
# What a 429 asks the exporter to wait before it retries, in seconds.
RETRY_AFTER_S = 1
# After an answer given before its request's body was read (413, 429...), what of the
# body is still read and dropped, and for how long, before the connection closes.
LINGER_BYTES = 2 * MAX_BODY_BYTES
LINGER_S = 2.0
# How long the connections left when the receiver stops get to end by themselves.
STOP_TIMEOUT_S = 2.0
# Spans, and log events plus metric points, kept per run (Codex sends about 490 spans
# for a short run); the rest are counted.
MAX_SPANS = 20_000
MAX_EVENTS = 20_000
# Attributes that hold a command line, and so the prompt: never stored.
COMMAND_LINE_ATTRIBUTES = frozenset(
    {"process.command_args", "process.command_line", "process.command", "process.argv"}
)


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
    # The signals the CLI is asked to export ([butler.telemetry] cli); a CLI that cannot
    # leave one out sends it anyway, and the receiver drops it unread.
    signals: frozenset[CliSignal] = CLI_SIGNALS

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


class OtlpReceiver:
    """The receiver of one run: checks its secret, decodes, redacts and keeps the spans.

    ``run_trace`` is ``(trace_id, span_id)`` of the run's span in hex, or None when
    the run has no recording span (then nothing is re-parented). ``prompt`` is kept
    out of every stored attribute, like the run's secrets (``redactor``). ``on_timing``
    gets a :class:`~spawnkit.events.Timing` for each model request and tool call a log
    event reports (:mod:`spawnkit.telemetry.timings`), as the event arrives. Only
    ``signals`` are kept; requests of the others are answered and dropped unread.
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
        signals: frozenset[CliSignal] = CLI_SIGNALS,
    ) -> None:
        self.session_id = session_id
        self.signals = signals
        self.unwanted = 0  # requests of a signal not asked for, dropped unread
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
            if key in OPAQUE_KEYS:
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
            resource = attributes_of((resource_spans.get("resource") or {}).get("attributes", []))
            if resource.get(SESSION_ATTRIBUTE) != self.session_id:
                continue
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    original = hex_id(span.get("traceId", ""), from_base64)
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
        and rejoined like the stored spans, in the encoding it came in."""
        tree = self._scrub(data)
        if signal == "traces":
            self._rejoin(tree, from_base64)
        if not from_base64:
            return signal, json.dumps(tree).encode(), "application/json"
        try:
            body = ParseDict(tree, REQUESTS[signal]()).SerializeToString()
        except ParseError as exc:  # not expected: the tree came from the same message
            logger.warning("run %s: could not re-encode OTLP %s: %s", self.session_id, signal, exc)
            return None
        return signal, body, "application/x-protobuf"

    def _spans(self, pairs: Iterable[Pair], room: int) -> tuple[list[CliSpan], int]:
        """The decoded spans of one request as kept (redacted, rejoined), at most ``room``
        of them; and how many were over."""
        kept: list[CliSpan] = []
        over = 0
        clean = _Cleaner(self.redactor, self._prompt)
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
            attributes = clean.attributes(span["attributes"])
            attributes.update(clean.resource(resource))
            if reparented:
                attributes["spawnkit.original_trace_id"] = span["trace_id"]
            kept.append(
                CliSpan(
                    session_id=self.session_id,
                    trace_id=trace_id,
                    span_id=span["span_id"],
                    parent_span_id=parent,
                    name=clean.text(span["name"]),
                    service=resource.get("service.name"),
                    start_ns=span["start_ns"],
                    end_ns=span["end_ns"],
                    status=span["status"],
                    attributes=attributes,
                    reparented=reparented,
                )
            )
        return kept, over

    def _events(self, pairs: Iterable[Pair], room: int) -> tuple[list[CliEvent], int]:
        """The decoded log events or metric points of one request as kept (redacted), at
        most ``room`` of them; and how many were over."""
        kept: list[CliEvent] = []
        over = 0
        clean = _Cleaner(self.redactor, self._prompt)
        for resource, event in pairs:
            if len(kept) >= room:
                over += 1
                continue
            attributes = clean.attributes(event["attributes"])
            attributes.update(clean.resource(resource))
            kept.append(
                CliEvent(
                    session_id=self.session_id,
                    kind=event["kind"],
                    name=clean.text(event["name"]),
                    service=resource.get("service.name"),
                    time_ns=event["time_ns"],
                    trace_id=event["trace_id"],
                    span_id=event["span_id"],
                    value=event["value"],
                    attributes=attributes,
                )
            )
        return kept, over

    def _decode(self, signal: str, body: bytes, content_type: str, encoding: str) -> Decoded:
        """One request as it will be kept and forwarded: all the CPU work, in a worker thread.

        It reads only what does not change while the run lasts (the redactors swap their
        patterns whole), and how much room is left, which only :meth:`_keep` changes, after.
        Raises ``OverflowError`` (inflated past the limit) or ``ValueError`` and the like.
        """
        request = read(decompress(body, encoding), content_type, signal)
        pairs = items_of(signal, request)
        if signal == "traces":
            spans, over = self._spans(pairs, MAX_SPANS - len(self.spans))
            events: list[CliEvent] = []
        else:
            events, over = self._events(pairs, MAX_EVENTS - len(self.events))
            spans = []
        forward = None
        if self.forward is not None and signal in self.forward.urls:
            forward = self._forwarded(signal, *tree_of(request))
        return Decoded(spans, events, over, forward)

    def _keep(self, decoded: Decoded) -> None:
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

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection of the CLI's exporters: its requests in turn, kept alive between
        them, closed after an answer given before the request's body was read."""
        try:
            while (request := await wire.read_request(reader)) is not None:
                answer = await self._answer(request, reader, writer)
                close = answer.close or not request.keep_alive
                writer.write(answer.encode(close))
                await writer.drain()
                if answer.close:
                    await _linger(reader, writer)
                if close:
                    break
        except (wire.BadRequest, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            logger.warning("OTLP receiver of %s: a malformed request: %s", self.session_id, exc)
            with contextlib.suppress(ConnectionError):
                writer.write(_Answer(400, str(exc).encode()).encode(close=True))
        except ConnectionError:
            pass  # the exporter went away; nothing to answer
        finally:
            writer.close()

    async def _answer(
        self, request: wire.Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> _Answer:
        """The answer to one request: its secret, its path, the room for it, then its body."""
        given = request.header(SECRET_HEADER.encode()).decode("latin-1")
        if not hmac.compare_digest(given.encode(), self.secret.encode()):
            self.refused += 1
            logger.warning("OTLP receiver of %s: a request without its secret", self.session_id)
            return _Answer(401, close=True)
        path = request.path
        if request.method != "POST" or path not in ("/v1/traces", "/v1/metrics", "/v1/logs"):
            return _Answer(404, close=True)
        if self._in_flight >= MAX_IN_FLIGHT:
            self._limited()
            return _Answer(429, headers=(b"retry-after: %d" % RETRY_AFTER_S,), close=True)
        self._in_flight += 1
        try:
            if b"100-continue" in request.header(b"expect").lower():
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                body = await wire.read_body(reader, request.headers, MAX_BODY_BYTES)
            except wire.TooLarge:
                return self._too_large(close=True)
            return await self._export(
                path.removeprefix("/v1/"),
                request.header(b"content-type").decode("latin-1") or "application/x-protobuf",
                request.header(b"content-encoding").decode("latin-1").strip().lower(),
                body,
            )
        finally:
            self._in_flight -= 1

    async def _export(self, signal: str, content_type: str, encoding: str, body: bytes) -> _Answer:
        """One export request, read: decoded in a worker thread, then kept."""
        ok = _Answer(200, b"{}" if "json" in content_type else b"", content_type)
        if signal not in self.signals:  # a CLI that cannot leave it out (Gemini's metrics)
            self.unwanted += 1
            return ok
        async with self._turn:  # FIFO: requests are kept in the order they were read
            try:
                decoded = await asyncio.to_thread(
                    self._decode, signal, body, content_type, encoding
                )
            except OverflowError:
                return self._too_large()
            except (ValueError, zlib.error, gzip.BadGzipFile) as exc:
                logger.warning("OTLP receiver of %s: a bad request: %s", self.session_id, exc)
                return _Answer(400, str(exc).encode())
            self._keep(decoded)
        return ok

    def _too_large(self, close: bool = False) -> _Answer:
        self.too_large += 1
        if self.too_large == 1:
            logger.warning(
                "OTLP receiver of %s: a request over %d bytes; refused with 413 (further "
                "refusals not logged)", self.session_id, MAX_BODY_BYTES,
            )  # fmt: skip
        return _Answer(413, close=close)

    def _limited(self) -> None:
        self.limited += 1
        if self.limited == 1:
            logger.warning(
                "OTLP receiver of %s: more than %d requests at once; refused with 429 "
                "(further refusals not logged)", self.session_id, MAX_IN_FLIGHT,
            )  # fmt: skip

    @asynccontextmanager
    async def serve(self, uds: Path | None = None, port: int = 0) -> AsyncIterator[CliTelemetry]:
        """Listen until the block exits (and forward, with a target: what is still waiting
        then gets at most :data:`FORWARD_DRAIN_S`).

        On a free loopback port; or, with ``uds`` (a door of a run in a network of its own,
        :mod:`spawnkit.containment.doors`), on that unix socket (mode 0600, removed at the
        end), ``port`` being the port the run reaches it at inside.
        """
        connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None  # a connection is served in a task of its own
            connections[task] = writer
            try:
                await self._connection(reader, writer)
            except asyncio.CancelledError:
                # Cancelled by the receiver's own stop: the end of this task, not an error
                # (asyncio's stream server would log a cancelled handler as one).
                pass
            finally:
                connections.pop(task, None)

        async with contextlib.AsyncExitStack() as stack:
            if self.forward is not None:
                forwarder = Forwarder(self.forward, f"run {self.session_id}")
                self.forwarder = await stack.enter_async_context(forwarder.running())
            if uds is None:
                server = await asyncio.start_server(connected, "127.0.0.1", 0, limit=wire.MAX_HEAD)
                port = int(server.sockets[0].getsockname()[1])
            else:
                server = await asyncio.start_unix_server(connected, str(uds), limit=wire.MAX_HEAD)
                uds.chmod(0o600)  # noqa: ASYNC240 - a local chmod, as quick as the bind before it
            try:
                yield CliTelemetry(f"http://127.0.0.1:{port}", self.session_id, self.secret,
                                   self.signals)  # fmt: skip
            finally:
                server.close()
                await _close_connections(connections)
                if uds is not None:
                    uds.unlink(missing_ok=True)  # noqa: ASYNC240 - one unlink
        if self.dropped:
            logger.warning("run %s: %d CLI spans, events or points over the limit were not kept",
                           self.session_id, self.dropped)  # fmt: skip


async def _close_connections(
    connections: Mapping[asyncio.Task[None], asyncio.StreamWriter],
) -> None:
    """End the connections left once the CLI has exited (its idle kept-alive ones): each
    handler sees the end of its stream and returns; one still busy after
    :data:`STOP_TIMEOUT_S` is cancelled."""
    tasks = list(connections)
    for writer in connections.values():
        writer.close()
    if tasks:
        _, busy = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After an answer given before its request's body was read: end our side, then read
    and drop what the client still sends (at most :data:`LINGER_BYTES`, for at most
    :data:`LINGER_S`), so that closing does not reset the connection before the client
    has read the answer."""
    with contextlib.suppress(OSError):
        writer.write_eof()
    left = LINGER_BYTES
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(LINGER_S):
            while left > 0 and (data := await reader.read(min(left, 256 * 1024))):
                left -= len(data)


@dataclass(frozen=True)
class _Answer:
    """An answer of the receiver; ``close``: the connection ends after it (its request's
    body, if any, was not read)."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain"
    headers: tuple[bytes, ...] = ()
    close: bool = False

    def encode(self, close: bool) -> bytes:
        lines = [
            b"HTTP/1.1 %d %s" % (self.status, _REASONS.get(self.status, b"")),
            b"content-type: " + self.content_type.encode("latin-1"),
            b"content-length: %d" % len(self.body),
            *self.headers,
            *([b"connection: close"] if close else []),
        ]
        return b"\r\n".join(lines) + b"\r\n\r\n" + self.body


_REASONS = {
    200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found",
    413: b"Content Too Large", 429: b"Too Many Requests",
}  # fmt: skip


class _Cleaner:
    """Redaction for the spans or events of one request, each distinct value once.

    Every span of a request repeats its resource's attributes, and most attribute values
    recur (span kinds, tool names, versions): each string is redacted once, each resource's
    attributes are cleaned once (the decoders hand the same dict to all of its spans).
    What a value becomes is exactly what redacting it each time gave.
    """

    def __init__(self, redactor: Redactor, prompt: Redactor) -> None:
        self._redactor, self._prompt = redactor, prompt
        self._texts: dict[str, str] = {}
        self._numbers: dict[tuple[type, float], Any] = {}
        self._resources: dict[int, tuple[Mapping[str, Any], dict[str, Any]]] = {}
        # Most spans carry several numbers (Codex's: busy_ns, idle_ns, thread and line),
        # nearly all distinct; no secret of a run but one of digits can be in them.
        self._numbers_kept = not (redactor.redacts_numbers or prompt.redacts_numbers)

    def text(self, text: str) -> str:
        clean = self._texts.get(text)
        if clean is None:
            clean = self._texts[text] = self._prompt.text(self._redactor.text(text))
        return clean

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            clean = self._texts.get(value)
            return self.text(value) if clean is None else clean
        if not isinstance(value, int | float):  # lists and maps: their items are redacted
            return self._prompt.data(self._redactor.data(value))
        if self._numbers_kept and type(value) in (int, float):
            return value
        # A number may read as a secret too. Kept by type (True is not 1), and the value
        # itself is returned when unchanged (-0.0 equals 0.0).
        key = (type(value), value)
        if key not in self._numbers:
            clean = self._prompt.data(self._redactor.data(value))
            self._numbers[key] = None if clean is value else clean
        clean = self._numbers[key]
        return value if clean is None else clean

    def attributes(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """``attributes`` redacted, without those that hold a command line."""
        return {
            key: self.value(value)
            for key, value in attributes.items()
            if key not in COMMAND_LINE_ATTRIBUTES
        }

    def resource(self, resource: Mapping[str, Any]) -> dict[str, Any]:
        """A resource's attributes, cleaned and named ``resource.*``: made once per resource."""
        known = self._resources.get(id(resource))
        if known is None or known[0] is not resource:
            cleaned = {f"resource.{k}": v for k, v in self.attributes(resource).items()}
            known = self._resources[id(resource)] = (resource, cleaned)
        return known[1]
