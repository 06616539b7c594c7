"""Redaction of injected secrets: the Redactor itself, and each boundary it is applied at.

The boundaries are driven here with a hand-written adapter that leaks its secrets
every way a CLI can (streamed text split mid-value, tool inputs and outputs, log
lines, the final output and error); the real CLIs do the same in
test_secrets_e2e.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spawnkit import redaction
from spawnkit.config.credential_file import CredentialFile
from spawnkit.events import (
    AssistantText,
    EventSink,
    Finished,
    RunEvent,
    Started,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from spawnkit.redaction import MIN_SECRET_CHARS, Redactor
from spawnkit.result import SpawnerResult, ToolCall
from spawnkit.run import Spawner
from spawnkit.runtimes.base import RunOutcome, RunSpec
from spawnkit.serve.butler_server import ButlerServer
from spawnkit.telemetry.runlog import RunLog
from spawnkit.telemetry.spans import run_span

from . import mcp_clients
from .fakes import FakeAdapter, Gate

TOKEN = "tok-7Hq2Lm9Xv4"
TRICKY = 'p"a\\ss/wörd 1'


def test_values_and_their_common_encodings_are_redacted() -> None:
    r = Redactor({"TOKEN": TOKEN, "TRICKY": TRICKY})
    samples = {
        "plain": f"the token is {TOKEN}.",
        "json": json.dumps({"v": TRICKY}),
        "json ascii": json.dumps({"v": TRICKY}, ensure_ascii=True),
        "json in json": json.dumps({"line": json.dumps({"v": TRICKY})}),
        "url": "https://x/?t=" + "p%22a%5Css%2Fw%C3%B6rd%201",
        "url plus": "q=p%22a%5Css%2Fw%C3%B6rd+1",
        "base64 <<<": base64.b64encode(TOKEN.encode() + b"\n").decode(),
        "base64 -n": base64.b64encode(TOKEN.encode()).decode(),
    }
    for label, text in samples.items():
        out = r.text(text)
        assert "[redacted:" in out, label
        assert TOKEN not in out and TRICKY not in out, label
    assert r.text(f"a{TOKEN}b") == "a[redacted:TOKEN]b"
    assert r.names == ["TOKEN", "TRICKY"] and repr(r) == "Redactor(TOKEN, TRICKY)"


def test_each_line_of_a_multiline_value_is_a_secret() -> None:
    pem = "-----BEGIN KEY-----\nMIIEvQIBADANBgkq\nhkiG9w0BAQEFAASC\n-----END KEY-----\n"
    r = Redactor({"KEY": pem})
    printed = "cat key:\n" + "\n".join(f"> {line}" for line in pem.splitlines())
    out = r.text(printed)
    assert "MIIEvQIBADANBgkq" not in out and "hkiG9w0BAQEFAASC" not in out
    assert out.count("[redacted:KEY]") == 4


def test_short_values_are_not_secrets_and_longest_values_win() -> None:
    short = "x" * (MIN_SECRET_CHARS - 1)
    r = Redactor({"SHORT": short, "LONG": TOKEN + "-extended", "BASE": TOKEN, "TWIN": TOKEN})
    assert r.text(f"{short} {TOKEN}-extended {TOKEN}") == (
        f"{short} [redacted:LONG] [redacted:BASE]"
    ), "the longer value wins; a value shared by two names is reported under the first"
    assert not Redactor({"SHORT": short}) and Redactor({"SHORT": short}).text(short) == short
    empty = Redactor()
    assert not empty and empty.text(TOKEN) == TOKEN and empty.text(None) is None


def test_text_that_only_shares_a_secrets_opening_skips_the_regex() -> None:
    """A key named after a word the texts hold (``spawnkit-...``, and every run's paths say
    ``spawnkit``) must not send each text through the regex, nor change it."""
    redactor = Redactor({"OPENAI_API_KEY": "spawnkit-replay-key"})
    text = "/home/u/.spawnkit/workspaces/butler_x/run.json: spawnkit-replay"
    assert redactor.text(text) == text
    assert "regex" not in vars(redactor._patterns), "no regex was compiled for it"
    assert redactor.text(f"{text} spawnkit-replay-key") == f"{text} [redacted:OPENAI_API_KEY]"


def test_data_results_and_events_are_redacted_throughout() -> None:
    r = Redactor({"TOKEN": TOKEN, "PIN": "90817263"})
    assert r.data({TOKEN: [TOKEN, 90817263, 7, True, None, {"k": (TOKEN,)}]}) == {
        "[redacted:TOKEN]": ["[redacted:TOKEN]", "[redacted:PIN]", 7, True, None,
                             {"k": ("[redacted:TOKEN]",)}],
    }  # fmt: skip
    now = datetime.now(UTC)
    call = ToolCall.start("c1", "Bash", {"command": f"echo {TOKEN}"}, now).finish(TOKEN, False, now)
    result = SpawnerResult(output=TOKEN, error=f"failed: {TOKEN}", tool_calls=[call])
    redacted = json.dumps(r.result(result).to_dict())
    assert TOKEN not in redacted and redacted.count("[redacted:TOKEN]") == 4
    events: list[RunEvent] = [
        TextDelta("s", TOKEN), AssistantText("s", TOKEN), ToolCallStarted("s", call),
        ToolCallFinished("s", call), Finished("s", result),
        Started("s", "b", "codex", None, None),
    ]  # fmt: skip
    assert all(TOKEN not in repr(r.event(e)) for e in events)


@pytest.mark.parametrize("value", [TOKEN, TRICKY, "aaaaaaaaaa", "abababab"])
def test_a_stream_catches_a_value_split_anywhere(value: str) -> None:
    """Every way of cutting the text in two or three pieces gives what one pass gives."""
    r = Redactor({"V": value})
    text = f"say {value}{value[:5]} then {value}"
    expected = r.text(text)
    assert value not in expected
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 3):
            stream = r.stream()
            out = "".join(stream.feed(p) for p in (text[:i], text[i:j], text[j:])) + stream.flush()
            assert out == expected, (i, j)
    stream = r.stream()
    pieces = [stream.feed(c) for c in text]
    assert all(value not in piece for piece in pieces)
    assert "".join(pieces) + stream.flush() == expected


def test_files_are_rewritten_in_place_and_only_when_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redaction, "FILE_CHUNK_CHARS", 7)  # a value straddles chunks
    r = Redactor({"TOKEN": TOKEN})
    root = tmp_path / "transcripts"
    (root / "deep").mkdir(parents=True)
    leaky = root / "deep" / "session.jsonl"
    leaky.write_bytes(b"\xff\xfe not utf-8 " + json.dumps({"t": TOKEN}).encode() + b"\nend\n")
    leaky.chmod(0o640)
    clean = root / "clean.txt"
    clean.write_text("nothing here\n")
    clean_inode = clean.stat().st_ino
    outside = tmp_path / "outside.txt"
    outside.write_text(TOKEN)
    (root / "link").symlink_to(outside)

    assert r.tree(root) == 1
    assert leaky.read_bytes() == b'\xff\xfe not utf-8 {"t": "[redacted:TOKEN]"}\nend\n'
    assert (leaky.stat().st_mode & 0o777) == 0o640
    assert clean.stat().st_ino == clean_inode, "an untouched file is not rewritten"
    assert outside.read_text() == TOKEN, "a symlink is not followed"
    assert sorted(p.name for p in root.rglob("*")) == ["clean.txt", "deep", "link", "session.jsonl"]


def test_run_logs_are_redacted_line_by_line(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "log", cap_bytes=60, redactor=Redactor({"TOKEN": TOKEN}))
    log.stdout(json.dumps({"echo": TOKEN}))
    log.stderr(f"warning: {TOKEN}")
    log.stderr(f"warning: {TOKEN} {TOKEN} {TOKEN} {TOKEN}")  # over the cap: dropped
    log.close()
    stdout = (tmp_path / "log" / "stdout.log").read_text()
    stderr = (tmp_path / "log" / "stderr.log").read_text()
    assert stdout == '{"echo": "[redacted:TOKEN]"}\n'
    assert stderr.startswith("warning: [redacted:TOKEN]\n[spawnkit: log capped at 60 bytes")


def test_span_attributes_and_status_are_redacted_before_the_cut() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    r = Redactor({"TOKEN": TOKEN})
    now = datetime.now(UTC)
    call = ToolCall.start("c1", "Bash", {}, now).finish("x" * 195 + TOKEN, True, now)
    with run_span(
        butler="b", runtime="codex", model=TOKEN, session_id="s", trigger_source="external",
        provider=provider, redactor=r,
    ) as span:  # fmt: skip
        span.tool_call(call)
        span.finish(SpawnerResult(success=False, status="failed", error="y" * 195 + TOKEN))
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    dumped = "".join(s.to_json() for s in spans)
    assert TOKEN[:5] not in dumped, "no prefix of the value survives the 200-character cut"
    assert "[redac" in dumped


class LeakyAdapter(FakeAdapter):
    """Leaks every injected secret through each channel an adapter has."""

    type: ClassVar[str] = "fake"
    names: ClassVar[tuple[str, ...]] = ("LEAKY_TOKEN",)

    async def invoke(self, spec: RunSpec, emit: EventSink) -> RunOutcome:
        root = self.root
        root.specs.append(spec)
        await root.gate.wait()
        secret = spec.env["LEAKY_TOKEN"]
        now = datetime.now(UTC)
        call = ToolCall.start("c1", "Bash", {"command": f"echo {secret}"}, now)
        emit(ToolCallStarted(spec.session_id, call))
        emit(ToolCallFinished(spec.session_id, call.finish(secret + "\n", False, now)))
        text = f"Your token is {secret}, as JSON {json.dumps({'t': secret})}."
        for i in range(0, len(text), 3):
            emit(TextDelta(spec.session_id, text[i : i + 3]))
        emit(AssistantText(spec.session_id, text))
        assert spec.log is not None
        spec.log.stdout(json.dumps({"type": "assistant", "text": text}))
        spec.log.stderr(f"debug: Authorization: Bearer {secret}")
        if self.root.fail:  # type: ignore[attr-defined]
            return RunOutcome(output=text, success=False, error=f"exit 1: {secret}")
        return RunOutcome(output=text)

    def __init__(self, config: object = None, *, parent: FakeAdapter | None = None) -> None:
        super().__init__(config, parent=parent)
        self.fail = False

    def create_worker(self) -> LeakyAdapter:
        return LeakyAdapter(parent=self.root)


async def test_a_leaky_run_leaves_no_secret_anywhere(make_butler, store, monkeypatch) -> None:
    CredentialFile.beside(store.path).set("LEAKY_TOKEN", TOKEN)
    monkeypatch.setenv("LEAKY_TOKEN", "env-value-not-used")
    butler = make_butler(
        extra='[butler.env]\nrequired = ["LEAKY_TOKEN"]\n[modules.memory]\nmax_tokens = 500\n'
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    events: list[RunEvent] = []
    spawner = Spawner(
        butler,
        store=store,
        adapter=LeakyAdapter(),
        tracer_provider=provider,  # type: ignore[arg-type]
    )
    spawner.add_listener(events.append)
    result = await spawner.trigger(f"use {TOKEN} please", context=f"token: {TOKEN}")
    spawner.adapter.fail = True  # type: ignore[attr-defined]
    failed = await spawner.trigger("again")

    assert result.success and failed.error == "exit 1: [redacted:LEAKY_TOKEN]"
    assert result.output.startswith("Your token is [redacted:LEAKY_TOKEN], as JSON {")
    assert store.recent_episodes("health", 5), "the memory module stored an episode"
    everything = {
        "result": json.dumps(result.to_dict()),
        "failed": json.dumps(failed.to_dict()),
        "events": repr(events),
        "streamed": "".join(
            e.text for e in events if isinstance(e, TextDelta) and e.session_id == result.session_id
        ),
        "record": json.dumps(store.get_session(result.session_id or "").to_dict()),  # type: ignore[union-attr]
        "spans": "".join(s.to_json() for s in exporter.get_finished_spans()),
    }
    home = Path(os.environ["SPAWNKIT_HOME"])
    for path in [*store.path.parent.rglob("*"), *home.rglob("*")]:  # noqa: ASYNC240
        if path.is_file() and path.name != "credentials.json":
            everything[str(path)] = path.read_bytes().decode("utf-8", "replace")
    for where, text in everything.items():
        assert TOKEN not in text, where
    assert "[redacted:LEAKY_TOKEN]" in everything["streamed"]
    assert everything["streamed"] == result.output, "deltas held back are flushed, not lost"
    log_dir = store.get_session(result.session_id or "").log_dir  # type: ignore[union-attr]
    assert log_dir is not None
    assert "Bearer [redacted:LEAKY_TOKEN]" in (log_dir / "stderr.log").read_text()
    raw = sqlite3.connect(store.path).execute("SELECT prompt, context FROM sessions").fetchone()
    assert raw == ("use [redacted:LEAKY_TOKEN] please", "token: [redacted:LEAKY_TOKEN]")


async def test_a_value_changed_while_queued_is_redacted_too(make_butler, store) -> None:
    """The run gets the value current when it starts; that is the one redacted."""
    credentials = CredentialFile.beside(store.path)
    credentials.set("LEAKY_TOKEN", "first-value-123")
    butler = make_butler(extra='[butler.env]\nrequired = ["LEAKY_TOKEN"]\n')
    adapter = LeakyAdapter()
    adapter.gate = Gate(open_=False)
    spawner = Spawner(butler, store=store, adapter=adapter)  # type: ignore[arg-type]
    task = asyncio.create_task(spawner.trigger("go"))
    await asyncio.sleep(0)  # accepted: its redactor knows the first value
    credentials.set("LEAKY_TOKEN", "second-value-456")
    adapter.gate.open()
    result = await task
    assert adapter.specs[0].env["LEAKY_TOKEN"] == "second-value-456"
    assert "second-value-456" not in json.dumps(result.to_dict())
    assert "[redacted:LEAKY_TOKEN]" in result.output


async def test_mcp_calls_are_redacted_with_the_calling_runs_values(make_butler, store) -> None:
    credentials = CredentialFile.beside(store.path)
    credentials.set("LEAKY_TOKEN", TOKEN)
    butler = make_butler(extra='[butler.env]\nrequired = ["LEAKY_TOKEN"]\n')
    adapter = LeakyAdapter()
    adapter.gate = Gate(open_=False)
    spawner = Spawner(butler, store=store, adapter=adapter)  # type: ignore[arg-type]
    started: list[Started] = []
    task = asyncio.create_task(
        spawner.trigger(
            "go", on_event=lambda e: started.append(e) if isinstance(e, Started) else None
        )
    )
    async with asyncio.timeout(10):
        while not adapter.specs:
            await asyncio.sleep(0.01)
    credentials.set("LEAKY_TOKEN", "a-newer-value-99")  # the run still has the old one
    key = started[0].session_id  # the fake has no runtime session id of its own
    server = ButlerServer(butler, store, spawner)
    secret, strangers = await server.access.grant(key), await server.access.grant("nobody")
    async with (
        server.serve(port=0) as address,
        mcp_clients.http_client(f"{address.url}/mcp?session_id={key}", secret) as client,
        mcp_clients.http_client(f"{address.url}/mcp?session_id=nobody", strangers) as stranger,
    ):
        await client.call_tool("state_get", {"key": TOKEN})
        await stranger.call_tool("state_get", {"key": "a-newer-value-99"})
    adapter.gate.open()
    result = await task
    (call,) = store.mcp_calls(result.session_id or "")
    assert call["arguments"] == {"key": "[redacted:LEAKY_TOKEN]"}
    assert TOKEN not in call["result"] and "[redacted:LEAKY_TOKEN]" in call["result"]
    rows = sqlite3.connect(store.path).execute("SELECT arguments, result FROM mcp_calls")
    dumped = str(rows.fetchall())
    assert TOKEN not in dumped and "a-newer-value-99" not in dumped, "no run: current values"


def test_secrets_minted_for_a_run_are_redacted_under_their_own_names() -> None:
    r = Redactor({"TOKEN": TOKEN})
    minted = {name: f"{name.lower()}-Zk3vQ9pL2x" for name in redaction.RUN_SECRETS}
    assert [r.add_run_secret(name, value) for name, value in minted.items()] == [*minted.values()]
    printed = json.dumps({"headers": {"Authorization": f"Bearer {minted['SPAWNKIT_MCP_SECRET']}"}})
    out = r.text(printed + " " + " ".join(minted.values()))
    assert all(value not in out for value in minted.values())
    assert all(f"[redacted:{name}]" in out for name in minted)
    assert r.names == sorted([*minted, "TOKEN"])


def test_numbers_are_scanned_only_when_a_secret_could_be_spelled_in_one() -> None:
    """A number's text holds digits, a sign, a point, an exponent, "inf" or "nan": a secret
    with any other character cannot occur in it, and numbers then pass unscanned (CLI
    telemetry carries thousands a run); a secret of digits still reaches them."""
    letters = Redactor({"TOKEN": TOKEN})
    assert not letters.redacts_numbers
    assert letters.data({"busy_ns": 123456789012, "ratio": -1.5e20}) == {
        "busy_ns": 123456789012, "ratio": -1.5e20,
    }  # fmt: skip
    pin = Redactor({"TOKEN": TOKEN})
    pin.add({"PIN": "12345678901"})  # a secret added later swaps the patterns: seen
    assert pin.redacts_numbers
    assert pin.data([12345678901, 12345678901.5, 7, True]) == [
        "[redacted:PIN]", "[redacted:PIN].5", 7, True,
    ]  # fmt: skip
    assert Redactor({"ODD": "nan-e+inf.1"}).redacts_numbers  # each character can be in one
