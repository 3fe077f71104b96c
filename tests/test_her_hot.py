"""The HER read fast path's kept state (her/records.py, her/shot.py): the goals handed to
``compute_reward`` and the sampler's last Shot (``her._hot``).

A fast batch must equal the general path's (``rb._fast_read = False``) bit for bit, also
for a dense reward computed from random float goals (the fast path hands goals of fewer
than 8 numbers in Fortran order), and a setting changed between samples must apply to
the next sample, as in the general path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from xpbank import ReplayBuffer
from xpbank.her import HerSampler


def distance(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    """A dense reward: minus the goal distance (gymnasium-robotics' ``goal_distance``)."""
    return -np.linalg.norm(achieved - desired, axis=-1)


def manhattan(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    return -np.abs(achieved - desired).sum(axis=-1, dtype=np.float32)


def sparse(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.5).astype(np.float32)


def pair(
    reward: Callable[..., np.ndarray], envs: int = 2, capacity: int = 120, **her: object
) -> list[ReplayBuffer]:
    """A fast and a general buffer, same seed and sampler settings."""
    rbs = []
    for fast in (True, False):
        sampler = HerSampler(compute_reward=reward, **her)  # type: ignore[arg-type]
        rb = ReplayBuffer(capacity, num_envs=envs, seed=3, sampler=sampler)
        rb._fast_read = fast
        rbs.append(rb)
    return rbs


def feed(rbs: list[ReplayBuffer], rng: np.random.Generator, steps: int, envs: int, g: int) -> None:
    """``steps`` lockstep steps of random float32 goals of ``g`` numbers, into each buffer."""
    n = steps * envs
    goal = rng.standard_normal((n, g), dtype=np.float32)
    data = {
        "achieved_goal": torch.from_numpy(goal),
        "desired_goal": torch.from_numpy(rng.standard_normal((n, g), dtype=np.float32)),
        "next_achieved_goal": torch.from_numpy(goal + rng.standard_normal((n, g), dtype=np.float32)),
        "next_desired_goal": torch.from_numpy(rng.standard_normal((n, g), dtype=np.float32)),
        "reward": torch.full((n,), -1.0),
        "terminated": torch.from_numpy(rng.random(n) < 0.1),
    }
    for rb in rbs:
        rb.extend(data)


def assert_same(a, b) -> None:
    keys = list(a.keys(include_nested=True, leaves_only=True))
    assert keys == list(b.keys(include_nested=True, leaves_only=True))
    for key in keys:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("g", [1, 3, 7, 8, 16])
@pytest.mark.parametrize("reward", [distance, manhattan])
def test_a_dense_reward_of_random_goals_is_the_general_paths(g: int, reward) -> None:
    rng = np.random.default_rng(g)
    rbs = pair(reward)
    for _ in range(12):  # past ring wraps, open and closed episodes
        feed(rbs, rng, int(rng.integers(1, 9)), 2, g)
        a, b = rbs[0].sample(16), rbs[1].sample(16)
        assert_same(a, b)
        assert (a["her_goal"][:12] >= 0).all()  # relabelled: the reward is compute_reward's
    assert rbs[0]._sampler._hot is not None  # (the fast path ran)


def test_compute_reward_gets_goal_arrays_of_the_goals_shape_and_dtype() -> None:
    seen = []

    def reward(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
        seen.append((achieved.shape, desired.shape, achieved.dtype, desired.dtype, info))
        return distance(achieved, desired, info)

    rng = np.random.default_rng(0)
    rbs = pair(reward)
    feed(rbs, rng, 20, 2, 3)
    assert_same(rbs[0].sample(10), rbs[1].sample(10))
    assert seen[0] == seen[1] == ((8, 3), (8, 3), np.float32, np.float32, None)


def test_a_setting_changed_between_samples_applies_to_the_next() -> None:
    rng = np.random.default_rng(5)
    rbs = pair(sparse)
    feed(rbs, rng, 30, 2, 3)
    changes: list[tuple[str, object]] = [
        ("strategy", "final"),
        ("compute_reward", distance),
        ("relabel_fraction", 0.5),
        ("strategy", "episode"),  # the general path's only
        ("strategy", "future"),
        ("compute_reward", manhattan),
    ]
    for name, value in changes:
        for _ in range(2):
            assert_same(rbs[0].sample(12), rbs[1].sample(12))
        for rb in rbs:
            setattr(rb._sampler, name, value)
            assert rb._sampler._hot is None
        feed(rbs, rng, 2, 2, 3)
    assert_same(rbs[0].sample(12), rbs[1].sample(12))


def test_a_subclass_that_relabels_itself_takes_the_general_path() -> None:
    class Mine(HerSampler):
        def relabel(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super().relabel(*args, **kwargs)

    rb = ReplayBuffer(60, num_envs=2, seed=1, sampler=Mine(compute_reward=sparse))
    feed([rb], np.random.default_rng(1), 20, 2, 3)
    rb.sample(8)
    assert rb._sampler._hot is None and rb._sampler.sample_records(None, None, 8, None) is None
