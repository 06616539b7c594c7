"""Codex CLI transcripts: every ``*.jsonl`` under ``$CODEX_HOME/sessions`` into rows.

Codex names its rollouts ``sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl``, but other tools
and older versions leave JSONL sessions under other names (ccusage's own fixture is
``sessions/project-alpha/session-alpha.jsonl``), so every ``.jsonl`` under ``sessions/`` and
``archived_sessions/`` is read; when both folders hold the same relative path, the active
copy wins. Each line is ``{"timestamp", "type", "payload"}``. The types used here:
``session_meta`` (the thread id, cwd, CLI version, originator, model provider, git branch,
commit and repository, and for a fork or a spawned sub-agent its parent), ``turn_context``
(the model, reasoning effort, approval and sandbox policy of the turns that follow),
``response_item`` tool calls and their outputs, and ``event_msg`` payloads ``token_count``
(usage, the context window, rate-limit snapshots), ``error`` and the tool-end events.

Token counts are cumulative: ``token_count.info.total_token_usage`` is the running total of
the session, repeated unchanged by events that add nothing. A usage row is the difference
between two successive totals (when a total goes backwards, as after a compaction, the
event's ``last_token_usage`` is used instead). Codex's ``input_tokens`` include the cached
ones and its ``output_tokens`` the reasoning ones: rows split them into ``input_tokens``
(uncached), ``cache_read_tokens``, ``output_tokens`` (without reasoning) and
``thinking_tokens``.

**Forks and sub-agents replay their parent.** A rollout whose header names a parent
(``forked_from_id``, or ``source.subagent.thread_spawn.parent_thread_id``) starts with a copy
of the parent's history: the parent's own ``session_meta`` line, then its items, all written
within the second the copy was made. Those lines are the parent's, already counted in the
parent's file: their token counts only move the running total, and their tool calls are not
the fork's. The tokens skipped this way are reported as a ``replay_skipped`` event. A copy
made with the parent's own timestamps is caught later instead: usage rows are keyed by
timestamp, model and counts, and :mod:`~spawnkit.history.frames` keeps one row per key
across all files, as ccusage does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Raw, Struct

from .rows import INPUT_PREVIEW, OUTPUT_PREVIEW, PROMPT_PREVIEW, FileFacts, Rows, preview
from .walk import files_under

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_EXIT = re.compile(r"(?:exited with code|Exit code:?)\s*(-?\d+)")
_CALL_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})
FOLDERS = ("sessions", "archived_sessions")
REQUEST_KEY = "codex"  # the request id of every Codex usage row (see the module docstring)


class _Tokens(Struct):
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_output_tokens: int = 0


class _Info(Struct):
    total_token_usage: _Tokens | None = None
    last_token_usage: _Tokens | None = None
    model_context_window: int | None = None
    model: str | None = None


class _Window(Struct):
    used_percent: float | None = None
    window_minutes: int | None = None


class _RateLimits(Struct):
    primary: _Window | None = None
    secondary: _Window | None = None


class _Git(Struct):
    branch: str | None = None
    commit_hash: str | None = None
    repository_url: str | None = None


class _Payload(Struct):
    type: str | None = None
    id: str | None = None
    cwd: str | None = None
    cli_version: str | None = None
    originator: str | None = None
    model_provider: str | None = None
    forked_from_id: str | None = None
    source: Raw = Raw()
    git: _Git | None = None
    model: str | None = None
    effort: str | None = None
    approval_policy: Raw = Raw()
    sandbox_policy: Raw = Raw()
    name: str | None = None
    namespace: str | None = None
    call_id: str | None = None
    arguments: Raw = Raw()
    input: Raw = Raw()
    action: Raw = Raw()
    output: Raw = Raw()
    info: _Info | None = None
    rate_limits: _RateLimits | None = None
    item: dict[str, Any] | None = None
    exit_code: int | None = None
    result: Raw = Raw()
    role: str | None = None
    message: str | None = None


class _Line(Struct):
    timestamp: str | None = None
    type: str | None = None
    payload: _Payload | None = None


_decode = msgspec.json.Decoder(_Line).decode


def default_roots() -> list[Path]:
    """``$CODEX_HOME`` (comma-separated homes allowed, as ccusage reads it), else ``~/.codex``."""
    raw = os.environ.get("CODEX_HOME")
    if raw:
        return [Path(p.strip()).expanduser() for p in raw.split(",") if p.strip()]
    return [Path.home() / ".codex"]


def discover(root: Path) -> list[Path]:
    """Every ``.jsonl`` under ``sessions/`` and ``archived_sessions/`` (the active copy of a
    relative path wins), or under ``root`` itself when it has neither folder."""
    folders = [root / f for f in FOLDERS if (root / f).is_dir()] or [root]
    found: list[Path] = []
    seen: set[Path] = set()
    for folder in folders:
        for path in files_under(folder, (".jsonl",)):
            relative = path.relative_to(folder)
            if relative not in seen:
                seen.add(relative)
                found.append(path)
    return sorted(found, key=str)


def identify(path: Path, root: Path) -> tuple[str, str]:
    """``(session_id, project)`` until the header says better: the id in a rollout's name,
    else the path under the sessions folder without its extension (ccusage's session id).
    The project is filled in from the session's cwd."""
    match = _UUID.search(path.name)
    if match:
        return match.group(0), ""
    for folder in (*(root / f for f in FOLDERS), root):
        if path.is_relative_to(folder):
            return path.relative_to(folder).with_suffix("").as_posix(), ""
    return path.stem, ""


def _failed(output: bytes) -> bool | None:
    """Whether a tool output says it failed: a JSON ``success``/exit code, or the text."""
    if not output:
        return None
    try:
        value = msgspec.json.decode(output)
    except msgspec.DecodeError:
        return None
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError:
            match = _EXIT.search(value)
            return int(match.group(1)) != 0 if match else None
    if isinstance(value, dict):
        if isinstance(value.get("success"), bool):
            return not value["success"]
        meta = value.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("exit_code"), int):
            return bool(meta["exit_code"] != 0)
    return None


def _json(raw: Raw) -> Any:
    try:
        return msgspec.json.decode(raw) if raw else None
    except msgspec.DecodeError:
        return None


def _policy(raw: Raw) -> str | None:
    """A policy is a string (older versions) or an object with a ``type``."""
    value = _json(raw)
    if isinstance(value, dict):
        value = value.get("type") or value.get("mode")
    return value if isinstance(value, str) else None


def _header(p: _Payload, facts: FileFacts) -> None:
    """What the rollout's own ``session_meta`` says about the session."""
    if p.id:
        facts.session_id = p.id
    facts.cwd = p.cwd
    facts.project = p.cwd or facts.project
    facts.version = p.cli_version
    facts.originator = p.originator
    facts.model_provider = p.model_provider
    if p.git is not None:
        facts.git_branch = p.git.branch
        facts.git_commit = p.git.commit_hash
        facts.git_repo_url = p.git.repository_url
    facts.forked_from_id = p.forked_from_id
    source = _json(p.source)
    if isinstance(source, dict) and isinstance(source.get("subagent"), dict | str):
        sub = source["subagent"]
        facts.agent_kind = "subagent"
        spawn = sub.get("thread_spawn") if isinstance(sub, dict) else None
        if isinstance(spawn, dict) and isinstance(spawn.get("parent_thread_id"), str):
            facts.parent_session_id = spawn["parent_thread_id"]
    elif isinstance(source, str):
        facts.agent_kind = "main"
    facts.parent_session_id = facts.parent_session_id or p.forked_from_id


def _first_meta(data: bytes) -> _Payload | None:
    """The payload of the first line when it is the rollout's ``session_meta``."""
    head = data.lstrip()[: 1 << 20].split(b"\n", 1)[0]
    try:
        line = _decode(head)
    except msgspec.DecodeError:
        return None
    return line.payload if line.type == "session_meta" else None


def parse_codex_file(data: bytes, facts: FileFacts, rows: Rows) -> None:
    meta = _first_meta(data)
    if meta is not None:
        _header(meta, facts)
    session = facts.session_id
    own_id = meta.id if meta is not None else None
    has_parent = facts.parent_session_id is not None
    sidechain = facts.agent_kind == "subagent"
    model: str | None = None
    previous: _Tokens | None = None
    replay_second: str | None = None
    replay_at = ""
    replayed = 0
    errors: dict[str, bool] = {}
    results: list[tuple[int, str, str, bool | None, str]] = []
    number = 0
    for raw in data.split(b"\n"):
        number += 1
        if not raw or raw.isspace():
            continue
        facts.lines += 1
        try:
            line = _decode(raw)
        except msgspec.DecodeError:
            facts.bad(number)
            continue
        p, ts = line.payload, line.timestamp
        if p is None or not ts:
            continue
        if replay_second is not None:
            if ts[:19] == replay_second:
                info = p.info if line.type == "event_msg" and p.type == "token_count" else None
                if info is not None:
                    delta = _delta(previous, info)
                    if info.total_token_usage is not None:
                        previous = info.total_token_usage
                    if delta is not None:
                        replayed += delta.input_tokens + delta.output_tokens
                continue
            if replayed:
                rows.events.append((number, session, replay_at, "replay_skipped",
                                    float(replayed), None))  # fmt: skip
            replay_second, replayed = None, 0
        facts.seen(ts)
        kind = line.type
        if kind == "session_meta":
            if has_parent and p.id and p.id != own_id:
                replay_second, replay_at = ts[:19], ts  # the parent's history follows
        elif kind == "turn_context":
            model = p.model or model
            facts.effort = p.effort or facts.effort
            facts.approval_policy = _policy(p.approval_policy) or facts.approval_policy
            facts.sandbox_policy = _policy(p.sandbox_policy) or facts.sandbox_policy
        elif kind == "response_item":
            if p.type in _CALL_TYPES and p.call_id:
                name = p.name or ("shell" if p.type == "local_shell_call" else "")
                if p.namespace:
                    name = f"{p.namespace}__{name}"
                args = p.arguments or p.input or p.action
                text = _string(args, INPUT_PREVIEW)
                rows.calls.append(
                    (number, session, p.call_id, name, text, ts, model, sidechain, None)
                )
            elif p.type in _OUTPUT_TYPES and p.call_id:
                results.append((number, p.call_id, ts, _failed(p.output),
                                _string(p.output, OUTPUT_PREVIEW)))  # fmt: skip
        elif kind == "event_msg":
            if p.type == "token_count":
                _token_count(p, number, ts, model, previous, sidechain, facts, rows)
                if p.info is not None and p.info.total_token_usage is not None:
                    previous = p.info.total_token_usage
            elif p.type in ("exec_command_end", "mcp_tool_call_end") and p.call_id:
                errors[p.call_id] = _event_failed(p)
            elif p.type == "error":
                rows.events.append((number, session, ts, "api_error", None,
                                    (p.message or "error")[:OUTPUT_PREVIEW]))  # fmt: skip
            elif p.type == "user_message" and p.message and facts.first_prompt is None:
                facts.first_prompt = p.message[:PROMPT_PREVIEW]
            elif p.type == "item_completed" and isinstance(p.item, dict):
                item = p.item
                if item.get("type") == "UserMessage" and facts.first_prompt is None:
                    facts.first_prompt = _item_text(item)
                if isinstance(item.get("id"), str) and ("exit_code" in item or "status" in item):
                    code = item.get("exit_code")
                    errors[item["id"]] = item.get("status") == "failed" or (
                        isinstance(code, int) and code != 0
                    )
    if replayed:
        rows.events.append((number, session, replay_at, "replay_skipped", float(replayed), None))
    for line_no, call_id, ts, failed, output in results:
        rows.results.append((line_no, session, call_id, ts, errors.get(call_id, failed), output))


def _token_count(
    p: _Payload,
    number: int,
    ts: str,
    model: str | None,
    previous: _Tokens | None,
    sidechain: bool,
    facts: FileFacts,
    rows: Rows,
) -> None:
    session = facts.session_id
    limits = p.rate_limits
    if limits is not None:
        for window, name in ((limits.primary, "primary"), (limits.secondary, "secondary")):
            if window is not None and window.used_percent is not None:
                detail = f"{name} {window.window_minutes} min" if window.window_minutes else name
                rows.events.append((number, session, ts, "rate_limit", window.used_percent,
                                    detail))  # fmt: skip
    info = p.info
    if info is None:
        return
    if info.model_context_window:
        facts.context_window = info.model_context_window
    delta = _delta(previous, info)
    if delta is None:
        return
    model = info.model or p.model or model
    cached = min(delta.cached_input_tokens, delta.input_tokens)
    reasoning = min(delta.reasoning_output_tokens, delta.output_tokens)
    # The key ccusage deduplicates Codex events on, across files.
    key = (f"{ts}|{model}|{delta.input_tokens}|{cached}|{delta.output_tokens}|"
           f"{delta.reasoning_output_tokens}")  # fmt: skip
    rows.usage.append((
        number, session, key, REQUEST_KEY, ts, model, delta.input_tokens - cached,
        delta.output_tokens - reasoning, 0, 0, cached, reasoning, None, sidechain, None,
        None, None, None, None, None, None, None, None,
    ))  # fmt: skip


def _string(raw: Raw, limit: int) -> str:
    """A preview of a JSON value; Codex encodes arguments and outputs as JSON strings."""
    try:
        value = msgspec.json.decode(raw) if raw else ""
    except msgspec.DecodeError:
        return preview(raw, limit)
    if isinstance(value, str):
        return value[:limit]
    return msgspec.json.encode(value).decode()[:limit]


def _item_text(item: dict[str, Any]) -> str | None:
    content = item.get("content")
    if isinstance(content, list):
        texts = [c.get("text") for c in content if isinstance(c, dict)]
        text = " ".join(t for t in texts if isinstance(t, str))
        return text[:PROMPT_PREVIEW] or None
    return None


def _event_failed(p: _Payload) -> bool:
    if p.exit_code is not None:
        return p.exit_code != 0
    return bytes(p.result).startswith(b'{"Err"')


def _delta(previous: _Tokens | None, info: _Info) -> _Tokens | None:
    """The usage an event adds; None when it adds nothing."""
    total = info.total_token_usage
    if total is None:
        return info.last_token_usage
    if previous is None:
        delta = total
    else:
        delta = _Tokens(
            total.input_tokens - previous.input_tokens,
            total.cached_input_tokens - previous.cached_input_tokens,
            total.output_tokens - previous.output_tokens,
            total.reasoning_output_tokens - previous.reasoning_output_tokens,
        )
        if min(delta.input_tokens, delta.cached_input_tokens, delta.output_tokens,
               delta.reasoning_output_tokens) < 0:  # fmt: skip
            delta = info.last_token_usage or total
    if (delta.input_tokens == 0 and delta.output_tokens == 0 and delta.cached_input_tokens == 0
            and delta.reasoning_output_tokens == 0):  # fmt: skip
        return None
    return delta
