"""The parts of the network sandbox, each with real processes: the butler's
``[butler.sandbox] network``/``allow_hosts``, the host's doors (:mod:`spawnkit.containment.doors`),
the forwarder inside (:mod:`spawnkit.containment.sandbox_forward`) and the view that joins them
(:func:`spawnkit.containment.sandbox.plan`). The real CLIs are in test_network_sandbox_e2e.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spawnkit.config.roster import adhoc_butler
from spawnkit.containment import sandbox
from spawnkit.containment.doors import DOORS_DIR, INSIDE, open_doors
from spawnkit.errors import RosterError

FORWARDER = Path(sandbox.__file__).with_name("sandbox_forward.py")
# The interpreter the forwarder runs on (the system's build of this version, if any).
PYTHON = str(sandbox._python())
BIG = 24 * 1024 * 1024


# -- the butler's configuration ---------------------------------------------------------------


def test_a_butler_has_a_network_of_its_own_by_default(make_butler) -> None:
    butler = make_butler()
    assert (butler.sandbox.network, butler.sandbox.allow_hosts) == ("model-only", ())


def test_allow_hosts_takes_names_wildcards_and_addresses(make_butler) -> None:
    hosts = '["PyPI.org", "files.pythonhosted.org.", "*.github.com", "10.0.0.5", "::1"]'
    butler = make_butler(extra=f"[butler.sandbox]\nallow_hosts = {hosts}\n")
    assert butler.sandbox.allow_hosts == (
        "pypi.org", "files.pythonhosted.org", "*.github.com", "10.0.0.5", "::1",
    )  # fmt: skip
    assert make_butler(extra='[butler.sandbox]\nnetwork = "host"\n').sandbox.network == "host"


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        ('network = "none"', "must be 'model-only' or 'host'"),
        ('network = "host"\nallow_hosts = ["pypi.org"]', 'no effect with network = "host"'),
        ('allow_hosts = "pypi.org"', "must be a list of host names"),
        ('allow_hosts = ["https://pypi.org"]', "not a host name"),
        ('allow_hosts = ["pypi.org:443"]', "not a host name"),
        ('allow_hosts = ["py*.org"]', "only allowed as a leading '*.'"),
        ('allow_hosts = ["*.com"]', "a whole top-level domain"),
        ('allow_hosts = ["-bad.org"]', "not a host name"),
    ],
)
def test_a_bad_network_setting_is_a_one_line_error_naming_the_file(
    make_butler, table: str, complaint: str
) -> None:
    with pytest.raises(RosterError) as caught:
        make_butler(extra=f"[butler.sandbox]\n{table}\n")
    message = str(caught.value)
    assert "\n" not in message and complaint in message
    assert "butler.toml" in message and "butler.sandbox." in message


# -- the forwarder ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder whose sockets fit a unix socket's 107 bytes (tmp_path may not)."""
    folder = Path(tempfile.mkdtemp(prefix="sk-doors-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def big_server(path: Path) -> threading.Thread:
    """A unix server that answers each connection's request line with BIG bytes."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()

    def answer() -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                request = conn.recv(100)
                chunk = hashlib.sha256(request).digest() * 2048  # 64 KiB
                for _ in range(BIG // len(chunk)):
                    conn.sendall(chunk)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


CLIENT = """
import hashlib, socket, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
sock.sendall(b"GET big")
sock.shutdown(socket.SHUT_WR)
digest, size = hashlib.sha256(), 0
while chunk := sock.recv(1 << 16):
    digest.update(chunk); size += len(chunk)
print(size, digest.hexdigest())
sys.exit(int(sys.argv[2]))
"""


def forward(*args: str, **options: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-I", "-S", str(FORWARDER), *args],
        capture_output=True, text=True, timeout=120, check=False, **options,  # type: ignore[arg-type]
    )  # fmt: skip


def test_the_forwarder_carries_a_big_stream_intact_and_passes_the_exit_code(short_dir) -> None:
    big_server(short_dir / "door.sock")
    port = free_port()
    done = forward(f"{port}={short_dir / 'door.sock'}", "--", PYTHON, "-c", CLIENT, str(port), "7")
    chunk = hashlib.sha256(b"GET big").digest() * 2048
    expected = hashlib.sha256(chunk * (BIG // len(chunk))).hexdigest()
    assert done.returncode == 7, done.stderr
    assert done.stdout.split() == [str(BIG), expected]


def test_the_forwarder_sends_each_write_at_once(monkeypatch, short_dir) -> None:
    """Its sockets to the CLI are TCP_NODELAY, as a direct connection's are (asyncio's):
    with Nagle's algorithm a second small write (an SSE event, an answer's tail) waits for
    the CLI's delayed ACK of the first, some 40 ms a time, and slowed every run."""
    from spawnkit.containment import sandbox_forward

    accepted: list[socket.socket] = []

    class Accepted(Exception):
        """Ends the forwarder's accept loop once it has handed on a connection."""

    class Threads:
        @staticmethod
        def start_new_thread(function: object, args: tuple[object, ...]) -> None:
            accepted.append(args[0])  # type: ignore[arg-type]  # carry(client, path, slots)
            raise Accepted

        allocate_lock = staticmethod(threading.Lock)

    def serve_one(listener: socket.socket) -> None:
        with contextlib.suppress(Accepted):
            sandbox_forward.serve(listener, str(short_dir / "door.sock"))

    monkeypatch.setattr(sandbox_forward, "_thread", Threads)
    listeners = sandbox_forward.listen(free_port())
    serving = threading.Thread(target=serve_one, args=(listeners[0],), daemon=True)
    serving.start()
    with socket.create_connection(listeners[0].getsockname()[:2]):
        serving.join(timeout=60)
    assert accepted, "the forwarder accepted no connection"
    assert accepted[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    for sock in (*accepted, *listeners):
        sock.close()


def test_the_forwarder_reports_a_signal_as_bubblewrap_does_and_bad_use_clearly() -> None:
    assert forward("--", "sh", "-c", "kill -9 $$").returncode == 128 + signal.SIGKILL
    assert forward("--", "/nonexistent/cli").returncode == 127
    bad = forward("80:x", "--", "true")
    assert bad.returncode == 2 and "not PORT=SOCKET" in bad.stderr


def test_the_forwarder_holds_no_copy_of_the_clis_stdout_or_stdin() -> None:
    """The CLI closes its stdout and waits on stdin: its reader sees EOF at once, and the
    CLI's stdin reaches EOF when the writer closes it (nobody else holds either)."""
    script = "echo ready; exec >&-; read line; cat > /dev/null; echo $line >&2"
    proc = subprocess.Popen(
        [PYTHON, "-I", "-S", str(FORWARDER), f"{free_port()}=/nonexistent.sock", "--",
         "sh", "-c", script],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.read() == b"ready\n"  # EOF while the CLI still runs
        assert proc.poll() is None
        _, err = proc.communicate(b"hello\n", timeout=60)  # then stdin's EOF ends `cat`
    finally:
        proc.kill()
    assert proc.returncode == 0 and err == b"hello\n"


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_the_forwarder_passes_termination_signals_on_to_the_cli(signum: int) -> None:
    """Even one sent the moment the CLI's process exists, before its exec (the forwarder
    holds them blocked until the child has its own dispositions and the forwarder passes
    them on: it used to die of one there, by Python's SIGINT handler or the default)."""
    for _ in range(5):
        proc = subprocess.Popen(
            [PYTHON, "-I", "-S", str(FORWARDER), "--", "sleep", "300"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not children(proc.pid):  # no pause: the signal goes as soon as it can
                assert time.monotonic() < deadline, "the CLI started"
            proc.send_signal(signum)
            assert proc.wait(timeout=60) == 128 + signum
        finally:
            proc.kill()


# -- the doors on the host -------------------------------------------------------------------


async def echo_server() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_door_bridges_to_its_tcp_port_and_goes_with_the_run(short_dir) -> None:
    server, port = await echo_server()
    async with server, open_doors(short_dir, [port]) as doors:
        (door,) = doors.doors
        assert door.port == port and door.inside == INSIDE / f"{port}.sock"
        assert (door.socket.parent.stat().st_mode & 0o777) == 0o700
        reader, writer = await asyncio.open_unix_connection(str(door.socket))
        writer.write(b"through the door")
        writer.write_eof()
        assert await reader.read() == b"THROUGH THE DOOR"
        writer.close()
        # A server made for the run listens on its door's socket itself.
        own = doors.socket_for(port + 1)
        unix = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(own))
        assert (short_dir / DOORS_DIR / f"{port + 1}.sock").exists()
        unix.close()
    assert not (short_dir / DOORS_DIR).exists()


async def test_a_door_to_a_name_looks_it_up_once_not_per_connection(monkeypatch, short_dir) -> None:
    """The butler's MCP server is ``localhost``: looked up on every connection, each went
    through the default executor (a thread hop behind the run's other threaded work)."""
    server, port = await echo_server()
    loop = asyncio.get_running_loop()
    lookups: list[object] = []
    real = loop.getaddrinfo

    async def counted(host: object, *args: object, **kwargs: object) -> object:
        lookups.append(host)
        return await real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "getaddrinfo", counted)
    async with server, open_doors(short_dir, [("localhost", port)]) as doors:
        (door,) = doors.doors
        for n in range(3):
            reader, writer = await asyncio.open_unix_connection(str(door.socket))
            writer.write(f"call {n}".encode())
            writer.write_eof()
            assert await reader.read() == f"CALL {n}".encode()
            writer.close()
    assert lookups == ["localhost"]


async def test_a_connection_open_when_the_run_ends_is_closed_quietly(
    short_dir, caplog: pytest.LogCaptureFixture
) -> None:
    """A run stopped mid-request (a cancel) closes its doors with connections open: they
    end without asyncio logging an error (which a notebook shows in the run's cell)."""
    server, port = await echo_server()
    async with server:
        async with open_doors(short_dir, [port]) as doors:
            (door,) = doors.doors
            reader, writer = await asyncio.open_unix_connection(str(door.socket))
            writer.write(b"held open")
            await writer.drain()
            assert await reader.readexactly(4) == b"HELD"
        assert await reader.read() in (b"", b" OPEN"), "the door closed the connection"
        writer.close()
        await asyncio.sleep(0.05)  # asyncio logs a callback's end on the next loop pass
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_door_carries_big_streams_both_ways_to_slow_readers_intact(short_dir) -> None:
    """A full buffer on one side pauses reading on the other; nothing is lost or reordered."""
    payload = os.urandom(4 * 1024 * 1024)
    received = bytearray()

    async def slow_sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payload)  # answers 4 MB while the client is still sending its own
        while data := await reader.read(16384):
            received.extend(data)
            await asyncio.sleep(0)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(slow_sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, open_doors(short_dir, [port]) as doors:
        reader, writer = await asyncio.open_unix_connection(str(doors.doors[0].socket))
        writer.write(payload[::-1])
        await writer.drain()
        writer.write_eof()
        back = await reader.read()
        writer.close()
    assert back == payload and bytes(received) == payload[::-1]


async def test_a_door_passes_each_sides_end_on_as_a_half_close(short_dir) -> None:
    """The host's side ends first; the client goes on sending, and the host still gets it."""
    heard: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def answers_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        writer.write_eof()
        heard.set_result(await reader.read())
        writer.close()

    server = await asyncio.start_server(answers_first, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, open_doors(short_dir, [port]) as doors:
        reader, writer = await asyncio.open_unix_connection(str(doors.doors[0].socket))
        assert await reader.read() == b"hello"  # the host's end came through as EOF
        writer.write(b"still talking")
        writer.write_eof()
        assert await asyncio.wait_for(heard, 30) == b"still talking"
        writer.close()


async def ended(reader: asyncio.StreamReader) -> bool:
    """The other side closed: an EOF, or a reset (it closed with our request unread)."""
    try:
        return await asyncio.wait_for(reader.read(), 30) == b""
    except ConnectionResetError:
        return True


async def test_a_door_whose_port_is_gone_or_full_closes_the_connection(short_dir) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    async with open_doors(short_dir, [closed_port]) as doors:
        reader, writer = await asyncio.open_unix_connection(str(doors.doors[0].socket))
        writer.write(b"anyone?")
        assert await ended(reader)
        writer.close()
    server, port = await echo_server()
    async with server, open_doors(short_dir, [port], max_connections=1) as doors:
        path = str(doors.doors[0].socket)
        first_reader, first = await asyncio.open_unix_connection(path)
        first.write(b"one")
        assert await first_reader.readexactly(3) == b"ONE"
        second_reader, second = await asyncio.open_unix_connection(path)
        assert await ended(second_reader), "over the limit"
        first.write(b" more")
        assert await first_reader.readexactly(5) == b" MORE", "the first still works"
        for writer in (first, second):
            writer.close()


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
    reason="needs root (to act as the user nobody), setpriv and /usr/bin/python3",
)
async def test_another_local_user_cannot_connect_to_a_runs_door(short_dir) -> None:
    short_dir.chmod(0o755)  # only the door folder's own mode stands in the way

    async def connect_as_nobody(path: Path) -> str:
        proc = await asyncio.create_subprocess_exec(
            "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
            "/usr/bin/python3", "-c",
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[1]); print('connected')\n"
            "except OSError as e:\n    print(type(e).__name__)",
            str(path), stdout=asyncio.subprocess.PIPE, cwd="/",
        )  # fmt: skip
        out, _ = await proc.communicate()
        return out.decode().strip()

    server, port = await echo_server()
    async with server, open_doors(short_dir, [port]) as doors:
        (door,) = doors.doors
        door.socket.chmod(0o777)  # as uvicorn leaves its sockets: the folder must refuse
        assert await connect_as_nobody(door.socket) == "PermissionError"
        door.socket.parent.chmod(0o755)  # the control: the folder's mode is what refuses
        assert await connect_as_nobody(door.socket) == "connected"


# -- the view ---------------------------------------------------------------------------------


def test_the_plan_gives_a_network_of_its_own_unless_the_butler_says_host(tmp_path) -> None:
    butler = adhoc_butler("claude-code", tmp_path)
    (tmp_path / DOORS_DIR).mkdir()
    from spawnkit.containment.doors import Door

    door = Door(8123, tmp_path / DOORS_DIR / "8123.sock")
    argv = sandbox.plan(butler, tmp_path, doors=[door]).argv
    assert "--unshare-net" in argv
    assert argv[-6:] == (PYTHON, "-I", "-S", "/run/spawnkit/forward.pyc",
                         "8123=/run/spawnkit/doors/8123.sock", "--")  # fmt: skip
    chat = sandbox.plan(butler, tmp_path, doors=[door], interactive=True).argv
    assert chat[-3:] == ("--interactive", "8123=/run/spawnkit/doors/8123.sock", "--")
    assert sandbox.plan(butler, tmp_path).argv[-1] == "--", "no doors, no forwarder"

    from dataclasses import replace

    host = replace(butler, sandbox=replace(butler.sandbox, network="host"))
    argv = sandbox.plan(host, tmp_path, doors=[door]).argv
    assert "--unshare-net" not in argv and argv[-1] == "--"
    assert sandbox.network_policy(host) == "host"
    none = replace(butler, sandbox=replace(butler.sandbox, mode="none"))
    assert sandbox.network_policy(none) == "host"
    assert sandbox.network_policy(butler) == "model-only"
