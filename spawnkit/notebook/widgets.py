"""The butler dashboard: every butler of a roster at a glance, with runs you can start and stop.

``ButlerDashboard(roster)`` (or ``%spawn_dashboard``) shows one card per butler
(runtime, port, whether its MCP server is up, with a button to start it, slots
in use, queue depth, its last runs with a mark per state, and, when its CLI's telemetry
is on, model request latency and time per tool over its last 20 runs), a prompt box with a
Trigger button, the runs in flight (each labelled with its state, butler,
prompt, session id and queue position, with its live view and, while it runs, a
Cancel button), the runs that just finished here, and a table of recent sessions
(with each run's runtime and where it came from: notebook, dashboard, map, chat, a
schedule, the MCP trigger tool); a click on a session shows its transcript. The
prompt box empties once a run was taken. Marks and durations are the run
view's, so every place says the same. Clicks only submit work to spawnkit's
background loop and return, so the dashboard stays responsive while runs
stream; the refresh also runs there. On a SQLite store it refreshes every second; on a
PostgreSQL store it refreshes only when the store's change feed reports a change, from
this host or any other, and shows the runs open on every host. Works in JupyterLab and
as a Voila app.
"""

from __future__ import annotations

import asyncio
import html
import logging
import socket
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from ..cli.console import blocked_count
from ..config.roster import ButlerConfig, Roster, load_roster
from ..result import SpawnerResult
from ..serve.queue_report import QueueReport
from ..serve.service import ButlerService
from ..store import SessionRecord
from .hub import Hub, RunHandle, Target, default_hub
from .live import LiveStatus
from .prompt_box import PromptBox
from .session_table import SessionTable
from .static_view import static_html
from .view import RunView
from .view_state import MARKS, ViewState, format_duration

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)
# What a refresh's thread hop raises once its loop or the process is ending: the loop's
# thread pool is closed, or (the interpreter exiting before the pool was first made, as a
# terminal IPython that shows a dashboard and quits does) a new pool cannot register its
# exit hook.
_ENDING = ("cannot schedule new futures after", "can't register atexit after shutdown")

REFRESH_S = 1.0
RECENT_ROWS = 12
KEEP_FINISHED = 3
LAST_RUNS = 4
TIMING_RUNS = 20  # a card's request latency and tool time cover this many runs
TIMING_TOOLS = 4
REAL_MODEL = "(real model)"
PROMPT_CHARS = 60
LIVE_STEPS = 12
MAX_RECEIVED = 1000
# Theme variables, so marks keep their colour in the dark theme too.
MARK_COLOURS = {
    "success": "var(--jp-success-color1, #2e7d32)",
    "failed": "var(--jp-error-color1, #c62828)",
    "crashed": "var(--jp-error-color1, #c62828)",
    "cancelled": "var(--jp-warn-color1, #e65100)",
    "budget": "var(--jp-warn-color1, #e65100)",
    "timeout": "var(--jp-error-color1, #c62828)",
    "running": "var(--jp-brand-color1, #1976d2)",
    "queued": "var(--jp-ui-font-color2, #5f5f5f)",
}
BORDER = "1px solid var(--jp-border-color2, #e0e0e0)"


def dashboard_title(roster: Roster) -> str:
    """The dashboard's heading: its butlers by name (the roster's folder is its tooltip)."""
    names = ", ".join(html.escape(b.name) for b in roster)
    where = html.escape(str(roster.directory), quote=True)
    return f'<h3 title="roster: {where}">spawnkit · {names}</h3>'


def _port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def mark_html(state: str) -> str:
    """The state's mark in its theme colour."""
    colour = MARK_COLOURS.get(state, "inherit")
    mark = html.escape(MARKS.get(state, "?"))
    return f'<b class="sk-mark" data-state="{html.escape(state)}" style="color:{colour}">{mark}</b>'


def run_label(handle: RunHandle) -> str:
    """An in-flight (or just finished) run in one line: state, butler, prompt, session."""
    state = handle.state
    prompt = " ".join(handle.prompt.split())
    prompt = prompt if len(prompt) <= PROMPT_CHARS else prompt[: PROMPT_CHARS - 1] + "…"
    butler = html.escape(handle.target.butler.name)
    parts = [f"{mark_html(state)} {html.escape(state)}", f"<b>{butler}</b>"]
    if state == "queued" and handle.position:
        parts.append(f"queue position {handle.position}")
    parts.append(f"“{html.escape(prompt)}”")
    if handle.session_id:
        sid = html.escape(handle.session_id)
        parts.append(f'<code title="{sid}">{sid[:8]}</code>')
    if handle.result_value is not None:
        parts.append(format_duration(handle.result_value.duration_ms))
    return f'<span class="sk-run-label">{" · ".join(parts)}</span>'


def record_result(record: SessionRecord) -> SpawnerResult:
    """A session record as the result it was (for its transcript)."""
    return SpawnerResult(
        output=record.output or "", tool_calls=record.tool_calls, success=bool(record.success),
        error=record.error, session_id=record.id, duration_ms=record.duration_ms or 0,
        usage=record.usage, cost_usd=record.cost_usd, butler=record.butler,
        runtime=record.runtime, model=record.model,
        status=record.status if record.status in MARKS else "failed",  # type: ignore[arg-type]
        error_kind=record.error_kind, num_turns=record.num_turns,
        network_denied=record.network_denied,
    )  # fmt: skip


def timing_html(frame: pd.DataFrame, runs: int = TIMING_RUNS) -> str:
    """A card's timings (a ``history.timings()`` frame): request latency p50/p90 and the
    tools with the most time; "" when the CLI reported none (telemetry off)."""
    from .. import history  # pandas: only once a card has timings to show

    if frame.empty:
        return ""
    over = f"last {runs} runs" if frame["session_id"].nunique() >= runs else "its runs"
    parts = []
    latency = history.request_latency(frame=frame, by="butler")
    if len(latency):
        row = latency.iloc[0]
        n = int(row["requests"])
        parts.append(
            f'<div class="sk-latency">model requests ({over}): '
            f"p50 {format_duration(row['p50_ms'])} · p90 {format_duration(row['p90_ms'])}"
            f" · {n} request{'s' if n != 1 else ''}</div>"
        )
    tools = history.tool_times(frame=frame)
    if len(tools):
        rows = "".join(
            f"<tr><td>{html.escape(str(t['tool']))}</td><td>{format_duration(t['total_ms'])}</td>"
            f"<td>{t['calls']} calls</td><td>p90 {format_duration(t['p90_ms'])}</td></tr>"
            for t in tools.head(TIMING_TOOLS).to_dict("records")
        )
        parts.append(
            f'<div class="sk-tool-times">time per tool ({over}):<table>{rows}</table></div>'
        )
    return "<small>" + "".join(parts) + "</small>"


@dataclass
class _RunRow:
    handle: RunHandle
    box: w.VBox
    header: w.HBox
    label: w.HTML
    cancel: w.Button

    def drop_cancel(self) -> None:
        """A finished run has nothing to cancel: its row keeps the label only."""
        if self.cancel in self.header.children:
            self.cancel.disabled = True
            self.header.children = (self.label,)


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
        # Queue waits, a cool-down in effect, and today's spend against the daily budget.
        self.pacing = w.HTML()
        self.pacing.add_class("sk-pacing")
        # Request latency and time per tool (CLI telemetry on), refreshed when a run ends.
        self.timing = w.HTML()
        self.timing.add_class("sk-timing")
        self.timing_key: tuple[str, ...] | None = None
        self.box = w.VBox(
            [
                self.title,
                self.info,
                self.pacing,
                w.HBox([self.server, self.start]),
                self.runs,
                self.timing,
            ],
            layout={"border": BORDER, "padding": "6px", "margin": "4px", "width": "280px"},
        )
        self.box.add_class("sk-card")

    def update(
        self,
        running: int,
        queued: int,
        up: bool,
        recent: list[SessionRecord],
        report: QueueReport | None = None,
    ) -> None:
        b = self.butler
        if report is not None:
            parts = [report.wait_text]
            if report.cooldown_s > 0:
                parts.append(f"<b>cool-down {report.cooldown_s:.1f} s</b> (rate limited)")
            elif report.cooldown_waits:
                parts.append(f"{report.cooldown_waits} starts waited on a cool-down")
            parts.append(html.escape(report.budget_text))
            self.pacing.value = "<small>" + " · ".join(parts) + "</small>"
        self.info.value = (
            f"{html.escape(b.runtime.type)} · port {b.port} · "
            f"slots {running}/{b.runtime.max_concurrent_sessions} · queue {queued}"
        )
        self.server.value = "MCP server: " + ("<b>up</b>" if up else "down")
        self.start.disabled = up
        marks = [
            f'<span title="{html.escape(r.status)} · {html.escape(r.id)}">{mark_html(r.status)}'
            + (f" {format_duration(r.duration_ms)}" if r.duration_ms is not None else "")
            + (f" ${r.cost_usd:.3f}" if r.cost_usd is not None else "")
            + (f" ⛔ {blocked_count(r.network_denied)}" if r.network_denied else "")
            + "</span>"
            for r in recent[:LAST_RUNS]
        ]
        self.runs.value = "<small>last runs: " + (", ".join(marks) or "none") + "</small>"


class ButlerDashboard(w.VBox):  # type: ignore[misc]
    """Cards, a trigger box, live in-flight runs, recent sessions and their transcripts."""

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
        # The Trigger button sends the text it was clicked with (see PromptBox).
        self.prompt = PromptBox(
            placeholder="What should the butler do? (Ctrl+Enter triggers)", label="Trigger",
            layout={"width": "70%"},
        )  # fmt: skip
        self.prompt.on_submit(self.trigger_run)
        self.message = w.HTML()
        self.in_flight = w.VBox()
        self.in_flight.add_class("sk-in-flight")
        self.finished = w.VBox()
        self.finished.add_class("sk-finished")
        self.sessions = SessionTable()
        self.sessions.observe(lambda change: self.show_transcript(change["new"]), names="selected")
        self.transcript = w.VBox()
        self.transcript.add_class("sk-transcript-panel")
        self._rows: list[_RunRow] = []
        self._servers: dict[str, ButlerService] = {}
        # On a PostgreSQL store: every host's open runs, and the steps the feed reported.
        self.hosts = w.HTML()
        self.hosts.add_class("sk-hosts")
        self.live = self.hub.live()
        # The steps of runs the feed reported since the dashboard opened, in order (the last
        # MAX_RECEIVED of them).
        self.received: deque[str] = deque(maxlen=MAX_RECEIVED)
        self.refreshes = 0
        self._scenarios()
        super().__init__(
            [
                w.HTML(dashboard_title(self.roster)),
                w.HBox(
                    [card.box for card in self.cards.values()], layout={"flex_flow": "row wrap"}
                ),
                w.HBox([self.butler_choice, self.scenario_choice]),
                self.prompt,
                self.message,
                w.HTML("<b>In flight</b>"),
                self.in_flight,
                self.hosts,
                w.HTML("<b>Just finished</b>"),
                self.finished,
                w.HTML("<b>Recent sessions</b> <small>(click one for its transcript)</small>"),
                self.sessions,
                self.transcript,
            ]
        )
        self.add_class("spawnkit-dashboard")
        self._changed: asyncio.Event | None = None
        if self.live is not None:
            # No polling: a refresh when the store's feed reports a change, on any host.
            self._refresher = self.hub.loop.submit(self._refresh_on_change(self.live))
        else:
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
        handle = self.hub.start(
            Target(butler, replay=replay), text, listeners=[view], view=view,
            approver=view.approve, source="dashboard",
        )  # fmt: skip
        self._add_row(handle, view)
        self.message.value = ""
        # Taken: the field empties (unless typing went on), so a second click cannot rerun it.
        self.prompt.accept(prompt if prompt is not None else self.prompt.value)
        # Its record's end may be heard before the run is done here: refresh once more then.
        handle.job.future.add_done_callback(lambda _: self._poke())
        return handle

    def _poke(self) -> None:
        """Refresh now, from any thread (with a change feed; the poll does it otherwise)."""
        changed = self._changed
        if changed is not None:
            self.hub.loop.loop.call_soon_threadsafe(changed.set)

    def _add_row(self, handle: RunHandle, view: RunView) -> None:
        cancel = w.Button(description="Cancel", icon="stop", button_style="danger")
        label = w.HTML(run_label(handle))
        header = w.HBox([label, cancel])
        row = _RunRow(handle, w.VBox([header, view]), header, label, cancel)
        row.box.add_class("sk-run-row")

        def on_cancel(_: Any) -> None:
            cancel.disabled = True
            handle.cancel(wait=False)

        cancel.on_click(on_cancel)
        self._rows.append(row)
        self.in_flight.children = (*self.in_flight.children, row.box)

    def show_transcript(self, session_id: str) -> None:
        """Show one session's transcript under the table ("" hides it)."""
        if not session_id:
            self.transcript.children = ()
            return
        body: w.Widget
        for row in self._rows:
            if row.handle.session_id == session_id and isinstance(row.handle.view, RunView):
                body, prompt = row.handle.view, row.handle.prompt  # still live
                break
        else:
            record = self.hub.store.get_session(session_id)
            if record is None:
                self.transcript.children = (w.HTML(f"<i>no session {html.escape(session_id)}</i>"),)
                return
            body = w.HTML(static_html(ViewState.from_result(record_result(record))))
            prompt = record.prompt
        title = w.HTML(
            f"<b>Transcript</b> · <code>{html.escape(session_id)}</code><br>"
            f"<small>prompt: {html.escape(prompt[:500])}</small>"
        )
        self.transcript.children = (title, body)

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
            self._poke()  # a server is no store change: refresh its card now

        self.hub.loop.submit(start())

    # -- refresh (on the background loop) --------------------------------------------

    async def _refresh_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except RuntimeError as exc:
                if any(sign in str(exc) for sign in _ENDING):
                    return  # the loop or the process is ending
                logger.exception("spawnkit dashboard: refresh failed")
            except Exception:  # a failed refresh must not stop the next one
                logger.exception("spawnkit dashboard: refresh failed")
            await asyncio.sleep(self.refresh_s)

    async def _refresh_on_change(self, live: LiveStatus) -> None:
        changed = self._changed = asyncio.Event()
        seen = live.reported

        def on_change(_: LiveStatus) -> None:
            changed.set()

        live.on_change.append(on_change)
        changed.set()  # the first refresh
        try:
            while True:
                await changed.wait()
                changed.clear()
                if live.reported > seen:
                    self.received.extend(live.lines()[-(live.reported - seen) :])
                    seen = live.reported
                try:
                    await self.refresh()
                except Exception:  # a failed refresh must not stop the next one
                    logger.exception("spawnkit dashboard: refresh failed")
        finally:
            live.on_change.remove(on_change)

    def _hosts_html(self, live: LiveStatus) -> str:
        runs = [
            f"{mark_html(run.record.status)} <b>{html.escape(run.record.butler)}</b> on "
            f"{html.escape(run.record.owner_host or '?')} · "
            f"<code>{html.escape(run.record.id[:8])}</code>"
            + (
                f" · {len(run.tools)} tool calls, last {html.escape(run.tools[-1])}"
                if run.tools
                else ""
            )
            for run in live.open_runs
        ]
        body = "<br>".join(runs) or "<i>nothing running on any host</i>"
        return f"<b>Every host</b> <small>(live from the store)</small><br><small>{body}</small>"

    async def refresh(self) -> None:
        self.refreshes += 1
        if self.live is not None:
            hosts = self._hosts_html(self.live)
            if self.hosts.value != hosts:
                self.hosts.value = hosts
        statuses = {s.butler: s for s in self.hub.statuses()}
        records = await asyncio.to_thread(self.hub.store.list_sessions, limit=200)
        for name, card in self.cards.items():
            s = statuses.get(name)
            up = await asyncio.to_thread(_port_open, card.butler.port)
            report = await asyncio.to_thread(self.hub.queue_report, card.butler)
            card.update(
                s.active if s else 0,
                s.queued if s else 0,
                up,
                [r for r in records if r.butler == name],
                report,
            )
            await self._refresh_timings(card, [r for r in records if r.butler == name])
        self.sessions.show(records[:RECENT_ROWS])
        for row in self._rows:
            label = run_label(row.handle)
            if row.label.value != label:
                row.label.value = label
            if row.handle.done():
                row.drop_cancel()
        # Finished runs leave "In flight" for "Just finished" (the last few are kept).
        live = [row for row in self._rows if not row.handle.done()]
        done = [row for row in self._rows if row.handle.done()][-KEEP_FINISHED:]
        self._rows = [row for row in self._rows if row in live or row in done]
        in_flight = tuple(row.box for row in live)
        finished = tuple(row.box for row in reversed(done))
        # "Just finished" first: a run between the two lists is shown twice for a moment
        # rather than vanishing from both.
        if self.finished.children != finished:
            self.finished.children = finished
        if self.in_flight.children != in_flight:
            self.in_flight.children = in_flight

    async def _refresh_timings(self, card: _Card, recent: list[SessionRecord]) -> None:
        """Re-read the card's timings from the store when its last runs changed."""
        key = tuple(f"{r.id}:{r.status}" for r in recent[:TIMING_RUNS])
        if key == card.timing_key:
            return
        from .. import history  # pandas, first needed here

        frame = await asyncio.to_thread(
            history.timings, self.hub.store, butler=card.butler.name, runs=TIMING_RUNS
        )
        card.timing.value = timing_html(frame)
        card.timing_key = key

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


class LiveStatusView(w.VBox):  # type: ignore[misc]
    """``%spawn_status --live``: the runs open on every host and the steps they took,
    redrawn on each change the store's feed reports (never on a timer)."""

    def __init__(self, live: LiveStatus, hub: Hub, steps: int = LIVE_STEPS) -> None:
        self.live = live
        self.hub = hub
        self.max_steps = steps
        self.table = w.HTML()
        self.table.add_class("sk-live-runs")
        self.steps_html = w.HTML()
        self.steps_html.add_class("sk-live-steps")
        super().__init__([self.table, self.steps_html])
        self.add_class("spawnkit-live-status")
        self.draw(live)
        hub.loop.call_soon(lambda: live.on_change.append(self.draw))

    def draw(self, live: LiveStatus) -> None:
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v if v is not None else ''))}</td>"
                             for v in row.values()) + "</tr>"
            for row in live.rows()
        )  # fmt: skip
        head = "".join(
            f"<th>{h}</th>"
            for h in ("host", "butler", "session", "status", "tool calls", "last tool")
        )
        self.table.value = (
            f"<b>Open on every host</b> <small>({html.escape(self.hub.store.location)})</small>"
            f"<table><tr>{head}</tr>{rows}</table>"
            if rows
            else "<b>Open on every host</b>: <i>nothing running</i>"
        )
        lines = live.lines()[-self.max_steps :]
        self.steps_html.value = "<small>" + "<br>".join(html.escape(x) for x in lines) + "</small>"

    def close(self) -> None:
        def remove() -> None:
            if self.draw in self.live.on_change:
                self.live.on_change.remove(self.draw)

        self.hub.loop.call_soon(remove)
        super().close()

    def __repr__(self) -> str:
        return "LiveStatusView(every host sharing the store, updated live)"
