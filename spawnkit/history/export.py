"""History as Parquet files: one source's frames, or a folder DuckDB reads as tables.

:meth:`Transcripts.to_parquet` writes a load's frames as ``FRAME.parquet``. :func:`export`
writes the history of several sources into one folder laid out for DuckDB (and any engine
that reads Hive-partitioned Parquet)::

    FOLDER/sessions/source=claude-code/part-0.parquet
    FOLDER/sessions/source=spawnkit/part-0.parquet     (the store's sessions)
    FOLDER/usage/source=codex/part-0.parquet
    FOLDER/views.sql                                   (one CREATE VIEW per frame)

so ``duckdb -c ".read views.sql" -c "SELECT source, sum(cost_usd) FROM sessions GROUP BY 1"``
run in FOLDER sees every source in one ``sessions`` table. Columns a source lacks are null
there (``union_by_name``). A frame is written complete, to a temporary name, then renamed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .errors import HistoryError
from .parquet import FRAMES, write_frame
from .store_frames import sessions as store_sessions
from .store_frames import tool_calls as store_calls
from .transcript_loader import transcripts

STORE = "spawnkit"  # the source name of spawnkit's own session store in an export


def export_sources() -> tuple[str, ...]:
    """Every source an export can hold: the store, then each CLI."""
    return (STORE, "claude-code", "codex", "gemini")


def export(
    folder: str | Path,
    sources: Iterable[str] = (STORE, "claude-code", "codex", "gemini"),
    *,
    store: str | Path | None = None,
) -> Path:
    """Write the history of ``sources`` (``"spawnkit"``: the store) as a DuckDB-readable folder.

    Each transcript source is loaded with its defaults (the CLI's folders, spawnkit's runs
    and what was imported into ``store``).
    """
    out = Path(folder).expanduser()
    written: set[str] = set()
    for source in sources:
        if source == STORE:
            frames = {"sessions": store_sessions(store), "tool_calls": store_calls(store)}
        else:
            loaded = transcripts(source, store=store)
            frames = {name: getattr(loaded, name) for name in FRAMES}
            source = loaded.source
        for name, frame in frames.items():
            write_frame(frame.drop(columns=["source"], errors="ignore"),
                   out / name / f"source={source}" / "part-0.parquet")  # fmt: skip
            written.add(name)
    if not written:
        raise HistoryError("nothing to export: no source named")
    views = [
        f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet("
        f"'{name}/*/*.parquet', hive_partitioning = true, union_by_name = true);"
        for name in FRAMES
        if name in written
    ]
    (out / "views.sql").write_text("\n".join(views) + "\n", encoding="utf-8")
    return out
