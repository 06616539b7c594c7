"""The offline pricing table: what a token costs, per model, when a runtime reports no cost.

The package ships ``prices.json`` (US dollars per million tokens, the unit vendors publish):
input, output, 5-minute and 1-hour cache writes, cache reads, and for models with a
long-context tier the rates that apply past ``above_tokens``. Two tier rules exist, each
matching how ccusage prices that vendor: ``"each"`` (Claude, as LiteLLM lists it) charges the
part of each token count past the threshold at the higher rate (of 300,000 input tokens,
200,000 at ``input`` and 100,000 at ``input_above``); ``"prompt"`` (Google's rule) charges the
whole request at the higher rates once its prompt (input plus cache reads and writes) is past
the threshold. A user replaces the table with
:meth:`PricingTable.load` or extends it with :meth:`PricingTable.with_prices`; nothing is
fetched from the network.

Model names are matched exactly, then without a date suffix (``claude-sonnet-4-5-20250929``),
a ``@date`` suffix (Vertex) or a provider prefix (``anthropic/``). A name still unknown is
priced as an estimate (:meth:`PricingTable.resolve` says so), the way ccusage falls back:

1. a table name that ends the unknown one (``aide-gpt-5`` is priced as ``gpt-5``);
2. the same family: vendor and tier (Claude's opus, sonnet or haiku; Gemini's pro, flash or
   flash-lite; GPT's variant such as ``codex`` or ``mini``), at the nearest version not
   above the unknown one, else the nearest above (``claude-opus-5`` is priced as the newest
   opus in the table, ``gemini-3.1-pro-preview`` as ``gemini-3-pro-preview``).

A model that matches neither has no price at all; loads warn once per such model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypedDict, cast

import numpy as np
import numpy.typing as npt

from ..errors import HistoryError

PER_MILLION = 1_000_000
_DATE_SUFFIX = re.compile(r"(-\d{8}|@\d{8}|-latest)$")
_PREFIX = re.compile(r"^(anthropic|openai|google|gemini|vertex_ai|models)/")
_FAMILIES = (
    # (pattern, family key built from the groups named tier/variant, version groups)
    re.compile(
        r"^claude-(?P<tier>opus|sonnet|haiku)-(?P<major>\d+)(?:[-.](?P<minor>\d{1,2}))?(?!\d)"
    ),
    re.compile(r"^claude-(?P<major>\d+)(?:[-.](?P<minor>\d{1,2}))?-(?P<tier>opus|sonnet|haiku)"),
    re.compile(r"^gemini-(?P<major>\d+)(?:\.(?P<minor>\d+))?-(?P<tier>flash-lite|flash|pro)"),
    re.compile(
        r"^gpt-(?P<major>\d+)(?:\.(?P<minor>\d+))?(?:-(?P<tier>[a-z-]+?))?(?:-\d{4}-\d{2}-\d{2})?$"
    ),
    re.compile(r"^o(?P<major>\d+)(?:-(?P<tier>mini|pro))?$"),
)

FloatArray = npt.NDArray[np.float64]
TierRule = Literal["each", "prompt"]


class PriceDict(TypedDict, total=False):
    """One model's entry in ``prices.json`` (US dollars per million tokens)."""

    input: float
    output: float
    cache_write: float
    cache_write_1h: float
    cache_read: float
    above_tokens: int
    tier: str
    input_above: float
    output_above: float
    cache_write_above: float
    cache_write_1h_above: float
    cache_read_above: float


@dataclass(frozen=True)
class ModelPrice:
    """Prices of one model in dollars per token; ``*_above`` apply past ``above_tokens``."""

    input: float
    output: float
    cache_write: float
    cache_write_1h: float
    cache_read: float
    above_tokens: int | None = None
    tier: TierRule = "each"
    input_above: float | None = None
    output_above: float | None = None
    cache_write_above: float | None = None
    cache_write_1h_above: float | None = None
    cache_read_above: float | None = None

    @classmethod
    def from_dict(cls, raw: PriceDict, where: str) -> ModelPrice:
        unknown = set(raw) - set(PriceDict.__annotations__)
        if unknown:
            raise HistoryError(f"{where}: unknown price keys {sorted(unknown)}")
        try:
            per = {
                k: float(cast(float, v)) / PER_MILLION
                for k, v in raw.items()
                if k not in ("above_tokens", "tier")
            }
            tier = raw.get("tier", "each")
            if tier not in ("each", "prompt"):
                raise ValueError(f"tier must be 'each' or 'prompt', not {tier!r}")
            base_input = per["input"]
            return cls(
                input=base_input,
                output=per["output"],
                # Vendors that do not sell cache writes bill them as input.
                cache_write=per.get("cache_write", base_input),
                cache_write_1h=per.get("cache_write_1h", per.get("cache_write", base_input)),
                cache_read=per.get("cache_read", base_input),
                above_tokens=int(raw["above_tokens"]) if "above_tokens" in raw else None,
                tier=cast(TierRule, tier),
                input_above=per.get("input_above"),
                output_above=per.get("output_above"),
                cache_write_above=per.get("cache_write_above"),
                cache_write_1h_above=per.get("cache_write_1h_above"),
                cache_read_above=per.get("cache_read_above"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise HistoryError(f"{where}: needs numeric input and output prices ({exc})") from exc

    def cost(
        self,
        input_tokens: npt.ArrayLike,
        output_tokens: npt.ArrayLike,
        cache_write_5m: npt.ArrayLike,
        cache_write_1h: npt.ArrayLike,
        cache_read: npt.ArrayLike,
    ) -> FloatArray:
        """Cost in dollars of each row of token counts (arrays or scalars)."""
        counts = (input_tokens, output_tokens, cache_write_5m, cache_write_1h, cache_read)
        if self.tier == "prompt" and self.above_tokens is not None:
            prompt = sum(np.asarray(c, np.float64) for i, c in enumerate(counts) if i != 1)
            high = self._flat(*counts, above=True)
            return np.where(prompt > self.above_tokens, high, self._flat(*counts, above=False))
        return (
            self._tiered(input_tokens, self.input, self.input_above)
            + self._tiered(output_tokens, self.output, self.output_above)
            + self._tiered(cache_write_5m, self.cache_write, self.cache_write_above)
            + self._tiered(cache_write_1h, self.cache_write_1h, self.cache_write_1h_above)
            + self._tiered(cache_read, self.cache_read, self.cache_read_above)
        )

    def _flat(
        self,
        input_tokens: npt.ArrayLike,
        output_tokens: npt.ArrayLike,
        cache_write_5m: npt.ArrayLike,
        cache_write_1h: npt.ArrayLike,
        cache_read: npt.ArrayLike,
        *,
        above: bool,
    ) -> FloatArray:
        """Every count at its base rate, or at its higher rate (``above``) where one exists."""

        def at(tokens: npt.ArrayLike, base: float, higher: float | None) -> FloatArray:
            rate = higher if above and higher is not None else base
            return np.asarray(tokens, np.float64) * rate

        return (
            at(input_tokens, self.input, self.input_above)
            + at(output_tokens, self.output, self.output_above)
            + at(cache_write_5m, self.cache_write, self.cache_write_above)
            + at(cache_write_1h, self.cache_write_1h, self.cache_write_1h_above)
            + at(cache_read, self.cache_read, self.cache_read_above)
        )

    def _tiered(self, tokens: npt.ArrayLike, base: float, above: float | None) -> FloatArray:
        n = np.asarray(tokens, dtype=np.float64)
        if self.above_tokens is None or above is None:
            return n * base
        over = np.maximum(n - self.above_tokens, 0.0)
        return (n - over) * base + over * above


@dataclass(frozen=True)
class PricingTable:
    """Model name to :class:`ModelPrice`; look-ups tolerate date suffixes and prefixes."""

    prices: dict[str, ModelPrice] = field(default_factory=dict)
    version: str = "custom"

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "prices") -> PricingTable:
        models = raw.get("models", raw)
        if not isinstance(models, dict):
            raise HistoryError(f"{where}: expected an object of models")
        prices = {
            name: ModelPrice.from_dict(cast(PriceDict, entry), f"{where}: {name}")
            for name, entry in models.items()
            if not name.startswith("_") and isinstance(entry, dict)
        }
        return cls(prices, str(raw.get("version", "custom")))

    @classmethod
    def load(cls, path: str | Path) -> PricingTable:
        """A table from a JSON file shaped like the shipped ``prices.json``."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise HistoryError(f"cannot read the pricing table {path}: {exc}") from exc
        return cls.from_dict(raw, str(path))

    def with_prices(self, extra: dict[str, PriceDict]) -> PricingTable:
        """This table plus (or with replaced) ``extra`` models, in dollars per million."""
        added = {n: ModelPrice.from_dict(p, f"prices: {n}") for n, p in extra.items()}
        return replace(self, prices={**self.prices, **added}, version=f"{self.version}+custom")

    def lookup(self, model: str | None) -> ModelPrice | None:
        """The model's own price, or None (see :meth:`resolve` for estimates)."""
        if not model:
            return None
        if model in self.prices:
            return self.prices[model]
        name = _PREFIX.sub("", model)
        for candidate in (name, _DATE_SUFFIX.sub("", name)):
            if candidate in self.prices:
                return self.prices[candidate]
        return None

    def resolve(self, model: str | None) -> tuple[ModelPrice | None, bool]:
        """``(price, estimated)``: the model's own price, else an estimate from a model of
        its family (see the module docstring), else ``(None, False)``."""
        exact = self.lookup(model)
        if exact is not None or not model:
            return exact, False
        name = _DATE_SUFFIX.sub("", _PREFIX.sub("", model))
        ending = [k for k in self.prices if name.endswith(k) and not name[-len(k) - 1].isalnum()
                  ] if name not in self.prices else []  # fmt: skip
        if ending:
            return self.prices[max(ending, key=len)], True
        key = _family(name)
        if key is None:
            return None, False
        members = [(_family(k), k) for k in self.prices]
        same = sorted((fam[1], k) for fam, k in members if fam is not None and fam[0] == key[0])
        if not same:
            return None, False
        below = [k for version, k in same if version <= key[1]]
        return self.prices[below[-1] if below else same[0][1]], True


def _family(name: str) -> tuple[tuple[str, str], tuple[int, int]] | None:
    """``((vendor, tier), (major, minor))`` of a model name, or None for an unknown shape."""
    for pattern in _FAMILIES:
        match = pattern.match(name)
        if match:
            groups = match.groupdict()
            vendor = name.split("-", 1)[0] if not name.startswith("o") else "o"
            version = (int(groups["major"]), int(groups.get("minor") or 0))
            return (vendor, groups.get("tier") or ""), version
    return None


def default_pricing() -> PricingTable:
    """The table shipped with spawnkit."""
    text = resources.files("spawnkit.config").joinpath("prices.json").read_text("utf-8")
    return PricingTable.from_dict(json.loads(text), "spawnkit/config/prices.json")
