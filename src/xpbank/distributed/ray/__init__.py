"""Many machines: a replay buffer sharded over Ray actors (the ``ray`` extra).

:class:`RayReplayBuffer` has the buffer API of :class:`~xpbank.ReplayBuffer` (``add``,
``extend``, ``sample``, ``update_priority``, ``len``) over ``num_shards`` actors, each a
local buffer; :class:`RayWriter` is the batching handle a collector process writes
through; a :class:`~xpbank.distributed.limiter.RateLimiter` keeps samples and inserts at
a ratio. Modules: ``client`` (the buffer), ``writer`` (batching and routing of rows),
``shard`` (the actor body: a buffer, restart-proof ids, bank checkpoints), ``link`` (Ray
calls, timeouts, the limiter's actor), ``ids`` (global id encoding), ``routing``
(priority updates by id), ``spawn`` (starting the actors), ``health`` (which shards are
up), ``draw`` (a sample's per-shard counts, fetch and merge), ``weights`` (global
importance weights), ``local_api`` (positions, epochs, ``update`` and ``state_dict``
over the shards).

Contracts the modules rely on: a shard is a plain ``ReplayBuffer`` in a threaded actor
(its lock serialises the actor's threads) and the client never touches a shard's ring; a
sample's ``"index"`` is ``local_id * num_shards + shard``; a shard's ids are its ring's
plus an ``offset`` that only grows after a restart that lost items, so no id is handed
out twice; rows with an ``env_id`` field always go to shard ``env_id % num_shards``;
shard banks live at ``<checkpoint_dir>/shard-<i>`` with ``{"xpbank.distributed.ray":
{"shard", "num_shards", "offset"}}`` in their metadata. ``flush_bytes=0`` makes writes
synchronous and return ids; ``shards=`` / ``start_shards`` reuse actors
(``Shard.reset``). ``PrioritizedSampler.totals()`` (sum and smallest stored priority)
and ``priorities.check_values`` (the ring-free half of ``check_update``) exist for this
client.

Importing this module without Ray installed raises :class:`~xpbank.MissingExtraError`
naming the ``ray`` extra and how to install it.
"""

from __future__ import annotations

from xpbank.errors import require

require("ray", "ray")

from xpbank.distributed.limiter import RateLimiter  # noqa: E402
from xpbank.distributed.ray.client import RayReplayBuffer, ShardStatus  # noqa: E402
from xpbank.distributed.ray.ids import decode, encode  # noqa: E402
from xpbank.distributed.ray.spawn import start_shards  # noqa: E402
from xpbank.distributed.ray.writer import RayWriter  # noqa: E402

__all__ = ["RayReplayBuffer", "RayWriter", "RateLimiter", "ShardStatus", "encode", "decode", "start_shards"]
