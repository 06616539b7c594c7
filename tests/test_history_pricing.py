"""The offline pricing table: tiers, 1-hour cache writes, name matching, replacement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spawnkit.history import HistoryError, ModelPrice, PricingTable, default_pricing


def test_long_context_tier_applies_to_each_count_past_the_threshold() -> None:
    sonnet = default_pricing().lookup("claude-sonnet-4-5")
    assert sonnet is not None and sonnet.above_tokens == 200_000
    # 300k input: 200k at $3 and 100k at $6 per million; 1M output: 200k at 15, 800k at 22.5.
    assert float(sonnet.cost(300_000, 0, 0, 0, 0)) == pytest.approx(1.2)
    assert float(sonnet.cost(0, 1_000_000, 0, 0, 0)) == pytest.approx(21.0)
    assert float(sonnet.cost(0, 0, 0, 1_000_000, 0)) == pytest.approx(10.8)  # 1-hour writes
    flat = default_pricing().lookup("claude-opus-4-5")
    assert flat is not None and float(flat.cost(1e6, 1e6, 1e6, 1e6, 1e6)) == pytest.approx(46.75)


def test_gemini_prices_the_whole_request_past_the_prompt_threshold() -> None:
    pro = default_pricing().lookup("gemini-2.5-pro")
    assert pro is not None and pro.tier == "prompt"
    # A 100k prompt: base rates; a 300k prompt: every token, output included, at the higher.
    assert float(pro.cost(100_000, 100_000, 0, 0, 0)) == pytest.approx(1.125)
    assert float(pro.cost(300_000, 100_000, 0, 0, 0)) == pytest.approx(2.25)
    assert float(pro.cost(150_000, 0, 0, 0, 100_000)) == pytest.approx(0.375 + 0.025)


def test_names_match_without_dates_prefixes_or_vertex_suffixes() -> None:
    table = default_pricing()
    exact = table.lookup("claude-haiku-4-5")
    for name in ("claude-haiku-4-5-20251001", "anthropic/claude-haiku-4-5",
                 "claude-haiku-4-5@20251001"):  # fmt: skip
        assert table.lookup(name) == exact
    assert table.lookup("claude-unknown-9") is None and table.lookup(None) is None


def test_a_user_table_replaces_or_extends_the_shipped_one(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"version": "mine", "models": {
        "house-model": {"input": 2, "output": 4, "cache_read": 0.5}}}))  # fmt: skip
    table = PricingTable.load(path)
    assert table.version == "mine" and table.lookup("claude-opus-4-5") is None
    house = table.lookup("house-model")
    assert house == ModelPrice(2e-6, 4e-6, 2e-6, 2e-6, 0.5e-6)  # writes default to input
    extended = default_pricing().with_prices({"house-model": {"input": 1, "output": 1}})
    assert extended.lookup("house-model") is not None and extended.lookup("gpt-5") is not None


@pytest.mark.parametrize(
    ("text", "message"),
    [("{", "cannot read the pricing table"),
     ('{"models": {"m": {"input": 1}}}', "needs numeric input and output"),
     ('{"models": {"m": {"input": 1, "output": 2, "per_call": 3}}}', "unknown price keys"),
     ('{"models": []}', "expected an object of models")],
)  # fmt: skip
def test_bad_tables_are_refused_with_the_reason(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(text)
    with pytest.raises(HistoryError, match=message):
        PricingTable.load(path)
