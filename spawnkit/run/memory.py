"""Memory context: what a butler remembers between runs.

When a butler's ``butler.toml`` has ``[modules.memory]``, the spawner asks a
:class:`MemoryProvider` for context before each run (appended to the system
prompt) and hands it the output of each successful run as an episode. Both
calls fail open: an error is logged and the run goes on without memory.

:class:`StoreMemory` is the built-in provider: episodes in spawnkit's store,
the most recent ones that fit a token budget (about four characters a token).
Replace it by passing ``memory=`` to the :class:`~spawnkit.run.Spawner`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from ..store import SessionStore

DEFAULT_MAX_TOKENS = 2000
DEFAULT_MAX_EPISODES = 20
CHARS_PER_TOKEN = 4


class MemoryProvider(Protocol):
    async def fetch_context(self, butler: str, prompt: str) -> str | None:
        """Text to append to the system prompt for a run of ``butler``, or None."""

    async def store_episode(self, butler: str, session_id: str, prompt: str, output: str) -> None:
        """Remember a successful run."""


class StoreMemory:
    """Recent episodes from the session store, newest first, within a token budget."""

    def __init__(
        self,
        store: SessionStore,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_episodes: int = DEFAULT_MAX_EPISODES,
    ) -> None:
        self.store = store
        self.max_tokens = max_tokens
        self.max_episodes = max_episodes

    @classmethod
    def from_module_config(cls, store: SessionStore, config: Mapping[str, Any]) -> StoreMemory:
        return cls(
            store,
            max_tokens=int(config.get("max_tokens", DEFAULT_MAX_TOKENS)),
            max_episodes=int(config.get("max_episodes", DEFAULT_MAX_EPISODES)),
        )

    async def fetch_context(self, butler: str, prompt: str) -> str | None:
        episodes = await asyncio.to_thread(self.store.recent_episodes, butler, self.max_episodes)
        return render_episodes(episodes, self.max_tokens)

    async def store_episode(self, butler: str, session_id: str, prompt: str, output: str) -> None:
        await asyncio.to_thread(self.store.add_episode, butler, session_id, prompt, output)


def render_episodes(episodes: list[dict[str, Any]], max_tokens: int) -> str | None:
    """Format episodes (newest first) until the budget is spent; oldest shown first."""
    budget = max_tokens * CHARS_PER_TOKEN
    chosen: list[str] = []
    for episode in episodes:
        entry = (
            f"- {episode['created_at'][:16].replace('T', ' ')} UTC\n"
            f"  asked: {_one_line(episode['prompt'], 300)}\n"
            f"  answered: {_one_line(episode['output'], 600)}"
        )
        if len(entry) > budget:
            break
        budget -= len(entry)
        chosen.append(entry)
    if not chosen:
        return None
    return "## What you remember from recent runs\n\n" + "\n".join(reversed(chosen))


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
