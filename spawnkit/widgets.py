"""The butler dashboard: every butler of a roster at a glance, with runs you can start and stop.

``ButlerDashboard(roster)`` (or ``%spawn_dashboard``) shows one card per butler
(runtime, port, whether its MCP server is up, with a button to start it, slots
in use, queue depth, its last runs), a prompt box with a Trigger button, the
runs in flight with live views and Cancel buttons, and a table of recent
sessions that refreshes itself. Clicks only submit work to spawnkit's
background loop and return, so the dashboard stays responsive while runs
stream; the refresh also runs there. Works in JupyterLab and as a Voila app.
"""

from __future__ import annotations

import asyncio
import html
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as w

from .notebook.hub import Hub, RunHandle, Target, default_hub
from .notebook.view import RunView
from .roster import ButlerConfig, Roster, load_roster
from .service import ButlerService
from .store import SessionRecord

logger = logging.getLogger(__name__)

REFRESH_S = 1.0
RECENT_ROWS = 12
KEEP_FINISHED = 3
REAL_MODEL = "(real model)"


def _port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def sessions_table(records: list[SessionRecord]) -> str:
    """Recent sessions as an HTML table."""
    if not records:
        return "<p><i>no sessions yet</i></p>"
    head = "".join(
        f"<th>{h}</th>"
        for h in ("started", "butler", "status", "source", "tools", "s", "cost", "prompt")
    )
    body = []
    for r in records:
        cost = f"${r.cost_usd:.4f}" if r.cost_usd is not None else ""
        duration = f"{r.duration_ms / 1000:.1f}" if r.duration_ms is not None else ""
        cells = (
            r.created_at.strftime("%H:%M:%S"), r.butler, r.status, r.trigger_source,
            str(len(r.tool_calls)), duration, cost, r.prompt[:60],
        )  # fmt: skip
        row = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        body.append(f'<tr class="sk-{html.escape(r.status)}">{row}</tr>')
    return (
        '<table class="sk-sessions"><thead><tr>' + head + "</tr></thead><tbody>"
        + "".join(body) + "</tbody></table>"
    )  # fmt: skip


@dataclass
class _RunRow:
    handle: RunHandle
    box: w.VBox
    label: w.HTML
    cancel: w.Button


class _Card:
    """One butler's card."""

    def __init__(self, dashboard: ButlerDashboard, butler: ButlerConfig) -> None:
        self.butler = butler
        self.title = w.HTML(
            f"<b>{html.escape(butler.name)}</b><br><small>{html.escape(butler.description)}</small>"
        )
        self.info = w.HTML()
        self.server = w.HTML()
        self.start = w.Button(description="Start server", icon="play", layout={"width": "auto"})
        self.start.on_click(lambda _: dashboard.start_server(butler))
        self.runs = w.HTML()
        self.box = w.VBox(
            [self.title, self.info, w.HBox([self.server, self.start]), self.runs],
            layout={
                "border": "1px solid #ccc",
                "padding": "6px",
                "margin": "4px",
                "width": "260px",
            },
        )

    def update(self, running: int, queued: int, up: bool, recent: list[SessionRecord]) -> None:
        b = self.butler
        self.info.value = (
            f"{html.escape(b.runtime.type)} · port {b.port} · "
            f"slots {running}/{b.runtime.max_concurrent_sessions} · queue {queued}"
        )
        self.server.value = "MCP server: " + ("<b>up</b>" if up else "down")
        self.start.disabled = up
        marks = [
            ("✓" if r.success else "✗")
            + (f" {r.duration_ms / 1000:.1f}s" if r.duration_ms is not None else "")
            + (f" ${r.cost_usd:.3f}" if r.cost_usd is not None else "")
            for r in recent[:3]
        ]
        self.runs.value = "<small>last runs: " + (", ".join(marks) or "none") + "</small>"


class ButlerDashboard(w.VBox):  # type: ignore[misc]
    """Cards, a trigger box, live in-flight runs and recent sessions for a roster."""

    def __init__(
        self, roster: str | Path | Roster, *, hub: Hub | None = None, refresh_s: float = REFRESH_S
    ) -> None:
        self.roster = roster if isinstance(roster, Roster) else load_roster(roster)
        self.hub = hub or default_hub()
        self.refresh_s = refresh_s
        self.cards = {b.name: _Card(self, b) for b in self.roster}
        names = list(self.cards)
        self.butler_choice = w.Dropdown(options=names, description="Butler")
        self.scenario_choice = w.Dropdown(description="Model")
        self.butler_choice.observe(lambda _: self._scenarios(), names="value")
        self.prompt = w.Textarea(placeholder="What should the butler do?", layout={"width": "60%"})
        self.trigger = w.Button(description="Trigger", button_style="primary", icon="paper-plane")
        self.trigger.on_click(lambda _: self.trigger_run())
        self.message = w.HTML()
        self.in_flight = w.VBox()
        self.recent = w.HTML()
        self._rows: list[_RunRow] = []
        self._servers: dict[str, ButlerService] = {}
        self._scenarios()
        super().__init__(
            [
                w.HTML(f"<h3>spawnkit · {html.escape(str(self.roster.directory))}</h3>"),
                w.HBox(
                    [card.box for card in self.cards.values()], layout={"flex_flow": "row wrap"}
                ),
                w.HBox([self.butler_choice, self.scenario_choice]),
                w.HBox([self.prompt, self.trigger]),
                self.message,
                w.HTML("<b>In flight</b>"),
                self.in_flight,
                w.HTML("<b>Recent sessions</b>"),
                self.recent,
            ]
        )
        self._refresher = self.hub.loop.submit(self._refresh_forever())

    # -- actions (called on the kernel's thread; they only submit work) -------------

    def _scenarios(self) -> None:
        butler = self.roster[self.butler_choice.value]
        found = sorted((butler.directory / "scenarios").glob("*.toml"))
        self.scenario_choice.options = [REAL_MODEL] + [f"replay: {p.stem}" for p in found]
        self.scenario_choice.value = self.scenario_choice.options[1 if found else 0]

    def trigger_run(self, prompt: str | None = None) -> RunHandle | None:
        text = (prompt if prompt is not None else self.prompt.value).strip()
        if not text:
            self.message.value = "<i>type a prompt first</i>"
            return None
        butler = self.roster[self.butler_choice.value]
        choice = self.scenario_choice.value
        replay = None
        if choice and choice != REAL_MODEL:
            replay = butler.directory / "scenarios" / f"{choice.split(': ', 1)[1]}.toml"
        view = RunView(schedule=self._schedule)
        handle = self.hub.start(Target(butler, replay=replay), text, listeners=[view], view=view)
        self._add_row(handle, view)
        self.message.value = ""
        return handle

    def _add_row(self, handle: RunHandle, view: RunView) -> None:
        cancel = w.Button(description="Cancel", icon="stop", button_style="danger")
        label = w.HTML(f"<b>{html.escape(handle.target.butler.name)}</b>")
        row = _RunRow(handle, w.VBox([w.HBox([label, cancel]), view]), label, cancel)

        def on_cancel(_: Any) -> None:
            cancel.disabled = True
            handle.cancel(wait=False)

        cancel.on_click(on_cancel)
        self._rows.append(row)
        self.in_flight.children = (*self.in_flight.children, row.box)

    def start_server(self, butler: ButlerConfig) -> None:
        """Serve the butler's MCP server on its own port (and its schedule) from this kernel."""

        async def start() -> None:
            if butler.name in self._servers:
                return
            service = ButlerService(
                butler,
                store=self.hub.store,
                mcp_port=butler.port,
                schedules=True,
                owner_token=True,
            )
            try:
                await service.__aenter__()
            except Exception as exc:  # noqa: BLE001 - shown on the dashboard, not raised
                self.message.value = (
                    f"cannot start {html.escape(butler.name)}: {html.escape(str(exc))}"
                )
                return
            self._servers[butler.name] = service

        self.hub.loop.submit(start())

    # -- refresh (on the background loop) --------------------------------------------

    async def _refresh_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # a failed refresh must not stop the next one
                logger.exception("spawnkit dashboard: refresh failed")
            await asyncio.sleep(self.refresh_s)

    async def refresh(self) -> None:
        statuses = {s.butler: s for s in self.hub.statuses()}
        records = await asyncio.to_thread(self.hub.store.list_sessions, limit=200)
        for name, card in self.cards.items():
            s = statuses.get(name)
            up = await asyncio.to_thread(_port_open, card.butler.port)
            card.update(
                s.active if s else 0,
                s.queued if s else 0,
                up,
                [r for r in records if r.butler == name],
            )
        self.recent.value = sessions_table(records[:RECENT_ROWS])
        for row in self._rows:
            if row.handle.done() and not row.cancel.disabled:
                row.cancel.disabled = True
                row.label.value = (
                    f"<b>{html.escape(row.handle.target.butler.name)}</b> · {row.handle.status}"
                )
        finished = [row for row in self._rows if row.handle.done()]
        if len(finished) > KEEP_FINISHED:
            drop = {id(row) for row in finished[:-KEEP_FINISHED]}
            self._rows = [row for row in self._rows if id(row) not in drop]
            self.in_flight.children = tuple(row.box for row in self._rows)

    def _schedule(self, delay: float, callback: Any) -> None:
        loop = self.hub.loop.loop
        loop.call_soon_threadsafe(loop.call_later, delay, callback)

    def __repr__(self) -> str:
        # Stable text (no widget ids): it is what a saved notebook shows without widgets.
        names = ", ".join(self.cards)
        return f"ButlerDashboard(roster={self.roster.directory.name!r}, butlers=[{names}])"

    def close(self) -> None:
        self._refresher.cancel()
        super().close()
