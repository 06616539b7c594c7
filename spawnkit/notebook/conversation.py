"""Going on with a conversation from a cell: ``%%spawn --continue`` and ``--resume ID``.

A run that continues another is a new session of the same butler on the same runtime,
linked to the earlier one (``parent_session_id``); the runtime picks the conversation up
from its own transcript (:meth:`spawnkit.run.Spawner.resume`). This module finds the run
to go on from (the notebook's last run of the butler, or a session of the store by id or
id prefix), refuses with one line what cannot be continued, and writes the earlier turns
as fixed HTML, collapsed, for the top of the new run's view.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from ..errors import ConfigError
from ..store import SessionRecord, SessionStore
from .hub import Hub
from .static_view import static_html
from .view_state import ViewState
from .widgets import record_result

# Earlier turns shown above a continued run (the oldest beyond are named, not shown).
EARLIER_SHOWN = 5
NOTEBOOK_BUTLER = "notebook"  # the butler of a %%spawn without --butler


@dataclass(frozen=True)
class Earlier:
    """The run a new one continues, and the turns before it, oldest first."""

    record: SessionRecord
    turns: tuple[SessionRecord, ...]
    more: bool  # there are earlier turns still, not shown


def last_run(hub: Hub, butler: str) -> str:
    """The session id of this notebook's last run of ``butler`` (``--continue``)."""
    for handle in reversed(hub.runs):
        if handle.target.butler.name == butler and handle.session_id and handle.done():
            return handle.session_id
    raise ConfigError(
        f"--continue: no earlier run of butler {butler!r} in this notebook; "
        "run one first, or name a session with --resume SESSION_ID"
    )


def resumable(store: SessionStore, key: str) -> SessionRecord:
    """The finished session ``key`` names (an id or a unique prefix), one that can go on."""
    found = store.sessions_with_prefix(key, limit=2)
    exact = [r for r in found if r.id == key]
    if exact:
        found = exact
    if not found:
        raise ConfigError(f"--resume: no session {key!r} in {store.location}")
    if len(found) > 1:
        raise ConfigError(f"--resume: {key!r} names several sessions; give more of the id")
    record = found[0]
    if record.completed_at is None:
        raise ConfigError(f"session {record.id} has not ended yet; go on with it afterwards")
    if not record.runtime_session_id:
        raise ConfigError(
            f"session {record.id} ({record.status}) never reached its runtime: "
            "there is no conversation to go on with"
        )
    return record


def earlier(store: SessionStore, record: SessionRecord) -> Earlier:
    """``record`` and the runs it continued, back to the first (at most EARLIER_SHOWN)."""
    chain = [record]
    while len(chain) < EARLIER_SHOWN and (parent := chain[-1].parent_session_id):
        found = store.get_session(parent)
        if found is None or any(r.id == found.id for r in chain):
            break
        chain.append(found)
    more = len(chain) == EARLIER_SHOWN and bool(chain[-1].parent_session_id)
    return Earlier(record, tuple(reversed(chain)), more)


def earlier_html(before: Earlier) -> str:
    """The earlier turns, collapsed: each one's prompt, then its transcript as it ended."""
    count = f"{len(before.turns)}{'+' if before.more else ''}"
    label = f"Earlier in this conversation · {count} run{'s' if count != '1' else ''}"
    parts = [f'<details class="sk-earlier"><summary>{html.escape(label)}</summary>']
    if before.more:
        parts.append('<div class="sk-hidden">… earlier runs not shown</div>')
    for turn in before.turns:
        parts.append(f'<div class="sk-earlier-prompt"><b>you:</b> {html.escape(turn.prompt)}</div>')
        parts.append(static_html(ViewState.from_result(record_result(turn))))
    parts.append("</details>")
    return "".join(parts)
