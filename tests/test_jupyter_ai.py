"""Butlers as Jupyter AI personas (spawnkit.notebook.jupyter_ai).

The persona classes as Jupyter AI's persona manager finds them: through the package's
entry point, and through a ``.jupyter/personas`` file of two lines.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import sys
from pathlib import Path

import pytest
from jupyter_ai_persona_manager.persona_manager import load_from_dir

from spawnkit.notebook.jupyter_ai import (
    ButlerPersona,
    acp_command,
    butler_personas,
    without_mention,
)

REPO = Path(__file__).resolve().parents[1]
PERSONAS_FILE = (
    "from spawnkit.notebook.jupyter_ai import butler_personas\n"
    "globals().update(butler_personas(__name__))\n"
)


@pytest.fixture
def roster(tmp_path: Path) -> Path:
    copy = tmp_path / "roster"
    shutil.copytree(REPO / "roster", copy)
    return copy


def test_the_personas_file_of_two_lines_gives_every_butler_but_the_default(
    roster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPAWNKIT_ROSTER", str(roster))
    personas = tmp_path / ".jupyter" / "personas"
    personas.mkdir(parents=True)
    (personas / "spawnkit_personas.py").write_text(PERSONAS_FILE)
    found = load_from_dir(str(personas), logging.getLogger("test"))
    names = sorted(item["persona_class"].butler_name for item in found)
    # `general` is the roster's first by name: the entry point's persona serves it.
    assert names == ["health", "relationship"]
    assert all(issubclass(item["persona_class"], ButlerPersona) for item in found)


def test_the_entry_point_is_the_rosters_default_butler(
    roster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPAWNKIT_ROSTER", str(roster))
    (entry,) = importlib.metadata.entry_points(group="jupyter_ai.personas", name="spawnkit")
    cls = entry.load()
    assert cls.__name__ == "SpawnkitPersona" and cls.butler_name == "general"
    monkeypatch.setenv("SPAWNKIT_PERSONA_BUTLER", "health")
    assert entry.load().butler_name == "health"
    assert sorted(butler_personas("x")) == ["Butler_general", "Butler_relationship"]


def test_no_roster_leaves_the_entry_point_out_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_ai_persona_manager import PersonaRequirementsUnmet

    monkeypatch.setenv("SPAWNKIT_ROSTER", str(tmp_path / "nowhere"))
    (entry,) = importlib.metadata.entry_points(group="jupyter_ai.personas", name="spawnkit")
    with pytest.raises(PersonaRequirementsUnmet, match="no roster found"):
        entry.load()


def test_the_command_is_spawnkit_acp_on_jupyters_interpreter(roster: Path) -> None:
    assert acp_command(roster, "health", None) == [
        sys.executable, "-m", "spawnkit", "acp", "--roster", str(roster), "--butler", "health",
    ]  # fmt: skip
    scenario = roster / "health" / "scenarios" / "demo.toml"
    assert acp_command(roster, "health", scenario)[-2:] == ["--replay", str(scenario)]


def test_replay_applies_to_butlers_that_have_the_scenario(
    roster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = next((roster / "health" / "scenarios").glob("*.toml")).stem
    monkeypatch.setenv("SPAWNKIT_ROSTER", str(roster))
    monkeypatch.setenv("SPAWNKIT_PERSONA_BUTLER", "general")
    classes = butler_personas("x", replay=scenario)
    assert classes["Butler_health"].replay == roster / "health" / "scenarios" / f"{scenario}.toml"
    assert classes["Butler_relationship"].replay is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("@health I weighed 72 kg", "I weighed 72 kg"),
        ("  @health, log this", "log this"),
        ("@healthy is another", "@healthy is another"),
        ("no mention", "no mention"),
        ("@health", "@health"),
    ],
)
def test_the_mention_that_routed_a_message_is_not_part_of_the_prompt(
    body: str, expected: str
) -> None:
    assert without_mention(body, "health") == expected
