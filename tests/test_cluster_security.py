"""A spawnkit Dask cluster answers only its own members (spawnkit.containment.cluster_security).

Real processes throughout: ``spawnkit scheduler`` and ``spawnkit worker`` on ``tls://``, a
run through the real Claude Code CLI on the replay model, and the user ``nobody`` (through
``setpriv``) trying what anyone on the host could try against a ``tcp://`` cluster: submit
``os.system`` through the scheduler, or call the worker's and the nanny's ``run`` handler
directly. Without certificates signed by the cluster's CA, every connection is refused in
the TLS handshake, and the file the payload would write never appears.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from spawnkit.containment.cluster_security import (  # noqa: E402
    CA_KEY,
    SHARED,
    ClusterCredentials,
    ClusterSecurityError,
    ensure_credentials,
    export_credentials,
    load_credentials,
)
from spawnkit.run import Spawner  # noqa: E402
from spawnkit.run.dispatch import Cluster, RemoteTrigger  # noqa: E402
from spawnkit.store import SessionStore  # noqa: E402

from .conftest import REPO  # noqa: E402
from .postgres import PASSWORD  # noqa: E402
from .test_cluster_e2e import WEIGHT, scenario  # noqa: E402
from .test_cluster_tcp_e2e import _start, free_port  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SPAWNKIT = [sys.executable, "-m", "spawnkit"]
# What the user nobody runs: each way in it knows, tried in turn; prints what each did.
INTRUDER = r"""
import asyncio, json, os, pickle, sys
import distributed
from distributed.core import rpc
from distributed.security import Security

scheduler, servers, target = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
payload = f"id > {target}"
outcome = {}

def attempt(name, action):
    try:
        outcome[name] = f"ran: {action()!r}"
    except Exception as exc:
        outcome[name] = f"refused: {type(exc).__name__}: {exc}"[:300]

def submit(security):
    with distributed.Client(scheduler, timeout=5, security=security) as client:
        return client.submit(os.system, payload, pure=False).result(timeout=30)

def submit_plain():
    with distributed.Client("tcp://" + scheduler.partition("://")[2], timeout=5) as client:
        return client.submit(os.system, payload, pure=False).result(timeout=30)

async def call(address, security):
    args = security.get_connection_args("client") if security else {}
    async with rpc(address, connection_args=args, timeout=5) as server:
        return await server.run(function=pickle.dumps(os.system), args=pickle.dumps((payload,)))

own_ca = Security.temporary()  # certificates of the intruder's own making
attempt("submit without a certificate", lambda: submit(None))
attempt("submit over plain tcp", lambda: submit_plain())
attempt("submit with its own CA", lambda: submit(own_ca))
for address in servers:
    attempt(f"rpc {address} without a certificate", lambda: asyncio.run(call(address, None)))
    plain = "tcp://" + address.partition("://")[2]
    attempt(f"rpc {plain}", lambda: asyncio.run(call(plain, None)))
    attempt(f"rpc {address} with its own CA", lambda: asyncio.run(call(address, own_ca)))
print(json.dumps(outcome))
"""


def as_nobody(scheduler: str, servers: list[str], target: Path) -> dict[str, str]:
    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         sys.executable, "-c", INTRUDER, scheduler, json.dumps(servers), str(target)],
        capture_output=True, text=True, timeout=180, cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent",
             "DASK_TEMPORARY_DIRECTORY": "/tmp"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root (to act as the user nobody) and setpriv",
)


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in reversed(processes):
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def listening(pid: int) -> list[str]:
    """The addresses (``host:port``) process ``pid`` listens on over TCP, read from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = str(fd.readlink())
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(_address(fields[1]))
    return found


def _address(hex_address: str) -> str:
    raw, _, port = hex_address.partition(":")
    packed = bytes.fromhex(raw)
    if len(packed) == 4:
        host = ".".join(str(b) for b in reversed(packed))
    else:  # tcp6: four little-endian words
        words = b"".join(packed[i : i + 4][::-1] for i in range(0, 16, 4))
        host = f"[{words.hex()}]"
    return f"{host}:{int(port, 16)}"


# -- the credentials on disk ----------------------------------------------------------------


def test_credentials_are_private_kept_across_starts_and_exported_without_the_ca_key(
    isolated_home: Path, tmp_path: Path
):
    made = ensure_credentials()
    folder = isolated_home / "cluster"
    assert made.directory == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = sorted(p.name for p in folder.iterdir())
    assert files == sorted([*SHARED, CA_KEY])
    assert all(stat.S_IMODE((folder / f).stat().st_mode) == 0o600 for f in files)
    before = {f: (folder / f).read_bytes() for f in files}
    assert ensure_credentials() == made  # the next start reuses them
    assert {f: (folder / f).read_bytes() for f in files} == before

    shared = export_credentials(made, tmp_path / "for-host-2")
    assert sorted(p.name for p in shared.iterdir()) == sorted(SHARED)  # no CA key
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in shared.iterdir())
    assert load_credentials(shared) == ClusterCredentials(shared)

    (shared / "key.pem").chmod(0o644)  # copied carelessly: others could read the key
    with pytest.raises(ClusterSecurityError, match="chmod 600"):
        load_credentials(shared)


def test_a_client_with_credentials_refuses_a_tcp_address_and_secures_a_bare_one():
    ensure_credentials()
    with pytest.raises(ClusterSecurityError, match="not a secured scheduler"):
        Cluster("tcp://127.0.0.1:8786")
    assert Cluster("127.0.0.1:8786").address == "tls://127.0.0.1:8786"


# -- `spawnkit worker` refusals -------------------------------------------------------------


def test_spawnkit_worker_refuses_a_tcp_scheduler_without_insecure():
    done = subprocess.run(
        [*SPAWNKIT, "worker", "--scheduler", "tcp://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "not a secured scheduler" in done.stderr and "--insecure" in done.stderr


def test_spawnkit_worker_with_no_reachable_scheduler_says_so_in_one_line():
    ensure_credentials()  # a secured address, and this host has the credentials
    address = f"tls://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [*SPAWNKIT, "worker", "--scheduler", address],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"spawnkit: error: cannot reach the Dask scheduler at {address}: "
        + done.stderr.split(f"{address}: ", 1)[1].strip()
    ]
    assert "Traceback" not in done.stderr


def test_an_insecure_worker_starts_on_loopback_and_warns(isolated_home: Path, tmp_path: Path):
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ)
    scheduler = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                 "--port", str(port), "--dashboard-address", "127.0.0.1:0"]  # fmt: skip
    worker = [*SPAWNKIT, "--store", str(tmp_path / "s.db"), "worker", "--insecure",
              "--scheduler", address, "--", "--nthreads", "1"]  # fmt: skip
    log = tmp_path / "worker.log"
    processes = [_start(scheduler, env, tmp_path / "scheduler.log")]
    try:
        processes.append(_start(worker, env, log))
        with distributed.Client(address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=90)
            pids = client.run(os.getpid)
        text = log.read_text()
        assert f"spawnkit worker: WARNING: {address} is not secured (--insecure)" in text
        assert "spawnkit: this worker is not secured (--insecure)" in text  # every start
        (worker_pid,) = pids.values()
        sockets = listening(processes[1].pid) + listening(worker_pid)
        assert sockets and all(s.startswith("127.0.0.1:") for s in sockets), sockets
    finally:
        _stop(processes)


# -- a secured cluster ----------------------------------------------------------------------


@dataclass
class SecuredCluster:
    address: str
    client: Any  # the test's own member client
    home: Path  # the SPAWNKIT_HOME of the scheduler, the worker and the test's client
    store: Path
    nanny_pid: int


@pytest.fixture(scope="module")
def started_secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredCluster]:
    tmp_path = tmp_path_factory.mktemp("secured-cluster")
    home = tmp_path / "home"
    port = free_port()
    address = f"tls://127.0.0.1:{port}"
    store = tmp_path / "sessions.db"
    env = {**os.environ, "SPAWNKIT_HOME": str(home)}
    scheduler = [*SPAWNKIT, "scheduler", "--port", str(port), "--", "--dashboard-address",
                 "127.0.0.1:0"]  # fmt: skip
    processes = [_start(scheduler, env, tmp_path / "s.log")]
    client = None
    try:
        # The scheduler makes the credentials (all at once: renamed into place) before
        # Dask starts; bounded by the fixture's timeout.
        while not (home / "cluster").exists():
            assert processes[0].poll() is None, (tmp_path / "s.log").read_text()
            time.sleep(0.1)
        worker = [*SPAWNKIT, "--store", str(store), "worker", "--scheduler", address, "--",
                  "--nthreads", "2", "--name", "secured-worker"]  # fmt: skip
        processes.append(_start(worker, env, tmp_path / "w.log"))
        security = ClusterCredentials(home / "cluster").security()
        client = distributed.Client(address, timeout=60, set_as_default=False, security=security)
        client.wait_for_workers(1, timeout=90)
        yield SecuredCluster(address, client, home, store, processes[1].pid)
    finally:
        if client is not None:
            client.close()
        _stop(processes)


@pytest.fixture
def secured(started_secured: SecuredCluster, monkeypatch: pytest.MonkeyPatch) -> SecuredCluster:
    """The module's secured cluster, this test in its SPAWNKIT_HOME (with its credentials)."""
    monkeypatch.setenv("SPAWNKIT_HOME", str(started_secured.home))
    started_secured.client.wait_for_workers(1, timeout=90)
    return started_secured


def test_a_secured_cluster_runs_a_run_end_to_end(make_butler, secured, tmp_path):
    butler = make_butler()
    scenario_file = tmp_path / "weight.toml"
    scenario_file.write_text(WEIGHT)
    done = subprocess.run(
        [*SPAWNKIT, "--store", str(secured.store), "run", "--roster", str(butler.roster_dir),
         "--butler", butler.name, "--replay", str(scenario_file), "--on", secured.address,
         "--json", "Please log my weight"],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["success"] and "72.4 kg" in result["output"]
    with SessionStore(secured.store) as store:
        record = store.get_session(result["session_id"])
        assert record is not None and record.status == "success"
        assert [c["tool"] for c in store.mcp_calls(record.id)] == ["state_set", "state_get"]


def test_the_secured_worker_and_its_nanny_listen_on_loopback_only(secured):
    (worker,) = secured.client.run(os.getpid).values()
    sockets = listening(secured.nanny_pid) + listening(worker)
    assert len(sockets) >= 2 and all(s.startswith("127.0.0.1:") for s in sockets), sockets
    info = secured.client.scheduler_info()["workers"]
    assert all(a.startswith("tls://127.0.0.1:") for a in info)
    assert all(w["nanny"].startswith("tls://127.0.0.1:") for w in info.values())


@needs_root
def test_nobody_cannot_submit_to_the_scheduler_nor_call_the_worker(secured, tmp_path):
    target = tmp_path / "owned-by-nobody"
    info = secured.client.scheduler_info()["workers"]
    servers = [*info, *(w["nanny"] for w in info.values())]
    outcome = as_nobody(secured.address, servers, target)
    print(json.dumps(outcome, indent=1))
    assert len(outcome) == 3 + 3 * len(servers)
    assert all(what.startswith("refused") for what in outcome.values()), outcome
    assert not target.exists()


async def test_the_payload_holds_no_store_password(make_butler, postgres_url, monkeypatch):
    """What the client sends the scheduler names the store by its URL without password;
    the worker opens it with the password of its own SPAWNKIT_STORE, and the run succeeds."""
    assert PASSWORD in postgres_url
    sent: list[RemoteTrigger] = []  # the triggers of the tasks the scheduler received

    class Capture(distributed.diagnostics.plugin.SchedulerPlugin):  # type: ignore[misc]
        def __init__(self, scheduler: Any) -> None:
            self.scheduler = scheduler

        def transition(self, key: Any, start: str, finish: str, *a: Any, **kw: Any) -> None:
            task = self.scheduler.tasks.get(key)
            if start == "released" and task is not None and task.run_spec is not None:
                spec = task.run_spec
                sent.extend(x for x in (*spec.args, *spec.kwargs.values())
                            if isinstance(x, RemoteTrigger))  # fmt: skip

    monkeypatch.setenv("SPAWNKIT_HOST", "dask-worker-host")
    with (
        distributed.LocalCluster(
            processes=True, n_workers=1, threads_per_worker=2, dashboard_address=None,
            env={"SPAWNKIT_STORE": postgres_url, "SPAWNKIT_HOST": "dask-worker-host"},
        ) as local,
        distributed.Client(local) as client,
        SessionStore(postgres_url) as store,
    ):  # fmt: skip
        local.scheduler.add_plugin(Capture(local.scheduler))
        with Cluster(client, replay=scenario(WEIGHT)) as cluster:
            spawner = Spawner(make_butler(), store=store, cluster=cluster)
            result = await spawner.trigger("Please log my weight")
        record = await asyncio.to_thread(store.get_session, result.session_id)
    assert result.success, result.error
    assert record is not None and record.status == "success"
    assert record.owner_host == "dask-worker-host"
    assert len(sent) == 1, "the scheduler saw no trigger"
    fields = {f.name: repr(getattr(sent[0], f.name)) for f in dataclasses.fields(sent[0])}
    assert not [name for name, value in fields.items() if PASSWORD in value], fields
    assert sent[0].store == store.location  # the URL, without password
