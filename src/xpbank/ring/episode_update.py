"""What :meth:`ReplayBuffer.update <xpbank.ReplayBuffer.update>` may rewrite of the fields
an :class:`~xpbank.EpisodeIndex` is built from: :func:`check_episode_update`.

The index reads each item's env and episode-end flags (``terminated``, ``truncated``, or
``done`` standing for ``terminated``; :class:`~xpbank.EpisodeKeys`) when the item is
written, and everything that follows episodes is derived from them then: the ``next`` /
``prev`` links and episode starts of the items after, n-step windows and their kept
results (:class:`~xpbank.nstep.table.WindowTable`), the sequence sampler's valid windows,
the frame stacks of a :class:`~xpbank.FrameStorage`. An update that changed one of those
fields would leave all of them describing the old episodes, so it is refused, before
anything is written. An update that writes the values the index already holds (a uniform
sample passed back whole, or the stored ``truncated`` set to ``True`` after
:meth:`EpisodeIndex.truncate_newest <xpbank.EpisodeIndex.truncate_newest>`) is accepted.
A buffer without an index (no ``num_envs``, no env field, nothing that needs episodes)
reads these fields only as stored data, so any update of them is accepted there.

Example:
    >>> import torch
    >>> from xpbank import ReplayBuffer
    >>> rb = ReplayBuffer(10, num_envs=1)
    >>> _ = rb.extend({"obs": torch.zeros(3, 1), "terminated": torch.tensor([False, False, True])})
    >>> rb.update([2], {"terminated": torch.tensor([True])})  # what the index holds: fine
    >>> rb.update([1], {"terminated": torch.tensor([True])})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    xpbank.errors.SpecError: update: field 'terminated' of item 1: expected False (...), got True; ...
"""

from __future__ import annotations

import numpy as np
import torch

from xpbank.errors import SpecError
from xpbank.ring.episode_keys import read_flag
from xpbank.ring.ids import Ring
from xpbank.spec.spec import NestedKey, Spec, key_str, normalize_key

__all__ = ["check_episode_update"]

_WHY = (
    "the episode index (episode links and starts, n-step windows, sequence windows, frame "
    "stacks) is built from the envs and episode-end flags when items are written, and an "
    "update cannot move an episode boundary"
)
_FLAG_FIX = (
    "write the right flags when extending; to end each env's open episode at its newest "
    "item, call rb.episodes.truncate_newest() (then an update setting those items' stored "
    "truncated flag to True is accepted)"
)


def check_episode_update(
    ring: Ring, spec: Spec, slots: torch.Tensor, flat: dict[NestedKey, torch.Tensor]
) -> None:
    """Refuse an update that changes an indexed item's env or episode-end flag.

    Args:
        ring: the buffer's ring; its ``episodes`` is the index (``None``: the buffer
            keeps none, nothing to check).
        spec: the buffer's spec (says which fields the index reads).
        slots: the live slots written, one per row of ``flat`` (no repeats).
        flat: the validated new values, by field.

    Raises:
        SpecError: a row whose env id or flag differs from what the index holds for its
            item; it names the field, the item, the value held and the value given.
    """
    episodes = ring.episodes
    if episodes is None or not flat:
        return
    term_key, trunc_key = episodes.keys.resolve(spec)
    env_key = normalize_key(episodes.keys.env)
    links = episodes.links()
    s = slots.detach().cpu().numpy().astype(np.int64, copy=False)
    n = s.shape[0]
    for key, held in ((term_key, links.terminated), (trunc_key, links.truncated)):
        if key is not None and key in flat:
            _compare(key, held[s], read_flag(flat, key, n), slots, ring, _FLAG_FIX)
    if env_key in spec and env_key in flat:
        given = flat[env_key].detach().cpu().reshape(n, -1)[:, 0].numpy().astype(np.int64)
        fix = "an item's env cannot change after it is written: write the right env ids when extending"
        _compare(env_key, links.env[s], given, slots, ring, fix)


def _compare(
    key: NestedKey, held: np.ndarray, given: np.ndarray, slots: torch.Tensor, ring: Ring, fix: str
) -> None:
    differ = np.flatnonzero(held != given)
    if differ.size == 0:
        return
    i = int(differ[0])
    item = int(ring.ids_of_slots(slots[i : i + 1])[0])
    raise SpecError(
        f"update: field {key_str(key)!r} of item {item}: expected {held[i].item()!r} (the value the "
        f"episode index holds), got {given[i].item()!r}; {_WHY}: {fix}"
        + (f" ({differ.size} rows differ)" if differ.size > 1 else "")
    )
