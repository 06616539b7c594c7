"""The egress proxy: the one door out of a run's network namespace to the hosts its butler allows.

A sandboxed run has a network namespace of its own, with nothing in it but its own loopback
and spawnkit's doors. A butler that must fetch (``pip install``, ``git clone``, a docs site)
lists the hosts it needs in ``[butler.sandbox] allow_hosts``; its runs then get one more
door: this proxy, an HTTP proxy serving on a unix socket of the run (the namespace's
forwarder maps an inside ``127.0.0.1`` port to it), which the CLI and its tools reach through
``HTTPS_PROXY``/``HTTP_PROXY`` (:func:`proxy_env`). It never starts for runs without the
network sandbox (they have the host's network): the code that sets up the namespace decides.

It takes ``CONNECT host:port`` (a tunnel: bytes both ways, TLS is never intercepted) and
plain HTTP requests with an absolute URI (``GET http://host/path``, forwarded once, the
``Host`` header checked against the URI). What it lets through is decided by the host name
the client asked for, never by what a name resolves to inside the sandbox (there is no DNS
there): the proxy resolves names itself, on the host, and connects to the very address it
checked (no second lookup to rebind). The rules, as in most allow lists:

- a name matches itself only, case-insensitive, a trailing dot ignored;
- ``*.github.com`` matches every name under github.com (``api.github.com``,
  ``a.b.github.com``) but not ``github.com`` itself: list both when both are needed;
- an IP literal (v4 or v6, in any spelling a resolver accepts: ``2130706433``, ``0x7f.1``
  and ``127.1`` are ``127.0.0.1``) is refused unless that address is listed, in any spelling;
- a listed name that resolves to a loopback, link-local, unspecified or cloud-metadata
  address (127.0.0.0/8, ::1, 0.0.0.0/8, ::, 169.254.0.0/16, fe80::/10, fd00:ec2::254,
  100.100.100.200) is refused, a guard against DNS rebinding onto the host's own services,
  unless the list names that address itself (or the proxy is made with
  ``allow_private=True``, as tests that map a test name to 127.0.0.1 do). Private LAN
  addresses (10/8, 192.168/16, ...) are reachable through a listed name: internal mirrors
  are listed by name;
- every port of an allowed host is allowed.

Everything else gets ``403`` with a plain-text body that says what to add and where, and is
reported (``on_denied``) so the run's events and record show it. What it cannot see: the
content of a tunnel (an allowed CDN serving other sites by SNI or Host inside TLS is
"allowed"), and what an allowed host does with the data sent to it.

Bounded: at most ``max_tunnels`` open connections to upstream hosts at once (one more is
refused with 503 and reported), as many again waiting for their request head, a head of at
most :data:`MAX_HEAD_BYTES` read within :data:`HEAD_TIMEOUT_S`, upstream connects within
:data:`CONNECT_TIMEOUT_S`. Leaving :func:`egress_proxy` closes every connection, idle or
not: nothing outlives the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..events import NOT_LISTED

logger = logging.getLogger(__name__)

HostAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

MAX_TUNNELS = 64
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
CHUNK_BYTES = 64 * 1024

PRIVATE = "resolves to a loopback, link-local or metadata address"
TOO_MANY = "too many open connections"

# Addresses a listed name may not lead to unless listed themselves (see the module text).
_GUARDED = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "100.100.100.200/32",
        "::/128", "::1/128", "fe80::/10", "fd00:ec2::254/128",
    )
)  # fmt: skip
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
# Headers for this hop only: never passed on to the upstream host.
_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade"}
)


@dataclass(frozen=True)
class Denial:
    """One refused attempt: the host as the client named it, the port, and why."""

    host: str
    port: int
    reason: str
    # For a listed name refused by the guard: the address it resolved to.
    address: str | None = None


def ip_literal(host: str) -> HostAddress | None:
    """``host`` as an IP address if it is one, in any spelling a resolver accepts, else None.

    ``[::1]``, ``::ffff:127.0.0.1``, ``2130706433``, ``0x7f.1``, ``0177.0.0.1`` and ``127.1``
    are all addresses: a resolver would connect to them without a lookup.
    """
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if not text or ":" in text or any(c.isspace() for c in text):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None


def normal_name(host: str) -> str:
    """``host`` lower-cased, without its one trailing dot."""
    name = host.lower()
    return name[:-1] if name.endswith(".") else name


def is_guarded(address: HostAddress) -> bool:
    """Whether ``address`` is loopback, link-local, unspecified or a metadata endpoint."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in net for net in _GUARDED if net.version == address.version)


@dataclass(frozen=True)
class HostRules:
    """A butler's ``allow_hosts``, parsed: names, ``*.`` suffixes and addresses."""

    names: frozenset[str]
    suffixes: tuple[str, ...]  # ".github.com" for "*.github.com"
    addresses: frozenset[HostAddress]

    @classmethod
    def parse(cls, allow_hosts: Iterable[str]) -> HostRules:
        names: set[str] = set()
        suffixes: list[str] = []
        addresses: set[HostAddress] = set()
        for entry in allow_hosts:
            address = ip_literal(normal_name(entry.strip()))
            name = normal_name(entry.strip())
            if address is not None:
                addresses.add(address)
            elif name.startswith("*.") and _NAME.fullmatch(name[2:]):
                suffixes.append(name[1:])
            elif _NAME.fullmatch(name) and len(name) <= 253:
                names.add(name)
            else:
                raise ConfigError(
                    f"allow_hosts: {entry!r} is not a host name, a '*.' wildcard or an IP address"
                )
        return cls(frozenset(names), tuple(suffixes), frozenset(addresses))

    def allows_name(self, name: str) -> bool:
        name = normal_name(name)
        return name in self.names or any(name.endswith(s) for s in self.suffixes)

    def lists_address(self, address: HostAddress) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return address in self.addresses or address.ipv4_mapped in self.addresses
        return address in self.addresses


async def resolve_on_host(host: str, port: int) -> list[str]:
    """The addresses of ``host``, looked up on the host (the sandbox has no DNS)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def proxy_env(port: int) -> dict[str, str]:
    """The variables that send a run's HTTP(S) traffic through the proxy at inside ``port``.

    Both spellings, as tools read one or the other; the doors on the sandbox's loopback
    (the relay, the MCP server) are reached directly.
    """
    url = f"http://127.0.0.1:{port}"
    direct = "127.0.0.1,localhost,::1"
    return {
        "HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url,
        "NO_PROXY": direct, "no_proxy": direct,
    }  # fmt: skip


class _BadRequest(Exception):
    """A request the proxy cannot take (400); not a policy refusal."""


class _Unreachable(Exception):
    """An allowed host that cannot be resolved or connected to (502)."""


@dataclass(frozen=True)
class _Request:
    method: str
    host: str
    port: int
    # What goes upstream before the tunnel opens: None for CONNECT (nothing, a 200 back).
    head: bytes | None


class EgressProxy:
    """The proxy of one run; :func:`egress_proxy` serves it on the run's unix socket."""

    def __init__(
        self,
        allow_hosts: Iterable[str],
        *,
        butler: str,
        config_file: str | Path | None = None,
        on_denied: Callable[[Denial], None] | None = None,
        resolver: Resolver = resolve_on_host,
        allow_private: bool = False,
        max_tunnels: int = MAX_TUNNELS,
    ) -> None:
        self.rules = HostRules.parse(allow_hosts)
        self.butler = butler
        self.config_file = str(config_file) if config_file else f"roster/{butler}/butler.toml"
        self.on_denied = on_denied
        self.resolver = resolver
        self.allow_private = allow_private
        self.max_tunnels = max_tunnels
        self.denied = 0  # refused attempts so far
        self.tunnels = 0  # open connections to upstream hosts
        self._waiting = 0  # connections still sending their request head
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    # -- the policy ---------------------------------------------------------------------

    async def addresses_for(self, host: str, port: int) -> list[HostAddress] | Denial:
        """Where a connection to ``host:port`` may go, best first, or why it may not."""
        literal = ip_literal(normal_name(host))
        if literal is not None:
            return (
                [literal] if self.rules.lists_address(literal) else Denial(host, port, NOT_LISTED)
            )
        if not _NAME.fullmatch(normal_name(host)):
            raise _BadRequest(f"{host!r} is not a host name")
        if not self.rules.allows_name(host):
            return Denial(host, port, NOT_LISTED)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                found = [
                    ipaddress.ip_address(a.split("%")[0]) for a in await self.resolver(host, port)
                ]
        except (OSError, TimeoutError, ValueError) as exc:
            raise _Unreachable(f"could not resolve {host}: {exc or 'timed out'}") from exc
        allowed = [
            a
            for a in found
            if self.allow_private or not is_guarded(a) or self.rules.lists_address(a)
        ]
        if not allowed and found:
            return Denial(host, port, PRIVATE, str(found[0]))
        if not allowed:
            raise _Unreachable(f"{host} has no address")
        return allowed

    def message(self, denial: Denial) -> str:
        """The 403 body: what was refused, why, and which key of which file would allow it."""
        where = f"[butler.sandbox] allow_hosts in {self.config_file}"
        start = f"spawnkit: connect {denial.host}:{denial.port} refused"
        if denial.reason == NOT_LISTED:
            return f"{start}: {NOT_LISTED} of butler {self.butler} (add it to {where})"
        if denial.reason == PRIVATE:
            return (
                f"{start}: {denial.host} resolves to {denial.address}, a loopback, link-local or"
                f" metadata address (list {denial.address} itself in {where} to allow it)"
            )
        return f"{start}: {denial.reason} (at most {self.max_tunnels} at once for a run)"

    def _deny(self, denial: Denial) -> bytes:
        self.denied += 1
        logger.info("egress of butler %s refused: %s:%s (%s)",
                    self.butler, denial.host, denial.port, denial.reason)  # fmt: skip
        if self.on_denied is not None:
            try:
                self.on_denied(denial)
            except Exception:  # a broken listener must not break the proxy
                logger.exception("egress: on_denied failed for %s", denial)
        status = (403, "Forbidden") if denial.reason != TOO_MANY else (503, "Service Unavailable")
        return _response(*status, self.message(denial))

    # -- connections --------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: its request head, the policy, then the tunnel."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, OSError) as exc:
            logger.debug("egress: connection ended: %s", exc)
        except asyncio.CancelledError:
            # Only close() cancels a connection. A server's callback task that ends
            # cancelled is logged as an error by asyncio (3.11): shown in a notebook's cell.
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            await _close(writer)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._waiting >= self.max_tunnels:
            logger.warning("egress of butler %s: too many request heads at once", self.butler)
            await _send(writer, _response(503, "Service Unavailable", "spawnkit: proxy busy"))
            return
        self._waiting += 1
        try:
            request = await self._request(reader)
        except _BadRequest as exc:
            await _send(writer, _response(400, "Bad Request", f"spawnkit: {exc}"))
            return
        finally:
            self._waiting -= 1
        try:
            decided = await self.addresses_for(request.host, request.port)
        except _BadRequest as exc:
            await _send(writer, _response(400, "Bad Request", f"spawnkit: {exc}"))
            return
        except _Unreachable as exc:
            await _send(writer, _response(502, "Bad Gateway", f"spawnkit: {exc}"))
            return
        if isinstance(decided, Denial):
            await _send(writer, self._deny(decided))
            return
        if self.tunnels >= self.max_tunnels:
            await _send(writer, self._deny(Denial(request.host, request.port, TOO_MANY)))
            return
        self.tunnels += 1
        try:
            await self._tunnel(request, decided, reader, writer)
        finally:
            self.tunnels -= 1

    async def _request(self, reader: asyncio.StreamReader) -> _Request:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as exc:
            raise _BadRequest(f"request head over {MAX_HEAD_BYTES} bytes") from exc
        except TimeoutError as exc:
            raise _BadRequest(f"no request head within {HEAD_TIMEOUT_S:g} s") from exc
        except asyncio.IncompleteReadError as exc:
            raise _BadRequest("connection closed before a whole request head") from exc
        return parse_request(head)

    async def _tunnel(
        self,
        request: _Request,
        addresses: list[HostAddress],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        try:
            up_reader, up_writer = await _connect(addresses, request.port)
        except _Unreachable as exc:
            await _send(writer, _response(502, "Bad Gateway", f"spawnkit: {request.host}: {exc}"))
            return
        self._writers.add(up_writer)
        try:
            if request.head is None:
                await _send(writer, b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                await _send(up_writer, request.head)
            await asyncio.gather(
                _pipe(reader, up_writer, writer), _pipe(up_reader, writer, up_writer)
            )
        finally:
            self._writers.discard(up_writer)
            up_writer.transport.abort()

    async def close(self) -> None:
        """End every connection, idle or not, and wait (bounded) for their tasks."""
        for writer in list(self._writers):
            writer.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)


def parse_request(head: bytes) -> _Request:
    """A request head (up to its blank line) as what to connect to and what to send."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise _BadRequest(f"not an HTTP/1 request line: {lines[0][:100]!r}")
    method, target, version = parts
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[0] in " \t":
            raise _BadRequest(f"malformed header line {line[:100]!r}")
        headers.append((name, value.strip()))
    if method == "CONNECT":
        host, port = _host_port(target, default=None)
        return _Request(method, host, port, None)
    return _forwarded(method, target, version, headers)


def _forwarded(method: str, target: str, version: str, headers: list[tuple[str, str]]) -> _Request:
    url = urlsplit(target)
    if url.scheme.lower() != "http" or not url.netloc:
        raise _BadRequest(
            f"{method} {target[:100]}: a proxy request needs an absolute http:// URI "
            "(https goes through CONNECT)"
        )
    if "@" in url.netloc:
        raise _BadRequest("a URI with credentials in its host part is not forwarded")
    host, port = _host_port(url.netloc, default=80)
    hosts = [value for name, value in headers if name.lower() == "host"]
    if len(hosts) > 1:
        raise _BadRequest("more than one Host header")
    if hosts and _host_port(hosts[0], default=80) != (host, port):
        raise _BadRequest(f"Host {hosts[0][:100]!r} is not the URI's host {url.netloc!r}")
    path = url.path or "/"
    if url.query:
        path += f"?{url.query}"
    kept = [(n, v) for n, v in headers if n.lower() not in _HOP_HEADERS]
    if not hosts:
        kept.insert(0, ("Host", url.netloc))
    lines = [f"{method} {path} {version}", *(f"{n}: {v}" for n, v in kept), "Connection: close"]
    return _Request(method, host, port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def _host_port(text: str, default: int | None) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (the port optional when there is a default)."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
        if not sep or (rest and port_text is None):
            raise _BadRequest(f"malformed host {text[:100]!r}")
    else:
        host, sep, port_text_ = text.rpartition(":")
        host, port_text = (host, port_text_) if sep else (port_text_, None)
    if port_text is None or port_text == "":
        if default is None:
            raise _BadRequest(f"CONNECT {text[:100]!r} names no port")
        return normal_name(host), default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _BadRequest(f"bad port in {text[:100]!r}")
    if not host:
        raise _BadRequest(f"no host in {text[:100]!r}")
    return normal_name(host), int(port_text)


async def _connect(
    addresses: list[HostAddress], port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    errors = []
    for address in addresses:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(str(address), port)
        except (OSError, TimeoutError) as exc:
            errors.append(f"{address}: {exc or 'timed out'}")
    raise _Unreachable("could not connect (" + "; ".join(errors) + ")")


async def _pipe(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, source_writer: asyncio.StreamWriter
) -> None:
    """Copy ``source`` to ``sink`` until end of file, then half-close ``sink``.

    On an error either side is dead: both are aborted, which ends the other direction too.
    """
    try:
        while data := await source.read(CHUNK_BYTES):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (ConnectionError, OSError) as exc:
        logger.debug("egress: tunnel ended: %s", exc)
        sink.transport.abort()
        source_writer.transport.abort()


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close gracefully (what was written still reaches the client), within a bound."""
    writer.close()
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await writer.wait_closed()
    except (ConnectionError, OSError, TimeoutError):
        writer.transport.abort()


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


def _response(status: int, reason: str, body: str) -> bytes:
    data = (body + "\n").encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + data


@contextlib.asynccontextmanager
async def egress_proxy(
    allow_hosts: Iterable[str],
    uds: Path,
    *,
    butler: str,
    config_file: str | Path | None = None,
    on_denied: Callable[[Denial], None] | None = None,
    resolver: Resolver = resolve_on_host,
    allow_private: bool = False,
    max_tunnels: int = MAX_TUNNELS,
) -> AsyncIterator[EgressProxy]:
    """Serve a run's egress proxy on the unix socket ``uds`` while the block runs.

    Only a unix socket: on ``127.0.0.1`` every local user could use the proxy. The socket
    is made 0600 and removed at the end, with every connection still open.
    """
    proxy = EgressProxy(
        allow_hosts, butler=butler, config_file=config_file, on_denied=on_denied,
        resolver=resolver, allow_private=allow_private, max_tunnels=max_tunnels,
    )  # fmt: skip
    server = await asyncio.start_unix_server(proxy.handle, path=str(uds), limit=MAX_HEAD_BYTES)
    try:
        uds.chmod(0o600)  # noqa: ASYNC240 - one chmod: microseconds
        yield proxy
    finally:
        server.close()
        await proxy.close()
        with contextlib.suppress(FileNotFoundError):
            uds.unlink()  # noqa: ASYNC240 - one unlink: microseconds
