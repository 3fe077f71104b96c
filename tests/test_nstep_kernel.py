"""The compiled n-step kernel (numba, ``xpbank.nstep.kernel``) against the NumPy path:
the same batch, bit for bit, on random streams (lockstep and env-id mode, both kinds of
episode end, ring wraps, the newest items, duplicate ids, every n from 1 to 5), plus the
switches that turn it off. The NumPy path runs here too (the kernel switched off by a
fixture), so CI covers both whether or not numba is installed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from xpbank import NStep, ReplayBuffer, nstep_sum
from xpbank.nstep import kernel as nstep_kernel

needs_kernel = pytest.mark.skipif(
    nstep_kernel.kernel() is None, reason="numba not installed, or XPBANK_NO_NUMBA=1"
)


@pytest.fixture
def kernel_off(monkeypatch: pytest.MonkeyPatch):
    """A context manager: the kernel switched off (the NumPy path) inside it."""

    @contextlib.contextmanager
    def off(*buffers: ReplayBuffer):
        # (NStep's cached fused entry is valid only for the kernel it was made with, so
        # switching _compiled is enough; ``buffers`` names the buffers sampled inside)
        with monkeypatch.context() as m:
            m.setattr(nstep_kernel, "_compiled", [None])
            yield

    return off


def _fill(rb: ReplayBuffer, rng: np.random.Generator, steps: int, case: tuple) -> None:
    """``steps`` writes of random size (lockstep: whole env steps), random rewards and ends."""
    envs, env_field, torchrl, dtype = case
    for _ in range(steps):
        k = int(rng.integers(1, 4)) * envs
        reward = rng.normal(size=k) * 10.0 ** rng.integers(-3, 4, size=k)
        term = rng.random(k) < 0.15
        trunc = (rng.random(k) < 0.1) & ~term
        obs = torch.as_tensor(rng.normal(size=(k, 2)), dtype=torch.float32)
        if torchrl:
            batch = {"observation": obs, ("next", "observation"): obs + 1,
                     ("next", "reward"): torch.as_tensor(reward, dtype=torch.float32)[:, None],
                     ("next", "terminated"): torch.as_tensor(term)[:, None],
                     ("next", "truncated"): torch.as_tensor(trunc)[:, None]}  # fmt: skip
        else:
            batch = {"obs": obs, "next_obs": obs + 1, "reward": torch.as_tensor(reward, dtype=dtype),
                     "terminated": torch.as_tensor(term), "truncated": torch.as_tensor(trunc)}  # fmt: skip
        if env_field:
            batch["env_id"] = torch.as_tensor(rng.integers(0, envs, size=k))
        rb.extend(batch)


def _assert_same(a: dict, b: dict) -> None:
    assert set(a.keys()) == set(b.keys())
    for key in a:
        x, y = a[key], b[key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), (key, x, y)  # exact: same slots, flags and float64 sum order


CASES = [  # (num_envs, env_field, torchrl keys, reward dtype)
    (1, False, False, torch.float32),
    (4, False, False, torch.float32),
    (3, True, False, torch.float64),
    (4, False, True, torch.float32),
    (1, True, True, torch.float32),
]


@needs_kernel
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_kernel_matches_numpy_path(case: int, n: int, kernel_off) -> None:
    envs, env_field = CASES[case][:2]
    rng = np.random.default_rng(100 * case + n)
    for trial in range(3):
        capacity = int(rng.integers(8, 40)) * envs  # small: the ring wraps many times
        rb = ReplayBuffer(capacity, num_envs=None if env_field else envs, nstep=NStep(n, 0.9), seed=trial)
        for _ in range(4):
            _fill(rb, rng, int(rng.integers(1, 30)), CASES[case])
            if rng.random() < 0.3:
                rb.episodes.truncate_newest()
            ring, storage = rb._ring, rb._storage
            live = np.arange(ring.first_id, ring.next_id)
            newest = live[-envs:]
            ids = np.concatenate([live, rng.choice(live, size=64), newest, newest])  # duplicates
            ids_t = torch.from_numpy(ids)
            slots = ids_t % capacity
            fast = rb._nstep.gather(storage, ring, slots, ids_t, None)
            with kernel_off(rb):
                slow = rb._nstep.gather(storage, ring, slots, ids_t, None)
            assert nstep_kernel.kernel() is not None
            _assert_same(fast, slow)
            assert fast["nstep_steps"].min() >= 1 and fast["nstep_steps"].max() <= n


@needs_kernel
def test_kernel_window_against_brute_force() -> None:
    """The kernel on a hand-made index against a loop over the links written here:
    windows stop at ``next == -1`` and after ``n`` steps; terminated zeroes the discount,
    truncated keeps it; lockstep stride and link-following agree."""
    rng = np.random.default_rng(7)
    c, e, powers = 24, 3, 0.8 ** np.arange(5.0)
    first = 30  # live ids 30 .. 53: slots wrap
    nxt = np.full(c, -1)
    term = rng.random(c) < 0.2
    trunc = (rng.random(c) < 0.2) & ~term
    for i in range(first, first + c - e):
        if not (term[i % c] or trunc[i % c]):
            nxt[i % c] = i + e
    reward = rng.normal(size=(c, 2))[:, 0]  # a strided view
    ids = rng.integers(first, first + c, size=50)
    for lockstep in (e, 0):
        flags = nstep_kernel.flags_view(np.stack([term, trunc], axis=1))
        pair, steps, ret, disc, done = nstep_kernel.nstep_window(
            ids, lockstep, c, first + c, nxt, flags, reward, powers
        )
        for row, item in enumerate(ids.tolist()):
            acc, k, cur = 0.0, 0, item
            while True:
                acc += powers[k] * reward[cur % c]
                k += 1
                if k == 4 or nxt[cur % c] < 0:
                    break
                cur = int(nxt[cur % c])
            assert (pair[row], pair[50 + row], steps[row]) == (item % c, cur % c, k)
            assert ret[row] == np.float32(acc) and done[row] == term[cur % c]
            assert disc[row] == (0.0 if term[cur % c] else np.float32(powers[k]))


@needs_kernel
def test_numpy_path_when_reward_has_no_float_host_view(kernel_off) -> None:
    """bfloat16 rewards (no NumPy dtype) take the NumPy path even with numba: same batch."""
    rb = ReplayBuffer(64, num_envs=2, nstep=NStep(3, 0.9), seed=0)
    rng = np.random.default_rng(0)
    for _ in range(40):
        rb.extend({"obs": torch.zeros(2, 1), "reward": torch.as_tensor(rng.normal(size=2)).bfloat16(),
                   "terminated": torch.as_tensor(rng.random(2) < 0.2)})  # fmt: skip
    ids = torch.arange(rb._ring.first_id, rb._ring.next_id)
    fast = rb._nstep.gather(rb._storage, rb._ring, ids % 64, ids, None)
    with kernel_off(rb):
        slow = rb._nstep.gather(rb._storage, rb._ring, ids % 64, ids, None)
    _assert_same(fast, slow)


def test_env_var_switches_the_kernel_off() -> None:
    code = "from xpbank.nstep import kernel as k; print(k.DISABLED, k.kernel())"
    env = {**os.environ, "XPBANK_NO_NUMBA": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "None"], out.stderr


def test_nstep_window_without_numba_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nstep_kernel, "_compiled", [None])
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(RuntimeError, match="numba is not available"):
        nstep_kernel.nstep_window(one, 1, 1, 1, one, one.view(np.uint16)[:1], np.zeros(1), np.ones(2))


def test_numpy_sum_is_the_kernels_order_bit_for_bit() -> None:
    """``nstep_sum`` (the NumPy path) adds ``powers[j] * r_j`` in float64 one step after
    another, step 0 first, as the kernel (and the tests' models) do. Regression: it was one
    ``np.dot`` (BLAS dgemv: blocked, fused multiply-adds), whose float64 sums differ in the
    last bit for ~40% of items, and so their float32 returns for ~1 in 7,000."""
    rng = np.random.default_rng(0)
    n, b = 4, 100_000
    powers = 0.9 ** np.arange(n + 1, dtype=np.float64)
    by_step = rng.normal(size=(n, b)).astype(np.float32)
    past = np.zeros((n - 1, b), dtype=bool)
    past[2, : b // 2] = True  # half the windows end after 3 steps
    steps = np.where(past[2], 3, 4)
    expected = np.zeros(b)
    for j in range(n):
        expected += powers[j] * np.where(j and past[j - 1], np.float32(0), by_step[j]).astype(np.float64)
    ret, _ = nstep_sum(by_step.copy(), past, steps, np.zeros(b, dtype=bool), powers)
    assert np.array_equal(ret.view(np.int32), expected.astype(np.float32).view(np.int32))
