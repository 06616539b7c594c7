"""Summary tables of a history, for the ``spawnkit history`` command line and for notebooks.

:func:`summarize` reduces the store's sessions or a CLI's transcripts to one of three views:
by day (each model response on the day it happened; store sessions on the day they were
created), by butler (store) or project (transcripts), or by session (newest first). The
result is a plain DataFrame; :func:`render_table` formats it for a terminal and
:func:`to_json` for scripts. Both are pure: nothing here prints.
"""

from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from .errors import HistoryError
from .pricing import PricingTable
from .store_frames import sessions as store_sessions
from .transcript_loader import Source, daily_totals, transcripts

View = Literal["day", "group", "session"]
TOKENS = ["input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens"]
TRANSCRIPT_TOKENS = [*TOKENS[:2], "thinking_tokens", *TOKENS[2:]]
_HEADERS = {
    "input_tokens": "input", "output_tokens": "output", "cache_write_tokens": "cache write",
    "cache_read_tokens": "cache read", "total_tokens": "total", "cost_usd": "cost $",
    "n_tool_calls": "tools", "n_tool_errors": "tool errors", "session_id": "session",
    "started_at": "started", "responses": "responses", "thinking_tokens": "thinking",
    "cost_estimated": "est.", "n_api_errors": "api errors", "sidechain_tokens": "subagents",
}  # fmt: skip


def _since(value: str | date | datetime | None) -> pd.Timestamp | None:
    if value is None:
        return None
    try:
        stamp = pd.Timestamp(value)
    except ValueError:
        raise HistoryError(f"since: {value!r} is not a date or a time (e.g. 2026-11-01)") from None
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def summarize(
    source: Literal["store"] | Source = "store",
    *,
    view: View = "day",
    root: str | Path | None = None,
    store: str | Path | None = None,
    since: str | date | datetime | None = None,
    limit: int | None = None,
    pricing: PricingTable | None = None,
    tz: str = "UTC",
    machine: str | None = None,
) -> pd.DataFrame:
    """One summary table; ``since`` keeps activity at or after it (naive means UTC).

    Transcript views show thinking tokens apart from output, side-chain (sub-agent) tokens,
    API errors and whether a cost is an estimate (``est.``: priced as another model of the
    family); ``machine`` keeps one machine's rows (imported with ``--machine``).
    """
    start = _since(since)
    if source == "store":
        frame = store_sessions(store, since=start.to_pydatetime() if start is not None else None,
                               pricing=pricing)  # fmt: skip
        frame["total_tokens"] = frame[TOKENS].sum(axis=1)
        if view == "day":
            day = frame["created_at"].dt.tz_convert(tz).dt.strftime("%Y-%m-%d").rename("date")
            out = _totals(frame, [day])
            out.insert(1, "sessions", frame.groupby(day).size().to_numpy())
            return _tail(out, limit)
        if view == "group":
            return _groups(frame, "butler", failed=True)
        columns = ["session_id", "started_at", "butler", "runtime", "model", "role", "status",
                   *TOKENS, "total_tokens", "cost_usd", "n_tool_calls"]  # fmt: skip
        newest = frame.sort_values("created_at", ascending=False, kind="stable")
        return _head(newest.assign(started_at=newest["created_at"])[columns], limit)
    loaded = transcripts(source, root, pricing=pricing, machine=machine)
    usage, sessions = loaded.usage, loaded.sessions
    if start is not None:
        usage = usage[usage["timestamp"] >= start]
        sessions = sessions[sessions["ended_at"] >= start]
    if view == "day":
        out = daily_totals(usage, tz)
        counts = usage.groupby(
            usage["timestamp"].dt.tz_convert(tz).dt.strftime("%Y-%m-%d"), observed=True
        )["session_id"].nunique()
        out.insert(1, "sessions", out["date"].map(counts).fillna(0).astype("Int64"))
        return _tail(out, limit)
    if view == "group":
        return _groups(sessions, "project", failed=False)
    columns = ["session_id", "started_at", "machine", "project", "title", "models",
               *TRANSCRIPT_TOKENS, "total_tokens", "sidechain_tokens", "cost_usd", "cost_source",
               "cost_estimated", "n_tool_calls", "n_tool_errors", "n_api_errors"]  # fmt: skip
    newest = sessions.sort_values("started_at", ascending=False, kind="stable")
    return _head(newest[columns], limit)


def _totals(frame: pd.DataFrame, keys: list[pd.Series]) -> pd.DataFrame:
    """Sums of the store's token columns and cost per key."""
    grouped = frame.groupby(keys, observed=True)
    out = grouped[[*TOKENS, "total_tokens", "cost_usd"]].sum(min_count=1)
    return out.reset_index()


def _groups(frame: pd.DataFrame, column: str, *, failed: bool) -> pd.DataFrame:
    grouped = frame.groupby(column, observed=True)
    tokens = [c for c in TRANSCRIPT_TOKENS if c in frame.columns]
    out = grouped[[*tokens, "total_tokens", "cost_usd", "n_tool_calls"]].sum(min_count=1)
    out.insert(0, "sessions", grouped.size())
    if failed:
        out.insert(1, "failed", grouped["success"].agg(lambda s: int((s == False).sum())))  # noqa: E712
    else:
        out.insert(1, "tool_errors", grouped["n_tool_errors"].sum())
    return out.sort_values("sessions", ascending=False, kind="stable").reset_index()


def _head(frame: pd.DataFrame, limit: int | None) -> pd.DataFrame:
    return (frame.head(limit) if limit else frame).reset_index(drop=True)


def _tail(frame: pd.DataFrame, limit: int | None) -> pd.DataFrame:
    return (frame.tail(limit) if limit else frame).reset_index(drop=True)


def render_table(frame: pd.DataFrame) -> str:
    """A terminal table: thousands separators, dollars to the cent, short timestamps."""
    if frame.empty:
        return "(no history)"
    shown = pd.DataFrame(index=frame.index)
    for column in frame.columns:
        values = frame[column]
        if column == "cost_usd":
            shown[column] = values.map(lambda v: "" if pd.isna(v) else f"{v:,.2f}")
        elif pd.api.types.is_bool_dtype(values):
            shown[column] = values.map(lambda v: "yes" if v is True else "")
        elif pd.api.types.is_datetime64_any_dtype(values):
            shown[column] = values.dt.strftime("%Y-%m-%d %H:%M").fillna("")
        elif pd.api.types.is_integer_dtype(values) or pd.api.types.is_float_dtype(values):
            shown[column] = values.map(lambda v: "" if pd.isna(v) else f"{int(v):,}")
        elif column == "session_id":
            shown[column] = values.astype(str).str.slice(0, 8)
        elif column == "models":
            shown[column] = values.map(lambda m: ", ".join(m) if isinstance(m, list) else "")
        else:
            shown[column] = values.astype(object).where(values.notna(), "").astype(str)
    shown.columns = [_HEADERS.get(c, c.replace("_", " ")) for c in shown.columns]
    return shown.to_string(index=False)


def to_json(frame: pd.DataFrame) -> str:
    """Records with ISO timestamps; missing values are null."""
    records = []
    for row in frame.to_dict(orient="records"):
        records.append({key: _plain(value) for key, value in row.items()})
    return json.dumps(records, ensure_ascii=False)


def _plain(value: object) -> object:
    if isinstance(value, list):
        return value
    if value is None or value is pd.NaT or (isinstance(value, float) and np.isnan(value)):
        return None
    if value is pd.NA:
        return None
    if isinstance(value, pd.Timestamp | datetime):
        return value.isoformat()
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
