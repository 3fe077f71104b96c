"""Client-side write batching and routing for a :class:`~xpbank.distributed.ray.RayReplayBuffer`.

A call on a Ray actor costs about a millisecond (about 1k calls/s per actor measured on
this project's machines), so a :class:`RayWriter` checks each batch against the spec
at once (a bad batch raises here and nothing of it is kept), holds the rows per shard
in local memory, and sends them when they reach ``flush_bytes`` (default 1 MiB) or on
:meth:`RayWriter.flush` (which the buffer's ``sample``, ``len`` and ``checkpoint`` call
for its own writer). Rows are routed so that episodes stay whole on one shard:

- items with an env field (``env_id``, what :class:`~xpbank.ReplaySink` writes): shard
  ``env_id % num_shards``; give every env of every writer its own id;
- otherwise, when shards keep an episode index (``nstep``, a sampler that needs
  episodes): every row of this writer to shard ``writer_index % num_shards``;
- otherwise (no episodes to keep whole): each ``extend`` to the next shard in turn.

A flush whose shard is down loses its rows (logged, counted in :attr:`RayWriter.lost`):
a shard keeps what its last checkpoint held, never a row twice.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from xpbank.errors import ShardUnavailableError, SpecError
from xpbank.ring.episode_keys import MAX_ENV_ID
from xpbank.ring.episodes import EpisodeKeys
from xpbank.spec.batch import flatten
from xpbank.spec.spec import NestedKey, Spec, key_str, normalize_key, reject_reserved

__all__ = ["RayWriter"]

log = logging.getLogger(__name__)

_RESERVED = frozenset({"index"})


class RayWriter:
    """Batches writes for the shards of a Ray buffer; see the module docstring.

    Made by :meth:`RayReplayBuffer.writer`; picklable, so it can be sent to a collector
    (a Ray task or actor). Pickling sends no pending rows: flush before sending.

    Args:
        link: the buffer's :class:`~xpbank.distributed.ray.client.ShardLink` (actor
            handles, timeouts, the rate limiter).
        spec: the item layout, or ``None`` (from the first batch).
        writer_index: this writer's number (where pinned or rotated rows start).
        pinned: keep every row of this writer on one shard when there is no env field.
        flush_bytes: send once this many bytes are pending.
    """

    def __init__(self, link: Any, spec: Spec | None, writer_index: int, pinned: bool, flush_bytes: int):
        self._link, self._spec, self.writer_index = link, spec, writer_index
        self._pinned, self.flush_bytes = pinned, flush_bytes
        self._env_key: NestedKey = normalize_key(EpisodeKeys().env)
        self._pending: list[list[dict[NestedKey, torch.Tensor]]] = [[] for _ in range(link.num_shards)]
        self._rows = [0] * link.num_shards
        self._bytes = 0
        self._turn = writer_index
        self.lost = [0] * link.num_shards  # rows whose shard was down when they were sent
        self._routes: list[tuple[int, torch.Tensor | None]] = []  # (shard, rows) queued by write_now
        self._stored: dict[int, int] = {}  # shard -> first local id of the last flush's rows
        self._listed: dict[int, torch.Tensor | None] = {}  # shard -> its ids, where not a run

    def __getstate__(self) -> dict[str, Any]:
        if self._bytes:
            raise SpecError(
                f"writer: {sum(self._rows)} rows are still pending; call flush() before sending it to "
                "another process (they would be lost)"
            )
        spec = None if self._spec is None else self._spec.to_dict()
        return {
            "link": self._link,
            "spec": spec,
            "index": self.writer_index,
            "pinned": self._pinned,
            "flush_bytes": self.flush_bytes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        spec = None if state["spec"] is None else Spec.from_dict(state["spec"])
        self.__init__(state["link"], spec, state["index"], state["pinned"], state["flush_bytes"])  # type: ignore[misc]

    @property
    def spec(self) -> Spec | None:
        return self._spec

    def adopt_spec(self, spec: Spec) -> None:
        """Check later batches against ``spec`` (the shards' after a state was loaded)."""
        self._spec = spec

    @property
    def pending(self) -> int:
        """Rows held here, not yet sent."""
        return sum(self._rows)

    def add(self, item: Any) -> int:
        """Queue one item (no batch dim); returns 1."""
        return self.extend(self.one_row(item))

    def one_row(self, item: Any) -> dict[NestedKey, torch.Tensor]:
        """``item`` (no batch dim) checked as an item, as a batch of one row.

        Raises:
            SpecError: as :meth:`ReplayBuffer.add` (shapes named without a batch dim).
        """
        flat = flatten(item, self._spec)
        spec = self._spec
        if spec is None:
            why = "sampled batches carry the items' ids under 'index', which would hide the stored field"
            spec = reject_reserved(Spec.from_batch(flat, batch_ndim=0), _RESERVED, why)
        _, flat = spec.conform(flat, 0)
        return {k: v.unsqueeze(0) for k, v in flat.items()}

    def extend(self, batch: Any) -> int:
        """Check ``batch`` (leading dim = items) and queue it; returns its number of items.

        The whole batch is checked first: on error nothing of it is queued. Ids are
        given by the shards when the rows are flushed (see the buffer's docstring).

        Raises:
            SpecError: as :meth:`ReplayBuffer.extend`, or an env id outside ``[0, 2**20)``.
            BatchTypeError: ``batch`` is not a TensorDict or mapping of tensors/arrays.
        """
        flat = flatten(batch, self._spec)
        spec = self._spec
        if spec is None:
            why = "sampled batches carry the items' ids under 'index', which would hide the stored field"
            spec = reject_reserved(Spec.from_batch(flat, batch_ndim=1), _RESERVED, why)
        (n,), flat = spec.conform(flat, 1)
        shards = self._route(flat, n, spec)
        self._spec = spec
        if n == 0:
            return 0
        if shards is None:  # a copy: the caller may reuse its tensors before the flush
            s = self.writer_index % self._link.num_shards if self._pinned else self._next_turn()
            self._queue(s, {k: v.detach().to("cpu", copy=True) for k, v in flat.items()}, n)
            self._routes.append((s, None))
            flat = {}
        else:  # index_select copies
            flat = {k: v.detach().cpu() for k, v in flat.items()}
            order = np.argsort(shards, kind="stable")
            bounds = np.searchsorted(shards[order], np.arange(self._link.num_shards + 1))
            for s in range(self._link.num_shards):
                rows = torch.from_numpy(order[bounds[s] : bounds[s + 1]])
                if rows.numel():
                    self._queue(s, {k: v.index_select(0, rows) for k, v in flat.items()}, rows.numel())
                    self._routes.append((s, rows))
        if self._bytes >= self.flush_bytes:
            self.flush()
        return n

    def write_now(self, batch: Any) -> range | torch.Tensor:
        """:meth:`extend` and flush in the call; returns the global ids of the rows, in order.

        One round trip to each shard the rows go to (plus the rate limiter's). The ids are
        a ``range`` (step ``num_shards``) when the rows went to one shard, else an int64
        tensor.

        Raises:
            ShardUnavailableError: a shard the rows were sent to is down (they are lost;
                rows sent to the others are stored).
        """
        self.flush()
        self._routes = []
        n = self.extend(batch)
        self.flush()
        routes, self._routes = self._routes, []
        num = self._link.num_shards
        missing = sorted({s for s, _ in routes if s not in self._stored})
        if missing:
            raise ShardUnavailableError(
                f"extend: shard(s) {missing} are down; the rows sent to them are lost"
            )
        if n == 0:
            return range(0)
        if len(routes) == 1 and routes[0][1] is None and self._listed.get(routes[0][0]) is None:
            s, first = routes[0][0], self._stored[routes[0][0]]
            return range(first * num + s, (first + n) * num + s, num)
        ids = torch.empty(n, dtype=torch.int64)
        for s, rows in routes:
            count = n if rows is None else rows.numel()
            listed = self._listed.get(s)  # a table's ids, reused out of order
            local = torch.arange(self._stored[s], self._stored[s] + count) if listed is None else listed
            ids[rows if rows is not None else slice(None)] = local * num + s
        return ids

    def _next_turn(self) -> int:
        s = self._turn % self._link.num_shards
        self._turn += 1
        return s

    def _route(self, flat: dict[NestedKey, torch.Tensor], n: int, spec: Spec) -> np.ndarray | None:
        """Each row's shard by its env id, or ``None`` without an env field (checked first)."""
        if self._env_key not in spec:
            return None
        env = flat[self._env_key].detach().cpu().reshape(n, -1)
        name = key_str(self._env_key)
        if env.shape[1] != 1 or env.dtype.is_floating_point or env.dtype == torch.bool:
            raise SpecError(
                f"field {name!r} (env id): expected one integer per item, got {env.dtype} {tuple(env.shape)}"
            )
        ids = env[:, 0].numpy().astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= MAX_ENV_ID):
            bad = int(ids[(ids < 0) | (ids >= MAX_ENV_ID)][0])
            raise SpecError(f"field {name!r} (env id): expected ids in [0, {MAX_ENV_ID}), got {bad}")
        return ids % self._link.num_shards

    def _queue(self, shard: int, flat: dict[NestedKey, torch.Tensor], n: int) -> None:
        self._pending[shard].append(flat)
        self._rows[shard] += n
        self._bytes += sum(v.numel() * v.element_size() for v in flat.values())

    def discard(self) -> int:
        """Drop the pending rows without sending them; returns how many were dropped."""
        dropped = sum(self._rows)
        self._pending = [[] for _ in range(self._link.num_shards)]
        self._rows, self._bytes = [0] * self._link.num_shards, 0
        return dropped

    def flush(self) -> int:
        """Send every pending row (waits for the rate limiter and the shards); returns rows stored.

        Raises:
            RateLimitTimeout: the rate limiter kept the insert waiting past the timeout
                (the rows stay pending).
        """
        total = sum(self._rows)
        if total == 0:
            return 0
        self._link.admit_insert(total)
        parts = {s: _concat(chunks) for s, chunks in enumerate(self._pending) if chunks}
        rows = list(self._rows)
        self.discard()
        answers = self._link.call_each({s: ("extend", (part,)) for s, part in parts.items()})
        stored = 0
        ok = {s: a for s, a in answers.items() if not isinstance(a, BaseException)}
        self._stored = {s: int(a["first"]) for s, a in ok.items()}
        self._listed = {
            s: None if a.get("ids") is None else torch.from_numpy(a["ids"]) for s, a in ok.items()
        }
        for s in parts:
            if isinstance(answers[s], BaseException):
                self.lost[s] += rows[s]
                log.warning("shard %d is down: %d row(s) sent to it are lost (%s)", s, rows[s], answers[s])
            else:
                stored += int(answers[s]["count"])
        return stored


def _concat(chunks: list[dict[NestedKey, torch.Tensor]]) -> dict[NestedKey, torch.Tensor]:
    if len(chunks) == 1:
        return chunks[0]
    return {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
