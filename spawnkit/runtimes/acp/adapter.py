"""The ``acp`` runtime: any Agent Client Protocol agent, ``[butler.runtime] type = "acp"``.

``command = ["gemini", "--acp"]`` names the agent; spawnkit is its ACP client
(:mod:`.client`). Like every runtime it runs inside the run's sandbox with the run's
isolated environment, and reaches only the butler's MCP server (given in
``session/new``). A known agent (:mod:`.presets`) is the adapter of its native runtime
in the ways that matter to the spawner: the same model keys pass credential isolation,
its model calls go through the run's relay (so ``--replay`` works and keys stay
placeholders), its transcripts are kept and staged for a resume the same way. An
unknown agent uses its own model with the keys the butler declares in ``[butler.env]``.

``AcpAdapter(config)`` is the adapter of the agent its command names: a preset's
subclass (whose class attributes are its native runtime's) or this class itself.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any, ClassVar

from ...config.butler_config import RuntimeConfig
from ...containment.sandbox import node_install
from ...errors import ConfigError, RuntimeNotFoundError
from ...events import EventSink
from .. import get_adapter
from ..base import McpServerSpec, RunOutcome, RunSpec, RuntimeAdapter
from ..streaming import find_cli
from .client import AcpPrompt
from .presets import AcpPreset, find_preset

PresetClass = type[AcpPreset]  # (in the class body, ``type`` is the runtime's name)

# What a preset adapter takes over from its native runtime's adapter.
_NATIVE_TRAITS = (
    "passthrough_env", "other_vendor_keys", "api_key_env", "subscription_env",
    "default_api_url", "auth_remedy", "login_command", "login_files", "transcripts_dir",
)  # fmt: skip


class AcpAdapter(RuntimeAdapter):
    """Runs an ACP agent's prompt over its stdio."""

    type: ClassVar[str] = "acp"
    binary_name: ClassVar[str] = "ACP agent"
    install_hint: ClassVar[str] = AcpPreset.install_hint
    auth_remedy: ClassVar[str] = "check the variables the agent needs ([butler.env])"
    system_prompt_filename: ClassVar[str] = "CLAUDE.md"
    # Each butler names its agent: there is nothing to check without one.
    needs_configuration: ClassVar[bool] = True
    preset: ClassVar[PresetClass] = AcpPreset

    def __new__(cls, config: RuntimeConfig | None = None) -> AcpAdapter:
        if cls is AcpAdapter and config is not None:
            cls = _preset_adapter(find_preset(config.acp_command))
        return super().__new__(cls)

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config)
        self._binary: Path | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        if not self.config.acp_command:
            raise ConfigError(
                'the acp runtime needs [butler.runtime] command = ["agent", ...], '
                'like ["gemini", "--acp"]'
            )
        return self.config.acp_command

    def agent(self) -> AcpPreset:
        return self.preset(self.argv)

    def reset(self) -> None:
        self._binary = None

    def find_binary(self) -> Path:
        if self._binary is None:
            self._binary = self._find(self.argv[0])
        return self._binary

    def _find(self, program: str) -> Path:
        if os.sep in program:
            path = Path(program).expanduser()
            if path.is_file() and os.access(path, os.X_OK):
                return path
            raise RuntimeNotFoundError(self.type, program, self.preset.install_hint)
        if self.preset is AcpPreset:
            found = shutil.which(program)
            if found is None:
                raise RuntimeNotFoundError(self.type, program, self.preset.install_hint)
            return Path(found)
        return find_cli(self.type, program, self.preset.binary_env, self.preset.install_hint)

    async def binary_version(self) -> str | None:
        """The agent's version where it prints one (an arbitrary agent and the npm ACP
        adapters do not: they name it only in ``initialize``, in the run's log)."""
        if self.preset.version_args is None:
            return None
        return await super().binary_version()

    def install_paths(self) -> list[Path]:
        """The agent's install (a node package's whole tree, else its prefix) and the files
        its command line names (a script), read-only in the sandbox."""
        binary = self.find_binary()
        real = binary.resolve()
        if "node_modules" in real.parts:
            paths = node_install(real)
        else:
            paths = [
                folder.parent if folder.name == "bin" and folder.parent != Path("/usr") else folder
                for folder in (binary.parent, real.parent)
            ]
        named = [Path(arg) for arg in self.argv[1:] if Path(arg).is_absolute()]
        paths += [path.resolve() for path in named if path.exists()]
        return list(dict.fromkeys(paths))

    def model_via_base_url(self) -> bool:
        return self.default_api_url is not None

    def capabilities(self) -> dict[str, Any]:
        """Resume: the known agents advertise it (``loadSession`` or ``session/resume``);
        another agent's is known only when it starts, and asked for then."""
        return {
            **super().capabilities(),
            "supports_resume": self.preset is not AcpPreset and self.preset.resumes,
            "supports_max_turns": self.preset.native_turn_limit,
            **(
                {}
                if self.preset.native_turn_limit
                else {"max_turns_enforced_by": "spawnkit (tool calls are counted)"}
            ),
        }

    def build_config_file(self, workspace: Path, server: McpServerSpec | None) -> Path:
        return self.agent().build_config_file(workspace)

    def child_env(self, spec: RunSpec) -> dict[str, str]:
        return self.agent().env(spec)

    def keep_transcripts(self, home: Path, redact: Any = None) -> int:
        native = self.agent().native_adapter()
        return 0 if native is None else native.keep_transcripts(home, redact)

    def stage_resume(self, home: Path, cwd: Path, runtime_session_id: str) -> bool:
        return self.agent().stage_resume(home, cwd, runtime_session_id)

    async def invoke(self, spec: RunSpec, emit: EventSink) -> RunOutcome:
        agent = self.agent()
        agent.prepare(spec)
        argv = agent.command(spec, str(self.find_binary().resolve()))
        prompt = AcpPrompt(
            spec=spec,
            emit=emit,
            argv=spec.sandbox.wrap(argv),
            env=agent.env(spec),
            session_meta=agent.session_meta(spec),
            system_in_prompt=agent.system_in_prompt,
            count_turns=not agent.native_turn_limit,
            noise=agent.noise,
            transcript=functools.partial(agent.transcript, spec),
            turn_logged=agent.turn_logged,
            resumes=agent.resumes,
            replayed=functools.partial(agent.replayed, spec),
            name=Path(self.argv[0]).name,
            auth_remedy=self.auth_remedy,
        )
        outcome = await prompt.run()
        # ACP names no model: the one the run asked for prices its usage.
        outcome.model = outcome.model or agent.model(spec)
        return outcome


_PRESET_ADAPTERS: dict[str, type[AcpAdapter]] = {}


def _preset_adapter(preset: PresetClass) -> type[AcpAdapter]:
    """The adapter class of a known agent: its native runtime's traits, its preset."""
    if not preset.native:
        return AcpAdapter
    made = _PRESET_ADAPTERS.get(preset.program)
    if made is None:
        native = get_adapter(preset.native)
        traits = {name: getattr(native, name) for name in _NATIVE_TRAITS}
        made = type(
            f"AcpAdapter[{preset.program}]",
            (AcpAdapter,),
            {**traits, "preset": preset, "install_hint": preset.install_hint,
             "binary_name": preset.program, "version_env": native.version_env,
             # An agent that tells no usage is metered by its relay, as Codex and Gemini are.
             "usage_at_end": preset.metered},
        )  # fmt: skip
        _PRESET_ADAPTERS[preset.program] = made
    return made
