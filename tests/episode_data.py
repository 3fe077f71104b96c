"""Synthetic multi-env experience with known episodes, and a brute-force episode finder.

``steps(schedule, ...)`` writes E envs in lockstep; env ``e``'s k-th episode lasts
``schedule[e][k]`` steps and ends terminated or truncated (alternating by env and
episode). Every item is a transition in the layout the Collector writes: ``obs``
(``[4]`` float32, ``obs[0]`` = a global step counter), ``action`` int64, ``reward``,
``terminated``, ``truncated``, ``("next", "obs")`` (the obs of that env's next item
inside an episode; at an episode end the true final observation, which no item has as
its ``obs``), and ``("info", "step")`` (the step within the episode).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

import xpbank


def steps(schedule: Sequence[Sequence[int]], n_steps: int, seed: int = 0) -> list[dict[object, torch.Tensor]]:
    """``n_steps`` lockstep batches of ``len(schedule)`` items (one per env)."""
    rng = np.random.default_rng(seed)
    envs = len(schedule)
    episode = [0] * envs
    t = [0] * envs
    out = []
    current = rng.normal(size=(envs, 4)).astype(np.float32)
    for _ in range(n_steps):
        obs = current.copy()
        nxt = rng.normal(size=(envs, 4)).astype(np.float32)
        term = np.zeros(envs, bool)
        trunc = np.zeros(envs, bool)
        info = np.zeros(envs, np.int64)
        current = nxt.copy()
        for e in range(envs):
            info[e] = t[e]
            t[e] += 1
            lengths = schedule[e]
            if t[e] >= lengths[episode[e] % len(lengths)]:
                (term if (e + episode[e]) % 2 == 0 else trunc)[e] = True
                episode[e] += 1
                t[e] = 0
                current[e] = rng.normal(size=4)  # the reset observation of the next episode
        out.append(
            {
                "obs": torch.from_numpy(obs),
                "action": torch.from_numpy(rng.integers(0, 3, envs)),
                "reward": torch.from_numpy(rng.normal(size=envs).astype(np.float32)),
                "terminated": torch.from_numpy(term),
                "truncated": torch.from_numpy(trunc),
                ("next", "obs"): torch.from_numpy(nxt),
                ("info", "step"): torch.from_numpy(info),
            }
        )
    return out


def filled_buffer(
    schedule: Sequence[Sequence[int]], n_steps: int, capacity: int, num_envs: bool = True, seed: int = 0
) -> xpbank.ReplayBuffer:
    """A buffer holding :func:`steps` (``num_envs=E``; with ``num_envs`` false, one env and no
    episode index: the scan reads the flag fields)."""
    envs = len(schedule)
    rb = xpbank.ReplayBuffer(capacity, num_envs=envs) if num_envs else xpbank.ReplayBuffer(capacity)
    if not num_envs and envs != 1:
        raise ValueError("without num_envs the buffer holds one env")
    for batch in steps(schedule, n_steps, seed):
        rb.extend(batch)
    return rb


def reference_episodes(
    rb: xpbank.ReplayBuffer, envs: int, exact_heads: bool = True
) -> list[dict[str, object]]:
    """Complete episodes by brute force: walk every stored item, oldest first, one list per env.

    When the ring has wrapped, an env's first stored episode counts only if its first
    stored item starts an episode (``info.step == 0``) and ``exact_heads`` (a buffer
    with an episode index knows; one without drops it). Ordered by the last item's position.
    """
    data = rb.sample_all()
    wrapped = int(data["index"][0]) > 0
    open_: dict[int, list[int]] = {}
    first_seen: set[int] = set()
    found = []
    for pos in range(len(rb)):
        e = int(data["index"][pos]) % envs
        if e not in open_:
            open_[e] = []
        if e not in first_seen:
            first_seen.add(e)
            head_ok = not wrapped or (exact_heads and int(data["info", "step"][pos]) == 0)
            open_[e] = [] if head_ok else [-1]  # -1 marks a cut head
        open_[e].append(pos)
        if bool(data["terminated"][pos]) or bool(data["truncated"][pos]):
            items = open_[e]
            open_[e] = []
            if items[0] != -1:
                rewards = data["reward"][items].double()
                found.append(
                    {
                        "env": e,
                        "positions": items,
                        "terminated": bool(data["terminated"][pos]),
                        "return": float(rewards.sum()),
                    }
                )
    return found
