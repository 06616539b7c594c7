"""OpenTelemetry for runs: one ``invoke_agent <butler>`` span each, tool calls as children.

Attributes follow the GenAI semantic conventions (``gen_ai.*``). spawnkit
never installs a global tracer provider; the spawner uses one of its own only when
the application configured none and either the standard ``OTEL_EXPORTER_OTLP_*``
variables name a collector (:func:`spawnkit.telemetry.otlp_export.tracer_provider_from_env`) or CLI
telemetry is on. With none configured, spans are
non-recording, no trace id is stored and no ``TRACEPARENT`` reaches the child,
and the run works the same. With one configured (the application's, or one
passed to the spawner), the session record keeps the trace id and the child
gets the W3C ``TRACEPARENT`` of the run's span, so a CLI that exports its own
telemetry nests under it.

Every attribute and status message a run's spans get passes the run's
:class:`~spawnkit.redaction.Redactor` (redacted before it is cut to length, so
no prefix of a secret survives a cut).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..redaction import Redactor
from ..result import SpawnerResult, ToolCall

TRACER_NAME = "spawnkit"
_PROVIDERS = {"claude-code": "anthropic", "codex": "openai", "gemini": "gcp.gemini"}


_Attributes = Mapping[str, str | int | float | bool]


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


class RunSpan:
    """The span of one run, with helpers for its trace id, traceparent and tool calls."""

    def __init__(
        self, span: trace.Span, tracer: trace.Tracer, redactor: Redactor | None = None
    ) -> None:
        self.span = span
        self._tracer = tracer
        self.redactor = redactor or Redactor()

    def _clean(self, attributes: _Attributes) -> dict[str, str | int | float | bool]:
        return {
            key: self.redactor.text(value) if isinstance(value, str) else value
            for key, value in attributes.items()
        }

    def _error(self, span: trace.Span, message: str | None) -> None:
        span.set_status(Status(StatusCode.ERROR, self.redactor.text(message or "")[:200]))

    @property
    def trace_id(self) -> str | None:
        ctx = self.span.get_span_context()
        return trace.format_trace_id(ctx.trace_id) if ctx.is_valid else None

    def traceparent(self) -> str | None:
        if not self.span.get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(self.span))
        return carrier.get("traceparent")

    def tool_call(self, call: ToolCall) -> None:
        """Record a finished tool call as a child span with its real start and end."""
        if not self.span.is_recording():
            return
        child = self._tracer.start_span(
            f"execute_tool {call.tool}",
            context=trace.set_span_in_context(self.span),
            kind=SpanKind.INTERNAL,
            start_time=_ns(call.started_at),
            attributes=self._clean(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": call.tool,
                    "gen_ai.tool.call.id": call.id,
                    "gen_ai.tool.type": "extension" if call.server else "function",
                    **({"spawnkit.mcp.server": call.server} if call.server else {}),
                }
            ),
        )
        if call.status == "error":
            self._error(child, call.output)
        child.end(end_time=_ns(call.finished_at) if call.finished_at else None)

    def record_exception(self, exc: BaseException) -> None:
        """Record ``exc`` on the run's span as an ``exception`` event, its text redacted."""
        if not self.span.is_recording():
            return
        trace_text = "".join(traceback.format_exception(exc))
        self.span.record_exception(
            exc,
            attributes={
                "exception.message": self.redactor.text(str(exc)),
                "exception.stacktrace": self.redactor.text(trace_text),
            },
        )

    def finish(self, result: SpawnerResult) -> None:
        span = self.span
        if not span.is_recording():
            return
        for call in result.tool_calls:
            if call.finished_at is None:
                self.tool_call(call)
        usage = result.usage
        attributes: dict[str, str | int | float | bool] = {
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
            "spawnkit.status": result.status,
            "spawnkit.tool_calls": len(result.tool_calls),
        }
        if result.model:
            attributes["gen_ai.response.model"] = result.model
        if result.runtime_session_id:
            attributes["gen_ai.conversation.id"] = result.runtime_session_id
        if result.cost_usd is not None:
            attributes["spawnkit.cost_usd"] = result.cost_usd
        if not result.success:
            attributes["error.type"] = result.error_kind or result.status
            self._error(span, result.error)
        span.set_attributes(self._clean(attributes))


@contextmanager
def run_span(
    *,
    butler: str,
    runtime: str,
    model: str | None,
    session_id: str,
    trigger_source: str,
    provider: TracerProvider | None = None,
    redactor: Redactor | None = None,
    kind: str = "run",
) -> Iterator[RunSpan]:
    """Open the run's span and make it current for the block."""
    tracer = trace.get_tracer(TRACER_NAME, tracer_provider=provider)
    redactor = redactor or Redactor()
    attributes: dict[str, str] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": butler,
        "gen_ai.provider.name": _PROVIDERS.get(runtime, runtime),
        "spawnkit.session_id": session_id,
        "spawnkit.runtime": runtime,
        "spawnkit.trigger_source": trigger_source,
        "spawnkit.kind": kind,
    }
    if model:
        attributes["gen_ai.request.model"] = model
    with tracer.start_as_current_span(
        f"invoke_agent {butler}",
        kind=SpanKind.CLIENT,
        attributes={k: redactor.text(v) for k, v in attributes.items()},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield RunSpan(span, tracer, redactor)
