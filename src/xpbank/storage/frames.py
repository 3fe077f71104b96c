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

Every write is checked against these rules before anything is stored (``verify=True``),
so what comes back is bit-for-bit what went in, or the write is refused with a
:class:`~xpbank.SpecError`. The storage is used under a
:class:`~xpbank.ReplayBuffer`, which builds the episode index for it (it declares
``needs_episodes``), hands it the ring (``attach``) and shows it each whole batch with
its episode plan before writing it (``prepare_write``). Data lives on the CPU.

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
from xpbank.spec import NestedKey, Spec, key_str, normalize_key
from xpbank.storage.base import Slots, StorageBase, check_capacity
from xpbank.storage.dtypes import as_torch, to_numpy
from xpbank.storage.frame_pool import SlotPool
from xpbank.storage.frame_write import plan_frames
from xpbank.storage.tensor import TensorStorage

if TYPE_CHECKING:
    from xpbank.episodes import _Plan
    from xpbank.ring import Ring

__all__ = ["FrameStorage"]

_PADS = ("repeat", "zero")
_CHUNK_BYTES = 1 << 19  # stacks read per chunk: small enough to stay in L2 for next obs


class FrameStorage(StorageBase):
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
        self._frames = torch.empty((self.capacity, *self.frame_shape), dtype=self.dtype)
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

    def _as_stack(self, value: torch.Tensor) -> torch.Tensor:
        return value if self.stacked else value.unsqueeze(1)

    # -- writing ---------------------------------------------------------------
    def prepare_write(self, flat: Mapping[NestedKey, torch.Tensor], n: int, plan: _Plan) -> None:
        """Check a whole batch against the frame rules, then update the side stores.

        Called by the buffer before any :meth:`write` of the batch.

        Raises:
            SpecError: an observation that is not the previous step's next observation
                of the same env, a next observation that is not its observation shifted
                by one frame, or an episode's first stack not padded as ``pad`` says.
        """
        ring = self._links_ring()
        obs = self._as_stack(flat[self.obs_key].detach().cpu())
        nxt = None if self.next_key is None else self._as_stack(flat[self.next_key].detach().cpu())
        todo = plan_frames(self, ring, obs, nxt, plan, n)  # checks; nothing changed yet
        c = self.capacity
        if todo.rescue_old.size:  # stacks whose older frames this write overwrites
            self._stacks.put(todo.rescue_old % c, self._read_stacks(todo.rescue_old % c, todo.rescue_old))
        self._last.drop(todo.overwritten)
        self._stacks.drop(todo.overwritten)
        self._last.drop(todo.resolved % c)
        if nxt is not None:
            rows = torch.from_numpy(todo.last_rows)
            self._last.put(todo.ids[todo.last_rows] % c, nxt.index_select(0, rows)[:, -1])
        rows = torch.from_numpy(todo.rescue_rows)
        self._stacks.put(todo.ids[todo.rescue_rows] % c, obs.index_select(0, rows))

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
        elif self.obs_key in batch:
            self._frames[slots] = self._as_stack(batch[self.obs_key].detach().cpu())[:, -1]
        if rest and self._rest is not None:
            self._rest.write(slots, rest)

    # -- reading ---------------------------------------------------------------
    def _sources(self, slots: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per item, the slots of its stack's frames ``[N, stack]`` (oldest first) and
        which of them are padding (before the episode's first frame)."""
        eps = self._links_ring().episodes
        links = eps.links()  # type: ignore[union-attr]
        c, s = self.capacity, self.stack
        step = eps.lockstep  # type: ignore[union-attr]
        if step is not None:  # an env's items are `step` ids apart: no walk needed
            back = ids[:, None] - step * np.arange(s - 1, -1, -1)
            first = links.start[slots][:, None]
            return np.maximum(back, first) % c, back < first
        src = np.empty((slots.shape[0], s), dtype=np.int64)
        pad = np.zeros((slots.shape[0], s), dtype=bool)
        src[:, s - 1] = slots
        cur, cur_id = slots, ids
        padded = np.zeros(slots.shape[0], dtype=bool)
        for j in range(s - 2, -1, -1):
            padded = padded | (links.start[cur] == cur_id)
            cur_id = np.where(padded, cur_id, links.prev[cur])
            cur = cur_id % c
            src[:, j], pad[:, j] = cur, padded
        return src, pad

    def _read(
        self, slots: np.ndarray, ids: np.ndarray, want_obs: bool, want_next: bool
    ) -> list[torch.Tensor]:
        """``[obs, next_obs]`` (those asked for) of live items, each a fresh ``[N, stack, *frame]``.

        Items are read in chunks small enough to stay in cache: a chunk's stacks are
        gathered into ``obs``, and its next observations copied from them, shifted by one
        frame, with only the newest frame gathered (so each frame is read from memory once).
        """
        links = self._links_ring().episodes.links()  # type: ignore[union-attr]
        frames = to_numpy(self._frames)
        src, pad = self._sources(slots, ids)
        n, s = src.shape
        obs = np.empty((n, s, *frames.shape[1:]), dtype=frames.dtype)
        nxt = np.empty_like(obs) if want_next else None
        last = slots
        if nxt is not None:
            succ = links.next[slots]
            follows = (succ >= 0) & ~(links.terminated[slots] | links.truncated[slots])
            last = np.where(follows, succ % self.capacity, slots)
        step = max(1, _CHUNK_BYTES // max(1, s * frames[0].nbytes))
        for a in range(0, n, step):  # a loop over chunks of items, not over items
            b = min(a + step, n)
            np.take(frames, src[a:b], axis=0, out=obs[a:b], mode="clip")  # "clip": unbuffered
            if nxt is not None:
                nxt[a:b, :-1] = obs[a:b, 1:]
                nxt[a:b, -1] = frames[last[a:b]]
        if self.pad == "zero":
            obs[pad] = 0
        kept = np.flatnonzero(self._stacks.has(slots))
        if kept.size:
            obs[kept] = to_numpy(self._stacks.get(slots[kept]))
        out = [as_torch(obs, self.dtype)] if want_obs else []
        if nxt is not None:
            if self.pad == "zero":
                nxt[:, :-1][pad[:, 1:]] = 0
            if kept.size:
                nxt[kept, :-1] = obs[kept, 1:]
            aside = np.flatnonzero(~follows)
            if aside.size:
                nxt[aside, -1] = to_numpy(self._last.get(slots[aside]))
            out.append(as_torch(nxt, self.dtype))
        return out

    def _read_stacks(self, slots: np.ndarray, ids: np.ndarray) -> torch.Tensor:
        """The stacked observations of live items ``(slots, ids)``."""
        return self._read(slots, ids, True, False)[0]

    def _read_next(self, slots: np.ndarray, ids: np.ndarray) -> torch.Tensor:
        """The stacked next observations of live items ``(slots, ids)``."""
        return self._read(slots, ids, False, True)[0]

    def gather(
        self, slots: torch.Tensor, keys: Sequence[NestedKey] | None = None
    ) -> dict[NestedKey, torch.Tensor]:
        if self._spec is None:
            raise RuntimeError("FrameStorage.gather before initialize(spec)")
        order = list(self._spec if keys is None else keys)
        frame_keys = [k for k in order if k in (self.obs_key, self.next_key)]
        out: dict[NestedKey, torch.Tensor] = {}
        rest = [k for k in order if k not in (self.obs_key, self.next_key)]
        if rest and self._rest is not None:  # first, while the caches hold its index arrays
            out.update(self._rest.gather(slots, rest))
        if frame_keys:
            s = slots.cpu().numpy()
            ids = self._links_ring().ids_of_slots(torch.from_numpy(s)).numpy()
            want_obs = self.obs_key in frame_keys
            read = self._read(s, ids, want_obs, self.next_key is not None and self.next_key in frame_keys)
            asked = [k for k in (self.obs_key, self.next_key) if k in frame_keys]
            for key, value in zip(asked, read, strict=True):
                out[key] = value if self.stacked else value.squeeze(1)
        return {k: out[k] for k in order}

    def nbytes(self) -> int:
        """Bytes held: the frame ring, the side stores and the other fields."""
        if self._spec is None:
            return 0
        rest = self._rest.nbytes() if self._rest is not None else 0
        frames = self._frames.numel() * self._frames.element_size()
        return int(frames + self._last.nbytes() + self._stacks.nbytes() + rest)

    # -- state -----------------------------------------------------------------
    def state_dict(self, size: int) -> dict[str, Any]:
        """Spec, frames of slots ``[0, size)``, side stores and other fields: NumPy
        arrays, tensors, str-keyed dicts and scalars only (no pickle needed)."""
        if self._spec is None:
            return {"spec": None}
        return {
            "spec": self._spec.to_dict(),
            "frames": self._frames[:size].clone(),
            "last": self._last.state_dict(),
            "stacks": self._stacks.state_dict(),
            "rest": self._rest.state_dict(size) if self._rest is not None else {"spec": None},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("spec") is None:
            return
        spec = Spec.from_dict(state["spec"])
        if self._spec is None:
            self.initialize(spec)
        elif self._spec != spec:
            raise SpecError(f"state holds {spec}, but this storage holds {self._spec}")
        frames = torch.as_tensor(state["frames"])
        self._frames[: frames.shape[0]] = frames
        self._last.load_state_dict(state["last"])
        self._stacks.load_state_dict(state["stacks"])
        if self._rest is not None:
            self._rest.load_state_dict(state["rest"])
