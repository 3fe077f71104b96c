"""N-step targets for sampled items, read through the episode index: ``NStep(n, gamma)``.

Give it to the buffer, ``ReplayBuffer(..., nstep=NStep(3, 0.99))``, and every
:meth:`~xpbank.ReplayBuffer.sample` (uniform or prioritized: the sampler still picks
items ``t``, and priorities stay per item) also returns, for each item ``t``:

- ``"nstep_return"``: ``sum_{j<k} gamma**j * r_{t+j}`` (float32);
- ``"nstep_discount"``: ``gamma**k``, or 0 when step ``t+k-1`` terminated (float32);
- ``"nstep_steps"``: ``k`` (int64) and ``"nstep_terminated"`` (bool);
- the next-step fields (the observation after step ``t+k-1``, its ``terminated`` ...)
  taken from item ``t+k-1`` instead of ``t``: with TorchRL keys every ``("next", ...)``
  field but the reward; with flat keys every ``next_*`` field and ``terminated``,
  ``truncated``, ``done``.

The window holds ``t`` and the items after it in the same env (from the buffer's
:class:`~xpbank.EpisodeIndex`), at most ``n``: it stops after the item that ends the
episode (terminated or truncated; a truncated item's next observation is the true final
one, so the bootstrap stays) and at the newest item written, so the newest items get a
shorter window and bootstrap from the newest step's next observation. No slot of an item
newer than the window is ever read.

With numba (``xpbank[fast]``), a lockstep buffer (``num_envs=``) also keeps the results
of complete windows (:class:`~xpbank.nstep.table.WindowTable`), so most sampled items
read one small cell instead of their window. Rewrite rewards through
:meth:`ReplayBuffer.update <xpbank.ReplayBuffer.update>` (which drops the results that
read them), not by writing into the storage's views. The windows follow the episode
index, built from each item's env and ``terminated`` / ``truncated`` when it is
written: an ``update()`` that would change one of those is refused
(:mod:`xpbank.ring.episode_update`); write the right flags when extending, or end the
open episodes with :meth:`EpisodeIndex.truncate_newest <xpbank.EpisodeIndex.truncate_newest>`.

The NumPy path (the reference) precomputes nothing: the window's slots
(:meth:`EpisodeIndex.walk_slots <xpbank.EpisodeIndex.walk_slots>`), one storage read of
the items' rows with their windows' last rows (``gather_pairs`` where the storage has
it, else one ``gather`` of ``2B`` slots), one fancy index of the ``[n, B]`` rewards in
the reward field's ``host_view`` (else a ``gather``), and
:func:`~xpbank.nstep.returns.nstep_sum`; so an ``update()`` of a reward or next field
shows in the next sample. The compiled path keeps its arguments (fixed arrays and views)
in one cache entry per storage, spec, index and keys, valid while
:func:`xpbank.nstep.kernel.kernel` returns the kernel it was made with: switching
``xpbank.nstep.kernel._compiled`` in a test or benchmark takes effect at once.

Example:
    >>> import torch
    >>> from xpbank import NStep, ReplayBuffer
    >>> rb = ReplayBuffer(100, num_envs=1, nstep=NStep(3, 0.5), seed=0)
    >>> rb.extend({"obs": torch.arange(4.0), "next_obs": torch.arange(1.0, 5.0),
    ...            "reward": torch.ones(4), "terminated": torch.tensor([0, 0, 0, 1])})
    range(0, 4)
    >>> batch = rb.sample(64)
    >>> sorted(set(zip(batch["index"].tolist(), batch["nstep_return"].tolist(),
    ...                batch["next_obs"].tolist(), batch["nstep_discount"].tolist())))
    [(0, 1.75, 3.0, 0.125), (1, 1.75, 4.0, 0.0), (2, 1.5, 4.0, 0.0), (3, 1.0, 4.0, 0.0)]
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from xpbank.errors import SpecError, check_positive_int
from xpbank.nstep import kernel as nstep_kernel
from xpbank.nstep.kernel import kernel_plan, nstep_rows, nstep_window
from xpbank.nstep.returns import nstep_sum
from xpbank.nstep.table import MAX_TABLE_N, NO_TABLE, WindowTable
from xpbank.ring.episodes import EpisodeIndex
from xpbank.ring.ids import Ring
from xpbank.spec.spec import NestedKey, Spec, is_next_key, key_str, normalize_key
from xpbank.storage.base import Storage
from xpbank.storage.dtypes import numpy_native

__all__ = ["NStep"]

_REWARD = (("next", "reward"), "reward")
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class NStep:
    """N-step returns for every sampled item (a buffer option).

    Args:
        n: the most steps in a window (1: one-step targets in the same layout).
        gamma: the discount per step, in ``[0, 1]``.
        reward_key: the reward field; default ``("next", "reward")`` or ``"reward"``.
        next_keys: the fields taken from the window's last item; default as described
            in the module docstring.

    A window's ends are the episode index's, read when items are written: the buffer's
    ``update`` refuses to change an item's env or episode-end flag (it may rewrite the
    reward, which drops the results that read it, and any other field).
    """

    n: int
    gamma: float
    reward_key: Any = None
    next_keys: Any = None
    _cache: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)
    _powers: np.ndarray = field(init=False, repr=False, compare=False)  # gamma ** arange(n + 1)
    # _fused's last answer: [(storage, spec, episode index, keys, answer)]
    _fused_cache: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive_int("n", self.n)
        if isinstance(self.reward_key, list):  # from config(): JSON has no tuples
            object.__setattr__(self, "reward_key", tuple(self.reward_key))
        if self.next_keys is not None:
            nexts = tuple(tuple(k) if isinstance(k, list) else k for k in self.next_keys)
            object.__setattr__(self, "next_keys", nexts)
        if isinstance(self.gamma, bool) or not (
            isinstance(self.gamma, (int, float)) and 0 <= self.gamma <= 1
        ):
            raise SpecError(f"gamma: expected a number in [0, 1], got {self.gamma!r}")  # NaN fails too
        object.__setattr__(self, "_powers", float(self.gamma) ** np.arange(self.n + 1, dtype=np.float64))

    def __getstate__(self) -> dict[str, Any]:
        # the caches hold the storage's arrays: a pickled option starts without them
        return {**self.__dict__, "_cache": [], "_fused_cache": []}

    def config(self) -> dict[str, Any]:
        """The constructor arguments, JSON-able (nested keys as lists, which the
        constructor turns back into tuples): ``NStep(**option.config()) == option``."""

        def plain(key: Any) -> Any:
            return list(key) if isinstance(key, tuple) else key

        nexts = None if self.next_keys is None else [plain(k) for k in self.next_keys]
        return {
            "n": self.n,
            "gamma": float(self.gamma),
            "reward_key": plain(self.reward_key),
            "next_keys": nexts,
        }

    def keys(self, spec: Spec) -> tuple[NestedKey, list[NestedKey]]:
        """``(reward_key, next_keys)`` for ``spec``.

        Raises:
            SpecError: no reward field, or a named field that is not in the spec.
        """
        if self._cache and self._cache[0] is spec:
            return self._cache[1]
        names = [key_str(k) for k in spec]
        if self.reward_key is not None:
            reward = normalize_key(self.reward_key)
        else:
            found = [k for k in _REWARD if k in spec]
            if not found:
                raise SpecError(
                    f"nstep: no reward field ('next.reward' or 'reward') in the spec; known: {names}"
                )
            reward = found[0]
        if self.next_keys is not None:
            nexts = [normalize_key(k) for k in self.next_keys]
        else:
            nexts = [k for k in spec if k != reward and is_next_key(k)]
        for key in [reward, *nexts]:
            if key not in spec:
                raise SpecError(f"nstep: field {key_str(key)!r} is not in the spec; known: {names}")
        if spec[reward].numel != 1:
            raise SpecError(
                f"nstep: field {key_str(reward)!r} (reward): expected one number per item, got {spec[reward]}"
            )
        self._cache[:] = [spec, (reward, nexts)]
        return reward, nexts

    def gather(
        self,
        storage: Storage,
        ring: Ring,
        slots: torch.Tensor,
        ids: torch.Tensor,
        keys: list[NestedKey] | None,
    ) -> dict[NestedKey, torch.Tensor]:
        """The fields ``keys`` (default all) of live items ``ids`` (in ``slots``) with their
        n-step entries merged in: the next fields from each window's last item.

        The window is :meth:`EpisodeIndex.walk_slots <xpbank.EpisodeIndex.walk_slots>`
        (computed in lockstep mode); one storage read gives the items' rows with their windows' last
        rows (``2B`` slots, ``gather_pairs`` where the storage has it), one more the
        rewards of the whole ``[n, B]`` window (from the storage's ``host_view`` of the
        reward field where it has one); the reduction is a few NumPy calls over ``[n, B]``.
        With numba (``xpbank[fast]``) and a float32/float64 host view of the reward, the
        window and its reduction are one compiled call instead
        (:mod:`xpbank.nstep.kernel`, same results), then the same row read; where the
        storage also has ``pair_rows`` (``TensorStorage`` on the CPU, packed) that one
        call reads the rows too (:func:`~xpbank.nstep.kernel.nstep_gather`): each item's
        fields from its row and the next fields from its window's last row, no other
        bytes of either, with the loads of items a few places ahead prefetched. In
        lockstep mode both compiled calls read complete windows from the buffer's
        :class:`~xpbank.nstep.table.WindowTable` (:meth:`_table`).
        """
        episodes = ring.episodes
        spec = storage.spec
        if episodes is None or spec is None:
            raise RuntimeError("NStep.gather needs the buffer's episode index")
        kernel = nstep_kernel.kernel()  # looked up each call: a test may switch it
        found = self._fused_cache[0] if self._fused_cache else None  # one read: thread-safe
        if not (
            found
            and found[0] is storage
            and found[1] is spec
            and found[2] is episodes
            and found[3] == keys
            and found[5] is kernel
        ):
            found = self._fused(storage, spec, episodes, keys)
        if found[4] is not None:  # numba: window, return, discount and the rows in one call
            rows_of, args = found[4]
            rows = rows_of.empty(ids.shape[0])
            # the tensors first (Python work while its code and data are in cache), then
            # the compiled pass that fills them (and evicts much of the cache); the call
            # is nstep_kernel.nstep_gather's, its arguments made once by _fused
            out = rows_of.read(rows)
            found[5](_numpy(ids), ring.next_id, ring.next_id - ring.size, *args, rows)  # the kernel
            return out
        reward_key, next_keys = self.keys(spec)
        wanted = list(spec) if keys is None else keys
        n = self.n
        fast = _kernel_inputs(storage, spec, reward_key, episodes)
        if fast is not None:  # numba: window, return and discount in one compiled call
            lockstep, capacity, nxt, flags, rewards = fast
            pair, steps, ret, disc, terminated = nstep_window(
                _numpy(ids), lockstep, capacity, ring.next_id, nxt, flags, rewards, self._powers,
                self._table(spec, episodes, capacity), ring.first_id,
            )  # fmt: skip
            if n == 1:
                out = storage.gather(torch.from_numpy(pair[: pair.shape[0] // 2]), wanted)
            else:
                out = _gather_pairs(storage, pair, wanted, next_keys)
            return _merge(out, ret, disc, steps, terminated, storage.device)
        window, steps = episodes.walk_slots(_numpy(ids), n)  # [n, B] slots, step-major
        # the small NumPy work first, while its code and data are still in cache ...
        terminated = episodes.terminated_of_slots(window[-1])
        rewards = _window_rewards(storage, spec, reward_key, window)
        past = window[1:] == window[:-1]  # a window stays on its last slot past its end
        ret, disc = nstep_sum(rewards, past, steps, terminated, self._powers)
        # ... then the rows: the items', and their windows' last items' (n = 1: the same)
        if n == 1:
            out = storage.gather(torch.from_numpy(window[0]), wanted)
        else:
            out = _gather_pairs(storage, window[:: n - 1].reshape(-1), wanted, next_keys)
        return _merge(out, ret, disc, steps, terminated, storage.device)

    def _table(self, spec: Spec, episodes: EpisodeIndex, capacity: int) -> WindowTable | None:
        """The buffer's :class:`~xpbank.nstep.table.WindowTable` (lockstep mode; else
        ``None``), made on first use and kept in ``episodes.derived``."""
        lockstep = episodes.lockstep
        if lockstep is None or self.n > MAX_TABLE_N:
            return None
        key = ("nstep", self.n, float(self.gamma), self.keys(spec)[0])
        table = episodes.derived.get(key)
        if table is None:
            table = episodes.derived[key] = WindowTable(capacity, self.n, lockstep)
        return table

    def rewritten(self, spec: Spec, ring: Ring, slots: torch.Tensor, keys: Collection[NestedKey]) -> None:
        """:meth:`ReplayBuffer.update <xpbank.ReplayBuffer.update>` wrote fields ``keys``
        of the live items in ``slots``: where the reward is one of them, the windows that
        hold those items are walked again when sampled (their kept results are dropped)."""
        episodes = ring.episodes
        if episodes is None or not episodes.derived or self.keys(spec)[0] not in keys:
            return
        ids = _numpy(ring.ids_of_slots(slots))
        for table in episodes.derived.values():
            if isinstance(table, WindowTable):
                table.forget(ids, ring.first_id)

    def _fused(
        self,
        storage: Storage,
        spec: Spec,
        episodes: EpisodeIndex,
        keys: list[NestedKey] | None,
    ) -> tuple[Any, ...]:
        """The fused path's cache entry for a storage, spec, index and fields: ``(storage,
        spec, episodes, keys, fused, kernel)``: ``kernel`` the compiled kernel of
        :func:`~xpbank.nstep.kernel.nstep_gather` it was made with; ``fused`` its output
        rows (the storage's ``pair_rows`` with the n-step values,
        :func:`~xpbank.nstep.kernel.nstep_rows`) and its arguments between ``first_id``
        and the rows (lockstep, capacity, links, flags, rewards, powers, the window
        table, rows and plan), or ``None``: no numba, no float32/float64 host view of the reward, or a storage
        without ``pair_rows`` (or whose ``pair_rows`` is ``None``: CUDA, unpacked). Made
        once per entry (all fixed arrays and views: the index, the table and the storage
        write into them in place) and kept as the one entry of ``_fused_cache``."""
        kernel = nstep_kernel.kernel()
        reward_key, next_keys = self.keys(spec)
        wanted = list(spec) if keys is None else keys
        inputs = None if kernel is None else _kernel_inputs(storage, spec, reward_key, episodes)
        pair_rows = getattr(storage, "pair_rows", None)
        pairs = pair_rows(wanted, next_keys) if inputs is not None and pair_rows is not None else None
        fused = None
        if pairs is not None and inputs is not None:
            rows = nstep_rows(pairs)
            runs, mixed, offsets = kernel_plan(rows)
            table = self._table(spec, episodes, inputs[1]) or NO_TABLE
            args = (*inputs, self._powers, table.cells, table.state, rows.words, runs, mixed, offsets)
            fused = (rows, args)
        entry = (storage, spec, episodes, None if keys is None else list(keys), fused, kernel)
        self._fused_cache[:] = [entry]
        return entry


def _merge(
    out: dict[NestedKey, torch.Tensor],
    ret: np.ndarray,
    disc: np.ndarray,
    steps: np.ndarray,
    terminated: np.ndarray,
    device: torch.device,
) -> dict[NestedKey, torch.Tensor]:
    """``out`` with the n-step entries added: tensors sharing the arrays' memory, or
    copies on the device of the rows (a CUDA storage: computed on the host, delivered
    beside the fields they go with)."""
    entries = {
        "nstep_return": torch.from_numpy(ret),
        "nstep_discount": torch.from_numpy(disc),
        "nstep_steps": torch.from_numpy(steps),
        "nstep_terminated": torch.from_numpy(terminated),
    }
    if device.type != "cpu":
        entries = {key: value.to(device) for key, value in entries.items()}
    out.update(entries)
    return out


def _kernel_inputs(
    storage: Storage, spec: Spec, key: NestedKey, episodes: EpisodeIndex
) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray] | None:
    """The compiled kernel's per-buffer arguments ``(lockstep, capacity, next, flags,
    rewards)`` (``flags`` as :func:`~xpbank.nstep.kernel.flags_view`), or ``None`` (take
    the NumPy path): no numba (or ``XPBANK_NO_NUMBA=1``), or no float32/float64 host view
    of the reward field."""
    if nstep_kernel.kernel() is None:
        return None
    host_view = getattr(storage, "host_view", None)
    host = host_view(key) if host_view is not None else None
    if host is None or host.dtype not in _KERNEL_DTYPES:
        return None
    links = episodes.links()
    rewards = host.reshape(host.shape[0])  # one number per item (keys() checks): a view
    flags = nstep_kernel.flags_view(links.flags)
    return episodes.lockstep or 0, links.next.shape[0], links.next, flags, rewards


def _gather_pairs(
    storage: Storage, both: np.ndarray, keys: list[NestedKey], second: list[NestedKey]
) -> dict[NestedKey, torch.Tensor]:
    """Fields ``keys`` of the items in the first half of ``both``, those in ``second``
    from the items in its second half: the storage's ``gather_pairs`` where it has one,
    else one :meth:`~xpbank.storage.base.Storage.gather` of all of ``both``, split."""
    pairs = getattr(storage, "gather_pairs", None)
    if pairs is not None:
        return pairs(both, keys, second)
    b = both.shape[0] // 2
    rows = storage.gather(torch.from_numpy(both), keys)
    return {k: v[b:] if k in second else v[:b] for k, v in rows.items()}


def _window_rewards(storage: Storage, spec: Spec, key: NestedKey, window: np.ndarray) -> np.ndarray:
    """The rewards of the window's slots ``[n, B]`` (a fresh NumPy array): one fancy index of the
    storage's ``host_view`` of the field where it has one NumPy holds as itself, else a
    storage gather."""
    host_view = getattr(storage, "host_view", None)
    host = host_view(key) if host_view is not None and numpy_native(spec[key].dtype) else None
    if host is not None:
        return host[window].reshape(window.shape)
    rewards = storage.gather(torch.from_numpy(window.reshape(-1)), [key])[key]
    return _numpy(rewards).reshape(window.shape).copy()  # ours to zero past the windows


def _numpy(values: torch.Tensor) -> np.ndarray:
    """A CPU tensor (ids, a gathered field) as NumPy (bfloat16, which NumPy lacks, as float32)."""
    try:
        return values.numpy()  # a CPU field of a gathered batch: a view (the common case)
    except (RuntimeError, TypeError):  # on a device, or bfloat16 (which NumPy lacks)
        return values.detach().float().cpu().numpy()
