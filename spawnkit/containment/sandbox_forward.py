"""The forwarder inside a run's network namespace: the sandbox's end of each door.

bubblewrap starts this program in the run's namespace (``python -I -S`` of spawnkit's Python
version: see :func:`spawnkit.containment.sandbox._python`), in place of the CLI:

    sandbox_forward.py [--interactive] PORT=SOCKET ... -- CLI ARGS...

For each ``PORT=SOCKET`` it listens on the sandbox's ``127.0.0.1:PORT`` (and ``[::1]:PORT``
when the namespace has IPv6 loopback) and carries every connection to the unix socket
``SOCKET``, a door spawnkit keeps on the host (see :mod:`spawnkit.containment.doors`). Then it
starts the CLI and serves until the CLI exits, and exits with its status (128 + the signal's
number when a signal ended it, as bubblewrap reports one), so the run sees the CLI's exit.

What the CLI sees is as if the forwarder were not there: it is listening before the CLI
starts (a connection made at once waits in the backlog); it holds no copy of the CLI's
stdin and stdout after the fork (EOF comes when the CLI closes them); it never writes to
stdout; SIGTERM, SIGINT and SIGHUP sent to it are passed on to the CLI. A chat
(``--interactive``) keeps the terminal: the CLI stays in the terminal's foreground group,
and the forwarder ignores the terminal's SIGINT and SIGQUIT (they reach the CLI from the
terminal itself; passing them on too would double them).

It runs before every sandboxed CLI, so it starts fast: the standard library's C modules
only (``_socket``, ``_signal``, ``_thread``: their Python wrappers import ``enum``,
``selectors`` and ``collections``, which would triple its start). Connections are served
by threads, at most :data:`MAX_CONNECTIONS` per door at once.
"""

import _signal  # type: ignore[import-not-found]  # signal.py imports enum: slow
import _socket
import _thread
import os
import sys

MAX_CONNECTIONS = 64
BACKLOG = 128
_CHUNK = 64 * 1024
_USAGE = "usage: sandbox_forward.py [--interactive] PORT=SOCKET ... -- COMMAND [ARG ...]"
_HANDLED = (_signal.SIGINT, _signal.SIGQUIT, _signal.SIGTERM, _signal.SIGHUP)
_IGNORED, _DEFAULT = _signal.SIG_IGN, _signal.SIG_DFL


def parse(argv: list[str]) -> tuple[bool, list[tuple[int, str]], list[str]]:
    """(interactive, [(port, socket path)], command) from the command line; ValueError."""
    if "--" not in argv:
        raise ValueError("no '--' before the command")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    if not command:
        raise ValueError("no command after '--'")
    interactive = "--interactive" in options
    doors = []
    for spec in options:
        if spec == "--interactive":
            continue
        port, sep, path = spec.partition("=")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not path:
            raise ValueError(f"not PORT=SOCKET: {spec!r}")
        doors.append((int(port), path))
    return interactive, doors, command


def listen(port: int) -> list[_socket.socket]:
    """Listening sockets on the loopback's ``port``: IPv4, and IPv6 when it is up."""
    listeners = []
    for family, host in ((_socket.AF_INET, "127.0.0.1"), (_socket.AF_INET6, "::1")):
        try:
            sock = _socket.socket(family, _socket.SOCK_STREAM)  # close-on-exec
        except OSError:
            continue  # no IPv6 in this kernel
        try:
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            if family == _socket.AF_INET6:
                sock.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
            sock.listen(BACKLOG)
        except OSError:
            sock.close()
            if family == _socket.AF_INET:
                raise
            continue  # IPv6 loopback is not up in this namespace
        listeners.append(sock)
    return listeners


class _Slots:
    """At most ``limit`` connections of one door at once."""

    def __init__(self, limit: int) -> None:
        self.free = limit
        self.lock = _thread.allocate_lock()

    def take(self) -> bool:
        with self.lock:
            if self.free == 0:
                return False
            self.free -= 1
            return True

    def give(self) -> None:
        with self.lock:
            self.free += 1


def serve(listener: _socket.socket, path: str) -> None:
    """Accept on ``listener`` forever, each connection carried to the socket ``path``."""
    slots = _Slots(MAX_CONNECTIONS)
    while True:
        try:
            fd, _ = listener._accept()  # type: ignore[attr-defined]  # the fd, no wrapper
        except OSError:
            continue
        client = _socket.socket(fileno=fd)
        # Each write goes out at once, as a direct connection's would (asyncio's sockets
        # are TCP_NODELAY): with Nagle's algorithm, a second small write (an SSE event, an
        # MCP answer's tail) waits for the CLI's delayed ACK of the first, about 40 ms.
        client.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        if not slots.take():
            client.close()  # over the bound: refused rather than queued without end
            continue
        _thread.start_new_thread(carry, (client, path, slots))


def carry(client: _socket.socket, path: str, slots: _Slots) -> None:
    """One connection: ``client`` spliced to a new connection to the door ``path``."""
    door = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        door.connect(path)
    except OSError:
        client.close()
        door.close()
        slots.give()
        return
    done = _thread.allocate_lock()
    done.acquire()
    _thread.start_new_thread(_pump_then_release, (door, client, done))
    pump(client, door)
    done.acquire()  # the other way is over too
    client.close()
    door.close()
    slots.give()


def _pump_then_release(source: _socket.socket, sink: _socket.socket, done: object) -> None:
    try:
        pump(source, sink)
    finally:
        done.release()  # type: ignore[attr-defined]


def pump(source: _socket.socket, sink: _socket.socket) -> None:
    """Copy ``source`` to ``sink`` until EOF, passed on as a half-close; a reset ends both."""
    try:
        while chunk := source.recv(_CHUNK):
            sink.sendall(chunk)
        sink.shutdown(_socket.SHUT_WR)
    except OSError:
        for end in (source, sink):
            try:  # noqa: SIM105 - contextlib would cost the start what it saves here
                end.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass


def start(command: list[str], inherited: dict[int, object], mask: object) -> int:
    """Fork and exec ``command``; its pid. The child gets the signals as we got them: what
    was ignored stays ignored, the rest is at its default, as exec would leave it (a
    handler of ours, Python's SIGINT one included, would act between fork and exec), and
    the signal mask ``mask``, which we hold blocked until then."""
    pid = os.fork()
    if pid == 0:
        try:
            for number, handler in inherited.items():
                if handler is not None:  # None: set outside Python, and left as it is
                    _signal.signal(number, _IGNORED if handler == _IGNORED else _DEFAULT)
            _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
            os.execvp(command[0], command)
        except BaseException as exc:  # noqa: BLE001 - never return into the forwarder's code
            os.write(2, f"spawnkit forwarder: cannot run {command[0]}: {exc}\n".encode())
        os._exit(127)
    return pid


def pass_signals(child: int, interactive: bool) -> None:
    """SIGTERM, SIGHUP (and SIGINT, headless) sent here reach the CLI."""

    def forward(number: int, _frame: object) -> None:
        try:  # noqa: SIM105 - contextlib would cost the start what it saves here
            os.kill(child, number)
        except ProcessLookupError:
            pass

    for number in (_signal.SIGTERM, _signal.SIGHUP):
        _signal.signal(number, forward)
    if not interactive:
        _signal.signal(_signal.SIGINT, forward)


def let_go_of_stdio() -> None:
    """Our copies of stdin and stdout become /dev/null: the CLI's EOF is its own."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def exit_status(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    try:
        interactive, doors, command = parse(argv)
    except ValueError as exc:
        os.write(2, f"spawnkit forwarder: {exc}\n{_USAGE}\n".encode())
        return 2
    served = []
    for port, path in doors:
        try:
            served += [(sock, path) for sock in listen(port)]
        except OSError as exc:
            os.write(2, f"spawnkit forwarder: cannot listen on port {port}: {exc}\n".encode())
            return 125
    inherited = {number: _signal.getsignal(number) for number in _HANDLED}
    if interactive:  # the terminal's own SIGINT must not end us before the CLI
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
        _signal.signal(_signal.SIGQUIT, _signal.SIG_IGN)
    # Blocked from before the fork until the child has its own dispositions and ours pass
    # signals on: one that comes in between waits, and is then passed on (it would end us
    # by Python's SIGINT handler, or the child before its exec, with the wrong status).
    mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, _HANDLED)
    child = start(command, inherited, mask)
    pass_signals(child, interactive)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
    let_go_of_stdio()
    for sock, path in served:
        _thread.start_new_thread(serve, (sock, path))
    _, status = os.waitpid(child, 0)
    return exit_status(status)


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))  # no interpreter shutdown: the serving threads just end
