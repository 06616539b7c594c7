"""Who may call a butler's MCP server: a bearer secret per run, and the owner's token.

Every run gets a fresh random secret that its CLI sends as ``Authorization: Bearer
<secret>`` (:meth:`AccessTable.grant`); the secret is withdrawn when the run ends
(:meth:`AccessTable.revoke`), so a finished run's secret is refused. A secret names
its run: the server records calls against the session key the secret was granted for,
never against a session id a request merely puts in its URL.

The owner token lives in a file only the user can read
(``$SPAWNKIT_HOME/mcp/<butler>-<port>.token``, mode 0600, in a 0700 folder). ``spawnkit
serve`` creates it so the user's own MCP clients can call a served butler, and so a
second spawnkit process (``spawnkit run --external-mcp``) can ask the served butler for
per-run secrets over HTTP (:class:`RemoteAccess`).

The table holds SHA-256 digests, never secrets, and checks a presented secret against
every entry with :func:`hmac.compare_digest`, without stopping at a match, so neither
its memory nor its timing gives a secret away. Secrets are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from ..errors import ConfigError
from ..home import spawnkit_home

logger = logging.getLogger(__name__)

SECRET_BYTES = 32
# A served butler's route that mints and withdraws run secrets for the owner.
GRANTS_PATH = "/spawnkit/grants"
# Bounds: live grants (runs plus owner tokens), and transport sessions tied to callers.
MAX_GRANTS = 4096
MAX_BINDINGS = 16_384
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32,256}")
_REMOTE_TIMEOUT_S = 10.0


class McpAccessError(ConfigError):
    """An owner token file is unusable, or a served butler would not grant a run secret."""


@dataclass(frozen=True)
class Caller:
    """Who an authenticated request comes from: one run, or the owner."""

    grant_id: int
    # The run's session key (the one its MCP URL carries); None for the owner.
    session_key: str | None

    @property
    def is_owner(self) -> bool:
        return self.session_key is None


@dataclass(frozen=True)
class _Grant:
    digest: bytes
    caller: Caller
    expires: float | None  # time.monotonic(); None: until revoked


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class McpAccess(Protocol):
    """What the spawner needs: a secret for each run, withdrawn when the run ends."""

    async def grant(self, session_key: str, ttl_s: float | None = None) -> str: ...

    async def revoke(self, secret: str) -> None: ...


class AccessTable:
    """The secrets a butler's MCP server accepts right now, and the callers they name.

    Shared by the spawner (which grants and revokes) and the server (which
    authenticates); safe to use from several threads. The server also ties the
    transport's own session ids (an SSE connection, a streamable HTTP session) to
    the caller that opened them, so one caller cannot speak on another's.
    """

    def __init__(self, max_grants: int = MAX_GRANTS) -> None:
        self.max_grants = max_grants
        self._grants: list[_Grant] = []
        self._bindings: OrderedDict[str, int] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._grants)

    # -- granting ------------------------------------------------------------------------

    async def grant(self, session_key: str, ttl_s: float | None = None) -> str:
        """A fresh secret for the run whose MCP URL carries ``session_key``."""
        if not session_key:
            raise ValueError("a run secret needs the run's session key")
        secret = new_secret()
        self._add(secret, session_key, ttl_s)
        return secret

    async def revoke(self, secret: str) -> None:
        """Withdraw a secret and whatever transport sessions it opened."""
        self.remove(secret)

    def allow_owner(self, token: str) -> None:
        """Accept the owner's token (from the token file) until :meth:`remove`."""
        self._add(token, None, None)

    def _add(self, secret: str, session_key: str | None, ttl_s: float | None) -> None:
        expires = time.monotonic() + ttl_s if ttl_s is not None else None
        with self._lock:
            self._expire()
            if len(self._grants) >= self.max_grants:
                raise McpAccessError(
                    f"the MCP server already holds {self.max_grants} live secrets; refusing another"
                )
            caller = Caller(next(self._ids), session_key)
            self._grants.append(_Grant(_digest(secret), caller, expires))

    def remove(self, secret: str) -> None:
        digest = _digest(secret)
        with self._lock:
            gone = {
                g.caller.grant_id for g in self._grants if hmac.compare_digest(g.digest, digest)
            }
            self._grants = [g for g in self._grants if g.caller.grant_id not in gone]
            self._unbind(gone)

    def _expire(self) -> None:
        now = time.monotonic()
        stale = {
            g.caller.grant_id for g in self._grants if g.expires is not None and g.expires < now
        }
        if stale:
            self._grants = [g for g in self._grants if g.caller.grant_id not in stale]
            self._unbind(stale)

    def _unbind(self, grant_ids: set[int]) -> None:
        for transport_id in [t for t, g in self._bindings.items() if g in grant_ids]:
            del self._bindings[transport_id]

    # -- checking ------------------------------------------------------------------------

    def authenticate(self, authorization: str | None) -> Caller | None:
        """The caller an ``Authorization`` header value proves, or None.

        Every live entry is compared in constant time, and the loop never stops
        early: how long this takes says nothing about how close a guess was.
        """
        token = bearer(authorization)
        if token is None:
            return None
        digest = _digest(token)
        found: Caller | None = None
        with self._lock:
            self._expire()
            for entry in self._grants:
                if hmac.compare_digest(entry.digest, digest):
                    found = entry.caller
        return found

    def bind(self, transport_id: str, caller: Caller) -> None:
        """Tie a transport session id (SSE connection, ``mcp-session-id``) to its opener."""
        with self._lock:
            self._bindings[transport_id] = caller.grant_id
            self._bindings.move_to_end(transport_id)
            while len(self._bindings) > MAX_BINDINGS:
                self._bindings.popitem(last=False)

    def bound_to(self, transport_id: str) -> int | None:
        """The grant id that opened ``transport_id``, or None when unknown."""
        with self._lock:
            return self._bindings.get(transport_id)


# -- the owner token file --------------------------------------------------------------------


def owner_token_path(butler: str, port: int) -> Path:
    return spawnkit_home() / "mcp" / f"{butler}-{port}.token"


def owner_token(path: Path, *, create: bool) -> str:
    """The token in ``path``; with ``create``, a new one when the file does not exist.

    The folder is made (or tightened to) 0700 and the file is created 0600 with
    ``O_EXCL``; an existing file that others could read, or that another user
    owns, is refused rather than trusted.
    """
    folder = path.parent
    if create:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
        if info.st_uid != os.geteuid():
            raise McpAccessError(f"the MCP token folder {folder} belongs to another user")
        if stat.S_IMODE(info.st_mode) & 0o077:
            folder.chmod(0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(new_secret() + "\n")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise McpAccessError(f"no MCP token file {path}: is the butler served?") from None
    except OSError as exc:
        raise McpAccessError(f"cannot read the MCP token file {path}: {exc.strerror}") from None
    with os.fdopen(fd, encoding="ascii", errors="replace") as fh:
        info = os.fstat(fh.fileno())
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise McpAccessError(
                f"the MCP token file {path} is readable by others or not yours; remove it "
                "and start the server again to get a new one"
            )
        token = fh.read(1024).strip()
    if not _TOKEN_RE.fullmatch(token):
        raise McpAccessError(f"the MCP token file {path} holds no valid token; remove it")
    return token


class RemoteAccess:
    """Run secrets minted by a butler served in another process, with its owner token.

    For ``spawnkit run --external-mcp``: the runs call the served butler, so that
    server must know their secrets. Each grant carries a time to live, so a secret
    whose run died before withdrawing it still expires.
    """

    def __init__(self, base_url: str, token: str) -> None:
        self.url = base_url.rstrip("/") + GRANTS_PATH
        self._headers = {"Authorization": f"Bearer {token}"}

    async def grant(self, session_key: str, ttl_s: float | None = None) -> str:
        body = {"session_key": session_key, "ttl_s": ttl_s}
        try:
            async with httpx.AsyncClient(timeout=_REMOTE_TIMEOUT_S) as client:
                response = await client.post(self.url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise McpAccessError(f"cannot reach the MCP server at {self.url}: {exc}") from None
        if response.status_code != 201:
            raise McpAccessError(
                f"the MCP server at {self.url} refused a run secret "
                f"(HTTP {response.status_code}); is the token file current?"
            )
        try:
            secret = response.json().get("secret")
        except (ValueError, AttributeError):
            secret = None
        if not isinstance(secret, str) or not _TOKEN_RE.fullmatch(secret):
            raise McpAccessError(f"the MCP server at {self.url} answered without a secret")
        return secret

    async def revoke(self, secret: str) -> None:
        try:
            async with httpx.AsyncClient(timeout=_REMOTE_TIMEOUT_S) as client:
                response = await client.request(
                    "DELETE", self.url, json={"secret": secret}, headers=self._headers
                )
            status = response.status_code
        except httpx.HTTPError as exc:
            status = None
            problem = type(exc).__name__
        else:
            problem = f"HTTP {status}"
        if status != 204:
            logger.warning(
                "could not withdraw a run secret at %s (%s); it expires on its own",
                self.url, problem,
            )  # fmt: skip
