"""Scenario loading, validation, templating and turn selection (pure, no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spawnkit.errors import ScenarioError
from spawnkit.replay import Scenario
from spawnkit.replay.scenario import (
    ErrorSpec,
    PlannedCall,
    TurnRequest,
    Usage,
    escape_glob,
    escape_template,
    render,
)

BUTLER = """
description = "Health butler records a weight"

[[script]]
match = "weigh(?:t|ed) (\\\\d+)"
  [[script.turn]]
  text = "Recording it."
  tool = "mcp__*__state_set"
  input = { key = "weight", value = "{{ match.1 }}", tags = ["{{ match.0 }}", 3] }
  usage = { input_tokens = 100, cache_read_input_tokens = 50 }
  [[script.turn]]
  text = "Stored: {{ last_tool_result }}"

[[script]]
  [[script.turn]]
  text = "You said {{ prompt }}; I have {{ tools }}."
  chunk_chars = 3
  delay_ms = 20
"""

TOOLS = ("Bash", "mcp__health__state_get", "mcp__health__state_set")


def request(prompt: str, index: int = 0, **extra: Any) -> TurnRequest:
    return TurnRequest(prompt=prompt, turn_index=index, tools=TOOLS, **extra)


def load(text: str, tmp_path: Path) -> Scenario:
    path = tmp_path / "scenario.toml"
    path.write_text(text)
    return Scenario.load(path)


def test_loads_and_plays_the_matching_script(tmp_path: Path) -> None:
    scenario = load(BUTLER, tmp_path)
    assert scenario.description == "Health butler records a weight"
    assert scenario.source == str(tmp_path / "scenario.toml")

    first = scenario.reply(request("I weighed 81 this morning"))
    assert first.text == "Recording it."
    assert first.tool_calls == (
        PlannedCall(
            "mcp__health__state_set",
            {"key": "weight", "value": "81", "tags": ["weighed 81", 3]},
        ),
    )
    assert first.stop_reason == "tool_use"
    assert first.usage == Usage(input_tokens=100, cache_read_input_tokens=50)

    second = scenario.reply(request("I weighed 81", 1, last_tool_result="ok\nsaved"))
    assert second.text == "Stored: ok\nsaved"
    assert second.stop_reason == "end_turn"


def test_fallback_script_and_prompt_and_tools_templates(tmp_path: Path) -> None:
    reply = load(BUTLER, tmp_path).reply(request("hello"))
    assert reply.text == (
        "You said hello; I have Bash, mcp__health__state_get, mcp__health__state_set."
    )
    assert (reply.chunk_chars, reply.delay_ms) == (3, 20)


def test_turns_running_out_answer_with_text() -> None:
    scenario = Scenario.from_dict({"turn": [{"text": "only one"}]})
    reply = scenario.reply(request("x", 1))
    assert reply.text.startswith("[replay] no more scripted turns")
    assert reply.stop_reason == "end_turn"


def test_no_matching_script_says_so() -> None:
    scenario = Scenario.from_dict({"script": [{"match": "^deploy", "turn": [{"text": "ok"}]}]})
    reply = scenario.reply(request("tell me a joke"))
    assert "no script" in reply.text
    assert "tell me a joke" in reply.text


def test_tool_glob_matching_nothing_names_pattern_and_offered_tools() -> None:
    scenario = Scenario.from_dict({"turn": [{"tool": "mcp__*__missing"}]})
    reply = scenario.reply(request("x"))
    assert reply.tool_calls == ()
    assert "mcp__*__missing" in reply.text
    assert "mcp__health__state_get" in reply.text


def test_exact_tool_name_beats_an_earlier_glob_match() -> None:
    tools = ("mcp__a__get", "mcp__b__get")
    scenario = Scenario.from_dict({"turn": [{"tool": "mcp__b__get"}]})
    reply = scenario.reply(TurnRequest("x", 0, tools))
    assert reply.tool_calls[0].name == "mcp__b__get"
    glob = Scenario.from_dict({"turn": [{"tool": "mcp__*__get"}]})
    assert glob.reply(TurnRequest("x", 0, tools)).tool_calls[0].name == "mcp__a__get"


def test_several_tool_calls_in_one_turn() -> None:
    scenario = Scenario.from_dict(
        {
            "turn": [
                {
                    "text": "Two at once.",
                    "tool_calls": [
                        {"tool": "Bash", "input": {"command": "echo {{ prompt }}"}},
                        {"tool": "*state_get", "input": {"key": "weight"}},
                    ],
                }
            ]
        }
    )
    reply = scenario.reply(request("hi"))
    assert [call.name for call in reply.tool_calls] == ["Bash", "mcp__health__state_get"]
    assert reply.tool_calls[0].input == {"command": "echo hi"}


def test_error_turn() -> None:
    scenario = Scenario.from_dict(
        {"turn": [{"error": {"status": 529, "type": "overloaded_error", "message": "Busy"}}]}
    )
    assert scenario.reply(request("x")).error == ErrorSpec(529, "overloaded_error", "Busy")


def test_model_is_optional() -> None:
    assert Scenario.from_dict({"model": "m-1", "turn": [{"text": "x"}]}).model == "m-1"
    assert Scenario.from_dict({"turn": [{"text": "x"}]}).model == ""


def test_render_escape_and_missing_groups() -> None:
    assert render("a \\{{ prompt }} b {{prompt}}", {"prompt": "P"}) == "a {{ prompt }} b P"
    assert render(escape_template("{{ x }} and {{"), {}) == "{{ x }} and {{"
    scenario = Scenario.from_dict(
        {"script": [{"match": "a(b)?", "turn": [{"text": "[{{ match.1 }}]"}]}]}
    )
    assert scenario.reply(request("a")).text == "[]"


def test_escape_glob_matches_only_itself() -> None:
    import fnmatch

    name = "weird*name?[x]"
    assert fnmatch.fnmatchcase(name, escape_glob(name))
    assert not fnmatch.fnmatchcase("weirdXname?[x]", escape_glob(name))


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"turn": [{"text": "x"}], "colour": "red"}, "colour: unknown key"),
        (
            {"script": [{"turn": [{"text": "x", "tool": "a", "imput": {}}]}]},
            "script[0].turn[0].imput",
        ),
        ({"script": [{"turn": [{"text": 3}]}]}, "script[0].turn[0].text: expected a string"),
        ({"script": [{"match": "(", "turn": [{"text": "x"}]}]}, "script[0].match: bad regex"),
        ({"script": [{"turn": [{"text": "x"}, {"usage": {}}]}]}, "script[0].turn[1]: a turn needs"),
        ({"script": [{"match": "a", "turn": []}]}, "script[0].turn: expected a non-empty array"),
        ({"script": [{"match": "a"}]}, "script[0].turn: a script needs"),
        ({"turn": [{"text": "{{ nope }}"}]}, "turn[0].text: unknown placeholder {{ nope }}"),
        ({"turn": [{"text": "{{ match.1 }}"}]}, "turn[0].text: {{ match.1 }} used but"),
        (
            {
                "script": [
                    {"match": "(a)", "turn": [{"tool": "t", "input": {"k": ["{{ match.2 }}"]}}]}
                ]
            },
            "script[0].turn[0].input.k[0]: {{ match.2 }}: the match regex has only 1",
        ),
        ({"turn": [{"tool": "t", "input": "x"}]}, "turn[0].input: expected a table"),
        ({"turn": [{"text": "x", "input": {}}]}, "turn[0].input: input needs tool"),
        (
            {"turn": [{"tool": "a", "tool_calls": [{"tool": "b"}]}]},
            "turn[0].tool_calls: use either",
        ),
        ({"turn": [{"tool_calls": [{"input": {}}]}]}, "turn[0].tool_calls[0].tool: missing"),
        ({"turn": [{"text": "x", "usage": {"input_tokens": -1}}]}, "turn[0].usage.input_tokens"),
        ({"turn": [{"text": "x", "usage": {"tokens": 1}}]}, "turn[0].usage.tokens: unknown key"),
        ({"turn": [{"text": "x", "delay_ms": True}]}, "turn[0].delay_ms: expected an integer"),
        ({"turn": [{"text": "x", "chunk_chars": 0}]}, "turn[0].chunk_chars: must be >= 1"),
        ({"turn": [{"error": {"type": "x"}}]}, "turn[0].error.status: missing"),
        ({"turn": [{"error": {"status": 200}}]}, "turn[0].error.status: must be between"),
        ({"turn": [{"error": {"status": 500}, "text": "x"}]}, "turn[0].text: an error turn"),
        ({"turn": [{"text": "x"}], "script": []}, "turn: use either"),
        ({"description": "nothing"}, "no [[script]] or [[turn]]"),
    ],
)
def test_validation_errors_name_the_file_and_place(data: dict[str, Any], where: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        Scenario.from_dict(data, source="butler.toml")
    message = str(caught.value)
    assert message.startswith("butler.toml: ")
    assert where in message


def test_load_reports_bad_toml_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[turn]\ntext = 'x'\n")
    with pytest.raises(ScenarioError, match=r"bad\.toml: not valid TOML"):
        Scenario.load(bad)
    with pytest.raises(ScenarioError, match=r"missing\.toml: cannot read"):
        Scenario.load(tmp_path / "missing.toml")
