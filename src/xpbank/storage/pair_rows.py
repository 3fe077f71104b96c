"""Which bytes of a packed row come from an item, and which from its partner: a copy plan.

An n-step sample reads, for each item, its own fields from its row and the next fields
(``next_obs``, ``terminated`` ...) from the row of its window's last item. Reading both
whole rows copies twice the bytes a sample returns, and misses the cache on lines it
then throws away. :func:`pair_plan` splits a packed row (``TensorStorage``'s
``[capacity, row_bytes]`` block) into machine words instead: runs of whole words read
from the item's row or from the partner's, and the few words shared by fields of both
(a reward beside a ``terminated`` flag) merged through a bit mask. A kernel then writes
each output row from exactly the lines that hold what is asked for
(:func:`xpbank.nstep.kernel.nstep_gather`), and :meth:`PairPlan.fields` views the rows
as the fields, as a whole-row gather would.

Bytes of no wanted field (padding, fields not asked for) may come from either row.

Example:
    >>> import numpy as np
    >>> from xpbank.storage.pair_rows import Span, pair_plan
    >>> spans = [Span("obs", 0, 8), Span("next_obs", 8, 8), Span("reward", 16, 4), Span("done", 20, 1)]
    >>> plan = pair_plan(spans, 24, {"next_obs", "done"}, ["obs", "next_obs", "reward", "done"])
    >>> plan.word.itemsize, plan.runs.tolist(), plan.run_src.tolist(), plan.mixed.tolist()
    (8, [[0, 1], [1, 2]], [0, 1], [2])
    >>> hex(int(plan.mask[0]))  # word 2: bytes 16-19 (reward) from the item, the rest from the partner
    '0xffffffff'
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from xpbank.spec.keys import NestedKey
from xpbank.storage.dtypes import numpy_native

__all__ = ["PairPlan", "PairRows", "Span", "block_pair_rows", "pair_plan"]

_ITEM, _PARTNER, _FREE = 0, 1, 2  # where a byte of the output row comes from


@dataclass(frozen=True)
class Span:
    """A field's bytes in a row: ``[start, start + nbytes)``."""

    key: NestedKey
    start: int
    nbytes: int


@dataclass(frozen=True)
class PairPlan:
    """How to assemble output rows from item rows and partner rows, word by word.

    Attributes:
        word: the unsigned word dtype rows are copied in (the widest of 8, 4, 2, 1
            bytes that divides the row).
        runs: ``[m, 2]`` uint64 half-open word ranges copied whole from one row.
        run_src: ``[m]`` int64, ``0``: the item's row, ``1``: the partner's.
        mixed: ``[q]`` uint64 words holding bytes of both: ``(item & mask) | (partner & keep)``.
        mask: ``[q]`` of ``word``: the bits taken from the item's row.
        keep: ``[q]`` of ``word``: ``~mask``, the bits taken from the partner's row.
    """

    word: np.dtype
    runs: np.ndarray
    run_src: np.ndarray
    mixed: np.ndarray
    mask: np.ndarray
    keep: np.ndarray


def pair_plan(
    spans: Sequence[Span], row_bytes: int, second: Collection[NestedKey], keys: Collection[NestedKey]
) -> PairPlan:
    """The copy plan of a row of ``row_bytes`` holding ``spans``: the fields in ``keys``
    from the item's row, those also in ``second`` from the partner's, others from either.

    Raises:
        ValueError: a span outside the row, or two wanted spans that overlap.
    """
    owner = np.full(row_bytes, _FREE, dtype=np.int8)
    wanted = set(keys)
    for span in spans:
        if span.key not in wanted:
            continue
        if span.start < 0 or span.start + span.nbytes > row_bytes:
            where = f"bytes {span.start}..{span.start + span.nbytes - 1}"
            raise ValueError(f"pair_plan: field {span.key!r} at {where} is outside a row of {row_bytes}")
        part = owner[span.start : span.start + span.nbytes]
        if (part != _FREE).any():
            raise ValueError(f"pair_plan: field {span.key!r} overlaps another wanted field")
        part[...] = _PARTNER if span.key in second else _ITEM
    size = next(w for w in (8, 4, 2, 1) if row_bytes % w == 0)
    word = np.dtype(f"u{size}")
    by_word = owner.reshape(-1, size)
    has_item = (by_word == _ITEM).any(axis=1)
    has_partner = (by_word == _PARTNER).any(axis=1)
    source = np.where(has_partner, _PARTNER, _ITEM)  # a word of free bytes only is read from the item
    mixed = np.flatnonzero(has_item & has_partner)
    whole = np.flatnonzero((has_item | has_partner) & ~(has_item & has_partner))
    runs, run_src = _runs(whole, source)
    bits = np.zeros((mixed.shape[0], size), dtype=np.uint8)
    bits[by_word[mixed] == _ITEM] = 0xFF  # little-endian bytes of each word's mask
    mask = bits.view(word).reshape(-1) if mixed.size else np.zeros(0, dtype=word)
    return PairPlan(
        word=word,
        runs=runs,
        run_src=run_src,
        mixed=mixed.astype(np.uint64),
        mask=mask,
        keep=~mask,
    )


def _runs(words: np.ndarray, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive ``words`` of one source as ``[m, 2]`` ranges and their sources."""
    out: list[tuple[int, int]] = []
    src: list[int] = []
    for w in words.tolist():
        if out and out[-1][1] == w and src[-1] == source[w]:
            out[-1] = (out[-1][0], w + 1)
        else:
            out.append((w, w + 1))
            src.append(int(source[w]))
    return np.array(out, dtype=np.uint64).reshape(-1, 2), np.array(src, dtype=np.int64)


@dataclass(frozen=True)
class PairRows:
    """A storage's packed rows with a copy plan: what a pair-gathering kernel takes, and
    how its output rows read back as fields (see :meth:`TensorStorage.pair_rows
    <xpbank.TensorStorage.pair_rows>`).

    Attributes:
        plan: the copy plan.
        words: every slot's row as ``[capacity, W]`` words of ``plan.word`` (a view of
            the storage).
        record: one row as a NumPy record (each field a named member).
        fields: ``(key, record member, torch dtype)`` of each wanted field, in order;
            the dtype is ``None`` where NumPy holds the field as itself.
    """

    plan: PairPlan
    words: np.ndarray
    record: np.dtype
    fields: tuple[tuple[NestedKey, str, torch.dtype | None], ...]
    extra_offsets: tuple[int, ...] = ()  # byte offsets of with_extras' values in an output row

    @functools.cached_property
    def width(self) -> int:
        """Words in an output row (``W``)."""
        return self.record.itemsize // self.plan.word.itemsize

    def empty(self, b: int) -> np.ndarray:
        """Output rows for ``b`` items, ``[b, W]`` words (uninitialized)."""
        return np.empty((b, self.width), dtype=self.plan.word)

    def with_extras(self, extras: Sequence[tuple[NestedKey | None, np.dtype]]) -> PairRows:
        """These rows with each output row widened by ``extras``: per-item values a
        kernel writes after the row's bytes (each at an offset aligned to 8, from the
        first multiple of 8 past the row; ``extra_offsets``), read back by :meth:`read`
        as fields ``key`` (``None``: written but not read back). The widened row stays a
        whole number of 8-byte words.

        Example:
            >>> import numpy as np
            >>> from xpbank import Field, Spec, TensorStorage
            >>> st = TensorStorage(4, Spec({"obs": Field((2,)), "next_obs": Field((2,))}))
            >>> rows = st.pair_rows(["obs"], []).with_extras([("ret", np.dtype(np.float32))])
            >>> rows.extra_offsets, rows.empty(3).shape, sorted(rows.read(rows.empty(3)))
            ((16,), (3, 3), ['obs', 'ret'])
        """
        offset = -(-self.record.itemsize // 8) * 8
        names, formats, offsets = [], [], []
        fields = list(self.fields)
        for i, (key, dtype) in enumerate(extras):
            names.append(f"x{i}")
            formats.append(np.dtype(dtype))
            offsets.append(offset)
            if key is not None:
                fields.append((key, f"x{i}", None))
            offset += -(-np.dtype(dtype).itemsize // 8) * 8
        base: Mapping[str, Any] = self.record.fields or {}
        widened: Any = {
            "names": [*base, *names],
            "formats": [base[k][0] for k in base] + formats,
            "offsets": [base[k][1] for k in base] + offsets,
            "itemsize": offset,
        }
        record = np.dtype(widened)
        return PairRows(self.plan, self.words, record, tuple(fields), tuple(offsets))

    def read(self, rows: np.ndarray) -> dict[NestedKey, torch.Tensor]:
        """The wanted fields of filled output ``rows``, as tensors viewing them (no copy:
        each a strided view of the rows, as a whole-row gather gives)."""
        records = rows.view(self.record)[:, 0]
        tensor = torch.from_numpy
        return {
            key: tensor(records[name]) if dtype is None else tensor(records[name]).view(dtype)
            for key, name, dtype in self.fields
        }


def block_pair_rows(block: Any, keys: Sequence[NestedKey], second: Collection[NestedKey]) -> PairRows:
    """The :class:`PairRows` of a ``TensorStorage`` block (its ``members``, ``names``,
    ``row_bytes``, ``record`` and ``np_data``) holding every field of ``keys``."""
    spans = [Span(m.key, m.start, m.nbytes) for m in block.members]
    plan = pair_plan(spans, block.row_bytes, second, keys)
    names = {
        m.key: (name, None if numpy_native(m.dtype) else m.dtype)
        for name, m in zip(block.names, block.members, strict=True)
    }
    fields = tuple((k, *names[k]) for k in keys)
    return PairRows(plan, block.np_data.view(plan.word), block.record, fields)
