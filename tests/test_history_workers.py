"""The parse server and its workers: scripts without a main guard, failures, and cleanup.

Worker processes are real (the parse server of :mod:`spawnkit.history.workers`). A stuck
worker is a worker reading a named pipe nobody writes to: it blocks until killed.
"""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from spawnkit.history import workers
from spawnkit.history.cache import FileStat
from spawnkit.history.formats import FORMATS
from spawnkit.history.transcript_loader import parse_files

from .conftest import REPO, live_processes

sys.path.insert(0, str(REPO / "benchmarks"))
import gen_transcripts

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="named pipes, /proc")


def _gone(pid: int, timeout: float = 60.0) -> bool:
    """Whether process group ``pid`` is empty within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _stuck_files(tmp_path: Path, n: int = 2) -> list[FileStat]:
    paths = []
    for i in range(n):
        path = tmp_path / "projects" / "p" / f"s{i}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        paths.append(FileStat(str(path), 1 << 20, 0))
    return paths


def test_a_script_without_a_main_guard_loads_history_in_workers(tmp_path: Path) -> None:
    """multiprocessing's workers import the caller's __main__; ours must not (it hung)."""
    gen_transcripts.generate(tmp_path / "corpus", 4, seed=5)
    script = tmp_path / "analysis.py"
    script.write_text(
        textwrap.dedent(f"""
            from spawnkit.history import transcripts
            print("top level ran", flush=True)
            loaded = transcripts("claude", {str(tmp_path / "corpus")!r}, cache=False, workers=2)
            print(len(loaded.sessions), loaded.stats.parsed, flush=True)
        """)
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "top level ran" and len(lines) == 2  # the script ran once, not per worker
    sessions, parsed = map(int, lines[1].split())
    assert sessions > 0 and parsed == len(list((tmp_path / "corpus").rglob("*.jsonl")))


def test_a_worker_failure_is_raised_in_the_caller() -> None:
    # json.loads given a list (each worker's chunk) raises TypeError in the worker.
    with pytest.raises(TypeError):
        workers.parse_in_workers(json.loads, ["1", "2"], [1, 1], 2)  # type: ignore[arg-type]
    # The server survives a failed job and takes the next one.
    server = workers.SERVER.pid
    assert server is not None
    with pytest.raises(TypeError):
        workers.parse_in_workers(json.loads, ["1", "2"], [1, 1], 2)  # type: ignore[arg-type]
    assert workers.SERVER.pid == server


def test_failing_loads_in_a_row_each_raise_and_leave_no_worker() -> None:
    """Stopping multiprocessing's Pool after a failed task deadlocked (Pool.terminate waiting
    on a killed worker's queue lock): the second or third failing load of a process hung."""
    for _ in range(20):
        with pytest.raises(TypeError):
            workers.parse_in_workers(json.loads, ["1", "2", "3"], [1, 1, 1], 2)  # type: ignore[arg-type]
    server = workers.SERVER.pid
    assert server is not None
    assert _children(server) == []


def test_a_worker_that_dies_fails_the_load_at_once() -> None:
    """A worker that exits mid-task (here sys.exit; the kernel's OOM killer alike) fails
    the load with its exit status, rather than leaving it to wait for its time limit."""
    with pytest.raises(RuntimeError, match=r"parse worker ended while parsing \(exit status 1\)"):
        workers.parse_in_workers(sys.exit, ["1", "2"], [1, 1], 2)  # type: ignore[arg-type]
    assert workers.SERVER.pid is not None  # the server lives on
    assert _children(workers.SERVER.pid) == []


def _children(pid: int) -> list[int]:
    """The live (not zombie) children of ``pid``."""
    return [child for child, _, fields in live_processes() if int(fields[1]) == pid]


def test_a_load_past_its_time_kills_its_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt = FORMATS["claude-code"]
    sessions = tmp_path / "ok" / "projects" / "p"
    sessions.mkdir(parents=True)
    for i in range(2):
        (sessions / f"t{i}.jsonl").write_text("{}\n")
    good = [FileStat(str(p), p.stat().st_size, 0) for p in sorted(sessions.iterdir())]
    assert parse_files(fmt, tmp_path / "ok", good, workers=2).files.num_rows == 2
    server = workers.SERVER.pid
    assert server is not None

    monkeypatch.setattr(workers, "RESULT_TIMEOUT_S", 3.0)
    with pytest.raises(TimeoutError):
        parse_files(fmt, tmp_path, _stuck_files(tmp_path), workers=2)
    # The server's group, its stuck workers included, is gone.
    assert workers.SERVER.pid is None
    assert _gone(server), f"left behind: {_group(server)}"
    # The next load starts a new server (with the real time limit: starting one and
    # importing pyarrow can take over 3 s on a loaded machine).
    monkeypatch.undo()
    assert parse_files(fmt, tmp_path / "ok", good, workers=2).files.num_rows == 2
    assert workers.SERVER.pid not in (None, server)


def test_the_parse_server_and_workers_end_when_their_caller_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _stuck_files(tmp_path)
    script = textwrap.dedent(f"""
        import sys, threading, time
        from pathlib import Path
        from spawnkit.history import workers
        from spawnkit.history.cache import FileStat
        from spawnkit.history.formats import FORMATS
        from spawnkit.history.transcript_loader import parse_files
        files = [FileStat(p, 1 << 20, 0) for p in {[f.path for f in files]!r}]
        threading.Thread(
            target=parse_files, args=(FORMATS["claude-code"], Path({str(tmp_path)!r}), files, 2),
            daemon=True,
        ).start()
        while workers.SERVER.pid is None:
            time.sleep(0.05)
        print(workers.SERVER.pid, flush=True)
        time.sleep(600)
    """)
    # A caller killed with SIGKILL cannot remove its folder of worker outputs: keep it here.
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    caller = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert caller.stdout is not None
        server = int(caller.stdout.readline())
        # Wait until the server has forked its two workers (children in its group).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_group(server)) < 3:
            time.sleep(0.05)
        assert len(_group(server)) >= 3, _group(server)
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    assert _gone(server), f"left behind: {_group(server)}"
    # The killed caller's folder of worker outputs stays, until a load removes it once it is
    # older than any load may last.
    (left,) = (tmp_path / "tmp").iterdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    sessions = tmp_path / "ok" / "projects" / "p"
    sessions.mkdir(parents=True)
    for i in range(2):
        (sessions / f"t{i}.jsonl").write_text("{}\n")
    good = [FileStat(str(p), p.stat().st_size, 0) for p in sorted(sessions.iterdir())]
    assert parse_files(FORMATS["claude-code"], tmp_path / "ok", good, workers=2).files.num_rows
    assert left.exists()  # young: it might be a load whose caller this process cannot see
    monkeypatch.setattr(workers, "ORPHAN_AGE_S", 0.0)
    assert parse_files(FORMATS["claude-code"], tmp_path / "ok", good, workers=2).files.num_rows
    assert not left.exists()


def _group(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_a_parse_server_killed_mid_load_is_a_clear_error(tmp_path: Path) -> None:
    fmt = FORMATS["claude-code"]
    errors: list[BaseException] = []

    def load() -> None:
        try:
            parse_files(fmt, tmp_path, _stuck_files(tmp_path), workers=2)
        except BaseException as exc:  # noqa: BLE001 - the test looks at what it is
            errors.append(exc)

    thread = threading.Thread(target=load)
    thread.start()
    deadline = time.monotonic() + 60
    while (server := workers.SERVER.pid) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server is not None
    while len(_group(server)) < 3 and time.monotonic() < deadline:  # its workers are stuck
        time.sleep(0.05)
    os.kill(server, signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
    assert "parse server ended while parsing" in str(errors[0])
    assert _gone(server), f"left behind: {_group(server)}"


def test_a_server_gone_before_reading_its_job_is_the_same_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Killed with the job unread, the server's end of the socket is closed: sending gets a
    broken pipe, receiving a reset. Either is the error a user can read, not an OSError."""
    server = workers.ParseServer()
    ours, theirs = socket.socketpair()
    theirs.close()
    conn = multiprocessing.connection.Connection(ours.detach())
    monkeypatch.setattr(server, "_connect", lambda: conn)
    try:
        with pytest.raises(RuntimeError, match="parse server ended while parsing"):
            server.run(("a job",), timeout=5)  # type: ignore[arg-type]
    finally:
        conn.close()
