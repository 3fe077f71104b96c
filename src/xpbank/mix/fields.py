"""A :class:`~xpbank.Mixture` batch taken in place field by field: sources that store the
same fields in different storages (a packed buffer and a bank opened ``"r"``, whose
fields are memory-mapped files) each take their share's rows of every field straight
into the batch's per-field arrays.

A batch of ``B`` items is one ``np.empty`` of ``B`` rows per field and one of ``B`` ids,
then per share the draw (:func:`~xpbank.mix.inplace.draw_rows`: the same draws as the
source's ``sample``) and one NumPy ``take`` per field from the storage's view of that
field (``host_view``: a strided view of packed rows, or the memmap itself) into the
share's rows of the batch: every field is copied once, as by the sources' own samples,
with no ``torch.cat`` afterwards. It is taken where a source with a share is
memory-mapped (:class:`~xpbank.MemmapStorage`, what ``open_bank`` gives): in-memory
sources of one packed layout take whole records (:mod:`xpbank.mix.inplace`), and those
of other layouts, or sources that store different fields (or dtypes, or shapes), are
joined share by share (:mod:`xpbank.mix.assemble`).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from xpbank.mix.inplace import _IN_RANGE, Share, draw_rows, ids_into, put_weights
from xpbank.replay import ReplayBuffer, reading
from xpbank.storage.dtypes import as_torch
from xpbank.storage.memmap import MemmapStorage

__all__ = ["FieldLayout", "share_entries", "take_fields"]


class FieldLayout:
    """Each source's RecordReader where its fields are packed rows, else its NumPy view of
    every field (``None`` for sources without a share),
    the fields' order (the first such source's spec order, as its ``sample`` gives
    them), NumPy dtype, shape and torch dtype, whether every key is a string, and the
    device. Found once per state of the sources (:meth:`Layout.state_of
    <xpbank.mix.inplace.Layout.state_of>`)."""

    __slots__ = ("device", "fields", "flat", "state", "views")

    def __init__(self, state: tuple[Any, ...], views: tuple[Any, ...], fields: dict[Any, Any]):
        self.state, self.views, self.fields = state, views, fields
        self.flat = all(type(key) is str for key in fields)
        self.device = next(f[2] for f in state if f is not None)

    @classmethod
    def of(cls, sources: tuple[ReplayBuffer, ...], state: tuple[Any, ...]) -> FieldLayout | None:
        """The layout, or ``None``: no source with a share is memory-mapped, one samples
        its own way, is not on the CPU, or keeps a field without a contiguous NumPy view
        (and no packed block), or the sources' specs differ."""
        if not any(f is not None and isinstance(f[0], MemmapStorage) for f in state):
            return None
        views: list[dict[Any, np.ndarray] | None] = []
        readers: list[Any] = []
        spec = None
        for rb, found in zip(sources, state, strict=True):
            if found is None:
                views.append(None)
                readers.append(None)
                continue
            storage, _, device = found
            host = getattr(storage, "host_view", None)
            if type(rb).sample is not ReplayBuffer.sample or host is None or device.type != "cpu":
                return None
            if storage.device != device or rb.spec is None or (spec is not None and rb.spec != spec):
                return None
            if spec is None:
                spec = rb.spec
            arrays = {key: host(key) for key in spec}
            if any(a is None for a in arrays.values()):
                return None
            # a packed block: whole records taken, then split; other fields must be
            # contiguous (NumPy's take of a strided view copies the whole field first)
            reader = found[1]
            if reader is None and not all(a.flags.c_contiguous for a in arrays.values()):
                return None
            views.append(arrays)
            readers.append(reader)
        given = [v for v in views if v is not None]
        fields = {}
        for key in given[0]:
            first = given[0][key]
            if any(v[key].dtype != first.dtype or v[key].shape[1:] != first.shape[1:] for v in given):
                return None
            fields[key] = (first.dtype, first.shape[1:], spec[key].dtype)  # type: ignore[index]
            if as_torch(np.empty((0, *first.shape[1:]), first.dtype), fields[key][2]).dtype != fields[key][2]:
                return None
        # per source: its reader where it has one, else its fields' views
        chosen = tuple(r if r is not None else v for r, v in zip(readers, views, strict=True))
        return cls(state, chosen, fields)


def take_fields(
    s: int,
    rb: ReplayBuffer,
    k: int,
    replace: bool,
    views: Any,
    joint: tuple[dict[Any, np.ndarray], np.ndarray],
    lo: int,
    weights: list[np.ndarray | None],
) -> Share | None:
    """Source ``s``'s ``k`` items as ``rb.sample(k, replace)`` draws them (every field),
    each field's rows taken (from ``views``: ``{key: NumPy view}``, or the RecordReader of
    a packed block) into slice ``[lo, lo + k)`` of the batch's
    ``joint`` ``({key: rows}, ids)``, the weights, if any, into ``weights[0]``; returns
    ``None``, or the share read the source's own way (the batch is then joined share by
    share, :func:`share_entries` giving the shares taken here)."""
    hi = lo + k
    with rb.lock:
        rows, weight, own, drawn = draw_rows(s, rb, k, replace)
        if own is not None:
            return own
        outs, ids = joint
        if isinstance(views, dict):  # fields of their own (a memmap): one take each
            mode: Literal["clip", "raise"] = "clip" if type(rb._sampler) in _IN_RANGE else "raise"
            for key, view in views.items():
                view.take(rows, axis=0, out=outs[key][lo:hi], mode=mode)
        else:  # packed records: one take of whole rows, then each field into its place
            reader: Any = getattr(rb._storage, "host_reader", None)
            if reader is None or reader is not views:  # laid out anew since
                slots = torch.from_numpy(rows.copy())
                info = {} if weight is None else {"weight": torch.from_numpy(weight)}
                flat = reading.gather_flat(rb, slots, rb._ring.ids_of_slots(slots), None, info, None)
                return s, flat, (k,), None
            taken = reader.records.take(rows)
            for key, name, _ in reader.fields:
                outs[key][lo:hi] = taken[name]
        ids_into(rb, rows, drawn, ids[lo:hi])
    if weight is not None:
        put_weights(weights, weight, lo, ids.shape[0])
    return None


def share_entries(
    layout: FieldLayout,
    joint: tuple[dict[Any, np.ndarray], np.ndarray],
    weights: np.ndarray | None,
    lo: int,
    k: int,
) -> dict[Any, torch.Tensor]:
    """The entries of a share taken by :func:`take_fields` at ``[lo, lo + k)``, as the
    source's own read gives them (for a batch joined share by share)."""
    outs, ids = joint
    out = {key: as_torch(outs[key][lo : lo + k], f[2]) for key, f in layout.fields.items()}
    out["index"] = torch.from_numpy(ids[lo : lo + k])
    if weights is not None:
        out["weight"] = torch.from_numpy(weights[lo : lo + k])
    return out
