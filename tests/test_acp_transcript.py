"""When an ACP agent's transcript counts as written: the turn's end on its last line, or
a file that stopped changing (a resume needs the whole turn; the agent is then stopped)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from spawnkit.runtimes.acp import client
from spawnkit.runtimes.acp.presets import AcpPreset, ClaudeCodePreset

REAL = Path(__file__).parent / "data" / "real" / "claude" / "projects"
POMODORO = REAL / "yoavf-ai-sessions" / "claude-code-pomodoro-timer.jsonl"


def _entries() -> list[tuple[bytes, dict]]:
    lines = POMODORO.read_bytes().splitlines()
    return [(line, json.loads(line)) for line in lines if line.strip()]


def _blocks(entry: dict) -> list[dict]:
    content = (entry.get("message") or {}).get("content")
    return content if isinstance(content, list) else []


def _text(entry: dict) -> str:
    return "".join(b.get("text", "") for b in _blocks(entry) if b.get("type") == "text")


def test_claude_codes_answer_entry_ends_the_turn() -> None:
    preset = ClaudeCodePreset(["claude-code-acp"])
    answers = [
        (line, entry) for line, entry in _entries()
        if entry.get("type") == "assistant" and _blocks(entry)
        and all(b.get("type") == "text" for b in _blocks(entry))
    ]  # fmt: skip
    tool_uses = [
        (line, entry) for line, entry in _entries()
        if any(b.get("type") == "tool_use" for b in _blocks(entry))
    ]  # fmt: skip
    assert answers and tool_uses, "the real transcript has both kinds of entry"
    line, entry = answers[-1]
    assert preset.turn_logged(line, _text(entry))
    assert preset.turn_logged(line, f"  {_text(entry)}\n"), "whitespace at the ends aside"
    assert not preset.turn_logged(line, "another answer")
    assert not preset.turn_logged(line, ""), "no answer: nothing to recognise"
    user = next(line for line, entry in _entries() if entry.get("type") == "user")
    assert not preset.turn_logged(user, _text(entry))
    tool_line, tool_entry = tool_uses[-1]
    assert not preset.turn_logged(tool_line, _text(tool_entry))
    assert not preset.turn_logged(line[:-5], _text(entry)), "a line cut short"
    assert not AcpPreset(["some-agent"]).turn_logged(line, _text(entry)), "other agents: not known"


def _answer_line(text: str) -> bytes:
    entry = {"type": "assistant", "message": {"content": [{"type": "text", "text": text}]}}
    return json.dumps(entry).encode() + b"\n"


async def test_the_answer_on_the_last_line_ends_the_wait_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file that never stops changing long enough, and a generous overall bound: only
    # the turn's end can end this wait within the hang guard.
    monkeypatch.setattr(client, "TRANSCRIPT_STILL_S", 3600.0)
    monkeypatch.setattr(client, "TRANSCRIPT_WAIT_S", 3600.0)
    path = tmp_path / "session.jsonl"
    path.write_bytes(b'{"type": "user"}\n' + _answer_line("done")[:10])

    def logged(line: bytes) -> bool:
        return ClaudeCodePreset(["claude-code-acp"]).turn_logged(line, "done")

    waiting = asyncio.ensure_future(client.transcript_written(path, logged))
    await asyncio.sleep(0.1)
    assert not waiting.done(), "a half-written line is not the turn's end"
    with path.open("ab") as file:
        file.write(_answer_line("done")[10:])
    async with asyncio.timeout(60):
        await waiting


async def test_without_a_turns_end_the_wait_is_for_a_still_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "TRANSCRIPT_WAIT_S", 3600.0)
    path = tmp_path / "session.jsonl"
    waiting = asyncio.ensure_future(client.transcript_written(path, lambda line: False))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "a transcript that does not exist yet is waited for"
    path.write_bytes(_answer_line("something else"))
    async with asyncio.timeout(60):
        await waiting
