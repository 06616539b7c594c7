"""Which of its own telemetry signals a run's CLI exports (``[butler.telemetry] cli``).

``true`` (or ``"all"``) asks for everything: spans, log events and metric points. A
choice of signals (``"logs"``, ``"logs+metrics"``, ``"traces+logs"``…) keeps only those,
and costs less: a Codex run's 500-odd spans are most of what its telemetry costs (the
CLI's exporting and spawnkit's decoding), while the timings (``history.timings()``, the
live ``Timing`` events) come from the log events alone. It lives here, below the
runtimes and the spawner, because the butler's configuration holds it.
"""

from __future__ import annotations

from typing import Literal, get_args

from ..errors import ConfigError

CliSignal = Literal["traces", "logs", "metrics"]
CLI_SIGNALS: frozenset[CliSignal] = frozenset(get_args(CliSignal))
# What ``cli_telemetry`` accepts: on/off, or signals joined by "+".
CliTelemetryChoice = bool | str
CHOICE_HELP = 'true, false, "all", or signals joined by "+" from "traces", "logs", "metrics"'


def cli_signals(choice: CliTelemetryChoice | None) -> frozenset[CliSignal]:
    """The signals a choice names (none when off); ``ConfigError`` for one it does not."""
    if choice is None or choice is False:
        return frozenset()
    if choice is True:
        return CLI_SIGNALS
    if not isinstance(choice, str):
        raise ConfigError(f"cli telemetry must be {CHOICE_HELP}; got {choice!r}")
    if choice.strip().lower() == "all":
        return CLI_SIGNALS
    names = [name.strip().lower() for name in choice.split("+")]
    unknown = [name for name in names if name not in CLI_SIGNALS]
    if unknown or not names:
        raise ConfigError(f"cli telemetry must be {CHOICE_HELP}; got {choice!r}")
    return frozenset(name for name in CLI_SIGNALS if name in names)
