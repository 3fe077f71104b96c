"""An :class:`~xpbank.EpisodeIndex`'s pickling (SB3's ``save_replay_buffer`` pickles the
buffer): views made again on arrival."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["PickledIndex"]


class PickledIndex:
    """An :class:`~xpbank.EpisodeIndex`'s pickling. Its per-slot arrays are views of two
    arrays (:class:`~xpbank.ring.episode_slots.SlotLinks`' ``rows`` and ``flags``), which
    pickle copies apart: the compiled upkeep
    (:func:`~xpbank.ring.episode_step.record_step`) would then write into ``rows`` what
    no reader reads. The views are made again on arrival, and the per-env state packed
    for that upkeep (views of one byte array) is left out, to be packed again."""

    # the per-env state packed for the compiled upkeep (episode_step._packed), or None
    _packed: tuple[Any, ...] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_packed"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        a = self.__dict__.get("_arrays")
        if a is None or a.rows is None:
            return
        rows, flags = a.rows, a.flags
        a = dataclasses.replace(
            a,
            env=rows[0],
            prev=rows[1],
            next=rows[2],
            start=rows[3],
            terminated=flags[:, 0],
            truncated=flags[:, 1],
        )
        self.__dict__.update(_arrays=a, _env=a.env, _prev=a.prev, _next=a.next, _start=a.start)
        self.__dict__.update(_flags=a.flags, _term=a.terminated, _trunc=a.truncated)
