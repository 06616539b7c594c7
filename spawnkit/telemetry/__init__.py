"""What a run tells about itself while it runs: spans, the CLI's own telemetry, logs.

The run's OpenTelemetry span and ``TRACEPARENT`` (:mod:`.spans`, whose public names this
package also exports); the OTLP receiver of the CLI's own spans, logs and metrics
(:mod:`.otlp`); the model latency and tool time read from them (:mod:`.timings`); and the
per-session log files (:mod:`.runlog`).
"""

from __future__ import annotations

from typing import Any

# spawnkit.telemetry was the module spans.py before it was a package: its names stay here,
# loaded on first use (spans imports OpenTelemetry, which the other modules do not need).
__all__ = ["TRACER_NAME", "RunSpan", "run_span"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import spans

    return getattr(spans, name)
