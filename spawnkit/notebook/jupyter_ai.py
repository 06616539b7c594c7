"""Butlers as personas of Jupyter AI's chat: ``@health`` runs through ``spawnkit acp``.

Jupyter AI 3 talks to agents over ACP (``jupyter-ai-acp-client``): a persona is a class
that names the agent's command, and the chat @-mentions it by name. Each butler becomes
such a class, whose command is ``spawnkit acp --butler NAME``: every message is then a
spawnkit run, with the butler's sandbox, MCP server, budgets and session record, and its
tool calls render in the chat as they happen.

Jupyter AI makes one persona per class it finds. Two places find them:

- the entry point ``spawnkit`` in ``jupyter_ai.personas`` (``pip install
  "spawnkit[jupyter-ai]"``) loads :class:`SpawnkitPersona`: the roster's default butler
  (see :func:`default_butler`), found where the Jupyter server started;
- a file ``.jupyter/personas/spawnkit_personas.py`` beside the chats adds every other
  butler of a roster, in two lines::

      from spawnkit.notebook.jupyter_ai import butler_personas
      globals().update(butler_personas(__name__))

Offline, ``SPAWNKIT_PERSONA_REPLAY=SCENARIO`` (or ``replay=``) runs each butler that has
that replay scenario on the replay model instead of the real one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

from jupyter_ai_acp_client.base_acp_persona import BaseAcpPersona
from jupyter_ai_persona_manager import PersonaDefaults, PersonaRequirementsUnmet

from ..config.butler_config import ButlerConfig, Roster
from ..config.roster import load_roster
from ..config.roster_location import find_roster
from ..errors import ConfigError, SpawnkitError

AVATAR = Path(__file__).with_name("spawnkit.svg")
REPLAY_ENV = "SPAWNKIT_PERSONA_REPLAY"
DEFAULT_BUTLER_ENV = "SPAWNKIT_PERSONA_BUTLER"


class ButlerPersona(BaseAcpPersona):  # type: ignore[misc]
    """One butler of one roster in the chat; subclasses name which (see butler_personas)."""

    butler_name: ClassVar[str]
    roster_dir: ClassVar[Path]
    about: ClassVar[str] = ""
    replay: ClassVar[Path | None] = None  # a replay scenario file: offline

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, executable=acp_command(self.roster_dir, self.butler_name,
                                                       self.replay), **kwargs)  # fmt: skip
        # Jupyter AI prefixes a session's first prompt with advice on editing notebooks
        # through its own tools, which a butler (its own tools, its own system prompt)
        # does not have: the prompt goes to the butler as the user wrote it.
        self._notebook_guidance_sent = True

    @property
    def defaults(self) -> PersonaDefaults:
        return PersonaDefaults(
            name=self.butler_name,
            description=self.about or f"the spawnkit butler {self.butler_name}",
            avatar_path=str(AVATAR),
            system_prompt="unused",  # the butler's own, composed by spawnkit
        )

    async def process_message(self, message: Any) -> None:
        body = without_mention(message.body, self.butler_name)
        if body != message.body:
            message = dataclasses.replace(message, body=body)  # jupyterlab_chat's Message
        await super().process_message(message)


def acp_command(roster: Path, butler: str, replay: Path | None) -> list[str]:
    """``spawnkit acp`` for one butler, on this interpreter (Jupyter's own)."""
    command = [sys.executable, "-m", "spawnkit", "acp", "--roster", str(roster), "--butler", butler]
    return [*command, "--replay", str(replay)] if replay else command


def without_mention(body: str, name: str) -> str:
    """The message without the leading ``@name`` that routed it here."""
    return re.sub(rf"^\s*@{re.escape(name)}\b[\s,:]*", "", body, count=1) or body


def persona_class(butler: ButlerConfig, roster: Roster, module: str, replay: str | None) -> type:
    """A persona class for ``butler``; Jupyter AI's persona id is its module and class name."""
    name = "Butler_" + re.sub(r"\W", "_", butler.name)
    scenario = butler.directory / "scenarios" / f"{replay}.toml" if replay else None
    if scenario is not None and not scenario.is_file():
        scenario = None  # this butler has no such scenario: it runs on its real model
    return type(name, (ButlerPersona,), {
        "__module__": module, "butler_name": butler.name, "roster_dir": roster.directory,
        "about": butler.description or "", "replay": scenario,
    })  # fmt: skip


def butler_personas(
    module: str, roster: str | Path | None = None, *, replay: str | None = None
) -> dict[str, type]:
    """One persona class per butler of ``roster`` (found as the CLI finds one), for a file
    in ``.jupyter/personas/``: ``globals().update(butler_personas(__name__))``.

    The butler that :class:`SpawnkitPersona` already serves (the same roster's default)
    is left out, so that no butler shows twice.
    """
    found = load_roster(find_roster(Path(roster) if roster else None))
    replay = replay or os.environ.get(REPLAY_ENV) or None
    served = _served_by_entry_point()
    classes = {}
    for butler in found:
        if served == (found.directory.resolve(), butler.name):
            continue
        cls = persona_class(butler, found, module, replay)
        classes[cls.__name__] = cls
    return classes


def default_butler(roster: Roster) -> ButlerConfig:
    """The butler ``$SPAWNKIT_PERSONA_BUTLER`` names, else the roster's first by name."""
    wanted = os.environ.get(DEFAULT_BUTLER_ENV)
    if wanted:
        return roster[wanted]
    if not len(roster):
        raise ConfigError(f"the roster {roster.directory} has no butler")
    return min(roster, key=lambda b: b.name)


def _served_by_entry_point() -> tuple[Path, str] | None:
    """The roster and butler :class:`SpawnkitPersona` serves, or None when it serves none."""
    try:
        roster = load_roster(find_roster())
        return roster.directory.resolve(), default_butler(roster).name
    except SpawnkitError:
        return None


def _entry_point_persona() -> type:
    try:
        roster = load_roster(find_roster())
        butler = default_butler(roster)
    except SpawnkitError as exc:  # Jupyter AI logs this and leaves the persona out
        raise PersonaRequirementsUnmet(f"spawnkit: {exc}") from exc
    cls = persona_class(butler, roster, __name__, os.environ.get(REPLAY_ENV) or None)
    cls.__name__ = cls.__qualname__ = "SpawnkitPersona"
    return cls


def __getattr__(name: str) -> Any:
    # The entry point's class, worked out when Jupyter AI loads it (not on import: the
    # roster is found from where the Jupyter server runs).
    if name == "SpawnkitPersona":
        return _entry_point_persona()
    raise AttributeError(name)
