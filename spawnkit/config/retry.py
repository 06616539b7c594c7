"""``[butler.retry]``: when spawnkit starts a rate-limited run again, and how runs are spaced.

A :class:`RetryPolicy` is configuration and pure arithmetic, nothing else. A run whose CLI
failed on a rate limit (HTTP 429) or an overload (529, 503) *before any tool call ran* is
started again, up to ``max_attempts`` starts in all, after an exponential backoff with
jitter (:meth:`RetryPolicy.backoff`), or after the wait the API asked for when the CLI's
message says it ("try again in 20s": :func:`retry_after_hint`; the CLIs do not pass the
``Retry-After`` header on). A run that had called a tool is never started again: its tools
may have had effects. The spawner holds the backoff as the butler's shared cool-down
(:mod:`spawnkit.budgets.pacing`), so runs waiting for a start wait it out too. ``stagger_s`` spaces
the starts of a butler's runs. The default (``max_attempts = 1``) retries nothing.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from ..errors import InvalidArgument

# The error kinds (RuntimeFailure.kind) of a failure that waiting can cure.
RETRYABLE_KINDS = frozenset({"rate_limit", "overloaded"})
# "try again in 6.5s" (OpenAI), "Please retry in 41.4s" (Gemini), "retry after 3 seconds".
_HINT = re.compile(
    r"\b(?:retry|try again)\s+(?:after|in)\s+(\d+(?:\.\d+)?)\s*"
    r"(ms|milliseconds?|s|secs?|seconds?)?\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RetryPolicy:
    """How often a rate-limited run is started, how long between starts, and run spacing."""

    max_attempts: int = 1
    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    # At least this long between the starts of two runs of the butler (0: no spacing).
    stagger_s: float = 0.0

    def validate(self) -> RetryPolicy:
        """This policy, or InvalidArgument naming a setting out of range."""
        if isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be at least 1, not {self.max_attempts!r}")
        for name in ("backoff_s", "max_backoff_s", "stagger_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or value < 0:
                raise InvalidArgument(f"{name} must not be negative, not {value!r}")
        return self

    def backoff(self, failed_attempts: int, retry_after: float | None = None) -> float:
        """Seconds to wait after ``failed_attempts`` rate-limited starts (1 after the first).

        ``backoff_s`` doubled for each failure before, capped at ``max_backoff_s``, times a
        random factor in [1, 1.5) so runs limited together do not come back together; never
        shorter than the API's ``retry_after``.
        """
        base = min(self.max_backoff_s, self.backoff_s * 2 ** max(0, failed_attempts - 1))
        wait = base * (1 + random.random() / 2)  # jitter, not a secret
        return float(max(wait, retry_after or 0.0))


def retry_after_hint(message: str | None) -> float | None:
    """The wait in seconds a rate-limit message asks for, if it names one."""
    found = _HINT.search(message or "")
    if found is None:
        return None
    value = float(found.group(1))
    unit = (found.group(2) or "s").lower()
    return value / 1000 if unit.startswith("m") else value
