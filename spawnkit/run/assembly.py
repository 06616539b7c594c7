"""Assembly: what a run is made of before its CLI starts, and the parts open while it runs.

What is shared by every runtime is written here once, never per adapter: the door folder
of the run's own network and the bridges through it (:mod:`spawnkit.containment.doors`), the egress
proxy for the hosts a butler allows, the model relay that holds the real keys, the OTLP
receiver of the CLI's own telemetry, the MCP secret, the isolated environment, the system
prompt (with memory and sources), the sandbox plan and the CLI's config file, and the
record of what the run was given. :meth:`Assembly.assemble` opens them in the order they
depend on each other and returns the :class:`~spawnkit.runtimes.base.RunSpec` the worker
runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from opentelemetry import trace

from ..config.system_prompt import append_memory, compose_system_prompt
from ..containment import sandbox
from ..containment.credentials import (
    MODEL_CREDENTIALS,
    isolated_env,
    missing_optional,
    run_values,
    secret_names,
)
from ..containment.doors import DOORS_DIR, Door, Doors, loopback_address, open_doors
from ..containment.egress import egress_proxy, proxy_env
from ..containment.relay import free_port, open_relay
from ..containment.sources import sources_list
from ..containment.sweep import HOME_VAR, run_home
from ..containment.workspace import files_in, link_sources, mcp_url, source_paths
from ..errors import ConfigError, StoreError
from ..result import Usage
from ..runtimes.base import McpServerSpec, RunSpec
from ..telemetry.otlp import CliTelemetry, OtlpReceiver
from ..telemetry.spans import RunSpan
from .accepted import CANCEL_GRACE_S, AcceptedRun, RunStart
from .checkout import repo_given
from .recording import on_store
from .request import SOURCE_KINDS, compose_prompt
from .settings import RunSettings

logger = logging.getLogger(__name__)


class Assembly:
    """Opens a run's parts and builds the spec its worker runs, from the spawner's settings."""

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings

    async def assemble(
        self, run: AcceptedRun, workspace: Path, span: RunSpan, parts: contextlib.AsyncExitStack
    ) -> RunSpec:
        """The run's spec, its parts open in ``parts`` until the CLI has exited."""
        doors = await self.open_run_doors(run, workspace, parts)
        base_url = await self.open_run_relay(run, parts, doors)
        telemetry = await self.cli_receiver(run, span, parts, doors)
        await self.bridge_doors(run, doors, base_url, parts)
        spec = await self.prepare(
            run, workspace, span, base_url, None if doors is None else doors.doors, telemetry
        )
        return replace(spec, telemetry=telemetry)

    async def open_run_relay(
        self, run: AcceptedRun, stack: contextlib.AsyncExitStack, doors: Doors | None
    ) -> str | None:
        """Open the run's model relay in ``stack`` (``run.relay``); the base URL its CLI is given.

        A CLI that reaches its model API through a base URL goes through a relay of its own
        (:mod:`spawnkit.containment.relay`) whenever there is an API to forward to: the butler's
        base_url, else the CLI's default API when the run has a model key (a subscription
        login without one goes its own way). The relay swaps the real keys in for the
        placeholders the CLI gets (:meth:`prepare`), and meters a CLI that reports usage
        only at its end (Codex, Gemini): for its live figures and its token or dollar limits.
        """
        worker = run.worker
        run.relay = None  # an earlier attempt's, closed
        # A limit needs usage as it comes; so do the live figures of a CLI that tells it
        # only at the end. Only a limit routes a login-less run to the default API.
        needs_meter = not worker.live_usage and run.budget.limits.needs_usage
        metered = needs_meter or worker.usage_at_end
        upstream = self.settings.base_url
        if upstream is None and worker.model_via_base_url():
            resolve = run_values(
                self.settings.butler,
                self.settings.credentials,
                worker.passthrough_env,
                worker.other_vendor_keys,
            )
            keyed = await asyncio.to_thread(lambda: any(map(resolve, MODEL_CREDENTIALS)))
            if keyed or (needs_meter and run.budget.price is not None):
                upstream = worker.default_api_url
        if upstream is None or not worker.model_via_base_url():
            if worker.usage_at_end:
                run.collector.usage_at_end()
            if needs_meter:
                logger.warning(
                    "run %s: %s reports usage only at its end, and no model API is known to "
                    "meter; its limits are checked on what it reports", run.session_id,
                    worker.type,
                )  # fmt: skip
            return self.settings.base_url
        meter = None
        if metered:
            from ..budgets.metering import Meter

            def counted(usage: Usage) -> None:
                run.collector.metered_usage(usage, meter.calls if meter is not None else None)

            meter = Meter(counted)
            run.collector.metered = True
        # In a network sandbox the relay serves on a door of its own: no TCP port at all,
        # and no bridge between the sandbox's forwarder and the relay.
        uds = port = None
        if doors is not None:
            port = free_port()
            uds = doors.socket_for(port)
        relay = await stack.enter_async_context(
            open_relay(upstream, sink=meter, uds=uds, port=port)
        )
        # Its URL carries the secret, and a CLI may print its URL (in an error, say).
        run.redactor.add_run_secret("SPAWNKIT_RELAY_SECRET", relay.secret)
        run.relay = relay
        return relay.url

    async def cli_receiver(
        self,
        run: AcceptedRun,
        span: RunSpan,
        stack: contextlib.AsyncExitStack,
        doors: Doors | None = None,
    ) -> CliTelemetry | None:
        """Start the run's OTLP receiver (CLI telemetry on); what it got is stored when it stops.

        It lives in ``stack``, which closes after the CLI has exited: the CLIs flush
        their spans before they exit. In a run's own network it is a door itself (it
        listens on the door's socket), with no bridge between the door and a port.
        """
        # A sampled signal is drawn here, once per run: the run exports it whole or not at all.
        signals = self.settings.cli_telemetry.for_run(self.settings.adapter.type)
        if not signals:
            return None
        context = span.span.get_span_context()
        receiver = OtlpReceiver(
            run.session_id,
            run.redactor,
            prompt=run.prompt,
            run_trace=(
                (trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id))
                if context.is_valid
                else None
            ),
            forward=self.settings.otlp_target,
            on_timing=run.collector.emit,  # live: the views show each request and tool
            signals=signals,
        )
        run.redactor.add_run_secret("SPAWNKIT_OTLP_SECRET", receiver.secret)

        async def store() -> None:
            try:
                await asyncio.to_thread(
                    self.settings.store.record_cli_spans, [s.row() for s in receiver.finished()]
                )
                await asyncio.to_thread(
                    self.settings.store.record_cli_events, [e.row() for e in receiver.events]
                )
            except StoreError:
                logger.exception("could not store the CLI spans of run %s", run.session_id)

        stack.push_async_callback(store)
        if doors is None:
            return await stack.enter_async_context(receiver.serve())
        port = free_port()
        return await stack.enter_async_context(receiver.serve(doors.socket_for(port), port))

    async def open_run_doors(
        self, run: AcceptedRun, workspace: Path, stack: contextlib.AsyncExitStack
    ) -> Doors | None:
        """The door folder of the run's own network (:mod:`spawnkit.containment.doors`), open until
        ``stack`` closes; None when the run has the host's network."""
        if sandbox.network_policy(self.settings.butler) == "host":
            return None
        return await stack.enter_async_context(open_doors(workspace))

    async def bridge_doors(
        self,
        run: AcceptedRun,
        doors: Doors | None,
        base_url: str | None,
        stack: contextlib.AsyncExitStack,
    ) -> None:
        """The other doors of a run in a network of its own: bridges to the butler's MCP
        server and a model URL with no relay in front (a loopback model server such as the
        replay server); and the egress proxy when the butler allows hosts. The relay and the
        OTLP receiver, when the run has them, are doors already (:meth:`open_run_relay`,
        :meth:`cli_receiver`).

        A model API elsewhere with no relay in front (a subscription login) has no door:
        such a run fails here, before its CLI starts.
        """
        run.egress_port = None  # an earlier attempt's, closed
        if doors is None:
            return
        ports: dict[int, tuple[str, int]] = {}
        port = self.settings.mcp_port or self.settings.butler.port
        if run.kind not in SOURCE_KINDS and port:  # 0: no server (an ad-hoc butler's own)
            ports[port] = (self.settings.mcp_host, port)
        model = base_url or run.worker.default_api_url
        if run.relay is None and model is not None:
            address = loopback_address(model)
            if address is None:
                raise ConfigError(
                    f'[butler.sandbox] network = "model-only" needs spawnkit\'s relay to reach '
                    f"{model}, and this run has none; give the butler a base_url on this "
                    'machine, or network = "host"'
                )
            ports[address[1]] = address
        for target in ports.values():
            await doors.bridge(target)
        if self.settings.butler.sandbox.allow_hosts:
            # The proxy is a door of its own: on a unix socket only the run reaches.
            port = free_port()
            await stack.enter_async_context(
                egress_proxy(
                    self.settings.butler.sandbox.allow_hosts, doors.socket_for(port),
                    butler=self.settings.butler.name, config_file=self.settings.butler.config_file,
                    on_denied=run.collector.network_denied,
                )
            )  # fmt: skip
            run.egress_port = port

    async def prepare(
        self,
        run: AcceptedRun,
        workspace: Path,
        span: RunSpan,
        base_url: str | None,
        doors: tuple[Door, ...] | None = None,
        telemetry: CliTelemetry | None = None,
    ) -> RunSpec:
        butler, worker = self.settings.butler, run.worker
        agent = butler.agents.get(run.role) if run.role else None
        if agent is not None:
            base = agent.prompt
        else:
            base = worker.parse_system_prompt_file(butler.system_prompt_file, butler.roster_dir)
        system_prompt = compose_system_prompt(butler, base)
        if self.settings.memory is not None:
            try:
                memory_context = await self.settings.memory.fetch_context(butler.name, run.prompt)
            except Exception:
                logger.exception("memory: could not fetch context for %s; going on", run.session_id)
                memory_context = None
            system_prompt = append_memory(system_prompt, memory_context)
        asking = run.kind in SOURCE_KINDS
        if run.sources:
            system_prompt += "\n\nThe sources, as linked in your working directory:\n"
            system_prompt += sources_list(run.sources)
        server: McpServerSpec | None = None
        if not asking:
            session_key = run.runtime_session_id or run.resume or run.session_id
            run.mcp_secret = run.redactor.add_run_secret(
                "SPAWNKIT_MCP_SECRET",
                await self.settings.mcp_access.grant(
                    session_key, ttl_s=run.timeout_s + CANCEL_GRACE_S
                ),
            )
            server = McpServerSpec(
                name=butler.name,
                transport=butler.mcp_transport,
                url=mcp_url(
                    butler, session_key, self._mcp_host_seen(doors), self.settings.mcp_port
                ),
                secret=run.mcp_secret,
            )
        linked = source_paths(run.sources)
        if asking:
            cwd = await asyncio.to_thread(link_sources, workspace, run.sources)
        else:
            cwd = run.workdir or butler.workdir or workspace
        # A tool of [butler.permissions] ask is asked about even when tools lists it too.
        ask = butler.permissions.ask
        tools = tuple(
            tool
            for tool in (
                agent.tools
                if agent is not None and agent.tools is not None
                else butler.runtime.tools
            )
            if tool not in ask
        )
        if run.resume and not await asyncio.to_thread(
            worker.stage_resume, workspace, cwd, run.resume
        ):
            logger.warning("no kept transcript of %s to resume; the CLI looks for it itself",
                           run.resume)  # fmt: skip
        plan = sandbox.plan(
            butler, workspace, worker.install_paths(), read=linked, cwd=cwd,
            write=(run.workdir,) if run.workdir is not None else (),
            interactive=run.kind == "chat", doors=doors or (),
        )  # fmt: skip
        config_file = worker.build_config_file(workspace, server)
        given: dict[str, Any] = {
            "config_files": [
                name for name in files_in(workspace) if not name.startswith(f"{DOORS_DIR}/")
            ],
            "network": network_given(doors, run.egress_port),
            "mcp_servers": [server.name] if server is not None else [],
            "tools": list(tools),
            **({"ask": list(ask)} if ask else {}),
            "home": "the run's workspace",
            **({"dispatch": self.settings.origin} if self.settings.origin else {}),
            **({"sources": [str(path) for path in linked]} if asking else {}),
            **({"repo": repo_given(run.checkout)} if run.checkout is not None else {}),
            # With CLI telemetry on, the signals this run's CLI exported (a sampled one was
            # drawn for it; none when it drew none).
            **(
                {"cli_telemetry": sorted(telemetry.signals) if telemetry is not None else []}
                if self.settings.cli_telemetry
                else {}
            ),
        }  # fmt: skip
        run.setup = (plan.kind, given)
        identity = {
            "SPAWNKIT_SESSION_ID": run.session_id,
            "SPAWNKIT_BUTLER": butler.name,
            "SPAWNKIT_ROLE": run.role or "butler",
            "SPAWNKIT_WORKSPACE": str(workspace),
            HOME_VAR: run_home(),  # which home's sweep may kill what is left of the run
        }
        traceparent = span.traceparent()
        if traceparent:
            identity["TRACEPARENT"] = traceparent
        start, run.start = run.start, None  # recorded now, whatever becomes of this run
        env = await on_store(
            self.settings.store, self._record_setup, run, start, plan.kind, given, identity
        )
        if missing := missing_optional(butler, env):
            logger.warning(
                "run %s of butler %s goes on without %s (optional, not set; "
                "`spawnkit credentials set NAME` sets one)",
                run.session_id, butler.name, ", ".join(missing),
            )  # fmt: skip
        # What was really injected is what must be redacted (a value may have changed
        # since the trigger was accepted).
        names = secret_names(butler, worker.passthrough_env, worker.other_vendor_keys)
        run.redactor.add({name: env[name] for name in names if name in env})
        if run.relay is not None:
            # The CLI gets placeholders; the real keys stay with its relay, which swaps them in.
            env = run.relay.keys.hide(env)
            run.redactor.add({name: env[name] for name in MODEL_CREDENTIALS if name in env})
        if run.egress_port is not None:
            env = {**env, **proxy_env(run.egress_port)}
        return RunSpec(
            session_id=run.session_id,
            butler=butler.name,
            prompt=compose_prompt(run.prompt, run.context),
            system_prompt=system_prompt,
            workspace=workspace,
            cwd=cwd,
            mcp_server=server,
            config_file=config_file,
            env=env,
            max_turns=run.max_turns,
            tools=tools,
            model=(agent.model if agent is not None and agent.model else None)
            or self.settings.model,
            base_url=base_url,
            default_api=run.relay is not None and self.settings.base_url is None,
            runtime_session_id=run.runtime_session_id,
            resume=run.resume,
            log=run.log,
            # A run acting as one of the roles does not delegate further.
            agents={} if agent is not None or asking else butler.agents,
            sandbox=plan,
            add_dirs=linked,
            model_retries=0 if self.settings.retry.max_attempts > 1 else None,
            ask=ask,
            approver=run.approver,
        )

    def _record_setup(
        self,
        run: AcceptedRun,
        start: RunStart | None,
        sandbox_kind: str,
        given: dict[str, Any],
        identity: dict[str, str],
    ) -> dict[str, str]:
        """Record the run's setup (with its start, in one transaction, when that is not
        recorded yet) and build its CLI's environment (it reads the credentials), just
        before the CLI starts: both on the event loop, or both in one thread when the
        store's write would wait (:func:`~spawnkit.run.recording.on_store`)."""
        store = self.settings.store
        if start is None:
            store.record_setup(run.session_id, sandbox=sandbox_kind, given=given)
        else:
            store.mark_started(
                run.session_id, started_at=start.started_at, trace_id=start.trace_id,
                workspace=start.workspace, setup=(sandbox_kind, given),
            )  # fmt: skip
        worker = run.worker
        return isolated_env(
            self.settings.butler, self.settings.credentials.pinned(), worker.passthrough_env,
            identity,
            worker.other_vendor_keys,
        )  # fmt: skip

    def _mcp_host_seen(self, doors: tuple[Door, ...] | None) -> str:
        """The MCP server's host as the CLI names it: behind a door, a loopback name."""
        if doors is None or loopback_address(f"http://{self.settings.mcp_host}") is not None:
            return self.settings.mcp_host
        return "127.0.0.1"


def network_given(doors: tuple[Door, ...] | None, egress_port: int | None) -> str:
    """The run's network policy as its record gives it."""
    if doors is None:
        return "host"
    return "model-only+allow_hosts" if egress_port is not None else "model-only"
