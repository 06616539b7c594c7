"""The tables of the session store, as SQLite creates them, and the steps between versions.

``PRAGMA user_version`` holds the schema a file has; :data:`MIGRATIONS` takes an older one
up to :data:`SCHEMA_VERSION` when :class:`~spawnkit.store.sqlite.SqliteBackend` opens it.
A PostgreSQL store keeps the same tables and columns under its own versions
(:mod:`spawnkit.store.postgres`).
"""

from __future__ import annotations

SCHEMA_VERSION = 16

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    butler TEXT NOT NULL,
    runtime TEXT NOT NULL,
    model TEXT,
    prompt TEXT NOT NULL,
    context TEXT,
    trigger_source TEXT NOT NULL,
    status TEXT NOT NULL,
    success INTEGER,
    error TEXT,
    error_kind TEXT,
    output TEXT,
    tool_calls TEXT,
    num_tool_calls INTEGER,
    duration_ms INTEGER,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cache_read_tokens INTEGER,
    cache_write_tokens INTEGER,
    cost_usd REAL,
    num_turns INTEGER,
    trace_id TEXT,
    runtime_session_id TEXT,
    parent_session_id TEXT,
    created_at TEXT NOT NULL,
    started_at TEXT,
    completed_at TEXT,
    owner_host TEXT,
    owner_pid INTEGER,
    owner_start TEXT,
    log_dir TEXT,
    role TEXT,
    sandbox TEXT,
    given TEXT,
    workspace TEXT,
    kind TEXT NOT NULL DEFAULT 'run',
    sources TEXT,
    budget TEXT,
    attempts TEXT,
    lease_until TEXT,
    owner_seal TEXT,
    network_denied INTEGER,
    permissions TEXT
);
CREATE INDEX IF NOT EXISTS sessions_by_created ON sessions (created_at);
CREATE INDEX IF NOT EXISTS sessions_by_butler ON sessions (butler, created_at);
CREATE INDEX IF NOT EXISTS sessions_by_runtime_id ON sessions (runtime_session_id);
CREATE INDEX IF NOT EXISTS sessions_open ON sessions (owner_host) WHERE completed_at IS NULL;
CREATE INDEX IF NOT EXISTS sessions_lease ON sessions (lease_until) WHERE completed_at IS NULL;

CREATE TABLE IF NOT EXISTS tool_calls (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    name TEXT NOT NULL,
    server TEXT,
    tool TEXT NOT NULL,
    input TEXT,
    output TEXT,
    status TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    duration_ms INTEGER,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE IF NOT EXISTS mcp_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    butler TEXT NOT NULL,
    session_key TEXT,
    session_id TEXT,
    tool TEXT NOT NULL,
    arguments TEXT,
    result TEXT,
    is_error INTEGER NOT NULL DEFAULT 0,
    called_at TEXT NOT NULL,
    duration_ms INTEGER
);
CREATE INDEX IF NOT EXISTS mcp_calls_by_session ON mcp_calls (session_id);

CREATE TABLE IF NOT EXISTS state (
    butler TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (butler, key)
);

CREATE TABLE IF NOT EXISTS episodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    butler TEXT NOT NULL,
    session_id TEXT,
    prompt TEXT NOT NULL,
    output TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_by_butler ON episodes (butler, id);
"""


# Schema 5, for spawnkit.history: the CLIs' transcripts copied in by `spawnkit history
# import` (files, their raw lines zlib-compressed, and the deduplicated usage rows, per
# machine), and a change counter that keys the columnar cache of sessions and tool calls
# (spawnkit/history/store_cache.py). That cache holds completed sessions and their tool
# calls, which the store only ever appends; the triggers count anything that changes or
# removes them, which makes the cache stale. One statement per string (trigger bodies hold
# semicolons); every one is idempotent, so a new store runs them after SCHEMA.
HISTORY_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS history_epoch (
        id INTEGER PRIMARY KEY CHECK (id = 1), token TEXT NOT NULL, epoch INTEGER NOT NULL)""",
    "INSERT OR IGNORE INTO history_epoch VALUES (1, lower(hex(randomblob(16))), 0)",
    """CREATE TRIGGER IF NOT EXISTS history_epoch_session_update AFTER UPDATE ON sessions
        WHEN OLD.completed_at IS NOT NULL
        BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
    """CREATE TRIGGER IF NOT EXISTS history_epoch_session_delete AFTER DELETE ON sessions
        BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
    """CREATE TRIGGER IF NOT EXISTS history_epoch_call_update AFTER UPDATE ON tool_calls
        BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
    """CREATE TRIGGER IF NOT EXISTS history_epoch_call_delete AFTER DELETE ON tool_calls
        BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
    """CREATE TABLE IF NOT EXISTS history_files (
        id INTEGER PRIMARY KEY, source TEXT NOT NULL, machine TEXT NOT NULL, path TEXT NOT NULL,
        lines INTEGER NOT NULL, bytes INTEGER NOT NULL, version INTEGER NOT NULL,
        imported_at TEXT NOT NULL, UNIQUE (source, machine, path))""",
    """CREATE TABLE IF NOT EXISTS history_lines (
        file_id INTEGER NOT NULL, line INTEGER NOT NULL, hash BLOB NOT NULL, raw BLOB NOT NULL,
        PRIMARY KEY (file_id, line)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS history_usage (
        source TEXT NOT NULL, machine TEXT NOT NULL, row_key TEXT NOT NULL, session_id TEXT,
        timestamp TEXT, model TEXT, input_tokens INTEGER, output_tokens INTEGER,
        thinking_tokens INTEGER, cache_write_tokens INTEGER, cache_read_tokens INTEGER,
        cost_usd REAL, cost_source TEXT, cost_estimated INTEGER, is_sidechain INTEGER,
        PRIMARY KEY (source, machine, row_key)) WITHOUT ROWID""",
)

# The spans a run's CLI exported (spawnkit.telemetry.otlp), attributes redacted, as JSON.
CLI_SPANS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cli_spans (
        session_id TEXT NOT NULL, trace_id TEXT NOT NULL, span_id TEXT NOT NULL,
        parent_span_id TEXT, name TEXT NOT NULL, service TEXT, start_ns BIGINT NOT NULL,
        end_ns BIGINT NOT NULL, status TEXT NOT NULL, attributes TEXT NOT NULL,
        reparented INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX IF NOT EXISTS cli_spans_by_session ON cli_spans (session_id, start_ns)",
)

# The log events and metric points a run's CLI exported (spawnkit.telemetry.otlp), attributes
# redacted, as JSON; ``kind`` is "log" or "metric", ``value`` a metric point's value.
CLI_EVENTS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cli_events (
        session_id TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL, service TEXT,
        time_ns BIGINT NOT NULL, trace_id TEXT, span_id TEXT, value DOUBLE PRECISION,
        attributes TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS cli_events_by_session ON cli_events (session_id, time_ns)",
)

# Schema 16, for spawnkit.history: the store's own columnar copy of its completed history
# (spawnkit/store/segments.py), and triggers that bump the epoch only for what that copy
# holds: a tool call of a run still going is rewritten as it ends and replaced when the run
# completes (before the record is closed, spawnkit/store/writes.py), which changes nothing
# sealed. A completed session's calls changing, or the session itself, still bumps it.
_CALL_OF_COMPLETED = (
    "WHEN EXISTS (SELECT 1 FROM sessions WHERE id = OLD.session_id AND completed_at IS NOT NULL)"
)
SEAL_SESSIONS = 1000
"""Sessions that come between two seals (the rows a reader still reads one by one)."""
SERVER_SEAL_DUE = """SELECT count(*) >= ? AS due
    FROM (SELECT 1 FROM history_unsealed LIMIT ?) AS queued"""
"""On PostgreSQL (spawnkit/store/server_segments.py): whether ``?`` sessions are queued to
be sealed, counting at most that many index entries."""
SEGMENTS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS history_segments (
        id INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, hi INTEGER NOT NULL,
        open TEXT NOT NULL, level INTEGER NOT NULL, n_sessions INTEGER NOT NULL,
        sessions BLOB NOT NULL, calls BLOB NOT NULL)""",
    "DROP TRIGGER IF EXISTS history_epoch_call_update",
    "DROP TRIGGER IF EXISTS history_epoch_call_delete",
    f"""CREATE TRIGGER history_epoch_call_update AFTER UPDATE ON tool_calls
        {_CALL_OF_COMPLETED} BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
    f"""CREATE TRIGGER history_epoch_call_delete AFTER DELETE ON tool_calls
        {_CALL_OF_COMPLETED} BEGIN UPDATE history_epoch SET epoch = epoch + 1; END""",
)

# MIGRATIONS[v - 1] takes a store from schema v to v + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    ("ALTER TABLE sessions ADD COLUMN log_dir TEXT",),
    ("ALTER TABLE sessions ADD COLUMN role TEXT",),
    ("ALTER TABLE sessions ADD COLUMN sandbox TEXT", "ALTER TABLE sessions ADD COLUMN given TEXT"),
    HISTORY_SCHEMA,
    ("ALTER TABLE sessions ADD COLUMN workspace TEXT",),
    # What the run was (a butler's "run", or an "ask" about sources) and which sources.
    (
        "ALTER TABLE sessions ADD COLUMN kind TEXT NOT NULL DEFAULT 'run'",
        "ALTER TABLE sessions ADD COLUMN sources TEXT",
    ),
    # How a run stood against its limits (spawnkit.budgets.budget), as JSON.
    ("ALTER TABLE sessions ADD COLUMN budget TEXT",),
    # Each start of the run's CLI (spawnkit.config.retry), as JSON.
    ("ALTER TABLE sessions ADD COLUMN attempts TEXT",),
    CLI_SPANS_SCHEMA,
    CLI_EVENTS_SCHEMA,
    # Runs that belong to a host: the lease its host renews while the run lives.
    (
        "ALTER TABLE sessions ADD COLUMN lease_until TEXT",
        "CREATE INDEX IF NOT EXISTS sessions_lease ON sessions (lease_until) "
        "WHERE completed_at IS NULL",
    ),
    # Which home wrote a record, sealed with that home's key (spawnkit.containment.sweep.HomeSeal).
    ("ALTER TABLE sessions ADD COLUMN owner_seal TEXT",),
    # Connections the run's network sandbox refused (spawnkit.containment.egress).
    ("ALTER TABLE sessions ADD COLUMN network_denied INTEGER",),
    # Each answer to a [butler.permissions] ask question (spawnkit.run.approval), as JSON.
    ("ALTER TABLE sessions ADD COLUMN permissions TEXT",),
    SEGMENTS_SCHEMA,
)
assert len(MIGRATIONS) == SCHEMA_VERSION - 1
