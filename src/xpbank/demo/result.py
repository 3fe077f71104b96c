"""What a demo agent's training run produced, and the timer around its buffer calls."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import nn

__all__ = ["AgentResult", "TimedBuffer", "Progress"]

Progress = Callable[[int, "float | None"], Any]
"""``progress(env_steps_done, last_episode_return)``, called after every vector step."""


@dataclass
class AgentResult:
    """One training run: the trained network, the buffer it learned from, timings, returns."""

    config: Any
    model: nn.Module
    buffer: Any
    env_steps: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # process CPU time of the training loop (the machine may be shared)
    buffer_ops: int = 0  # calls into the buffer (writes, samples, priority updates ...)
    buffer_seconds: float = 0.0  # time spent in them
    curve: list[tuple[int, float]] = field(default_factory=list)  # (env step, episode return)
    eval_return: float = float("nan")

    @property
    def final_return(self) -> float:
        """Mean return of the last 10 training episodes.

        Example:
            >>> from torch import nn
            >>> AgentResult(None, nn.Identity(), None, curve=[(5, 1.0), (9, 3.0)]).final_return
            2.0
        """
        return float(np.mean([r for _, r in self.curve[-10:]])) if self.curve else float("nan")

    def start_clock(self) -> None:
        self._start, self._cpu_start = time.perf_counter(), time.process_time()

    def stop_clock(self, timed: TimedBuffer) -> None:
        self.seconds = time.perf_counter() - self._start
        self.cpu_seconds = time.process_time() - self._cpu_start
        self.buffer_ops, self.buffer_seconds = timed.calls, timed.seconds


class TimedBuffer:
    """A buffer whose method calls are counted and timed; attributes pass through.

    Example:
        >>> import torch, xpbank
        >>> timed = TimedBuffer(xpbank.ReplayBuffer(10))
        >>> timed.extend({"x": torch.zeros(2)})
        range(0, 2)
        >>> timed.calls, len(timed.buffer)
        (1, 2)
    """

    def __init__(self, buffer: Any):
        self.buffer, self.calls, self.seconds = buffer, 0, 0.0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.buffer, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            out = self._time(attr, *args, **kwargs)
            return self._each(out) if isinstance(out, Iterator) else out

        return timed

    def _time(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def _each(self, items: Iterator[Any]) -> Iterator[Any]:
        """A minibatch generator whose every minibatch counts as one timed call."""
        done = object()
        while (item := self._time(next, items, done)) is not done:
            yield item
