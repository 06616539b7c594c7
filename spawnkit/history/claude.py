"""Claude Code transcripts: ``<config>/projects/<escaped cwd>/<session>.jsonl`` into rows.

Claude Code writes one JSON object a line. An API response is split over several
``assistant`` lines, one per content block, each repeating the response's ``message.id``,
``requestId`` and usage (older versions wrote a partial ``output_tokens`` on the first
lines). Subagents write side-chain files under ``<session>/subagents/``; they count towards
the parent session. This module only turns lines into rows, one usage row per line that
carries usage; deduplication needs every file and lives in :mod:`spawnkit.history.frames`.

Besides usage and tool calls, a line may say who spent the tokens (``agentId``,
``attributionAgent``, ``attributionSkill``, ``attributionPlugin``), how (``service_tier``,
``stop_reason``, ``server_tool_use`` web searches and fetches, thinking tokens in
``output_tokens_details``), what the session is (``gitBranch``, ``entrypoint``, ``version``,
``permissionMode``; its title from ``summary``, ``ai-title`` or ``custom-title`` lines) and
what went wrong or took time (API error lines, 429s included; ``turn_duration`` and
``compact_boundary`` system lines): all of it is kept, as columns or event rows.

Lines are decoded with msgspec into structs that name only the fields used, so the large
fields (tool outputs, attachments, file snapshots) are skipped without being materialised.
A line that is not JSON, or whose fields have the wrong types, is counted in the file's
``bad_lines`` with its number. Lines with usage are kept or dropped by the rules ccusage
applies, so totals can be compared with it: a ``version`` that is not a semantic version,
an empty ``sessionId``, ``requestId``, ``message.id`` or ``model``, or an explicit ``null``
in one of those fields (or in the cache token counts) drops the line.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
from msgspec import Raw, Struct

from .rows import INPUT_PREVIEW, OUTPUT_PREVIEW, PROMPT_PREVIEW, FileFacts, Rows
from .walk import files_under

_SEMVER = re.compile(r"\d+\.\d+\.\d")
_TOOL_USE = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
_TITLES = {"custom-title": 3, "ai-title": 2, "summary": 1}
SYNTHETIC_MODEL = "<synthetic>"
# Defaults that tell an absent field from an explicit null (None) without isinstance checks.
ABSENT = "\x00absent"
ABSENT_INT = -1
ABSENT_FLOAT = -1.0


class _CacheCreation(Struct, gc=False):
    ephemeral_5m_input_tokens: int = 0
    ephemeral_1h_input_tokens: int = 0


class _ServerTools(Struct, gc=False):
    web_search_requests: int | None = None
    web_fetch_requests: int | None = None


class _OutputDetails(Struct, gc=False):
    thinking_tokens: int | None = None


class _Usage(Struct, gc=False):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int | None = ABSENT_INT
    cache_read_input_tokens: int | None = ABSENT_INT
    cache_creation: _CacheCreation | None = None
    speed: str | None = ABSENT
    service_tier: str | None = None
    server_tool_use: _ServerTools | None = None
    output_tokens_details: _OutputDetails | None = None


class _Block(Struct, gc=False):
    type: str = ""
    id: str | None = None
    name: str | None = None
    input: Raw = Raw()
    tool_use_id: str | None = None
    is_error: bool | None = None
    content: Raw = Raw()


class _Message(Struct, gc=False):
    id: str | None = ABSENT
    model: str | None = ABSENT
    usage: _Usage | None = None
    content: str | list[_Block] | None = None
    stop_reason: str | None = None


class _Compaction(Struct, rename="camel", gc=False):
    trigger: str | None = None
    pre_tokens: int | None = None


class _Line(Struct, rename="camel", gc=False):
    type: str | None = None
    subtype: str | None = None
    timestamp: str | None = None
    session_id: str | None = ABSENT
    request_id: str | None = ABSENT
    is_sidechain: bool | None = None
    is_meta: bool | None = None
    version: str | None = ABSENT
    cwd: str | None = None
    git_branch: str | None = None
    entrypoint: str | None = None
    permission_mode: str | None = None
    agent_id: str | None = None
    attribution_agent: str | None = None
    attribution_skill: str | None = None
    attribution_plugin: str | None = None
    message: _Message | None = None
    cost_usd: float | None = msgspec.field(default=ABSENT_FLOAT, name="costUSD")
    total_cost_usd: float | None = msgspec.field(default=None, name="totalCostUSD")
    is_api_error_message: bool | None = None
    api_error_status: int | None = None
    error: Raw = Raw()
    duration_ms: float | None = None
    compact_metadata: _Compaction | None = None
    summary: str | None = None
    custom_title: str | None = None
    ai_title: str | None = None
    data: Raw = Raw()


class _StreamedMessage(Struct, rename="camel", gc=False):
    type: str | None = None
    timestamp: str | None = None
    request_id: str | None = ABSENT
    message: _Message | None = None


class _Progress(Struct, rename="camel", gc=False):
    type: str | None = None
    agent_id: str | None = None
    message: _StreamedMessage | None = None


class _ErrorDetail(Struct, gc=False):
    status: int | None = None
    type: str | None = None


_decode = msgspec.json.Decoder(_Line).decode
_decode_progress = msgspec.json.Decoder(_Progress).decode
_decode_error = msgspec.json.Decoder(_ErrorDetail | str | None).decode


def session_parts(path: Path) -> tuple[str, str]:
    """``(session_id, project)`` of a transcript path, as ccusage derives them.

    ``projects/P/S.jsonl`` is session S of project P; a file under ``projects/P/S/``
    (``subagents/`` included) belongs to session S.
    """
    parts = path.parts
    try:
        rel = parts[len(parts) - 1 - parts[::-1].index("projects") + 1 :]
    except ValueError:
        rel = parts
    stem = rel[-1].removesuffix(".jsonl") if rel else ""
    if len(rel) == 2 and stem:
        return stem, rel[0]
    if len(rel) >= 4 and rel[-2] == "subagents":
        return rel[-3], "/".join(rel[:-3]) or "Unknown Project"
    session = rel[-2] if len(rel) >= 2 else "unknown"
    return session, "/".join(rel[:-2]) if len(rel) > 2 else "Unknown Project"


def _meta_line(line: _Line, number: int, facts: FileFacts, rows: Rows) -> None:
    """A line without a message: cost, title, mode, errors, durations and compactions."""
    kind = line.type
    if kind == "cost-state":
        if line.total_cost_usd is not None:
            facts.reported_cost = line.total_cost_usd
    elif kind in _TITLES:
        facts.set_title(line.custom_title or line.ai_title or line.summary, _TITLES[kind])
    elif kind == "permission-mode" and line.permission_mode:
        facts.permission_mode = line.permission_mode
    elif kind == "system" and line.timestamp:
        ts = line.timestamp
        sub = line.subtype
        if sub == "api_error":
            status, detail = _error(line.error)
            rows.events.append((number, facts.session_id, ts, "api_error", status, detail))
        elif sub == "turn_duration" and line.duration_ms is not None:
            rows.events.append((number, facts.session_id, ts, "turn_duration", line.duration_ms,
                                None))  # fmt: skip
        elif sub == "compact_boundary":
            meta = line.compact_metadata
            before = meta.pre_tokens if meta is not None else None
            trigger = meta.trigger if meta is not None else None
            rows.events.append((number, facts.session_id, ts, "compaction",
                                None if before is None else float(before), trigger))  # fmt: skip


def _agent_response(raw: Raw) -> tuple[_Message, str | None, str | None, str | None] | None:
    """``(message, timestamp, request id, agent id)`` of an ``agent_progress`` line's
    response, or None when it holds none (its prompt, a tool result, an odd shape)."""
    try:
        progress = _decode_progress(raw)
    except msgspec.DecodeError:
        return None
    streamed = progress.message
    if progress.type != "agent_progress" or streamed is None or streamed.type != "assistant":
        return None
    if streamed.message is None or streamed.message.usage is None:
        return None
    return streamed.message, streamed.timestamp, streamed.request_id, progress.agent_id


def _error(raw: Raw) -> tuple[float | None, str | None]:
    """``(HTTP status, kind)`` of an ``error`` field: a string or an object with a status."""
    if not raw:
        return None, None
    try:
        value = _decode_error(raw)
    except msgspec.DecodeError:
        return None, None
    if isinstance(value, str):
        return None, value
    if value is None:
        return None, None
    return (None if value.status is None else float(value.status)), value.type


def parse_claude_file(data: bytes, facts: FileFacts, rows: Rows) -> None:
    """Append the rows of one transcript file to ``rows`` and fill in ``facts``.

    This loop is the cold-load hot path: look-ups are hoisted, absent fields are told from
    explicit nulls by sentinel defaults, and ccusage's filter is written out inline.
    """
    session = facts.session_id
    usage_rows, call_rows, result_rows, event_rows = (
        rows.usage,
        rows.calls,
        rows.results,
        rows.events,
    )
    decode, error, tool_use = _decode, msgspec.DecodeError, _TOOL_USE
    first = last = None
    semver_ok: dict[str, bool] = {}
    view, find, size = memoryview(data), data.find, len(data)
    start = number = lines = 0
    while start < size:
        end = find(b"\n", start)
        if end < 0:
            end = size
        number += 1
        raw = view[start:end]  # a view: decoding needs no copy of the line
        blank = end - start < 8 and not data[start:end].strip()
        line_start, start = start, end + 1
        if blank:
            continue
        lines += 1
        try:
            line = decode(raw)
        except error:
            facts.bad(number)
            continue
        message = line.message
        ts = line.timestamp
        sidechain = line.is_sidechain is True
        rid, agent = line.request_id, line.agent_id
        if message is None:
            if line.type != "progress":
                _meta_line(line, number, facts, rows)
                continue
            if find(b'"agent_progress"', line_start, end) < 0:
                continue  # progress of a hook or a command: no usage
            # A sub-agent's response, streamed into the parent's transcript (Claude Code 2.1
            # writes it there as well as, or instead of, the sub-agent's own file).
            nested = _agent_response(line.data)
            if nested is None:
                continue
            message, ts, rid, agent = nested
            sidechain = True
        if ts is None or len(ts) < 19 or ts[10] != "T":
            if line.type in ("user", "assistant"):
                facts.bad(number)  # a conversation line that cannot be placed in time
            continue
        if first is None or ts < first:
            first = ts
        if last is None or ts > last:
            last = ts
        if line.permission_mode is not None:
            facts.permission_mode = line.permission_mode
        content = message.content
        usage = message.usage
        if usage is None:
            if line.type == "user":
                if type(content) is list:
                    for block in content:
                        if block.type == "tool_result" and block.tool_use_id:
                            text = _preview(block.content, OUTPUT_PREVIEW)
                            result_rows.append(
                                (number, session, block.tool_use_id, ts, block.is_error, text)
                            )
                elif facts.first_prompt is None and type(content) is str and not line.is_meta:
                    facts.first_prompt = content[:PROMPT_PREVIEW]
                if facts.cwd is None:
                    facts.cwd = line.cwd
                    facts.version = line.version if line.version is not ABSENT else None
                    facts.git_branch = line.git_branch or None
                    facts.entrypoint = line.entrypoint
            continue
        model = message.model
        if line.is_api_error_message:
            code = line.api_error_status
            status = None if code is None else float(code)
            event_rows.append((number, session, ts, "api_error", status, _error(line.error)[1]))
        if type(content) is list:
            for block in content:
                if block.type in tool_use and block.id:
                    known = model if model is not ABSENT else None
                    preview = _preview(block.input, INPUT_PREVIEW)
                    call_rows.append((number, session, block.id, block.name or "", preview, ts,
                                      known, sidechain, agent))  # fmt: skip
        # ccusage's filter: an explicit null or an empty identifier drops the line.
        sid, mid, version = line.session_id, message.id, line.version
        write, read = usage.cache_creation_input_tokens, usage.cache_read_input_tokens
        if (
            sid is None or rid is None or mid is None or model is None or version is None
            or line.cost_usd is None or usage.speed is None or write is None or read is None
            or not sid or not rid or not mid or not model
        ):  # fmt: skip
            continue
        if version is not ABSENT:
            ok = semver_ok.get(version)
            if ok is None:
                ok = semver_ok[version] = _SEMVER.match(version) is not None
            if not ok:
                continue
        name = None if model is ABSENT or model == SYNTHETIC_MODEL else model
        if name is not None and usage.speed == "fast":
            name += "-fast"
        breakdown = usage.cache_creation
        if breakdown is not None:
            write_5m = breakdown.ephemeral_5m_input_tokens
            write_1h = breakdown.ephemeral_1h_input_tokens
        else:
            write_5m, write_1h = (write if write > 0 else 0), 0
        cost = line.cost_usd
        details = usage.output_tokens_details
        thinking = details.thinking_tokens if details is not None else None
        output = usage.output_tokens
        if thinking:  # Claude counts thinking inside output_tokens: kept apart here
            thinking = min(thinking, output)
            output -= thinking
        tools = usage.server_tool_use
        usage_rows.append((
            number, session, None if mid is ABSENT else mid, None if rid is ABSENT else rid, ts,
            name, usage.input_tokens, output, write_5m, write_1h, read if read > 0 else 0,
            thinking, None, sidechain, None if cost == ABSENT_FLOAT else cost, agent,
            line.attribution_agent, line.attribution_skill, line.attribution_plugin,
            usage.service_tier, message.stop_reason,
            tools.web_search_requests if tools is not None else None,
            tools.web_fetch_requests if tools is not None else None,
        ))  # fmt: skip
    facts.lines += lines
    facts.seen(first)
    facts.seen(last)


def _preview(raw: Raw, limit: int) -> str:
    """The first ``limit`` characters of a raw JSON value, a string without its quotes.

    Most values are longer than ``limit`` + 2 bytes and start with plain ASCII: then those
    bytes, less the opening quote, are decoded straight from the raw value's buffer (a
    value longer than that keeps its first ``limit`` characters after the quote, which is
    what :func:`_text` gives too, in half the steps: this runs once per tool call and
    result). Others go through :func:`_text`.
    """
    view = memoryview(raw)
    if len(view) > limit + 2:
        try:
            return str(view[1 : limit + 1] if view[0] == 0x22 else view[:limit], "ascii")
        except UnicodeDecodeError:
            pass
    return _text(view[: limit * 4].tobytes(), limit)


def _text(raw: bytes, limit: int) -> str:
    text = raw.decode("utf-8", "replace")
    if text[:1] == '"':
        text = text[1:-1] if text[-1:] == '"' else text[1:]
    return text[:limit]


def discover(root: Path) -> list[Path]:
    """Transcript files under ``root/projects``, sorted by path (ccusage's order)."""
    projects = root / "projects"
    if not projects.is_dir():
        return []
    return files_under(projects, (".jsonl",))
