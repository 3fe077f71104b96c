"""The read fast path of a hindsight sample: the sampled records and their goals in one compiled pass.

A :class:`~xpbank.her.HerSampler` sample through the general path reads the items
(``storage.gather``, field by field), then chooses the goals and reads their rows
(:mod:`xpbank.her.kernel`), then writes the goals into the batch's goal fields, then
builds the TensorDict walking the keys: about 3x a uniform sample of the same buffer.
Where the storage keeps every field in one packed CPU block (the buffer's read plan,
:mod:`xpbank.replay.fast_read`), :func:`sample_records` does it the way a uniform
sample does, plus the relabelling:

- the uniform draw (the same draws as the wrapped :class:`~xpbank.UniformSampler`),
  then the relabelling draw (:meth:`HerSampler._draw <xpbank.her.HerSampler>`), in the
  general path's order: the same batch for a seed; with numba, for an even batch, both
  in one torch call (:func:`fused_draw`'s: the same words of the generator, decoded in
  the compiled call; ~1.5 µs less; the sample makes it into its Shot's kept tensor);
- one compiled call (:func:`xpbank.her.kernel._drawn_pass`, or ``_records_loop`` after
  two draws; the first compiled for the layout's one signature and reading its kept
  arguments from an int64 context of addresses: ~0.5 µs less call than numba's
  dispatcher typing thirteen arguments; what it needs kept per batch size in a
  :class:`~xpbank.her.shot.Shot`, the sampler's last one kept as ``her._hot``): item by
  item, it prefetches the record and the item's cell of the ends table a few items
  ahead, chooses the goal (the rule of :func:`xpbank.her.kernel._goals_loop`, to the
  bit), prefetches its row and copies a record whole into fresh rows (made as the
  reward's dtype where it has the words' size: the pass views them as words); then
  copies each goal (the goal step's next achieved goal) over the record's desired goal
  and next desired goal, and into a fresh ``[m, ...]`` array of the goal's dtype beside
  one of the item's own next achieved goals; the ids and goal ids into fresh arrays;
- the user's ``compute_reward(achieved, goal, None)`` once on the relabelled rows (those
  two arrays as they are; in Fortran order where a goal has fewer than 8 numbers:
  NumPy's sum over a goal's numbers then adds them in the order it adds C-order rows,
  to the bit, and a distance over the goal axis runs along whole columns, ~2.5 µs less
  for gymnasium-robotics' reward), its rewards written into the records' reward field
  (one column of the rows where it can, else :meth:`RecordLayout.put_rewards
  <xpbank.her.layout.RecordLayout.put_rewards>`);
- the batch split from the records as the fast read does (:meth:`RecordReader.split
  <xpbank.storage.blocks.RecordReader.split>`): the same keys, order, dtypes and values
  as the general path (the tests compare the two).

It applies in the kernel's case (lockstep, ``future`` or ``final``, no n-step, no
``info_keys``, no ``compute_terminated``), with the uniform base sampler and goal and
reward fields NumPy holds as themselves; anything else returns ``None`` before any
randomness is drawn, and the general path takes the call. Without numba the same pass
runs in NumPy (:func:`_numpy_pass`: a ``take`` of whole rows, :func:`choose_goals
<xpbank.her.goals.choose_goals>`, a fancy index of the goal rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from xpbank.her.goals import choose_goals
from xpbank.her.kernel import _decode, record_kernels
from xpbank.her.kernel import _records_loop as _records_loop  # (its source: the tests run it)
from xpbank.her.layout import RecordLayout
from xpbank.her.relabel import _per_item
from xpbank.her.shot import Shot
from xpbank.replay.fast_read import ids_of_rows
from xpbank.sampler.uniform import UniformSampler

__all__ = ["RecordLayout", "drawn_kernel", "fused_draw", "kernel", "sample_records"]

_compiled: list[tuple[Callable[..., Any], Callable[..., Any]] | None] = []  # [] until _kernels() is called
_NO_U = np.zeros(0, dtype=np.float64)  # the arguments of a batch with no relabelled item
_NO_LEFT = np.zeros(0, dtype=np.int64)
_INT64 = np.dtype(np.int64)
_FUSED_LIMIT = 1 << 28  # torch's random_(0, n) takes 32 bits a value below this n, 64 from it
_fusion: list[bool] = []  # [_fusion_holds()'s answer] once checked
_LOW = -(2**63)  # a full-range int64 draw: random_(_LOW, None)
_KEPT_SHOTS = 8  # batch sizes whose Shot a layout keeps


def _kernels() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    if not _compiled:
        _compiled.append(record_kernels())
    return _compiled[0]


def _entry(layout: RecordLayout, dispatcher: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`~xpbank.her.kernel._drawn_pass` compiled for ``layout``'s one signature (its
    words; fresh rows of the reward's dtype where it has the words' size, so the rewards
    go in without a view, else of the words; fresh goal arrays of the goal's dtype where
    numba takes it, else of the words), kept on the layout with those dtypes: its calls
    skip the dispatcher's typing of each argument. The dispatcher itself where numba
    gives no entry."""
    try:
        import numba  # type: ignore[import-untyped, unused-ignore]
        from numba import types  # type: ignore[import-untyped, unused-ignore]
    except ImportError:  # pragma: no cover - _kernels() found numba
        layout.call = dispatcher
        return dispatcher
    i8 = types.int64
    rows = [layout.word]
    if layout.reward_at >= 0 and layout.reward_type.itemsize == layout.word.itemsize:
        rows.insert(0, layout.reward_type)
    for pair, row in [(pair, row) for pair in (layout.goal_dtype, layout.word) for row in rows]:
        try:
            goals = types.Array(numba.from_dtype(pair), 2, layout.goal_order)
            sig = (
                i8, i8, i8, i8, types.boolean, numba.typeof(layout.words),
                types.Array(numba.from_dtype(row), 2, "C"), goals, goals, types.Array(i8, 1, "C"),
                types.Array(i8, 1, "C"),
            )  # fmt: skip
            layout.call = dispatcher.compile(sig)  # type: ignore[attr-defined]
        except Exception:  # a dtype numba does not take (float16): the words
            continue
        layout.pair_dtype, layout.row_dtype = pair, row
        return layout.call
    layout.call = dispatcher  # pragma: no cover - the words always compile
    return dispatcher


def _shot(layout: RecordLayout, her: Any, ring: Any, batch_size: int) -> Shot | None:
    """A new :class:`~xpbank.her.shot.Shot` of ``batch_size``, kept on ``layout``; ``None``
    where the fused draw and its compiled pass do not apply (no numba, an odd batch, a
    torch whose draws :func:`_fusion_holds` finds different): nothing drawn."""
    kernels = _kernels()
    if kernels is None or batch_size & 1 or not (_fusion[0] if _fusion else _fusion_holds()):
        return None
    if layout.call is None:
        _entry(layout, kernels[1])
    if len(layout.shots) >= _KEPT_SHOTS:
        layout.shots.clear()
    shot = layout.shots[batch_size] = Shot(
        layout, her.relabel_fraction, her.strategy == "final", batch_size, ring
    )
    return shot


def kernel() -> Callable[..., Any] | None:
    """The compiled :func:`xpbank.her.kernel._records_loop` (numba, cached on disk), or
    ``None`` without numba."""
    kernels = _kernels()
    return None if kernels is None else kernels[0]


def drawn_kernel() -> Callable[..., Any] | None:
    """The compiled :func:`xpbank.her.kernel._drawn_pass` (numba, cached on disk), or
    ``None`` without numba."""
    kernels = _kernels()
    return None if kernels is None else kernels[1]


def fused_draw(
    layout: RecordLayout, size: int, batch_size: int, m: int, generator: torch.Generator
) -> np.ndarray | None:
    """The uniform base sampler's slot draw (``random_(0, size)`` of ``batch_size``) and
    the ``m`` goal offsets (``uniform_`` of ``m`` float64) in one torch call: the words
    they would take from ``generator``, in the same order, as ``batch_size / 2 + m``
    int64 (a tensor kept on ``layout``), for :func:`~xpbank.her.kernel._decode`; the generator ends where
    the two draws leave it. ``None`` (nothing drawn) where that does not hold: an odd
    batch (it would take a word more), ``size`` from ``2**28`` (torch then takes 64 bits
    a slot), or a torch whose draws :func:`_fusion_holds` finds different."""
    if batch_size & 1 or not 0 < size < _FUSED_LIMIT or not (_fusion[0] if _fusion else _fusion_holds()):
        return None
    n = (batch_size >> 1) + m
    kept = layout.draw
    if kept is None or kept[1].shape[0] != n:  # (a NumPy shape: ~0.2 µs less than torch's)
        t = torch.empty(n, dtype=torch.int64)
        kept = layout.draw = (t, t.numpy())
    kept[0].random_(_LOW, None, generator=generator)  # every bit of each 64-bit word
    return kept[1]


def _fusion_holds() -> bool:
    """Whether this torch's full-range int64 draw gives the words its ``random_(0, n)``
    (one 32-bit word a value, ``n < 2**28``) and float64 ``uniform_`` (one 64-bit word a
    value) take, high half first: checked once per process against the two draws."""
    if not _fusion:
        holds = True
        for size in (3, 1000, _FUSED_LIMIT - 1):
            gen = torch.Generator().manual_seed(size)
            start = gen.get_state()
            slots = torch.empty(6, dtype=torch.int64).random_(0, size, generator=gen)
            uniform = torch.empty(5, dtype=torch.float64).uniform_(generator=gen)
            end = gen.get_state()
            gen.set_state(start)
            raw = torch.empty(8, dtype=torch.int64).random_(-(2**63), None, generator=gen)
            rows, got = np.empty(6, dtype=np.int64), np.empty(5, dtype=np.float64)
            _decode(raw.numpy(), rows, size, got)  # (its source, run as Python)
            holds = holds and torch.equal(gen.get_state(), end)
            holds = holds and np.array_equal(rows, slots.numpy()) and np.array_equal(got, uniform.numpy())
        _fusion.append(holds)
    return _fusion[0]


def sample_records(
    her: Any, plan: Any, ring: Any, batch_size: int, generator: torch.Generator
) -> tuple[np.ndarray, np.ndarray, dict[str, torch.Tensor]] | None:
    """:meth:`HerSampler.sample <xpbank.her.HerSampler.sample>` and :meth:`relabel
    <xpbank.her.HerSampler.relabel>` in one read of whole records (``HerSampler.sample_records``
    is this function), for the buffer's read fast path: the same batch as the general
    path, or ``None`` (nothing drawn) where it does not apply.

    The sampler keeps the :class:`~xpbank.her.shot.Shot` of its last fused sample
    (``her._hot``, dropped whenever any of its attributes is set): a call with the same
    plan, batch size, spec and episode index skips the checks of the sampler's settings
    and of the layout (:func:`_sample_checked` makes them).

    Args:
        her: the :class:`~xpbank.her.HerSampler` (``self``).
        plan: the buffer's :class:`~xpbank.replay.fast_read.ReadPlan`.
        ring: the buffer's ring (with its episode index).
        batch_size: items to sample (with replacement).
        generator: the buffer's generator.

    Returns:
        ``(the records, their ids, info)`` with ``info["her_goal"]``, or ``None``.

    Raises:
        SpecError: the goal fields not found, or ``compute_reward`` returning the wrong
            number of values (the goals are drawn by then, as in the general path).

    Threads: the caller holds the buffer's lock (``rb.lock``).
    """
    shot = her._hot
    if (
        shot is None
        or shot.plan is not plan
        or shot.batch_size != batch_size
        or shot.spec is not plan.storage.spec
        or shot.episodes is not ring.episodes
        or not 0 < ring.size < _FUSED_LIMIT
    ):
        return _sample_checked(her, plan, ring, batch_size, generator)
    layout, m = shot.layout, shot.m  # both draws in one, decoded by the kernel
    out = np.empty(shot.out_shape, shot.row_dtype)  # the rows (as words, or as rewards: the pass's view)
    ids = np.empty(batch_size, _INT64)
    goal_ids = np.empty(batch_size, _INT64)
    reached = np.empty(shot.goal_shape, shot.pair_dtype, shot.order)  # the items' next achieved goals
    goal = np.empty(shot.goal_shape, shot.pair_dtype, shot.order)
    table = shot.table
    if table is not None and table.seen != ring.next_id:  # items written since
        table.catch_up(ring, shot.episodes)
    shot.draw.random_(_LOW, None, generator=generator)  # fused_draw's draw
    size, next_id = ring.size, ring.next_id
    shot.call(
        shot.context_at, size, next_id - size, next_id, shot.final, layout.words, out, reached, goal, ids,
        goal_ids,
    )  # fmt: skip
    if m:
        if shot.plain:
            value = her.compute_reward(reached, goal, None)
        else:
            value = her.compute_reward(layout.as_goals(reached), layout.as_goals(goal), None)
        if type(value) is not np.ndarray or value.shape != shot.reward_shape:
            value = _per_item("compute_reward", value, m)
        if shot.reward_column is not None:  # one column of the rows (put_rewards' case, inline)
            out[shot.reward_column] = value
        else:
            layout.put_rewards(out, m, value)
    records = np.ndarray(batch_size, layout.record, out)  # the rows as records (~0.5 µs less than a view)
    return records, ids, {"her_goal": torch.from_numpy(goal_ids)}


def _sample_checked(
    her: Any, plan: Any, ring: Any, batch_size: int, generator: torch.Generator
) -> tuple[np.ndarray, np.ndarray, dict[str, torch.Tensor]] | None:
    """:func:`sample_records` after checking the sampler's settings and the layout: a
    fused sample keeps its Shot as ``her._hot`` and goes through :func:`sample_records`;
    any other (two draws, or NumPy) runs here."""
    reward = her.compute_reward
    if (
        not her._reads_records()
        or reward is None  # the general path raises
        or type(her.base) is not UniformSampler
        or her.strategy == "episode"
        or her.info_keys
        or her.compute_terminated is not None
    ):
        return None
    spec, episodes, reader = plan.storage.spec, ring.episodes, plan.reader
    layout = getattr(her, "_records", None)  # (absent from a sampler pickled before it)
    if (
        layout is None
        or layout.reader is not reader
        or layout.spec is not spec
        or layout.episodes is not episodes
    ):
        if spec is None or episodes is None:
            return None
        layout = her._records = RecordLayout(reader, her._resolve(spec, episodes), spec, episodes)
    if not layout.usable:
        return None
    shot = layout.shots.get(batch_size)
    if shot is None or shot.fraction != her.relabel_fraction or shot.final is not (her.strategy == "final"):
        shot = _shot(layout, her, ring, batch_size)
    if shot is not None and 0 < ring.size < _FUSED_LIMIT:  # both draws in one: decoded by the kernel
        shot.plan = plan
        her._hot = shot  # (set last: any setting of the sampler drops it)
        return sample_records(her, plan, ring, batch_size, generator)
    m = int(her.relabel_fraction * batch_size)
    out = np.empty((batch_size, layout.width), layout.word)
    index = np.empty((2, batch_size), _INT64)
    reached = np.empty((m, layout.goal_words), layout.pair_dtype, layout.goal_order)
    goal = np.empty((m, layout.goal_words), layout.pair_dtype, layout.goal_order)
    left = layout.ends(ring) if m else _NO_LEFT
    kernels = _kernels()
    slots, rows, _ = plan.draw(batch_size)
    her.base.draw_into(ring, slots, generator)  # the wrapped sampler's draws
    uniform = her._draw(m, generator) if m else _NO_U
    words = (
        (goal, reached) if goal.dtype is layout.word else (goal.view(layout.word), reached.view(layout.word))
    )
    if kernels is None:
        _numpy_pass(layout, ring, rows, uniform, her.strategy, out, words[0], words[1], index[0], index[1])
    else:
        kernels[0](
            layout.words, rows, ring.next_id - ring.size, uniform, left, layout.stride, ring.next_id,
            her.strategy == "final", layout.achieved, layout.goal_at, out, words[0], words[1], index[0],
            index[1],
        )  # fmt: skip
    if m:
        value = reward(layout.as_goals(reached), layout.as_goals(goal), None)
        if type(value) is not np.ndarray or value.shape != (m,):
            value = _per_item("compute_reward", value, m)
        layout.put_rewards(out, m, value)
    return np.ndarray(batch_size, layout.record, out), index[0], {"her_goal": torch.from_numpy(index[1])}


def _numpy_pass(
    layout: RecordLayout,
    ring: Any,
    rows: np.ndarray,
    uniform: np.ndarray,
    strategy: str,
    out: np.ndarray,
    goal: np.ndarray,
    reached: np.ndarray,
    ids: np.ndarray,
    goal_ids: np.ndarray,
) -> None:
    """:func:`~xpbank.her.kernel._records_loop`'s work in NumPy, where numba is missing: the same records,
    ids, goals (:func:`~xpbank.her.goals.choose_goals`, the kernel's reference) and rows."""
    m, g, a = goal.shape[0], goal.shape[1], layout.achieved
    np.take(layout.words, rows, axis=0, out=out)  # whole rows, one call
    ids[...] = ids_of_rows(ring, rows)
    goal_ids[m:] = -1
    if not m:
        return
    choose_goals(ring.episodes, ring, ids[:m], strategy, uniform, layout.stride, rows[:m], goal_ids[:m])
    goal[...] = layout.words[goal_ids[:m] % ring.capacity, a : a + g]
    reached[...] = out[:m, a : a + g]
    for at in layout.goal_at.tolist():
        out[:m, at : at + g] = goal
