"""spawnkit as an ACP client: one prompt to an agent over its stdio, start to end.

:class:`AcpPrompt` starts the agent (through :func:`spawnkit._process.open_stdio`, inside
the run's sandbox), speaks JSON-RPC with the SDK's :class:`acp.connection.Connection` over
a transport of bounded lines, and runs one prompt: ``initialize``, ``session/new`` (or
``session/resume``/``session/load`` to continue one) with the butler's MCP server as an
http server whose bearer secret is a header, then ``session/prompt``. What the agent
streams (``session/update``) goes through :class:`~.events.AcpUpdates` to the run's
events; what it asks (``session/request_permission``) is answered by :mod:`.approval`.
The raw messages the agent sends are the run's ``stdout.log``; what spawnkit sends is not
logged (``session/new`` carries the MCP secret).

Ends: the prompt's ``stopReason``; a cancelled run sends ``session/cancel``, waits a
moment for the agent to stop, then its process group is terminated; an agent that exits
mid-prompt is a :class:`~spawnkit.errors.RuntimeFailure` with its stderr's last word.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acp.connection import Connection
from acp.exceptions import RequestError
from acp.meta import PROTOCOL_VERSION

from ... import _process
from ...errors import RuntimeCrashed, RuntimeFailure
from ...events import EventSink
from ..base import McpServerSpec, RunOutcome, RunSpec, classify_failure
from ..streaming import STDERR_TAIL_LINES, stderr_summary
from .approval import Approval
from .events import STOP_REASONS, AcpUpdates

logger = logging.getLogger(__name__)

# How long the set-up requests may take (session/new starts the agent's model client
# and connects its MCP servers): a hang guard, not a budget.
SETUP_TIMEOUT_S = 120.0
# How long a cancelled prompt may take to stop before its process group is terminated.
CANCEL_GRACE_S = 3.0
# How long the agent's transcript may take to be written after the prompt's answer (the
# known agents do not exit when their stdin closes, and are terminated after this).
TRANSCRIPT_WAIT_S = 5.0
# How long the transcript must stay unchanged to count as written (when the agent's
# preset cannot tell a turn's end from the last line), and how often it is looked at.
TRANSCRIPT_STILL_S = 0.1
TRANSCRIPT_POLL_S = 0.01
# How much of the transcript's end holds its last line (a longer one counts as unknown).
TRANSCRIPT_TAIL_BYTES = 1 << 20
# How long the rest of a session/load's replay may take after its answer (an agent that
# answers first, Gemini): a bound for a replay shorter than foretold, then the prompt goes.
REPLAY_WAIT_S = 10.0
# The updates a replay of a conversation is made of.
REPLAYED = frozenset(
    {"user_message_chunk", "agent_message_chunk", "agent_thought_chunk", "tool_call"}
)
# How long an agent that closed its stdout has to exit before it counts as running.
EXIT_WAIT_S = 5.0
CLIENT_INFO = {"name": "spawnkit", "title": "spawnkit", "version": "1"}


def mcp_servers(server: McpServerSpec | None) -> list[dict[str, Any]]:
    """``session/new``'s ``mcpServers``: the butler's, with its secret as a header."""
    if server is None:
        return []
    return [
        {
            "type": server.transport,
            "name": server.name,
            "url": server.url,
            "headers": [{"name": k, "value": v} for k, v in server.headers.items()],
        }
    ]


def prompt_blocks(spec: RunSpec, system_in_prompt: bool) -> list[dict[str, Any]]:
    """``session/prompt``'s content: the prompt, after the system prompt when the agent has
    no other way to take one."""
    text = spec.prompt
    if system_in_prompt and spec.system_prompt.strip():
        text = f"{spec.system_prompt}\n\n---\n\n{spec.prompt}"
    return [{"type": "text", "text": text}]


class _LineFeed:
    """The agent's stdout for the SDK: its JSON-RPC lines, bounded, into :attr:`reader`.

    The SDK's connection reads a stream of lines (in every version spawnkit supports,
    0.11 and 0.12); this feeds it only whole JSON objects. A line the agent writes that is
    too long or not a JSON object is counted and skipped; each line goes to the run's log
    as it arrives. What spawnkit sends goes straight to the agent's stdin.
    """

    # Longer lines are cut by the child's framer (and skipped here) well before this.
    LIMIT = 64 * 1024 * 1024

    def __init__(self, child: _process.StdioChild, spec: RunSpec) -> None:
        self.child = child
        self.spec = spec
        self.bad_lines = 0
        self.reader = asyncio.StreamReader(limit=self.LIMIT)
        self._pump = asyncio.create_task(self._feed(), name="acp-agent-stdout")

    async def _feed(self) -> None:
        try:
            while (read := await self.child.read_line()) is not None:
                line, truncated = read
                if self.spec.log is not None:
                    self.spec.log.stdout(line)
                if truncated or not line.strip():
                    self.bad_lines += truncated
                    continue
                if _is_object(line):
                    self.reader.feed_data(line.encode("utf-8") + b"\n")
                else:
                    self.bad_lines += 1
        finally:
            self.reader.feed_eof()

    async def close(self) -> None:
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)


def _is_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


@dataclass
class AcpPrompt:
    """One run's prompt to an ACP agent; :meth:`run` is the whole conversation."""

    spec: RunSpec
    emit: EventSink
    argv: Sequence[str]
    env: Mapping[str, str]
    # What the agent's session/new gets in _meta (a preset's system prompt, options).
    session_meta: Mapping[str, Any] = field(default_factory=dict)
    # Whether the system prompt goes at the head of the prompt (no other way in).
    system_in_prompt: bool = True
    # Whether spawnkit enforces max_turns by counting tool calls (the agent has no limit).
    count_turns: bool = True
    # The starts of text chunks that are the agent's warnings (see .presets).
    noise: tuple[str, ...] = ()
    # False: the agent is known not to continue a session, whatever it advertises.
    resumes: bool = True
    # Where the agent writes the transcript of a session (a resume needs it whole), given
    # its session id; None: nothing to wait for.
    transcript: Callable[[str], Path | None] | None = None
    # Whether a transcript's last line ends the turn that gave this answer (see
    # .presets): then it is written, with no wait for the file to stop changing.
    turn_logged: Callable[[bytes, str], bool] | None = None
    # How many session/update notifications a session/load of a session replays, for an
    # agent that answers the load before its replay is over (None: it replays first).
    replayed: Callable[[str], int | None] | None = None
    name: str = "the ACP agent"
    auth_remedy: str = "check the agent's API key"
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))

    def __post_init__(self) -> None:
        server = self.spec.mcp_server
        self.updates = AcpUpdates(
            self.spec.session_id, server.name if server else "", noise=self.noise
        )
        self.approval = Approval(self.spec, self.updates)
        self.agent_session: str | None = None
        self.loading = False  # session/load replays the old conversation: not this run's
        self.replay_seen = 0
        self.replay_expected: int | None = None
        self.replay_over = asyncio.Event()
        self.turn_limited = False
        self.stopping: asyncio.Future[None] | None = None
        self.prompt_task: asyncio.Task[Any] | None = None
        self.conn: Connection | None = None

    async def run(self) -> RunOutcome:
        """Start the agent, run the prompt, and end it: the outcome, or a failure raised."""
        try:
            async with _process.open_stdio(
                self.argv, env=self.env, cwd=self.spec.cwd, on_stderr=self._stderr_line
            ) as child:
                feed = _LineFeed(child, self.spec)
                assert child.proc.stdin is not None
                self.conn = Connection(self._handle, child.proc.stdin, feed.reader)
                try:
                    return await self._converse(self.conn, child)
                finally:
                    await self.conn.close()
                    await feed.close()
                    if feed.bad_lines:
                        logger.warning(
                            "%s: %d lines of the agent were not JSON-RPC messages (session %s)",
                            self.name, feed.bad_lines, self.spec.session_id,
                        )  # fmt: skip
        except FileNotFoundError as exc:
            raise RuntimeFailure(f"cannot start {self.argv[0]}: {exc}", "crash") from exc

    def _stderr_line(self, line: str, truncated: bool) -> None:
        if self.spec.log is not None:
            self.spec.log.stderr(line)
        self.stderr.append(line)

    async def _converse(self, conn: Connection, child: _process.StdioChild) -> RunOutcome:
        try:
            async with asyncio.timeout(SETUP_TIMEOUT_S):
                init = await conn.send_request("initialize", self._initialize())
                capabilities = (init or {}).get("agentCapabilities") or {}
                self.agent_session = await self._open_session(conn, capabilities)
            result = await self._prompt(conn, self.agent_session)
            written = self.transcript(self.agent_session) if self.transcript else None
            if written is not None:
                answer = self.updates.last_text()
                logged = self.turn_logged
                await transcript_written(
                    written, None if logged is None else lambda line: logged(line, answer)
                )
        except (ConnectionError, TimeoutError) as exc:
            raise await self._ended(child, exc) from None
        except RequestError as exc:
            raise self._refused(exc) from None
        return self._outcome(result)

    def _initialize(self) -> dict[str, Any]:
        # No fs or terminal capability: the agent reads, writes and runs commands itself,
        # inside the run's sandbox, not through spawnkit.
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                                   "terminal": False},
            "clientInfo": CLIENT_INFO,
        }  # fmt: skip

    async def _open_session(self, conn: Connection, capabilities: Mapping[str, Any]) -> str:
        spec = self.spec
        params: dict[str, Any] = {
            "cwd": str(spec.cwd),
            "mcpServers": mcp_servers(spec.mcp_server),
        }
        if self.session_meta:
            params["_meta"] = dict(self.session_meta)
        if spec.resume:
            how = resume_method(capabilities) if self.resumes else None
            if how is None:
                raise RuntimeFailure(
                    f"{self.name} cannot continue a session over ACP (it advertises neither "
                    "session/resume nor a loadSession that works)", "runtime_error",
                )  # fmt: skip
            self.loading = how == "session/load"
            if self.loading and self.replayed is not None:
                self.replay_expected = self.replayed(spec.resume)
            try:
                await conn.send_request(how, {**params, "sessionId": spec.resume})
                await self._replay_done()
            finally:
                self.loading = False
            return spec.resume
        created = await conn.send_request("session/new", params)
        session_id = (created or {}).get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            raise RuntimeFailure(
                f"{self.name} answered session/new without a sessionId", "protocol"
            )
        return session_id

    async def _replay_done(self) -> None:
        """Wait for the rest of the load's replay, when the agent foretold it: what comes
        after is this prompt's (Gemini answers session/load while still replaying)."""
        expected = self.replay_expected
        if not expected or self.replay_seen >= expected:
            return
        try:
            async with asyncio.timeout(REPLAY_WAIT_S):
                await self.replay_over.wait()
        except TimeoutError:
            logger.warning(
                "%s replayed %d of the %d updates foretold of session %s; the prompt goes on",
                self.name, self.replay_seen, expected, self.spec.resume,
            )  # fmt: skip

    async def _prompt(self, conn: Connection, session_id: str) -> Mapping[str, Any]:
        params = {
            "sessionId": session_id,
            "prompt": prompt_blocks(self.spec, self.system_in_prompt),
        }
        self.prompt_task = asyncio.ensure_future(conn.send_request("session/prompt", params))
        try:
            result = await asyncio.shield(self.prompt_task)
        except asyncio.CancelledError:
            await self._cancel(conn, session_id)
            raise
        return result if isinstance(result, Mapping) else {}

    async def _cancel(self, conn: Connection, session_id: str) -> None:
        """``session/cancel``, then a moment for the prompt to end; the process group is
        terminated after, whatever the agent did."""
        task = self.prompt_task
        with contextlib.suppress(ConnectionError, OSError):
            await conn.send_notification("session/cancel", {"sessionId": session_id})
        if task is not None:
            await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _handle(self, method: str, params: Any, is_notification: bool) -> Any:
        """The agent's requests and notifications to its client."""
        params = params if isinstance(params, Mapping) else {}
        if method == "session/update":
            self._update(params.get("update"))
            return None
        if method == "session/request_permission":
            return await self.approval.answer(params, self.emit)
        raise RequestError.method_not_found(method)

    def _update(self, update: Any) -> None:
        if self.loading:
            # What a replay is made of (not, say, the agent's available_commands_update).
            if isinstance(update, Mapping) and update.get("sessionUpdate") in REPLAYED:
                self.replay_seen += 1
            if self.replay_expected is not None and self.replay_seen >= self.replay_expected:
                self.replay_over.set()
            return
        if not isinstance(update, Mapping):
            return
        for event in self.updates.feed(update):
            self.emit(event)
        if self.count_turns and self.updates.tool_calls > self.spec.max_turns:
            self._stop_for_turns()

    def _stop_for_turns(self) -> None:
        """Over max_turns with an agent that has no limit of its own: cancel its prompt."""
        if self.turn_limited or self.conn is None or self.agent_session is None:
            return
        self.turn_limited = True
        self.stopping = asyncio.ensure_future(
            self.conn.send_notification("session/cancel", {"sessionId": self.agent_session})
        )

    async def _ended(self, child: _process.StdioChild, cause: Exception) -> RuntimeFailure:
        """Why the conversation broke off: the agent exited (its code and last word), or
        did not answer its set-up in time."""
        code = await child.exited(EXIT_WAIT_S)
        said = stderr_summary(list(self.stderr))
        if code is None:
            return RuntimeFailure(
                f"{self.name} did not answer ({type(cause).__name__}: {cause})", "timeout"
            )
        detail = f"{self.name} exited with code {code} mid-prompt" + (f": {said}" if said else "")
        if said:
            failure = classify_failure(None, said, auth_remedy=self.auth_remedy)
            if type(failure) is not RuntimeFailure:
                return failure
        failure = RuntimeCrashed(detail)
        failure.exit_code = code
        return failure

    def _refused(self, exc: RequestError) -> RuntimeFailure:
        """A JSON-RPC error from the agent: its message, classified like a CLI's."""
        data = exc.data if isinstance(exc.data, Mapping) else {}
        text = str(data.get("details") or data.get("message") or exc)
        if exc.code == -32000 or "auth" in text.lower():
            return classify_failure(401, text, auth_remedy=self.auth_remedy)
        return classify_failure(None, f"{self.name}: {text}", auth_remedy=self.auth_remedy)

    def _outcome(self, result: Mapping[str, Any]) -> RunOutcome:
        for event in self.updates.finish(result):
            self.emit(event)
        reason = str(result.get("stopReason") or "end_turn")
        success, kind, message = STOP_REASONS.get(
            reason, (False, "runtime_error", f"the agent stopped: {reason}")
        )
        outcome = RunOutcome(
            output=self.updates.answer(),
            runtime_session_id=self.agent_session,
            usage=self.updates.usage,
            cost_usd=self.updates.cost_usd,
        )
        if self.turn_limited:
            success, kind = False, "max_turns"
            message = (
                f"stopped after {self.spec.max_turns} tool calls: {self.name} has no turn "
                "limit of its own, so spawnkit enforces max_turns by counting tool calls"
            )
        if not success:
            outcome.success, outcome.error_kind, outcome.error = False, kind, message
            outcome.output = self.updates.all_text()
        return outcome


def _file_state(path: Path) -> tuple[int, int] | None:
    """A file's size and change time (None: there is none), a stat of a local file."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_size, info.st_mtime_ns


def _last_line(path: Path) -> bytes:
    """The file's last complete line (empty: none, or the line is still being written)."""
    try:
        with path.open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(0, size - TRANSCRIPT_TAIL_BYTES))
            tail = file.read()
    except FileNotFoundError:
        return b""
    if not tail.endswith(b"\n"):
        return b""
    return tail[:-1].rsplit(b"\n", 1)[-1]


async def transcript_written(path: Path, logged: Callable[[bytes], bool] | None = None) -> None:
    """Wait (bounded) until ``path`` is written: its last line is the turn's end by
    ``logged``, or it exists and has not changed for :data:`TRANSCRIPT_STILL_S`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TRANSCRIPT_WAIT_S
    seen: tuple[int, int] | None = None
    changed = loop.time()
    while loop.time() < deadline:
        now = _file_state(path)
        if now != seen:
            seen, changed = now, loop.time()
            if now is not None and logged is not None and logged(_last_line(path)):
                return
        elif now is not None and loop.time() - changed >= TRANSCRIPT_STILL_S:
            return
        await asyncio.sleep(TRANSCRIPT_POLL_S)
    logger.warning("the agent's transcript %s was not written in time", path.name)


def resume_method(capabilities: Mapping[str, Any]) -> str | None:
    """How the agent continues a session: ``session/resume`` (no replay of the old
    conversation), else ``session/load`` (which replays it); None: it cannot."""
    sessions = capabilities.get("sessionCapabilities")
    if isinstance(sessions, Mapping) and sessions.get("resume") is not None:
        return "session/resume"
    if capabilities.get("loadSession"):
        return "session/load"
    return None
