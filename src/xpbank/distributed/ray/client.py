"""RayReplayBuffer: a replay buffer sharded over Ray actors, used like a ReplayBuffer."""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from tensordict import TensorDict

from xpbank.distributed.limiter import RateLimiter
from xpbank.distributed.ray.draw import draw_parts, merge_parts
from xpbank.distributed.ray.health import Health, ShardStatus, raise_if_down
from xpbank.distributed.ray.link import ShardLink
from xpbank.distributed.ray.local_api import LocalApi
from xpbank.distributed.ray.routing import route_priorities
from xpbank.distributed.ray.spawn import (
    ShardPlan,
    check_arguments,
    check_checkpoint_dir,
    check_seconds,
    sampler_code,
    spawn,
    wait_started,
)
from xpbank.distributed.ray.table_draw import sample_table
from xpbank.distributed.ray.writer import RayWriter
from xpbank.errors import CapacityError, PriorityError, ShardUnavailableError, SpecError, check_positive_int
from xpbank.nstep.option import NStep
from xpbank.sampler import PrioritizedSampler, Sampler, UniformSampler, sampler_config
from xpbank.sampler.priorities import check_values
from xpbank.spec.spec import Spec, check_fields

__all__ = ["RayReplayBuffer", "ShardStatus"]

log = logging.getLogger(__name__)


class RayReplayBuffer(LocalApi):
    """A replay buffer of ``num_shards`` Ray actors, each a local :class:`~xpbank.ReplayBuffer`.

    Writes (``add``/``extend``, or :meth:`writer` handles in collector processes) are
    checked here and batched locally, then sent to the shards in batches of
    ``flush_bytes`` (see :class:`~xpbank.distributed.ray.RayWriter` for how rows are
    routed so that an env's episodes stay on one shard). ``sample(B)`` flushes, asks
    every shard for its size (uniform) or priority mass (prioritized), draws how many
    items each shard gives from a multinomial over them, fetches the parts in parallel,
    and, with a :class:`~xpbank.PrioritizedSampler`, weights the batch from the global
    totals (items, summed priority, smallest priority), so every item is drawn with the
    probability and weight it would have in one buffer holding every shard's items.

    Ids: a shard numbers its items itself; the ``"index"`` of a sample is
    ``local_id * num_shards + shard`` (:mod:`xpbank.distributed.ray.ids`), so
    :meth:`update_priority` routes by id, and an id whose item was overwritten (or lost
    in a shard's restart) is dropped or raised as in a local buffer.

    Fault tolerance: shards are actors with ``max_restarts``; each saves itself as a bank
    under ``checkpoint_dir`` every ``checkpoint_every`` items / ``checkpoint_seconds``
    and on :meth:`checkpoint`, and a restarted shard reloads it. While a shard is down,
    samples come from the others (logged; :meth:`shard_status` says which) and rows
    sent to it are lost (at most once, never twice).

    Threads/processes: the client object is for one thread (the learner's); give each
    collector its own :meth:`writer` (send writers to collector tasks or actors, not the
    buffer). Each shard runs each call in one step under its lock; a call over several
    shards is one step per shard, in parallel, not one moment across them (what each
    method's "per shard" note means); reads by position are checked (``LocalApi``).

    Args:
        num_shards: how many actors.
        capacity: the most items held in all (split as evenly as possible).
        spec: the item layout; ``None`` takes it from the first write.
        sampler: a :class:`~xpbank.UniformSampler` (default) or
            :class:`~xpbank.PrioritizedSampler` (a template: each shard gets a copy of
            its settings); other registered samplers run per shard, drawn by size.
        nstep: n-step returns, computed inside each shard (episodes stay on one shard).
        seed: seeds the client's draws and each shard's generator.
        rate_limiter: a :class:`~xpbank.distributed.limiter.RateLimiter` (its settings;
            the counting happens in one actor) or ``None``.
        checkpoint_dir: where shards keep their banks (a path every node sees, on a
            cluster); default: a new temporary directory on this machine.
        checkpoint_every, checkpoint_seconds: the checkpoint schedule (checked at writes).
        resume: load the shards' banks already in ``checkpoint_dir`` (else it must hold none).
        flush_bytes: the batch size of writes to a shard; ``0``: synchronous writes, each
            ``add``/``extend`` sent in the call (one round trip per shard it touches, about
            a millisecond) and returning its ids as :meth:`ReplayBuffer.extend` does.
        timeout: seconds any blocking call (a write, a sample, a rate limiter wait) may take.
        probe_timeout: seconds a shard may take to answer before a sample goes on without it.
        start_timeout: seconds the shard actors may take to start (their processes import
            xpbank and torch).
        max_restarts: how often Ray restarts a dead shard (``-1``: always).
        max_concurrency: threads per shard actor (sampling need not queue behind writes).
        actor_options: more ``ray.remote`` options for the shard actors (e.g.
            ``{"num_cpus": 1}``, ``{"resources": {...}}``).
        shards: existing :class:`~xpbank.distributed.ray.shard.Shard` actors, one per
            shard (e.g. :func:`~xpbank.distributed.ray.start_shards`), reset to this
            buffer's settings instead of starting new ones (seconds saved per buffer);
            :meth:`close` leaves them running. Ray restarts such an actor with the
            arguments it was started with, so a pooled buffer does not get its data
            back after a shard crash: use it where start-up dominates (tests, notebooks).
        device: where sampled batches are delivered.

    The rest of the local buffer's API (``sample_by_index``, ``sample_all``, ``epochs``,
    ``update``, ``state_dict``) is :class:`~xpbank.distributed.ray.local_api.LocalApi`'s.

    Example:
        >>> import ray, torch
        >>> from xpbank.distributed.ray import RayReplayBuffer
        >>> if not ray.is_initialized():
        ...     _ = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        >>> rb = RayReplayBuffer(2, 1000, seed=0)
        >>> rb.extend({"obs": torch.randn(64, 4), "env_id": torch.arange(64) % 4})  # queued, 2 envs a shard
        64
        >>> batch = rb.sample(32)  # flushes first
        >>> len(rb), batch["obs"].shape, bool((batch["index"] % 2 == batch["env_id"] % 2).all())
        (64, torch.Size([32, 4]), True)
        >>> rb.close()
    """

    def __init__(
        self,
        num_shards: int,
        capacity: int,
        spec: Spec | None = None,
        *,
        sampler: Sampler | None = None,
        nstep: NStep | None = None,
        seed: int | None = None,
        rate_limiter: RateLimiter | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int | None = None,
        checkpoint_seconds: float | None = None,
        resume: bool = False,
        flush_bytes: int = 1 << 20,
        timeout: float = 60.0,
        probe_timeout: float = 5.0,
        start_timeout: float = 300.0,
        max_restarts: int = -1,
        max_concurrency: int = 8,
        actor_options: Mapping[str, Any] | None = None,
        shards: Sequence[Any] | None = None,
        device: str | torch.device = "cpu",
    ):
        num_shards, capacity = check_arguments(num_shards, capacity, spec, nstep, rate_limiter)
        check_seconds(timeout=timeout, probe_timeout=probe_timeout, start_timeout=start_timeout)
        self._sync = flush_bytes == 0 and not isinstance(flush_bytes, bool)
        flush_bytes = 1 if self._sync else check_positive_int("flush_bytes", flush_bytes)
        if shards is not None and len(shards) != num_shards:
            raise CapacityError(f"shards: expected {num_shards} actors (num_shards), got {len(shards)}")
        self._device = torch.device(device)
        every = None if checkpoint_every is None else check_positive_int("checkpoint_every", checkpoint_every)
        self._sampler = sampler if sampler is not None else UniformSampler()
        # refuses an unregistered sampler; code: a HerSampler's compute_reward, for each shard
        described, code = sampler_config(self._sampler), sampler_code(self._sampler)
        self._prioritized = isinstance(self._sampler, PrioritizedSampler)
        self._table = self._sampler if hasattr(self._sampler, "sample_options") else None  # a Table
        self._dir = (
            Path(checkpoint_dir)
            if checkpoint_dir is not None
            else Path(tempfile.mkdtemp(prefix="xpbank-ray-"))
        )
        check_checkpoint_dir(self._dir, resume)
        options = {"sampler": described, "nstep": nstep and nstep.config(), "seed": seed, "code": code}
        plan = ShardPlan(num_shards, capacity, spec, options, str(self._dir), every, checkpoint_seconds)
        ray_options = {
            "max_restarts": max_restarts,
            "max_concurrency": max_concurrency,
            **(actor_options or {}),
        }
        self._pooled = shards is not None
        shards, limiter = spawn(plan, rate_limiter, ray_options, None if shards is None else list(shards))
        self._link = ShardLink(shards, limiter, float(timeout), float(probe_timeout))
        self._capacity = capacity
        self._rng = np.random.default_rng(seed)
        self._pinned = nstep is not None or bool(getattr(self._sampler, "needs_episodes", False))
        self._writer = RayWriter(self._link, spec, 0, self._pinned, flush_bytes)
        self._writers = 1
        self._health = Health(self._link)
        self._samples = 0  # sample() calls: the beta schedule's position
        self._max_priority = self._sampler.max_priority if self._prioritized else 0.0  # type: ignore[attr-defined]
        try:
            wait_started(self._link, start_timeout)
        except ShardUnavailableError:
            self.close()
            raise

    # -- properties ------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        return self._link.num_shards

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def spec(self) -> Spec | None:
        return self._writer.spec

    @property
    def sampler(self) -> Sampler:
        """The sampler template (each shard runs a copy of its settings)."""
        return self._sampler

    @property
    def checkpoint_dir(self) -> Path:
        return self._dir

    @property
    def shards(self) -> list[Any]:
        """The shard actors' handles (e.g. for ``ray.kill``)."""
        return list(self._link.shards)

    def __len__(self) -> int:
        """Items held by the shards that are up (flushes this client's writer first).
        Threads/processes: per shard (sizes of one round trip); may be stale at once."""
        self._writer.flush()
        return sum(int(st["size"]) for st in self._health.poll().values())

    def __repr__(self) -> str:
        return (
            f"RayReplayBuffer(num_shards={self.num_shards}, capacity={self._capacity}, "
            f"sampler={self._sampler!r}, down={sorted(self._health.down)})"
        )

    # -- writing ---------------------------------------------------------------
    def writer(self) -> RayWriter:
        """A new picklable writer for a collector (its own batching; see :class:`RayWriter`;
        with ``flush_bytes=0`` it batches 1 MiB: synchronous writes are this client's).
        Threads/processes: a new handle with its own queue; one per collector."""
        self._writers += 1
        flush = 1 << 20 if self._sync else self._writer.flush_bytes
        return RayWriter(self._link, self.spec, self._writers - 1, self._pinned, flush)

    def add(self, item: Any) -> int:
        """Queue one item (a mapping or TensorDict without a batch dim); returns 1, or
        its id with synchronous writes (``flush_bytes=0``). Threads/processes: as :meth:`extend`."""
        if self._sync:
            return int(self._writer.write_now(self._writer.one_row(item))[0])
        return self._writer.add(item)

    def extend(self, batch: Any) -> int | range | torch.Tensor:
        """Check and queue a batch (leading dim = items); returns its number of items.

        With ``flush_bytes=0`` the batch is stored in the call and its global ids are
        returned as :meth:`ReplayBuffer.extend` does: a ``range`` (step ``num_shards``;
        with one shard the local buffer's ids) when the rows went to one shard, else an
        int64 tensor in row order. Otherwise this gives no ids: they are the shards' and
        only known once the rows are flushed; a sample's ``"index"`` carries them.
        Threads/processes: per shard (a batch split over shards lands shard by shard).
        """
        if self._sync:
            return self._writer.write_now(batch)
        return self._writer.extend(batch)

    def flush(self) -> int:
        """Send this client's pending rows now; returns how many. Threads/processes: per shard."""
        return self._writer.flush()

    def rate_limiter_state(self) -> dict[str, float] | None:
        """The limiter's counters and bounds (``None``: none). Threads/processes: of one moment."""
        limiter = self._link.limiter
        return None if limiter is None else ray.get(limiter.state.remote(), timeout=self._link.timeout)

    def shard_status(self) -> list[ShardStatus]:
        """The state of every shard (flushes this client's writer, then polls them).
        Threads/processes: per shard (each as it answered)."""
        self._writer.flush()
        return self._health.status(self._writer.lost)

    # -- sampling --------------------------------------------------------------
    def sample(
        self, batch_size: int, replace: bool = True, fields: Sequence[Any] | None = None, **options: Any
    ) -> TensorDict:
        """Draw ``batch_size`` items over every shard that is up.

        ``replace=False`` (uniform only) gives distinct items: per-shard counts from a
        multivariate hypergeometric draw over the shard sizes, distinct within each shard.

        Flushes this client's writer and waits for the rate limiter first. Rows come
        grouped by shard (the draw and the merge: :mod:`xpbank.distributed.ray.draw`).
        With a :class:`~xpbank.PrioritizedSampler` the batch carries ``"weight"``
        computed from the global totals (see the class docstring). Threads/processes:
        counts from the sizes (priority totals) of one round trip, each part drawn and
        weighted per shard (a write in between shifts the counts a little, tears nothing).

        A :class:`~xpbank.Table`'s ``options`` (``timeout``, ``max_staleness``, ``current_version``)
        go to the shards; each gives at most what its table can serve now, and the sample
        waits as the table would (:mod:`xpbank.distributed.ray.table_draw`).

        Raises:
            EmptyBufferError: no shard that is up holds an item.
            ShardUnavailableError: every shard is down.
            RateLimitTimeout: the rate limiter (or a table's) held the sample past ``timeout``.
            CapacityError: ``replace=False`` and more items asked for than are stored.
            SpecError: an option the sampler does not take.
        """
        batch_size = check_positive_int("batch_size", batch_size)
        if not replace and self._prioritized:
            raise PriorityError(
                "replace=False: prioritized sampling draws with replacement; sample with replace=True"
            )
        self._writer.flush()
        keys = check_fields(self.spec, fields)  # before any randomness is drawn
        if self._table is None and options:
            raise SpecError(f"sample: {self._sampler!r} takes no option {next(iter(options))!r}")
        self._link.admit_sample(batch_size)
        if self._table is not None:
            table = sample_table(
                self._link, self._health, self._rng, self._table, batch_size, keys, replace, options
            )
            return self._batch(table, batch_size)
        parts, stats = draw_parts(
            self._link, self._health, self._rng, batch_size, keys, self._prioritized, replace
        )
        self._samples += 1
        weighted = self._sampler if isinstance(self._sampler, PrioritizedSampler) else None
        flat = merge_parts(parts, stats, self.num_shards, weighted, self._samples - 1)
        return self._batch(flat, batch_size)

    # -- priorities --------------------------------------------------------------
    def update_priority(self, indices: Any, priorities: Any, stale: str = "raise") -> None:
        """Set priorities by the ids a sample returned; each update goes to its id's shard.

        Flushes this client's writer first. Every involved shard checks its ids first
        (in parallel), then all write. With ``stale="raise"`` an id overwritten (or lost
        in a restart) raises and nothing is written; an item overwritten between the
        check and the write is dropped. Updates for a shard that is down are dropped
        (logged). Threads/processes: per shard, effective at the check round.

        Raises:
            PriorityError, XpbankIndexError, StaleIndexError: as :meth:`ReplayBuffer.update_priority`.
        """
        if not self._prioritized and self._table is None:
            raise PriorityError(
                f"update_priority: {self._sampler!r} keeps no priorities; build the buffer "
                "with sampler=PrioritizedSampler()"
            )
        ids, values = check_values(indices, priorities, stale)
        self._writer.flush()
        route_priorities(self._link, self._health, ids, values, stale)
        if self._table is not None:
            return  # a table's new items start at its default_priority
        sampler: PrioritizedSampler = self._sampler  # type: ignore[assignment]
        top = float(values.max()) + sampler.eps if values.size else -math.inf
        if top > self._max_priority:  # new items on every shard start at the global largest
            self._max_priority = top
            for s in range(self.num_shards):
                if s not in self._health.down:
                    self._link.submit(s, "set_max_priority", top)

    def clear(self) -> None:
        """Drop every item on every shard that is up, and this client's pending rows.

        Ids handed out before become stale (each shard's ``ReplayBuffer.clear``).
        Threads/processes: per shard (another client's rows may land on either side).

        Raises:
            ShardUnavailableError: a shard is down (the others were cleared).
        """
        self._writer.discard()
        answers = self._link.call_each({s: ("clear", ()) for s in range(self.num_shards)})
        raise_if_down(answers, "clear", "cleared")

    # -- checkpoints and shutdown ---------------------------------------------------
    def checkpoint(self) -> list[Path]:
        """Flush, then save every shard that is up as a bank now; returns their paths.
        Threads/processes: per shard (each bank one state of its shard).

        Raises:
            ShardUnavailableError: a shard is down (the others are saved).
        """
        self._writer.flush()
        answers = self._link.call_each({s: ("checkpoint", ()) for s in range(self.num_shards)})
        raise_if_down(answers, "checkpoint", "saved")
        return [Path(answers[s]["path"]) for s in range(self.num_shards)]

    def close(self) -> None:
        """Flush and end the shard actors (their checkpoints stay in ``checkpoint_dir``).
        Threads/processes: writers still sending fail after it; call it once."""
        try:
            self._writer.flush()
        finally:
            for actor in [*([] if self._pooled else self._link.shards), self._link.limiter]:
                if actor is not None:
                    ray.kill(actor, no_restart=True)

    def __enter__(self) -> RayReplayBuffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
