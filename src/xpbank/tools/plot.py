"""A bank at a glance as one PNG: episode returns and lengths over time, the reward
histogram, and the sampler's priorities when it has some.

Everything is read in chunks (:func:`~xpbank.tools.stats.episode_stats`,
:func:`reward_histogram`), so a bank larger than memory plots through ``open_bank``.
Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from xpbank.errors import EmptyBufferError, require
from xpbank.replay.buffer import ReplayBuffer
from xpbank.tools.episode_scan import CHUNK
from xpbank.tools.stats import episode_stats, field_stats

__all__ = ["plot_bank", "reward_histogram", "stored_priorities"]


def reward_histogram(
    buffer: ReplayBuffer, key: str = "reward", bins: int = 50, chunk: int = CHUNK
) -> tuple[np.ndarray, np.ndarray]:
    """``(counts, edges)`` of a one-number-per-item field over every item, in two chunked passes.

    Example:
        >>> import torch, xpbank
        >>> rb = xpbank.ReplayBuffer(10)
        >>> _ = rb.extend({"reward": torch.tensor([0.0, 1.0, 1.0])})
        >>> reward_histogram(rb, bins=2)[0].tolist()
        [1, 2]
    """
    m = field_stats(buffer, chunk=chunk, fields=[key])[key]
    lo, hi = (m.min, m.max) if m.max > m.min else (m.min - 0.5, m.max + 0.5)
    edges = np.linspace(lo, hi, bins + 1)
    counts = np.zeros(bins, dtype=np.int64)
    n = len(buffer)
    for start in range(0, n, chunk):
        values = buffer.sample_by_index(np.arange(start, min(n, start + chunk)), fields=[key])[key]
        counts += np.histogram(values.to(torch.float64).numpy(), edges)[0]
    return counts, edges


def stored_priorities(buffer: ReplayBuffer) -> np.ndarray | None:
    """The priorities a prioritized sampler keeps for the stored items (``None``: no priorities)."""
    state = buffer.sampler.state_dict()
    if not isinstance(state, dict) or "priorities" not in state:
        return None
    value = state["priorities"]
    arr = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    return arr[: len(buffer)].astype(np.float64)


def plot_bank(buffer: ReplayBuffer, path: str | os.PathLike[str], *, title: str = "") -> Path:
    """Draw ``buffer``'s episodes, rewards and priorities into a PNG at ``path``.

    Panels: return per episode (in the order episodes ended) with a moving average,
    length per episode, the reward histogram, and the priority histogram (a prioritized
    sampler) or the termination/truncation counts (otherwise).

    Raises:
        EmptyBufferError: the buffer holds nothing.
        MissingExtraError: matplotlib is not installed.
    """
    if len(buffer) == 0:
        raise EmptyBufferError("plot: the bank holds no items; nothing to plot")
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "plot")
    has_reward = buffer.spec is not None and "reward" in buffer.spec
    eps = episode_stats(buffer, reward="reward" if has_reward else None)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    (ax_ret, ax_len), (ax_hist, ax_extra) = axes
    x = np.arange(len(eps.lengths))
    if eps.returns.size:
        ax_ret.plot(x, eps.returns, ".", ms=3, alpha=0.5, label="return")
        window = max(1, len(x) // 20)
        if len(x) >= window > 1:
            smooth = np.convolve(eps.returns, np.ones(window) / window, mode="valid")
            ax_ret.plot(x[window - 1 :], smooth, "-", label=f"mean of {window}")
        ax_ret.legend(loc="best")
    _empty_note(ax_ret, eps.returns.size == 0, "no complete episodes with rewards")
    ax_ret.set(title="episode return", xlabel="episode (in the order they ended)", ylabel="return")
    ax_len.plot(x, eps.lengths, ".", ms=3)
    _empty_note(ax_len, eps.lengths.size == 0, "no complete episodes")
    ax_len.set(title="episode length", xlabel="episode", ylabel="steps")
    if has_reward:
        counts, edges = reward_histogram(buffer)
        ax_hist.stairs(counts, edges, fill=True)
    _empty_note(ax_hist, not has_reward, "no 'reward' field")
    ax_hist.set(title="reward per step", xlabel="reward", ylabel="items")
    priorities = stored_priorities(buffer)
    if priorities is not None and priorities.size:
        ax_extra.hist(priorities, bins=50)
        ax_extra.set(title="sampler priorities (as stored: p^alpha)", xlabel="priority", ylabel="items")
    else:
        ends = [int(eps.terminated.sum()), int((~eps.terminated).sum()), eps.partial]
        ax_extra.bar(["terminated", "truncated", "partial"], ends)
        ax_extra.set(title="how episodes end", ylabel="episodes")
    fig.suptitle(title or f"{len(buffer)} items, {len(eps.lengths)} complete episodes")
    fig.tight_layout()
    out = Path(os.fspath(path))
    out.parent.mkdir(parents=True, exist_ok=True)  # like every command that writes
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _empty_note(ax: object, empty: bool, text: str) -> None:
    if empty:
        ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)  # type: ignore[attr-defined]
