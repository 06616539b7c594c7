"""What the metering relay reads of a model's stream: the events that carry usage, no more.

A run of Codex or Gemini with a token or dollar limit has its relay meter each model call
(:class:`~spawnkit.budgets.metering.Meter`). The text and tool-call deltas, nearly all of
a long answer's bytes, say nothing about usage: Anthropic and OpenAI name every event, and
the relay's decoder passes over those it was not told to read. The streams here are the
bytes the replay server sends each CLI (its own wire adapters), cut at arbitrary points as
TCP would; the whole-turn tap of record mode reads the same bytes beside it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any, cast

import pytest

from spawnkit.budgets.metering import Meter
from spawnkit.replay import anthropic, gemini, openai
from spawnkit.replay.recorded import RecordedTurn
from spawnkit.replay.scenario import PlannedCall, Reply
from spawnkit.replay.server import TurnTap, turn_tap
from spawnkit.replay.sse import SSEDecoder, SSEEvent
from spawnkit.result import Usage

REPLY = Reply(
    text="Checking now, " * 40,
    tool_calls=(PlannedCall("mcp__health__state_get", {"key": "weight"}),),
    chunk_chars=7,
)
PROMPT = [{"role": "user", "content": "What is my weight?"}]


def _anthropic() -> tuple[str, dict[str, Any], str]:
    body = {"model": "m", "max_tokens": 100, "stream": True, "messages": PROMPT}
    request = anthropic.to_turn_request(cast(anthropic.MessagesRequest, body))
    usage = anthropic.estimate_usage(cast(anthropic.MessagesRequest, body), REPLY)
    frames = anthropic.sse_frames(request, REPLY, model="m", usage=usage)
    return "/v1/messages", body, "".join(frames)


def _openai() -> tuple[str, dict[str, Any], str]:
    body = {"model": "m", "stream": True, "input": [{"role": "user", "content": "Weight?"}]}
    typed = cast(openai.ResponsesRequest, body)
    request = openai.to_turn_request(typed)
    usage = openai.estimate_usage(typed, REPLY)
    frames = openai.sse_frames(typed, request, REPLY, model="m", usage=usage)
    return "/v1/responses", body, "".join(frames)


def _gemini() -> tuple[str, dict[str, Any], str]:
    body = {"contents": [{"role": "user", "parts": [{"text": "What is my weight?"}]}]}
    typed = cast(gemini.GenerateContentRequest, body)
    request = gemini.to_turn_request(typed)
    usage = gemini.estimate_usage(typed, REPLY)
    frames = gemini.sse_frames(typed, request, REPLY, model="gemini-x", usage=usage)
    path = "/v1beta/models/gemini-x:streamGenerateContent"
    return path, body, "".join(frames)


STREAMS: dict[str, Callable[[], tuple[str, dict[str, Any], str]]] = {
    "anthropic": _anthropic,
    "openai": _openai,
    "gemini": _gemini,
}


def _tapped(
    api: str, usage_only: bool, cut: int, stream: str | None = None
) -> tuple[Meter, TurnTap]:
    path, body, whole = STREAMS[api]()
    meter = Meter(lambda total: None)
    tap = turn_tap(
        meter, "POST", path, json.dumps(body).encode(), {}, 200, "text/event-stream",
        usage_only=usage_only,
    )  # fmt: skip
    assert tap is not None
    raw = (whole if stream is None else stream).encode()
    for offset in range(0, len(raw), cut):
        tap.feed(raw[offset : offset + cut])
    tap.close()
    return meter, tap


@pytest.mark.parametrize("cut", [1, 13, 1 << 16])
@pytest.mark.parametrize("api", list(STREAMS))
def test_metering_counts_what_the_whole_turn_says(api: str, cut: int) -> None:
    whole, whole_tap = _tapped(api, usage_only=False, cut=cut)
    lean, lean_tap = _tapped(api, usage_only=True, cut=cut)
    assert lean.total == whole.total
    assert lean.total.input_tokens > 0 and lean.total.output_tokens > 0
    assert (lean.calls, whole.calls) == (1, 1)
    full = cast(RecordedTurn, whole_tap.recorded)
    assert full.text == REPLY.text and len(full.tool_calls) == 1  # record mode: all of it
    read = cast(RecordedTurn, lean_tap.recorded)
    if api == "anthropic":  # the content is in the deltas alone
        assert (read.text, read.tool_calls) == ("", ())
    else:  # OpenAI's last event repeats the output; Gemini's events are unnamed, all read
        assert read == full


DELTAS = {"anthropic": "content_block_delta", "openai": "response.output_text.delta"}


@pytest.mark.parametrize("api", list(DELTAS))
def test_metering_does_not_decode_the_deltas(api: str, caplog: pytest.LogCaptureFixture) -> None:
    """The deltas' data made unreadable: record mode says so for each, metering never
    looks at them, and counts the same."""
    _, _, whole = STREAMS[api]()
    name = DELTAS[api]
    frames = whole.split("\n\n")
    spoiled = [f"event: {name}\ndata: {{not json" if f.startswith(f"event: {name}\n") else f
               for f in frames]  # fmt: skip
    assert spoiled.count(f"event: {name}\ndata: {{not json") >= 10
    stream = "\n\n".join(spoiled)
    caplog.set_level("WARNING", logger="spawnkit.replay.sse")
    lean, _ = _tapped(api, usage_only=True, cut=29, stream=stream)
    assert caplog.records == []
    whole_meter, _ = _tapped(api, usage_only=False, cut=29, stream=stream)
    assert len(caplog.records) == spoiled.count(f"event: {name}\ndata: {{not json")
    assert lean.total == whole_meter.total != Usage()


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_stream_cut_before_its_end_is_not_counted(api: str) -> None:
    _, _, whole = STREAMS[api]()
    last = {"anthropic": "event: message_stop", "openai": "event: response.completed"}[api]
    meter, tap = _tapped(api, usage_only=True, cut=101, stream=whole[: whole.index(last)])
    assert (meter.calls, meter.total, tap.recorded) == (0, Usage(), None)


def test_an_error_event_in_the_middle_of_a_stream_is_kept() -> None:
    _, _, whole = STREAMS["anthropic"]()
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    middle = whole.index("event: content_block_delta", len(whole) // 2)
    stream = whole[:middle] + f"event: error\ndata: {json.dumps(error)}\n\n"
    meter, _ = _tapped("anthropic", usage_only=True, cut=64, stream=stream)
    assert [(e.type, e.message) for e in meter.errors] == [("overloaded_error", "busy")]
    assert meter.calls == 0


STREAM = (
    b'event: keep\ndata: {"a": 1}\n\n'
    b"event: drop\ndata: not json at all\ndata: nor this\n\n"
    b"data: unnamed\n\n"
    b"event: message\ndata: named as the default\n\n"
    b"data: named late\nevent: drop\n\n"
    b"event: drop\r\ndata: cut\r\ndata: with CRLF\r\n\r\n"
    b': a comment\nevent: keep\r\ndata: {"b": 2}\r\n\r\n'
)


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 7, 11, len(STREAM)])
def test_a_decoder_told_which_events_it_wants_drops_the_others(cut: int) -> None:
    decoder = SSEDecoder(frozenset({"keep"}))
    events: list[SSEEvent] = []
    for offset in range(0, len(STREAM), cut):
        events += decoder.feed(STREAM[offset : offset + cut])
    assert events == [
        SSEEvent("keep", '{"a": 1}'),
        SSEEvent("message", "unnamed"),
        SSEEvent("message", "named as the default"),
        SSEEvent("keep", '{"b": 2}'),
    ]
    everything = SSEDecoder().feed(STREAM)
    assert [event.event for event in everything] == [
        "keep", "drop", "message", "message", "drop", "drop", "keep",
    ]  # fmt: skip
    assert everything[1].data == "not json at all\nnor this"


def test_a_decoder_told_which_events_it_wants_keeps_what_the_whole_decoder_keeps() -> None:
    """Random streams (LF and CRLF lines, names before and after the data, comments, many
    data lines) cut at random: the events kept are the whole decoder's, filtered by name."""
    rng = random.Random(20261129)
    for _ in range(300):
        end = rng.choice([b"\n", b"\r\n"])
        stream = b""
        for _ in range(rng.randint(1, 8)):
            lines = [b"data: " + bytes(rng.choices(b"ab\r:{} ", k=rng.randint(0, 9))).strip(b"\r")
                     for _ in range(rng.randint(0, 3))]  # fmt: skip
            name = b"event: " + rng.choice([b"keep", b"drop", b"message"])
            lines.insert(rng.choice([0, len(lines)]), name)
            if rng.random() < 0.2:
                lines.insert(0, b": comment")
            stream += end.join(lines) + end + end
        wanted = [e for e in SSEDecoder().feed(stream) if e.event in ("keep", "message")]
        decoder, events, offset = SSEDecoder(frozenset({"keep"})), [], 0
        while offset < len(stream):
            step = rng.randint(1, 12)
            events += decoder.feed(stream[offset : offset + step])
            offset += step
        assert events == wanted, stream
