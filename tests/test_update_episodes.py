"""``ReplayBuffer.update`` of the fields the episode index is built from (env id,
terminated, truncated, done): refused where it would change the index, accepted where it
writes what the index holds or the buffer keeps no index. After every update, refused or
not, each item's n-step target equals a brute-force one computed from the stored fields."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from xpbank import FrameStorage, NStep, ReplayBuffer, SequenceSampler, SpecError

GAMMA = 0.5
N = 3


def _keys(torchrl: bool) -> tuple[Any, Any, Any]:
    if torchrl:
        return ("next", "reward"), ("next", "terminated"), ("next", "truncated")
    return "reward", "terminated", "truncated"


def _batch(env: np.ndarray, rng: np.random.Generator, torchrl: bool, env_field: bool) -> dict[Any, Any]:
    """Items of envs ``env`` with random rewards and episode ends."""
    n = len(env)
    reward = torch.as_tensor(rng.integers(-3, 4, size=n).astype(np.float32))
    term = torch.as_tensor(rng.random(n) < 0.15)
    trunc = torch.as_tensor(rng.random(n) < 0.1) & ~term
    obs = torch.as_tensor(rng.normal(size=(n, 1)).astype(np.float32))
    if torchrl:
        data: dict[Any, Any] = {
            "obs": obs,
            "next": {
                "obs": obs + 1,
                "reward": reward[:, None],
                "terminated": term[:, None],
                "truncated": trunc[:, None],
            },
        }
    else:
        data = {"obs": obs, "next_obs": obs + 1, "reward": reward, "terminated": term, "truncated": trunc}
    if env_field:
        data["env_id"] = torch.as_tensor(env)
    return data


def _fill(num_envs: int | None, torchrl: bool, seed: int = 0) -> tuple[ReplayBuffer, dict[int, int]]:
    """An n-step buffer of capacity 16 that has wrapped (24 items written); with
    ``num_envs`` in lockstep (2 envs), else 3 envs whose items carry ``env_id`` in an
    irregular order. Returns it and each id's env (the test's own record)."""
    rng = np.random.default_rng(seed)
    rb = ReplayBuffer(16, num_envs=num_envs, nstep=NStep(N, GAMMA), seed=seed)
    env_of: dict[int, int] = {}
    for _ in range(4):
        env = np.tile(np.arange(2), 3) if num_envs else rng.integers(0, 3, size=6)
        ids = rb.extend(_batch(env, rng, torchrl, num_envs is None))
        env_of.update(zip(ids, env.tolist(), strict=True))
    return rb, env_of


def _reference(
    rb: ReplayBuffer, env_of: dict[int, int], torchrl: bool
) -> dict[int, tuple[float, float, int]]:
    """Each live item's (return, discount, steps), walked by hand over the stored fields:
    the window follows the item's env forward, stops after a stored terminated or
    truncated item, after ``N`` items, or at the newest item."""
    reward_key, term_key, trunc_key = _keys(torchrl)
    data = rb.sample_all()
    ids = data["index"].tolist()
    reward = data[reward_key].reshape(-1).tolist()
    absent = torch.zeros(len(ids), dtype=torch.bool)
    term = data.get(term_key, absent).reshape(-1).tolist()
    trunc = data.get(trunc_key, absent).reshape(-1).tolist()
    out = {}
    for p, x in enumerate(ids):
        stream = [q for q in range(p, len(ids)) if env_of[ids[q]] == env_of[x]]
        ret, k = 0.0, 0
        for q in stream:
            ret += GAMMA**k * reward[q]
            k += 1
            if k == N or term[q] or trunc[q]:
                break
        out[x] = (ret, 0.0 if term[q] else GAMMA**k, k)
    return out


def _check_nstep(rb: ReplayBuffer, env_of: dict[int, int], torchrl: bool) -> None:
    """Every live item's sampled n-step target equals the brute-force one."""
    want = _reference(rb, env_of, torchrl)
    batch = rb.sample(2000)
    got = {}
    for x, r, d, k in zip(
        batch["index"].tolist(),
        batch["nstep_return"].tolist(),
        batch["nstep_discount"].tolist(),
        batch["nstep_steps"].tolist(),
        strict=True,
    ):
        got[x] = (r, d, k)
    assert got.keys() == want.keys()
    for x, (r, d, k) in want.items():
        assert got[x][2] == k, x
        assert got[x][:2] == pytest.approx((r, d), rel=1e-6, abs=1e-6), x


def _snapshot(rb: ReplayBuffer) -> tuple[Any, ...]:
    data = rb.sample_all()
    fields = {k: data[k].clone() for k in data.keys(True, True)}
    index = rb.episodes.state_dict() if rb.episodes is not None else {}
    return fields, {k: v for k, v in index.items()}, rb._ring.state_dict()


def _assert_same(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    assert a[0].keys() == b[0].keys() and a[1].keys() == b[1].keys() and a[2] == b[2]
    for k in a[0]:
        assert torch.equal(a[0][k], b[0][k]), k
    for k in a[1]:
        same = a[1][k] == b[1][k] if not torch.is_tensor(a[1][k]) else torch.equal(a[1][k], b[1][k])
        assert same, k


def test_the_reported_case_is_refused_and_changes_nothing() -> None:
    """The report: after ``update([1], {"terminated": True})`` item 0 kept a 3-step
    window (1.75, 0.125) where the stored flags say 2 steps (1.5, 0.0)."""
    rb = ReplayBuffer(100, num_envs=1, nstep=NStep(3, GAMMA), seed=0)
    rb.extend({"obs": torch.arange(4.0), "next_obs": torch.arange(1.0, 5.0),
               "reward": torch.ones(4), "terminated": torch.tensor([0, 0, 0, 1])})  # fmt: skip
    before = _snapshot(rb)
    with pytest.raises(
        SpecError,
        match=r"update: field 'terminated' of item 1: expected False \(the value the episode index "
        r"holds\), got True; .*built from the envs and episode-end flags when items are written.*"
        r"write the right flags when extending.*truncate_newest\(\)",
    ):
        rb.update([1], {"terminated": torch.tensor([1])})
    _assert_same(_snapshot(rb), before)
    _check_nstep(rb, dict.fromkeys(range(4), 0), torchrl=False)


@pytest.mark.parametrize("torchrl", [False, True], ids=["flat", "torchrl"])
@pytest.mark.parametrize("num_envs", [2, None], ids=["lockstep", "env_id"])
def test_flag_updates_that_move_an_episode_end_are_refused(num_envs: int | None, torchrl: bool) -> None:
    rb, env_of = _fill(num_envs, torchrl)
    _check_nstep(rb, env_of, torchrl)
    _, term_key, trunc_key = _keys(torchrl)
    data = rb.sample_all()
    ids = data["index"]
    shape = data[term_key].shape[1:]
    for key in (term_key, trunc_key):
        flags = data[key].clone()
        flags[3] = ~flags[3]  # one item of several (its row in the middle of the wrapped ring)
        before = _snapshot(rb)
        name = key if isinstance(key, str) else ".".join(key)
        with pytest.raises(SpecError, match=rf"field '{name}' of item {int(ids[3])}: expected "):
            rb.update(ids[1:6], {key: flags[1:6], "obs": torch.zeros(5, 1)})
        _assert_same(_snapshot(rb), before)  # not even "obs" was written
        _check_nstep(rb, env_of, torchrl)
    # the same values (a sample passed back whole, flags included) and new rewards: accepted
    reward_key = _keys(torchrl)[0]
    back = {k: data[k][2:9] for k in data.keys(True, True) if k != "index" and not k[0].startswith("nstep")}
    back[reward_key] = back[reward_key] * 2 + 1
    rb.update(ids[2:9], back)
    assert torch.equal(rb.sample_all()[reward_key][2:9], back[reward_key])
    assert rb.sample_all()[term_key].shape[1:] == shape
    _check_nstep(rb, env_of, torchrl)


@pytest.mark.parametrize("torchrl", [False, True], ids=["flat", "torchrl"])
def test_env_id_updates_are_refused(torchrl: bool) -> None:
    rb, env_of = _fill(None, torchrl, seed=1)
    data = rb.sample_all()
    ids, env = data["index"], data["env_id"]
    moved = env.clone()
    moved[4] = (moved[4] + 1) % 3
    before = _snapshot(rb)
    with pytest.raises(
        SpecError,
        match=rf"field 'env_id' of item {int(ids[4])}: expected {int(env[4])} .*got {int(moved[4])}; "
        r".*an item's env cannot change",
    ):
        rb.update(ids, {"env_id": moved})
    _assert_same(_snapshot(rb), before)
    _check_nstep(rb, env_of, torchrl)
    rb.update(ids[:3], {"env_id": env[:3]})  # unchanged: accepted
    _check_nstep(rb, env_of, torchrl)


def test_a_repeated_id_keeps_its_last_row_before_the_check() -> None:
    rb = ReplayBuffer(10, num_envs=1, nstep=NStep(2, GAMMA))
    rb.extend({"reward": torch.ones(3), "terminated": torch.tensor([False, False, True])})
    rb.update([1, 1], {"terminated": torch.tensor([True, False])})  # the last row is what is held
    with pytest.raises(SpecError, match=r"field 'terminated' of item 1: expected False .*got True"):
        rb.update([1, 1], {"terminated": torch.tensor([False, True])})
    assert rb.sample_all()["terminated"].tolist() == [False, False, True]


def test_truncate_newest_then_updating_the_stored_flag_is_accepted() -> None:
    """``EpisodeIndex.truncate_newest`` marks the index only; the caller then sets the
    stored flag, which now agrees with the index; the n-step targets follow both."""
    rb = ReplayBuffer(20, num_envs=2, nstep=NStep(N, GAMMA), seed=0)
    rng = np.random.default_rng(3)

    def steps(k: int) -> None:
        batch = _batch(np.tile(np.arange(2), k), rng, False, False)
        batch["terminated"][:] = False
        batch["truncated"][:] = False
        rb.extend(batch)

    steps(2)  # items 0 .. 3, no episode ends
    marked = rb.episodes.truncate_newest()
    assert marked.tolist() == [2, 3]
    rb.update(marked, {"truncated": torch.ones(2, dtype=torch.bool)})
    steps(2)
    env_of = {x: x % 2 for x in range(8)}
    _check_nstep(rb, env_of, torchrl=False)
    with pytest.raises(SpecError, match=r"field 'truncated' of item 2: expected True .*got False"):
        rb.update([2], {"truncated": torch.zeros(1, dtype=torch.bool)})


def test_done_standing_for_terminated_is_checked_too() -> None:
    rb = ReplayBuffer(10, num_envs=1, nstep=NStep(2, GAMMA))
    rb.extend({"reward": torch.ones(3), "done": torch.tensor([0, 0, 1], dtype=torch.uint8)})
    with pytest.raises(SpecError, match=r"field 'done' of item 0: expected False .*got True"):
        rb.update([0], {"done": torch.tensor([1], dtype=torch.uint8)})
    rb.update([2], {"done": torch.tensor([7], dtype=torch.uint8)})  # nonzero: still an end


@pytest.mark.parametrize("kind", ["sequence", "frames", "env_id"])
def test_every_buffer_with_an_episode_index_refuses(kind: str) -> None:
    """Not only n-step: sequence windows, frame stacks, and a plain buffer whose items
    carry ``env_id`` (its index is public: ``rb.episodes``) are built from the flags."""
    if kind == "sequence":
        rb = ReplayBuffer(20, num_envs=1, sampler=SequenceSampler(2), seed=0)
    elif kind == "frames":
        rb = ReplayBuffer(20, storage=FrameStorage(20), num_envs=1)
    else:
        rb = ReplayBuffer(20)
    frames = torch.arange(6, dtype=torch.uint8).view(6, 1, 1).expand(6, 2, 2)

    def stack(t: int) -> torch.Tensor:  # 3 frames, the first repeated at an episode's start
        return torch.stack([frames[max(0, t - 2 + j)] for j in range(3)])

    for t in range(4):
        item: dict[Any, Any] = {"obs": stack(t), ("next", "obs"): stack(t + 1),
                                ("next", "terminated"): torch.tensor(t == 3)}  # fmt: skip
        if kind == "env_id":
            item["env_id"] = torch.tensor(t % 2)
        rb.add(item)
    assert rb.episodes is not None
    before = _snapshot(rb)
    with pytest.raises(SpecError, match=r"field 'next.terminated' of item 1: expected False"):
        rb.update([1], {("next", "terminated"): torch.tensor([True])})
    _assert_same(_snapshot(rb), before)


def test_a_buffer_without_an_episode_index_accepts_flag_updates() -> None:
    """Nothing there reads the flags but the sampled batch: the stored value is the truth."""
    rb = ReplayBuffer(10, seed=0)
    rb.extend({"obs": torch.zeros(3, 1), "terminated": torch.zeros(3, dtype=torch.bool)})
    assert rb.episodes is None
    rb.update([1], {"terminated": torch.tensor([True])})
    assert rb.sample_all()["terminated"].tolist() == [False, True, False]
    assert rb.sample_by_index([1])["terminated"].tolist() == [True]
