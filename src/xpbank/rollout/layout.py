"""Where each step of a rollout goes: per-writer cursors over a fixed grid of slots.

A layout maps "the next step of writer ``w``" (an env, or an agent) to a slot of the
storage, and describes the stored steps as a time-major grid ``[L, R]`` of slots: column
``r`` holds the ``L`` consecutive steps of one writer, oldest first.

- :class:`TimeLayout` is the ``[T, E]`` rollout: slot ``t * E + e``, one column per env,
  each env with its own cursor (envs may be out of step).
- :class:`SegmentLayout` is metta's ``[segments, bptt_horizon]``: slot ``s * H + t``.
  Every agent fills one row (a segment) at a time and takes the next free row when
  its row is full, independently of the other agents; ``successor[s]`` is the row
  that continues row ``s`` for the same agent (``-1`` when none).

Layouts hold only counters (NumPy, O(writers) per call, no loop over items).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from xpbank.errors import CapacityError, NotReadyError, check_positive_int

__all__ = ["TimeLayout", "SegmentLayout", "SegmentSizes", "segment_sizes", "span_of", "as_bool", "count_ends"]


@dataclass(frozen=True)
class SegmentSizes:
    """How a batch of ``batch_size`` steps splits into BPTT segments and minibatches.

    Attributes:
        segments: rows of ``bptt_horizon`` steps in the buffer (``batch_size // bptt_horizon``).
        bptt_horizon: steps per row.
        minibatch_size: steps per optimizer minibatch, at most ``max_minibatch_size``.
        minibatch_segments: rows per minibatch.
        num_minibatches: minibatches per pass over the buffer.
        accumulate_minibatches: minibatches whose gradients are accumulated per step
            (``requested minibatch_size // max_minibatch_size``, at least 1).
    """

    segments: int
    bptt_horizon: int
    minibatch_size: int
    minibatch_segments: int
    num_minibatches: int
    accumulate_minibatches: int


def segment_sizes(
    total_agents: int, batch_size: int, bptt_horizon: int, minibatch_size: int, max_minibatch_size: int
) -> SegmentSizes:
    """Check metta-style sizes and derive the segment layout (a pure function).

    Example:
        >>> segment_sizes(4, 64, 8, 32, 16)
        SegmentSizes(segments=8, bptt_horizon=8, minibatch_size=16, minibatch_segments=2, num_minibatches=4, accumulate_minibatches=2)
    """  # noqa: E501
    agents = check_positive_int("total_agents", total_agents)
    batch = check_positive_int("batch_size", batch_size)
    bptt = check_positive_int("bptt_horizon", bptt_horizon)
    requested = check_positive_int("minibatch_size", minibatch_size)
    cap = check_positive_int("max_minibatch_size", max_minibatch_size)
    if batch % bptt:
        raise CapacityError(f"batch_size {batch} is not a multiple of bptt_horizon {bptt}")
    segments = batch // bptt
    if segments < agents:
        raise CapacityError(
            f"batch_size {batch} / bptt_horizon {bptt} gives {segments} segments, fewer than "
            f"total_agents {agents}: every agent needs a segment row of its own"
        )
    mb = min(requested, cap)
    if requested > cap and requested % cap:
        raise CapacityError(
            f"minibatch_size {requested} is not a multiple of max_minibatch_size {cap}: "
            f"gradients are accumulated over whole minibatches of {cap}"
        )
    if mb % bptt:
        raise CapacityError(f"minibatch_size {mb} is not a multiple of bptt_horizon {bptt}")
    if batch % mb:
        raise CapacityError(f"batch_size {batch} is not a multiple of minibatch_size {mb}")
    return SegmentSizes(segments, bptt, mb, mb // bptt, batch // mb, max(1, requested // cap))


def _env_ids(env_ids: object, n: int, what: str) -> np.ndarray:
    """``env_ids`` (slice, range, list, array, tensor, int) as distinct int64 ids in range."""
    if isinstance(env_ids, slice):
        return np.arange(n)[env_ids]  # distinct and in range by construction
    if isinstance(env_ids, torch.Tensor):
        ids = env_ids.detach().cpu().numpy().reshape(-1)
    else:
        ids = np.asarray(env_ids).reshape(-1)
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        raise CapacityError(f"{what}: expected integer ids, a slice or a range, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    bad = ids[(ids < 0) | (ids >= n)]
    if bad.size:
        raise CapacityError(f"{what}: id {int(bad[0])} is out of range [0, {n})")
    if np.unique(ids).size != ids.size:
        raise CapacityError(f"{what}: ids repeat; each writes one step, give each once")
    return ids


def span_of(ids: np.ndarray, all_ids: np.ndarray) -> tuple[int, int] | None:
    """``(a, b)`` when ``ids`` are exactly ``a, a + 1, ..., b - 1`` in order, else ``None``."""
    a, n = int(ids[0]), ids.size
    if int(ids[-1]) - a != n - 1:
        return None
    if ids is not all_ids and n > 1 and not (ids[1:] - ids[:-1] == 1).all():
        return None
    return a, a + n


def as_bool(flags: torch.Tensor) -> np.ndarray:
    """Episode-end flags ``[n]`` (or ``[n, 1]``) as a NumPy bool array (a view when possible)."""
    arr = (flags if flags.device.type == "cpu" else flags.cpu()).detach().numpy().reshape(-1)
    return arr if arr.dtype == np.bool_ else arr != 0


def count_ends(
    steps: np.ndarray,
    episodes: list[int],
    ends: Sequence[torch.Tensor | None],
    ids: np.ndarray,
    span: tuple[int, int] | None,
) -> None:
    """Count a step of writers ``ids`` (``span`` when consecutive) in ``steps`` and the
    episodes it ends in ``episodes`` (``[count, total length]``), restarting them. ``ends``:
    the step's ``(terminated, truncated)`` flags (``None`` where absent; nothing is counted
    without ``terminated``).

    Example:
        >>> steps, episodes = np.array([2, 0]), [0, 0]
        >>> count_ends(steps, episodes, [torch.tensor([True, False]), None], np.arange(2), (0, 2))
        >>> steps.tolist(), episodes
        ([0, 1], [1, 3])
    """
    if ends[0] is None:
        return
    done = as_bool(ends[0])
    for more in ends[1:]:
        if more is not None:
            done = done | as_bool(more)
    if span is not None:  # consecutive writers: slices instead of fancy indexing
        steps[span[0] : span[1]] += 1
        ended = span[0] + np.flatnonzero(done)
    else:
        steps[ids] += 1
        ended = ids[done]
    if ended.size:
        episodes[0] += int(ended.size)
        episodes[1] += int(steps[ended].sum())
        steps[ended] = 0


class TimeLayout:
    """``[T, E]`` time-major slots with one write cursor per env.

    Example:
        >>> lay = TimeLayout(num_envs=2, horizon=3)
        >>> lay.slots(lay.ids([1])).tolist(); lay.advance(lay.ids([1])); lay.cursor.tolist()
        [1]
        [0, 1]
    """

    def __init__(self, num_envs: int, horizon: int):
        self.num_writers = check_positive_int("num_envs", num_envs)
        self.length = check_positive_int("horizon", horizon)
        self.rows = self.num_writers
        self.capacity = self.num_writers * self.length
        self.grid = torch.arange(self.capacity).view(self.length, self.rows)
        self.successor = np.full(self.rows, -1, np.int64)
        self.writer_of_row = np.arange(self.rows)
        self.cursor = np.zeros(self.num_writers, np.int64)
        self.lockstep: int | None = 0  # the common cursor while every env is in step

    def ids(self, env_ids: object) -> np.ndarray:
        return _env_ids(env_ids, self.num_writers, "env_ids")

    def contiguous(self, ids: np.ndarray, span: tuple[int, int] | None) -> slice | None:
        """The slots of a step of consecutive envs ``span`` at one time index, as a slice."""
        if span is None:
            return None
        if self.lockstep is not None:  # O(1): no look at the cursors
            t = self.lockstep
        else:
            cur = self.cursor[span[0] : span[1]]  # a view, two reductions to check
            t = int(cur[0])
            if int(cur.min()) != t or int(cur.max()) != t:
                return None
        if t >= self.length:
            return None
        start = t * self.rows + span[0]
        return slice(start, start + ids.size)

    def slots(self, ids: np.ndarray) -> np.ndarray:
        t = self.cursor[ids]
        full = ids[t >= self.length]
        if full.size:
            raise CapacityError(
                f"env {int(full[0])} already holds horizon={self.length} steps; writing more would "
                f"overwrite its rollout: call clear() (after training on it) first"
            )
        return t * self.rows + ids

    def room(self) -> np.ndarray:
        return self.cursor < self.length

    def step_all(self) -> bool:
        """Count a step of every env where they are in lockstep with room left (O(1), what
        :meth:`advance` of all envs does then); ``False``, nothing changed, otherwise."""
        t = self.lockstep
        if t is None or t >= self.length:
            return False
        self.cursor += 1
        self.lockstep = t + 1
        return True

    def advance(self, ids: np.ndarray, span: tuple[int, int] | None = None) -> None:
        if span is not None and span[1] - span[0] == self.num_writers and self.lockstep is not None:
            self.cursor += 1
            self.lockstep += 1
            return
        if span is not None:
            self.cursor[span[0] : span[1]] += 1
        else:
            self.cursor[ids] += 1
        c = self.cursor
        self.lockstep = int(c[0]) if c.min() == c.max() else None

    def filled(self) -> np.ndarray:
        """``[L, R]`` bool: which grid cells hold a step."""
        return np.arange(self.length)[:, None] < self.cursor[None, :]

    def ready(self) -> bool:
        return bool((self.cursor == self.length).all())

    def require_ready(self, what: str) -> None:
        if not self.ready():
            env = int(np.argmin(self.cursor))
            raise NotReadyError(
                f"{what}: the rollout is not complete: env {env} has {int(self.cursor[env])} of "
                f"horizon={self.length} steps"
            )

    def clear(self) -> None:
        self.cursor[:] = 0
        self.lockstep = 0


class SegmentLayout:
    """``[segments, bptt_horizon]`` rows; each agent fills a row, then takes a free one.

    Example:
        >>> lay = SegmentLayout(total_agents=2, segments=3, bptt_horizon=2)
        >>> for _ in range(2): lay.advance(lay.ids([0]))
        >>> lay.row_of.tolist(), lay.successor.tolist()
        ([2, 1], [2, -1, -1])
    """

    def __init__(self, total_agents: int, segments: int, bptt_horizon: int):
        self.num_writers = check_positive_int("total_agents", total_agents)
        self.rows = check_positive_int("segments", segments)
        self.length = check_positive_int("bptt_horizon", bptt_horizon)
        if self.rows < self.num_writers:
            raise CapacityError(f"segments {self.rows} < total_agents {self.num_writers}")
        self.capacity = self.rows * self.length
        self.grid = torch.arange(self.capacity).view(self.rows, self.length).T
        self.successor = np.full(self.rows, -1, np.int64)
        self.writer_of_row = np.full(self.rows, -1, np.int64)
        self.row_of = np.zeros(self.num_writers, np.int64)
        self.pos = np.zeros(self.num_writers, np.int64)
        self.next_free = self.num_writers
        self.full_rows = 0
        self.clear()

    def ids(self, env_ids: object) -> np.ndarray:
        return _env_ids(env_ids, self.num_writers, "env_ids")

    def contiguous(self, ids: np.ndarray, span: tuple[int, int] | None) -> slice | None:
        return None  # an agent's steps are H slots apart: writes always go by index

    def slots(self, ids: np.ndarray) -> np.ndarray:
        rows = self.row_of[ids]
        done = ids[rows < 0]
        if done.size:
            raise CapacityError(
                f"agent {int(done[0])}: its segment is full and all {self.rows} segments are "
                f"taken; store only agents with room() until ready(), then train and clear()"
            )
        return rows * self.length + self.pos[ids]

    def room(self) -> np.ndarray:
        return self.row_of >= 0

    def step_all(self) -> bool:
        """No O(1) step of every agent here (each moves through its segments): ``False``."""
        return False

    def advance(self, ids: np.ndarray, span: tuple[int, int] | None = None) -> None:
        self.pos[ids] += 1
        full = ids[self.pos[ids] == self.length]
        if not full.size:
            return
        self.full_rows += full.size
        new = self.next_free + np.arange(full.size)
        new[new >= self.rows] = -1
        got = new >= 0
        self.successor[self.row_of[full[got]]] = new[got]
        self.writer_of_row[new[got]] = full[got]
        self.row_of[full] = new
        self.pos[full] = 0
        self.next_free = min(self.rows, self.next_free + full.size)

    def filled(self) -> np.ndarray:
        count = np.zeros(self.rows, np.int64)
        count[: self.next_free] = self.length
        active = self.row_of >= 0
        count[self.row_of[active]] = self.pos[active]
        return np.arange(self.length)[:, None] < count[None, :]

    def ready(self) -> bool:
        return self.full_rows == self.rows

    def require_ready(self, what: str) -> None:
        if not self.ready():
            raise NotReadyError(
                f"{what}: the rollout is not complete: {self.full_rows} of {self.rows} segments are full"
            )

    def clear(self) -> None:
        self.row_of[:] = np.arange(self.num_writers)
        self.pos[:] = 0
        self.successor[:] = -1
        self.writer_of_row[:] = -1
        self.writer_of_row[: self.num_writers] = np.arange(self.num_writers)
        self.next_free = self.num_writers
        self.full_rows = 0
