"""Operations over several banks and buffers: list what is on disk, merge experience."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from xpbank.bank.format import read_manifest
from xpbank.bank.manifest import Manifest
from xpbank.bank.opened import open_bank
from xpbank.bank.rebuild import check_options
from xpbank.bank.summary import BankSummary, list_summaries, spec_text
from xpbank.errors import BankError, SpecError
from xpbank.replay.buffer import ReplayBuffer
from xpbank.sampler import make_sampler, sampler_config
from xpbank.spec.field import dtype_name
from xpbank.spec.spec import Spec, key_str

__all__ = ["BankSummary", "bank_summary", "list_banks", "merge", "merge_into"]

_MERGE_CHUNK = 4096  # items copied per step


def list_banks(directory: str | os.PathLike[str] = ".") -> list[BankSummary]:
    """Every bank directly inside ``directory``, newest (last updated) first.

    Only manifests are read. Entries that are not banks (files, directories without a
    ``manifest.json``, hidden temporaries of a save in progress) are skipped; a bank
    whose manifest is corrupt (malformed, or sampler and buffer options out of range)
    is listed last with ``error`` set, not raised.

    Example:
        >>> import tempfile, torch, xpbank
        >>> root = tempfile.mkdtemp()
        >>> rb = xpbank.ReplayBuffer(10)
        >>> _ = rb.extend({"x": torch.zeros(2)})
        >>> _ = xpbank.save(rb, root + "/a")
        >>> [(b.path.name, b.size, b.capacity, b.spec) for b in xpbank.list_banks(root)]
        [('a', 2, 10, "{'x': (*) float32}")]
    """
    return list_summaries(directory, bank_summary)


def bank_summary(entry: Path) -> BankSummary:
    """What :func:`list_banks` says about the bank at ``entry``: its manifest parsed and
    its options checked (:func:`~xpbank.bank.rebuild.check_options`), or the error."""
    try:
        m = Manifest.parse(read_manifest(entry), entry)
        check_options(m, entry)  # alpha, num_envs, nstep ... in range (no data read)
    except BankError as exc:
        return BankSummary(entry, error=str(exc))
    spec = None if m.spec is None else [(k, f.shape, dtype_name(f.dtype)) for k, f in m.spec.items()]
    return BankSummary(entry, m.session_id, m.size, m.capacity, spec_text(spec), m.created, m.updated)


def _as_buffer(source: Any, name: str, verify: bool) -> ReplayBuffer:
    if isinstance(source, ReplayBuffer):
        return source
    if isinstance(source, (str, os.PathLike)):
        return open_bank(source, "r", verify=verify)
    raise BankError(f"merge: {name} must be a ReplayBuffer or a bank path, got {type(source).__name__}")


def check_same_spec(a: Spec | None, b: Spec | None, names: tuple[str, str]) -> None:
    """Raise :class:`SpecError` naming the fields where two specs differ."""
    if a is None or b is None or a == b:
        return
    Spec.merge(a, b, names=list(names))  # a key with different fields: names both sources
    only = [f"{key_str(k)!r} only in {names[0]}" for k in a if k not in b]
    only += [f"{key_str(k)!r} only in {names[1]}" for k in b if k not in a]
    raise SpecError(f"merge: the specs differ: field {', field '.join(only)}; merge needs the same fields")


def merge(a: Any, b: Any, *, capacity: int | None = None, verify: bool = True) -> ReplayBuffer:
    """A new memory buffer with ``a``'s items, then ``b``'s, each oldest first.

    Args:
        a, b: buffers or bank paths (banks are opened read-only, not loaded whole).
        capacity: of the result; default ``a.capacity + b.capacity`` (everything fits).
            When the items do not fit, the oldest go first: ``a``'s oldest, then the
            rest of ``a``, then ``b``'s, as if ``b`` were extended after ``a``.
        verify: check the checksums of a bank given by path before copying from it
            (one extra read of its stored rows); ``False`` copies it unchecked. A
            buffer is copied as it is (open a bank with ``verify=True`` to check it).

    The result has new ids (``0 ..``), ``a``'s sampler kind and a fresh RNG. Each
    source is copied under its lock: a consistent snapshot while other threads write.

    Raises:
        SpecError: the specs differ (naming the fields).
        CorruptBankError: a bank's file is damaged (naming it), with ``verify``.

    Example:
        >>> import torch, xpbank
        >>> a, b = xpbank.ReplayBuffer(4), xpbank.ReplayBuffer(4)
        >>> _ = a.extend({"x": torch.tensor([1.0, 2.0])}); _ = b.extend({"x": torch.tensor([3.0])})
        >>> xpbank.merge(a, b, capacity=2).sample_all()["x"]
        tensor([2., 3.])
    """
    first, second = _as_buffer(a, "a", verify), _as_buffer(b, "b", verify)
    check_same_spec(first.spec, second.spec, ("a", "b"))
    size = capacity if capacity is not None else first.capacity + second.capacity
    out = ReplayBuffer(size, first.spec or second.spec, sampler=make_sampler(sampler_config(first.sampler)))
    _copy_items(first, out)
    _copy_items(second, out)
    return out


def merge_into(dst: ReplayBuffer, src: Any, *, verify: bool = True) -> None:
    """Append every item of ``src`` (a buffer or a bank path) to ``dst``, oldest first.

    ``verify``: as for :func:`merge` (a bank path's checksums are checked first).
    """
    source = _as_buffer(src, "other", verify)
    check_same_spec(dst.spec, source.spec, ("this buffer", "other"))
    _copy_items(source, dst)


def _copy_items(src: ReplayBuffer, dst: ReplayBuffer) -> None:
    """Copy ``src`` chunk by chunk holding both buffers' locks for the whole copy (a
    consistent snapshot of ``src``), taken in one global order (by ``id``) so that two
    merges in opposite directions cannot deadlock."""
    with contextlib.ExitStack() as stack:
        for _, lock in sorted({id(src.lock): src.lock, id(dst.lock): dst.lock}.items()):
            stack.enter_context(lock)
        n = len(src)
        start = max(0, n - dst.capacity)  # older ones would be overwritten by this copy
        for lo in range(start, n, _MERGE_CHUNK):
            batch = src.sample_by_index(np.arange(lo, min(n, lo + _MERGE_CHUNK)))
            dst.extend(batch.exclude("index"))
