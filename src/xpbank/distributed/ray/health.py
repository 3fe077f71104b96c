"""Which shards are up: the client's view, kept from the answers of cheap status calls.

A shard that raises ``RayActorError`` (died, restarting) or does not answer a status
call within the link's ``probe_timeout`` is *down*: it is left out of sampling and
priority updates (logged once), and one status call (a probe) stays outstanding for it.
When that probe answers, the shard is *up* again (logged with how many items it
restored from its checkpoint). Polling never waits on a down shard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray

from xpbank.errors import ShardUnavailableError

__all__ = ["Health", "ShardStatus", "raise_if_down"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardStatus:
    """What the client knows of one shard (see :meth:`RayReplayBuffer.shard_status`).

    ``state``: ``"up"`` or ``"down"`` (died, restarting, or slower than the probe
    timeout). ``size``: items (its last known count when down). ``restarts``: how often
    it was restarted; ``restored``: items its current incarnation reloaded from its
    checkpoint; ``checkpointed``: items in its last checkpoint; ``lost``: rows the
    buffer's own writer sent while it was down.
    """

    index: int
    state: str
    size: int
    restarts: int
    restored: int
    checkpointed: int
    lost: int


class Health:
    """Up/down state of each shard of a :class:`~xpbank.distributed.ray.link.ShardLink`."""

    def __init__(self, link: Any):
        self._link = link
        self.down: dict[int, Any] = {}  # shard -> the outstanding probe
        self.seen: dict[int, dict[str, Any]] = {}  # shard -> its last stats

    def poll(self, args: tuple[Any, ...] = ()) -> dict[int, dict[str, Any]]:
        """Stats of every shard that is up; marks slow or dead ones down (and back up).
        ``args``: passed to :meth:`~xpbank.distributed.ray.shard.Shard.stats`."""
        link = self._link
        for s, probe in list(self.down.items()):  # a down shard is back once its probe answers
            ready, _ = ray.wait([probe], timeout=0)
            if not ready:
                continue
            answer = link.collect({s: probe}, 0.0)[s]
            if isinstance(answer, ShardUnavailableError):  # failed: probe again
                self.down[s] = link.submit(s, "stats")
                continue
            del self.down[s]
            log.warning("shard %d is back (restored %d items from its checkpoint)", s, answer["restored"])
        refs = {s: link.submit(s, "stats", *args) for s in range(link.num_shards) if s not in self.down}
        out = {}
        for s, answer in link.collect(refs, link.probe_timeout).items():
            if isinstance(answer, ShardUnavailableError):
                self.mark_down(s, answer, refs[s])
            else:
                out[s] = self.seen[s] = answer
        return out

    def mark_down(self, s: int, why: Exception, probe: Any = None) -> None:
        """Leave shard ``s`` out until ``probe`` (a status call; a new one by default) answers."""
        if s not in self.down:
            log.warning("%s; sampling goes on with the other shards until it is back", why)
        self.down[s] = probe if probe is not None else self._link.submit(s, "stats")

    def status(self, lost: list[int]) -> list[ShardStatus]:
        """Every shard's :class:`ShardStatus` (polls first); ``lost``: rows lost per shard."""
        live = self.poll()
        out = []
        for s in range(self._link.num_shards):
            st = live.get(s, self.seen.get(s, {}))
            state = "up" if s in live else "down"
            restarts = int(st.get("incarnation", 1)) - 1
            out.append(
                ShardStatus(
                    s, state, int(st.get("size", 0)), restarts, int(st.get("restored", 0)),
                    int(st.get("checkpointed", 0)), lost[s],
                )
            )  # fmt: skip
        return out


def raise_if_down(answers: dict[int, Any], what: str, done: str) -> None:
    """Raise if a shard's answer to ``what`` is a :class:`~xpbank.ShardUnavailableError`
    (``done``: what happened to the others, for the message)."""
    down = [s for s, a in answers.items() if isinstance(a, ShardUnavailableError)]
    if down:
        raise ShardUnavailableError(f"{what}: shard(s) {down} are down; the others were {done}")
