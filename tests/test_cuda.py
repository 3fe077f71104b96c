"""Every CUDA path against its CPU twin: the same writes on a CPU buffer and on one that
stores on (or delivers to) CUDA hold the same items, give rows that match by id, and
compute the same targets (floats computed on the GPU within a stated tolerance).

Each test also runs with ``dev="cpu"``, where the twin is the plain buffer: that run
checks the test's own logic on machines without a GPU. ``pytest -m cuda`` runs the CUDA
ones (skipped without a CUDA device).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import xpbank
from helpers import make_batch, transition_spec
from xpbank import (
    Field,
    NStep,
    PrioritizedSampler,
    ReplayBuffer,
    RolloutBuffer,
    SequenceSampler,
    Spec,
    StaleIndexError,
    Table,
    TensorStorage,
    XpbankError,
)
from xpbank.spec.batch import flatten

CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
)
DEVICES = ["cpu", CUDA]
SPEC = transition_spec()
# float targets computed by CUDA kernels: other reduction orders and fused multiply-adds
CLOSE = {"rtol": 1e-5, "atol": 1e-5}


def _on(batch: dict[Any, torch.Tensor], device: str, keys: Any = None) -> dict[Any, torch.Tensor]:
    """``batch`` with the values of ``keys`` (default: all) moved to ``device``."""
    return {k: v.to(device) if keys is None or k in keys else v for k, v in batch.items()}


def _cpu(td: Any) -> dict[Any, torch.Tensor]:
    return {k: v.cpu() for k, v in flatten(td).items()}


def _same(a: dict[Any, torch.Tensor], b: dict[Any, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


def _all_on(td: Any, device: str) -> None:
    for key, value in flatten(td).items():
        assert value.device.type == device, (key, value.device)


def _by_id(rb: Any, ids: torch.Tensor) -> Any:
    """The items of ids ``ids`` (``sample_by_index`` takes positions: 0 is the oldest)."""
    oldest = int(rb.sample_by_index([0])["index"][0])
    return rb.sample_by_index(ids.cpu() - oldest)


def _rows_match(rb: ReplayBuffer, ref: ReplayBuffer, td: Any) -> None:
    """Every row of ``td`` is the reference's row of the same id, bit for bit."""
    got = _cpu(td)
    _same(got, _cpu(_by_id(ref, got["index"])))


def _write_both(rb: ReplayBuffer, ref: ReplayBuffer, dev: str) -> None:
    """18 items into capacity 10 (the ring wraps): CPU tensors, device tensors, fields on
    two devices in one batch, NumPy arrays and single items."""
    writes = [
        make_batch(SPEC, 4, 0),
        _on(make_batch(SPEC, 5, 4), dev),
        _on(make_batch(SPEC, 3, 9), dev, keys={"obs", ("next", "obs")}),
        {k: v.numpy() for k, v in make_batch(SPEC, 2, 12).items()},
    ]
    for batch in writes:
        assert rb.extend(batch) == ref.extend({k: torch.as_tensor(v).cpu() for k, v in batch.items()})
    for i in range(14, 18):
        item = {k: v[0] for k, v in _on(make_batch(SPEC, 1, i), dev).items()}
        assert rb.add(item) == ref.add({k: v.cpu() for k, v in item.items()})


# -- uniform replay: storing on, or delivering to, the device -------------------------
@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("where", ["storing", "delivering", "storage-unpacked"])
def test_replay_twin(dev: str, where: str) -> None:
    if where == "storing":
        rb = ReplayBuffer(10, SPEC, storing_device=dev, seed=0)
    elif where == "delivering":
        rb = ReplayBuffer(10, SPEC, device=dev, seed=0)
    else:
        rb = ReplayBuffer(10, SPEC, storage=TensorStorage(10, SPEC, device=dev, pack=False), seed=0)
    ref = ReplayBuffer(10, SPEC, seed=0)
    _write_both(rb, ref, dev)
    assert len(rb) == len(ref) == 10 and rb.is_full
    _same(_cpu(rb.sample_all()), _cpu(ref.sample_all()))
    # the same seed draws the same ids wherever the data lives
    _same(_cpu(rb.sample(6)), _cpu(ref.sample(6)))
    for td in (
        rb.sample(8),
        rb.sample(5, replace=False),
        rb.sample_by_index([9, -10, 3]),
        rb.sample_by_index(torch.tensor([1, -1], device=dev)),
        next(rb.epochs(4)),
    ):
        _all_on(td, dev)
        _rows_match(rb, ref, td)

    ids = rb.sample(4)["index"]
    new = {"reward": -torch.arange(4, dtype=torch.float32, device=dev) - 1}
    rb.update(ids, new)
    ref.update(ids.cpu(), {"reward": new["reward"].cpu()})
    _same(_cpu(rb.sample_all()), _cpu(ref.sample_all()))

    back = ReplayBuffer(10, SPEC)
    back.load_state_dict(rb.state_dict())
    _same(_cpu(back.sample_all()), _cpu(ref.sample_all()))


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize(
    "bad",
    [
        {"obs": torch.zeros(2, 4)},  # shape
        {"action": torch.zeros(2)},  # dtype: float into int64
        {"reward": torch.zeros(3)},  # batch size
    ],
    ids=["shape", "dtype", "batch"],
)
def test_bad_device_batches_leave_the_buffer_as_it_was(dev: str, bad: dict[str, torch.Tensor]) -> None:
    rb = ReplayBuffer(10, SPEC, storing_device=dev, seed=0)
    rb.extend(_on(make_batch(SPEC, 9), dev))
    before = _cpu(rb.sample_all())
    batch = _on({**make_batch(SPEC, 2, 9), **bad}, dev)
    with pytest.raises(XpbankError):
        rb.extend(batch)
    assert len(rb) == 9
    _same(_cpu(rb.sample_all()), before)


# -- prioritized: trees beside the data, priorities and ids from the device -------------
@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("tree_device", [None, "numpy", "cuda"])
def test_prioritized_on_device_draws_by_priority(dev: str, tree_device: str | None) -> None:
    if tree_device == "cuda" and dev == "cpu":
        tree_device = "cpu"
    alpha, beta, n = 0.7, 0.5, 20
    sampler = PrioritizedSampler(alpha=alpha, beta=beta, tree_device=tree_device)
    rb = ReplayBuffer(32, SPEC, storing_device=dev, sampler=sampler, seed=3)
    rb.extend(_on(make_batch(SPEC, n), dev))
    prio = torch.arange(1, n + 1, dtype=torch.float32, device=dev)
    rb.update_priority(torch.arange(n, device=dev), prio)
    counts = torch.zeros(n, dtype=torch.int64)
    draws = 40_000
    for _ in range(draws // 500):
        batch = rb.sample(500)
        _all_on(batch, dev)
        ids, w = batch["index"].cpu(), batch["weight"].cpu().double()
        counts += torch.bincount(ids, minlength=n)
        # weights are (N P(i))^-beta up to one scale: their ratios are the probabilities'
        p = (torch.arange(1, n + 1, dtype=torch.float64) ** alpha)[ids]
        torch.testing.assert_close(w / w[0], (p / p[0]) ** -beta, rtol=1e-4, atol=0)
    want = torch.arange(1, n + 1, dtype=torch.float64) ** alpha
    want = draws * want / want.sum()
    # seeded: each count within 5 sd of its binomial mean (40k draws: ~1.7% of the mean at most)
    sd = (want * (1 - want / draws)).sqrt()
    assert ((counts - want).abs() <= 5 * sd).all(), (counts, want)


@pytest.mark.parametrize("dev", DEVICES)
def test_prioritized_stale_ids_from_the_device_are_refused(dev: str) -> None:
    rb = ReplayBuffer(8, SPEC, storing_device=dev, sampler=PrioritizedSampler(), seed=0)
    rb.extend(_on(make_batch(SPEC, 8), dev))
    ids = rb.sample(4)["index"]
    rb.extend(_on(make_batch(SPEC, 8, 8), dev))  # every slot rewritten
    before = _cpu(rb.sample_all())
    with pytest.raises(StaleIndexError):
        rb.update_priority(ids, torch.ones(4, device=dev))
    rb.update_priority(ids + 8, torch.full((4,), 2.0, device=dev))
    _same(_cpu(rb.sample_all()), before)


# -- n-step and sequences over episode ends of two envs --------------------------------
def _episodes(rb: ReplayBuffer, ref: ReplayBuffer, dev: str, steps: int = 23) -> None:
    g = torch.Generator().manual_seed(5)
    for t in range(steps):
        step = {
            "obs": torch.randn(2, 3, generator=g),
            ("next", "obs"): torch.randn(2, 3, generator=g),
            "action": torch.tensor([t, 100 + t]),
            "reward": torch.randn(2, generator=g),
            "terminated": torch.tensor([t % 7 == 6, t % 5 == 4]),
            "truncated": torch.tensor([t % 11 == 10, False]),
        }
        rb.extend(_on(step, dev))
        ref.extend(step)


@pytest.mark.parametrize("dev", DEVICES)
def test_nstep_targets_on_device_match_the_cpu(dev: str) -> None:
    kw: dict[str, Any] = {"num_envs": 2, "nstep": NStep(3, 0.9), "seed": 1}
    rb = ReplayBuffer(32, SPEC, storing_device=dev, **kw)
    ref = ReplayBuffer(32, SPEC, **kw)
    _episodes(rb, ref, dev)
    _same(_cpu(rb.sample_all()), _cpu(ref.sample_all()))
    td = rb.sample(64)  # the same seed, the same ids: n-step targets computed where the data is
    _all_on(td, dev)
    got, want = _cpu(td), _cpu(ref.sample(64))
    assert set(got) == set(want) and "nstep_return" in got
    for key in want:
        if want[key].is_floating_point():
            torch.testing.assert_close(got[key], want[key], **CLOSE)
        else:
            assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("dev", DEVICES)
def test_sequences_on_device_match_the_cpu(dev: str) -> None:
    rb = ReplayBuffer(40, SPEC, storing_device=dev, num_envs=2, sampler=SequenceSampler(3), seed=2)
    ref = ReplayBuffer(40, SPEC, num_envs=2, sampler=SequenceSampler(3), seed=2)
    _episodes(rb, ref, dev)
    a, b = rb.sample(12), ref.sample(12)
    _all_on(a, dev)
    _same(_cpu(a), _cpu(b))
    actions = a["action"].cpu()
    assert (actions.diff(dim=1) == 1).all()  # consecutive steps of one env, never across an end


# -- rollouts and the return functions ---------------------------------------------------
def _steps(n: int, envs: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "obs": torch.randn(envs, 3, generator=g),
            "reward": torch.randn(envs, generator=g),
            "value": torch.randn(envs, generator=g),
            "terminated": torch.rand(envs, generator=g) < 0.15,
        }
        for _ in range(n)
    ]


@pytest.mark.parametrize("dev", DEVICES)
def test_rollout_returns_and_minibatches_on_device(dev: str) -> None:
    rb, ref = RolloutBuffer(4, 16, device=dev, seed=0), RolloutBuffer(4, 16, seed=0)
    for t, step in enumerate(_steps(16, 4, seed=1)):
        rb.add(_on(step, dev) if t % 2 else step)  # steps from both devices
        ref.add(step)
    last = torch.randn(4)
    adv, ret = rb.compute_returns(last.to(dev), gamma=0.97, lam=0.9)
    want_adv, want_ret = ref.compute_returns(last, gamma=0.97, lam=0.9)
    assert adv.device.type == ret.device.type == dev
    torch.testing.assert_close(adv.cpu(), want_adv, **CLOSE)
    torch.testing.assert_close(ret.cpu(), want_ret, **CLOSE)
    got = list(rb.minibatches(num_minibatches=4, epochs=1, shuffle=False))
    want = list(ref.minibatches(num_minibatches=4, epochs=1, shuffle=False))
    assert len(got) == len(want) == 4
    for x, y in zip(got, want, strict=True):
        _all_on(x, dev)
        torch.testing.assert_close(_cpu(x), _cpu(y), **CLOSE)
    shuffled = torch.cat([mb["obs"].cpu() for mb in rb.minibatches(num_minibatches=3, epochs=1)])
    every = torch.cat([mb["obs"].cpu() for mb in want])
    assert torch.equal(shuffled[shuffled[:, 0].argsort()], every[every[:, 0].argsort()])


@pytest.mark.parametrize("dev", DEVICES)
def test_return_functions_on_device_tensors(dev: str) -> None:
    g = torch.Generator().manual_seed(4)
    t, e = 9, 3
    r, v, nv = (torch.randn(t, e, generator=g) for _ in range(3))
    term, trunc = torch.rand(t, e, generator=g) < 0.2, torch.rand(t, e, generator=g) < 0.1
    blp, tlp = torch.randn(t, e, generator=g), torch.randn(t, e, generator=g)
    cases = [
        (xpbank.gae, (r, v, nv, term, trunc), {"gamma": 0.9, "lam": 0.8}),
        (xpbank.vtrace, (blp, tlp, r, v, nv, term, trunc), {"gamma": 0.9}),
        (xpbank.discounted_returns, (r, term, trunc, nv), {"gamma": 0.9}),
    ]
    for fn, args, kw in cases:
        want = fn(*args, **kw)
        got = fn(*(a.to(dev) for a in args), **kw)
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        for x, y in zip(got, want, strict=True):
            assert x.device.type == dev, fn.__name__
            torch.testing.assert_close(x.cpu(), y, **CLOSE)


# -- hindsight relabelling, mixing and tables -----------------------------------------
def _goal_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    assert isinstance(achieved, np.ndarray) and isinstance(desired, np.ndarray)
    return -(np.abs(achieved - desired).sum(-1) > 0.5).astype(np.float32)


@pytest.mark.parametrize("dev", DEVICES)
def test_her_on_device_relabels_with_future_goals_of_the_episode(dev: str) -> None:
    from xpbank.her import HerSampler

    her = HerSampler(strategy="future", n_sampled_goal=3, compute_reward=_goal_reward)
    rb = ReplayBuffer(64, storing_device=dev, sampler=her, num_envs=1, seed=0)
    g = torch.Generator().manual_seed(0)
    for ep in range(6):
        n = 3 + ep
        pos = torch.randn(n + 1, 2, generator=g)
        rb.extend(
            _on(
                {
                    "achieved_goal": pos[:-1],
                    "next_achieved_goal": pos[1:],
                    "desired_goal": torch.full((n, 2), 9.0),
                    "reward": -torch.ones(n),
                    "episode": torch.full((n,), ep),
                    "terminated": torch.arange(n) == n - 1,
                },
                dev,
            )
        )
    batch = rb.sample(256)
    _all_on(batch, dev)
    got = _cpu(batch)
    goal = got["her_goal"]
    relabelled = goal >= 0
    assert 0.6 < relabelled.float().mean() < 0.9  # k / (k + 1) = 0.75 of 256
    rows = _cpu(_by_id(rb, goal[relabelled]))
    assert torch.equal(rows["episode"], got["episode"][relabelled])  # same episode
    assert (goal[relabelled] >= got["index"][relabelled]).all()  # the future, the item included
    assert torch.equal(got["desired_goal"][relabelled], rows["next_achieved_goal"])
    want = torch.from_numpy(
        _goal_reward(got["next_achieved_goal"].numpy(), got["desired_goal"].numpy(), None)
    )
    assert torch.equal(got["reward"][relabelled], want[relabelled])
    assert (got["reward"][~relabelled] == -1).all() and (got["desired_goal"][~relabelled] == 9).all()


@pytest.mark.parametrize("dev", DEVICES)
def test_mixture_of_a_device_buffer_and_a_cpu_bank(dev: str, tmp_path: Path) -> None:
    online = ReplayBuffer(50, SPEC, storing_device=dev, seed=0)
    online.extend(_on(make_batch(SPEC, 30), dev))
    offline = ReplayBuffer(50, SPEC, seed=1)
    offline.extend(make_batch(SPEC, 40, 1000))
    path = xpbank.save(offline, tmp_path / "offline")
    if dev != "cpu":
        with pytest.raises(xpbank.DeviceError, match="pass device="):
            xpbank.Mixture([online, path], [0.5, 0.5])
    mix = xpbank.Mixture([online, path], [0.5, 0.5], seed=0, device=dev)
    batch = mix.sample(16)
    _all_on(batch, dev)
    got = _cpu(batch)
    assert got["source"].tolist() == [0] * 8 + [1] * 8
    assert (got["action"][:8] < 30).all() and (got["action"][8:] >= 1000).all()
    devices = {v.device for v in flatten(batch).values()}
    assert len(devices) == 1, devices  # one batch, one device
    _same({k: v[:8] for k, v in got.items() if k != "source"}, _cpu(_by_id(online, got["index"][:8])))
    mix.update(batch["source"][:8], batch["index"][:8], {"reward": torch.full((8,), -5.0, device=dev)})
    assert (_by_id(online, got["index"][:8])["reward"] == -5).all()
    in_memory = xpbank.Mixture([online, offline], [0.5, 0.5], seed=0, device=dev)
    batch = in_memory.sample(16)
    _all_on(batch, dev)
    in_memory.update(batch["source"], batch["index"], {"reward": torch.full((16,), 7.0, device=dev)})
    got = _cpu(batch)
    assert (_by_id(online, got["index"][:8])["reward"] == 7).all()
    assert (_by_id(offline, got["index"][8:])["reward"] == 7).all()


@pytest.mark.parametrize("dev", DEVICES)
def test_table_queue_and_prioritized_table_on_device(dev: str) -> None:
    rb = ReplayBuffer(4, storing_device=dev, sampler=Table.queue(), seed=0)
    rb.extend({"obs": torch.arange(3.0, device=dev)})
    batch = rb.sample(2)
    _all_on(batch, dev)
    assert batch["obs"].tolist() == [0.0, 1.0] and len(rb) == 1
    table = Table("prioritized", "fifo", max_times_sampled=2)
    rb = ReplayBuffer(8, storing_device=dev, sampler=table, seed=0)
    rb.extend({"obs": torch.arange(8.0, device=dev)})
    rb.update_priority(torch.arange(8, device=dev), torch.tensor([0.0] * 7 + [1.0], device=dev))
    got = rb.sample(2)
    assert got["obs"].tolist() == [7.0, 7.0] and len(rb) == 7  # sampled twice, then removed


@pytest.mark.parametrize("dev", DEVICES)
def test_heap_table_first_items_and_updates_on_device_as_on_the_cpu(dev: str) -> None:
    """A heap table's sample(replace=False) and priority update: the CPU twin takes the
    compiled small calls (xpbank.table.fast), the device buffer what applies there."""
    devs = ("cpu", dev)
    rbs = [ReplayBuffer(16, storing_device=d, sampler=Table("max_heap"), seed=0) for d in devs]
    for rb, d in zip(rbs, devs, strict=True):
        rb.extend({"obs": torch.arange(10.0, device=d)})
        prios = torch.tensor([3.0, 1, 4, 1, 5, 9, 2, 6, 5, 3], device=d)
        rb.update_priority(torch.arange(10, device=d), prios)
    for step in range(3):
        got = [rb.sample(4, replace=False) for rb in rbs]
        _all_on(got[1], dev)
        assert got[0]["index"].tolist() == got[1]["index"].cpu().tolist()
        assert got[0]["obs"].tolist() == got[1]["obs"].cpu().tolist()
        for rb, d, batch in zip(rbs, devs, got, strict=True):
            rb.update_priority(batch["index"], torch.full((4,), float(step), device=d))


# -- banks and frames -----------------------------------------------------------------
@pytest.mark.parametrize("dev", DEVICES)
def test_bank_of_a_device_buffer_loads_bit_for_bit_anywhere(dev: str, tmp_path: Path) -> None:
    rb = ReplayBuffer(10, SPEC, storing_device=dev, sampler=PrioritizedSampler(), seed=0)
    ref = ReplayBuffer(10, SPEC, seed=0)
    _write_both(rb, ref, dev)
    rb.update_priority(torch.arange(8, 18, device=dev), torch.linspace(0.5, 3.0, 10, device=dev))
    path = xpbank.save(rb, tmp_path / "b")
    for device in ("cpu", dev):
        back = xpbank.load(path, device=device)
        assert back.storage.device.type == device
        _same(_cpu(back.sample_all()), _cpu(ref.sample_all()))
        got = back.sample(64)
        _all_on(got, device)
        w = got["weight"].cpu()
        prio = got["index"].cpu().double() - 8  # priority linspace(0.5, 3.0)[i]
        p = (0.5 + prio * 2.5 / 9) ** 0.6
        torch.testing.assert_close(w / w[0], (p / p[0]).float() ** -0.4, rtol=1e-4, atol=0)


@pytest.mark.parametrize("dev", DEVICES)
def test_frame_storage_delivers_to_the_device_from_device_frames(dev: str) -> None:
    spec = Spec(
        {
            "obs": Field((2, 4, 4), torch.uint8),
            ("next", "obs"): Field((2, 4, 4), torch.uint8),
            "terminated": Field((), torch.bool),
        }
    )
    rb = ReplayBuffer(12, spec, storage=xpbank.FrameStorage(12, spec), device=dev, num_envs=1, seed=0)
    ref = ReplayBuffer(12, spec, num_envs=1, seed=0)
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (20, 4, 4), generator=g, dtype=torch.uint8)
    stack = torch.stack([frames[0], frames[0]])
    for t in range(1, 20):
        nxt = torch.stack([stack[1], frames[t]])
        step = {"obs": stack[None], ("next", "obs"): nxt[None], "terminated": torch.tensor([False])}
        rb.extend(_on(step, dev))
        ref.extend(step)
        stack = nxt
    got = rb.sample_all()
    _all_on(got, dev)
    _same(_cpu(got), _cpu(ref.sample_all()))


# -- the drop-ins on the device, beside the originals on the same device ---------------
@pytest.mark.parametrize("dev", DEVICES)
def test_sb3_buffer_on_device_stores_and_samples_as_sb3(dev: str) -> None:
    pytest.importorskip("stable_baselines3")
    gym = pytest.importorskip("gymnasium")
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    from xpbank.integrations.sb3 import XpbankReplayBuffer

    obs_space, act_space = gym.spaces.Box(-10, 10, (3,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)
    ref = SB3ReplayBuffer(12, obs_space, act_space, dev, n_envs=2)
    buf = XpbankReplayBuffer(12, obs_space, act_space, dev, n_envs=2, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(9):  # 6 rows of 2 envs: wraps
        args = (
            rng.normal(size=(2, 3)).astype(np.float32),
            rng.normal(size=(2, 3)).astype(np.float32),
            rng.uniform(-1, 1, size=(2, 2)).astype(np.float32),
            rng.normal(size=2).astype(np.float32),
            rng.random(2) < 0.3,
            [{"TimeLimit.truncated": bool(rng.random() < 0.3)} for _ in range(2)],
        )
        ref.add(*args)
        buf.add(*args)
    assert (buf.pos, buf.full) == (ref.pos, ref.full)
    s, r = buf.sample(32), ref.sample(32)
    for name in ("observations", "actions", "next_observations", "dones", "rewards"):
        x, y = getattr(s, name), getattr(r, name)
        assert x.device == y.device and x.dtype == y.dtype and x.shape == y.shape, name
    batch = buf.xp.sample_all()
    slots = batch["index"].cpu().numpy() % buf.xp.capacity
    rows, envs = slots // 2, slots % 2
    got = buf.samples_of(batch)
    np.testing.assert_array_equal(got.observations.cpu().numpy(), ref.observations[rows, envs])
    np.testing.assert_array_equal(got.actions.cpu().numpy(), ref.actions[rows, envs])
    np.testing.assert_array_equal(got.rewards.cpu().numpy()[:, 0], ref.rewards[rows, envs])
    want_done = ref.dones[rows, envs] * (1 - ref.timeouts[rows, envs])
    np.testing.assert_array_equal(got.dones.cpu().numpy()[:, 0], want_done)


def _rsl_transitions(cls: Any, dev: str, envs: int, steps: int) -> list[Any]:
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        tr = cls.Transition()
        tr.observations = TensorDict({"policy": torch.randn(envs, 3, generator=g)}, batch_size=[envs]).to(dev)
        tr.actions = torch.randn(envs, 2, generator=g).to(dev)
        tr.rewards = torch.randn(envs, generator=g).to(dev)
        tr.dones = (torch.rand(envs, generator=g) < 0.3).float().to(dev)
        tr.values = torch.randn(envs, 1, generator=g).to(dev)
        tr.actions_log_prob = torch.randn(envs, generator=g).to(dev)
        tr.distribution_params = (
            torch.randn(envs, 2, generator=g).to(dev),
            torch.rand(envs, 2, generator=g).to(dev),
        )
        out.append(tr)
    return out


@pytest.mark.parametrize("dev", DEVICES)
def test_rsl_rl_storage_on_device_gives_rsl_rls_minibatches_bit_for_bit(dev: str) -> None:
    rsl_storage = pytest.importorskip("rsl_rl.storage")
    from tensordict import TensorDict

    from xpbank.compat.rsl_rl import RolloutStorage

    envs, steps = 5, 6
    obs = TensorDict({"policy": torch.zeros(envs, 3)}, batch_size=[envs]).to(dev)
    ref = rsl_storage.RolloutStorage("rl", envs, steps, obs, [2], device=dev)
    ours = RolloutStorage("rl", envs, steps, obs, [2], device=dev, parity=True)
    for tr in _rsl_transitions(rsl_storage.RolloutStorage, dev, envs, steps):
        ref.add_transition(tr)
        ours.add_transition(tr)
    for st in (ref, ours):  # what rsl_rl's PPO.compute_returns leaves in the storage
        st.returns[:] = st.values + 1
        st.advantages = st.returns - st.values * 0.5
    assert ours.values.device.type == dev
    torch.manual_seed(7)
    a = list(ref.mini_batch_generator(3, 2))
    torch.manual_seed(7)
    b = list(ours.mini_batch_generator(3, 2))
    assert len(a) == len(b) == 6
    for x, y in zip(a, b, strict=True):
        assert y.observations["policy"].device.type == dev
        assert torch.equal(x.observations["policy"], y.observations["policy"])
        for name in ("actions", "values", "advantages", "returns", "old_actions_log_prob"):
            assert torch.equal(getattr(x, name), getattr(y, name)), name


# -- the copies to the device: the same values as gather and .to(device) ---------------
@pytest.mark.parametrize("dev", DEVICES)
def test_rows_and_index_copies_give_what_gather_gives(dev: str) -> None:
    from xpbank.replay import to_device

    spec = Spec(
        {
            "obs": Field((3,), torch.bfloat16),
            "action": Field((), torch.int64),
            "flag": Field((2,), torch.bool),
            "small": Field((), torch.uint8),
            ("next", "obs"): Field((3,), torch.bfloat16),
        }
    )
    storage = TensorStorage(12, spec)
    storage.write(slice(0, 12), make_batch(spec, 12, 5))
    for slots in (torch.tensor([3, 0, 11, 3]), torch.tensor([[1, 2, 3], [9, 10, 11]])):
        rows = to_device.rows_to(storage, slots, torch.device(dev))
        assert rows is not None and list(rows) == list(spec)
        want = storage.gather(slots.reshape(-1))
        for key in spec:
            assert rows[key].device.type == dev and rows[key].shape == (*slots.shape, *spec[key].shape)
            assert torch.equal(rows[key].cpu().reshape(want[key].shape), want[key]), key
    assert (
        to_device.rows_to(TensorStorage(12, spec, pack=False), torch.tensor([0]), torch.device(dev)) is None
    )
    ids = torch.tensor([[17, 4], [5, 6]])
    sent = to_device.slots_and_ids_to(ids % 12, ids, torch.device(dev))
    assert sent is not None and torch.equal(sent[0].cpu(), ids % 12) and torch.equal(sent[1].cpu(), ids)
    assert to_device.slots_and_ids_to(ids.int(), ids, torch.device(dev)) is None  # not a pair
