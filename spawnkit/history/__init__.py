"""Session history as pandas DataFrames: spawnkit's store and the agent CLIs' own transcripts.

``sessions()``, ``tool_calls()`` and ``usage()`` read spawnkit's session store;
``transcripts(source)`` reads what Claude Code, Codex or Gemini CLI wrote themselves, with an
incremental cache, deduplication as ccusage does it, and costs from an offline pricing table
(``default_pricing()``, replaceable). See docs/history.md.
"""

from . import report
from .errors import HistoryError
from .pricing import ModelPrice, PricingTable, default_pricing
from .store_frames import sessions, tool_calls, usage
from .transcript_loader import (
    SESSION_COLUMNS,
    TOOL_CALL_COLUMNS,
    LoadStats,
    Transcripts,
    transcripts,
)

__all__ = [
    "SESSION_COLUMNS",
    "TOOL_CALL_COLUMNS",
    "HistoryError",
    "LoadStats",
    "ModelPrice",
    "PricingTable",
    "Transcripts",
    "default_pricing",
    "report",
    "sessions",
    "tool_calls",
    "transcripts",
    "usage",
]
