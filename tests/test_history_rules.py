"""One minimal file per rule of docs/history.md that real transcripts broke ("Wrong totals").

Each test writes the smallest set of lines that shows the rule, as the CLIs write them, and
checks the totals the rule gives (and what the old rule gave, where that is the point).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spawnkit.history import UnpricedModelWarning, default_pricing, transcripts
from spawnkit.history.frames import _WARNED

T = "2026-10-01T10:00:{:02d}.000Z".format


def jsonl(path: Path, records: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(
        (r if isinstance(r, str) else json.dumps(r, separators=(",", ":"))) + "\n" for r in records
    ))  # fmt: skip
    return path


def claude_line(session: str, msg: str, req: str, ts: str, out: int = 5, **extra: Any) -> dict:
    plain = {"input_tokens": 10, "output_tokens": out, "cache_creation_input_tokens": 0,
             "cache_read_input_tokens": 0}  # fmt: skip
    usage = extra.pop("usage", plain)
    message = {"id": msg, "model": extra.pop("model", "claude-haiku-4-5"), "usage": usage,
               "content": extra.pop("content", [])}  # fmt: skip
    message.update(extra.pop("message", {}))
    return {"type": "assistant", "sessionId": session, "timestamp": ts, "version": "2.1.0",
            "requestId": req, "message": message, **extra}  # fmt: skip


def token_count(ts: str, total: tuple[int, int, int, int], **info: Any) -> dict:
    inp, cached, out, reasoning = total
    usage = {"input_tokens": inp, "cached_input_tokens": cached, "output_tokens": out,
             "reasoning_output_tokens": reasoning, "total_tokens": inp + out}  # fmt: skip
    payload = {"type": "token_count", "info": {"total_token_usage": usage, **info}}
    return {"timestamp": ts, "type": "event_msg", "payload": payload}


def meta(ts: str, sid: str, **payload: Any) -> dict:
    return {"timestamp": ts, "type": "session_meta",
            "payload": {"id": sid, "cwd": "/w", "cli_version": "0.146.0", **payload}}  # fmt: skip


# -- 1. one API response under several session files ----------------------------------------


def test_a_response_in_several_session_files_counts_once_for_a_deterministic_session(
    tmp_path: Path,
) -> None:
    # A resumed session copies the parent's responses into its own file under its own
    # session id; a side chain repeats one; the copy with the fuller usage comes later.
    jsonl(tmp_path / "projects/p/a-parent.jsonl", [
        claude_line("a-parent", "m1", "r1", T(0), out=3),  # partial usage: an early line
        claude_line("a-parent", "m2", "r2", T(1)),
    ])  # fmt: skip
    jsonl(tmp_path / "projects/p/b-resumed.jsonl", [
        claude_line("b-resumed", "m1", "r1", T(0), out=9),  # the same response, fuller
        claude_line("b-resumed", "m2", "r2", T(1)),
        claude_line("b-resumed", "m3", "r3", T(2)),
    ])  # fmt: skip
    jsonl(tmp_path / "projects/p/a-parent/subagents/agent-x.jsonl", [
        claude_line("a-parent", "m3", "r3", T(2), out=50, isSidechain=True),
    ])  # fmt: skip
    loaded = transcripts("claude-code", tmp_path, cache=False)
    usage = loaded.usage.set_index("message_id")
    # Once each: 3 responses, not 6.
    assert sorted(usage.index) == ["m1", "m2", "m3"]
    # Kept: the larger usage for m1 (in the resumed file), the first file for m2 (a tie),
    # the main chain for m3 (over the larger side-chain copy).
    assert (usage.loc["m1", "output_tokens"], usage.loc["m1", "session_id"]) == (9, "b-resumed")
    assert usage.loc["m2", "session_id"] == "a-parent"
    assert (usage.loc["m3", "output_tokens"], usage.loc["m3", "session_id"]) == (5, "b-resumed")
    sessions = loaded.sessions.set_index("session_id")
    assert int(sessions["total_tokens"].sum()) == (10 + 9) + (10 + 5) + (10 + 5)
    assert int(sessions.loc["a-parent", "n_responses"]) == 1  # m2
    assert int(sessions.loc["b-resumed", "n_responses"]) == 2  # m1, m3


# -- 2. forked and spawned Codex sessions replay their parent --------------------------------


def test_a_codex_fork_replaying_its_parent_is_counted_once(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions/2026/10/01"
    parent = "11111111-1111-4111-8111-111111111111"
    child = "22222222-2222-4222-8222-222222222222"
    jsonl(sessions / f"rollout-2026-10-01T10-00-00-{parent}.jsonl", [
        meta(T(0), parent),
        {"timestamp": T(0), "type": "turn_context", "payload": {"model": "gpt-5"}},
        token_count(T(1), (1000, 100, 200, 50)),
        token_count(T(2), (1500, 150, 300, 80)),
    ])  # fmt: skip
    # The fork: its own header naming the parent, then the parent's header and history copied
    # within one second, then its own turn, whose running total continues the parent's.
    jsonl(sessions / f"rollout-2026-10-01T10-00-30-{child}.jsonl", [
        meta(T(30), child, forked_from_id=parent),
        meta(T(30), parent),
        {"timestamp": T(30), "type": "turn_context", "payload": {"model": "gpt-5"}},
        token_count(T(30), (1000, 100, 200, 50)),
        token_count(T(30), (1500, 150, 300, 80)),
        token_count(T(45), (1600, 150, 310, 80)),
    ])  # fmt: skip
    loaded = transcripts("codex", tmp_path, cache=False)
    s = loaded.sessions.set_index("session_id")
    assert s.loc[child, "forked_from_id"] == parent and s.loc[child, "parent_session_id"] == parent
    # The fork adds only its own turn: 100 input (all uncached), 10 output.
    assert (int(s.loc[child, "input_tokens"]), int(s.loc[child, "output_tokens"])) == (100, 10)
    assert int(s.loc[parent, "input_tokens"]) == 1500 - 150
    skipped = loaded.events[loaded.events["kind"] == "replay_skipped"]
    assert list(skipped["session_id"]) == [child] and list(skipped["value"]) == [1500 + 300]


def test_a_spawned_codex_subagent_and_a_copied_history_are_not_counted_twice(
    tmp_path: Path,
) -> None:
    sessions = tmp_path / "sessions"
    jsonl(sessions / "a-parent.jsonl", [
        {"timestamp": T(0), "type": "turn_context", "payload": {"model": "gpt-5"}},
        token_count(T(1), (1000, 0, 100, 0)),
    ])  # fmt: skip
    spawn = {"subagent": {"thread_spawn": {"parent_thread_id": "parent-id", "depth": 1}}}
    jsonl(sessions / "c-sub.jsonl", [
        meta(T(5), "sub-id", source=spawn),
        meta(T(5), "parent-id"),
        token_count(T(5), (1000, 0, 100, 0)),  # replayed at the spawn's second
        token_count(T(9), (40, 0, 4, 0)),  # its own count starts again from zero
    ])  # fmt: skip
    # A branch copied with the parent's own timestamps and no header (ccusage's fixture):
    # the copied event is one response, kept in the first file (path order).
    jsonl(sessions / "b-branch.jsonl", [
        {"timestamp": T(0), "type": "turn_context", "payload": {"model": "gpt-5"}},
        token_count(T(1), (1000, 0, 100, 0)),
        token_count(T(20), (1600, 0, 160, 0)),
    ])  # fmt: skip
    loaded = transcripts("codex", tmp_path, cache=False)
    s = loaded.sessions.set_index("session_id")
    assert s.loc["sub-id", "agent_kind"] == "subagent"
    assert s.loc["sub-id", "parent_session_id"] == "parent-id"
    assert bool(loaded.usage.loc[loaded.usage["session_id"] == "sub-id", "is_sidechain"].all())
    assert int(s.loc["sub-id", "input_tokens"]) == 40
    assert int(s.loc["b-branch", "input_tokens"]) == 600
    assert int(s["input_tokens"].sum()) == 1000 + 40 + 600


# -- 3. files that were never read -------------------------------------------------------------


def test_codex_sessions_not_named_rollout_are_read(tmp_path: Path) -> None:
    jsonl(tmp_path / "sessions/project-alpha/session-alpha.jsonl", [
        {"timestamp": T(0), "type": "turn_context", "payload": {"model": "gpt-5"}},
        token_count(T(1), (3500, 750, 425, 275)),
    ])  # fmt: skip
    jsonl(tmp_path / "archived_sessions/old.jsonl", [token_count(T(2), (10, 0, 1, 0))])
    # The same relative path in both folders: the active copy wins.
    jsonl(tmp_path / "archived_sessions/project-alpha/session-alpha.jsonl", [
        token_count(T(3), (999, 0, 9, 0)),
    ])  # fmt: skip
    loaded = transcripts("codex", tmp_path, cache=False)
    s = loaded.sessions.set_index("session_id")
    assert set(s.index) == {"project-alpha/session-alpha", "old"}
    assert int(s.loc["project-alpha/session-alpha", "input_tokens"]) == 2750


def test_gemini_chat_files_anywhere_under_tmp_are_read_and_others_skipped(
    tmp_path: Path,
) -> None:
    counts = {"input": 100, "output": 10, "cached": 40, "thoughts": 7, "tool": 3}
    chat = [{"sessionId": "s-1", "projectHash": "h", "startTime": T(0), "kind": "main"},
            {"id": "g1", "timestamp": T(1), "type": "gemini", "model": "gemini-2.5-flash",
             "tokens": counts}]  # fmt: skip
    jsonl(tmp_path / "tmp/proj/chats/session-2026-10-01.jsonl", chat)
    other = dict(chat[0], sessionId="s-2", messages=[dict(chat[1], id="g2")])
    (tmp_path / "tmp/proj/saved").mkdir(parents=True)
    (tmp_path / "tmp/proj/saved/my-chat.json").write_text(json.dumps(other, indent=2))
    (tmp_path / "tmp/proj/logs.json").write_text(json.dumps([{"sessionId": "s-1", "type": "user"}]))
    (tmp_path / "tmp/proj/checkpoint-x.json").write_text('[{"role": "user", "parts": []}]')
    loaded = transcripts("gemini", tmp_path, cache=False)
    assert set(loaded.sessions["session_id"]) == {"s-1", "s-2"}
    skipped = loaded.skipped.set_index(loaded.skipped["path"].map(lambda p: Path(p).name))
    assert set(skipped.index) == {"logs.json", "checkpoint-x.json"}
    assert "not a chat session" in skipped.loc["logs.json", "skip_reason"]
    assert loaded.stats.skipped == 2


# -- 4. unpriced models ------------------------------------------------------------------------


def test_unknown_models_are_priced_by_family_flagged_and_the_unpriceable_warned_once(
    tmp_path: Path,
) -> None:
    jsonl(tmp_path / "projects/p/s.jsonl", [
        claude_line("s", "m1", "r1", T(0), model="claude-opus-5"),
        claude_line("s", "m2", "r2", T(1), model="claude-haiku-4-5"),
        claude_line("s", "m3", "r3", T(2), model="rule4-model-without-a-family"),
        claude_line("s", "m4", "r4", T(3), model="rule4-model-without-a-family"),
    ])  # fmt: skip
    _WARNED.discard("rule4-model-without-a-family")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = transcripts("claude-code", tmp_path, cache=False)
        transcripts("claude-code", tmp_path, cache=False)
    unpriced = [w for w in caught if issubclass(w.category, UnpricedModelWarning)]
    assert len(unpriced) == 1 and "rule4-model-without-a-family" in str(unpriced[0].message)
    usage = loaded.usage.set_index("message_id")
    newest_opus = default_pricing().prices["claude-opus-4-8"]
    assert usage.loc["m1", "cost_estimated"] and usage.loc["m1", "cost_source"] == "computed"
    assert usage.loc["m1", "cost_usd"] == pytest.approx(
        10 * newest_opus.input + 5 * newest_opus.output
    )
    assert not usage.loc["m2", "cost_estimated"]
    assert pd.isna(usage.loc["m3", "cost_usd"]) and usage.loc["m3", "cost_source"] == "unpriced"
    (session,) = loaded.sessions.to_dict("records")
    assert session["cost_estimated"] and session["cost_source"] == "partial"


# -- 5. every bad line located -------------------------------------------------------------------


def test_bad_lines_are_located_by_file_and_line_for_every_source(tmp_path: Path) -> None:
    claude = tmp_path / "claude"
    jsonl(claude / "projects/p/s.jsonl", [
        claude_line("s", "m1", "r1", T(0)),
        "{not json",
        claude_line("s", "m2", "r2", "2026-13-45T99:99:99.000Z"),  # a time that cannot be
    ])  # fmt: skip
    codex = tmp_path / "codex"
    jsonl(codex / "sessions/a.jsonl", [
        token_count(T(1), (10, 0, 1, 0)),
        '{"timestamp": "x", "type": "event_msg", "payload": {"type": "token_count"',
        token_count("[trimmed]", (20, 0, 2, 0)),
        {"timestamp": T(3), "type": "response_item", "payload": {"type": 7}},
    ])  # fmt: skip
    gemini = tmp_path / "gemini"
    jsonl(gemini / "tmp/p/chats/session-1.jsonl", [
        {"sessionId": "g", "startTime": T(0)},
        {"id": "x", "timestamp": "yesterday", "type": "gemini", "tokens": {"input": 1}},
        "[1, 2",
    ])  # fmt: skip
    for source, root, numbers in (("claude-code", claude, [2, 3]), ("codex", codex, [2, 3, 4]),
                                  ("gemini", gemini, [2, 3])):  # fmt: skip
        (row,) = transcripts(source, root, cache=False).files.to_dict("records")
        assert (source, row["bad_lines"], list(row["bad_line_numbers"])) == (
            source, len(numbers), numbers)  # fmt: skip


# -- fields users want ----------------------------------------------------------------------------


def test_claude_code_fields(tmp_path: Path) -> None:
    base = {"gitBranch": "feature/x", "entrypoint": "cli", "cwd": "/w"}
    jsonl(tmp_path / "projects/p/s.jsonl", [
        {"type": "user", "sessionId": "s", "timestamp": T(0), "version": "2.1.30",
         "message": {"role": "user", "content": "fix it"}, "permissionMode": "plan", **base},
        claude_line("s", "m1", "r1", T(1), out=500, agentId="a1", attributionAgent="Explore",
                    attributionSkill="pdf", attributionPlugin="docs",
                    usage={"input_tokens": 10, "output_tokens": 500,
                           "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                           "service_tier": "priority",
                           "server_tool_use": {"web_search_requests": 2, "web_fetch_requests": 1},
                           "output_tokens_details": {"thinking_tokens": 120}},
                    message={"stop_reason": "tool_use"}, isSidechain=True),
        claude_line("s", "m2", "r2", T(2), model="<synthetic>", isApiErrorMessage=True,
                    apiErrorStatus=429, error="rate_limit",
                    usage={"input_tokens": 0, "output_tokens": 0}),
        {"type": "system", "subtype": "turn_duration", "durationMs": 1500, "timestamp": T(3),
         "sessionId": "s"},
        {"type": "system", "subtype": "compact_boundary", "timestamp": T(4), "sessionId": "s",
         "compactMetadata": {"trigger": "auto", "preTokens": 150000}},
        {"type": "system", "subtype": "api_error", "timestamp": T(5), "sessionId": "s",
         "error": {"status": 529, "type": "overloaded_error"}},
        {"type": "summary", "summary": "A generated summary", "leafUuid": "u"},
        {"type": "custom-title", "sessionId": "s", "customTitle": "Fixing it"},
        {"type": "permission-mode", "permissionMode": "acceptEdits", "sessionId": "s"},
    ])  # fmt: skip
    loaded = transcripts("claude-code", tmp_path, cache=False)
    (s,) = loaded.sessions.to_dict("records")
    assert (s["title"], s["git_branch"], s["entrypoint"], s["version"]) == (
        "Fixing it", "feature/x", "cli", "2.1.30")  # fmt: skip
    assert s["permission_mode"] == "acceptEdits"
    # Thinking is kept apart from output: 500 output tokens are 380 of answer, 120 of thinking.
    assert (s["output_tokens"], s["thinking_tokens"]) == (380, 120)
    assert s["total_tokens"] == 10 + 380 + 120
    searches = (s["web_search_requests"], s["web_fetch_requests"], s["service_tier"])
    assert searches == (2, 1, "priority")
    assert (s["n_api_errors"], s["n_rate_limited"], s["n_compactions"]) == (2, 1, 1)
    assert s["turn_duration_ms"] == 1500 and s["sidechain_tokens"] == 510
    row = loaded.usage.set_index("message_id").loc["m1"]
    assert (row["agent_id"], row["agent_type"], row["skill"], row["plugin"]) == (
        "a1", "Explore", "pdf", "docs")  # fmt: skip
    assert row["stop_reason"] == "tool_use"
    haiku = default_pricing().prices["claude-haiku-4-5"]
    assert row["cost_usd"] == pytest.approx(10 * haiku.input + 500 * haiku.output)  # billed


def test_codex_fields(tmp_path: Path) -> None:
    git = {"branch": "main", "commit_hash": "abc123", "repository_url": "https://x/r.git"}
    jsonl(tmp_path / "sessions/r.jsonl", [
        meta(T(0), "t-1", originator="codex_cli_rs", model_provider="openai", git=git,
             source="cli"),
        {"timestamp": T(0), "type": "turn_context",
         "payload": {"model": "gpt-5-codex", "effort": "high", "approval_policy": "on-request",
                     "sandbox_policy": {"type": "workspace-write"}}},
        dict(token_count(T(1), (1000, 200, 300, 120), model_context_window=272000),
             payload={"type": "token_count",
                      "info": token_count(T(1), (1000, 200, 300, 120))["payload"]["info"]
                      | {"model_context_window": 272000},
                      "rate_limits": {"primary": {"used_percent": 12.5, "window_minutes": 300},
                                      "secondary": {"used_percent": 40.0}}}),
        {"timestamp": T(2), "type": "event_msg", "payload": {"type": "error",
                                                              "message": "stream error"}},
    ])  # fmt: skip
    (s,) = transcripts("codex", tmp_path, cache=False).sessions.to_dict("records")
    assert (s["originator"], s["model_provider"], s["effort"]) == ("codex_cli_rs", "openai", "high")
    assert (s["approval_policy"], s["sandbox_policy"]) == ("on-request", "workspace-write")
    assert (s["git_branch"], s["git_commit"], s["git_repo_url"]) == (
        "main", "abc123", "https://x/r.git")  # fmt: skip
    assert s["context_window"] == 272000
    assert (s["rate_limit_primary_pct"], s["rate_limit_secondary_pct"]) == (12.5, 40.0)
    # Codex's output includes its reasoning: kept apart, billed together.
    assert (s["input_tokens"], s["cache_read_tokens"]) == (800, 200)
    assert (s["output_tokens"], s["thinking_tokens"]) == (180, 120)
    assert s["n_api_errors"] == 1 and s["agent_kind"] == "main"


def test_gemini_fields(tmp_path: Path) -> None:
    jsonl(tmp_path / "tmp/p/chats/session-sub.jsonl", [
        {"sessionId": "sub", "startTime": T(0), "kind": "subagent"},
        {"id": "g1", "timestamp": T(1), "type": "gemini", "model": "gemini-2.5-flash",
         "tokens": {"input": 100, "output": 10, "cached": 40, "thoughts": 7, "tool": 3}},
        {"id": "e1", "timestamp": T(2), "type": "error", "content": "quota exceeded"},
        {"$set": {"summary": "Counting words"}},
    ])  # fmt: skip
    loaded = transcripts("gemini", tmp_path, cache=False)
    (s,) = loaded.sessions.to_dict("records")
    assert (s["agent_kind"], s["title"], s["n_api_errors"]) == ("subagent", "Counting words", 1)
    assert (s["input_tokens"], s["cache_read_tokens"]) == (100 - 40 + 3, 40)
    assert (s["output_tokens"], s["thinking_tokens"]) == (10, 7)
    row = loaded.usage.iloc[0]
    assert row["tool_prompt_tokens"] == 3 and bool(row["is_sidechain"])
    flash = default_pricing().prices["gemini-2.5-flash"]
    assert row["cost_usd"] == pytest.approx(
        63 * flash.input + 17 * flash.output + 40 * flash.cache_read
    )


def test_responses_without_a_request_id_are_matched_within_their_session_only(
    tmp_path: Path,
) -> None:
    # Two sessions whose (replayed) responses reuse message ids and carry no request id, in
    # the main chain and in a sub-agent's file.
    for session in ("s1", "s2"):
        line = claude_line(session, "msg_replay_1", "", T(0))
        side = claude_line(session, "msg_replay_sub", "", T(1), isSidechain=True)
        for record in (line, side):
            del record["requestId"]
        jsonl(tmp_path / f"projects/p/{session}.jsonl", [line, line])
        jsonl(tmp_path / f"projects/p/{session}/subagents/agent-a.jsonl", [side, side])
    sessions = transcripts("claude-code", tmp_path, cache=False).sessions
    assert list(sessions["n_responses"]) == [2, 2]
    assert list(sessions["sidechain_tokens"]) == [15, 15]
