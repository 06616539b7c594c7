"""Record mode: turn relayed model traffic, of any of the three APIs, into a scenario.

The recording proxy (in ``server.py``) relays each model exchange untouched and feeds the
bytes it relays to an :class:`~spawnkit.replay.sse.SSEDecoder` and the API's assembler (in
its wire module); when a turn completes it hands the result to a :class:`Recording`, which
keeps one script per conversation and rewrites the scenario file atomically after every
turn, so a recording cut short by Ctrl-C is still a valid scenario. Turns are stored by
their index in the conversation (the number of model turns in the request), the same
stateless rule the replay server uses, so a retried request replaces its failed attempt
instead of shifting every later turn. Recorded model text is template-escaped and tool names
glob-escaped, so the written scenario replays exactly what passed through; tool names are
the ones the scenario saw (``mcp__NAME__TOOL`` on every API), and a call of the CLI's shell
tool with nothing but a command is written as ``shell = "..."``, which replays on any CLI.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from .anthropic import MessageAssembler, MessagesRequest, to_turn_request, turn_from_message
from .recorded import RecordedCall, RecordedTurn, turn_from_error
from .scenario import ShellTool, TurnRequest, escape_glob, escape_template
from .sse import MAX_FRAME_BYTES, SSEDecoder, SSEEvent

# Re-exported: these lived here before the wire modules got their own assemblers.
__all__ = [
    "MAX_FRAME_BYTES",
    "MessageAssembler",
    "RecordedCall",
    "RecordedTurn",
    "Recording",
    "SSEDecoder",
    "SSEEvent",
    "turn_from_error",
    "turn_from_message",
    "write_scenario",
]

logger = logging.getLogger(__name__)

# How much of the prompt becomes a recorded script's `match`: enough to tell
# conversations apart, short enough to survive small edits to the prompt's tail.
MATCH_PREFIX_CHARS = 80
MAX_CONVERSATIONS = 1000
_REGEX_SPECIAL = re.compile(r"[.^$*+?{}\[\]\\|()]")


@dataclass
class _Conversation:
    prompt: str
    turns: dict[int, RecordedTurn] = field(default_factory=dict)
    shell: dict[int, ShellTool] = field(default_factory=dict)


class Recording:
    """The conversations recorded so far, written to ``out`` after every completed turn."""

    def __init__(self, out: Path, upstream: str) -> None:
        self.out = out
        self.upstream = upstream
        self._lock = threading.Lock()
        self._conversations: dict[tuple[str, str], _Conversation] = {}

    def add(self, body: MessagesRequest, session_id: str, turn: RecordedTurn) -> None:
        """Record ``turn`` as the answer to the Anthropic request ``body``."""
        self.add_turn(to_turn_request(body), session_id, turn)

    def add_turn(self, request: TurnRequest, session_id: str, turn: RecordedTurn) -> None:
        """Record ``turn`` as the answer to ``request`` (from any wire adapter)."""
        prompt = request.prompt
        index = request.turn_index
        with self._lock:
            key = (session_id, prompt)
            conversation = self._conversations.get(key)
            if conversation is None:
                if len(self._conversations) >= MAX_CONVERSATIONS:
                    logger.warning(
                        "recorder: %d conversations recorded; ignoring new ones", MAX_CONVERSATIONS
                    )
                    return
                conversation = self._conversations[key] = _Conversation(prompt)
            previous = conversation.turns.get(index)
            # A retry that succeeded replaces the error before it, never the reverse.
            if turn.error is not None and previous is not None and previous.error is None:
                return
            conversation.turns[index] = turn
            if request.shell is not None:
                conversation.shell[index] = request.shell
            write_scenario(self.out, self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "description": f"Recorded from {self.upstream}",
            "script": [_script(conversation) for conversation in self._conversations.values()],
        }


def _script(conversation: _Conversation) -> dict[str, Any]:
    script: dict[str, Any] = {}
    if conversation.prompt:
        script["match"] = "^" + _regex_literal(conversation.prompt[:MATCH_PREFIX_CHARS])
    turns = []
    for index in range(max(conversation.turns) + 1):
        turn = conversation.turns.get(index)
        turns.append(
            _turn_dict(turn, conversation.shell.get(index))
            if turn is not None
            # Keep later turns at their index; replay answers this gap with this text.
            else {"text": f"[replay] turn {index} was not recorded"}
        )
    script["turn"] = turns
    return script


def _regex_literal(text: str) -> str:
    # re.escape also escapes spaces and punctuation; keep the written regex readable.
    return _REGEX_SPECIAL.sub(r"\\\g<0>", text)


def _turn_dict(turn: RecordedTurn, shell: ShellTool | None) -> dict[str, Any]:
    if turn.error is not None:
        return {
            "error": {
                "status": turn.error.status,
                "type": turn.error.type,
                "message": turn.error.message,
            }
        }
    result: dict[str, Any] = {}
    if turn.text or not turn.tool_calls:
        result["text"] = escape_template(turn.text)
    calls = [_call_dict(call, shell) for call in turn.tool_calls]
    if len(calls) == 1:
        result.update(calls[0])
    elif calls:
        result["tool_calls"] = calls
    if turn.usage:
        result["usage"] = dict(turn.usage)
    return result


def _call_dict(call: RecordedCall, shell: ShellTool | None) -> dict[str, Any]:
    command = shell.command_of(call.input) if shell and call.name == shell.name else None
    if command is not None:
        return {"shell": escape_template(command)}
    return {"tool": escape_glob(call.name), "input": _toml_value(call.input, call.name)}


def _toml_value(value: Any, tool: str) -> Any:
    """Template-escape strings and drop nulls, which TOML cannot express."""
    if isinstance(value, str):
        return escape_template(value)
    if isinstance(value, Mapping):
        kept = {}
        for key, item in value.items():
            if item is None:
                logger.warning("recorder: dropped null %r from a %r tool input", key, tool)
                continue
            kept[str(key)] = _toml_value(item, tool)
        return kept
    if isinstance(value, list):
        return [_toml_value(item, tool) for item in value if item is not None]
    return value


def write_scenario(out: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as TOML via a temp file and rename, so readers never see half a file."""
    text = tomli_w.dumps(data, multiline_strings=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        Path(temp).replace(out)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
