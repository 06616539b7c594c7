"""``[butler.limits]``: what one run may spend, as configuration and nothing else.

A :class:`Limits` comes from ``butler.toml`` (``[butler.limits]``), a Spawner option, a
trigger, a CLI flag or a magic flag; :meth:`Limits.over` lays one on top of another (the
narrower setting wins where both give one). It knows nothing of prices or usage: the run's
budget (:mod:`spawnkit.budgets.budget`) enforces it. ``max_turns`` and ``timeout_s`` may also be
given here; they are the same settings as ``[butler.runtime]``'s, which keeps them.
``daily_cost_usd`` is the butler's, not a run's: what its runs may spend in a UTC day, summed
from its records in the store (so every process sharing the store keeps to it).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields, replace

from ..errors import InvalidArgument


@dataclass(frozen=True)
class Limits:
    """Per-run limits; ``None`` means no limit of that kind.

    ``max_tokens`` counts input plus output tokens (cache writes are input); cache reads
    are counted apart and only count towards it with ``count_cache_reads``.
    """

    max_cost_usd: float | None = None
    max_tokens: int | None = None
    count_cache_reads: bool = False
    max_turns: int | None = None
    timeout_s: float | None = None
    # The butler's spend per UTC day, over all its runs and every process sharing its store.
    daily_cost_usd: float | None = None

    def over(self, base: Limits) -> Limits:
        """These limits laid over ``base``: a field set here replaces the base's."""
        changes = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None and f.name != "count_cache_reads"
        }
        if self.count_cache_reads:
            changes["count_cache_reads"] = True
        return replace(base, **changes)

    def validate(self) -> Limits:
        """These limits, or InvalidArgument naming one that is not a positive number.

        ``inf`` and ``nan`` are refused: no limit is ``None``, never an infinite one.
        """
        for name in ("max_cost_usd", "max_tokens", "max_turns", "timeout_s", "daily_cost_usd"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not math.isfinite(value) or value <= 0
            ):
                raise InvalidArgument(f"{name} must be positive, not {value!r}")
        return self

    @property
    def needs_usage(self) -> bool:
        """Whether enforcing these limits needs the run's token usage as it happens."""
        return any(v is not None for v in (self.max_cost_usd, self.max_tokens, self.daily_cost_usd))

    @property
    def dollar_limits(self) -> list[str]:
        """The names of the limits given in dollars."""
        return [n for n in ("max_cost_usd", "daily_cost_usd") if getattr(self, n) is not None]


def positive_number(text: str) -> float:
    """An option's text as a finite number above zero: the ``type=`` of every option of
    the command line and the magics that gives a limit in seconds or dollars.

    ``float()`` alone takes ``inf`` and ``nan`` (a timeout that never fires, a budget no
    comparison reaches); those, zero and negatives are usage errors.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text!r}")
    return value
