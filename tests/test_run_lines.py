"""Line framing and the direct CLI runner used for Codex and Gemini."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from pathlib import Path

import pytest

from spawnkit._process import LineFramer, run_lines

from .conftest import processes_with_env


def test_framer_splits_across_chunks() -> None:
    framer = LineFramer(max_line=100)
    assert framer.feed(b'{"a": 1}\n{"b"') == [('{"a": 1}', False)]
    assert framer.feed(b": 2}\r\n\n") == [('{"b": 2}', False), ("", False)]
    assert framer.feed("é".encode()[:1]) == []
    assert framer.feed("é".encode()[1:] + b"\n") == [("é", False)]
    assert framer.flush() is None


def test_framer_bounds_a_line_without_newline() -> None:
    framer = LineFramer(max_line=10)
    assert framer.feed(b"x" * 25) == [("x" * 10, True)]
    assert framer.feed(b"y" * 1000) == [], "the rest of the long line is dropped"
    assert framer.feed(b"yy\nok\n") == [("ok", False)]
    assert framer.feed(b"tail") == []
    assert framer.flush() == ("tail", False)


def test_framer_marks_a_long_line_whose_end_comes_with_the_chunk_that_overflows() -> None:
    framer = LineFramer(max_line=10)
    assert framer.feed(b"x" * 6) == []
    assert framer.feed(b"x" * 20 + b"\nok\n") == [("x" * 10, True), ("ok", False)]
    assert framer.feed(b"y" * 30 + b"\n") == [("y" * 10, True)]


async def test_run_lines_streams_with_exact_env(tmp_path: Path) -> None:
    out: list[str] = []
    err: list[str] = []
    script = "echo one; echo warn >&2; sleep 0.2; echo two; env; exit 3"
    code = await run_lines(
        ["bash", "-c", script],
        env={"PATH": os.environ["PATH"], "ONLY_THIS": "yes"},
        cwd=tmp_path,
        on_stdout=lambda line, _: out.append(line),
        on_stderr=lambda line, _: err.append(line),
    )
    assert code == 3
    assert out[:2] == ["one", "two"] and err == ["warn"]
    names = {line.split("=", 1)[0] for line in out[2:]}
    assert "ONLY_THIS" in names and "HOME" not in names and "SPAWNKIT_HOME" not in names


async def test_run_lines_feeds_stdin(tmp_path: Path) -> None:
    out: list[str] = []
    code = await run_lines(
        ["cat"], env={"PATH": os.environ["PATH"]}, cwd=tmp_path, stdin=b"a\nb",
        on_stdout=lambda line, _: out.append(line), on_stderr=lambda *_: None,
    )  # fmt: skip
    assert (code, out) == (0, ["a", "b"])


async def test_a_large_stdin_and_a_chatty_child_do_not_block_each_other(tmp_path: Path) -> None:
    """stdin is written as the pipe drains while the output is read: 4 MB each way, more
    than either pipe holds, through a child that echoes what it reads."""
    data = b"".join(b"line %07d\n" % n for n in range(320_000))
    out: list[str] = []
    code = await run_lines(
        ["cat"], env={"PATH": os.environ["PATH"]}, cwd=tmp_path, stdin=data,
        on_stdout=lambda line, _: out.append(line), on_stderr=lambda *_: None,
    )  # fmt: skip
    assert code == 0
    assert len(out) == 320_000 and out[0] == "line 0000000" and out[-1] == "line 0319999"


async def test_a_sink_that_raises_stops_the_child_and_comes_out(tmp_path: Path) -> None:
    """As when a run reaches its turn limit: the exception the sink raised comes out of
    run_lines, no line is handed over after it, and the child's group is gone."""
    marker = "SPAWNKIT_RUN_LINES_SINK"

    class Enough(Exception):
        pass

    seen: list[str] = []

    def on_stdout(line: str, _: bool) -> None:
        seen.append(line)
        if line == "3":
            raise Enough

    with pytest.raises(Enough):
        await run_lines(
            ["bash", "-c", "for i in $(seq 1 100000); do echo $i; done; sleep 300"],
            env={"PATH": os.environ["PATH"], marker: "1"}, cwd=tmp_path,
            on_stdout=on_stdout, on_stderr=lambda *_: None,
        )  # fmt: skip
    assert seen == ["1", "2", "3"]
    assert processes_with_env(marker, "1") == []


async def test_a_child_costs_no_task(tmp_path: Path) -> None:
    """Its pipes, stdin and exit are followed by callbacks on the loop, not by tasks."""
    loop = asyncio.get_running_loop()
    created: list[object] = []
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: object, **kwargs: object) -> object:
        created.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)  # type: ignore[arg-type]

    loop.set_task_factory(counting)  # type: ignore[arg-type]
    try:
        out: list[str] = []
        code = await run_lines(
            ["cat"], env={"PATH": os.environ["PATH"]}, cwd=tmp_path, stdin=b"in\n",
            on_stdout=lambda line, _: out.append(line), on_stderr=lambda *_: None,
        )  # fmt: skip
    finally:
        loop.set_task_factory(factory)
    assert (code, out) == (0, ["in"])
    assert created == []


async def test_run_lines_starts_no_thread_to_wait_for_its_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.11's asyncio waits for each child in a thread of its own; a pidfd on the
    event loop tells the exit here, and the exit code and output are the same."""
    started: list[str] = []
    real = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread.name)
        real(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    out: list[str] = []
    code = await run_lines(
        ["sh", "-c", "echo out; exit 7"], env={"PATH": os.environ["PATH"]}, cwd=tmp_path,
        on_stdout=lambda line, _: out.append(line), on_stderr=lambda *_: None,
    )  # fmt: skip
    assert (code, out) == (7, ["out"])
    assert started == []


async def test_cancelling_kills_the_whole_group(tmp_path: Path) -> None:
    marker = "SPAWNKIT_RUN_LINES_TEST"
    started = asyncio.Event()
    script = "trap '' TERM; sleep 300 & echo started; wait"

    def on_stdout(line: str, _: bool) -> None:
        if line == "started":
            started.set()

    task = asyncio.create_task(
        run_lines(
            ["bash", "-c", script],
            env={"PATH": os.environ["PATH"], marker: "1"},
            cwd=tmp_path,
            on_stdout=on_stdout,
            on_stderr=lambda *_: None,
        )
    )
    await asyncio.wait_for(started.wait(), 10)
    assert len(processes_with_env(marker, "1")) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert processes_with_env(marker, "1") == [], "bash ignored SIGTERM and got SIGKILL"


async def test_background_children_die_with_a_finished_run(tmp_path: Path) -> None:
    marker = "SPAWNKIT_RUN_LINES_ORPHAN"
    code = await run_lines(
        ["bash", "-c", "(sleep 300 >/dev/null 2>&1 &); echo done"],
        env={"PATH": os.environ["PATH"], marker: "1"}, cwd=tmp_path,
        on_stdout=lambda *_: None, on_stderr=lambda *_: None,
    )  # fmt: skip
    assert code == 0
    assert processes_with_env(marker, "1") == []


async def test_stdout_via_a_file_with_no_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Node CLI's stdout goes to a file (a pipe loses its end at process.exit()): every
    line arrives, written before and after a pause, and the file never has a name in the
    temp folder, so nothing of it can be left there whatever kills us."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen: list[list[str]] = []
    out: list[str] = []

    def line(text: str, _: bool) -> None:
        out.append(text)
        seen.append(sorted(p.name for p in scratch.iterdir()))

    script = "seq 1 20000; sleep 0.3; echo last; printf tail"
    code = await run_lines(
        ["bash", "-c", script], env={"PATH": os.environ["PATH"]}, cwd=tmp_path,
        on_stdout=line, on_stderr=lambda *_: None, stdout_via_file=True,
    )  # fmt: skip
    assert code == 0
    assert out == [str(n) for n in range(1, 20001)] + ["last", "tail"]
    assert seen and all(names == [] for names in seen)
    assert list(scratch.iterdir()) == []


async def test_a_process_holding_the_output_open_does_not_hold_the_run(tmp_path: Path) -> None:
    """A grandchild in a session of its own keeps the CLI's stdout open after the CLI has
    exited: the run ends with the CLI's lines, not when that process ends (here: never)."""
    pidfile = tmp_path / "holder.pid"
    script = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 600' & echo done; exit 4"
    out: list[str] = []
    try:
        async with asyncio.timeout(60):  # a hang guard: on the old code it waited for ever
            code = await run_lines(
                ["bash", "-c", script], env={"PATH": os.environ["PATH"]}, cwd=tmp_path,
                on_stdout=lambda line, _: out.append(line), on_stderr=lambda *_: None,
            )  # fmt: skip
        assert (code, out) == (4, ["done"])
    finally:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), 9)
