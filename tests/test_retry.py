"""``[butler.retry]`` as configuration, the backoff arithmetic, and the butler's pacer."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from spawnkit.budgets.pacing import Pacer
from spawnkit.config.retry import RetryPolicy, retry_after_hint
from spawnkit.errors import InvalidArgument, RosterError


def test_butler_retry_is_read(make_butler) -> None:
    butler = make_butler(
        extra="[butler.retry]\nmax_attempts = 5\nbackoff_s = 0.5\nmax_backoff_s = 8\n"
        "stagger_s = 1.5\n"
    )
    assert butler.retry == RetryPolicy(max_attempts=5, backoff_s=0.5, max_backoff_s=8,
                                       stagger_s=1.5)  # fmt: skip
    assert make_butler(name="plain").retry == RetryPolicy(max_attempts=1), "off by default"
    assert make_butler(name="nostagger", extra="[butler.retry]\nstagger_s = 0\n").retry == (
        RetryPolicy()
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[butler.retry]\nmax_attempts = 0\n", "[butler.retry.max_attempts]: must be at least 1"),
        ("[butler.retry]\nbackoff_s = -1\n", "[butler.retry.backoff_s]: must be positive"),
        ("[butler.retry]\nstagger_s = -2\n", "[butler.retry.stagger_s]: must be positive"),
        ("[butler.retry]\nattempts = 3\n", "[butler.retry.attempts]: unknown key"),
    ],
)
def test_bad_retry_settings_name_the_key(make_butler, extra: str, message: str) -> None:
    with pytest.raises(RosterError, match=re.escape(message)):
        make_butler(extra=extra)


def test_a_retry_policy_given_to_a_spawner_is_checked() -> None:
    with pytest.raises(InvalidArgument, match="max_attempts must be at least 1, not 0"):
        RetryPolicy(max_attempts=0).validate()
    with pytest.raises(InvalidArgument, match="stagger_s must not be negative"):
        RetryPolicy(stagger_s=-1).validate()


def test_backoff_doubles_with_jitter_up_to_its_cap_and_honours_retry_after() -> None:
    policy = RetryPolicy(max_attempts=9, backoff_s=1.0, max_backoff_s=5.0)
    for failures, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (8, 5.0)]:
        waits = [policy.backoff(failures) for _ in range(200)]
        assert all(base <= w < base * 1.5 for w in waits), (failures, min(waits), max(waits))
        assert len(set(waits)) > 1, "jittered"
    assert policy.backoff(1, retry_after=30.0) == 30.0, "the API's wait wins when longer"
    assert 1.0 <= policy.backoff(1, retry_after=0.1) < 1.5


@pytest.mark.parametrize(
    ("message", "seconds"),
    [
        ("Rate limit reached for gpt-5. Please try again in 6.5s. Visit ...", 6.5),
        ("[API Error: quota exceeded] Please retry in 41.4s.", 41.4),
        ("rate limited by the replay server: try again in 3s", 3.0),
        ("Please try again in 250ms.", 0.25),
        ("retry after 2 seconds", 2.0),
        ("API Error: Request rejected (429) · Too many requests", None),
        (None, None),
    ],
)
def test_retry_after_hints_are_read_from_messages(
    message: str | None, seconds: float | None
) -> None:
    assert retry_after_hint(message) == seconds


async def test_the_pacer_holds_starts_through_a_cool_down_and_spaces_them() -> None:
    pacer = Pacer(stagger_s=0.2)
    assert pacer.cooling_for == 0.0
    first = await pacer.wait()
    assert (first.cooldown_s, first.stagger_s) == (0.0, 0.0)
    pacer.cool_down(0.3)
    pacer.cool_down(0.1)  # a shorter cool-down does not shorten the one in effect
    assert 0.2 < pacer.cooling_for <= 0.3 and pacer.cooldowns == 1
    clock = time.monotonic()
    waits = await asyncio.gather(pacer.wait(), pacer.wait())
    took = time.monotonic() - clock
    assert all(w.cooldown_s >= 0.25 for w in waits)
    # The second start also waited out the stagger the first one took.
    assert sorted(w.stagger_s for w in waits)[1] >= 0.15
    assert took >= 0.45
