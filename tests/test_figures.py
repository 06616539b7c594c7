"""The run header's figures, and the max_turns message, as pure functions of events.

The real CLIs' figures are in test_figures_e2e.py; here the cases a replay run cannot make
(a CLI nothing meters, a CLI that counts the turn it refused).
"""

from __future__ import annotations

from pathlib import Path

from spawnkit.budgets.budget import list_price, max_turns_message
from spawnkit.events import Started, UsageUpdate
from spawnkit.notebook.view_state import ViewState
from spawnkit.result import Usage

SID = "s1"


def running(runtime: str, max_turns: int = 20) -> ViewState:
    view = ViewState()
    view.apply(Started(SID, "health", runtime, None, None, max_turns=max_turns))
    return view


def test_a_cli_nothing_meters_says_tokens_at_the_end_not_zeros() -> None:
    view = running("codex")
    view.apply(UsageUpdate(SID, Usage(), None, None, at_end=True))
    view.apply(UsageUpdate(SID, Usage(), None, None, "replay-gpt-5"))
    figures = view.status.figures()
    assert "tokens at the end" in figures
    assert not any("in /" in f or "$" in f for f in figures), figures
    assert view.status.model == "replay-gpt-5"
    # Its one report at the end is shown as any other.
    view.apply(UsageUpdate(SID, Usage(1000, 100), None, None, "replay-gpt-5"))
    assert "1,000 in / 100 out tokens" in view.status.figures()


def test_a_model_named_before_any_usage_shows_no_zeros() -> None:
    view = running("claude-code")
    view.apply(UsageUpdate(SID, Usage(), None, None, "claude-sonnet-4-5"))
    assert not any("in /" in f or "tokens at the end" in f for f in view.status.figures())
    view.apply(UsageUpdate(SID, Usage(10, 5), None, 1, "claude-sonnet-4-5"))
    figures = view.status.figures()
    assert "turn 1/20" in figures and "10 in / 5 out tokens" in figures
    assert any(f.startswith("≈$") for f in figures), "priced live at the list price"


def test_the_turn_counter_never_reads_past_the_limit() -> None:
    view = running("claude-code", max_turns=20)
    view.apply(UsageUpdate(SID, Usage(10, 5), None, 21, None))
    assert "turn 20/20" in view.status.figures()


def test_the_max_turns_message_names_the_limit_and_how_to_raise_it(tmp_path: Path) -> None:
    where = tmp_path / "health" / "butler.toml"
    for said in ("reached the max_turns limit (20)", "reached the max_turns limit: settings.json"):
        message = max_turns_message(said, 20, where)
        assert message.startswith("stopped at max_turns = 20. To allow more: --max-turns N on")
        assert "`spawnkit run` or `%%spawn`" in message
        assert message.endswith(f"max_turns = N under [butler.runtime] in {where}")
    codex = max_turns_message("stopped after 20 tool calls: codex has no turn limit", 20, None)
    assert "(stopped after 20 tool calls: codex has no turn limit)" in codex
    assert codex.endswith("in the butler's butler.toml")


def test_list_price_estimates_a_family_and_prices_nothing_unknown() -> None:
    usage = Usage(1_000_000, 0)
    assert list_price("gpt-5", usage) == list_price("replay-gpt-5", usage) == 1.25
    assert list_price("mystery-model", usage) is None and list_price(None, usage) is None
