"""The egress proxy (spawnkit.containment.egress) with real clients against real local servers.

The proxy serves on a unix socket, as it does for a sandboxed run. Clients reach it either
directly over that socket (raw HTTP, to read exact status lines and bodies) or through a
small TCP-to-socket bridge standing in for the namespace's forwarder, which lets the real
``curl`` use it as ``-x`` or through ``HTTPS_PROXY``. The upstream hosts are servers on
127.0.0.1 (plain HTTP, and TLS with a certificate made here for the test names); the test
names reach them through the proxy's resolver hook, never through /etc/hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import http.server
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# cryptography comes with spawnkit's own dependencies (mcp needs pyjwt[crypto]).
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from spawnkit.containment import egress
from spawnkit.containment.egress import (
    NOT_LISTED,
    PRIVATE,
    TOO_MANY,
    Denial,
    EgressProxy,
    HostRules,
    egress_proxy,
    ip_literal,
    proxy_env,
)
from spawnkit.errors import ConfigError

ALLOWED = "allowed.test"
OTHER = "other.test"
SUB = "api.allowed.test"
CLIENT_TIMEOUT_S = 60


# -- upstream servers ------------------------------------------------------------------


@dataclass
class Upstream:
    """A server on 127.0.0.1 that answers every GET and remembers what it was asked."""

    port: int
    seen: list[tuple[str, str]] = field(default_factory=list)  # (Host header, path)


def _handler(upstream_seen: list[tuple[str, str]]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            upstream_seen.append((self.headers.get("Host", ""), self.path))
            body = f"hello {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def serving(context: ssl.SSLContext | None = None) -> Iterator[Upstream]:
    seen: list[tuple[str, str]] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(seen))
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Upstream(server.server_address[1], seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path


def self_signed(folder: Path, *names: str) -> Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    paths = Certificate(folder / "cert.pem", folder / "key.pem")
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.fixture
def folder() -> Iterator[Path]:
    """A short folder (a unix socket's path has at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="sk-egress-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def http_upstream() -> Iterator[Upstream]:
    with serving() as upstream:
        yield upstream


@pytest.fixture
def certificate(folder: Path) -> Certificate:
    return self_signed(folder, ALLOWED, SUB)


@pytest.fixture
def tls_upstream(certificate: Certificate) -> Iterator[Upstream]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate.cert, certificate.key)
    with serving(context) as upstream:
        yield upstream


# -- the proxy, its resolver hook and a bridge ----------------------------------------


class NameHook:
    """The resolver hook: test names to 127.0.0.1, and which names were looked up."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        if host not in self.mapping:
            raise OSError(f"[Errno -2] Name or service not known: {host}")
        return [self.mapping[host]]


@dataclass
class Running:
    proxy: EgressProxy
    uds: Path
    denials: list[Denial]
    names: NameHook


@contextlib.asynccontextmanager
async def running(
    folder: Path,
    allow_hosts: Sequence[str],
    names: dict[str, str] | None = None,
    **options: object,
) -> AsyncIterator[Running]:
    options.setdefault("allow_private", True)  # the test names lead to 127.0.0.1
    denials: list[Denial] = []
    resolver = NameHook(names if names is not None else {ALLOWED: "127.0.0.1"})
    uds = folder / "egress.sock"
    async with egress_proxy(
        allow_hosts, uds, butler="fetcher", config_file="roster/fetcher/butler.toml",
        on_denied=denials.append, resolver=resolver, **options,  # type: ignore[arg-type]
    ) as proxy:  # fmt: skip
        yield Running(proxy, uds, denials, resolver)


@contextlib.asynccontextmanager
async def tcp_bridge(uds: Path) -> AsyncIterator[int]:
    """A TCP port on 127.0.0.1 carried to ``uds``: what the namespace's forwarder does."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.write_eof()

    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(str(uds))
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()

    server = await asyncio.start_server(carry, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@dataclass(frozen=True)
class Reply:
    status: int
    head: str
    body: str


async def ask(uds: Path, request: str) -> Reply:
    """Send one raw request over the proxy's socket and read the reply to its end."""
    reader, writer = await asyncio.open_unix_connection(str(uds))
    try:
        writer.write(request.encode("latin-1"))
        await writer.drain()
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.decode("utf-8").partition("\r\n\r\n")
    return Reply(int(head.split(" ")[1]), head, body)


def connect(target: str) -> str:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"


async def curl(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        "curl", "--silent", "--show-error", "--max-time", "30", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env if env is not None else {"PATH": os.environ["PATH"]},
    )  # fmt: skip
    async with asyncio.timeout(CLIENT_TIMEOUT_S):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def refusal(host: str, port: int) -> str:
    return (
        f"spawnkit: connect {host}:{port} refused: not in allow_hosts of butler fetcher "
        "(add it to [butler.sandbox] allow_hosts in roster/fetcher/butler.toml)\n"
    )


# -- tunnels and TLS end to end --------------------------------------------------------


async def test_an_allowed_name_tunnels_and_its_tls_handshake_completes_end_to_end(
    folder: Path, tls_upstream: Upstream, certificate: Certificate
) -> None:
    async with running(folder, [ALLOWED]) as run, tcp_bridge(run.uds) as port:
        code, out, err = await curl(
            "-x", f"http://127.0.0.1:{port}", "--cacert", str(certificate.cert),
            f"https://{ALLOWED}:{tls_upstream.port}/tls",
        )  # fmt: skip
    assert (code, out, err) == (0, "hello /tls", "")
    # The proxy resolved the name (the client did not) and the server saw the test name.
    assert run.names.asked == [ALLOWED]
    assert tls_upstream.seen == [(f"{ALLOWED}:{tls_upstream.port}", "/tls")]
    assert (run.denials, run.proxy.denied) == ([], 0)


async def test_https_proxy_variables_lead_curl_through_the_proxy_and_refusals_are_reported(
    folder: Path, tls_upstream: Upstream, certificate: Certificate
) -> None:
    names = {ALLOWED: "127.0.0.1", OTHER: "127.0.0.1"}
    async with running(folder, [ALLOWED], names) as run, tcp_bridge(run.uds) as port:
        env = {"PATH": os.environ["PATH"], **proxy_env(port)}
        ca = ("--cacert", str(certificate.cert))
        ok = await curl(*ca, f"https://{ALLOWED}:{tls_upstream.port}/ok", env=env)
        refused = await curl(*ca, f"https://{OTHER}:{tls_upstream.port}/no", env=env)
    assert ok == (0, "hello /ok", "")
    code, out, err = refused
    assert code != 0 and out == "" and "403" in err, err
    assert tls_upstream.seen == [(f"{ALLOWED}:{tls_upstream.port}", "/ok")]
    assert run.denials == [Denial(OTHER, tls_upstream.port, NOT_LISTED)]
    assert run.names.asked == [ALLOWED], "a refused name is not even looked up"


def test_proxy_env_points_both_spellings_at_the_port_and_keeps_the_doors_direct() -> None:
    env = proxy_env(4123)
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        assert env[name] == "http://127.0.0.1:4123"
    assert env["NO_PROXY"] == env["no_proxy"] == "127.0.0.1,localhost,::1"


# -- refusals ----------------------------------------------------------------------------


async def test_a_name_not_listed_gets_403_with_a_body_that_says_what_to_add(
    folder: Path, http_upstream: Upstream
) -> None:
    async with running(folder, [ALLOWED], {OTHER: "127.0.0.1"}) as run:
        reply = await ask(run.uds, connect(f"{OTHER}:{http_upstream.port}"))
        assert run.proxy.denied == 1
    assert reply.status == 403
    assert "Content-Type: text/plain; charset=utf-8" in reply.head
    assert reply.body == refusal(OTHER, http_upstream.port)
    assert run.denials == [Denial(OTHER, http_upstream.port, NOT_LISTED)]
    assert run.names.asked == [] and http_upstream.seen == []


async def test_plain_http_is_forwarded_once_with_its_host_header_checked(
    folder: Path, http_upstream: Upstream
) -> None:
    port = http_upstream.port
    async with running(folder, [ALLOWED], {ALLOWED: "127.0.0.1", OTHER: "127.0.0.1"}) as run:
        ok = await ask(
            run.uds,
            f"GET http://{ALLOWED}:{port}/page?q=1 HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n"
            "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic c2VjcmV0\r\n\r\n",
        )
        # A Host header that names another host than the URI (a way to smuggle a request
        # to a host not listed, behind a shared front) is refused before any connection.
        smuggled = await ask(
            run.uds, f"GET http://{ALLOWED}:{port}/x HTTP/1.1\r\nHost: {OTHER}:{port}\r\n\r\n"
        )
        refused = await ask(
            run.uds, f"GET http://{OTHER}:{port}/y HTTP/1.1\r\nHost: {OTHER}:{port}\r\n\r\n"
        )
        tls_in_the_clear = await ask(run.uds, f"GET https://{ALLOWED}/ HTTP/1.1\r\n\r\n")
    assert (ok.status, ok.body) == (200, "hello /page?q=1")
    assert http_upstream.seen == [(f"{ALLOWED}:{port}", "/page?q=1")]
    assert (smuggled.status, refused.status, tls_in_the_clear.status) == (400, 403, 400)
    assert "is not the URI's host" in smuggled.body
    assert refused.body == refusal(OTHER, port)
    assert "https goes through CONNECT" in tls_in_the_clear.body
    assert run.denials == [Denial(OTHER, port, NOT_LISTED)]


LOOPBACK_SPELLINGS = [
    "127.0.0.1", "2130706433", "0x7f.1", "0x7f000001", "127.1", "0177.0.0.1", "127.0.0.1.",
    "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
]  # fmt: skip


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
async def test_an_ip_literal_is_refused_in_every_spelling_unless_listed(
    folder: Path, http_upstream: Upstream, spelling: str
) -> None:
    target = f"{spelling}:{http_upstream.port}"
    async with running(folder, [ALLOWED]) as run:
        refused = await ask(run.uds, connect(target))
    assert refused.status == 403 and http_upstream.seen == []
    assert [d.reason for d in run.denials] == [NOT_LISTED]
    async with running(folder, ["127.0.0.1"]) as run:
        # Listed, the address is allowed whatever its spelling.
        allowed = await ask(
            run.uds, connect(target) + "GET /in HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert allowed.status == 200 and allowed.body.endswith("hello /in"), allowed
    assert run.denials == [] and http_upstream.seen == [("x", "/in")]


async def test_an_ipv6_loopback_literal_is_refused(folder: Path) -> None:
    async with running(folder, [ALLOWED]) as run:
        reply = await ask(run.uds, connect("[::1]:22"))
    assert reply.status == 403
    assert run.denials == [Denial("::1", 22, NOT_LISTED)]


def test_ip_literal_knows_the_spellings_a_resolver_accepts() -> None:
    for spelling in LOOPBACK_SPELLINGS[:-3]:
        assert str(ip_literal(spelling)) == "127.0.0.1", spelling
    assert str(ip_literal("[::1]")) == "::1"
    for name in ("pypi.org", "1e3", "foo.123", "08.1.1.1", "", "1.2.3.4 x"):
        assert ip_literal(name) is None, name


def test_wildcards_match_subdomains_but_not_the_name_itself() -> None:
    rules = HostRules.parse(["*.github.com", "PyPI.org.", "10.0.0.5", "[::1]"])
    for name in ("api.github.com", "a.b.github.com", "API.GitHub.com.", "pypi.org", "PYPI.ORG."):
        assert rules.allows_name(name), name
    for name in ("github.com", "evilgithub.com", "github.com.evil.org", "files.pypi.org"):
        assert not rules.allows_name(name), name
    assert rules.lists_address(ip_literal("10.0.0.5"))  # type: ignore[arg-type]
    assert rules.lists_address(ip_literal("::1"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "entry", ["", "*", "*.", "a b.org", "http://pypi.org", "pypi.org/x", "**.x"]
)
def test_an_allow_hosts_entry_that_is_no_host_is_a_config_error(entry: str) -> None:
    with pytest.raises(ConfigError, match="allow_hosts"):
        HostRules.parse([entry])


async def test_a_wildcard_rule_tunnels_to_a_subdomain_and_refuses_the_bare_name(
    folder: Path, tls_upstream: Upstream, certificate: Certificate
) -> None:
    names = {SUB: "127.0.0.1", ALLOWED: "127.0.0.1"}
    async with (
        running(folder, ["*.allowed.test"], names) as run,
        tcp_bridge(run.uds) as port,
    ):
        proxy = ("-x", f"http://127.0.0.1:{port}", "--cacert", str(certificate.cert))
        sub = await curl(*proxy, f"https://{SUB}:{tls_upstream.port}/sub")
        bare = await curl(*proxy, f"https://{ALLOWED}:{tls_upstream.port}/bare")
    assert sub == (0, "hello /sub", "")
    assert bare[0] != 0 and "403" in bare[2]
    assert run.denials == [Denial(ALLOWED, tls_upstream.port, NOT_LISTED)]


async def test_a_listed_name_that_resolves_to_loopback_or_metadata_is_refused(
    folder: Path, http_upstream: Upstream
) -> None:
    """The DNS-rebinding guard: a name is no way into the host's own services."""
    names = {ALLOWED: "127.0.0.1", SUB: "169.254.169.254"}
    target = f"{ALLOWED}:{http_upstream.port}"
    async with running(folder, [ALLOWED, SUB], names, allow_private=False) as run:
        rebound = await ask(run.uds, connect(target))
        metadata = await ask(run.uds, connect(f"{SUB}:80"))
    assert (rebound.status, metadata.status) == (403, 403)
    assert "resolves to 127.0.0.1, a loopback, link-local or metadata address" in rebound.body
    assert [d.reason for d in run.denials] == [PRIVATE, PRIVATE]
    assert run.denials[1].address == "169.254.169.254"
    assert http_upstream.seen == []
    # Listing the address itself, or a proxy made for tests, lets the name through.
    for allow_hosts, private in (([ALLOWED, "127.0.0.1"], False), ([ALLOWED], True)):
        async with running(folder, allow_hosts, names, allow_private=private) as run:
            reply = await ask(run.uds, connect(target) + "GET /p HTTP/1.0\r\n\r\n")
        assert reply.status == 200 and reply.body.endswith("hello /p")


# -- bounds ------------------------------------------------------------------------------


async def test_tunnels_over_the_limit_are_refused_and_the_limit_frees_as_they_close(
    folder: Path, http_upstream: Upstream
) -> None:
    target = f"{ALLOWED}:{http_upstream.port}"
    async with running(folder, [ALLOWED], max_tunnels=3) as run:
        held = []
        for _ in range(3):
            reader, writer = await asyncio.open_unix_connection(str(run.uds))
            writer.write(connect(target).encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLIENT_TIMEOUT_S)
            assert head.startswith(b"HTTP/1.1 200 ")
            held.append(writer)
        flood = [await ask(run.uds, connect(target)) for _ in range(3)]
        assert [reply.status for reply in flood] == [503] * 3
        assert flood[0].body == (
            f"spawnkit: connect {target} refused: {TOO_MANY} (at most 3 at once for a run)\n"
        )
        assert [d.reason for d in run.denials] == [TOO_MANY] * 3
        held.pop().close()
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            while run.proxy.tunnels > 2:
                await asyncio.sleep(0.01)
        again = await ask(run.uds, connect(target) + "GET /again HTTP/1.0\r\n\r\n")
        assert again.status == 200 and again.body.endswith("hello /again")
        for writer in held:
            writer.close()


async def test_a_head_too_large_or_too_slow_is_cut(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(egress, "HEAD_TIMEOUT_S", 0.5)
    async with running(folder, [ALLOWED]) as run:
        huge = await ask(
            run.uds, connect(f"{ALLOWED}:443")[:-2] + "X: " + "y" * 20_000 + "\r\n\r\n"
        )
        reader, writer = await asyncio.open_unix_connection(str(run.uds))
        writer.write(b"CONNECT allowed.test:443 HTTP/1.1\r\n")  # and nothing more
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            slow = await reader.read()
        writer.close()
    assert huge.status == 400 and "request head over 16384 bytes" in huge.body
    assert slow.startswith(b"HTTP/1.1 400 ") and b"no request head within 0.5 s" in slow
    assert run.denials == []


async def test_leaving_the_proxy_closes_open_tunnels_and_removes_its_socket(
    folder: Path, http_upstream: Upstream
) -> None:
    async with running(folder, [ALLOWED]) as run:
        reader, writer = await asyncio.open_unix_connection(str(run.uds))
        writer.write(connect(f"{ALLOWED}:{http_upstream.port}").encode())
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLIENT_TIMEOUT_S)
        assert run.proxy.tunnels == 1
        assert (run.uds.stat().st_mode & 0o777) == 0o600
    async with asyncio.timeout(CLIENT_TIMEOUT_S):
        assert await reader.read() == b""  # the idle tunnel was closed, not left behind
    writer.close()
    assert not run.uds.exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
    reason="needs root (to act as the user nobody), setpriv and /usr/bin/python3",
)
async def test_another_local_user_cannot_use_the_proxy(folder: Path) -> None:
    folder.chmod(0o755)  # noqa: ASYNC240 - so only the socket's own mode stands in the way
    async with running(folder, [ALLOWED]) as run:
        proc = await asyncio.create_subprocess_exec(
            "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
            "/usr/bin/python3", "-c",
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    print('refused')\n"
            "else:\n    print('connected')",
            str(run.uds), stdout=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"}, cwd="/",
        )  # fmt: skip
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            out, _ = await proc.communicate()
    assert out.decode().strip() == "refused"


# -- into the run's events ---------------------------------------------------------------


async def test_refusals_reach_the_runs_events_naming_the_one_tool_call_in_progress(
    folder: Path, http_upstream: Upstream
) -> None:
    """The proxy's on_denied into the spawner's collector: a NetworkDenied event each,
    counted, the host redacted like any event, the tool call named only when one is open."""
    from datetime import UTC, datetime

    from spawnkit.events import NetworkDenied, RunEvent, ToolCallStarted
    from spawnkit.redaction import Redactor
    from spawnkit.result import ToolCall
    from spawnkit.run.collector import Collector as _Collector

    events: list[RunEvent] = []
    secret = "sk-live-0123456789abcdef"
    redactor = Redactor({"OPENAI_API_KEY": secret})
    config = "roster/x/butler.toml"
    collector = _Collector("s-1", [events.append], redactor, config_file=Path(config))
    now = datetime.now(UTC)
    bash = ToolCall.start("c1", "Bash", {"command": "curl ..."}, now)
    uds = folder / "egress.sock"
    async with egress_proxy(
        [ALLOWED], uds, butler="x", on_denied=collector.network_denied,
        resolver=NameHook({}), allow_private=True,
    ):  # fmt: skip
        await ask(uds, connect(f"{OTHER}:{http_upstream.port}"))  # no tool call open
        collector.emit(ToolCallStarted("s-1", bash))
        await ask(uds, connect(f"{secret}.{OTHER}:443"))  # a key sent out as a name
        collector.emit(ToolCallStarted("s-1", ToolCall.start("c2", "Read", {}, now)))
        await ask(uds, connect("10.1.2.3:22"))  # two open: cannot be pinned on one
    denials = [e for e in events if isinstance(e, NetworkDenied)]
    redacted = f"[redacted:OPENAI_API_KEY].{OTHER}"
    assert denials == [
        NetworkDenied("s-1", OTHER, http_upstream.port, NOT_LISTED, None, None, config),
        NetworkDenied("s-1", redacted, 443, NOT_LISTED, "Bash", "c1", config),
        NetworkDenied("s-1", "10.1.2.3", 22, NOT_LISTED, None, None, config),
    ]
    assert collector.denied == 3 and http_upstream.seen == []
