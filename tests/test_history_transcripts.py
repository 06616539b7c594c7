"""spawnkit.history.transcripts on real CLI transcripts, crafted traps, and the incremental cache.

The fixtures under ``tests/fixtures/history/`` were written by the real Claude Code 2.1.330,
Codex 0.169.0 and Gemini CLI 0.61.0 (``benchmarks/record_cli_transcripts.py``) against the
replay server playing one scenario, so every expected token count below is the scenario's.
The crafted files reproduce the traps of real transcripts line by line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spawnkit.history import HistoryError, transcripts
from spawnkit.history.cache import cache_dir

from .conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "history"
sys.path.insert(0, str(REPO / "benchmarks"))
import gen_transcripts  # noqa: E402


def tokens(row: pd.Series) -> tuple[int, int, int, int]:
    return (int(row["input_tokens"]), int(row["output_tokens"]),
            int(row["cache_write_tokens"]), int(row["cache_read_tokens"]))  # fmt: skip


# -- real transcripts ------------------------------------------------------------------------


def test_claude_code_transcripts_recorded_by_the_real_cli() -> None:
    loaded = transcripts("claude", FIXTURES / "claude", cache=False)
    sessions = loaded.sessions.set_index("first_prompt")
    assert len(sessions) == 2 and loaded.stats.bad_lines == 0
    count = sessions.loc["count words please"]
    # Three turns: 1200+1300+1500 input, 40+30+25 output, 800+900+1100 cache reads. The replay
    # server's cache_creation breakdown is zero, and ccusage counts the breakdown.
    assert tokens(count) == (4000, 95, 0, 2800)
    assert count["n_responses"] == 3 and count["n_tool_calls"] == 2
    assert count["n_tool_errors"] == 1 and count["models"] == ["claude-opus-5-5"]
    delegate = sessions.loc["delegate some work"]
    # Main chain 1400+1450+1500, subagent side chain 300+310 (its own file).
    assert tokens(delegate) == (4960, 150, 0, 3370)
    assert delegate["n_files"] == 2 and delegate["n_responses"] == 5
    # claude-opus-5-5 is not in the table: the session takes the CLI's own reported cost.
    assert delegate["cost_source"] == "reported"
    assert delegate["cost_usd"] == delegate["reported_cost_usd"] > 0
    # The real CLI wrote the two-tool response on several lines with one message id.
    assert loaded.usage["message_id"].is_unique
    raw_ids = [
        json.loads(line)["message"]["id"]
        for path in (FIXTURES / "claude").rglob("*.jsonl")
        for line in path.read_text().splitlines()
        if '"usage":{' in line and '"type":"assistant"' in line
    ]
    assert len(raw_ids) > len(set(raw_ids)) == 8
    calls = loaded.tool_calls
    assert len(calls) == 6 and calls["call_id"].is_unique
    failed = calls[calls["status"] == "error"].iloc[0]
    assert failed["input"] == '{"command":"exit 3"}' and "Exit code 3" in failed["output"]
    assert calls["is_sidechain"].sum() == 1
    assert (calls["finished_at"] >= calls["started_at"]).all()
    assert set(calls["session_id"]) == set(loaded.sessions["session_id"])


def test_codex_rollouts_recorded_by_the_real_cli() -> None:
    loaded = transcripts("codex", FIXTURES / "codex", cache=False)
    (session,) = loaded.sessions.to_dict(orient="records")
    # Codex's totals are cumulative and its input includes the cached tokens.
    assert (session["input_tokens"], session["output_tokens"]) == (4000, 95)
    assert (session["cache_write_tokens"], session["cache_read_tokens"]) == (0, 2800)
    assert session["n_responses"] == 3 and session["models"] == ["replay-model"]
    assert session["cost_source"] == "unpriced" and pd.isna(session["cost_usd"])
    assert session["project"] == "/fixture/work"
    calls = loaded.tool_calls.set_index("input")
    assert calls.loc['{"cmd": "exit 3"}', "status"] == "error"
    assert calls.loc['{"cmd": "echo hello"}', "status"] == "ok"


def test_gemini_chats_recorded_by_the_real_cli() -> None:
    loaded = transcripts("gemini", FIXTURES / "gemini", cache=False)
    (session,) = loaded.sessions.to_dict(orient="records")
    # Each message is written twice (before and after its tool calls): counted once.
    assert (session["input_tokens"], session["output_tokens"]) == (4000, 95)
    assert session["cache_read_tokens"] == 2800 and session["n_responses"] == 3
    assert session["cost_source"] == "computed"
    # gemini-2.5-flash: $0.30 input, $2.50 output, $0.03 cache read per million.
    assert session["cost_usd"] == pytest.approx((4000 * 0.3 + 95 * 2.5 + 2800 * 0.03) / 1e6)
    statuses = loaded.tool_calls.set_index("input")["status"]
    assert statuses['{"command":"exit 3"}'] == "error"
    assert statuses['{"command":"echo hello"}'] == "ok"


def test_frame_dtypes() -> None:
    loaded = transcripts("claude", FIXTURES / "claude", cache=False)
    s, c = loaded.sessions, loaded.tool_calls
    assert str(s["started_at"].dtype) == str(c["started_at"].dtype) == "datetime64[ns, UTC]"
    for column in ("input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens",
                   "n_tool_calls"):  # fmt: skip
        assert s[column].dtype == "Int64"
    assert s["cost_usd"].dtype == "float64"
    for frame, column in ((s, "source"), (s, "cost_source"), (c, "name"), (c, "tool")):
        assert frame[column].dtype == "category"
    assert c["duration_ms"].dtype == "Int64" and c["is_error"].dtype == "boolean"
    merged = c.merge(s[["session_id", "project"]], on="session_id", validate="many_to_one")
    assert len(merged) == len(c)


# -- crafted traps -----------------------------------------------------------------------------


def line(session: str, msg: str | None, req: str | None, ts: str, **extra: Any) -> str:
    default = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0}  # fmt: skip
    usage = extra.pop("usage", default)
    message: dict[str, Any] = {"model": extra.pop("model", "claude-haiku-4-5"), "usage": usage,
                               "content": extra.pop("content", [])}  # fmt: skip
    if msg is not None:
        message["id"] = msg
    record: dict[str, Any] = {"type": "assistant", "sessionId": session, "timestamp": ts,
                              "version": "2.1.0", "message": message, **extra}  # fmt: skip
    if req is not None:
        record["requestId"] = req
    return json.dumps(record, separators=(",", ":"))


def write(root: Path, rel: str, lines: list[str]) -> Path:
    path = root / "projects" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_duplicated_lines_replays_and_filters(tmp_path: Path) -> None:
    def usage(out: int, read: int = 0) -> dict[str, int]:
        return {"input_tokens": 10, "output_tokens": out, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": read}  # fmt: skip

    t = "2026-10-01T10:00:0{}.000Z".format
    write(tmp_path, "p/s1.jsonl", [
        # One response on three lines, the early ones with a partial output count.
        line("s1", "m1", "r1", t(0), usage=usage(1)),
        line("s1", "m1", "r1", t(1), usage=usage(7)),
        line("s1", "m1", "r1", t(2), usage=usage(3)),
        # No message id: never merged.
        line("s1", None, "r2", t(3)), line("s1", None, "r2", t(3)),
        # Dropped as ccusage drops them: explicit null, empty id, not a version.
        line("s1", "m3", None, t(4), requestId=None), line("s1", "", "r4", t(4)),
        line("s1", "m5", "r5", t(4), version="abc"),
        # A synthetic error message: counted, zero tokens, no model.
        line("s1", "m6", "r6", t(5), model="<synthetic>",
             usage={"input_tokens": 0, "output_tokens": 0}),
        "not json at all",
        '{"type":"assistant","message":{"usage":{"input_tokens":"ten"}}}',
        # A response that cannot be placed in time: no timestamp, or one that does not parse.
        '{"type":"assistant","message":{"id":"m8","usage":{"input_tokens":1}}}',
        line("s1", "m9", "r9", "2026-13-45T99:99:99.000Z"),
    ])  # fmt: skip
    write(tmp_path, "p/s1/subagents/agent-a.jsonl", [
        # A /btw side chain replays m1 under a new request id and its own timestamp...
        line("s1", "m1", "r9", t(8), isSidechain=True, usage=usage(7, read=500)),
        # ... and a side chain's own response, twice with two request ids: kept once.
        line("s1", "m7", "r7", t(9), isSidechain=True, usage=usage(2)),
        line("s1", "m7", "r8", t(9), isSidechain=True, usage=usage(4)),
    ])  # fmt: skip
    # The same message id under another request: another response (the same message and
    # request ids in another session are one response: tests/test_history_rules.py).
    write(tmp_path, "p/s2.jsonl", [line("s2", "m1", "r1-other", t(0))])
    # A final line cut short by a killed CLI.
    path = write(tmp_path, "p/s3.jsonl", [line("s3", "m9", "r9", t(0))])
    with path.open("a") as fh:
        fh.write(line("s3", "m10", "r10", t(1))[:40])

    loaded = transcripts("claude", tmp_path, cache=False)
    s = loaded.sessions.set_index("session_id")
    # m1 (10 + 7), two id-less rows (2 x 15), m6 (0), m7 (10 + 4).
    assert int(s.loc["s1", "input_tokens"]) == 10 + 20 + 0 + 10
    assert int(s.loc["s1", "output_tokens"]) == 7 + 10 + 0 + 4
    assert int(s.loc["s1", "cache_read_tokens"]) == 0
    assert s.loc["s1", "models"] == ["claude-haiku-4-5"]
    assert int(s.loc["s2", "total_tokens"]) == 15
    files = loaded.files.set_index(loaded.files["path"].map(lambda p: Path(p).name))
    # The unparseable timestamp is found after parsing, and located all the same.
    assert files.loc["s1.jsonl", "bad_lines"] == 4
    assert list(files.loc["s1.jsonl", "bad_line_numbers"]) == [10, 11, 12, 13]
    assert files.loc["s3.jsonl", "bad_lines"] == 1 and loaded.stats.bad_lines == 5
    assert int(s.loc["s1", "bad_lines"]) == 4


def test_cache_writes_split_into_five_minute_and_one_hour_parts(tmp_path: Path) -> None:
    write(tmp_path, "p/s.jsonl", [line("s", "m", "r", "2026-10-01T10:00:00.000Z",
          model="claude-opus-4-5", usage={
              "input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 400,
              "cache_read_input_tokens": 0,
              "cache_creation": {"ephemeral_5m_input_tokens": 100,
                                 "ephemeral_1h_input_tokens": 200}})])  # fmt: skip
    (session,) = transcripts("claude", tmp_path, cache=False).sessions.to_dict("records")
    # The breakdown wins over the total (as in ccusage); 1-hour writes cost twice the input.
    assert session["cache_write_tokens"] == 300
    assert session["cost_usd"] == pytest.approx(100 * 6.25e-6 + 200 * 10e-6)


def test_daily_splits_a_session_across_midnight(tmp_path: Path) -> None:
    write(tmp_path, "p/s.jsonl", [line("s", "a", "r1", "2026-10-01T23:59:59.000Z"),
                                  line("s", "b", "r2", "2026-10-02T00:00:01.000Z")])  # fmt: skip
    loaded = transcripts("claude", tmp_path, cache=False)
    assert list(loaded.daily()["date"]) == ["2026-10-01", "2026-10-02"]
    assert list(loaded.daily(tz="America/New_York")["date"]) == ["2026-10-01"]


def test_unknown_source_and_missing_folder() -> None:
    with pytest.raises(HistoryError, match="unknown transcript source"):
        transcripts("cursor", FIXTURES)  # type: ignore[arg-type]
    with pytest.raises(HistoryError, match="no claude-code transcripts folder"):
        transcripts("claude", FIXTURES / "nowhere")


def test_claude_config_dir_names_the_default_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(FIXTURES / "claude", tmp_path / "a")
    write(tmp_path / "b", "p/other.jsonl", [line("other", "m", "r", "2026-10-01T10:00:00.000Z")])
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", f"{tmp_path / 'a'}, {tmp_path / 'b' / 'projects'}")
    loaded = transcripts("claude", cache=False)
    assert len(loaded.sessions) == 3 and len(loaded.roots) == 2


# -- the incremental cache ---------------------------------------------------------------------


def test_second_load_parses_only_what_changed(tmp_path: Path) -> None:
    root = tmp_path / "claude"
    shutil.copytree(FIXTURES / "claude", root)
    first = transcripts("claude", root)
    assert first.stats.parsed == first.stats.files == 3
    again = transcripts("claude", root)
    assert again.stats.parsed == 0 and again.stats.bytes_parsed == 0
    pd.testing.assert_frame_equal(again.sessions, first.sessions)
    pd.testing.assert_frame_equal(again.tool_calls, first.tool_calls)

    # The session without a subagent: its one file is all of it.
    main = next(p for p in root.rglob("*.jsonl") if not p.with_suffix("").is_dir())
    session = main.stem
    with main.open("a") as fh:  # the file grew: a new response
        fh.write(line(session, "new", "rnew", "2026-11-22T03:00:00.000Z",
                      usage={"input_tokens": 1000, "output_tokens": 1}) + "\n")  # fmt: skip
    grown = transcripts("claude", root)
    assert grown.stats.parsed == 1 and grown.stats.bytes_parsed == main.stat().st_size
    before = first.sessions.set_index("session_id").loc[session, "input_tokens"]
    assert grown.sessions.set_index("session_id").loc[session, "input_tokens"] == before + 1000

    st = main.stat()  # same size, new mtime: parsed again
    os.utime(main, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert transcripts("claude", root).stats.parsed == 1

    main.unlink()  # removed: its rows leave the history
    gone = transcripts("claude", root)
    assert gone.stats.parsed == 0 and session not in set(gone.usage["session_id"].astype(str))
    assert len(gone.files) == 2


def test_a_damaged_cache_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    root = tmp_path / "claude"
    shutil.copytree(FIXTURES / "claude", root)
    first = transcripts("claude", root)
    folder = cache_dir("claude-code", root)
    manifest = json.loads((folder / "current.json").read_text())
    (folder / manifest["generation"] / manifest["runs"][0] / "usage").write_bytes(b"not arrow")
    rebuilt = transcripts("claude", root)
    assert rebuilt.stats.parsed == 3
    pd.testing.assert_frame_equal(rebuilt.sessions, first.sessions)
    assert transcripts("claude", root).stats.parsed == 0


def test_without_cache_nothing_is_written(tmp_path: Path) -> None:
    transcripts("claude", FIXTURES / "claude", cache=False)
    assert not cache_dir("claude-code", FIXTURES / "claude").exists()


def test_worker_processes_give_the_same_frames_and_never_fork_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen_transcripts.generate(tmp_path / "corpus", 4, seed=3)
    serial = transcripts("claude", tmp_path / "corpus", cache=False, workers=1)

    def no_fork() -> int:
        # What a kernel with a huge virtual size gets (docs/history.md): workers must come
        # from elsewhere.
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(os, "fork", no_fork)
    parallel = transcripts("claude", tmp_path / "corpus", cache=False, workers=2)
    assert len(serial.files) >= 4 and serial.stats.bad_lines == parallel.stats.bad_lines
    pd.testing.assert_frame_equal(serial.sessions, parallel.sessions)
    pd.testing.assert_frame_equal(serial.tool_calls, parallel.tool_calls)
    pd.testing.assert_frame_equal(serial.usage, parallel.usage)


def test_a_load_shared_out_keeps_the_workers_files_as_its_cache(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    gen_transcripts.generate(root, 4, seed=5)
    cold = transcripts("claude", root, workers=2)
    folder = cache_dir("claude-code", root)
    manifest = json.loads((folder / "current.json").read_text())
    generation = folder / manifest["generation"]
    # The runs the workers wrote, as they wrote them: nothing written a second time.
    assert len(manifest["runs"]) > 1
    assert sorted(p.name for p in generation.iterdir()) == sorted(manifest["runs"])
    warm = transcripts("claude", root, workers=2)
    assert warm.stats.parsed == 0
    for name in ("sessions", "tool_calls", "usage", "events", "files"):
        pd.testing.assert_frame_equal(getattr(cold, name), getattr(warm, name))

    # One file grows: the merged rows become a new generation, and the old one goes.
    grown = sorted(root.rglob("*.jsonl"))[0]
    with grown.open("a") as f:
        f.write("\n")
    assert transcripts("claude", root, workers=2).stats.parsed == 1
    assert not generation.exists()
    (current,) = [p for p in folder.iterdir() if p.is_dir()]
    assert json.loads((folder / "current.json").read_text())["generation"] == current.name
    assert transcripts("claude", root, workers=2).stats.parsed == 0


def test_loads_racing_on_one_cache_leave_a_whole_one(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    gen_transcripts.generate(root, 4, seed=6)
    script = (
        "import sys; from spawnkit.history import transcripts; "
        "print(len(transcripts('claude', sys.argv[1], workers=2).usage))"
    )
    racers = [
        subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ))
        for _ in range(3)
    ]  # fmt: skip
    counts = {racer.communicate(timeout=300)[0].strip() for racer in racers}
    assert all(racer.returncode == 0 for racer in racers)
    after = transcripts("claude", root, workers=2)
    assert after.stats.parsed == 0 and counts == {str(len(after.usage))}


def test_default_folders_are_the_users_and_spawnkits_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_home: Path
) -> None:
    home = tmp_path / "home"
    shutil.copytree(FIXTURES / "claude", home / ".claude")
    monkeypatch.setenv("HOME", str(home))
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "GEMINI_CLI_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    runs = isolated_home / "runtimes"
    write(
        runs / "claude-code", "-work/run.jsonl", [line("run", "m", "r", "2026-10-01T10:00:00.000Z")]
    )
    shutil.copytree(FIXTURES / "codex" / "sessions", runs / "codex" / "sessions")
    shutil.copytree(FIXTURES / "gemini" / "tmp", runs / "gemini" / "tmp")
    claude = transcripts("claude-code", cache=False)
    assert claude.roots == (home / ".claude", runs / "claude-code")
    assert "run" in set(claude.sessions["session_id"]) and len(claude.sessions) == 3
    # No ~/.codex or ~/.gemini: spawnkit's runs alone.
    assert transcripts("codex", cache=False).roots == (runs / "codex",)
    assert len(transcripts("gemini", cache=False).sessions) == 1


def test_previews_of_tool_inputs_and_outputs_take_the_ascii_shortcut_only_when_equal() -> None:
    import random

    import msgspec

    from spawnkit.history.claude import _preview, _text

    rng = random.Random(7)
    odd = ['"', "\\\\", "é", "€", "𝄞", " ", "\\n"]
    values = [b"", b'"', b'""', b'"abc"', b'{"command": "ls"}', '"é"'.encode()]
    for n in (*range(195, 210), 400, 799, 800, 801, 5000):
        for quoted in (True, False):
            body = "".join(rng.choice(odd) if rng.random() < 0.05 else "a" for _ in range(n))
            text = f'"{body}"' if quoted else body
            values += [text.encode(), text.encode()[:-1], ("é" + text).encode()]
    for value in values:
        for limit in (200, 3):
            expected = _text(value[: limit * 4], limit)  # the whole rule, on every value
            assert _preview(msgspec.Raw(value), limit) == expected, (value[:40], limit)
    assert _preview(msgspec.Raw(b'"' + b"x" * 300 + b'"'), 200) == "x" * 200
    assert _preview(msgspec.Raw(b'"short"'), 200) == "short"
