"""The small interface a session store's database sits behind, and what picks one.

:class:`~spawnkit.store.SessionStore` writes every query once, in the SQL both engines
speak (``?`` placeholders, ``ON CONFLICT``, ``COALESCE``), against a :class:`Backend`:
run a read, run a write transaction, turn the engine's errors into the store's typed
ones, close. Two backends implement it: SQLite, the embedded default (one file under
``$SPAWNKIT_HOME``, :mod:`spawnkit.store`), and PostgreSQL, a store a team shares
(:mod:`spawnkit.store.postgres`). Each one creates and migrates its own schema when it
opens; nothing else differs, so one test suite runs on both.

A store is named by a path or a ``postgresql://`` (or ``postgres://``) URL; a URL of any
other scheme (``mysql://``, ``sqlite://``) is refused, never taken for a relative path
(``mysql://x/y`` would otherwise become a SQLite file ``./mysql:/x/y``). URLs carry
passwords, and no message, log line or record ever shows one: :func:`redact_url` is what
they print.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NamedTuple, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import StoreError

Row = Mapping[str, Any]
Params = Sequence[object]

URL_SCHEMES = ("postgresql", "postgres")
SERVER_SCHEMA = "spawnkit"
"""The PostgreSQL schema a server store's tables live in (here, not in
:mod:`spawnkit.store.postgres`, so that ``spawnkit.history``'s reads name it without
importing the store's writer and its connection pool)."""
# `scheme://`, as RFC 3986 spells a scheme: what a store target must not be unless supported.
_URL_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def is_postgres_url(target: str | Path) -> bool:
    """Whether ``target`` names a PostgreSQL store rather than a SQLite file.

    A string that is a URL of another scheme is neither: a StoreError naming what is
    supported.
    """
    if not isinstance(target, str):
        return False
    url = _URL_RE.match(target)
    if url is not None and url.group(1).lower() not in URL_SCHEMES:
        raise StoreError(
            f"unsupported session store {redact_url(target)!r}: use a SQLite file path "
            "or a postgresql:// (or postgres://) URL"
        )
    return target.split(":", 1)[0].lower() in URL_SCHEMES


def redact_url(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` parameter)."""
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    netloc = f"{user.split(':', 1)[0]}@{host}" if at and ":" in user else parts.netloc
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if k.lower() != "password"]
    query = urlencode(kept) if len(kept) < len(pairs) else parts.query
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class Transaction(Protocol):
    """One write transaction: committed when its block ends, rolled back on an exception."""

    # Whether the engine runs INSERT, UPDATE and DELETE inside WITH (PostgreSQL; SQLite
    # does not): a write of several steps can then be one statement, one round trip.
    writable_ctes: bool

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; how many rows it changed."""
        ...

    def executemany(self, sql: str, rows: Sequence[Params]) -> None: ...

    def query(self, sql: str, params: Params = ()) -> Sequence[Row]: ...


class SlotClaim(Protocol):
    """One run's claim on a slot of a limit that holds for every host sharing the store.

    Holds a dedicated connection while it lives; a slot is held until :meth:`release`, or
    until the connection dies with its process or host.
    """

    def try_acquire(self) -> int | None:
        """Take a free slot if there is one: its number, or None when all are held."""
        ...

    def release(self) -> None: ...


class Admission(Protocol):
    """A butler's admission places across every host sharing the store: a run holds one
    from its acceptance until its record is closed, queued or running, so ``places``
    (``max_concurrent_sessions + max_queued_sessions``) bounds what all hosts accepted.

    One connection per host and butler holds this host's places; when the host's process
    dies, its places go with that connection.
    """

    def enter(self, places: int, below: int | None = None) -> AdmissionTicket:
        """Take a free place of ``places``; with ``below``, only while fewer than ``below``
        places are held (a run slot is free). Serialised across hosts."""
        ...

    def leave(self, place: int) -> None: ...


class AdmissionTicket(NamedTuple):
    """What :meth:`Admission.enter` found: the place taken (None: refused), and how many
    runs held a run slot and a place across the hosts when it looked."""

    place: int | None
    running: int
    held: int


class Backend(Protocol):
    """A database a :class:`~spawnkit.store.SessionStore` reads and writes.

    Its schema is created and migrated when it is constructed. ``location`` names it in
    messages (a path, or a URL without password); ``path`` is the SQLite file, None for
    a server. ``local_dir`` is this machine's folder for what never goes to a shared
    database: the credentials file (:mod:`spawnkit.config.credential_file`).
    """

    location: str
    path: Path | None
    local_dir: Path
    errors: tuple[type[Exception], ...]

    @property
    def url(self) -> str | None:
        """The server's URL, password included (never printed): None for SQLite."""
        ...

    def query(self, sql: str, params: Params = ()) -> Sequence[Row]:
        """Run one read; its rows, as mappings from column name to value."""
        ...

    def transaction(self, single: bool = False) -> AbstractContextManager[Transaction]:
        """A write transaction. ``single``: the block runs one statement, which a server
        then commits on its own (one round trip instead of three)."""
        ...

    def error(self, exc: Exception) -> StoreError:
        """The typed error for one of :attr:`errors` raised by this database."""
        ...

    def close(self) -> None: ...

    def slot_claim(self, name: str, capacity: int) -> SlotClaim | None:
        """A claim on one of ``capacity`` slots named ``name`` shared by every host, or
        None where the store is one host's (SQLite: the spawner's own limit is enough)."""
        ...

    def admission(self, name: str) -> Admission | None:
        """The admission places named ``name`` shared by every host, or None where the
        store is one host's (SQLite: the spawner's own queue is the limit)."""
        ...


def statements(script: str) -> Iterator[str]:
    """The statements of a ``;``-separated script; a ``;`` counts only outside a
    ``$$``-quoted body (a PostgreSQL function's), which no other statement of ours holds."""
    found: list[str] = []
    current = ""
    for index, chunk in enumerate(script.split("$$")):
        if index % 2:  # inside $$ … $$
            current += f"$${chunk}$$"
            continue
        first, *rest = chunk.split(";")
        current += first
        for piece in rest:
            found.append(current)
            current = piece
    found.append(current)
    return (part for part in found if part.strip())
