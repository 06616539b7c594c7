"""The certificates that make a spawnkit Dask cluster answer only its own members.

A Dask worker runs whatever function it is sent, as the user it runs as; a scheduler
hands it whatever any client submits. Over ``tcp://`` anyone who reaches either port can
do both. So spawnkit's clusters speak ``tls://`` with mutual authentication
(``distributed.security.Security``, ``require_encryption``): every scheduler, worker and
client presents a certificate signed by the cluster's own CA, and a peer without one is
refused during the handshake, before any message is read.

The credentials live on disk in ``$SPAWNKIT_HOME/cluster/`` (a 0700 folder of 0600 files,
made on first use and kept across starts, like an SSH key): the CA's certificate and key,
and one certificate and key that every member of the cluster uses (as
``Security.temporary()`` does in memory). Another host joins by receiving a copy
(:func:`export_credentials`: the folder without the CA's key), in its own
``$SPAWNKIT_HOME/cluster/`` or a folder named with ``--credentials``. Files that others
could read or replace are refused: whoever can replace the CA certificate can let
themselves in.
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..home import spawnkit_home

FOLDER = "cluster"
CA_CERT, CA_KEY, CERT, KEY = "ca.pem", "ca-key.pem", "cert.pem", "key.pem"
# What another host needs to join (never the CA's key: it makes new members).
SHARED = (CA_CERT, CERT, KEY)
SECURE_SCHEME = "tls"
# Long-lived on purpose: kept on disk like an SSH key; rotate by removing the folder.
VALID_DAYS = 3650
# The name in the certificates; Dask checks the CA signature, not host names.
COMMON_NAME = "spawnkit-cluster"


class ClusterSecurityError(ConfigError):
    """Missing, unsafe or mismatched cluster credentials, or an unsecured address."""


@dataclass(frozen=True)
class ClusterCredentials:
    """A folder of cluster credentials: the CA certificate, and the members' certificate
    and key (also the CA's key, on the host that made them)."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / CA_CERT

    @property
    def cert_file(self) -> Path:
        return self.directory / CERT

    @property
    def key_file(self) -> Path:
        return self.directory / KEY

    def security(self) -> Any:
        """The ``distributed.security.Security`` of a member, in every role, encrypted only."""
        from distributed.security import Security

        ca, cert, key = str(self.ca_file), str(self.cert_file), str(self.key_file)
        return Security(  # type: ignore[no-untyped-call]  # distributed is not typed here
            require_encryption=True, tls_ca_file=ca,
            tls_client_cert=cert, tls_client_key=key,
            tls_scheduler_cert=cert, tls_scheduler_key=key,
            tls_worker_cert=cert, tls_worker_key=key,
        )  # fmt: skip

    def dask_options(self) -> list[str]:
        """The options of ``dask scheduler`` and ``dask worker`` that use these credentials."""
        return [
            "--tls-ca-file", str(self.ca_file), "--tls-cert", str(self.cert_file),
            "--tls-key", str(self.key_file),
        ]  # fmt: skip


def default_directory() -> Path:
    """``$SPAWNKIT_HOME/cluster``."""
    return spawnkit_home() / FOLDER


def load_credentials(directory: Path | None = None) -> ClusterCredentials | None:
    """The credentials in ``directory`` (default: :func:`default_directory`), checked; None
    when the folder does not exist. Raises :class:`ClusterSecurityError` for a folder that
    is incomplete or that others could read or change."""
    folder = directory if directory is not None else default_directory()
    if not folder.exists():
        return None
    _check_private(folder, is_dir=True)
    for name in SHARED:
        path = folder / name
        if not path.is_file():
            raise ClusterSecurityError(
                f"cluster credentials {folder} have no {name}: copy the folder again from "
                "the scheduler's host (spawnkit scheduler --export-credentials DIR)"
            )
        _check_private(path, is_dir=False)
    return ClusterCredentials(folder)


def ensure_credentials(directory: Path | None = None) -> ClusterCredentials:
    """The credentials in ``directory`` (default: :func:`default_directory`), made there first
    when the folder does not exist yet: a new CA, and the members' certificate signed by it."""
    folder = directory if directory is not None else default_directory()
    found = load_credentials(folder)
    if found is not None:
        return found
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Written beside it, then renamed: a concurrent start finds all of it or nothing.
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for name, data in _new_credentials().items():
            _write_private(staging / name, data)
        try:
            staging.rename(folder)
        except OSError:  # made by another start meanwhile: theirs is the cluster's
            if not folder.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    found = load_credentials(folder)
    assert found is not None
    return found


def export_credentials(credentials: ClusterCredentials, target: Path) -> Path:
    """Copy what another host needs to join (not the CA's key) into ``target``, a new or
    empty folder, made 0700 with 0600 files."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ClusterSecurityError(f"{target} exists and is not an empty folder")
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    target.chmod(0o700)
    for name in SHARED:
        _write_private(target / name, (credentials.directory / name).read_bytes())
    return target


def _check_private(path: Path, *, is_dir: bool) -> None:
    info = path.stat()
    if is_dir != stat.S_ISDIR(info.st_mode):
        raise ClusterSecurityError(f"{path} is not a {'folder' if is_dir else 'file'}")
    if info.st_mode & 0o077 or info.st_uid != os.geteuid():
        mode = "700" if is_dir else "600"
        raise ClusterSecurityError(
            f"cluster credentials {path} can be read or changed by other users "
            f"(mode {stat.S_IMODE(info.st_mode):o}, owner uid {info.st_uid}): "
            f"make it yours and chmod {mode} {path}"
        )


def _write_private(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)


def _new_credentials() -> dict[str, bytes]:
    """A CA, and one certificate and key it signed for every member (client, scheduler and
    worker alike, as ``distributed.security.Security.temporary()`` makes)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{COMMON_NAME} CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(COMMON_NAME)]), False)
        .add_extension(
            # Each member is a server (scheduler, worker) and a client (of the scheduler).
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    def private(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )  # fmt: skip

    return {
        CA_CERT: ca_cert.public_bytes(serialization.Encoding.PEM),
        CA_KEY: private(ca_key),
        CERT: cert.public_bytes(serialization.Encoding.PEM),
        KEY: private(key),
    }


# -- addresses ------------------------------------------------------------------------------


def scheme_of(address: str) -> str | None:
    """``tls`` of ``tls://host:8786``; None for a bare ``host:8786``."""
    scheme, sep, _ = address.partition("://")
    return scheme.lower() if sep else None


def is_secured(address: str) -> bool:
    return scheme_of(address) == SECURE_SCHEME


def host_of(address: str) -> str:
    """The host of a scheduler address (``tls://h:8786``, ``h:8786``, ``[::1]:8786``)."""
    rest = address.partition("://")[2] if "://" in address else address
    return urlsplit(f"//{rest}").hostname or ""


def checked_scheduler_address(address: str) -> str:
    """``address`` if it can name a Dask scheduler (``[tcp://|tls://]host:port``), else a
    ConfigError at once: a typo must not cost a connection attempt, nor leave a record."""
    text = address.strip()
    scheme = scheme_of(text)
    rest = text.partition("://")[2] if scheme is not None else text
    problem = None
    if scheme is not None and scheme not in ("tcp", SECURE_SCHEME):
        problem = f"the scheme {scheme}:// is not tcp:// or {SECURE_SCHEME}://"
    else:
        try:
            parts = urlsplit(f"//{rest}")
            port = parts.port
        except ValueError:
            port, parts = None, None
        if parts is None or not parts.hostname or parts.path or parts.query or parts.fragment:
            problem = "it is not host:port"
        elif port is None or port == 0:
            problem = "it has no port"
    if problem is not None:
        raise ConfigError(
            f"{address!r} is not a Dask scheduler's address ({problem}): give "
            "tcp://host:8786 or tls://host:8786 (spawnkit scheduler prints it)"
        )
    return text


def client_address(address: str, credentials: ClusterCredentials | None) -> str:
    """The address a client connects to: a bare ``host:port`` is ``tls://`` when this host
    has credentials. With credentials, a ``tcp://`` address is an error rather than a
    silent change of protocol: the scheduler at that address speaks plain TCP, and a
    client holding the cluster's credentials expects the secured one."""
    scheme = scheme_of(address)
    if credentials is None:
        if scheme == SECURE_SCHEME:
            raise ClusterSecurityError(
                f"{address} is a secured scheduler and this host has no cluster credentials "
                f"in {default_directory()}: copy them from the scheduler's host "
                "(spawnkit scheduler --export-credentials DIR)"
            )
        return address
    if scheme is None:
        return f"{SECURE_SCHEME}://{address}"
    if scheme != SECURE_SCHEME:
        raise ClusterSecurityError(
            f"{address} is not a secured scheduler, and this host has cluster credentials in "
            f"{credentials.directory}: use the scheduler's tls:// address "
            "(spawnkit scheduler prints it)"
        )
    return address


def listen_host(scheduler: str) -> str:
    """The one local address a worker of ``scheduler`` should listen on: the one this host
    reaches the scheduler from (127.0.0.1 for a scheduler on loopback), not every interface."""
    host = host_of(scheduler) or "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, 8786, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise ClusterSecurityError(f"cannot resolve the scheduler's host {host!r}: {exc}") from exc
    family, kind, _, _, where = infos[0]
    with socket.socket(family, kind) as probe:
        probe.connect(where)  # UDP: no packet is sent, the kernel only picks a route
        return str(probe.getsockname()[0])


# -- `spawnkit scheduler` -------------------------------------------------------------------


def scheduler_command(
    host: str, port: int, credentials: ClusterCredentials, options: Sequence[str] = ()
) -> list[str]:
    """``dask scheduler`` for this Python on ``tls://HOST:PORT`` with ``credentials``
    (``--tls-*`` make Dask require encryption), its dashboard on loopback unless
    ``options`` place it."""
    placed = any(o.startswith("--dashboard") or o == "--no-dashboard" for o in options)
    dashboard = [] if placed else ["--dashboard-address", "127.0.0.1:8787"]
    return [
        sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", host,
        "--port", str(port), "--protocol", SECURE_SCHEME, *credentials.dask_options(),
        *dashboard, *options,
    ]  # fmt: skip
