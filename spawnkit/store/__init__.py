"""The session store: every accepted run, its tool calls, and butler state.

One store, two engines behind one small interface (:mod:`.backend`): a SQLite file on
this machine, the default, or a PostgreSQL database a team shares (:mod:`.postgres`,
chosen by URL). :class:`SessionStore` is what the rest of spawnkit uses; the modules
beside it are its parts and its tools: the journal of writes a server away could not
take (:mod:`.journal`), the feed of a PostgreSQL store's live changes (:mod:`.listen`),
the copy of a SQLite store into PostgreSQL (:mod:`.migrate`), the rescue of a damaged
SQLite file (:mod:`.repair`), and a throw-away local PostgreSQL for demos and tests
(:mod:`.pg_local`). Those that need psycopg are imported only when used.
"""

from .backend import (
    Admission,
    Backend,
    Params,
    Row,
    SlotClaim,
    Transaction,
    is_postgres_url,
    statements,
)
from .journal import StoreJournal
from .records import SessionRecord, utcnow
from .schema import SCHEMA_VERSION
from .session_store import SessionStore
from .sqlite import BUSY_TIMEOUT_MS, SqliteBackend, StoreHealth, check_store, store_error
from .writer import RETRY_FIRST_S, RETRY_MAX_S

__all__ = [
    "BUSY_TIMEOUT_MS",
    "RETRY_FIRST_S",
    "RETRY_MAX_S",
    "SCHEMA_VERSION",
    "Admission",
    "Backend",
    "Params",
    "Row",
    "SessionRecord",
    "SessionStore",
    "SlotClaim",
    "SqliteBackend",
    "StoreHealth",
    "StoreJournal",
    "Transaction",
    "check_store",
    "is_postgres_url",
    "statements",
    "store_error",
    "utcnow",
]
