"""FrameStorage: what comes back is bit-for-bit what went in (stacked frames, episode
ends of many envs, ring wraps), compared with every transition kept in a dict."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xpbank import FrameStorage, ReplayBuffer, SequenceSampler, SpecError, TensorStorage

FRAME = (3, 4)


class StackedEnvs:
    """E envs with gymnasium ``FrameStackObservation`` semantics over random frames.

    ``step(envs)`` advances the given envs and returns their transitions: the stack,
    the next stack (the true final one at an episode end), terminated, truncated.
    """

    def __init__(
        self, num_envs: int, stack: int, seed: int, pad: str = "repeat", lengths=(1, 12), frame=FRAME
    ):
        self.rng, self.frame = np.random.default_rng(seed), frame
        self.stack, self.pad, self.lengths = stack, pad, lengths
        self.state = [self._reset() for _ in range(num_envs)]

    def _frame(self) -> np.ndarray:
        return self.rng.integers(0, 256, self.frame, dtype=np.uint8)

    def _reset(self) -> tuple[np.ndarray, int]:
        first = self._frame()
        pad = first if self.pad == "repeat" else np.zeros(self.frame, np.uint8)
        return np.stack([pad] * (self.stack - 1) + [first]), int(self.rng.integers(*self.lengths))

    def step(self, envs):
        obs, nxt, term, trunc = [], [], [], []
        for e in envs:
            stack, left = self.state[e]
            new = np.concatenate([stack[1:], self._frame()[None]])
            end = left == 1
            cut = end and self.rng.random() < 0.4
            obs.append(stack)
            nxt.append(new)
            term.append(end and not cut)
            trunc.append(cut)
            self.state[e] = self._reset() if end else (new, left - 1)
        return {
            "obs": torch.from_numpy(np.stack(obs)),
            ("next", "obs"): torch.from_numpy(np.stack(nxt)),
            "action": torch.as_tensor(self.rng.integers(0, 6, len(envs))),
            "reward": torch.as_tensor(self.rng.random(len(envs)), dtype=torch.float32),
            "terminated": torch.tensor(term),
            "truncated": torch.tensor(trunc),
        }


def _record(ref: dict, ids: range, batch: dict) -> None:
    for row, i in enumerate(ids):
        ref[i] = {k: v[row].clone() for k, v in batch.items()}


def _assert_same(ref: dict, td) -> None:
    ids = td["index"].reshape(-1).tolist()
    for key in ("obs", ("next", "obs"), "action", "terminated", "truncated"):
        got = td[key].reshape(len(ids), *td[key].shape[td["index"].ndim :])
        want = torch.stack([ref[i][key] for i in ids])
        assert torch.equal(got, want), key


def _fill(
    rb: ReplayBuffer, envs: StackedEnvs, steps: int, env_field: bool, seed: int, check: bool = True
) -> dict:
    rng = np.random.default_rng(seed)
    ref: dict = {}
    n = len(envs.state)
    for t in range(steps):
        if env_field:  # envs step at their own pace, in any order
            which = rng.permutation(n)[: rng.integers(1, n + 1)]
            batch = envs.step(which)
            batch["env_id"] = torch.as_tensor(which)
        else:
            k = int(rng.integers(1, 4))  # k steps of every env, time-major
            parts = [envs.step(range(n)) for _ in range(k)]
            batch = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
        _record(ref, rb.extend(batch), batch)
        if check and t % 7 == 3:
            _check_everything(rb, ref)
    return ref


def _check_everything(rb: ReplayBuffer, ref: dict) -> None:
    _assert_same(ref, rb.sample_all())
    _assert_same(ref, rb.sample(16))
    _assert_same(ref, rb.sample_by_index([0, -1, len(rb) // 2]))
    for mb in rb.epochs(13):
        _assert_same(ref, mb)


@pytest.mark.parametrize("env_field", [False, True])
@pytest.mark.parametrize("stack,pad", [(4, "repeat"), (3, "zero"), (1, "repeat")])
def test_round_trip_over_many_episodes_envs_and_wraps(env_field: bool, stack: int, pad: str) -> None:
    envs = StackedEnvs(3, stack, seed=stack, pad=pad)
    rb = ReplayBuffer(37, storage=FrameStorage(37, pad=pad), num_envs=None if env_field else 3, seed=0)
    ref = _fill(rb, envs, 60, env_field, seed=1)
    assert rb._ring.next_id > 3 * 37  # wrapped several times
    _check_everything(rb, ref)
    clone = ReplayBuffer(37, storage=FrameStorage(37, pad=pad), num_envs=None if env_field else 3, seed=0)
    clone.load_state_dict(rb.state_dict())
    _check_everything(clone, ref)
    more = envs.step(range(3))
    if env_field:
        more["env_id"] = torch.arange(3)
    for buffer in (rb, clone):  # both go on the same way: the side stores were restored
        _record(ref, buffer.extend(more), more)
        _check_everything(buffer, ref)


def test_real_gymnasium_frame_stack_wrapper() -> None:
    class Pixels(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (6, 6), np.uint8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.integers(0, 256, (6, 6), dtype=np.uint8), {}

        def step(self, action):
            self.t += 1
            obs = self.np_random.integers(0, 256, (6, 6), dtype=np.uint8)
            return obs, 0.0, bool(self.np_random.random() < 0.1), self.t >= 15, {}

    envs = [gym.wrappers.FrameStackObservation(Pixels(), 4) for _ in range(2)]
    obs = [np.asarray(env.reset(seed=i)[0]) for i, env in enumerate(envs)]
    rb = ReplayBuffer(50, storage=FrameStorage(50), num_envs=2, sampler=SequenceSampler(3), seed=0)
    ref: dict = {}
    for _ in range(120):
        rows = []
        for i, env in enumerate(envs):
            nxt, _, term, trunc, _ = env.step(0)
            rows.append((obs[i], np.asarray(nxt), term, trunc))
            obs[i] = np.asarray(env.reset()[0]) if term or trunc else np.asarray(nxt)
        batch = {
            "obs": torch.from_numpy(np.stack([r[0] for r in rows])),
            ("next", "obs"): torch.from_numpy(np.stack([r[1] for r in rows])),
            "action": torch.zeros(2, dtype=torch.int64),
            "reward": torch.zeros(2),
            "terminated": torch.tensor([r[2] for r in rows]),
            "truncated": torch.tensor([r[3] for r in rows]),
        }
        _record(ref, rb.extend(batch), batch)
    _assert_same(ref, rb.sample_all())
    _assert_same(ref, rb.sample(8))  # [8, 3] windows through the sequence sampler


def test_memory_is_one_frame_per_step() -> None:
    """Atari-sized frames: the naive layout holds 8 frames per step, this one 1 plus a
    few kept aside (episode ends, each env's newest step)."""
    envs = StackedEnvs(4, 4, seed=0, lengths=(50, 60), frame=(84, 84))
    rb = ReplayBuffer(800, storage=FrameStorage(800), num_envs=4)
    ref = _fill(rb, envs, 120, False, seed=0, check=False)
    assert rb._ring.next_id > 800
    naive = TensorStorage(800, rb.spec).nbytes()
    assert rb.storage.nbytes() < 0.15 * naive
    assert rb.storage.nbytes() > 800 * 84 * 84  # one frame per slot is really held
    _assert_same(ref, rb.sample(64))


def test_a_batch_that_breaks_the_rules_is_refused_and_nothing_changes() -> None:
    envs = StackedEnvs(2, 4, seed=0, lengths=(30, 40))
    rb = ReplayBuffer(20, storage=FrameStorage(20), num_envs=2)
    ref = _fill(rb, envs, 8, False, seed=0)
    before = rb.sample_all()
    bad = envs.step(range(2))
    bad["obs"] = bad["obs"].clone()
    bad["obs"][1, 0] += 1  # env 1's observation is not its previous next observation
    with pytest.raises(
        SpecError, match=r"field 'obs' \(FrameStorage\): item 1 of the batch \(env 1\) is not the next"
    ):
        rb.extend(bad)
    shifted = envs.step(range(2))
    shifted[("next", "obs")] = shifted[("next", "obs")].clone()
    shifted[("next", "obs")][0, 0] += 1
    with pytest.raises(
        SpecError, match=r"field 'next.obs' .*item 0 .*not its observation shifted by one frame"
    ):
        rb.extend(shifted)
    assert len(rb) == len(before) and (rb.sample_all() == before).all()
    with pytest.raises(SpecError, match=r"update: field 'obs' is shared between steps"):
        rb.update([int(before["index"][0])], {"obs": before["obs"][:1]})
    rb.update([int(before["index"][0])], {"action": torch.tensor([5])})
    assert int(rb.sample_by_index([0])["action"][0]) == 5
    del ref


def test_bad_configuration_raises() -> None:
    with pytest.raises(SpecError, match="pad: expected one of"):
        FrameStorage(10, pad="edge")
    from xpbank import Field, Spec

    spec = Spec({"obs": Field((4, 2), torch.uint8), ("next", "obs"): Field((4, 3), torch.uint8)})
    with pytest.raises(SpecError, match=r"field 'next.obs' \(next_obs=\): expected"):
        FrameStorage(10, spec)


# random buffers and streams (also drives test_frame_table.py)
RANDOM_RUNS = {
    "capacity": st.integers(3, 40),
    "num_envs": st.integers(1, 4),
    "stack": st.integers(1, 4),
    "seed": st.integers(0, 10_000),
    "env_field": st.booleans(),
}


@settings(max_examples=25, deadline=None)
@given(**RANDOM_RUNS)
def test_random_runs_round_trip(capacity: int, num_envs: int, stack: int, seed: int, env_field: bool) -> None:
    envs = StackedEnvs(num_envs, stack, seed=seed, lengths=(1, 6))
    rb = ReplayBuffer(capacity, storage=FrameStorage(capacity), num_envs=None if env_field else num_envs)
    ref = _fill(rb, envs, 25, env_field, seed=seed)
    _check_everything(rb, ref)


def test_with_prioritized_and_nstep_sampling() -> None:
    from xpbank import NStep, PrioritizedSampler

    envs = StackedEnvs(2, 4, seed=3, lengths=(2, 7))
    rb = ReplayBuffer(
        30, storage=FrameStorage(30), num_envs=2, sampler=PrioritizedSampler(), nstep=NStep(3, 0.9), seed=0
    )
    ref = _fill(rb, envs, 25, False, seed=0, check=False)
    batch = rb.sample(64)
    last_id = rb._ring.next_id - 1
    for row, i in enumerate(batch["index"].tolist()):
        assert torch.equal(batch["obs"][row], ref[i]["obs"])
        cur = i  # lockstep, 2 envs: the same env's next item is 2 ids later
        for _ in range(2):
            if ref[cur]["terminated"] or ref[cur]["truncated"] or cur + 2 > last_id:
                break
            cur += 2
        assert torch.equal(batch["next", "obs"][row], ref[cur]["next", "obs"])  # the n-step bootstrap obs


def test_saved_as_a_bank_and_loaded_back_bit_for_bit(tmp_path) -> None:
    """A bank holds plain per-field arrays (full stacks, readable by any NumPy reader);
    loading it gives a memory buffer whose every field is what went in."""
    import xpbank

    envs = StackedEnvs(3, 4, seed=5)
    rb = ReplayBuffer(37, storage=FrameStorage(37), num_envs=3, seed=0)
    ref = _fill(rb, envs, 40, env_field=False, seed=2, check=False)
    xpbank.save(rb, tmp_path / "frames")
    back = xpbank.load(tmp_path / "frames")
    assert back.config() == rb.config() and len(back) == len(rb)
    _check_everything(back, ref)
    assert torch.equal(back.sample_all()["index"], rb.sample_all()["index"])


@pytest.mark.parametrize("env_field", [False, True])
@pytest.mark.parametrize("stack,pad", [(4, "repeat"), (3, "zero")])
def test_reads_split_into_many_chunks_are_the_same(
    monkeypatch: pytest.MonkeyPatch, env_field: bool, stack: int, pad: str
) -> None:
    # Atari-sized frames put ~18 items in a chunk; these tiny frames would fit any batch
    # in one, so shrink the chunk to a single stack's bytes (and one not dividing it)
    import xpbank.storage.frames as frames_module

    envs = StackedEnvs(3, stack, seed=11 + stack, pad=pad)
    rb = ReplayBuffer(29, storage=FrameStorage(29, pad=pad), num_envs=None if env_field else 3, seed=0)
    ref = _fill(rb, envs, 40, env_field, seed=2, check=False)
    assert rb._ring.next_id > 2 * 29  # wrapped several times
    assert len(rb.storage._stacks) and len(rb.storage._last)  # rescued stacks, frames kept aside
    stack_bytes = stack * FRAME[0] * FRAME[1]
    for chunk in (1, stack_bytes, 2 * stack_bytes + 1, 5 * stack_bytes):
        monkeypatch.setattr(frames_module, "_CHUNK_BYTES", chunk)
        _check_everything(rb, ref)
        _assert_same(ref, rb.sample(31))
        only_next = rb.sample_by_index(list(range(len(rb))), fields=[("next", "obs")])
        want = torch.stack([ref[i]["next", "obs"] for i in only_next["index"].tolist()])
        assert torch.equal(only_next["next", "obs"], want)
