"""SB3's array attributes of an :class:`~xpbank.integrations.sb3.XpbankReplayBuffer`.

SB3's ``ReplayBuffer`` keeps ``observations``, ``next_observations``, ``actions``,
``rewards``, ``dones`` and ``timeouts`` as NumPy arrays of shape ``(buffer_size, n_envs,
...)``; user code reads them (``model.replay_buffer.rewards``) and a few algorithms
write them. The adapter stores row ``r`` of those arrays as slots ``r * n_envs ... +
n_envs - 1`` of its xpbank buffer, so each field's slots, split as ``(buffer_size,
n_envs)``, are SB3's array:

- with the default memory storage (and ``storage="memmap"``) ``observations``,
  ``next_observations``, ``actions`` and ``rewards`` are **views** of the stored bytes
  (:func:`field_view`; NumPy arrays, strided when the storage packs fields in rows):
  reading costs nothing and writing into them writes the buffer, without xpbank's
  checks (n-step results cached for the rewritten rewards are not dropped: rewrite
  rewards through ``buffer.xp.update`` with n-step);
- with ``optimize_memory_usage=True`` (a :class:`~xpbank.FrameStorage`, each observation
  stored once) there is no array to view: ``observations`` and ``next_observations``
  are fresh **copies** gathered on each access (:func:`field_copy`; ``next_observations``
  holds each step's true next observation, where SB3's own is ``None`` then), and
  writing into them changes nothing stored;
- ``dones`` (``terminated or truncated``) and ``timeouts`` (``truncated``; zeros with
  ``handle_timeout_termination=False``, which SB3 does not record) are float32 copies
  computed from the stored episode-end flags: xpbank stores the two flags, SB3 stores
  ``done`` and ``timeout``. ``dones`` is a :class:`Dones`, which reads like an array
  (``dones[:50]``, ``np.asarray(dones)``, ``dones.sum()``) and accepts the one write
  SB3 makes, ``dones[pos - 1] = True``.

Rows not written yet hold unspecified values in the views (SB3's hold zeros) and zeros
in the copies, as in SB3 only rows ``[0, size())`` (all rows once ``full``) are data.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np
import torch

from xpbank.errors import SpecError
from xpbank.replay.buffer import ReplayBuffer
from xpbank.ring.episodes import EpisodeIndex
from xpbank.spec.spec import NestedKey

__all__ = ["Dones", "SB3Layout", "field_copy", "field_view", "sb3_array"]


class SB3Layout(Protocol):
    """What these functions read of an :class:`~xpbank.integrations.sb3.XpbankReplayBuffer`
    (typed by this protocol so that this module need not import the buffer's)."""

    xp: ReplayBuffer
    buffer_size: int
    n_envs: int
    handle_timeout_termination: bool

    @property
    def pos(self) -> int: ...

    @property
    def next_id(self) -> int: ...

    @property
    def full(self) -> bool: ...

    def size(self) -> int: ...


_log = logging.getLogger(__name__)


def field_view(buffer: SB3Layout, key: NestedKey) -> np.ndarray | None:
    """Field ``key`` of every slot as a ``(buffer_size, n_envs, *shape)`` NumPy view, or
    ``None`` where the storage has no host view of it (``FrameStorage``, CUDA)."""
    host = getattr(buffer.xp.storage, "host_view", None)
    arr = host(key) if host is not None else None
    if arr is None:
        return None
    out = arr.view()
    out.shape = (buffer.buffer_size, buffer.n_envs, *arr.shape[1:])  # raises rather than copy
    return out


def field_copy(buffer: SB3Layout, key: NestedKey) -> np.ndarray:
    """Field ``key`` as a fresh ``(buffer_size, n_envs, *shape)`` array: the stored rows
    gathered from the buffer, zeros elsewhere."""
    spec = buffer.xp.spec
    if spec is None:  # never: the adapter builds its buffer with a spec
        raise RuntimeError("XpbankReplayBuffer: its xpbank buffer has no spec")
    field = spec[key]
    out = torch.zeros((buffer.buffer_size * buffer.n_envs, *field.shape), dtype=field.dtype)
    if len(buffer.xp):
        batch = buffer.xp.sample_all(fields=[key])
        out[batch["index"] % buffer.xp.capacity] = batch[key]
    return out.numpy().reshape(buffer.buffer_size, buffer.n_envs, *field.shape)


def sb3_array(buffer: SB3Layout, key: NestedKey) -> np.ndarray:
    """:func:`field_view` where the layout allows, else :func:`field_copy`."""
    view = field_view(buffer, key)
    return view if view is not None else field_copy(buffer, key)


def _flags(buffer: SB3Layout, key: str) -> np.ndarray:
    """A stored bool flag as ``(buffer_size, n_envs)``, zeros in rows not written yet."""
    flags = np.array(sb3_array(buffer, key), dtype=bool)  # a copy: rows are zeroed below
    if not buffer.full:
        flags[buffer.size() :] = False
    return flags


def timeouts(buffer: SB3Layout) -> np.ndarray:
    """SB3's ``timeouts``: ``truncated`` as float32 (zeros without ``handle_timeout_termination``)."""
    if not buffer.handle_timeout_termination:
        return np.zeros((buffer.buffer_size, buffer.n_envs), np.float32)
    return _flags(buffer, "truncated").astype(np.float32)


class Dones:
    """SB3's ``dones``: ``terminated or truncated`` of every row, float32, read like an
    array; the one write SB3 makes, ``dones[pos - 1] = True``, cuts each env's episode.

    With ``optimize_memory_usage``, SB3's ``learn(reset_num_timesteps=True)`` resets the
    envs and marks the newest row done, so the chain of observations may break there.
    Here that write ends each env's open episode at its newest step as a
    **truncation** (``truncated`` stored, the episode index told): the next ``add``'s
    reset observation starts a new episode, and the cut step keeps its true
    ``next_obs``, so with ``handle_timeout_termination=True`` it bootstraps (SB3's own
    buffer makes it a termination instead). SB3 warns "The last trajectory in the replay
    buffer will be truncated" before it writes: that is what happens, but the wrong
    target it warns of (a termination) does not, and its advice is not needed; the write
    logs (``logging``, INFO) what xpbank did. :class:`~xpbank.integrations.sb3.PrioritizedDQN`
    leaves the warning out; with SB3's own algorithms, silence it with
    ``warnings.filterwarnings("ignore", message="The last trajectory in the replay buffer")``.
    """

    def __init__(self, buffer: SB3Layout):
        self._buffer = buffer

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        b = self._buffer
        out = (_flags(b, "terminated") | _flags(b, "truncated")).astype(np.float32)
        return out if dtype is None else out.astype(dtype)

    @property
    def shape(self) -> tuple[int, int]:
        return (self._buffer.buffer_size, self._buffer.n_envs)

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(np.float32)

    def __len__(self) -> int:
        return self._buffer.buffer_size

    def __getitem__(self, index: Any) -> Any:
        return self.__array__()[index]

    def __getattr__(self, name: str) -> Any:  # sum, copy, any ...: the array's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.__array__(), name)

    def __repr__(self) -> str:
        return f"Dones({self.__array__()!r})"

    def _episodes(self) -> EpisodeIndex:
        eps = self._buffer.xp.episodes
        if eps is None:  # never: the buffer is built with num_envs
            raise RuntimeError("XpbankReplayBuffer: its xpbank buffer keeps no episode index")
        return eps

    def __setitem__(self, row: Any, value: Any) -> None:
        b = self._buffer
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < b.buffer_size:
            raise SpecError(
                f"dones: expected a row index in [0, {b.buffer_size}), got {row!r} (only the "
                f"newest row can be written: SB3's cut)"
            )
        if row >= b.size():
            raise SpecError(f"dones: row {row} holds no transition yet ({b.size()} rows stored)")
        if not bool(np.all(np.asarray(value))):
            raise SpecError(f"dones: only True can be written (an episode cut), got {value!r}")
        if int(row) != (b.pos - 1) % b.buffer_size:
            raise SpecError(
                f"dones: only the newest row ({(b.pos - 1) % b.buffer_size}) can be cut, got row {row}"
            )
        cut = self._episodes().truncate_newest()
        if cut.size:
            b.xp.update(torch.from_numpy(cut), {"truncated": torch.ones(cut.size, dtype=torch.bool)})
        _log.info(
            "XpbankReplayBuffer: SB3 cut the newest row (learn(reset_num_timesteps=True) resets the "
            "envs): the %d open episode(s) end there as truncations, which bootstrap from their true "
            "next observations (SB3's own buffer makes them terminations)",
            cut.size,
        )
