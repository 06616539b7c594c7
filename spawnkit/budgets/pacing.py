"""A butler's pacing: the shared cool-down after a rate limit, and spaced run starts.

One :class:`Pacer` per spawner (so per butler in a process). When a run is rate-limited or
the model is overloaded, the spawner calls :meth:`Pacer.cool_down` with the backoff; every
run of the butler about to start (a retry, or a queued run that got its slot) then waits in
:meth:`Pacer.wait` until the cool-down is over, instead of all of them hitting the API that
just refused one. ``stagger_s`` keeps starts that far apart. Waits happen on the event loop's
clock; what a run waited is handed back so its record can show it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Waited:
    """What a start waited: on the cool-down, and on the stagger."""

    cooldown_s: float = 0.0
    stagger_s: float = 0.0


class Pacer:
    """The cool-down and the stagger of one butler's run starts."""

    def __init__(self, stagger_s: float = 0.0) -> None:
        self.stagger_s = stagger_s
        self._cool_until = 0.0  # time.monotonic()
        self._next_start = 0.0
        self.cooldowns = 0  # how many times a cool-down was set (or lengthened)

    def cool_down(self, seconds: float) -> None:
        """No run starts for ``seconds`` from now (a cool-down in effect is only lengthened)."""
        until = time.monotonic() + max(0.0, seconds)
        if until > self._cool_until:
            self._cool_until = until
            self.cooldowns += 1

    @property
    def cooling_for(self) -> float:
        """Seconds left of the cool-down in effect (0 when none is)."""
        return max(0.0, self._cool_until - time.monotonic())

    async def wait(self) -> Waited:
        """Wait until a run may start; the start is then taken (the stagger counts from it)."""
        cooled = staggered = 0.0
        while True:
            now = time.monotonic()
            if (left := self._cool_until - now) > 0:
                await asyncio.sleep(left)
                cooled += time.monotonic() - now
                continue  # another run may have lengthened it meanwhile
            if (left := self._next_start - now) > 0:
                await asyncio.sleep(left)
                staggered += time.monotonic() - now
                continue
            break
        if self.stagger_s:
            self._next_start = time.monotonic() + self.stagger_s
        return Waited(round(cooled, 3), round(staggered, 3))
