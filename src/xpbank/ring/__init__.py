"""Which items are live and how they connect: the ring of ids and the episode index.

- :mod:`~xpbank.ring.ids`: :class:`Ring`, the FIFO ring of item ids (``slot = id %
  capacity``; an id is live while its slot holds it);
- :mod:`~xpbank.ring.episodes`: :class:`~xpbank.EpisodeIndex`, each item's env, episode
  bounds, predecessor and successor, kept as items are written; its write plans are made
  in :mod:`~xpbank.ring.episode_plan` and land in its per-slot arrays through
  :mod:`~xpbank.ring.episode_slots`;
- :mod:`~xpbank.ring.episode_keys`: :class:`~xpbank.EpisodeKeys`, which fields carry the
  env id and the episode-end flags.

Nothing here reads or writes item data: storages do.
"""

from xpbank.ring.episode_keys import EpisodeKeys
from xpbank.ring.episodes import EpisodeIndex
from xpbank.ring.ids import Ring

__all__ = ["EpisodeIndex", "EpisodeKeys", "Ring"]
