"""Find the episodes stored in a buffer, streaming: one pass in chunks, positions only.

An episode is the run of one env's items up to an item that is ``terminated`` or
``truncated``. Items of several envs may be interleaved (``num_envs`` buffers, an
``env_id`` field); the scan follows each env on its own. Only logical positions
(8 bytes per item of the episodes still open) and the flag fields are held, never the
data, so a bank larger than memory is scanned through ``open_bank``.

Envs and episode ends come from the buffer's :class:`~xpbank.EpisodeIndex` where it
keeps one, else from the fields its :class:`~xpbank.EpisodeKeys` name.

Example:
    >>> import torch, xpbank
    >>> rb = xpbank.ReplayBuffer(10)
    >>> _ = rb.extend({"reward": torch.ones(5), "terminated": torch.tensor([0, 1, 0, 0, 1]).bool()})
    >>> [(e.positions.tolist(), e.total) for e in iter_episodes(rb, reward="reward")]
    [([0, 1], 2.0), ([2, 3, 4], 3.0)]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xpbank.errors import CapacityError, SpecError
from xpbank.replay.buffer import ReplayBuffer
from xpbank.ring.episodes import EpisodeKeys
from xpbank.spec.spec import NestedKey, key_str, normalize_key

__all__ = ["EpisodeSpan", "iter_episodes", "flag_keys", "CHUNK"]

CHUNK = 65_536  # items read per step of a scan


@dataclass
class EpisodeSpan:
    """One episode found in a buffer.

    Attributes:
        env: the env it came from (0 without env information).
        positions: its items' logical positions (0 = oldest), in order.
        terminated, truncated: how its last item ends it (both false: unfinished).
        total: the sum of the ``reward`` field over it (``None`` without one).
        complete: it starts and ends inside the buffer: not cut at its head by the
            ring's wrap, and finished.
    """

    env: int
    positions: np.ndarray
    terminated: bool = False
    truncated: bool = False
    total: float | None = None
    complete: bool = True

    def __len__(self) -> int:
        return int(self.positions.size)


@dataclass
class _Open:
    parts: list[np.ndarray] = field(default_factory=list)
    total: float = 0.0
    head_cut: bool = False


def flag_keys(buffer: ReplayBuffer) -> tuple[NestedKey | None, NestedKey | None, NestedKey | None]:
    """``(terminated, truncated, env)`` fields of ``buffer`` (``None``: absent), found by the
    buffer's own :class:`~xpbank.EpisodeKeys`."""
    if buffer.spec is None:
        return None, None, None
    config = buffer.config().get("episode_keys")
    keys = EpisodeKeys.from_config(config) if config is not None else EpisodeKeys()
    term, trunc = keys.resolve(buffer.spec)
    env = normalize_key(keys.env) if keys.env is not None else None
    return term, trunc, env if env is not None and env in buffer.spec else None


def _chunk_flags(buffer: ReplayBuffer, lo: int, hi: int, reward: NestedKey | None) -> tuple[np.ndarray, ...]:
    """``(ids, env, end, terminated, truncated, reward)`` of positions ``[lo, hi)``."""
    term_key, trunc_key, env_key = flag_keys(buffer)
    index = buffer.episodes
    wanted = [k for k in (term_key, trunc_key, env_key, reward) if k is not None]
    if index is not None:
        wanted = [reward] if reward is not None else []
    batch = buffer.sample_by_index(np.arange(lo, hi), fields=wanted)
    ids = batch["index"].numpy()
    n = hi - lo

    def col(key: NestedKey | None, dtype: Any, default: Any) -> np.ndarray:
        if key is None:
            return np.full(n, default, dtype=dtype)
        return batch[key].reshape(n, -1)[:, 0].numpy().astype(dtype)

    if index is not None:
        env, term, trunc = index.env(ids), index.terminated(ids), index.truncated(ids)
    else:
        env, term, trunc = col(env_key, np.int64, 0), col(term_key, bool, False), col(trunc_key, bool, False)
    return ids, env, term | trunc, term, trunc, col(reward, np.float64, 0.0)


def iter_episodes(
    buffer: ReplayBuffer, *, reward: Any = None, chunk: int = CHUNK, partial: bool = False
) -> Iterator[EpisodeSpan]:
    """The episodes in ``buffer``, in the order they end (unfinished ones last).

    Args:
        buffer: a :class:`~xpbank.ReplayBuffer` (a loaded or opened bank too).
        reward: a field to sum over each episode (``EpisodeSpan.total``); must be one
            number per item.
        chunk: items read per step.
        partial: also yield episodes that are not complete: cut at their head by the
            ring's wrap, or unfinished at the end of the buffer (``complete=False``).

    Raises:
        SpecError: ``reward`` is not a field of one number per item.
    """
    chunk = _check_chunk(chunk)
    reward_key = _check_reward(buffer, reward)
    n = len(buffer)
    open_: dict[int, _Open] = {}
    first_id: int | None = None
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        ids, env, end, term, trunc, rew = _chunk_flags(buffer, lo, hi, reward_key)
        if first_id is None:
            first_id = int(ids[0]) if n else 0
        pos = np.arange(lo, hi)
        ended: list[EpisodeSpan] = []
        for e in np.unique(env).tolist():
            mask = env == e
            pos_e, end_e, rew_e = pos[mask], end[mask], rew[mask]
            cuts = np.flatnonzero(end_e) + 1
            if e not in open_:
                open_[e] = _Open(head_cut=_head_cut(buffer, int(ids[mask][0]), first_id))
            start = 0
            for stop in cuts.tolist():
                ep = open_.pop(e)
                ep.parts.append(pos_e[start:stop])
                last = pos_e[stop - 1] - lo
                span = EpisodeSpan(
                    e,
                    np.concatenate(ep.parts),
                    bool(term[last]),
                    bool(trunc[last]),
                    ep.total + float(rew_e[start:stop].sum()) if reward_key is not None else None,
                    not ep.head_cut,
                )
                open_[e] = _Open()
                start = stop
                if span.complete or partial:
                    ended.append(span)
            if start < pos_e.size:
                open_[e].parts.append(pos_e[start:])
                open_[e].total += float(rew_e[start:].sum())
        yield from sorted(ended, key=lambda span: int(span.positions[-1]))
    if partial:
        for e, ep in open_.items():
            if ep.parts:
                total = ep.total if reward_key is not None else None
                yield EpisodeSpan(e, np.concatenate(ep.parts), total=total, complete=False)


def _head_cut(buffer: ReplayBuffer, first_id_of_env: int, first_id: int) -> bool:
    """Whether the env's first stored episode may have lost its first items to the wrap."""
    index = buffer.episodes
    if index is not None:
        return bool(index.episode_start(np.array([first_id_of_env]))[0] < first_id)
    return first_id > 0


def _check_chunk(chunk: Any) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk <= 0:
        raise CapacityError(f"chunk: expected a positive int, got {chunk!r}")
    return int(chunk)


def _check_reward(buffer: ReplayBuffer, reward: Any) -> NestedKey | None:
    if reward is None:
        return None
    key = normalize_key(reward)
    spec = buffer.spec
    if spec is None or key not in spec:
        known = [] if spec is None else [key_str(k) for k in spec]
        raise SpecError(f"reward: field {key_str(key)!r} is not in the buffer; known: {known}")
    shape = tuple(spec[key].shape)
    if int(np.prod(shape)) != 1:
        raise SpecError(f"reward: field {key_str(key)!r} must hold one number per item, got shape {shape}")
    return key
