"""The client's side of cluster runs without a cluster: what travels, and what is refused.

Runs on real workers are in test_cluster_e2e.py and test_cluster_tcp_e2e.py.
"""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import pytest

from spawnkit.errors import ConfigError, MissingEnvError, QueueFullError, SpawnkitError
from spawnkit.events import ToolCallStarted
from spawnkit.result import ToolCall
from spawnkit.run.dispatch import SCHEDULER_VAR, Cluster, RemoteTrigger, event_message

distributed = pytest.importorskip("distributed")


@pytest.mark.parametrize(
    "error",
    [MissingEnvError("health", ["TOKEN", "OTHER"]), QueueFullError("butler 'b' is full")],
)
def test_spawnkit_errors_survive_pickling_whatever_their_constructor(error: SpawnkitError):
    """A trigger refused on a worker comes back to the client as the error itself."""
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert copy.__dict__ == error.__dict__


def test_a_remote_trigger_prints_no_store_password_or_prompt(make_butler):
    request = RemoteTrigger(
        butler=make_butler(), store="postgresql://u:s3cret@db/spawnkit", session_id="s-1",
        prompt="private prompt", trigger_source="external", options={}, replay=None,
        topic="t", cancel_event="e",
    )  # fmt: skip
    assert "s3cret" not in repr(request) and "private" not in repr(request)
    assert repr(request) == "RemoteTrigger(butler='health', session_id='s-1')"


def test_events_travel_as_msgpack_safe_messages():
    call = ToolCall(
        id="c1",
        name="mcp__health__state_get",
        input={"key": "weight"},
        started_at=datetime.now(UTC),
    )
    message = event_message("s-1", 3, ToolCallStarted("s-1", call))
    assert set(message) == {"session_id", "seq", "event"}
    assert isinstance(message["event"], bytes)
    assert pickle.loads(message["event"]) == ToolCallStarted("s-1", call)
    assert event_message("s-1", 4, None)["event"] is None  # the end of the stream


def test_without_a_client_or_scheduler_variable_there_is_no_cluster(monkeypatch):
    monkeypatch.delenv(SCHEDULER_VAR, raising=False)
    with pytest.raises(ConfigError, match=SCHEDULER_VAR):
        Cluster.from_environment()
    monkeypatch.setenv(SCHEDULER_VAR, "tcp://127.0.0.1:1")
    cluster = Cluster.from_environment()
    assert cluster.address == "tcp://127.0.0.1:1"
    cluster.close()  # never connected: nothing to close
