"""The :class:`Table`: Reverb's table model (selector, remover, ``max_times_sampled``,
rate limiter, versions) as one component a :class:`~xpbank.ReplayBuffer` is given.

See :mod:`xpbank.table` for the model and its guarantees. Here: the options, what the
table keeps, the presets (:meth:`Table.queue`, :meth:`Table.stack`), binding to a
buffer and the state. The write and sample paths are in :mod:`xpbank.table.ops`.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import numpy as np
import torch

from xpbank.distributed.limiter import RateLimiter
from xpbank.errors import SpecError, XpbankError, check_finite_number, check_positive_int
from xpbank.ring.episode_keys import wants_episodes
from xpbank.sampler import sumtree
from xpbank.sampler.registry import register_sampler
from xpbank.spec.keys import NestedKey, normalize_key
from xpbank.spec.spec import Spec
from xpbank.table import fast, heap, ops, runs
from xpbank.table import state as table_state
from xpbank.table.options import (
    REMOVERS,
    SELECTORS,
    as_tuple,
    limiter_config,
    make_limiter,
    reads_episodes,
)
from xpbank.table.orders import Dense, InsertionLog, LazyHeap
from xpbank.table.slots import TableRing

__all__ = ["REMOVERS", "SELECTORS", "Table"]


@register_sampler("table")
class Table:
    """Reverb's table as a sampler: which item is sampled (``selector``), which leaves when
    the table is full (``remover``), how often an item may be sampled, who waits.

    Give it to a buffer: ``ReplayBuffer(capacity, sampler=Table(...))``; one table serves
    one buffer. ``len(rb)`` is the number of live items; sampled batches carry ``"index"``
    (ids, live until the item leaves) and, with the prioritized selector,
    ``"probability"``; ``rb.update_priority(ids, p)`` sets priorities (heap and
    prioritized selectors and removers read them).

    Args:
        selector: ``"uniform"``, ``"prioritized"`` (probability ``p ** priority_exponent``),
            ``"fifo"`` (oldest first), ``"lifo"`` (newest first), ``"min_heap"`` /
            ``"max_heap"`` (lowest / highest priority first; ties: oldest first).
        remover: which item leaves when a write finds the table full: ``"fifo"`` (the
            oldest: a plain ring), ``"lifo"``, ``"min_heap"``, ``"max_heap"``, ``"uniform"``.
        max_times_sampled: an item leaves after its N-th sample (1: consume once);
            ``None``: no limit.
        rate_limiter: ``None``; ``"queue"`` (Reverb's ``Queue(capacity)``: writers wait
            while the table is full, readers while too few items are there); or a
            :class:`~xpbank.RateLimiter` (Reverb's ratio rules). Waits last up to
            ``timeout`` seconds, then raise :class:`~xpbank.RateLimitTimeout`.
        priority_exponent: the prioritized selector's exponent (Reverb's).
        default_priority: the priority of a new item (before ``update_priority``).
        version_key: an integer field holding the policy version that produced each
            item; ``None`` with ``versioned=True``: items take the writer-side stamp
            (:meth:`set_version`).
        versioned: keep an index of versions (on with ``version_key``) so that
            ``rb.sample(B, max_staleness=K, current_version=v)`` first removes the items
            with ``v - version > K`` (no scan: a min-heap of versions).
        timeout: seconds a write or a sample waits on the rate limiter (a sample's
            ``timeout=`` overrides it).

    Raises:
        SpecError: an unknown selector, remover or option; :meth:`bind_buffer` refuses a buffer
            with n-step, an episode index or a storage that reads one (``FrameStorage``).
        CapacityError: a bad count or timeout.

    Example:
        >>> import torch
        >>> from xpbank import ReplayBuffer, Table
        >>> rb = ReplayBuffer(4, sampler=Table.queue(), seed=0)
        >>> rb.extend({"obs": torch.arange(3.0)})
        range(0, 3)
        >>> rb.sample(2)["obs"].tolist(), len(rb)  # oldest first, each handed out once
        ([0.0, 1.0], 1)
    """

    needs_episodes = False
    sample_options = ("timeout", "max_staleness", "current_version")

    def __init__(
        self,
        selector: str = "uniform",
        remover: str = "fifo",
        *,
        max_times_sampled: int | None = None,
        rate_limiter: RateLimiter | str | dict[str, Any] | None = None,
        priority_exponent: float = 1.0,
        default_priority: float = 1.0,
        version_key: NestedKey | list[str] | None = None,
        versioned: bool = False,
        timeout: float = 60.0,
    ):
        if selector not in SELECTORS:
            raise SpecError(f"selector: expected one of {SELECTORS}, got {selector!r}")
        if remover not in REMOVERS:
            raise SpecError(f"remover: expected one of {REMOVERS}, got {remover!r}")
        self.selector, self.remover = selector, remover
        self.max_times_sampled = (
            None if max_times_sampled is None else check_positive_int("max_times_sampled", max_times_sampled)
        )
        self.rate_limiter = make_limiter(rate_limiter)
        self.priority_exponent = check_finite_number("priority_exponent", priority_exponent, 0.0)
        self.default_priority = check_finite_number("default_priority", default_priority, 0.0)
        self.timeout = check_finite_number("timeout", timeout, 0.0)
        if isinstance(version_key, list):  # from a JSON config
            version_key = tuple(version_key)
        self.version_key = None if version_key is None else normalize_key(version_key)
        self.versioned = bool(versioned) or self.version_key is not None
        self.writer_version = 0
        self.limiter: RateLimiter | None = None  # the bound limiter ("queue" becomes one)
        self.ring: TableRing | None = None
        self._rb: Any = None
        self._cond: threading.Condition | None = None
        self._cond_lock: Any = None
        # for a backend whose items arrive from outside the buffer's calls (shared memory):
        # waits wake every poll_interval seconds and call on_wait() holding rb.lock
        self.poll_interval: float | None = None
        self.on_wait: Any = None
        self.budget = 0  # draws left over the live items (max_times_sampled), minus stuck
        self.stuck = 0  # draws left of live items the prioritized selector cannot draw (priority 0)

    # -- presets (Reverb's names) -----------------------------------------------------
    @classmethod
    def queue(cls, *, timeout: float = 60.0, **options: Any) -> Table:
        """Reverb's ``Table.queue``: FIFO selector and remover, each item sampled once,
        writers wait while the table is full, readers while it holds too few items.

        Args:
            timeout: seconds a write or sample waits before :class:`~xpbank.RateLimitTimeout`.
            options: more :class:`Table` options (e.g. ``version_key``).

        Returns:
            A new table; give it to one buffer. Threads: a plain constructor.

        Example:
            >>> Table.queue()
            Table(selector='fifo', remover='fifo', max_times_sampled=1, rate_limiter='queue')
        """
        return cls("fifo", "fifo", max_times_sampled=1, rate_limiter="queue", timeout=timeout, **options)

    @classmethod
    def stack(cls, *, timeout: float = 60.0, **options: Any) -> Table:
        """Reverb's ``Table.stack``: as :meth:`queue`, newest first (LIFO selector and remover).

        Returns:
            A new table. Threads: a plain constructor.
        """
        return cls("lifo", "lifo", max_times_sampled=1, rate_limiter="queue", timeout=timeout, **options)

    def config(self) -> dict[str, Any]:
        """The constructor arguments, JSON-able: ``Table(**t.config())`` (how banks and Ray
        shards rebuild the table). Threads: reads options fixed at construction.

        Example:
            >>> Table("max_heap", "fifo", max_times_sampled=2).config()["max_times_sampled"]
            2
        """
        return {
            "selector": self.selector,
            "remover": self.remover,
            "max_times_sampled": self.max_times_sampled,
            "rate_limiter": limiter_config(self.rate_limiter),
            "priority_exponent": self.priority_exponent,
            "default_priority": self.default_priority,
            "version_key": None if self.version_key is None else list(as_tuple(self.version_key)),
            "versioned": self.versioned,
            "timeout": self.timeout,
        }

    def set_version(self, version: int) -> None:
        """The writer-side stamp: items written from now on (without ``version_key``) carry
        ``version``.

        Raises:
            SpecError: not an int.

        Threads: one attribute write; hold ``rb.lock`` to tie it to a write.
        """
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
            raise SpecError(f"version: expected an int, got {version!r}")
        self.writer_version = int(version)

    # -- binding -----------------------------------------------------------------------
    def bind_buffer(self, rb: Any) -> None:
        """Take over ``rb``'s slots (called once by :class:`~xpbank.ReplayBuffer`).

        Raises:
            SpecError: the table already serves a buffer, or ``rb`` uses n-step, an
                episode index or a storage that reads one: a table reuses slots out of
                order, which they cannot follow.

        Threads: called from the buffer's constructor, before any other thread has it.
        """
        if self._rb is not None:
            raise SpecError("Table: this table already serves a buffer; give each buffer its own Table")
        why = [
            name
            for name, on in (
                ("nstep", rb._nstep is not None),
                ("an episode index (num_envs=, an env field)", rb._ring.episodes is not None),
                (
                    f"a {type(rb._storage).__name__} (it reads the episode index)",
                    reads_episodes(rb._storage),
                ),
            )
            if on
        ]
        if why:
            raise SpecError(
                f"Table: cannot serve a buffer with {' and '.join(why)}: a table removes and reuses "
                "slots out of order, and these follow the FIFO ring's episodes; build the buffer without them"
            )
        if rb.spec is not None:
            self.check_spec(rb, rb.spec)
        c = rb.capacity
        self.ring = TableRing(c)
        rb._ring = self.ring
        rb.__dict__["_place"] = self.write  # the write path's hook (xpbank.replay.writing.write)
        rb.__dict__["_runs"] = (partial(runs.run_start, self), partial(runs.run_written, self))  # fast path
        rb.__dict__["_take_run"] = partial(runs.take_run, self)  # the read path's (a queue's oldest)
        rb.__dict__["_update_ids"] = partial(fast.update_ids, self)  # update_priority's compiled path
        rb.__dict__["_take_first"] = partial(fast.take_first, self)  # the read path's (a heap's first)
        self._rb = rb
        limiter = self.rate_limiter
        self.limiter = (
            RateLimiter.queue(c)
            if limiter == "queue"
            else limiter
            if isinstance(limiter, RateLimiter)
            else None
        )
        self._heap_kernels = heap.load()  # compiled indexed heaps with numba, else heapq's lazy ones
        self._build(c)

    def _build(self, c: int) -> None:
        sel, rem = self.selector, self.remover
        kernels = self._heap_kernels

        def new_heap(check: str) -> Any:
            return LazyHeap(c, check) if kernels is None else heap.IndexedHeap(c, kernels)

        self.log = InsertionLog(c) if "fifo" in (sel, rem) or "lifo" in (sel, rem) else None
        self.min_heap = new_heap("stamp") if "min_heap" in (sel, rem) else None
        self.max_heap = new_heap("stamp") if "max_heap" in (sel, rem) else None
        self.dense = Dense(c) if "uniform" in (sel, rem) else None
        self.tree = sumtree.new_tree(c, np.add) if sel == "prioritized" else None
        self.versions = new_heap("seq") if self.versioned else None

    def check_spec(self, rb: Any, spec: Spec) -> None:
        """Refuse a spec with an env field (an episode index) or a bad ``version_key``.

        Raises:
            SpecError: naming the field. Threads: pure.
        """
        if wants_episodes(spec, rb._episode_keys, None, False):
            raise SpecError(
                f"Table: the spec has the env field {rb._episode_keys.env!r}, which makes the buffer keep an "
                "episode index; a table reuses slots out of order. Rename the field or use a plain buffer"
            )
        key = self.version_key
        if key is not None:
            field = spec.get(key) if key in spec else None
            if (
                field is None
                or field.shape != ()
                or field.dtype.is_floating_point
                or field.dtype == torch.bool
            ):
                got = "no such field" if field is None else f"{tuple(field.shape)} {field.dtype}"
                raise SpecError(f"version_key {key!r}: expected a scalar integer field, got {got}")

    # -- the Sampler protocol (see xpbank.table.ops) -------------------------------------
    def write(self, rb: Any, flat: dict[Any, torch.Tensor], n: int, spec: Spec) -> Any:
        """Store ``n`` checked rows (the buffer's write path calls it; see :func:`ops.write`).

        Returns:
            The ids (a ``range`` when they count up by one, else a 1-D int64 tensor).

        Raises:
            CapacityError: more rows than the capacity with a limiter that makes writers wait.
            RateLimitTimeout: no room within ``timeout``; nothing written.

        Threads: the caller holds ``rb.lock``; a wait releases it until woken.
        """
        return ops.write(self, rb, flat, n, spec)

    def sample(
        self,
        ring: Any,
        batch_size: int,
        generator: torch.Generator,
        replace: bool = True,
        *,
        timeout: float | None = None,
        max_staleness: int | None = None,
        current_version: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``batch_size`` successive single samples (see :func:`ops.sample`).

        Args:
            ring: the buffer's ring (this table's own).
            batch_size: draws.
            generator: the buffer's generator.
            replace: ``False``: distinct items.
            timeout: seconds to wait on the rate limiter (default: the table's).
            max_staleness, current_version: first remove the items with
                ``current_version - version > max_staleness``.

        Returns:
            ``(slots, info)``; ``info`` holds ``"probability"`` for the prioritized selector.

        Raises:
            EmptyBufferError: too few draws left and no rate limiter to wait on.
            CapacityError: a batch no table of this capacity could ever serve.
            RateLimitTimeout: not served within ``timeout``; nothing changed.
            SpecError, PriorityError: bad options.

        Threads: the caller holds ``rb.lock`` (``rb.sample``); a wait releases it.
        """
        return ops.sample(self, batch_size, generator, replace, timeout, max_staleness, current_version)

    def on_write(self, slots: Any, ring: Any) -> None:
        raise XpbankError(
            "Table: items are written through Table.write (the buffer's write hook), not on_write"
        )

    def on_clear(self) -> None:
        """Every item left (the ring was cleared): the orders and the limiter start over
        (Reverb's reset). Threads: the caller holds ``rb.lock`` (``rb.clear``)."""
        if self.ring is not None:
            self._build(self.ring.capacity)
            self.budget = self.stuck = 0
            if self.limiter is not None:
                self.limiter.inserts = self.limiter.samples = self.limiter.deletes = 0
            self.notify()

    def update_priority(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of live ``slots`` (checked by the buffer; a repeated slot keeps
        its last). Threads: the caller holds ``rb.lock`` (``rb.update_priority``)."""
        ops.set_priorities(self, slots, priorities)

    # -- waiting -------------------------------------------------------------------------
    def condition(self) -> threading.Condition:
        """A condition on the buffer's lock (rebuilt if the buffer replaced its lock).

        Threads: call it holding ``rb.lock``.
        """
        lock = self._rb._lock
        if self._cond is None or self._cond_lock is not lock:
            self._cond, self._cond_lock = threading.Condition(lock), lock
        return self._cond

    def notify(self) -> None:
        """Wake the writers and readers waiting on the buffer, e.g. after rows arrived
        from outside the buffer's own calls. Threads: call it holding ``rb.lock``."""
        if self._cond is not None and self._cond_lock is self._rb._lock:
            self._cond.notify_all()

    # -- state (xpbank.table.state) ----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The slots' arrays, the uniform packing, counters, the limiter's counts (CPU
        tensors and numbers: ``torch.load(weights_only=True)`` reads it).

        Threads: the caller holds ``rb.lock`` (``rb.state_dict``).
        """
        return table_state.state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`; the orders are rebuilt from the slots.

        Raises:
            CapacityError: a state of a table of another capacity.

        Threads: the caller holds ``rb.lock`` (``rb.load_state_dict``); waiters are woken.
        """
        table_state.load_state_dict(self, state)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cond"] = state["_cond_lock"] = None  # a condition is not picklable
        return state

    def __repr__(self) -> str:
        n = "" if self.max_times_sampled is None else f", max_times_sampled={self.max_times_sampled}"
        lim = "" if self.rate_limiter is None else f", rate_limiter={self.rate_limiter!r}"
        return f"Table(selector={self.selector!r}, remover={self.remover!r}{n}{lim})"
