"""The compiled hindsight draw (``xpbank.her.kernel``) against the NumPy path, to the bit.

The kernel's loop also runs as plain Python (as the doctest does), so the comparison of
the loop with :func:`choose_goals` and :class:`GoalReader` runs without numba too; the
end-to-end comparison of two buffers (kernel on, kernel off) needs numba.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xpbank import Field, PrioritizedSampler, ReplayBuffer, Spec
from xpbank.her import HerSampler
from xpbank.her import kernel as her_kernel
from xpbank.her.goals import choose_goals, ends_table
from xpbank.her.relabel import GoalReader
from xpbank.storage.tensor import TensorStorage


def gap(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    return (desired[:, 0] - achieved[:, 0]).astype(np.float32)


def stream(rb: ReplayBuffer, rng: np.random.Generator, steps: int, envs: int, start: int) -> int:
    n = steps * envs
    term = rng.random(n) < 0.08
    ids = torch.arange(start, start + n, dtype=torch.float32)
    rb.extend(
        {
            "achieved_goal": ids[:, None].repeat(1, 3),
            "next_achieved_goal": ids[:, None].repeat(1, 3) + 0.5,
            "desired_goal": torch.full((n, 3), -7.0),
            "next_desired_goal": torch.full((n, 3), -7.0),
            "reward": torch.full((n,), -3.0),
            "terminated": torch.from_numpy(term),
            "truncated": torch.from_numpy((rng.random(n) < 0.05) & ~term),
        }
    )
    return start + n


@pytest.mark.parametrize("strategy", ["future", "final"])
@pytest.mark.parametrize("envs", [1, 3])
def test_the_loop_gives_choose_goals_and_the_goal_reader(strategy: str, envs: int) -> None:
    rng = np.random.default_rng(envs)
    rb = ReplayBuffer(60, num_envs=envs, seed=0, sampler=HerSampler(strategy=strategy, compute_reward=gap))
    written = 0
    for _ in range(25):  # wraps the ring many times; open episodes at the end of each write
        written = stream(rb, rng, int(rng.integers(1, 6)), envs, written)
        ring, eps = rb._ring, rb.episodes
        ids = rng.integers(ring.first_id, ring.next_id, 40).astype(np.int64)
        slots = ids % ring.capacity
        u = rng.random(40)
        want = choose_goals(eps, ring, ids, strategy, u, envs)
        reader = GoalReader("next_achieved_goal")
        host, words = reader.host(rb.storage)  # type: ignore[misc]
        got_ids = np.zeros(40, dtype=np.int64)
        rows = np.zeros((40, words.shape[1]), dtype=words.dtype)
        left = ends_table(eps, ring, envs).left
        her_kernel._goals_loop(
            ids, slots, u, left, envs, ring.capacity, ring.next_id, strategy == "final", words, rows, got_ids,
            np.zeros(40, dtype=np.int64), 3,
        )  # fmt: skip
        np.testing.assert_array_equal(got_ids, want)
        np.testing.assert_array_equal(rows.view(host.dtype), reader(rb.storage, want % ring.capacity))
        goal_slots = her_kernel.choose_rows(
            words, ids, slots, u, left, envs, ring.capacity, ring.next_id, strategy == "final", got_ids
        )
        if goal_slots is not None:
            compiled = her_kernel.copy_rows(words, host, goal_slots)
            np.testing.assert_array_equal(got_ids, want)
            np.testing.assert_array_equal(compiled, reader(rb.storage, want % ring.capacity))


def test_word_rows_copy_every_plain_dtype_and_shape() -> None:
    spec = Spec(
        {
            "f": Field((3,)),
            "d": Field((2,), torch.float64),
            "m": Field((2, 2), torch.int16),
            "b": Field((2,), torch.bool),
            "s": Field((), torch.int32),
        }
    )
    st = TensorStorage(30, spec)
    gen = torch.Generator().manual_seed(0)
    st.write(
        slice(0, 30),
        {
            "f": torch.rand(30, 3, generator=gen),
            "d": torch.rand(30, 2, generator=gen, dtype=torch.float64),
            "m": torch.randint(-9, 9, (30, 2, 2), generator=gen, dtype=torch.int16),
            "b": torch.rand(30, 2, generator=gen) < 0.5,
            "s": torch.randint(-9, 9, (30,), generator=gen, dtype=torch.int32),
        },
    )
    rows = np.array([29, 0, 7, 7, 13], dtype=np.int64)
    for key in spec:
        host = st.host_view(key)
        assert host is not None
        words = her_kernel.word_rows(host)
        assert words is not None, key
        assert np.shares_memory(words, host), key  # a view, never a copy
        want = st.gather(torch.from_numpy(rows), [key])[key].numpy()
        np.testing.assert_array_equal(words[rows].view(host.dtype).reshape(want.shape), want)


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
@pytest.mark.parametrize("prioritized", [False, True])
def test_a_buffer_samples_the_same_with_and_without_the_kernel(
    strategy: str, prioritized: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if her_kernel.kernel() is None:
        pytest.skip("numba is not installed (or XPBANK_NO_NUMBA is set): only the NumPy path runs")
    batches = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(her_kernel, "_compiled", [None])
        rng = np.random.default_rng(5)
        base = PrioritizedSampler() if prioritized else None
        her = HerSampler(base, strategy=strategy, compute_reward=gap)
        rb = ReplayBuffer(80, num_envs=4, seed=3, sampler=her)
        written, out = 0, []
        for _ in range(12):
            written = stream(rb, rng, int(rng.integers(1, 8)), 4, written)
            out.append(rb.sample(50))
        batches.append(out)
    for a, b in zip(*batches, strict=True):
        assert list(a.keys(include_nested=True)) == list(b.keys(include_nested=True))
        for key in a.keys(include_nested=True, leaves_only=True):
            assert torch.equal(a[key], b[key]), key


def test_a_pickled_buffer_draws_the_same_goals() -> None:
    import copy
    import pickle

    rng = np.random.default_rng(2)
    rb = ReplayBuffer(60, num_envs=2, seed=4, sampler=HerSampler(compute_reward=gap))
    stream(rb, rng, 20, 2, 0)
    rb.sample(16)  # the sampler's caches are made
    for other in (pickle.loads(pickle.dumps(rb)), copy.deepcopy(rb)):
        state = rb._generator.get_state()
        a = rb.sample(16)
        rb._generator.set_state(state)
        other._generator.set_state(state)
        b = other.sample(16)
        for key in a.keys(include_nested=True, leaves_only=True):
            assert torch.equal(a[key], b[key]), key
