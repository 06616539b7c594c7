"""``cli_telemetry``'s choice of signals: what it accepts, what each CLI is told, what the
receiver keeps. (The real CLIs with ``cli = "logs"``: tests/test_cli_telemetry_e2e.py.)"""

from __future__ import annotations

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

from spawnkit.config.cli_telemetry import CLI_SIGNALS, cli_signals
from spawnkit.errors import ConfigError
from spawnkit.redaction import Redactor
from spawnkit.run import Spawner
from spawnkit.runtimes import claude_code, codex, gemini
from spawnkit.store import SessionStore
from spawnkit.telemetry.otlp import CliTelemetry, OtlpReceiver

LOGS = frozenset({"logs"})


@pytest.mark.parametrize(
    ("choice", "signals"),
    [
        (True, CLI_SIGNALS), ("all", CLI_SIGNALS), (False, frozenset()), (None, frozenset()),
        ("logs", LOGS), ("Logs + metrics", {"logs", "metrics"}),
        ("traces+logs", {"traces", "logs"}),
    ],
)  # fmt: skip
def test_the_choices(choice: bool | str | None, signals: frozenset[str]) -> None:
    assert cli_signals(choice) == signals


@pytest.mark.parametrize("choice", ["spans", "", "logs+", 1, "logs,metrics"])
def test_a_bad_choice_is_a_config_error(choice: object, make_butler) -> None:
    with pytest.raises(ConfigError, match="must be true, false"):
        cli_signals(choice)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be true, false"):
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
