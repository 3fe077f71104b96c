"""The adapter's sample and add the short way: SB3's tensors read straight from the
records, SB3's arrays handed to the write fast path without conversions.

In SB3's training loop each buffer call runs between network updates, with the caches
cold, so its cost is mostly how much code and how many objects it goes through, not
the bytes it copies. The general way to answer SB3's ``sample`` (an xpbank batch, then
its fields split into SB3's ``ReplayBufferSamples``) builds a nested TensorDict of six
fields and the ids only to pull five of them out again, reshape the reward, cast the
flags and move each tensor to the device it is already on.

:func:`sample` goes the short way where it gives the same samples: the buffer's own
uniform draw (:func:`xpbank.replay.fast_read.draw_records`: the same slots from the same
generator as ``buffer.xp.sample``), one ``take`` of the whole records from a view of the
storage's rows whose record dtype gives SB3's shapes directly (the reward and the
episode flags as ``(1,)`` fields, so the taken rewards are ``(B, 1)`` already), a
``torch.from_numpy`` view per field, and the ``dones`` cast to float32 by one NumPy
call. It declines (``None``, nothing drawn) wherever anything differs from that case:
another sampler, n-step, a ``VecNormalize`` env, a device other than the CPU, a storage
without one packed CPU block (``FrameStorage``, CUDA), a bad ``batch_size`` (the general
path raises what it raises).

:func:`add` takes a vector step as SB3 passes it (NumPy arrays of the stored dtypes in
SB3's shapes): type, dtype and shape compared once each, the episode flags split from
``infos``, and the dict the checked add would build handed to the xpbank buffer's write
fast path (:func:`xpbank.replay.fast_write.try_write`, which checks what it checks);
anything else goes to the checked add (``XpbankReplayBuffer._add_checked``).

In SAC's ``learn()`` (Pendulum, one add and one ``sample(256)`` a step) the two cut the
adapter's buffer time from ~1.0-1.25x SB3's to ~0.7-0.8x, in DQN's from ~1.03x to ~0.6x
(``benchmarks/ab_sb3_loop.py``); the add alone still costs ~2x SB3's there.
``tests/test_sb3_fast.py`` compares both with the general path on the same streams.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.replay.fast_read import draw_records, try_read
from xpbank.replay.fast_write import try_write

__all__ = ["RecordsView", "add", "sample"]

_KEYS = ("obs", "action", ("next", "obs"), "reward", "terminated", "truncated")
_NEXT_OBS = ("next", "obs")
_ARRAY, _BOOL, _FLOAT32 = np.ndarray, np.dtype(bool), np.dtype(np.float32)


class RecordsView:
    """The storage's records (``reader.records``) seen through a record dtype of SB3's
    shapes: ``obs``, ``action``, ``next_obs`` as stored, ``reward``, ``terminated`` and
    ``truncated`` as ``(1,)`` fields (same bytes, same offsets, same row size).
    ``records`` is ``None`` where a field is not held as NumPy's own dtype."""

    def __init__(self, reader: Any):
        self.reader = reader
        self.records: np.ndarray | None = None
        name_of = {key: (name, bits) for key, name, bits in reader.fields}
        if any(key not in name_of or name_of[key][1] is not None for key in _KEYS):
            return
        layout = reader.records.dtype
        names, formats, offsets = [], [], []
        for i, key in enumerate(_KEYS):
            stored, offset = layout.fields[name_of[key][0]][:2]
            names.append(f"f{i}")
            formats.append(stored if i < 3 else np.dtype((stored, (1,))))
            offsets.append(offset)
        view = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": layout.itemsize})
        self.records = reader.records.view(view)

    def __reduce__(self) -> tuple[Any, ...]:
        # a view of the storage's rows: pickled (SB3's save_replay_buffer), it would copy
        # them all; it unpickles as None and is made anew on the next sample
        return (_nothing, ())


def _nothing() -> None:
    return None


def sample(buffer: Any, batch_size: Any, samples: Any) -> Any:
    """``buffer.sample(batch_size)`` as ``samples`` (SB3's ``ReplayBufferSamples``), read
    the short way, or ``None`` with nothing drawn where it does not apply (see the
    module's docstring). The caller has checked that ``buffer.device`` is the CPU and
    no ``env`` normalizes."""
    xp = buffer.xp
    with xp._lock:  # the draw and the read are one step, as in xp.sample
        drawn = draw_records(xp, batch_size)
        if drawn is None:
            return None
        rows, reader = drawn
        view = buffer.__dict__.get("_records_view")
        if view is None or view.reader is not reader:
            view = buffer._records_view = RecordsView(reader)
        if view.records is None:  # never with SB3's spaces: the general batch of the same draw
            return buffer.samples_of(try_read(xp, torch.from_numpy(rows), {}))
        rec = view.records.take(rows)
    if buffer.handle_timeout_termination:
        dones = rec["f4"].astype(np.float32)
    else:
        dones = np.maximum(rec["f4"], rec["f5"], dtype=np.float32)
    from_numpy = torch.from_numpy
    return samples(
        from_numpy(rec["f0"]), from_numpy(rec["f1"]), from_numpy(rec["f2"]), from_numpy(dones),
        from_numpy(rec["f3"]),
    )  # fmt: skip


def add(buffer: Any, obs: Any, next_obs: Any, action: Any, reward: Any, done: Any, infos: Any) -> bool:
    """``buffer.add(...)`` of a vector step that SB3 gives as it usually does: NumPy
    arrays, ``obs`` and ``next_obs`` shaped ``(n_envs, *obs_shape)``, ``reward`` float32
    and ``done`` bool shaped ``(n_envs,)``, ``action`` of ``n_envs * action_dim``
    values. Stored as the checked add stores it (the same dict of arrays, given to the
    xpbank buffer's write fast path, or to ``extend`` where that declines), with fewer
    calls and conversions around it. Returns ``False`` with nothing written for any
    other input (the checked add takes it and raises what it raises) and with
    ``optimize_memory_usage`` (its frame store keeps its own add). Raises the checked
    add's :class:`~xpbank.SpecError` for ``infos`` that are not one dict per env."""
    shapes = buffer.__dict__.get("_add_shapes")
    if shapes is None:
        if buffer.optimize_memory_usage:
            return False
        shapes = buffer._add_shapes = ((buffer.n_envs, *buffer.obs_shape), (buffer.n_envs,))
    if (
        type(obs) is not _ARRAY
        or type(next_obs) is not _ARRAY
        or type(action) is not _ARRAY
        or type(reward) is not _ARRAY
        or type(done) is not _ARRAY
        or reward.dtype is not _FLOAT32
        or done.dtype is not _BOOL
        or obs.shape != shapes[0]
        or next_obs.shape != shapes[0]
        or reward.shape != shapes[1]
        or done.shape != shapes[1]
    ):
        return False
    if action.shape != buffer._action_shape:
        if action.size != buffer.n_envs * buffer.action_dim:
            return False
        action = action.reshape(buffer._action_shape)
    term, trunc = buffer._step_flags(infos, done)
    batch = {
        "obs": obs,
        "action": action,
        "reward": reward,
        "terminated": term,
        "truncated": trunc,
        _NEXT_OBS: next_obs,
    }
    xp = buffer.xp
    with xp._lock:  # the write and the cursor's id, one step
        first = try_write(xp, batch, False)
        buffer._next_id = xp.extend(batch).stop if first is None else first + buffer.n_envs
    return True
