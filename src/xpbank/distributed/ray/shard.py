"""One shard of a :class:`~xpbank.distributed.ray.RayReplayBuffer`: the body of a Ray actor.

A shard is a plain :class:`~xpbank.ReplayBuffer` (its lock makes it safe for the
actor's threads: a threaded actor serves a sample while a write waits for the lock, not
behind it in a queue) plus what a remote shard needs around it:

- **ids that survive restarts**: the ids a shard hands out are its ring's ids plus an
  ``offset``. After every write the shard records the next id it would hand out in a
  small ``shard-<i>.issued`` file beside its checkpoint. A restarted shard that reloads
  a checkpoint older than that mark moves ``offset`` up so that its restored items get
  ids at or above the mark: every id handed out before the crash is then stale (an
  ``update_priority`` with it is dropped or raised, as for an overwritten item), and
  no id is ever handed out twice.
- **checkpoints**: a bank (``xpbank.save``) at ``<checkpoint_dir>/shard-<i>`` every
  ``every_items`` inserted items or ``every_seconds`` seconds (checked at each write)
  and on :meth:`Shard.checkpoint`, with ``{"xpbank.distributed.ray": {"shard",
  "num_shards", "offset"}}`` in its metadata; the constructor reloads it (Ray restarts
  an actor by running its constructor again).

Nothing here imports Ray: the client wraps the class with ``ray.remote``.

Example:
    >>> import tempfile, torch
    >>> from xpbank.distributed.ray.shard import Shard
    >>> s = Shard(0, 2, 8, None, {"sampler": {"name": "uniform", "config": {}}}, tempfile.mkdtemp())
    >>> s.extend({"obs": torch.ones(3, 2)})["first"], s.checkpoint()["items"]
    (0, 3)
    >>> Shard(0, 2, 8, None, {"sampler": {"name": "uniform", "config": {}}}, s.directory).stats()["size"]
    3
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xpbank.bank import bank_metadata, load, save
from xpbank.bank.format import MANIFEST
from xpbank.distributed.table_room import draws_now, live_ids, table_of
from xpbank.errors import CorruptBankError, EmptyBufferError, RateLimitTimeout, SpecError
from xpbank.replay.buffer import ReplayBuffer
from xpbank.replay.writing import keep_last
from xpbank.ring.episode_update import check_episode_update
from xpbank.sampler import make_sampler, sumtree
from xpbank.spec.spec import Spec
from xpbank.table.ops import drop_stale

__all__ = ["Shard", "META_KEY"]

log = logging.getLogger(__name__)

META_KEY = "xpbank.distributed.ray"  # the shard's own entry in its bank's metadata


class Shard:
    """A local buffer with restart-proof ids and bank checkpoints (see the module docstring).

    Args:
        index: this shard's number, ``0 <= index < num_shards``.
        num_shards: how many shards the buffer has (checked against a checkpoint).
        capacity: the most items this shard holds.
        spec: the item layout as ``Spec.to_dict()``, or ``None`` (from the first write).
        options: ``{"sampler": sampler_config, "nstep": config or None, "seed": int or None}``
            and ``"code"``: attributes set on the sampler (a HerSampler's ``compute_reward``).
        directory: where checkpoints and the issued-id mark live.
        every_items: checkpoint after this many items were inserted since the last one.
        every_seconds: checkpoint at the first write this long after the last one.
    """

    def __init__(
        self,
        index: int,
        num_shards: int,
        capacity: int,
        spec: dict[str, Any] | None,
        options: dict[str, Any],
        directory: str,
        every_items: int | None = None,
        every_seconds: float | None = None,
    ):
        self.index, self.num_shards = index, num_shards
        self.directory = directory
        self._bank = Path(directory) / f"shard-{index}"
        self._every_items, self._every_seconds = every_items, every_seconds
        self.offset = 0  # the ids handed out are ring ids + offset
        self.restored = 0  # items reloaded from a checkpoint by this incarnation
        self.checkpointed = 0  # items in the last checkpoint
        self._since, self._last = 0, time.monotonic()
        if (self._bank / MANIFEST).exists():
            self.rb = self._restore()
        else:
            seed = options.get("seed")
            self.rb = ReplayBuffer(
                capacity,
                None if spec is None else Spec.from_dict(spec),
                sampler=make_sampler(options["sampler"]),
                nstep=options.get("nstep"),
                seed=None if seed is None else int(seed) * 1_000_003 + index,
            )
        for name, code in options.get("code", {}).items():  # a HerSampler's compute_reward
            setattr(self.rb.sampler, name, code)
        renumbered = self._skip_issued()
        Path(directory).mkdir(parents=True, exist_ok=True)
        self._issued = os.open(Path(directory) / f"shard-{index}.issued", os.O_RDWR | os.O_CREAT, 0o600)
        self.incarnation = self._count_incarnation()
        self._mark_issued()
        if renumbered and len(self.rb):  # the bank must hold the new ids, or the next restart
            self.checkpoint()  # would renumber these items again

    # -- restarts ----------------------------------------------------------------
    def _restore(self) -> ReplayBuffer:
        rb = load(self._bank)
        meta = bank_metadata(rb).get(META_KEY, {})
        if meta.get("shard") != self.index or meta.get("num_shards") != self.num_shards:
            raise CorruptBankError(
                f"{self._bank}: expected the checkpoint of shard {self.index} of {self.num_shards}, "
                f"got {meta or 'a bank without shard metadata'}"
            )
        self.offset = int(meta["offset"])
        self.restored = self.checkpointed = len(rb)
        return rb

    def _skip_issued(self) -> bool:
        """Never hand out an id twice: start above every id issued before a restart.

        Returns whether the ids were moved (items written after the checkpoint were lost).
        """
        ring = self.rb._ring  # the shard owns this buffer; it only reads the ring's ids
        issued = _read_mark(Path(self.directory) / f"shard-{self.index}.issued")
        if issued > ring.next_id + self.offset:  # ids were handed out after the checkpoint
            log.warning(
                "shard %d restarted: %d item(s) written after its last checkpoint are lost; ids "
                "handed out before the restart are stale from now on",
                self.index,
                issued - (ring.next_id + self.offset),
            )
            self.offset = issued - ring.first_id  # the restored items get ids >= the mark
            return True
        return False

    def _count_incarnation(self) -> int:
        path = Path(self.directory) / f"shard-{self.index}.incarnation"
        count = int(path.read_text()) + 1 if path.exists() else 1
        path.write_text(str(count))
        return count

    def _mark_issued(self) -> None:
        os.pwrite(self._issued, np.int64(self.rb._ring.next_id + self.offset).tobytes(), 0)

    # -- writing ---------------------------------------------------------------
    def extend(self, flat: dict[Any, torch.Tensor]) -> dict[str, Any]:
        """Store a batch (already checked by the writer); returns ``{"first", "count"}``
        ids, and ``"ids"`` (in row order) where they do not count up from ``first``."""
        with self.rb.lock:
            ids = self.rb.extend(flat)
            self._mark_issued()
            self._since += len(ids)
            due = self._every_items is not None and self._since >= self._every_items
            due = due or (
                self._every_seconds is not None and time.monotonic() - self._last >= self._every_seconds
            )
            if due:
                self.checkpoint()
            if isinstance(ids, range):
                return {"first": ids.start + self.offset, "count": len(ids)}
            local = ids.numpy() + self.offset  # a table reused slots out of order
            return {"first": int(local[0]) if local.size else 0, "count": len(ids), "ids": local}

    def clear(self) -> None:
        """Drop every item (ids handed out so far become stale)."""
        with self.rb.lock:
            self.rb.clear()
            self._mark_issued()

    def set_max_priority(self, value: float) -> None:
        """Raise the priority new items start at to the largest any shard has seen."""
        sampler = self.rb.sampler
        with self.rb.lock:
            if hasattr(sampler, "max_priority"):
                sampler.max_priority = max(sampler.max_priority, float(value))

    # -- ids -------------------------------------------------------------------
    def check_ids(self, ids: np.ndarray) -> dict[str, Any] | None:
        """The first problem with these (shard-local) ids, or ``None``.

        ``{"kind": "never" | "stale", "id": ..., "first": ..., "next": ...}``: an id not
        handed out yet, or one whose item was overwritten, cleared or lost in a restart;
        ``first``/``next`` bound the live ids.
        """
        with self.rb.lock:
            ring = self.rb._ring
            first, nxt = ring.first_id + self.offset, ring.next_id + self.offset
            ids = np.asarray(ids, dtype=np.int64)
            if ids.size == 0:
                return None
            if ids.max() >= nxt:
                return {"kind": "never", "id": int(ids[ids >= nxt][0]), "first": first, "next": nxt}
            dead = ~live_ids(ring, ids - self.offset)
            if dead.any():
                return {"kind": "stale", "id": int(ids[dead][0]), "first": first, "next": nxt}
            return None

    def update_priority(self, ids: np.ndarray, priorities: np.ndarray) -> int:
        """Set priorities of live ids (others are dropped); returns how many were written."""
        with self.rb.lock:
            ring_ids = np.asarray(ids, dtype=np.int64) - self.offset
            live = live_ids(self.rb._ring, ring_ids)
            self.rb.update_priority(ring_ids[live], np.asarray(priorities)[live], stale="skip")
            return int(live.sum())

    # -- reading ---------------------------------------------------------------
    def stats(self, staleness: tuple[int, int] | None = None, replace: bool = True) -> dict[str, Any]:
        """Size, id range, priority mass, draws a sample may take now (``"draws"``, see
        :func:`~xpbank.distributed.table_room.draws_now`) and checkpoint state (under the
        buffer's lock: a sampler may bring lazy state up to date when asked for its totals).

        ``staleness``: ``(max_staleness, current_version)``: a table first removes the
        items staler than that (as its sample would), so ``"draws"`` counts the rest.
        """
        with self.rb.lock:
            ring, table = self.rb._ring, table_of(self.rb)
            if staleness is not None and table is not None:
                drop_stale(table, int(staleness[1]) - int(staleness[0]))
            totals = getattr(self.rb.sampler, "totals", None)
            total, smallest = totals() if totals is not None else (float(ring.size), 1.0)
            if table is not None and table.tree is not None:  # the prioritized selector's mass
                total = float(sumtree.top_reduce(table.tree, np.add))
            return {
                "draws": draws_now(self.rb, replace),
                "size": ring.size,
                "capacity": ring.capacity,
                "next": ring.next_id + self.offset,
                "total": total,
                "smallest": smallest,
                "incarnation": self.incarnation,
                "restored": self.restored,
                "checkpointed": self.checkpointed,
            }

    def sample(
        self,
        count: int,
        fields: list[Any] | None,
        priorities: bool,
        replace: bool = True,
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``count`` items drawn by this shard's sampler, as flat tensors, with their ids.

        ``priorities``: also return the drawn items' stored priorities and this shard's
        totals at the moment of the draw (the client weights the batch globally).
        ``options``: a table's sample options (``max_staleness``, ``current_version``);
        given (even empty), the table never waits here: if it cannot serve ``count`` now
        (another client took the items since the stats), the answer is ``{"short":
        draws}``, nothing drawn, and the client draws again.
        """
        with self.rb.lock:
            if options is not None:
                try:
                    batch = self.rb.sample(count, replace=replace, fields=fields, timeout=0.0, **options)
                except (RateLimitTimeout, EmptyBufferError):
                    return {"short": draws_now(self.rb, replace)}
            else:
                batch = self.rb.sample(count, replace=replace, fields=fields)
            flat = {key: batch.get(key) for key in batch.keys(True, True)}
            ring_ids = flat.pop("index")
            goal = flat.get("her_goal")  # a HerSampler's goal steps (-1: not relabelled)
            if goal is not None:
                flat["her_goal"] = torch.where(goal >= 0, goal + self.offset, goal)
            out: dict[str, Any] = {"data": flat, "ids": ring_ids + self.offset}
            if priorities:
                slots = ring_ids.numpy() % self.rb.capacity
                out["stored"] = self.rb.sampler.priority(slots)  # type: ignore[attr-defined]
                out["stats"] = self.stats()
            return out

    # -- checkpoints -------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        """Save this shard as a bank now; returns ``{"path", "items"}``."""
        with self.rb.lock:
            meta = {META_KEY: {"shard": self.index, "num_shards": self.num_shards, "offset": self.offset}}
            path = save(self.rb, self._bank, metadata=meta)
            self.checkpointed, self._since, self._last = len(self.rb), 0, time.monotonic()
            return {"path": str(path), "items": self.checkpointed}

    # -- the local buffer's API, per shard (positions, in-place updates, state) ------
    def reset(self, *args: Any) -> int:
        """Become a new shard, as if built with ``Shard(*args)`` (a reused actor); returns 1.

        The actor keeps its process (no start-up: what a buffer over a pool of actors
        pays instead of spawning); Ray's own restart of this actor would still rerun its
        original constructor.
        """
        with self.rb.lock:
            os.close(self._issued)
            self.__init__(*args)  # type: ignore[misc]
        return 1

    def sample_by_index(
        self, positions: Any, fields: list[Any] | None, expect: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """Items at this shard's positions (0 = oldest), as flat tensors, with their ids.

        ``expect``: the ``(next, size)`` of the :meth:`stats` the positions were computed
        from; if the ring moved since (a write or clear in between), nothing is read and
        the answer is ``{"changed": {"next", "size"}}`` (the ring now), under the lock.
        """
        with self.rb.lock:
            ring = self.rb._ring
            now = (ring.next_id + self.offset, ring.size)
            if expect is not None and tuple(expect) != now:
                return {"changed": {"next": now[0], "size": now[1]}}
            batch = self.rb.sample_by_index(positions, fields=fields)
            flat = {key: batch.get(key) for key in batch.keys(True, True)}
            return {"data": flat, "ids": flat.pop("index") + self.offset, "next": now[0], "size": now[1]}

    def permutation(self, n: int) -> torch.Tensor:
        """A random order of ``n`` positions from this shard's generator (an epoch's plan)."""
        with self.rb.lock:
            return torch.randperm(n, generator=self.rb.generator)

    def check_update(self, ids: np.ndarray, flat: dict[Any, torch.Tensor]) -> dict[str, Any] | None:
        """What ``update(ids, flat)`` would refuse, writing nothing: :meth:`check_ids`'s
        answer, or a :class:`~xpbank.SpecError` where a row changes an indexed item's env
        id or episode-end flag (``flat``: values already conformed to the spec)."""
        with self.rb.lock:
            problem = self.check_ids(ids)
            if problem is not None or self.rb.spec is None or self.rb.episodes is None:
                return problem
            slots = self.rb._ring.slots_of_ids(np.asarray(ids, dtype=np.int64) - self.offset)
            if slots.shape[0] and torch.unique(slots).numel() != slots.shape[0]:
                slots, flat = keep_last(slots, flat)
            try:
                check_episode_update(self.rb._ring, self.rb.spec, slots, flat)
            except SpecError as exc:
                raise SpecError(
                    f"shard {self.index}: {exc} (an id of this shard's ring: its global id is "
                    f"(id + {self.offset}) * {self.num_shards} + {self.index}); nothing was updated"
                ) from None
            return None

    def update(self, ids: Any, flat: dict[Any, torch.Tensor], checked: bool = False) -> int:
        """``ReplayBuffer.update`` by this shard's ids (it checks ids and values first);
        returns how many rows were written.

        ``checked``: the ids were found live by :meth:`check_update` (a multi-shard
        update's first round); those overwritten since are dropped, not raised: the
        update took effect at the check, before the write that overwrote them.
        """
        with self.rb.lock:
            ring_ids = np.asarray(ids, dtype=np.int64) - self.offset
            if checked:
                live = live_ids(self.rb._ring, ring_ids)
                if not live.all():
                    keep = torch.from_numpy(np.flatnonzero(live))
                    ring_ids, flat = ring_ids[live], {k: v.index_select(0, keep) for k, v in flat.items()}
                if not ring_ids.size:
                    return 0
            self.rb.update(ring_ids, flat)
            return int(ring_ids.size)

    def state_dict(self) -> dict[str, Any]:
        """The buffer's ``state_dict`` plus this shard's id ``offset``."""
        with self.rb.lock:
            return {**self.rb.state_dict(), "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """Load a :meth:`state_dict` (or a ``ReplayBuffer``'s: offset 0); returns the spec's dict."""
        with self.rb.lock:
            self.rb.load_state_dict(state)
            self.offset = int(state.get("offset", 0))
            self._mark_issued()
            return None if self.rb.spec is None else self.rb.spec.to_dict()

    def ping(self) -> int:
        """This shard's incarnation (1 at first start, +1 per restart)."""
        return self.incarnation


def _read_mark(path: Path) -> int:
    data = path.read_bytes() if path.exists() else b""
    return int(np.frombuffer(data[:8], dtype=np.int64)[0]) if len(data) >= 8 else 0
