"""The replay model server: a Starlette app that plays a scenario as three vendors' APIs.

:class:`ReplayServer` answers, from one :class:`~spawnkit.replay.scenario.Scenario` and on
one port, the Anthropic Messages API (``POST /v1/messages``, for Claude Code), the OpenAI
Responses API (``POST /v1/responses``, for Codex) and the Gemini API (``POST
/v1beta/models/MODEL:streamGenerateContent|generateContent|countTokens``, for the Gemini
CLI), streamed or not, plus the side endpoints Claude Code calls (``HEAD /api/hello``,
``/v1/messages/count_tokens``). Requests are routed by path; the wire modules do the
translating. The server keeps a bounded log of every request so tests can assert what the
CLI sent. A :class:`Throttle` makes it play a rate-limited API: it answers HTTP 429 (or
another status) to the first model requests, or to a request beyond a number in flight at
once, before the scenario is asked. :meth:`ReplayServer.recorder` builds the same server
in record mode: a transparent proxy to a real upstream API that rebuilds each turn, of any
of the three APIs, from the bytes it relays and writes them as a scenario. Serving goes through
``spawnkit._asgi`` (on the caller's loop or on a thread); :func:`serve_forever` and
:func:`record_forever` are the blocking entry points behind ``spawnkit replay``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn._types import ASGIApplication

from .. import signals
from .._asgi import serve, serve_in_thread
from . import anthropic, gemini, openai
from .anthropic import (
    MessagesRequest,
    count_tokens,
    error_body,
    estimate_usage,
    message_body,
    sse_frames,
    to_turn_request,
)
from .recorded import RecordedTurn, TurnAssembler, TurnSink, turn_from_error
from .recorder import Recording
from .scenario import ErrorSpec, Reply, Scenario, TurnRequest
from .sse import SSEDecoder

MAX_LOGGED_REQUESTS = 1000
# A non-streamed upstream body is buffered to be parsed; bound it.
MAX_BUFFERED_BODY = 32 * 1024 * 1024
# Claude Code itself gives a model call 600 s (its x-stainless-timeout header).
UPSTREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=10.0)
# Hop-by-hop headers, and the ones httpx recomputes, are not forwarded either way.
_REQUEST_HEADERS_DROPPED = frozenset(
    {"host", "content-length", "connection", "transfer-encoding", "accept-encoding", "keep-alive"}
)
_RESPONSE_HEADERS_DROPPED = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"}
)
_DISCONNECT_POLL_S = 0.05


@dataclass(frozen=True)
class Throttle:
    """Model requests the server refuses, as a rate-limited (or overloaded) API would.

    ``refuse_first`` requests are refused outright; after that, a request arriving while
    ``max_concurrent`` are in flight is. The refusal has ``status`` (429, or 529/503 for
    an overload) and, with ``retry_after_s``, a ``Retry-After`` header and a message that
    names the wait (the CLIs pass the message on, not the header).
    """

    refuse_first: int = 0
    max_concurrent: int | None = None
    status: int = 429
    retry_after_s: float | None = None

    def refusal(self) -> ErrorSpec:
        kind = "rate_limit_error" if self.status == 429 else "overloaded_error"
        message = "rate limited by the replay server"
        if self.retry_after_s is not None:
            message += f": try again in {self.retry_after_s:g}s"
        return ErrorSpec(self.status, kind, message)


class _Gate:
    """A throttle's counts: model requests seen, in flight, and refused."""

    def __init__(self, throttle: Throttle | None) -> None:
        self.throttle = throttle
        self.seen = self.in_flight = self.refused = 0
        self.most_in_flight = 0

    def enter(self) -> ErrorSpec | None:
        """A refusal for this request, or None once it counts as in flight (then leave())."""
        throttle = self.throttle
        self.seen += 1
        if throttle is not None and (
            self.seen <= throttle.refuse_first
            or (throttle.max_concurrent is not None and self.in_flight >= throttle.max_concurrent)
        ):
            self.refused += 1
            return throttle.refusal()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return None

    def leave(self) -> None:
        self.in_flight -= 1

    def refuse(self, error: ErrorSpec, encode_error: Callable[[ErrorSpec], Any]) -> Response:
        headers = {}
        if self.throttle is not None and self.throttle.retry_after_s is not None:
            headers["retry-after"] = f"{self.throttle.retry_after_s:g}"
        return JSONResponse(encode_error(error), status_code=error.status, headers=headers)


@dataclass(frozen=True)
class LoggedRequest:
    """One request the server received; ``body`` is the parsed JSON, or ``None``."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: Any


class _RequestLog:
    """The last ``limit`` requests; appended on the server's thread, read from any."""

    def __init__(self, limit: int) -> None:
        self._entries: deque[LoggedRequest] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def add(self, request: Request, raw: bytes) -> Any:
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = None
        entry = LoggedRequest(
            method=request.method,
            path=request.url.path,
            query=request.url.query,
            headers=dict(request.headers),
            body=body,
        )
        with self._lock:
            self._entries.append(entry)
        return body

    def snapshot(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._entries)


class ReplayServer:
    """Plays ``scenario`` as the Anthropic, OpenAI Responses and Gemini APIs at once.

    Or records one: :meth:`recorder`. Point Claude Code at the bare URL, Codex at
    ``URL/v1`` and the Gemini CLI at the bare URL (see ``docs/replay.md``).
    """

    scenario: Scenario | None
    recording: Recording | None
    app: Starlette

    def __init__(
        self,
        scenario: Scenario,
        *,
        max_requests: int = MAX_LOGGED_REQUESTS,
        throttle: Throttle | None = None,
    ) -> None:
        self.scenario = scenario
        self.recording = None
        self._log = _RequestLog(max_requests)
        self._gate = _Gate(throttle)
        self.app = _replay_app(scenario, self._log, self._gate)

    @property
    def refused(self) -> int:
        """How many model requests the throttle refused."""
        return self._gate.refused

    @property
    def most_in_flight(self) -> int:
        """The most model requests the server was answering at once."""
        return self._gate.most_in_flight

    @classmethod
    def recorder(
        cls, upstream: str, out: Path | str, *, max_requests: int = MAX_LOGGED_REQUESTS
    ) -> ReplayServer:
        """A proxy to ``upstream`` that writes what passes through as a scenario at ``out``."""
        server = cls.__new__(cls)
        server.scenario = None
        server.recording = Recording(Path(out), upstream)
        server._log = _RequestLog(max_requests)
        server._gate = _Gate(None)
        server.app = _record_app(upstream.rstrip("/"), server.recording, server._log)
        return server

    @property
    def requests(self) -> list[LoggedRequest]:
        """A copy of the most recent requests, oldest first."""
        return self._log.snapshot()

    @contextlib.asynccontextmanager
    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
        """Serve on the running loop; yields the base URL (``ANTHROPIC_BASE_URL``)."""
        async with serve(_asgi_app(self.app), host, port) as address:
            yield address.url

    @contextlib.contextmanager
    def serve_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """Serve on a daemon thread with its own loop; yields the base URL."""
        with serve_in_thread(_asgi_app(self.app), host, port) as address:
            yield address.url


def _asgi_app(app: Starlette) -> ASGIApplication:
    # Starlette types its scope as a plain mapping, uvicorn as TypedDicts: same protocol.
    return cast(ASGIApplication, app)


def _api_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(error_body(ErrorSpec(status, kind, message)), status_code=status)


def _replay_app(scenario: Scenario, log: _RequestLog, gate: _Gate) -> Starlette:
    Endpoint = Callable[[Request], Awaitable[Response]]

    def model_call(encode_error: Callable[[ErrorSpec], Any]) -> Callable[[Endpoint], Endpoint]:
        """A model endpoint behind the throttle: refused, or counted in flight while it runs."""

        def wrap(endpoint: Endpoint) -> Endpoint:
            async def throttled(request: Request) -> Response:
                refusal = gate.enter()
                if refusal is not None:
                    log.add(request, await request.body())
                    return gate.refuse(refusal, encode_error)
                try:
                    return await endpoint(request)
                finally:
                    gate.leave()

            return throttled

        return wrap

    @model_call(error_body)
    async def messages(request: Request) -> Response:
        body = log.add(request, await request.body())
        if not isinstance(body, dict):
            return _api_error(400, "invalid_request_error", "the body must be a JSON object")
        wire = cast(MessagesRequest, body)
        turn_request = to_turn_request(wire)
        reply = scenario.reply(turn_request)
        early = await _delay_or_error(request, reply, error_body)
        if early is not None:
            return early
        model = scenario.model or str(wire.get("model") or "replay")
        usage = estimate_usage(wire, reply)
        if not wire.get("stream"):
            return JSONResponse(message_body(turn_request, reply, model=model, usage=usage))
        return _event_stream(sse_frames(turn_request, reply, model=model, usage=usage))

    @model_call(openai.error_body)
    async def responses(request: Request) -> Response:
        body = log.add(request, await request.body())
        if not isinstance(body, dict):
            error = ErrorSpec(400, "invalid_request_error", "the body must be a JSON object")
            return JSONResponse(openai.error_body(error), status_code=400)
        wire = cast(openai.ResponsesRequest, body)
        turn_request = openai.to_turn_request(wire)
        reply = scenario.reply(turn_request)
        early = await _delay_or_error(request, reply, openai.error_body)
        if early is not None:
            return early
        model = scenario.model or str(wire.get("model") or "replay")
        usage = openai.estimate_usage(wire, reply)
        if not wire.get("stream"):
            return JSONResponse(
                openai.response_body(wire, turn_request, reply, model=model, usage=usage)
            )
        return _event_stream(openai.sse_frames(wire, turn_request, reply, model=model, usage=usage))

    @model_call(gemini.error_body)
    async def generate(request: Request) -> Response:
        body = log.add(request, await request.body())
        # The model is in the path: /v1beta/models/gemini-2.5-flash:streamGenerateContent
        asked, _, method = request.path_params["target"].rpartition(":")
        if method not in _GEMINI_METHODS:
            return _gemini_error(404, f"the replay server does not serve {request.url.path}")
        if not isinstance(body, dict):
            return _gemini_error(400, "the body must be a JSON object")
        wire = cast(gemini.GenerateContentRequest, body)
        if method == "countTokens":
            counted = body.get("generateContentRequest", body)
            return JSONResponse({"totalTokens": gemini.count_tokens(counted)})
        turn_request = gemini.to_turn_request(wire)
        reply = scenario.reply(turn_request)
        early = await _delay_or_error(request, reply, gemini.error_body)
        if early is not None:
            return early
        model = scenario.model or asked or "replay"
        usage = gemini.estimate_usage(wire, reply)
        if method == "generateContent":
            return JSONResponse(
                gemini.response_body(wire, turn_request, reply, model=model, usage=usage)
            )
        if request.query_params.get("alt") != "sse":
            # Without alt=sse the streaming method answers one JSON array of the chunks.
            return JSONResponse(
                gemini.response_chunks(wire, turn_request, reply, model=model, usage=usage)
            )
        return _event_stream(gemini.sse_frames(wire, turn_request, reply, model=model, usage=usage))

    async def tokens(request: Request) -> Response:
        body = log.add(request, await request.body())
        if not isinstance(body, dict):
            return _api_error(400, "invalid_request_error", "the body must be a JSON object")
        counted = {key: body.get(key) for key in ("system", "messages", "tools")}
        return JSONResponse({"input_tokens": count_tokens(counted)})

    async def hello(request: Request) -> Response:
        log.add(request, b"")
        return Response(status_code=200)

    async def other(request: Request) -> Response:
        log.add(request, await request.body())
        return _api_error(
            404,
            "not_found_error",
            f"the replay server does not serve {request.method} {request.url.path}",
        )

    return Starlette(
        routes=[
            Route("/api/hello", hello, methods=["GET", "HEAD"]),
            Route("/v1/messages/count_tokens", tokens, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            # Codex appends /responses to its provider's base_url, normally .../v1.
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/responses", responses, methods=["POST"]),
            *(
                Route(f"/{version}/models/{{target:path}}", generate, methods=["POST"])
                for version in _GEMINI_VERSIONS
            ),
            Route("/{path:path}", other, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]),
        ]
    )


_GEMINI_VERSIONS = ("v1beta", "v1", "v1alpha")
_GEMINI_METHODS = frozenset({"streamGenerateContent", "generateContent", "countTokens"})


def _event_stream(frames: list[str]) -> StreamingResponse:
    return StreamingResponse(
        iter(frames), media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


def _gemini_error(status: int, message: str) -> JSONResponse:
    return JSONResponse(gemini.error_body(ErrorSpec(status, "", message)), status_code=status)


async def _delay_or_error(
    request: Request, reply: Reply, encode_error: Callable[[ErrorSpec], Any]
) -> Response | None:
    """Wait out the turn's ``delay_ms``, then answer its ``error``; None to play the turn."""
    if reply.delay_ms and not await _pause(request, reply.delay_ms / 1000):
        return Response(status_code=499)  # the client is gone; nobody reads this
    if reply.error is not None:
        return JSONResponse(encode_error(reply.error), status_code=reply.error.status)
    return None


async def _pause(request: Request, seconds: float) -> bool:
    """Sleep ``seconds`` (a scenario's ``delay_ms``); False if the client hung up meanwhile."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        await asyncio.sleep(min(left, _DISCONNECT_POLL_S))
        if await request.is_disconnected():
            return False
    return True


def _record_app(upstream: str, recording: TurnSink, log: _RequestLog) -> Starlette:
    clients: list[httpx.AsyncClient] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The client belongs to the server's own loop, which may be another thread's.
        async with httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT) as client:
            clients.append(client)
            try:
                yield
            finally:
                clients.clear()

    async def proxy(request: Request) -> Response:
        raw = await request.body()
        body = log.add(request, raw)
        headers = {
            key: value
            for key, value in request.headers.items()
            if key.lower() not in _REQUEST_HEADERS_DROPPED
        }
        # Uncompressed, so the relayed stream can be parsed as it passes.
        headers["accept-encoding"] = "identity"
        url = upstream + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        client = clients[0]
        try:
            upstream_response = await client.send(
                client.build_request(request.method, url, headers=headers, content=raw),
                stream=True,
            )
        except httpx.HTTPError as exc:
            return _api_error(502, "api_error", f"recorder: upstream {upstream} failed: {exc!r}")
        response_headers = {
            key: value
            for key, value in upstream_response.headers.items()
            if key.lower() not in _RESPONSE_HEADERS_DROPPED
        }
        api = _recorded_api(request.method, request.url.path) if isinstance(body, dict) else None
        target = None
        if api is not None:
            target = _RecordTarget(
                recording, api, api.turn_request(body), request.headers.get(api.session_header, "")
            )
        relay = _relay(upstream_response, target)
        return StreamingResponse(
            relay, status_code=upstream_response.status_code, headers=response_headers
        )

    return Starlette(
        routes=[
            Route("/{path:path}", proxy, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
        ],
        lifespan=lifespan,
    )


@dataclass(frozen=True)
class _RecordedApi:
    """How record mode reads one API: its request, session header, and answers.

    ``usage_events`` names the stream events that carry a turn's usage, its end and its
    errors (None: any event may); metering reads only those (see :class:`TurnTap`).
    """

    turn_request: Callable[[Any], TurnRequest]
    session_header: str
    assembler: Callable[[], TurnAssembler]
    from_body: Callable[[Any], RecordedTurn]
    usage_events: frozenset[str] | None


_ANTHROPIC = _RecordedApi(
    lambda body: to_turn_request(cast(MessagesRequest, body)),
    anthropic.SESSION_HEADER,
    anthropic.MessageAssembler,
    anthropic.turn_from_message,
    frozenset({"message_start", "message_delta", "message_stop", "error"}),
)
_OPENAI = _RecordedApi(
    lambda body: openai.to_turn_request(cast(openai.ResponsesRequest, body)),
    openai.SESSION_HEADER,
    openai.ResponseAssembler,
    openai.turn_from_response,
    frozenset({"response.completed", "response.incomplete", "response.failed", "error"}),
)
# The Gemini CLI sends no session header: its conversations are told apart by prompt.
_GEMINI = _RecordedApi(
    lambda body: gemini.to_turn_request(cast(gemini.GenerateContentRequest, body)),
    "",
    gemini.GenerateAssembler,
    gemini.turn_from_generate,
    None,  # unnamed events, and every chunk carries usage
)
_GEMINI_MODEL_CALL = re.compile(r"/v1(?:beta|alpha)?/models/[^:]+:(?:stream)?[gG]enerateContent")


def _recorded_api(method: str, path: str) -> _RecordedApi | None:
    """Which API a relayed request speaks, if it is a model turn worth recording."""
    path = path.rstrip("/")
    if method != "POST":
        return None
    if path == "/v1/messages":
        return _ANTHROPIC
    if path in ("/v1/responses", "/responses"):
        return _OPENAI
    if _GEMINI_MODEL_CALL.fullmatch(path):
        return _GEMINI
    return None


@dataclass(frozen=True)
class _RecordTarget:
    recording: TurnSink
    api: _RecordedApi
    request: TurnRequest
    session_id: str


class TurnTap:
    """Rebuilds the model turn a relayed answer carries from its body bytes as they pass.

    A streamed turn is recorded as soon as its final event is parsed, before that event is
    passed on: Claude Code and Codex act on ``message_stop`` / ``response.completed``
    without waiting for the stream to close, and may exit (and their caller stop the
    recorder) before code after the last chunk would run. Anything arriving later (Gemini
    may send usage after ``finishReason``) is recorded again at :meth:`close`.

    With ``usage_only`` (metering), a stream's text and tool-call deltas are passed over
    unread, as :class:`~spawnkit.replay.sse.SSEDecoder` does with events not named in the
    API's ``usage_events``: the turn handed on has its usage, end and error, not its content.
    """

    def __init__(
        self, target: _RecordTarget, status: int, content_type: str, usage_only: bool = False
    ) -> None:
        self.target = target
        self.status = status
        self.is_sse = content_type.startswith("text/event-stream")
        self.decoder = SSEDecoder(target.api.usage_events if usage_only else None)
        self.assembler = target.api.assembler()
        self.buffered = bytearray()
        self.recorded: RecordedTurn | None = None

    def feed(self, chunk: bytes) -> None:
        """One piece of the (decompressed, de-chunked) body, as it arrives."""
        if self.is_sse:
            for event in self.decoder.feed(chunk):
                self.assembler.feed(event)
            done = self.assembler.complete or self.assembler.error is not None
            if self.recorded is None and done:
                self.recorded = _record(self.target, self.status, self.assembler, b"", True)
        elif len(self.buffered) < MAX_BUFFERED_BODY:
            self.buffered.extend(chunk)

    def close(self) -> None:
        """The body is over: record what it carried (unless recorded as it was)."""
        _record(
            self.target, self.status, self.assembler, bytes(self.buffered), self.is_sse,
            self.recorded,
        )  # fmt: skip


def turn_tap(
    sink: TurnSink, method: str, path: str, body: bytes, headers: Mapping[str, str],
    status: int, content_type: str, *, usage_only: bool = False,
) -> TurnTap | None:  # fmt: skip
    """A tap for the answer to a request, when it is a model turn of a known API (else None).

    ``headers`` are the request's (lower-case names): a session header may name the turn's
    conversation. ``usage_only``: see :class:`TurnTap`.
    """
    api = _recorded_api(method, path)
    if api is None:
        return None
    try:
        parsed = json.loads(body) if body else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(parsed, dict):
        return None
    session = headers.get(api.session_header, "") if api.session_header else ""
    target = _RecordTarget(sink, api, api.turn_request(parsed), session)
    return TurnTap(target, status, content_type, usage_only)


async def _relay(response: httpx.Response, target: _RecordTarget | None) -> AsyncIterator[bytes]:
    """Pass the upstream bytes on unchanged while rebuilding the turn they carry."""
    content_type = response.headers.get("content-type", "")
    tap = TurnTap(target, response.status_code, content_type) if target is not None else None
    try:
        async for chunk in response.aiter_bytes():
            if tap is not None:
                tap.feed(chunk)
            yield chunk
    finally:
        await response.aclose()
    if tap is not None:
        tap.close()


def _record(
    target: _RecordTarget,
    status: int,
    assembler: TurnAssembler,
    buffered: bytes,
    is_sse: bool,
    already: RecordedTurn | None = None,
) -> RecordedTurn | None:
    turn = _recorded_turn(status, is_sse, assembler, buffered, target.api.from_body)
    if turn is not None and turn != already:
        target.recording.add_turn(target.request, target.session_id, turn)
    return turn


def _recorded_turn(
    status: int,
    is_sse: bool,
    assembler: TurnAssembler,
    buffered: bytes,
    from_body: Callable[[Any], RecordedTurn],
) -> RecordedTurn | None:
    if is_sse:
        if assembler.error is not None:
            return RecordedTurn(error=assembler.error)
        # A stream cut short is not a turn the model gave; record nothing.
        return assembler.turn() if assembler.complete else None
    try:
        parsed = json.loads(buffered) if buffered else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        parsed = None
    if status >= 400:
        return turn_from_error(status, parsed)
    return from_body(parsed) if isinstance(parsed, dict | list) else None


def serve_forever(scenario_path: Path | str, host: str = "127.0.0.1", port: int = 0) -> None:
    """Play the scenario at ``scenario_path`` until Ctrl-C or SIGTERM (``spawnkit replay
    serve``)."""
    server = ReplayServer(Scenario.load(scenario_path))
    _run_until_stopped(server, host, port, "replay server listening on {url}", "replay server")


def record_forever(upstream: str, out: Path | str, host: str = "127.0.0.1", port: int = 0) -> None:
    """Record traffic to ``upstream`` into ``out`` until Ctrl-C or SIGTERM (``spawnkit
    replay record``)."""
    server = ReplayServer.recorder(upstream, out)
    _run_until_stopped(
        server,
        host,
        port,
        f"replay recorder listening on {{url}} (upstream {upstream}, writing {out})",
        "replay recorder",
    )


def _run_until_stopped(server: ReplayServer, host: str, port: int, banner: str, what: str) -> None:
    """Serve until Ctrl-C, SIGTERM or SIGHUP, then say so in one line (on stderr, as
    ``spawnkit serve`` does): whoever started it sees it went away on purpose."""
    served: list[str] = []

    async def main() -> None:
        async with server.serve(host, port) as url:
            served.append(url)
            print(banner.replace("{url}", url), flush=True)
            # Deliberately unbounded: the server runs until the user stops it.
            await asyncio.Event().wait()

    try:
        signals.run(main())
    except (KeyboardInterrupt, signals.Stopped) as stop:
        how = stop.args[0] if isinstance(stop, signals.Stopped) else "stopped by Ctrl-C"
        where = f" at {served[0]}" if served else ""
        print(f"{what}{where} {how}", file=sys.stderr, flush=True)
