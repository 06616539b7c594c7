"""``cli_telemetry``'s choice of signals: what it accepts, what each CLI is told, what the
receiver keeps. (The real CLIs with ``cli = "logs"``: tests/test_cli_telemetry_e2e.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)

from spawnkit.config.cli_telemetry import CLI_SIGNALS, parse_choice
from spawnkit.errors import ConfigError
from spawnkit.redaction import Redactor
from spawnkit.run import Spawner
from spawnkit.runtimes import claude_code, codex, gemini
from spawnkit.store import SessionStore
from spawnkit.telemetry.otlp import CliTelemetry, OtlpReceiver

LOGS = frozenset({"logs"})


ALL = CLI_SIGNALS


@pytest.mark.parametrize(
    ("choice", "runtime", "signals"),
    [
        ("all", "codex", ALL), ("all", "claude-code", ALL), (False, "codex", frozenset()),
        (None, "gemini", frozenset()), ("logs", "claude-code", LOGS),
        ("Logs + metrics", "codex", {"logs", "metrics"}),
        ("traces+logs", "codex", {"traces", "logs"}),
        # true: each runtime's default set; Codex's spans cost a third of its run's CPU.
        (True, "codex", LOGS), ("default", "codex", LOGS), (True, "claude-code", ALL),
        (True, "gemini", ALL), (True, "acp", ALL),
        # A share of 1 is every run.
        ("logs+traces@1", "codex", {"logs", "traces"}),
    ],
)  # fmt: skip
def test_the_choices(choice: bool | str | None, runtime: str, signals: frozenset[str]) -> None:
    assert parse_choice(choice).for_run(runtime) == signals
    assert bool(parse_choice(choice)) == (choice not in (False, None))


def test_a_sampled_signal_is_drawn_run_by_run() -> None:
    """``traces@0.25``: a run whose draw falls below the share exports the spans, whole; the
    others do not. The signals without a share are in every run."""
    choice = parse_choice("logs+traces@0.25")
    assert choice.for_run("codex", draw=lambda: 0.1) == {"logs", "traces"}
    assert choice.for_run("codex", draw=lambda: 0.25) == LOGS
    assert choice.for_run("codex", draw=lambda: 0.9) == LOGS
    only = parse_choice("traces@0.5")
    assert only and only.for_run("claude-code", draw=lambda: 0.7) == frozenset()  # off that run
    draws = [parse_choice("logs+traces@0.5").for_run("codex") for _ in range(400)]
    assert 0 < sum("traces" in d for d in draws) < 400  # the real draw, both ways


@pytest.mark.parametrize(
    "choice",
    ["spans", "", "logs+", 1, "logs,metrics", "logs+logs", "traces@0", "traces@1.5",
     "traces@", "traces@x", "logs@nan", "all@0.5"],
)  # fmt: skip
def test_a_bad_choice_is_a_config_error(choice: object, make_butler) -> None:
    with pytest.raises(ConfigError, match="cli telemetry"):
        parse_choice(choice)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cli telemetry"):
        Spawner(make_butler(), store=SessionStore(), cli_telemetry=choice)  # type: ignore[arg-type]


def test_each_cli_is_told_only_the_chosen_signals() -> None:
    everything = CliTelemetry("http://127.0.0.1:9", "s1", "secret")
    logs = CliTelemetry("http://127.0.0.1:9", "s1", "secret", LOGS)
    env = claude_code.telemetry_env(everything)
    assert (env["OTEL_TRACES_EXPORTER"], env["OTEL_METRICS_EXPORTER"]) == ("otlp", "otlp")
    assert env["CLAUDE_CODE_ENHANCED_TELEMETRY_BETA"] == "1"
    env = claude_code.telemetry_env(logs)
    assert (env["OTEL_TRACES_EXPORTER"], env["OTEL_METRICS_EXPORTER"]) == ("none", "none")
    assert env["OTEL_LOGS_EXPORTER"] == "otlp"
    assert "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA" not in env
    config = codex.otel_config(logs)
    assert (config["trace_exporter"], config["metrics_exporter"]) == ("none", "none")
    assert config["exporter"]["otlp-http"]["endpoint"] == "http://127.0.0.1:9/v1/logs"
    assert isinstance(codex.otel_config(everything)["trace_exporter"], dict)
    assert gemini.telemetry_env(logs)["GEMINI_TELEMETRY_TRACES_ENABLED"] == "false"
    assert gemini.telemetry_env(everything)["GEMINI_TELEMETRY_TRACES_ENABLED"] == "true"


async def test_the_receiver_drops_a_signal_not_chosen_unread() -> None:
    """Gemini sends its metrics whatever it is told: with ``"logs"`` they are answered
    (the exporter must not retry) and not decoded, even when they are not OTLP at all."""
    point = NumberDataPoint(time_unix_nano=9, as_int=4)
    metrics = ExportMetricsServiceRequest(resource_metrics=[ResourceMetrics(scope_metrics=[
        ScopeMetrics(metrics=[Metric(name="m", gauge=Gauge(data_points=[point]))])])])  # fmt: skip
    receiver = OtlpReceiver("s1", Redactor(), signals=LOGS)
    async with receiver.serve() as telemetry, httpx.AsyncClient() as http:
        assert telemetry.signals == LOGS
        answers = [
            await http.post(telemetry.url("metrics"), content=body, headers=telemetry.headers)
            for body in (metrics.SerializeToString(), b"\xff not protobuf")
        ]
        traces = await http.post(telemetry.url("traces"), content=b"", headers=telemetry.headers)
    assert [a.status_code for a in answers] == [200, 200] and traces.status_code == 200
    assert receiver.events == [] and receiver.spans == []
    assert receiver.unwanted == 3


@pytest.mark.parametrize(
    ("choice", "collected"),
    [("all", ["logs", "metrics", "traces"]), ("traces@0.000000001", []), (False, None)],
)
async def test_each_runs_record_says_what_it_collected(
    make_butler,
    store: SessionStore,
    tmp_path: Path,
    choice: str | bool,
    collected: list[str] | None,
) -> None:
    """A real run (a command runtime: the receiver is started and named in the run's
    setup, whatever the CLI does with it). A run that drew none of its sampled signals
    says so, with no receiver; with telemetry off the record does not mention it."""
    agent = tmp_path / "agent.py"
    agent.write_text("import sys\nprint('answer to', sys.stdin.read())\n")
    butler = make_butler(
        "plain",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = [{json.dumps(sys.executable)}, {json.dumps(str(agent))}]
        stdin = "prompt"
        """,
    )
    result = await Spawner(butler, store=store, cli_telemetry=choice).trigger("hi")
    assert result.success, result.error
    record = store.get_session(result.session_id or "")
    assert record is not None and record.given is not None
    assert record.given.get("cli_telemetry") == collected
