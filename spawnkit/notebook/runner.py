"""``spawnkit.notebook.spawn()``: the Python call behind ``%%spawn``.

It resolves what to run (a roster butler, possibly on another runtime, or the
notebook butler), starts the run on the kernel's hub, shows it live (a widget
in Jupyter, text lines in a terminal), and either waits for the result (an
interrupt cancels the run and re-raises) or returns the background handle::

    from spawnkit.notebook import spawn
    result = spawn("I weighed 72.4 kg", butler="health", replay="demo.toml")
    handle = spawn("count the words in: a b c", butler="general", background=True)

Configuration mistakes raise :class:`~spawnkit.errors.ConfigError`; the magic
turns them into ``UsageError``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from ..console import render_event
from ..errors import ConfigError
from ..events import RunEvent
from ..result import SpawnerResult
from ..roster import adhoc_butler, load_roster
from ..runtimes import canonical_runtime
from .hub import Hub, RunHandle, Target, default_hub
from .kernel_tools import kernel_tools
from .loop import CANCEL_TIMEOUT_S, Job
from .view import RunView

Render = Literal["auto", "widget", "text", "none"]
T = TypeVar("T")


def in_kernel() -> bool:
    """Whether this is a Jupyter kernel (widgets can be shown) rather than a terminal."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython

    return type(get_ipython()).__name__ == "ZMQInteractiveShell"


class _TextLines:
    """Collects rendered event lines on the loop thread; the waiting thread prints them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, event: RunEvent) -> None:
        text = render_event(event)
        if text is not None:
            self.lines.append(text)

    def drain(self) -> None:
        lines, self.lines = self.lines, []
        for line in lines:
            print(line, flush=True)


def resolve_target(
    *,
    runtime: str | None,
    butler: str | None,
    roster: str | Path,
    replay: str | Path | None,
    model: str | None,
    kernel_tools_enabled: bool,
    default_runtime: str = "claude-code",
) -> Target:
    if runtime is not None:
        runtime = canonical_runtime(runtime)  # `claude` is `claude-code`, as everywhere
    if butler:
        config = load_roster(roster)[butler]
        if runtime:
            config = config.with_runtime(runtime)
    else:
        config = adhoc_butler(runtime or default_runtime, Path.cwd(), name="notebook")
    scenario = Path(replay).expanduser().resolve() if replay else None
    if scenario is not None and not scenario.is_file():
        raise ConfigError(f"replay: no scenario file at {scenario}")
    return Target(config, replay=scenario, model=model, kernel_tools=kernel_tools_enabled)


def spawn(
    prompt: str,
    *,
    runtime: str | None = None,
    butler: str | None = None,
    roster: str | Path = "roster",
    replay: str | Path | None = None,
    model: str | None = None,
    max_turns: int | None = None,
    context: str | None = None,
    background: bool = False,
    render: Render = "auto",
    namespace: Callable[[], Mapping[str, Any]] | None = None,
    hub: Hub | None = None,
    default_runtime: str = "claude-code",
) -> SpawnerResult | RunHandle:
    """Run ``prompt``; the SpawnerResult, or with ``background`` a RunHandle at once.

    ``namespace`` enables the kernel tools: the agent may read summaries of the
    variables it returns (see :mod:`spawnkit.notebook.kernel_tools`).
    """
    if not prompt.strip():
        raise ConfigError("the prompt is empty")
    if max_turns is not None and max_turns < 1:
        raise ConfigError("max_turns must be at least 1")
    target = resolve_target(
        runtime=runtime, butler=butler, roster=roster, replay=replay, model=model,
        kernel_tools_enabled=namespace is not None, default_runtime=default_runtime,
    )  # fmt: skip
    hub = hub or default_hub()
    mode = render if render != "auto" else ("widget" if in_kernel() else "text")
    view = RunView(schedule=hub.schedule) if mode == "widget" else None
    text = _TextLines() if mode == "text" and not background else None
    listeners = [sink for sink in (view, text) if sink is not None]
    extensions = [kernel_tools(namespace)] if namespace is not None else []
    handle = hub.start(
        target, prompt, context=context, max_turns=max_turns,
        listeners=listeners, view=view, extensions=extensions,
    )  # fmt: skip
    if background:
        return handle
    if view is not None:
        from IPython.display import display

        display(view)  # type: ignore[no-untyped-call]
    return wait(handle, text)


def wait_job(job: Job[T]) -> T:
    """Block on a background-loop job; an interrupt cancels it, waits for it, re-raises."""
    try:
        while True:
            try:
                return job.future.result(timeout=0.05)
            except TimeoutError:
                continue
    except KeyboardInterrupt:
        job.cancel(wait=CANCEL_TIMEOUT_S)
        raise


def wait(handle: RunHandle, text: _TextLines | None = None) -> SpawnerResult:
    """Block until the run ends; an interrupt cancels the run, waits for it, re-raises."""
    try:
        while True:
            try:
                return handle.job.future.result(timeout=0.05)
            except TimeoutError:
                if text is not None:
                    text.drain()
    except KeyboardInterrupt:
        handle.job.cancel(wait=CANCEL_TIMEOUT_S)
        raise
    finally:
        if text is not None:
            text.drain()
