"""The session store: every accepted run, its tool calls, and butler state.

One store, two engines behind one small interface (:mod:`.backend`): a SQLite file on
this machine, the default, or a PostgreSQL database a team shares (chosen by URL).
Those that need psycopg are imported only when used. The modules, by concept:

- :mod:`.session_store`: :class:`SessionStore`, what the rest of spawnkit uses, over
  :mod:`.records` (a session's record), :mod:`.writes` (a run's writes, by name),
  :mod:`.writer` (made now, or journaled while a server is away) and :mod:`.ownership`
  (which host and process own a record, leases, dispatched runs);
- :mod:`.sqlite` and :mod:`.schema`: the embedded engine and its tables;
- :mod:`.postgres` and :mod:`.advisory`: the server engine and the limits it holds
  across hosts;
- :mod:`.journal`: this machine's journal of writes a server away could not take;
- :mod:`.listen`: the feed of a PostgreSQL store's live changes;
- :mod:`.migrate`: the copy of a SQLite store into PostgreSQL;
- :mod:`.repair`: every readable row of a damaged SQLite file into a new one;
- :mod:`.pg_local`: a throw-away local PostgreSQL for demos and tests.
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
from .sqlite import (
    BUSY_TIMEOUT_MS,
    SqliteBackend,
    StoreHealth,
    WriteWouldWait,
    check_store,
    store_error,
)
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
    "WriteWouldWait",
    "check_store",
    "is_postgres_url",
    "statements",
    "store_error",
    "utcnow",
]
