"""Attacks on two fast paths against their general (checked) paths.

- The SB3 adapter's short ``sample`` and ``add`` (``integrations/sb3/fast.py``): odd
  spaces and odd arrays, the generator state, pickling.
- A FrameStorage's one-call lockstep step (``replay/frame_kernel.py``,
  ``replay/fast_frames.py``): the SB3 adapter's ``optimize_memory_usage`` layout, and a
  storage whose ``verify`` is switched on after the one call's context was made.
Each pair gets the same stream; one has the fast path off (``_fast_read``/``_fast_write``).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from test_fast_frames import _index, _np_step
from test_frame_kernel import _counted
from test_frames import StackedEnvs
from test_frames_step import _assert_same_bytes
from xpbank import FrameStorage, ReplayBuffer, SpecError
from xpbank.replay import frame_kernel

pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from xpbank.integrations.sb3 import XpbankReplayBuffer  # noqa: E402


def _bytes_of(t: torch.Tensor) -> bytes:  # NaN == NaN, -0.0 != 0.0
    return t.numpy().tobytes()


def _same_samples(got, want) -> None:
    for name, a, b in zip(want._fields, got, want, strict=True):
        if b is None:
            assert a is None, name
            continue
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), name
        assert _bytes_of(a) == _bytes_of(b), name


def _same_store(fast, general) -> None:
    a, b = fast.xp.sample_all(), general.xp.sample_all()
    for key in b.keys(True, True):
        assert _bytes_of(a[key]) == _bytes_of(b[key]), key
    assert (fast.pos, fast.full, fast.size()) == (general.pos, general.full, general.size())
    ids = list(range(fast.xp._ring.next_id - len(fast.xp), fast.xp._ring.next_id))
    for read in ("episode_start", "predecessors", "successors"):
        got, want = (getattr(buf.xp.episodes, read)(ids).tolist() for buf in (fast, general))
        assert got == want, read


# -- SB3: the short sample ---------------------------------------------------------------

OBS_SPACES = {
    "f64": lambda: gym.spaces.Box(-1, 1, (3,), np.float64),
    "f16": lambda: gym.spaces.Box(-1, 1, (3,), np.float16),
    "u8odd": lambda: gym.spaces.Box(0, 255, (3, 5, 7), np.uint8),
    "multidiscrete": lambda: gym.spaces.MultiDiscrete([3, 4, 5]),
    "multibinary": lambda: gym.spaces.MultiBinary(3),
    "scalar": lambda: gym.spaces.Box(-1, 1, (), np.float32),
    "int16": lambda: gym.spaces.Box(-5, 5, (3,), np.int16),
}
ACT_SPACES = {
    "f64box": lambda: gym.spaces.Box(-1, 1, (1,), np.float64),
    "multidiscrete": lambda: gym.spaces.MultiDiscrete([2, 3]),
    "scalar": lambda: gym.spaces.Box(-1, 1, (), np.float32),
}


@pytest.mark.parametrize("handle_timeout", [True, False])
@pytest.mark.parametrize("obs", sorted(OBS_SPACES))
@pytest.mark.parametrize("act", sorted(ACT_SPACES))
def test_sb3_short_sample_of_odd_spaces_is_the_general_sample_and_draws(obs, act, handle_timeout):
    """Record dtypes whose rows are not multiples of 4 or 8 bytes, float64/float16/int16
    fields, a scalar Box: the same values, dtypes, shapes, and the same generator state
    after each sample (the next draws)."""
    obs_space, action_space = OBS_SPACES[obs](), ACT_SPACES[act]()
    obs_space.seed(0)
    action_space.seed(1)
    make = lambda: XpbankReplayBuffer(  # noqa: E731
        20, obs_space, action_space, "cpu", n_envs=2, seed=4, handle_timeout_termination=handle_timeout
    )
    fast, general = make(), make()
    general.xp._fast_read = False
    rng = np.random.default_rng(5)
    for t in range(17):  # wraps at 10 rows
        step = [np.stack([obs_space.sample() for _ in range(2)]) for _ in range(2)]
        action = np.stack([np.asarray(action_space.sample()) for _ in range(2)])
        done = rng.random(2) < 0.4
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        args = (*step, action, rng.normal(size=2).astype(np.float32), done, infos)
        fast.add(*args)
        general.add(*args)
        for batch_size in (1, 5 + t):
            _same_samples(fast.sample(batch_size), general.sample(batch_size))
            assert torch.equal(fast.xp._generator.get_state(), general.xp._generator.get_state())


def test_sb3_pickled_adapter_after_a_sample_carries_no_copy_of_the_records():
    """SB3's save_replay_buffer pickles the buffer. The short sample keeps a
    ``RecordsView`` (a NumPy view of every record, and the storage's RecordReader) in
    the buffer's ``__dict__``: it must pickle as nothing, not as private copies of the
    whole storage (failed at df86fb4: 221 KB -> 510 KB; fixed by fd3b0ec)."""
    space = gym.spaces.Box(0, 255, (64,), np.uint8)
    rb = XpbankReplayBuffer(1000, space, gym.spaces.Discrete(3), "cpu", seed=1)
    for t in range(1000):
        frame = np.full((1, 64), t % 256, np.uint8)
        rb.add(frame, frame + 1, np.array([[1]]), np.float32([1.0]), np.array([False]), [{}])
    before = len(pickle.dumps(rb))
    rb.sample(4)
    after = len(pickle.dumps(rb))
    assert after - before < 4096, (before, after, rb.xp.storage.nbytes())
    copy = pickle.loads(pickle.dumps(rb))
    _same_samples(copy.sample(8), rb.sample(8))


def test_sb3_samples_of_overridden_on_the_instance_is_used_by_sample():
    """``sample`` is documented as ``samples_of(xp.sample(batch_size))``, and a subclass
    that overrides ``samples_of`` gets its own (b2e6054); so does an override on the
    instance (a wrapper assigned to ``rb.samples_of``, the way tests pair paths): the
    short path once checked ``type(self).samples_of`` only and skipped it."""
    space, actions = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2)
    rb = XpbankReplayBuffer(10, space, actions, "cpu", seed=0)
    obs = np.zeros((1, 3), np.float32)
    rb.add(obs, obs + 1, np.array([[1]]), np.float32([2.0]), np.array([False]), [{}])
    seen = []
    own = rb.samples_of

    def wrapped(batch, env=None):
        seen.append(batch.batch_size)
        return own(batch, env)

    rb.samples_of = wrapped
    rb.sample(4)
    assert seen == [torch.Size([4])]


ODD_ADDS = {
    # arrays the short add takes, in layouts it must read right
    "fortran_and_reversed": lambda rng, o: (
        np.asfortranarray(o), o[::-1], rng.normal(size=(3, 2)).astype(np.float32)[:, ::-1],
        np.float32([1, 2, 3]), np.array([True, False, False]), [{}, {"TimeLimit.truncated": True}, {}],
    ),
    "readonly_broadcast_strided": lambda rng, o: (
        _readonly(o), np.broadcast_to(np.float32([1, 2, 3]), (3, 3)),
        np.broadcast_to(np.float32([0.5, 0.5]), (3, 2)), np.float32([1, 2, 3, 4, 5, 6])[::2],
        np.array([True, True, False, False, True, False])[::2], [{"TimeLimit.truncated": True}] * 3,
    ),
    "nan_inf_negzero": lambda rng, o: (
        o, o + 1, np.zeros((3, 2), np.float32), np.float32([np.nan, np.inf, -0.0]),
        np.array([False, True, True]), [{"TimeLimit.truncated": True}, {}, {"TimeLimit.truncated": False}],
    ),
    "timeout_without_done": lambda rng, o: (
        o, o, np.zeros((3, 2), np.float32), np.float32([1, 2, 3]), np.zeros(3, bool),
        [{"TimeLimit.truncated": True}] * 3,
    ),
    # arrays it declines or hands on: converted, or refused, as the checked add does
    "float64_obs_int64_next_flat_action": lambda rng, o: (
        o.astype(np.float64), np.ones((3, 3), np.int64), np.zeros(6, np.float64), np.float32([1, 2, 3]),
        np.zeros(3, bool), [{}] * 3,
    ),
    "torch": lambda rng, o: (
        torch.from_numpy(o), torch.from_numpy(o), torch.zeros(3, 2), torch.ones(3),
        torch.zeros(3, dtype=torch.bool), [{}] * 3,
    ),
    "infos_short": lambda rng, o: (
        o, o, np.zeros((3, 2), np.float32), np.float32([1, 2, 3]), np.zeros(3, bool), [{}] * 2
    ),
    "obs_wrong_shape": lambda rng, o: (
        o[:, :2].copy(), o, np.zeros((3, 2), np.float32), np.float32([1, 2, 3]), np.zeros(3, bool), [{}] * 3
    ),
    "reward_four": lambda rng, o: (
        o, o, np.zeros((3, 2), np.float32), np.float32([1, 2, 3, 4]), np.zeros(3, bool), [{}] * 3
    ),
    "obs_0d": lambda rng, o: (
        np.float32(1.0), o, np.zeros((3, 2), np.float32), np.float32([1, 2, 3]), np.zeros(3, bool), [{}] * 3
    ),
}  # fmt: skip


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("case", sorted(ODD_ADDS))
def test_sb3_short_add_of_odd_arrays_is_the_checked_add(case, storage):
    """The short add against the checked add with the xpbank write fast path off too:
    the same stored bytes, cursor and episode index, or the same error with nothing
    written."""
    obs_space = gym.spaces.Box(-10, 10, (3,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    make = lambda: XpbankReplayBuffer(  # noqa: E731
        12, obs_space, action_space, "cpu", n_envs=3, seed=5, storage=storage
    )
    fast, general = make(), make()
    general.xp._fast_write = general.xp._fast_read = False
    rng = np.random.default_rng(0)
    o = rng.normal(size=(3, 3)).astype(np.float32)
    for buf in (fast, general):
        buf.add(o, o, np.zeros((3, 2), np.float32), np.float32([0, 0, 0]), np.zeros(3, bool), [{}] * 3)
    args = ODD_ADDS[case](rng, o)
    errors = []
    for call in (fast.add, general._add_checked):
        try:
            call(*args)
            errors.append(None)
        except SpecError as e:
            errors.append(str(e))
    assert errors[0] == errors[1]
    _same_store(fast, general)
    _same_samples(fast.sample(8), general.sample(8))


# -- FrameStorage: the one-call step -----------------------------------------------------


needs_kernel = pytest.mark.skipif(frame_kernel._kernel is None, reason="numba is not installed")


@needs_kernel
@pytest.mark.parametrize("handle_timeout", [True, False])
@pytest.mark.parametrize("n_envs", [1, 3])
def test_sb3_optimize_memory_one_call_step_is_the_general_step(n_envs, handle_timeout, monkeypatch):
    """SB3's optimize_memory_usage layout (FrameStorage(stacked=False), whole uint8
    observations of 192 bytes): random episode ends (time limits among them, one env's
    among many), SB3's dones[pos - 1] cut twice, ring wraps; after every add the same
    items and index as the general write, and the same samples."""
    answers = _counted(monkeypatch)
    obs_space, action_space = gym.spaces.Box(0, 255, (4, 6, 8), np.uint8), gym.spaces.Discrete(3)
    obs_space.seed(3)
    make = lambda: XpbankReplayBuffer(  # noqa: E731
        30, obs_space, action_space, "cpu", n_envs=n_envs, optimize_memory_usage=True,
        handle_timeout_termination=handle_timeout, seed=2,
    )  # fmt: skip
    fast, general = make(), make()
    general.xp._fast_write = general.xp._fast_read = False
    rng = np.random.default_rng(0)
    obs = np.stack([obs_space.sample() for _ in range(n_envs)])
    for t in range(100):
        nxt = np.stack([obs_space.sample() for _ in range(n_envs)])
        done = rng.random(n_envs) < 0.25
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        action, reward = rng.integers(0, 3, (n_envs, 1)), rng.normal(size=n_envs).astype(np.float32)
        args = (obs, nxt, action, reward, done, infos)
        fast.add(*args)
        general.add(*args)
        obs = nxt.copy()
        for e in np.flatnonzero(done):
            obs[e] = obs_space.sample()
        if t in (40, 77):  # SB3 between two learn() calls
            for buf in (fast, general):
                buf.dones[buf.pos - 1] = True
            obs = np.stack([obs_space.sample() for _ in range(n_envs)])
        _same_store(fast, general)
        _same_samples(fast.sample(9), general.sample(9))
    assert answers.count(True) > 90 and False not in answers


@needs_kernel
def test_frame_storage_verify_switched_on_checks_the_next_step(monkeypatch):
    """``FrameStorage.verify`` is a plain attribute that the general path reads on every
    write. The one call's StepContext copies it (entry ``_VERIFY``), so
    ``StepContext.current`` compares it: a buffer made with ``verify=False`` and
    switched to ``verify=True`` refuses, as the general path does, a step whose next
    observation is not its observation shifted by one frame (it once stored it)."""
    answers = _counted(monkeypatch)
    results = []
    for fast_write in (True, False):
        envs = StackedEnvs(4, 4, seed=3, lengths=(5, 9), frame=(4, 8))
        rb = ReplayBuffer(40, storage=FrameStorage(40, verify=False), num_envs=4, seed=0)
        rb._fast_write = fast_write
        for _ in range(6):
            rb.extend(_np_step(envs, 4, True))
        rb.storage.verify = True
        bad = _np_step(envs, 4, True)
        bad["obs"][0, -1, 0, 0] ^= 1  # env 0's newest frame: no longer the last step's next
        before = (rb._ring.next_id, rb.storage._frames.clone())
        try:
            rb.extend(bad)
            results.append("written")
        except SpecError as e:
            results.append(str(e))
            assert rb._ring.next_id == before[0] and torch.equal(rb.storage._frames, before[1])
    assert True in answers  # the one call took the fast buffer's steps
    assert results[0] == results[1]


@needs_kernel
@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("num_envs,capacity", [(4, 40), (3, 36), (1, 13)])
def test_one_call_steps_mixed_with_other_writes_store_what_the_general_path_does(
    stacked, num_envs, capacity, monkeypatch
):
    """Steps through the one call interleaved with writes that take other paths and
    replace the index's per-env state: two steps in one extend (the general plan), CPU
    tensors (the signature's loop), a reward of another dtype (a cast, another
    signature), an observation with negative strides (the two-kernel path), and an
    episode cut from outside."""
    answers = _counted(monkeypatch)
    fast, slow = (
        ReplayBuffer(capacity, storage=FrameStorage(capacity, stacked=stacked), num_envs=num_envs, seed=7)
        for _ in range(2)
    )
    slow._fast_write = False
    envs = StackedEnvs(num_envs, 4, seed=5, lengths=(1, 6), frame=(4, 8))
    rng = np.random.default_rng(1)
    for t in range(150):
        r = rng.random()
        batch = _np_step(envs, num_envs, stacked)
        if r < 0.15:
            more = _np_step(envs, num_envs, stacked)
            batch = {k: np.concatenate([v, more[k]]) for k, v in batch.items()}
        elif r < 0.3:
            batch = {k: torch.from_numpy(v) for k, v in batch.items()}
        elif r < 0.35:
            batch["reward"] = batch["reward"].astype(np.float64)
        elif r < 0.4:
            batch["obs"] = np.ascontiguousarray(batch["obs"][::-1])[::-1]
        elif r < 0.45:
            assert fast.episodes.truncate_newest().tolist() == slow.episodes.truncate_newest().tolist()
            envs.state = [envs._reset() for _ in range(num_envs)]
            batch = _np_step(envs, num_envs, stacked)
        assert fast.extend(batch) == slow.extend(batch)
        _assert_same_bytes(fast, slow)
        assert _index(fast) == _index(slow), t
    assert fast._ring.next_id > 3 * capacity and answers.count(True) > 50 and False not in answers


@needs_kernel
def test_fast_write_switched_off_mid_stream_takes_no_fast_step(monkeypatch):
    """``rb._fast_write = False`` is documented (fast_write.remember) as turning the
    write fast path off for the buffer, and the tests of both new paths use it as the
    general side of a pair. Set after a write, it stops the kept ``_signature`` too
    (try_write once read it unconditionally, so a "general" buffer switched mid-stream
    kept running the one call)."""
    answers = _counted(monkeypatch)
    rb = ReplayBuffer(40, storage=FrameStorage(40), num_envs=4, seed=0)
    envs = StackedEnvs(4, 4, seed=1, frame=(4, 8))
    for _ in range(5):
        rb.extend(_np_step(envs, 4, True))
    assert True in answers  # the one call was on
    rb._fast_write = False
    seen = len(answers)
    for _ in range(5):
        rb.extend(_np_step(envs, 4, True))
    assert answers[seen:] == []


@needs_kernel
@pytest.mark.parametrize("pad", ["repeat", "zero"])
@pytest.mark.parametrize(
    "num_envs,stack,capacity,lengths",
    [
        (16, 4, 64, (1, 3)),  # capacity = stack * envs: every step rescues stacks
        (1, 4, 4, (1, 3)),  # one env, the ring as long as a stack
        (1, 4, 5, (1, 9)),
        (2, 3, 6, (1, 2)),  # an episode end nearly every step
        (3, 6, 18, (2, 30)),  # episodes longer than the ring
    ],
)
def test_one_call_step_at_tight_capacities_is_the_general_step(
    num_envs, stack, capacity, lengths, pad, monkeypatch
):
    """A ring of about one stack per env: each wrap overwrites frames live stacks read
    (the rescue pass); the same bytes, side stores and index as the general write."""
    answers = _counted(monkeypatch)
    fast, slow = (
        ReplayBuffer(capacity, storage=FrameStorage(capacity, pad=pad), num_envs=num_envs, seed=7)
        for _ in range(2)
    )
    slow._fast_write = False
    envs = StackedEnvs(num_envs, stack, seed=9, pad=pad, lengths=lengths, frame=(8,))
    for _ in range(120):
        batch = _np_step(envs, num_envs, True)
        assert fast.extend(batch) == slow.extend(batch)
        _assert_same_bytes(fast, slow)
        assert _index(fast) == _index(slow)
    a, b = fast.sample(20), slow.sample(20)
    for key in b.keys(True, True):
        assert _bytes_of(a[key]) == _bytes_of(b[key]), key
    assert answers.count(True) > 110 and False not in answers
