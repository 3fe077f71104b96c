"""Which items are live and how they connect: the ring of ids and the episode index.

- :mod:`~xpbank.ring.ids`: :class:`Ring`, the FIFO ring of item ids (``slot = id %
  capacity``; an id is live while its slot holds it);
- :mod:`~xpbank.ring.episodes`: :class:`~xpbank.EpisodeIndex`, each item's env, episode
  bounds, predecessor and successor, kept as items are written; its write plans are made
  in :mod:`~xpbank.ring.episode_plan` and land in its per-slot arrays through
  :mod:`~xpbank.ring.episode_slots`;
- :mod:`~xpbank.ring.episode_keys`: :class:`~xpbank.EpisodeKeys`, which fields carry the
  env id and the episode-end flags.
- :mod:`~xpbank.ring.episode_update`: what ``ReplayBuffer.update`` may write of those
  fields (only the values the index holds: the index is built from them at write time).

The ring carries the index (``ring.episodes``), so samplers and sample-time options reach
it through the ``ring`` argument they already get (the Sampler protocol is unchanged).
Hot paths (samplers, storages) reach the index through two unchecked accessors,
``links()`` and ``lockstep``, never by scanning; ``walk_slots`` in lockstep mode computes
a window's slots (``slot + j * num_envs``), looks up ``next`` of all steps at once and
takes the first step without one as the window's last: no step-by-step chase.

Nothing here reads or writes item data: storages do.
"""

from xpbank.ring.episode_keys import EpisodeKeys
from xpbank.ring.episodes import EpisodeIndex
from xpbank.ring.ids import Ring

__all__ = ["EpisodeIndex", "EpisodeKeys", "Ring"]
