"""Which of its own telemetry signals a run's CLI exports (``[butler.telemetry] cli``).

``true`` (or ``"default"``) asks for each runtime's default set: what costs a run no more
than about a tenth of its CPU there. That is everything (spans, log events and metric
points) on Claude Code and Gemini, and the log events alone on Codex, whose 500-odd spans
a run cost it and spawnkit a third of the run's CPU (docs/benchmarks.md). The timings
(``history.timings()``, the live ``Timing`` events) come from the log events alone; the
span views (``history.spans()``, ``history.waterfall()``) need the spans.

``"all"`` asks for every signal on every runtime. A choice of signals (``"logs"``,
``"logs+metrics"``, ``"traces+logs"``...) keeps only those, on every runtime. A signal may
carry a share of runs, ``"logs+traces@0.1"``: then spawnkit draws, run by run, whether
that run exports it (a run is traced whole or not at all), and the run's record says what
it got (``given["cli_telemetry"]``). It lives here, below the runtimes and the spawner,
because the butler's configuration holds it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

from ..errors import ConfigError

CliSignal = Literal["traces", "logs", "metrics"]
CLI_SIGNALS: frozenset[CliSignal] = frozenset(get_args(CliSignal))
# What ``cli_telemetry`` accepts: on/off, or signals joined by "+".
CliTelemetryChoice = bool | str
CHOICE_HELP = (
    'true, false, "default", "all", or signals joined by "+" from "traces", "logs", '
    '"metrics", each with an optional share of runs ("traces@0.1")'
)
# ``true``'s signals where a runtime's everything costs more than about a tenth of a run's
# CPU (measured by benchmarks/spawn_overhead.py --cli-telemetry; docs/benchmarks.md).
# Runtimes not named get every signal.
RUNTIME_DEFAULTS: Mapping[str, frozenset[CliSignal]] = MappingProxyType(
    {"codex": frozenset({"logs"})}
)


@dataclass(frozen=True)
class SignalChoice:
    """A butler's choice of its CLIs' signals, as parsed; ``for_run`` says one run's.

    ``signals`` None means each runtime's default set (:data:`RUNTIME_DEFAULTS`);
    ``shares`` the signals exported only in a share of runs, with that share (0 < s ≤ 1).
    False when telemetry is off.
    """

    signals: frozenset[CliSignal] | None = frozenset()
    shares: Mapping[CliSignal, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.signals is None or bool(self.signals)

    def for_run(
        self, runtime: str, draw: Callable[[], float] = random.random
    ) -> frozenset[CliSignal]:
        """The signals one run of ``runtime`` exports: a sampled signal is in when ``draw()``
        (uniform in [0, 1)) falls below its share."""
        if self.signals is None:
            return RUNTIME_DEFAULTS.get(runtime, CLI_SIGNALS)
        return frozenset(
            signal
            for signal in self.signals
            if signal not in self.shares or draw() < self.shares[signal]
        )


def parse_choice(choice: CliTelemetryChoice | None) -> SignalChoice:
    """What a choice asks for (off when None or false); ``ConfigError`` for one it does not."""
    if choice is None or choice is False:
        return SignalChoice()
    if choice is True:
        return SignalChoice(None)
    if not isinstance(choice, str):
        raise ConfigError(f"cli telemetry must be {CHOICE_HELP}; got {choice!r}")
    named = choice.strip().lower()
    if named == "default":
        return SignalChoice(None)
    if named == "all":
        return SignalChoice(CLI_SIGNALS)
    signals: set[CliSignal] = set()
    shares: dict[CliSignal, float] = {}
    for part in named.split("+"):
        name, _, share = (item.strip() for item in part.partition("@"))
        if name not in CLI_SIGNALS or name in signals:
            raise ConfigError(f"cli telemetry must be {CHOICE_HELP}; got {choice!r}")
        signals.add(name)
        if "@" in part:
            shares[name] = _share(share, choice)
    return SignalChoice(frozenset(signals), MappingProxyType(shares))


def _share(text: str, choice: str) -> float:
    try:
        share = float(text)
    except ValueError:
        share = math.nan
    if not 0 < share <= 1:
        raise ConfigError(
            f"cli telemetry: a signal's share of runs is a number above 0 and at most 1 "
            f"(traces@0.1); got {choice!r}"
        )
    return share
