"""Image observations stored once per step: next-observation dedup and frame stacks.

A naive transition buffer for Atari keeps ``obs`` and ``("next", "obs")``, each 4
stacked 84x84 frames: every frame is stored eight times. :class:`FrameStorage` keeps
each step's newest frame once, in a ring ``[capacity, *frame]``, and rebuilds the rest
at read time from the buffer's :class:`~xpbank.EpisodeIndex` (the items' env, their
predecessor and successor in that env, and where episodes start and end):

- ``obs[x]`` is the newest frames of ``x`` and of its ``stack - 1`` predecessors in the
  episode; before the episode's first frame, that first frame is repeated (gymnasium's
  ``FrameStackObservation(padding_type="reset")``) or zeros (``pad="zero"``);
- ``next_obs[x]`` is ``obs[x]`` shifted by one frame, whose newest frame is the next
  item's of the same env, except at an episode end (the true final observation) and
  for each env's newest item (its successor is not written yet): those frames live in
  a small side store;
- an item whose older frames are about to be overwritten (the oldest items of each env
  as the ring wraps) gets its whole stack copied to a second side store first.

Which frames each item reads is worked out when it is written, not at read time: a
per-slot table (:mod:`~xpbank.storage.frame_table`) holds their positions, so a read is
one table lookup and one gather for ``obs`` and one for ``("next", "obs")``. Those two
are separate tensors (changing one in place leaves the other, and the storage, alone).
With envs in lockstep each env's frames are kept together in memory.

Every write is checked against these rules before anything is stored (``verify=True``),
so what comes back is bit-for-bit what went in, or the write is refused with a
:class:`~xpbank.SpecError`. The storage is used under a
:class:`~xpbank.ReplayBuffer`, which builds the episode index for it (it declares
``needs_episodes``), hands it the ring (``attach``) and shows it each whole batch with
its episode plan before writing it (``prepare_write``). Data lives on the CPU.

At B=32 the two frame copies are ~60% of a sample (``benchmarks/bench_images.py``): the
other fields come in one call (``TensorStorage.gather_host``), and every call counts.

Example:
    >>> import torch
    >>> from xpbank import FrameStorage, ReplayBuffer
    >>> frames = torch.arange(6, dtype=torch.uint8).view(6, 1, 1).expand(6, 2, 2)
    >>> stack = lambda t: torch.stack([frames[max(0, t - 2 + j)] for j in range(3)])
    >>> rb = ReplayBuffer(100, storage=FrameStorage(100), num_envs=1)
    >>> for t in range(5):
    ...     _ = rb.add({"obs": stack(t), ("next", "obs"): stack(t + 1), "terminated": t == 4})
    >>> bool((rb.sample_by_index([2])["next", "obs"][0] == stack(3)).all())
    True
    >>> rb.storage.nbytes() < 2 * 5 * 3 * 4 * 100
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from xpbank.errors import SpecError
from xpbank.spec.keys import NestedKey, key_str, normalize_key
from xpbank.spec.spec import Spec
from xpbank.storage.base import Slots, StorageBase, check_capacity
from xpbank.storage.dtypes import to_numpy
from xpbank.storage.frame_pool import SlotPool
from xpbank.storage.frame_step import PickledWithoutViews, StepWrite, apply_step
from xpbank.storage.frame_table import FrameTable
from xpbank.storage.frame_write import FrameWrite, plan_frames, plan_step
from xpbank.storage.hugepages import advise_huge_pages
from xpbank.storage.tensor import TensorStorage

if TYPE_CHECKING:
    from xpbank.ring.episodes import _Plan
    from xpbank.ring.ids import Ring

__all__ = ["FrameStorage"]

_PADS = ("repeat", "zero")
_CHUNK_BYTES = 1 << 20  # stacks read per chunk: next obs then read their frames from cache


class FrameStorage(PickledWithoutViews, StorageBase):
    """Stores each frame of an image observation once (cpprb's ``next_of`` and
    ``stack_compress``, exact at episode ends, ring wraps and across envs).

    Args:
        capacity: number of slots.
        spec: the item layout (``None``: from the first write).
        obs: the observation field.
        next_obs: its next-step field, rebuilt from the next item (``None``: not stored).
        stacked: ``obs`` is ``[stack, *frame]``, frames stacked oldest first; ``False``
            stores whole observations (next-observation dedup only).
        pad: what stacks hold before an episode's first frame: ``"repeat"`` it
            (gymnasium's default) or ``"zero"``.
        verify: check every write against the frame-stack rules (a few comparisons per
            item); without it a batch that breaks them is stored wrongly.
    """

    needs_episodes = True

    def __init__(
        self,
        capacity: int,
        spec: Spec | None = None,
        *,
        obs: Any = "obs",
        next_obs: Any = ("next", "obs"),
        stacked: bool = True,
        pad: str = "repeat",
        verify: bool = True,
    ):
        self.capacity = check_capacity(capacity)
        self.device = torch.device("cpu")
        if pad not in _PADS:
            raise SpecError(f"pad: expected one of {_PADS}, got {pad!r}")
        self.obs_key = normalize_key(obs)
        self.next_key = None if next_obs is None else normalize_key(next_obs)
        self.stacked, self.pad, self.verify = bool(stacked), pad, bool(verify)
        self._spec: Spec | None = None
        self._ring: Ring | None = None
        self._stored: tuple[int, int] | None = None
        if spec is not None:
            self.initialize(spec)

    # -- layout ----------------------------------------------------------------
    def initialize(self, spec: Spec) -> None:
        if self.obs_key not in spec:
            raise SpecError(f"FrameStorage: field {key_str(self.obs_key)!r} (obs=) is not in the spec {spec}")
        field = spec[self.obs_key]
        if self.next_key is not None and spec.get(self.next_key) != field:
            got = spec.get(self.next_key)
            raise SpecError(
                f"FrameStorage: field {key_str(self.next_key)!r} (next_obs=): expected {field} like "
                f"{key_str(self.obs_key)!r}, got {got}"
            )
        if self.stacked and len(field.shape) < 1:
            raise SpecError(
                f"FrameStorage: stacked field {key_str(self.obs_key)!r} needs a stack dim, got {field}"
            )
        self.stack = field.shape[0] if self.stacked else 1
        self.frame_shape = field.shape[1:] if self.stacked else field.shape
        self.dtype = field.dtype
        rest = Spec({k: f for k, f in spec.items() if k not in (self.obs_key, self.next_key)})
        self._rest = TensorStorage(self.capacity, rest) if len(rest) else None
        # by position (see frame_table.py), plus one all-zero frame that pad="zero" reads
        self._frames = torch.empty((self.capacity + 1, *self.frame_shape), dtype=self.dtype)
        advise_huge_pages(self._frames)
        self._frames[self.capacity] = 0
        self._np_frames = to_numpy(self._frames)
        # items per chunk of a read (one take of both outputs up to this many)
        self._chunk_items = max(1, _CHUNK_BYTES // max(1, self.stack * self._np_frames[0].nbytes))
        self._order = tuple(spec)  # the fields of a whole-item read, in spec order
        self._table: FrameTable | None = None  # made once the ring is attached (its env layout)
        self._last = SlotPool(self.capacity, self.frame_shape, self.dtype)  # next frames kept aside
        self._stacks = SlotPool(self.capacity, (self.stack, *self.frame_shape), self.dtype)  # rescued
        self._spec = spec

    def attach(self, ring: Ring) -> None:
        """Read episode links from ``ring.episodes`` (the buffer calls this)."""
        self._ring = ring

    def _links_ring(self) -> Ring:
        if self._ring is None or self._ring.episodes is None:
            raise RuntimeError("FrameStorage is used under a ReplayBuffer, which attaches its ring")
        return self._ring

    def _layout(self) -> FrameTable:
        """The table of frame positions, made on first use: the frame layout is then fixed
        (per env when the buffer's envs write in lockstep, see frame_table.py)."""
        if self._table is None:
            eps = self._links_ring().episodes
            spec = self._spec if self._spec is not None else Spec()
            lockstep = eps is not None and normalize_key(eps.keys.env) not in spec  # no env field
            envs = eps.num_envs if lockstep and eps is not None and eps.num_envs else 1
            self._table = FrameTable(self.capacity, self.stack, envs, self.pad == "zero")
        return self._table

    def _frame_table(self) -> FrameTable:
        """:meth:`_layout`, rebuilt from the episode index first after a state load."""
        table = self._layout()
        if table.stale:
            table.rebuild(self._links_ring(), np.flatnonzero(self._stacks.index >= 0))
        return table

    def _as_stack(self, value: torch.Tensor) -> torch.Tensor:
        return value if self.stacked else value.unsqueeze(1)

    # -- writing ---------------------------------------------------------------
    def prepare_write(self, flat: Mapping[NestedKey, torch.Tensor], n: int, plan: _Plan) -> None:
        """Check a whole batch against the frame rules, then update the side stores
        (a lockstep step, with numba: and store its newest frames, see frame_step.py).

        Called by the buffer before any :meth:`write` of the batch.

        Raises:
            SpecError: an observation that is not the previous step's next observation
                of the same env, a next observation that is not its observation shifted
                by one frame, or an episode's first stack not padded as ``pad`` says.
        """
        ring, self._stored = self._links_ring(), None
        obs = self._as_stack(flat[self.obs_key].detach().cpu())
        nxt = None if self.next_key is None else self._as_stack(flat[self.next_key].detach().cpu())
        todo = plan_step(self, ring, obs, nxt, plan, n)  # checks; nothing changed yet
        if type(todo) is StepWrite and apply_step(self, todo):  # one compiled call wrote it,
            self._stored = ring.next_id % self.capacity, n  # newest frames included: write() skips them
            return
        if type(todo) is not FrameWrite:  # not one lockstep step, or a check failed (plan_frames raises)
            todo = plan_frames(self, ring, obs, nxt, plan, n)
        c, new = self.capacity, todo.overwritten  # the slots written: those of the kept rows
        table = self._frame_table()
        if todo.rescue_old.size:  # stacks whose older frames this write overwrites (rows
            old = todo.rescue_old % c  # not marked yet: their frames are all in the array)
            self._stacks.put(old, self._np_frames.take(table.src[old, : self.stack], axis=0))
            table.mark_kept(old)
        self._last.drop(np.concatenate((new, todo.resolved % c)))  # distinct slots
        self._stacks.drop(new)
        if nxt is not None:  # every row in a vector step
            rows, every = todo.last_rows, todo.last_rows.shape[0] == n
            last = nxt if every else nxt.index_select(0, torch.from_numpy(rows))
            self._last.put(new if every else todo.ids[rows] % c, last[:, -1], fresh=True)
        table.set_rows(new, todo.stack_ids, todo.pad)
        table.link(todo.linked, todo.successors)
        if todo.rescue_rows.size:
            kept = todo.ids[todo.rescue_rows] % c
            self._stacks.put(kept, obs.index_select(0, torch.from_numpy(todo.rescue_rows)), fresh=True)
            table.mark_kept(kept)

    def write(self, slots: Slots, batch: Mapping[NestedKey, torch.Tensor]) -> None:
        if self._spec is None:
            raise RuntimeError("FrameStorage.write before initialize(spec)")
        rest = {k: v for k, v in batch.items() if k not in (self.obs_key, self.next_key)}
        if not isinstance(slots, slice):
            frozen = [key_str(k) for k in batch if k in (self.obs_key, self.next_key)]
            if frozen:
                raise SpecError(
                    f"update: field {frozen[0]!r} is shared between steps in a FrameStorage (each frame "
                    "is stored once); it cannot be changed in place"
                )
        elif self.obs_key in batch and self._stored != (slots.start, slots.stop - slots.start):
            self._write_frames(slots, self._as_stack(batch[self.obs_key].detach().cpu())[:, -1])
        self._stored = None  # (first slot, count) of newest frames prepare_write stored
        if rest and self._rest is not None:
            self._rest.write(slots, rest)

    def _write_frames(self, slots: slice, frames: torch.Tensor) -> None:
        """Store the newest frames of slots ``[start, stop)`` at their positions."""
        table = self._frame_table()
        if table.envs == 1:  # positions are slots: one slice copy
            self._frames[slots] = frames
            return
        run = table.run(slots.start, slots.stop)
        if run is not None:  # lockstep steps: one strided copy into every env's run (NumPy's:
            first, count = run  # a step of 8 Atari frames in a third of torch's time)
            per_env = self._np_frames[: self.capacity].reshape(table.envs, table.rows, *self.frame_shape)
            steps = to_numpy(frames).reshape(count, table.envs, *self.frame_shape)
            per_env[:, first : first + count] = steps.swapaxes(0, 1)
            return
        where = table.positions(np.arange(slots.start, slots.stop, dtype=np.int64))
        self._frames.index_copy_(0, torch.from_numpy(where), frames)

    # -- reading ---------------------------------------------------------------
    def _read(self, slots: np.ndarray, want_obs: bool, want_next: bool) -> list[torch.Tensor]:
        """``[obs, next_obs]`` (those asked for) of live items, each a fresh ``[N, stack, *frame]``.

        One table lookup gives every item's frame positions (``[N, stack + 1]``: its
        stack, then the next item's frame); both outputs are one gather of the frames
        when they fit in cache, else a gather per output in chunks small enough to stay
        in cache (so the next observations' frames, read right after the observations',
        come from cache). Rows the frame array cannot serve (marked in the table) are
        then patched from the side stores.
        """
        table = self._table if self._table is not None and not self._table.stale else self._frame_table()
        src = table.src.take(slots, axis=0)  # half fancy indexing's cost
        frames, s = self._np_frames, self.stack
        n = src.shape[0]
        both = want_obs and want_next
        # one allocation for both: freed and reused as one block, it stays mapped (two
        # large blocks freed together are handed back to the system by the allocator,
        # and every sample then pays page faults on fresh memory: measured 3x slower at B=256)
        block = np.empty((2 if both else 1, n, s, *self.frame_shape), dtype=frames.dtype)
        step = self._chunk_items
        if n <= step and both:  # one chunk (the common case at small batches): ONE take of
            # both outputs, through a view of the table's rows (a fresh C-contiguous copy) as
            # [obs or next, item, frame]: pairs[k, i, j] = src[i, j + k] (no index copy)
            row, col = src.strides
            pairs = np.ndarray((2, n, s), src.dtype, src, 0, (col, row, col))
            frames.take(pairs, axis=0, out=block, mode="clip")  # "clip": unbuffered; -1: patched
        else:  # a loop over chunks of items, not over items
            for a in range(0, n, step):
                b = min(a + step, n)
                if want_obs:
                    frames.take(src[a:b, :s], axis=0, out=block[0, a:b], mode="clip")
                if want_next:
                    frames.take(src[a:b, 1:], axis=0, out=block[-1, a:b], mode="clip")
        obs = block[0] if want_obs else None
        nxt = block[-1] if want_next else None
        if src.min() < 0:  # a few rows the frame array cannot serve
            self._patch(slots, src, obs, nxt)
        out = [] if obs is None else [torch.from_numpy(obs)]
        if nxt is not None:
            out.append(torch.from_numpy(nxt))
        return out if out[0].dtype == self.dtype else [value.view(self.dtype) for value in out]

    def _patch(
        self, slots: np.ndarray, src: np.ndarray, obs: np.ndarray | None, nxt: np.ndarray | None
    ) -> None:
        """Rows marked in the table (see frame_table.py) from the side stores: stacks
        kept aside (first column ``-1``), next frames kept aside (last column ``-1``)."""
        kept = np.flatnonzero(src[:, 0] < 0)
        if kept.size:
            stacks = to_numpy(self._stacks.get(slots[kept]))
            if obs is not None:
                obs[kept] = stacks
            if nxt is not None:
                nxt[kept, :-1] = stacks[:, 1:]
        aside = np.flatnonzero(src[:, self.stack] < 0)
        if nxt is not None and aside.size:
            nxt[aside, -1] = to_numpy(self._last.get(slots[aside]))

    def gather(
        self, slots: torch.Tensor, keys: Sequence[NestedKey] | None = None
    ) -> dict[NestedKey, torch.Tensor]:
        if self._spec is None:
            raise RuntimeError("FrameStorage.gather before initialize(spec)")
        obs_key, next_key = self.obs_key, self.next_key
        if keys is None and self.stacked and next_key is not None:  # the sample hot path
            return self._gather_all(slots, obs_key, next_key)
        rest: list[NestedKey] | None = None  # None: every other field
        if keys is None:  # every field
            want_obs, want_next = True, next_key is not None
        else:
            want_obs, want_next = obs_key in keys, next_key is not None and next_key in keys
            rest = [k for k in keys if k != obs_key and k != next_key]
        out: dict[NestedKey, torch.Tensor] = {}
        if (rest is None or rest) and self._rest is not None:  # first, while the caches hold
            out = self._rest.gather(slots, rest)  # its index arrays
        if want_obs or want_next:
            read = self._read(slots.cpu().numpy(), want_obs, want_next)
            if not self.stacked:
                read = [value.squeeze(1) for value in read]
            if want_obs:
                out[obs_key] = read[0]
            if want_next:
                out[next_key] = read[-1]  # type: ignore[index]
        return {k: out[k] for k in (self._order if keys is None else keys)}

    def _gather_all(
        self, slots: torch.Tensor, obs_key: NestedKey, next_key: NestedKey
    ) -> dict[NestedKey, torch.Tensor]:
        """Every field of ``slots``: one NumPy view of the slots for both reads."""
        try:
            rows = slots.numpy()
        except TypeError:  # on a GPU
            rows = slots.cpu().numpy()
        out = {} if self._rest is None else self._rest.gather_host(rows)
        out[obs_key], out[next_key] = self._read(rows, True, True)
        return {k: out[k] for k in self._order}

    def nbytes(self) -> int:
        """Bytes held: the frames, the table of their positions, the side stores and the
        other fields."""
        if self._spec is None:
            return 0
        rest = self._rest.nbytes() if self._rest is not None else 0
        frames = self._frames.numel() * self._frames.element_size()
        table = (self.stack + 1) * self.capacity * 8  # FrameTable.src, allocated on first use
        return int(frames + table + self._last.nbytes() + self._stacks.nbytes() + rest)

    # -- state -----------------------------------------------------------------
    def state_dict(self, size: int) -> dict[str, Any]:
        """Spec, frames of slots ``[0, size)``, side stores and other fields: NumPy
        arrays, tensors, str-keyed dicts and scalars only (no pickle needed)."""
        if self._spec is None:
            return {"spec": None}
        return {
            "spec": self._spec.to_dict(),
            "frames": self._frames[self._slot_positions(size)],  # in slot order
            "last": self._last.state_dict(),
            "stacks": self._stacks.state_dict(),
            "rest": self._rest.state_dict(size) if self._rest is not None else {"spec": None},
        }

    def _slot_positions(self, size: int) -> torch.Tensor:
        """Where the frames of slots ``[0, size)`` are."""
        slots = np.arange(size, dtype=np.int64)
        return torch.from_numpy(slots if size == 0 else self._layout().positions(slots))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("spec") is None:
            return
        spec = Spec.from_dict(state["spec"])
        if self._spec is None:
            self.initialize(spec)
        elif self._spec != spec:
            raise SpecError(f"state holds {spec}, but this storage holds {self._spec}")
        frames = torch.as_tensor(state["frames"])
        self._frames[self._slot_positions(frames.shape[0])] = frames
        self._layout().stale = True  # its rows follow the episode index, loaded after this
        self._last.load_state_dict(state["last"])
        self._stacks.load_state_dict(state["stacks"])
        if self._rest is not None:
            self._rest.load_state_dict(state["rest"])
