"""Windows of consecutive steps of one env, for recurrent agents (R2D2, Dreamer).

A window is ``burn_in + length`` consecutive items of one env. Which windows may be
drawn is decided when they become complete, at write time, and kept in a structure
that is drawn from directly, so a sample never scans the buffer:

- every item gets a position in its episode (0 at the first item) from the buffer's
  :class:`~xpbank.EpisodeIndex`, and each env keeps its last ``2 * window`` ids in a
  small ring, so the item ``window - 1`` steps back is one array read;
- **strict** mode: the item at episode position ``p`` starts a valid window when the
  item ``window - 1`` steps later in the same episode is written (episodes shorter
  than a window give none);
- **padded** mode: also, when an episode ends, each start within ``window - 1`` steps
  of its end becomes valid, padded after the end;
- only starts at positions ``p % stride == 0`` are used (``stride < window``: R2D2's
  overlapping sequences; ``stride == window``: disjoint ones);
- a start stops being valid when its slot is overwritten. A window's other items are
  newer than its start, so a live start means a live window that never crosses the
  ring's write cursor.

The starts live in a :class:`~xpbank.sampler.draw.SlotSet` (uniform: one random
position, O(1)) or the sum-tree of :mod:`xpbank.sampler.sumtree` (prioritized: O(log C)).
The ids of a drawn window are ``start + j * num_envs`` in lockstep mode, or followed
through the index's ``next`` links otherwise: O(B * L) per sample either way.

The index is brought up to date lazily: before each write (the items of earlier writes)
and before each sample, so every item is indexed once, O(1) each, vectorized per call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.errors import CapacityError, EmptyBufferError, SpecError, check_positive_int
from xpbank.ring.episodes import EpisodeIndex
from xpbank.ring.ids import Ring
from xpbank.sampler.draw import SlotSet
from xpbank.sampler.registry import register_sampler
from xpbank.sampler.sequence_index import EnvStreams, new_starts, window_priority
from xpbank.sampler.sumtree import find_prefix_sum, new_tree, set_leaves, set_range
from xpbank.storage.base import Slots

__all__ = ["SequenceSampler"]

_MODES = ("strict", "padded")


@register_sampler("sequence")
class SequenceSampler:
    """Draws windows ``[B, burn_in + length]`` of consecutive steps of one env.

    ``ReplayBuffer(..., sampler=SequenceSampler(L))`` makes ``rb.sample(B)`` return a
    TensorDict of batch size ``[B, burn_in + L]``, with ``"index"`` (each step's item
    id), ``"mask"`` (True on real, non-burn-in steps), ``"burn_in_mask"`` (True on the
    first ``burn_in`` steps; only when ``burn_in > 0``) and, when prioritized,
    ``"weight"`` (importance weights, one per window, repeated along the steps).
    A recurrent state stored with each item comes back with it: read it at ``[:, 0]``.
    Padded steps (after an episode's end) repeat that episode's last item, with
    ``"mask"`` False.

    Args:
        length: training steps per window.
        burn_in: extra steps before them, to warm up a recurrent state.
        stride: starts are the items at episode positions ``0, stride, 2 * stride ...``
            (``1``: every item). R2D2's 80-step windows overlapping by 40: ``stride=40``.
        mode: ``"strict"``: windows wholly inside one episode (episodes shorter than
            ``burn_in + length`` never give one); ``"padded"``: also windows running
            past an episode's end, padded.
        prioritized: draw windows by priority (R2D2) instead of uniformly.
        alpha: priority exponent (``P ~ p ** alpha``).
        beta: importance-weight exponent.
        eta: R2D2's mix: a window's priority is ``eta * max|d| + (1 - eta) * mean|d|``.
        eps: added to every priority so none is 0.

    Raises:
        EmptyBufferError: at sample time, when no window is complete yet.

    Example:
        >>> import torch
        >>> from xpbank import ReplayBuffer, SequenceSampler
        >>> rb = ReplayBuffer(1000, num_envs=2, sampler=SequenceSampler(4), seed=0)
        >>> no = torch.zeros(2, dtype=torch.bool)
        >>> for t in range(10):
        ...     _ = rb.extend({"obs": torch.full((2, 1), float(t)), "terminated": no})
        >>> batch = rb.sample(3)
        >>> batch.batch_size, batch["obs"][0, :, 0].diff().tolist()
        (torch.Size([3, 4]), [1.0, 1.0, 1.0])
    """

    needs_episodes = True

    def __init__(
        self,
        length: int,
        *,
        burn_in: int = 0,
        stride: int = 1,
        mode: str = "strict",
        prioritized: bool = False,
        alpha: float = 0.9,
        beta: float = 0.6,
        eta: float = 0.9,
        eps: float = 1e-6,
    ):
        self.length = check_positive_int("length", length)
        if isinstance(burn_in, bool) or not isinstance(burn_in, (int, np.integer)) or burn_in < 0:
            raise CapacityError(f"burn_in: expected an int >= 0, got {burn_in!r}")
        self.burn_in = int(burn_in)
        self.stride = check_positive_int("stride", stride)
        if mode not in _MODES:
            raise SpecError(f"mode: expected one of {_MODES}, got {mode!r}")
        if not 0.0 <= eta <= 1.0:
            raise SpecError(f"eta: expected a number in [0, 1], got {eta!r}")
        self.mode, self.prioritized = mode, bool(prioritized)
        self.alpha, self.beta, self.eta, self.eps = float(alpha), float(beta), float(eta), float(eps)
        self.window = self.burn_in + self.length
        self._capacity = 0
        self._ring: Ring | None = None

    # -- index upkeep ----------------------------------------------------------
    def _setup(self, ring: Ring) -> None:
        c = ring.capacity
        self._capacity, self._ring = c, ring
        self._span = np.zeros(c, dtype=np.int64)  # real items of the window starting here
        self._starts = SlotSet(c)
        self._tree = new_tree(c, np.add) if self.prioritized else None
        self._max_priority = 1.0
        self._streams = EnvStreams(2 * self.window)
        self._synced = ring.next_id

    def _index(self, ring: Ring) -> EpisodeIndex:
        if ring.episodes is None:
            raise SpecError("SequenceSampler needs the buffer's episode index (ReplayBuffer builds it)")
        if self._ring is not ring:
            self.bind(ring)
        return ring.episodes

    def _sync(self, ring: Ring) -> None:
        """Index the items written since the last sync (all still live: see on_write)."""
        eps = self._index(ring)
        lo, hi = max(self._synced, ring.first_id), ring.next_id
        self._synced = hi
        if hi <= lo:
            return
        links = eps.links()
        chunk = self.window * max(1, self._streams.width)
        for a in range(lo, hi, chunk):
            ids = np.arange(a, min(hi, a + chunk), dtype=np.int64)
            starts, spans = new_starts(
                self._streams,
                ids,
                links,
                self._capacity,
                self.window,
                self.stride,
                self.mode == "padded",
                self.burn_in + 1,
            )
            keep = starts >= ring.first_id
            self._add(starts[keep] % self._capacity, spans[keep])

    def _add(self, slots: np.ndarray, spans: np.ndarray) -> None:
        self._span[slots] = spans
        self._starts.add(slots)
        if self._tree is not None:
            set_leaves(self._tree, slots, np.full(slots.shape[0], self._max_priority**self.alpha), np.add)

    def _drop(self, slots: np.ndarray) -> None:
        self._starts.remove(slots)
        if self._tree is not None:
            set_leaves(self._tree, slots, np.zeros(slots.shape[0]), np.add)

    def on_write(self, slots: Slots, ring: Ring) -> None:
        """Index earlier writes, then forget the starts about to be overwritten."""
        self._sync(ring)
        if isinstance(slots, slice):
            self._drop(np.arange(slots.start, slots.stop, dtype=np.int64))
        else:
            self._drop(np.unique(slots.numpy()))

    def on_clear(self) -> None:
        if self._ring is not None:
            self._starts.clear()
            if self._tree is not None:
                set_range(self._tree, 0, self._capacity, 0.0, np.add)
            self._streams.clear()
            self._synced = self._ring.next_id

    # -- sampling --------------------------------------------------------------
    def num_windows(self, ring: Ring) -> int:
        """How many windows may be drawn now."""
        self._sync(ring)
        return len(self._starts)

    def window_starts(self, ring: Ring) -> np.ndarray:
        """The first ids of the windows that may be drawn now, sorted (for inspection:
        O(number of windows))."""
        self._sync(ring)
        return np.sort(ring.ids_of_slots(torch.from_numpy(self._starts.members().copy())).numpy())

    def sample(
        self, ring: Ring, batch_size: int, generator: torch.Generator, replace: bool = True
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Slots ``[B, window]`` and ``{"mask", "burn_in_mask", "weight"}``."""
        self._sync(ring)
        n = len(self._starts)
        if n == 0:
            raise EmptyBufferError(
                f"sample: no complete window of {self.window} steps (burn_in={self.burn_in} + "
                f"length={self.length}) yet; in strict mode episodes shorter than that never give one"
            )
        info: dict[str, torch.Tensor] = {}
        if self._tree is None:
            if not replace and batch_size > n:
                raise CapacityError(f"sample: {batch_size} distinct windows asked for, only {n} are complete")
            pick = (
                torch.randint(0, n, (batch_size,), generator=generator)
                if replace
                else torch.randperm(n, generator=generator)[:batch_size]
            )
            start = self._starts.items[pick.numpy()]
        else:
            if not replace:
                raise CapacityError("sample: replace=False is not supported with prioritized windows")
            fractions = torch.rand(batch_size, generator=generator, dtype=torch.float64).numpy()
            start, total = find_prefix_sum(self._tree, fractions)
            prob = self._tree[0][start] / total
            w = (n * prob) ** -self.beta
            info["weight"] = torch.from_numpy((w / w.max()).astype(np.float32)).unsqueeze(1)
        slots, real = self._window_slots(ring, start)
        cols = np.arange(self.window) >= self.burn_in
        info["mask"] = torch.from_numpy(real & cols)
        if self.burn_in:
            info["burn_in_mask"] = torch.from_numpy(real & ~cols)
        if "weight" in info:
            info["weight"] = info["weight"].expand(batch_size, self.window).contiguous()
        return torch.from_numpy(slots), info

    def _window_slots(self, ring: Ring, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = self._capacity
        span = self._span[start]
        steps = np.minimum(np.arange(self.window), span[:, None] - 1)  # padding repeats the last
        eps = self._index(ring)
        step = eps.lockstep
        if step is not None:
            slots = (start[:, None] + steps * step) % c
        else:
            nxt = eps.links().next
            slots = np.empty((start.shape[0], self.window), dtype=np.int64)
            slots[:, 0] = start
            for j in range(1, self.window):
                more = j < span
                slots[:, j] = np.where(more, nxt[slots[:, j - 1]] % c, slots[:, j - 1])
        return slots, np.arange(self.window) < span[:, None]

    # -- priorities ------------------------------------------------------------
    def update_priorities(self, index: Any, errors: Any, mask: Any = None) -> int:
        """Set each window's priority from its per-step TD errors (R2D2's eta mix).

        Args:
            index: the batch's ``"index"`` ``[B, window]``; the window is named by its
                first id.
            errors: TD errors ``[B, window]`` (their absolute value is used).
            mask: which steps count (default all); pass the batch's ``"mask"``.

        Returns:
            How many windows were updated: a window whose start has been overwritten
            since it was sampled is skipped (its slot holds a newer item).
        """
        if not self.prioritized or self._tree is None or self._ring is None:
            raise SpecError("update_priorities: this SequenceSampler is not prioritized (prioritized=True)")
        ids = np.asarray(torch.as_tensor(index).cpu(), dtype=np.int64)
        err = np.abs(np.asarray(torch.as_tensor(errors, dtype=torch.float64).cpu()))
        keep = np.ones(err.shape, dtype=bool) if mask is None else np.asarray(torch.as_tensor(mask).cpu())
        if ids.ndim != 2 or err.shape != ids.shape or keep.shape != ids.shape:
            raise SpecError(
                f"update_priorities: expected index, errors and mask of one shape [B, {self.window}], "
                f"got {tuple(ids.shape)}, {tuple(err.shape)} and {tuple(keep.shape)}"
            )
        start = ids[:, 0]
        prio = window_priority(err, keep, self.eta) + self.eps
        slot = start % self._capacity
        live = (start >= self._ring.first_id) & (start < self._ring.next_id) & (self._tree[0][slot] > 0)
        slot, prio = slot[live], prio[live]
        _, last = np.unique(slot[::-1], return_index=True)  # a repeated window keeps its last row
        pick = slot.shape[0] - 1 - last
        if pick.shape[0]:
            set_leaves(self._tree, slot[pick], prio[pick] ** self.alpha, np.add)
            self._max_priority = max(self._max_priority, float(prio.max()))
        return int(pick.shape[0])

    # -- state -----------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The constructor arguments, JSON-able: ``SequenceSampler(**s.config())``."""
        return {
            "length": self.length,
            "burn_in": self.burn_in,
            "stride": self.stride,
            "mode": self.mode,
            "prioritized": self.prioritized,
            "alpha": self.alpha,
            "beta": self.beta,
            "eta": self.eta,
            "eps": self.eps,
        }

    def state_dict(self) -> dict[str, Any]:
        if self._ring is None:
            return {"window": self.window}
        starts = self._starts.members().copy()
        return {
            "window": self.window,
            "synced": self._synced,
            "starts": starts,
            "spans": self._span[starts].copy(),
            "weights": self._tree[0][starts].copy() if self._tree is not None else np.zeros(0),
            "max_priority": self._max_priority,
            "streams": self._streams.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["window"]) != self.window:
            raise SpecError(f"sampler state: window of {state['window']} steps, this sampler {self.window}")
        self._ring = None  # rebinds (and applies the state) at the next sync
        if "starts" in state:
            self._pending_state = state  # applied once the ring is known (first sync)

    def bind(self, ring: Ring) -> None:
        """Attach to ``ring`` and apply a loaded state (called by the first sync)."""
        state = getattr(self, "_pending_state", None)
        self._setup(ring)
        if state is None:
            return
        del self._pending_state
        starts = np.asarray(state["starts"], dtype=np.int64)
        self._synced = int(state["synced"])
        self._span[starts] = np.asarray(state["spans"], dtype=np.int64)
        self._starts.add(starts)
        if self._tree is not None:
            set_leaves(self._tree, starts, np.asarray(state["weights"], dtype=np.float64), np.add)
        self._max_priority = float(state["max_priority"])
        self._streams.load_state_dict(state["streams"])

    def __repr__(self) -> str:
        return (
            f"SequenceSampler(length={self.length}, burn_in={self.burn_in}, stride={self.stride}, "
            f"mode={self.mode!r}, prioritized={self.prioritized})"
        )
