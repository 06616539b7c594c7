"""What a trigger may ask for: its source, prompt, kind, role and working directory.

Pure checks that raise :class:`~spawnkit.errors.InvalidArgument` (or
:class:`~spawnkit.errors.InvalidTriggerSource`) before a trigger is accepted, shared by the
:class:`~spawnkit.run.Spawner`, ``MockSpawner`` and the command line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from ..containment.sources import Source
from ..errors import InvalidArgument, InvalidTriggerSource
from ..telemetry.runlog import check_session_id

# Where a run came from: the MCP trigger tool ("trigger"), the notebook's %%spawn and
# spawn() ("notebook"), the dashboard, spawnkit.map, a chat; "external" is any other caller
# (spawnkit run, the Python API). A schedule's runs are "schedule:<task-name>".
FRONTEND_SOURCES = ("notebook", "dashboard", "map", "chat")
TRIGGER_SOURCES = ("tick", "external", "trigger", "route", *FRONTEND_SOURCES)
# What a run is: a butler's trigger, a question about sources, or an interactive session
# about them on the user's terminal (spawnkit.ask).
RunKind = Literal["run", "ask", "chat"]
SOURCE_KINDS = ("ask", "chat")
_SCHEDULE_RE = re.compile(r"^schedule:[A-Za-z0-9_.-]+$")
ROLE_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")


def validate_trigger_source(source: str) -> None:
    if source in TRIGGER_SOURCES or (isinstance(source, str) and _SCHEDULE_RE.match(source)):
        return
    raise InvalidTriggerSource(
        f"invalid trigger_source {source!r}: use one of {', '.join(TRIGGER_SOURCES)} "
        "or schedule:<task-name> (a context is passed as context=...)"
    )


def validate_request(prompt: object, max_turns: int | None = None, context: object = None) -> None:
    """Refuse a prompt no run can be made of, or a turn limit below 1 (``InvalidArgument``).

    A prompt or context is passed on exactly as given or refused: never changed on the way.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidArgument("the prompt is empty: give the agent something to do")
    refuse_nul(prompt, "the prompt")
    if isinstance(context, str):
        refuse_nul(context, "the context")
    if max_turns is not None and max_turns < 1:
        raise InvalidArgument(f"max_turns must be at least 1, not {max_turns}")


def refuse_nul(text: str, what: str) -> None:
    """Refuse a text with a NUL byte: no agent CLI receives one intact (one drops it, a
    terminal shows a space, libpq cuts the text there), so it is refused, not changed."""
    at = text.find("\0")
    if at >= 0:
        raise InvalidArgument(
            f"{what} contains a NUL byte (at character {at}), which no agent CLI can receive: "
            "remove it"
        )


def checked_workdir(path: str | Path) -> Path:
    """A trigger's ``workdir``, resolved; it must be an existing directory."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise InvalidArgument(f"workdir {folder} is not a directory")
    return folder


def compose_prompt(prompt: str, context: str | None) -> str:
    """The text the agent receives: context first, when given, then the prompt."""
    if context is None or not context.strip():
        return prompt
    return f"{context.rstrip()}\n\n{prompt}"


def check_role(role: str | None) -> None:
    """A role names one of ``[butler.agents.<role>]`` or only labels the run: a plain name."""
    if role is not None and not ROLE_RE.fullmatch(role):
        raise InvalidArgument(f"invalid role name {role!r}")


def checked_run_arguments(
    *,
    role: str | None,
    session_id: str | None,
    kind: str,
    sources: Sequence[Source],
    workdir: Path | None,
) -> Path | None:
    """Refuse the arguments of a local run that do not go together; its ``workdir``, resolved."""
    check_role(role)
    if session_id is not None:
        check_session_id(session_id)  # it names the run's log folder
    if kind not in ("run", *SOURCE_KINDS):
        raise InvalidArgument(f"invalid run kind {kind!r}: use run, ask or chat")
    if sources and kind not in SOURCE_KINDS:
        raise InvalidArgument("sources are given to ask and chat runs only")
    if workdir is not None:
        if kind in SOURCE_KINDS:
            raise InvalidArgument("ask and chat runs work in their sources, not a workdir")
        workdir = checked_workdir(workdir)
    return workdir
