"""The adapter's sample without a TensorDict: SB3's tensors read straight from the records.

In SB3's training loop each ``sample`` runs between network updates, with the caches
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
path raises what it raises). ``tests/test_sb3_fast.py`` compares it with the general
path on the same streams.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.replay.fast_read import draw_records

__all__ = ["RecordsView", "sample"]

_KEYS = ("obs", "action", ("next", "obs"), "reward", "terminated", "truncated")


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
            return buffer.samples_of(_general_batch(xp, rows, reader))
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


def _general_batch(xp: Any, rows: np.ndarray, reader: Any) -> Any:
    """The xpbank batch of the drawn ``rows``, as ``xp.sample`` reads it."""
    from xpbank.replay.fast_read import ids_of_rows
    from xpbank.spec.batch import to_tensordict

    flat = reader.read(rows)
    flat["index"] = torch.from_numpy(ids_of_rows(xp._ring, rows))
    return to_tensordict(flat, torch.Size((rows.shape[0],)), xp._device)
