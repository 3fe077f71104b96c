"""Rebuilding a buffer from a bank's manifest, and the claims checked on the way.

:func:`new_buffer` builds the buffer ``manifest.buffer`` describes; :func:`check_options`
checks those options on a tiny ring (no spec, no data: cheap enough for ``list_banks``);
:func:`restore` loads the decoded state after checking what the buffer's own types
cannot: a prioritized sampler's trees must span the manifest's ring.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from xpbank.bank.format import MANIFEST
from xpbank.bank.manifest import Manifest
from xpbank.bank.summary import NOT_OPTIONS, SIZED, check_sized, node
from xpbank.errors import CorruptBankError, SpecError
from xpbank.her import HerSampler  # noqa: F401  (registers "her": a bank names its sampler)
from xpbank.replay.buffer import ReplayBuffer
from xpbank.sampler import PrioritizedSampler, make_sampler
from xpbank.sampler.sumtree import level_sizes

__all__ = ["new_buffer", "check_options", "restore"]

# what the buffer's parts raise for a state node of the wrong type or value (``None`` where
# a dict is expected: AttributeError, a list too short: IndexError ...)
_MALFORMED = (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError, ArithmeticError)

# the ring :func:`check_options` builds (options do not depend on the capacity)
_PROBE_SLOTS = 16


def new_buffer(manifest: Manifest, root: Path, storage: Any) -> ReplayBuffer:
    """The buffer ``manifest['buffer']`` (a ``ReplayBuffer.config()``) describes, over
    ``storage``. Every other key of the config (e.g. ``num_envs``) is passed on as a
    keyword argument, so a new constructor option needs no change here. Every sampler
    xpbank ships is registered by then (this module imports them, ``HerSampler`` too),
    whatever the caller imported.

    Raises:
        CorruptBankError: an option the constructor refuses (out of range, unknown).
    """
    config = manifest.buffer
    check_sized(config, manifest.capacity, root)
    options = {k: v for k, v in config.items() if k not in NOT_OPTIONS}
    try:
        sampler = make_sampler(config.get("sampler", {}))
        return ReplayBuffer(manifest.capacity, manifest.spec, storage=storage, sampler=sampler, **options)
    # ValueError: out of range; OverflowError: float() of an int past 1e308
    except (SpecError, TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
        raise CorruptBankError(f"{root / MANIFEST}: 'buffer' cannot be rebuilt: {exc}") from exc


def check_options(manifest: Manifest, root: Path) -> None:
    """Check the sampler and buffer options of ``manifest`` (alpha, num_envs, nstep ...)
    by building them over a ring of 16 slots with no spec: no data is read and nothing
    the size of the bank is allocated.

    Raises:
        CorruptBankError: an option out of range or unknown, naming ``manifest.json``.
    """
    check_sized(manifest.buffer, manifest.capacity, root)
    config = copy.deepcopy(manifest.buffer)
    for path in SIZED:  # checked: as small as the probe's ring, same validity
        parent = node(config, path[:-1])
        if isinstance(parent, dict) and type(parent.get(path[-1])) is int:
            parent[path[-1]] = min(parent[path[-1]], _PROBE_SLOTS)
    probe = dataclasses.replace(manifest, capacity=_PROBE_SLOTS, spec=None, buffer=config)
    new_buffer(probe, root, "memory")


def restore(buffer: ReplayBuffer, state: dict[str, Any], root: Path, manifest: Manifest) -> None:
    """``buffer.load_state_dict(state)`` for the bank at ``root``, after checking the
    state against ``manifest``.

    Raises:
        CorruptBankError: the state does not fit the buffer or the manifest's ring.
    """
    if isinstance(buffer.sampler, PrioritizedSampler):
        _check_trees(state.get("sampler"), root, manifest)
    try:
        buffer.load_state_dict(state)
    except _MALFORMED as exc:
        raise CorruptBankError(f"{root / MANIFEST}: 'state' cannot be restored ({exc!r})") from exc


def _check_trees(sampler: Any, root: Path, manifest: Manifest) -> None:
    """A prioritized sampler's state spans the ring: ``capacity`` is its padded leaf count
    (``level_sizes(ring capacity)[0]``, e.g. 48 for 40 slots) or 0 (no tree built yet), and
    it holds at most one priority a slot (the slots written so far)."""
    if not isinstance(sampler, dict):
        return  # load_state_dict names what is missing
    where = f"{root / MANIFEST}: 'state.sampler'"
    leaves = level_sizes(manifest.capacity)[0]
    capacity, priorities = sampler.get("capacity"), sampler.get("priorities")
    stored = getattr(priorities, "shape", None)
    source = _state_file(manifest, ("sampler", "priorities"))
    count = stored[0] if stored else 0
    held = f"{count} in {root / source}" if source else "none"
    if type(capacity) is not int or capacity not in (0, leaves):
        raise CorruptBankError(
            f"{where}: 'capacity' {capacity!r:.40} does not fit the ring of {manifest.capacity} slots: "
            f"its tree has {leaves} leaves (or 0 before the first write); priorities: {held}"
        )
    if stored is not None and (len(stored) != 1 or stored[0] > min(capacity, manifest.capacity)):
        raise CorruptBankError(
            f"{root / (source or MANIFEST)}: {list(stored)} priorities for a ring of {manifest.capacity} "
            f"slots (tree capacity {capacity}); expected at most one a slot"
        )


def _state_file(manifest: Manifest, path: tuple[str, ...]) -> str | None:
    """The state file the manifest's state tree names at ``path`` (``None``: none)."""
    leaf = node(manifest.state, path)
    index = leaf.get("__array__") if isinstance(leaf, dict) else None
    if type(index) is int and 0 <= index < len(manifest.state_files):
        return manifest.state_files[index].path
    return None
