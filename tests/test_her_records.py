"""The HER read fast path (her/records.py): one compiled pass over whole records.

It must give exactly the batch the general path gives (``rb._fast_read = False``): the
same draws, keys in the same order, dtypes, values, ``her_goal``, and the generator left
in the same state; where it does not apply it must decline before drawing anything.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xpbank import NStep, PrioritizedSampler, ReplayBuffer
from xpbank.errors import SpecError
from xpbank.her import HerSampler
from xpbank.her import records as her_records


def gap(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    return (desired[..., 0] - achieved[..., 0]).astype(np.float32)


def nested_stream(rb: ReplayBuffer, rng: np.random.Generator, steps: int, envs: int, start: int) -> int:
    """``steps`` lockstep steps of ``envs`` envs in gymnasium's nested keys; goals name ids."""
    n = steps * envs
    ids = torch.arange(start, start + n, dtype=torch.float64)
    goal = torch.stack([ids, -ids], 1)
    rb.extend(
        {
            ("obs", "observation"): torch.from_numpy(rng.random((n, 5), dtype=np.float32)),
            ("obs", "achieved_goal"): goal,
            ("obs", "desired_goal"): torch.full((n, 2), -7.0, dtype=torch.float64),
            "action": torch.from_numpy(rng.integers(0, 3, n)),
            ("next", "obs", "observation"): torch.from_numpy(rng.random((n, 5), dtype=np.float32)),
            ("next", "obs", "achieved_goal"): goal + 0.5,
            ("next", "obs", "desired_goal"): torch.full((n, 2), -7.0, dtype=torch.float64),
            ("next", "reward"): torch.full((n,), -3.0, dtype=torch.float64),
            ("next", "terminated"): torch.from_numpy(rng.random(n) < 0.08),
            ("next", "truncated"): torch.from_numpy(rng.random(n) < 0.05),
        }
    )
    return start + n


def flat_stream(rb: ReplayBuffer, rng: np.random.Generator, steps: int, envs: int, start: int) -> int:
    """Flat keys, float32 goals of one value, no next desired goal, an int16 reward."""
    n = steps * envs
    ids = torch.arange(start, start + n, dtype=torch.float32)[:, None]
    rb.extend(
        {
            "desired_goal": torch.full((n, 1), -7.0),
            "next_achieved_goal": ids + 0.5,
            "flag": torch.from_numpy(rng.random(n) < 0.5),
            "reward": torch.zeros(n, dtype=torch.int16),
            "terminated": torch.from_numpy(rng.random(n) < 0.1),
        }
    )
    return start + n


def words_stream(rb: ReplayBuffer, rng: np.random.Generator, steps: int, envs: int, start: int) -> int:
    """Float32 goals of three values and a float32 reward (the benchmark's layout)."""
    n = steps * envs
    ids = torch.arange(start, start + n, dtype=torch.float32)[:, None]
    rb.extend(
        {
            "achieved_goal": ids.expand(n, 3).contiguous(),
            "desired_goal": torch.full((n, 3), -7.0),
            "next_achieved_goal": (ids + 0.5).expand(n, 3).contiguous(),
            "next_desired_goal": torch.full((n, 3), -7.0),
            "reward": torch.full((n,), -3.0),
            "terminated": torch.from_numpy(rng.random(n) < 0.1),
        }
    )
    return start + n


def grid_stream(rb: ReplayBuffer, rng: np.random.Generator, steps: int, envs: int, start: int) -> int:
    """Goals of shape ``[2, 2]`` (float32), a float32 reward."""
    n = steps * envs
    ids = torch.arange(start, start + n, dtype=torch.float32)[:, None, None]
    rb.extend(
        {
            "desired_goal": torch.full((n, 2, 2), -7.0),
            "next_achieved_goal": (ids + torch.tensor([[0.5, 1.0], [2.0, 3.0]])).contiguous(),
            "reward": torch.full((n,), -3.0),
            "terminated": torch.from_numpy(rng.random(n) < 0.1),
        }
    )
    return start + n


def grid_gap(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    assert achieved.shape[1:] == desired.shape[1:] == (2, 2)
    return (desired[:, 1, 0] - achieved[:, 1, 0]).astype(np.float32)


def assert_same(a, b) -> None:
    keys = list(a.keys(include_nested=True, leaves_only=True))
    assert keys == list(b.keys(include_nested=True, leaves_only=True))
    assert a.batch_size == b.batch_size and a.device == b.device
    for key in keys:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def needs_kernel() -> None:
    if her_records.kernel() is None:
        pytest.skip("numba is not installed (or XPBANK_NO_NUMBA is set): only the NumPy pass runs")


@pytest.mark.parametrize("strategy", ["future", "final"])
@pytest.mark.parametrize("envs", [1, 3])
@pytest.mark.parametrize("stream", [nested_stream, flat_stream, words_stream, grid_stream])
@pytest.mark.parametrize("compiled", [True, False])
def test_the_fast_path_gives_the_general_batch(
    strategy: str, envs: int, stream, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if compiled:
        needs_kernel()
    else:  # the NumPy pass (numba missing)
        monkeypatch.setattr(her_records, "_compiled", [None])
    rng = np.random.default_rng(envs)
    rbs = []
    for fast in (True, False):
        her = HerSampler(strategy=strategy, compute_reward=grid_gap if stream is grid_stream else gap)
        rb = ReplayBuffer(90, num_envs=envs, seed=11, sampler=her)
        rb._fast_read = fast
        rbs.append(rb)
    written = 0
    for step in range(25):  # past several ring wraps, open and closed episodes
        steps = int(rng.integers(1, 9))
        state = rng.bit_generator.state
        for rb in rbs:
            rng.bit_generator.state = state
            end = stream(rb, rng, steps, envs, written)
        written = end
        for b in (1, 4, 37):
            got, want = rbs[0].sample(b), rbs[1].sample(b)
            assert_same(got, want)
        assert torch.equal(rbs[0]._generator.get_state(), rbs[1]._generator.get_state())
        if step == 12:
            for rb in rbs:
                rb.clear()
            written = 0
    layout = rbs[0].sampler._records
    assert layout is not None and layout.usable  # the fast path was taken
    assert rbs[1].sampler._records is None


@pytest.mark.parametrize(("shape", "dtype"), [((1,), torch.float32), ((), torch.float64), ((), torch.bool)])
def test_a_reward_field_of_any_layout_gets_the_general_rewards(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """The rewards go into the records as one column of the rows (a scalar reward whose
    offset and row fit its itemsize) or through the field (here: a reward of shape
    ``[1]``); either way the general path's batch, cast to the field's dtype."""
    rng = np.random.default_rng(8)
    rbs = []
    for fast in (True, False):
        rb = ReplayBuffer(60, num_envs=2, seed=4, sampler=HerSampler(compute_reward=gap))
        rb._fast_read = fast
        rbs.append(rb)
    for step in range(6):
        n = 2 * int(rng.integers(1, 9))
        ids = torch.arange(step * 100, step * 100 + n, dtype=torch.float32)[:, None]
        data = {
            "desired_goal": torch.full((n, 3), -7.0),
            "next_achieved_goal": (ids + 0.5).expand(n, 3).contiguous(),
            "reward": torch.zeros((n, *shape), dtype=dtype),
            "terminated": torch.from_numpy(rng.random(n) < 0.2),
        }
        for rb in rbs:
            rb.extend(data)
        for b in (2, 37):
            assert_same(rbs[0].sample(b), rbs[1].sample(b))
    layout = rbs[0].sampler._records
    assert layout is not None and layout.usable
    assert (layout.reward_at < 0) == (shape != ())


@pytest.mark.parametrize(
    "case",
    ["compute_terminated", "info_keys", "episode", "prioritized", "nstep"],
)
def test_other_cases_decline_before_drawing(case: str) -> None:
    rng = np.random.default_rng(1)
    rbs = []
    for fast in (True, False):
        kw: dict = {"compute_reward": gap}
        if case == "compute_terminated":
            kw["compute_terminated"] = lambda a, d, i: a[..., 0] == d[..., 0]
        if case == "info_keys":
            kw["info_keys"] = ["index"]
        if case == "episode":
            kw["strategy"] = "episode"
        base = PrioritizedSampler() if case == "prioritized" else None
        nstep = NStep(2, 0.9) if case == "nstep" else None
        rb = ReplayBuffer(40, num_envs=2, seed=2, sampler=HerSampler(base, **kw), nstep=nstep)
        rb._fast_read = fast
        rbs.append(rb)
    state = rng.bit_generator.state
    for rb in rbs:
        rng.bit_generator.state = state
        nested_stream(rb, rng, 15, 2, 0)
    for _ in range(3):
        assert_same(rbs[0].sample(20), rbs[1].sample(20))
    layout = rbs[0].sampler._records
    assert layout is None  # declined before looking at the records


def test_a_reward_of_the_wrong_size_is_refused() -> None:
    rb = ReplayBuffer(40, num_envs=2, seed=2, sampler=HerSampler(compute_reward=lambda a, d, i: np.zeros(3)))
    nested_stream(rb, np.random.default_rng(0), 10, 2, 0)
    with pytest.raises(SpecError, match="compute_reward must return one value per item"):
        rb.sample(16)


def test_the_loop_runs_as_python_and_compiled_alike() -> None:
    """The kernel's source run as plain Python (what a machine without numba could check)
    gives what the compiled kernel gives, and its goals are the chosen steps' rows."""
    needs_kernel()
    rng = np.random.default_rng(4)
    c, w = 12, 5
    src = rng.integers(0, 2**32, (c, w), dtype=np.uint64).astype(np.uint32)
    rows = rng.integers(0, c, 9)
    left = rng.integers(0, 4, c)  # 0: open episodes
    uniform = rng.random(6)
    outs = []
    for run in (her_records._records_loop, her_records.kernel()):
        out, ids, goal_ids = np.zeros((9, w), np.uint32), np.zeros(9, np.int64), np.zeros(9, np.int64)
        goal, reached = np.zeros((6, 2), np.uint32), np.zeros((6, 2), np.uint32)
        # the ring wrapped: the oldest live id is 29 (slot 5), the newest 40; goals: words 3-4
        args = (uniform, left, 1, 41, False, 3, np.array([0]), out, goal, reached, ids, goal_ids)
        run(src, rows, 29, *args)
        outs.append((out, goal, reached, ids, goal_ids))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)
    out, goal, reached, ids, goal_ids = outs[0]
    np.testing.assert_array_equal(ids % c, rows)
    assert ids.min() >= 29 and ids.max() <= 40
    assert (goal_ids[6:] == -1).all() and (goal_ids[:6] >= ids[:6]).all()
    np.testing.assert_array_equal(goal, src[goal_ids[:6] % c, 3:5])
    np.testing.assert_array_equal(reached, src[rows[:6], 3:5])
    np.testing.assert_array_equal(out[:6, 0:2], goal)  # the goal over the record's words 0..1
    np.testing.assert_array_equal(out[:6, 2:], src[rows[:6], 2:])
    np.testing.assert_array_equal(out[6:], src[rows[6:]])


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_every_relabel_fraction_and_a_pickled_buffer(fraction: float) -> None:
    """No item relabelled (no offsets drawn), half, every one; a pickled buffer's sampler
    makes its layout again and draws the same batch."""
    import pickle

    rng = np.random.default_rng(3)
    rbs = []
    for fast in (True, False):
        rb = ReplayBuffer(
            70, num_envs=2, seed=5, sampler=HerSampler(relabel_fraction=fraction, compute_reward=gap)
        )
        rb._fast_read = fast
        rbs.append(rb)
    state = rng.bit_generator.state
    for rb in rbs:
        rng.bit_generator.state = state
        nested_stream(rb, rng, 50, 2, 0)  # 100 items in 70 slots: wrapped
    for b in (1, 2, 64):
        assert_same(rbs[0].sample(b), rbs[1].sample(b))
    assert rbs[0].sampler._records.usable
    copy = pickle.loads(pickle.dumps(rbs[0]))
    assert copy.sampler._records is None
    assert_same(copy.sample(33), rbs[1].sample(33))
    assert copy.sampler._records is not None and copy.sampler._records.usable


def test_a_subclass_that_relabels_its_own_way_takes_the_general_path() -> None:

    class Shifted(HerSampler):
        def relabel(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            flat = super().relabel(*args, **kwargs)
            flat[("next", "reward")] += 100.0
            return flat

    rb = ReplayBuffer(40, num_envs=2, seed=2, sampler=Shifted(compute_reward=gap))
    nested_stream(rb, np.random.default_rng(0), 10, 2, 0)
    batch = rb.sample(16)
    assert rb.sampler._records is None
    assert (batch["next", "reward"] >= 90.0).all()


@pytest.mark.parametrize("size", [1, 5, 90, 1_000_000, 2**28 - 1])
def test_the_fused_draw_takes_the_two_draws_words(size: int) -> None:
    """One full-range int64 draw, decoded, is the uniform base sampler's slot draw then the
    goal offsets' float64 draw, and leaves the generator where those two leave it."""
    layout = her_records.RecordLayout.__new__(her_records.RecordLayout)
    layout.draw = None
    for b, m in ((2, 1), (64, 51), (256, 204), (8, 0)):
        gen = torch.Generator().manual_seed(size + b)
        start = gen.get_state()
        want_slots = torch.randint(0, size, (b,), generator=gen)
        want_u = torch.rand(m, generator=gen, dtype=torch.float64)
        end = gen.get_state()
        gen.set_state(start)
        raw = her_records.fused_draw(layout, size, b, m, gen)
        assert raw is not None and raw.shape == (b // 2 + m,)
        assert torch.equal(gen.get_state(), end)
        rows, uniform = np.empty(b, dtype=np.int64), np.empty(m, dtype=np.float64)
        her_records._decode(raw, rows, size, uniform)
        np.testing.assert_array_equal(rows, want_slots.numpy())
        np.testing.assert_array_equal(uniform, want_u.numpy())


@pytest.mark.parametrize(("size", "b"), [(100, 7), (2**28, 8), (0, 8)])
def test_the_fused_draw_declines_before_drawing(size: int, b: int) -> None:
    layout = her_records.RecordLayout.__new__(her_records.RecordLayout)
    layout.draw = None
    gen = torch.Generator().manual_seed(0)
    start = gen.get_state()
    assert her_records.fused_draw(layout, size, b, 3, gen) is None
    assert torch.equal(gen.get_state(), start)
