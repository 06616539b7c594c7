"""Session history as pandas DataFrames: spawnkit's store and the agent CLIs' own transcripts.

``sessions()``, ``tool_calls()`` and ``usage()`` read spawnkit's session store, and
``spans()`` and ``cli_events()`` the CLIs' own telemetry it kept (CLI telemetry on), with
``timings()``, ``tool_times()``, ``request_latency()`` and ``waterfall()`` (where a run's
time went: each model request, each tool call, each span);
``transcripts(source)`` reads what Claude Code, Codex or Gemini CLI wrote themselves, with an
incremental cache, deduplication as ccusage does it, and costs from an offline pricing table
(``default_pricing()``, replaceable); ``import_history()`` copies those transcripts into the
store so they outlive the CLIs' clean-ups, and ``export()`` writes everything as Parquet
files DuckDB reads. Every frame names a fact the same way (``session_id``, ``name``,
``started_at``, ``timestamp``, ``parent_span_id``); the few old names still work for a release
with a warning (:mod:`~spawnkit.history.renamed`). See docs/history.md.
"""

from . import report
from .errors import HistoryError, UnpricedModelWarning
from .export import export, export_sources
from .imported import ImportReport, import_history
from .pricing import ModelPrice, PricingTable, default_pricing
from .span_frames import CLI_EVENT_COLUMNS, SPAN_COLUMNS, cli_events, spans
from .store_frames import sessions, tool_calls, usage
from .timing_frames import (
    LATENCY_COLUMNS,
    TIMING_COLUMNS,
    TOOL_TIME_COLUMNS,
    WATERFALL_COLUMNS,
    plot_waterfall,
    request_latency,
    timings,
    tool_times,
    waterfall,
)
from .transcript_loader import (
    EVENT_COLUMNS,
    SESSION_COLUMNS,
    SOURCES,
    TOOL_CALL_COLUMNS,
    LoadStats,
    Transcripts,
    transcripts,
)

__all__ = [
    "CLI_EVENT_COLUMNS",
    "EVENT_COLUMNS",
    "LATENCY_COLUMNS",
    "SESSION_COLUMNS",
    "SOURCES",
    "SPAN_COLUMNS",
    "TIMING_COLUMNS",
    "TOOL_CALL_COLUMNS",
    "TOOL_TIME_COLUMNS",
    "WATERFALL_COLUMNS",
    "HistoryError",
    "ImportReport",
    "LoadStats",
    "ModelPrice",
    "PricingTable",
    "Transcripts",
    "UnpricedModelWarning",
    "cli_events",
    "default_pricing",
    "export",
    "export_sources",
    "import_history",
    "plot_waterfall",
    "report",
    "request_latency",
    "sessions",
    "spans",
    "timings",
    "tool_calls",
    "tool_times",
    "transcripts",
    "usage",
    "waterfall",
]
