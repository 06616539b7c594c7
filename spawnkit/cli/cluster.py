"""``spawnkit scheduler`` and ``spawnkit worker``: a secured Dask cluster that runs
butlers' triggers. Each command checks what it can before it hands its process over to
``dask scheduler`` (``exec``) or runs ``dask worker`` in it, so a mistake is one line, not
Dask's traceback, and a worker that spawnkit's plugin closed exits non-zero, not 0."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .parsing import Commands
from .reporting import EXIT_OK, EXIT_USAGE, say


def add_scheduler(commands: Commands) -> None:
    scheduler = commands.add_parser(
        "scheduler",
        help="start a secured Dask scheduler (tls://, certificates in $SPAWNKIT_HOME/cluster)",
        description="Starts `dask scheduler` on tls:// with the cluster's certificates, made "
        "on first use in $SPAWNKIT_HOME/cluster (0600 files in a 0700 folder) and kept: only "
        "holders of them can submit tasks or join. Another host joins with a copy: "
        "`spawnkit scheduler --export-credentials DIR`, copy DIR there, then `spawnkit worker "
        "--credentials DIR --scheduler tls://HOST:PORT` (or copy DIR to that host's "
        "$SPAWNKIT_HOME/cluster, which clients and workers read by default). Arguments after "
        "-- go to dask scheduler.",
    )
    scheduler.add_argument("--host", default="127.0.0.1", help="listen here (default: loopback)")
    scheduler.add_argument("--port", type=int, default=8786, help="default: 8786")
    scheduler.add_argument(
        "--export-credentials", type=Path, metavar="DIR",
        help="write what another host needs to join into DIR (new or empty) and exit",
    )  # fmt: skip
    scheduler.add_argument("scheduler_options", nargs="*", metavar="DASK_SCHEDULER_OPTION")


def add_worker(commands: Commands) -> None:
    worker = commands.add_parser(
        "worker",
        help="start a Dask worker that runs butlers' triggers (dask worker + spawnkit's plugin)",
        description="Starts `dask worker SCHEDULER --preload spawnkit.cluster.worker`: at "
        "start-up it checks the agent CLIs and the store (--store, else the default), and "
        "refuses to start (exit 2) when it cannot run agents. It joins only a secured (tls://) "
        "scheduler, with the certificates of `spawnkit scheduler` (--credentials DIR, else "
        "$SPAWNKIT_HOME/cluster), and listens on the address it reaches the scheduler from "
        "(loopback for a scheduler on loopback) unless given --host or --listen-address "
        "after --. Arguments after -- go to dask worker.",
    )
    worker.add_argument("--scheduler", required=True, metavar="ADDR", help="tls://host:8786")
    worker.add_argument(
        "--credentials", type=Path, metavar="DIR",
        help="the cluster's certificates (default: $SPAWNKIT_HOME/cluster)",
    )  # fmt: skip
    worker.add_argument(
        "--insecure", action="store_true",
        help="join a tcp:// scheduler: whoever reaches it or this worker can run code here",
    )  # fmt: skip
    worker.add_argument("worker_options", nargs="*", metavar="DASK_WORKER_OPTION")


def cmd_worker(args: argparse.Namespace) -> int:
    from ..run.dispatch import require_distributed

    require_distributed()  # says how to install it when it is missing (exit 2)
    from ..cluster.worker import check_worker, reach_scheduler, run_worker, secured_worker

    scheduler, options, credentials = secured_worker(
        args.scheduler, args.worker_options, credentials=args.credentials, insecure=args.insecure
    )
    if credentials is None:
        say(f"spawnkit worker: WARNING: {scheduler} is not secured (--insecure)")
    # Checked before Dask starts (one line, no Dask), and again by the plugin in the worker.
    report = check_worker()
    if not report.ready:
        say(f"spawnkit worker: this host cannot run agents: {report.problem}")
        return EXIT_USAGE
    reach_scheduler(scheduler, credentials)  # one line, not Dask's traceback, when out of reach
    code, refused = run_worker(scheduler, options)
    if refused is not None:  # the plugin's check failed in the worker, which it closed
        say(f"spawnkit worker: closed, this worker cannot run agents: {refused}")
        return EXIT_USAGE
    return code


def cmd_scheduler(args: argparse.Namespace) -> int:
    from ..run.dispatch import require_distributed

    require_distributed()
    from ..containment.cluster_security import (
        ensure_credentials,
        export_credentials,
        scheduler_command,
    )

    credentials = ensure_credentials()
    if args.export_credentials is not None:
        target = export_credentials(credentials, args.export_credentials)
        print(f"{target}: copy it to the worker's host, then: spawnkit worker --credentials "
              f"{target} --scheduler tls://THIS_HOST:{args.port}")  # fmt: skip
        return EXIT_OK
    command = scheduler_command(args.host, args.port, credentials, args.scheduler_options)
    say(f"spawnkit scheduler: certificates in {credentials.directory}")
    os.execv(command[0], command)  # this process becomes the scheduler
