"""What the demo shows when it is done: a summary table and a learning-curve PNG."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xpbank.errors import require

__all__ = ["AgentSummary", "summary_table", "summary_markdown", "plot_curves", "smooth", "SMOOTHING"]

SMOOTHING = 10  # episodes in the trailing mean the learning curves draw

COLUMNS = (
    "agent",
    "env",
    "env steps",
    "time (CPU)",
    "env steps/s",
    "buffer ops/s",
    "return (last 10 ep.)",
    "greedy eval (10 ep.)",
    "replay on disk",
)

NOTE = (
    "Returns depend on the seed and, through floating-point rounding, on the "
    "CPU: the same seed can end at another return on another machine."
)


@dataclass(frozen=True)
class AgentSummary:
    """One agent's line in the summary table."""

    agent: str
    env_id: str
    env_steps: int
    seconds: float
    cpu_seconds: float
    buffer_ops: int
    buffer_seconds: float
    final_return: float
    eval_return: float
    bank_bytes: int | None  # the saved replay (None: the agent keeps no replay)
    curve: Sequence[tuple[int, float]]

    @property
    def env_steps_per_s(self) -> float:
        return self.env_steps / self.seconds if self.seconds > 0 else float("nan")

    @property
    def buffer_ops_per_s(self) -> float:
        return self.buffer_ops / self.buffer_seconds if self.buffer_seconds > 0 else float("nan")


def smooth(values: Sequence[float], window: int = 10) -> np.ndarray:
    """Trailing mean over up to ``window`` values (the first points average fewer).

    Example:
        >>> smooth([1.0, 3.0, 5.0, 7.0], window=2).tolist()
        [1.0, 2.0, 4.0, 6.0]
    """
    x = np.asarray(values, dtype=np.float64)
    sums = np.cumsum(np.concatenate([[0.0], x]))
    idx = np.arange(1, len(x) + 1)
    start = np.maximum(0, idx - window)
    return (sums[idx] - sums[start]) / (idx - start)


def _cells(r: AgentSummary) -> list[str]:
    return [
        r.agent,
        r.env_id,
        f"{r.env_steps:,}",
        f"{r.seconds:.0f} s ({r.cpu_seconds:.0f} s)",
        f"{r.env_steps_per_s:,.0f}",
        f"{r.buffer_ops_per_s:,.0f}",
        f"{r.final_return:.1f}",
        f"{r.eval_return:.1f}",
        "-" if r.bank_bytes is None else f"{r.bank_bytes / 2**20:.1f} MiB",
    ]


def summary_table(rows: Sequence[AgentSummary], files: Sequence[Path], seed: int = 0) -> object:
    """A ``rich`` table of the run (print it with a ``rich`` console)."""
    table_mod = require("rich.table", "demo")
    caption = f"One seed ({seed}). {NOTE}\nfiles: " + ", ".join(str(f) for f in files)
    table = table_mod.Table(title="xpbank demo", caption=caption)
    for name in COLUMNS:
        table.add_column(name, justify="left" if name in ("agent", "env") else "right")
    for r in rows:
        table.add_row(*_cells(r))
    return table


def summary_markdown(rows: Sequence[AgentSummary], seed: int = 0) -> str:
    """The summary table as Markdown, with the seed and what the numbers depend on.

    Example:
        >>> row = AgentSummary("PPO", "CartPole-v1", 100, 2.0, 1.5, 10, 0.5, 20.0, 21.0, None, [])
        >>> print(summary_markdown([row]).splitlines()[-1])
        | PPO | CartPole-v1 | 100 | 2 s (2 s) | 50 | 20 | 20.0 | 21.0 | - |
    """
    lines = ["# xpbank demo", "", f"One seed ({seed}). {NOTE}", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_curves(rows: Sequence[AgentSummary], path: Path) -> Path:
    """Episode returns against env steps (raw and smoothed), one line per agent."""
    require("matplotlib", "demo")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4))
    for r in rows:
        if not r.curve:
            continue
        steps = [s for s, _ in r.curve]
        returns = [v for _, v in r.curve]
        (raw,) = ax.plot(steps, returns, alpha=0.35, linewidth=0.8, label=f"{r.agent}: each episode")
        ax.plot(
            steps,
            smooth(returns, SMOOTHING),
            color=raw.get_color(),
            linewidth=2,
            label=f"{r.agent}: mean of last {SMOOTHING} (greedy eval {r.eval_return:.0f})",
        )
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title(
        f"xpbank demo: {', '.join(sorted({r.env_id for r in rows}))} "
        f"(lines: trailing mean of {SMOOTHING} episodes; faint: each episode)",
        fontsize=9,
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # off the data
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
