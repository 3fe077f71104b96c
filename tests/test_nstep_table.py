"""The n-step window table (``nstep_table.WindowTable``): a lockstep buffer keeps the
results of complete windows and the kernel reads them instead of walking. Checked
against a brute-force model written here and against the NumPy path (which keeps no
table), bit for bit, through writes, samples, reward rewrites (``ReplayBuffer.update``),
``truncate_newest``, ``clear``, ring wraps, and state loads that move the ring back.

Where numba is missing the kernel's source runs as plain Python, so the table's logic
is checked either way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from test_nstep_kernel import _assert_same
from xpbank import NStep, ReplayBuffer, SpecError
from xpbank.nstep import kernel as nstep_kernel
from xpbank.nstep.table import MAX_TABLE_N, WindowTable

GAMMA = 0.9


@contextlib.contextmanager
def _kernel(which: str) -> Iterator[None]:
    """The n-step path inside: ``"compiled"`` (as installed; the Python source where numba
    is missing), ``"python"`` (the kernel's source as plain Python) or ``"numpy"``."""
    saved = list(nstep_kernel._compiled)
    nstep_kernel.kernel()
    if which == "python" or (which == "compiled" and nstep_kernel.kernel() is None):
        nstep_kernel._compiled[:] = [nstep_kernel._nstep_gather]
    elif which == "numpy":
        nstep_kernel._compiled[:] = [None]
    try:
        yield
    finally:
        nstep_kernel._compiled[:] = saved


def _table(rb: ReplayBuffer) -> WindowTable:
    tables = [t for t in rb.episodes.derived.values() if isinstance(t, WindowTable)]
    assert len(tables) == 1
    return tables[0]


def _gather(rb: ReplayBuffer, ids: np.ndarray, which: str, keys: list | None = None) -> dict:
    """``rb``'s n-step gather of ``ids`` on the ``which`` path (``NStep``'s cached fused
    entry is valid only for the kernel it was made with: switching it is enough)."""
    ids_t = torch.from_numpy(ids)
    with _kernel(which):
        return rb._nstep.gather(rb._storage, rb._ring, ids_t % rb.capacity, ids_t, keys)


class Model:
    """Every live item as ``[id, env, reward, terminated, truncated]`` (the index's ends)."""

    def __init__(self, capacity: int, envs: int):
        self.capacity, self.envs, self.items, self.next_id, self.base = capacity, envs, [], 0, 0

    def extend(self, reward: np.ndarray, term: np.ndarray, trunc: np.ndarray) -> None:
        for r, a, b in zip(reward.tolist(), term.tolist(), trunc.tolist(), strict=True):
            self.items.append([self.next_id, (self.next_id - self.base) % self.envs, r, a, b])
            self.next_id += 1
        self.items = self.items[-self.capacity :]

    def truncate_newest(self) -> None:
        for env in range(self.envs):
            mine = [it for it in self.items if it[1] == env]
            if mine and not (mine[-1][3] or mine[-1][4]):
                mine[-1][4] = True

    def clear(self) -> None:
        self.next_id = self.base = -(-self.next_id // self.capacity) * self.capacity
        self.items = []

    def target(self, x: int, n: int, powers: np.ndarray) -> tuple[np.float32, np.float32, int, bool]:
        """``(return, discount, k, terminated)``: summed in float64 from step 0, as the paths do."""
        env = next(it[1] for it in self.items if it[0] == x)
        stream = [it for it in self.items if it[1] == env]
        p = [it[0] for it in stream].index(x)
        acc, k = 0.0, 0
        while True:
            acc += powers[k] * np.float64(np.float32(stream[p][2]))
            k += 1
            if k == n or stream[p][3] or stream[p][4] or p + 1 == len(stream):
                break
            p += 1
        term = bool(stream[p][3])
        return np.float32(acc), np.float32(0.0 if term else powers[k]), k, term


class TableMachine(RuleBasedStateMachine):
    """Random writes, samples, rewrites, cuts, clears and state loads: the table path's
    batches equal the model's targets and the NumPy path's batches, bit for bit."""

    @initialize(
        envs=st.integers(1, 3),
        n=st.integers(1, 4),
        laps=st.integers(3, 8),
        which=st.sampled_from(["compiled", "python"]),
    )
    def setup(self, envs: int, n: int, laps: int, which: str) -> None:
        self.rng = np.random.default_rng(envs * 100 + n * 10 + laps)
        self.n, self.which = n, which
        capacity = laps * envs + int(self.rng.integers(0, envs))  # not always a multiple of envs
        self.rb = ReplayBuffer(capacity, num_envs=envs, nstep=NStep(n, GAMMA), seed=0)
        self.model = Model(capacity, envs)
        self.saved: list[tuple[dict, list, int, int]] = []

    @rule(steps=st.integers(1, 5))
    def extend(self, steps: int) -> None:
        k = steps * self.model.envs
        reward = (self.rng.normal(size=k) * 10.0 ** self.rng.integers(-2, 3, size=k)).astype(np.float32)
        term = self.rng.random(k) < 0.15
        trunc = (self.rng.random(k) < 0.1) & ~term
        self.rb.extend({"obs": torch.as_tensor(self.rng.normal(size=(k, 3)), dtype=torch.float32),
                        "next_obs": torch.as_tensor(self.rng.normal(size=(k, 3)), dtype=torch.float32),
                        "reward": torch.from_numpy(reward), "terminated": torch.from_numpy(term),
                        "truncated": torch.from_numpy(trunc)})  # fmt: skip
        self.model.extend(reward, term, trunc)

    @rule()
    def truncate_newest(self) -> None:
        self.rb.episodes.truncate_newest()
        self.model.truncate_newest()

    @rule(count=st.integers(1, 6))
    def rewrite_rewards(self, count: int) -> None:
        """``update`` of the reward: the windows holding those items change."""
        if not self.model.items:
            return
        live = np.array([it[0] for it in self.model.items])
        ids = self.rng.choice(live, size=count)
        reward = self.rng.normal(size=count).astype(np.float32)
        self.rb.update(torch.from_numpy(ids), {"reward": torch.from_numpy(reward)})
        for x, r in zip(ids.tolist(), reward.tolist(), strict=True):  # a repeated id keeps its last value
            next(it for it in self.model.items if it[0] == x)[2] = r

    @rule()
    def rewrite_other_field(self) -> None:
        """``update`` of a field the windows do not read changes no n-step result."""
        if self.model.items:
            x = self.model.items[0][0]
            self.rb.update(torch.tensor([x]), {"obs": torch.zeros(1, 3)})

    @rule()
    def clear(self) -> None:
        self.rb.clear()
        self.model.clear()

    @rule()
    def save(self) -> None:
        state = self.rb.state_dict()
        self.saved.append((state, [list(it) for it in self.model.items], self.model.next_id, self.model.base))

    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        """Back to a saved state (the ring's ids may go back, or forward past the table)."""
        if not self.saved:
            return
        state, items, next_id, base = data.draw(st.sampled_from(self.saved))
        self.rb.load_state_dict(state)
        self.model.items, self.model.next_id, self.model.base = [list(it) for it in items], next_id, base

    @invariant()
    def samples_match(self) -> None:
        if not self.model.items:
            return
        live = np.array([it[0] for it in self.model.items], dtype=np.int64)
        ids = np.concatenate([live, self.rng.choice(live, size=8)])
        got = _gather(self.rb, ids, self.which)
        _assert_same(got, _gather(self.rb, ids, "numpy"))
        powers = GAMMA ** np.arange(self.n + 1, dtype=np.float64)
        for row, x in enumerate(ids.tolist()):
            ret, disc, k, term = self.model.target(x, self.n, powers)
            assert got["nstep_return"][row].item() == ret, (x, got["nstep_return"][row], ret)
            assert got["nstep_discount"][row].item() == disc
            assert (got["nstep_steps"][row].item(), bool(got["nstep_terminated"][row])) == (k, term)
        table = _table(self.rb)  # filled up to the first incomplete window, never past the newest
        assert table.state[0] == max(
            self.rb._ring.first_id, self.model.next_id - (self.n - 1) * self.model.envs
        )


TableMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestTable = TableMachine.TestCase


@pytest.mark.parametrize("which", ["compiled", "python"])
def test_sampled_windows_come_from_the_table(which: str) -> None:
    """A complete window's result is read from its cell (a changed cell shows in the
    batch), an incomplete one's is walked; ``forget`` sends a window back to the walk."""
    rb = ReplayBuffer(64, num_envs=2, nstep=NStep(3, GAMMA), seed=0)
    rb.extend({"obs": torch.zeros(20, 1), "reward": torch.ones(20)})  # items 0 .. 19, no ends
    ids = np.array([4, 15, 18])  # 4: complete (4, 6, 8); 15: complete (15, 17, 19); 18: (18) only
    first = _gather(rb, ids, which)
    table = _table(rb)
    assert table.state.tolist() == [16, 1]  # ids below 20 - (3 - 1) * 2 are complete
    assert first["nstep_steps"].tolist() == [3, 3, 1]
    table.returns[4] = 123.0
    table.returns[18] = 456.0  # not below hi: never read
    assert _gather(rb, ids, which)["nstep_return"].tolist() == [123.0, first["nstep_return"][1].item(), 1.0]
    table.forget(np.array([8]), rb._ring.first_id)  # 8 is the last step of 4's window (and 6's, 8's)
    assert table.meta[[4, 6, 8]].tolist() == [0, 0, 0] and table.meta[2] != 0
    assert _gather(rb, ids, which)["nstep_return"][0].item() == first["nstep_return"][0].item()
    assert table.meta[4] != 0  # walked again, and kept


@pytest.mark.parametrize("which", ["compiled", "python"])
def test_table_fills_only_what_became_complete(which: str) -> None:
    rb = ReplayBuffer(40, num_envs=4, nstep=NStep(2, GAMMA), seed=0)
    step = {"obs": torch.zeros(4, 1), "reward": torch.ones(4)}
    rb.extend(step)
    _gather(rb, np.array([0]), which)
    assert _table(rb).state[0] == 0  # one step written: no window of 2 is complete
    for written in range(2, 15):  # wraps at 10 steps
        rb.extend(step)
        _gather(rb, np.array([rb._ring.next_id - 1]), which)
        assert _table(rb).state[0] == 4 * written - 4
    assert (_table(rb).meta != 0).all()  # every live complete window filled, after the wrap too


def test_link_following_buffers_keep_no_table() -> None:
    """An env-id field (no lockstep) walks every window: no table is made."""
    rb = ReplayBuffer(20, nstep=NStep(3, GAMMA), seed=0)
    rb.extend({"obs": torch.zeros(6, 1), "reward": torch.ones(6), "env_id": torch.tensor([0, 1, 0, 1, 0, 1])})
    batch = rb.sample(16)
    assert rb.episodes.derived == {}
    assert set(batch["nstep_steps"].tolist()) <= {1, 2, 3}


def test_window_table_bounds_and_forget() -> None:
    with pytest.raises(ValueError, match=r"n must be in 1 \.\. 65535, got 0"):
        WindowTable(10, 0, 1)
    with pytest.raises(ValueError, match="got 65536"):
        WindowTable(10, MAX_TABLE_N + 1, 1)
    table = WindowTable(10, 3, 2)
    table.meta[:] = 1
    table.state[0] = 15  # live ids 5 .. 14 are filled below 15
    table.forget(np.array([14, 7]), first_id=5)  # owners 14, 12, 10 and 7, 5 (3 is not live)
    assert np.flatnonzero(table.meta == 0).tolist() == sorted(x % 10 for x in (14, 12, 10, 7, 5))
    table.reset()
    assert table.state.tolist() == [0, 1] and not table.meta.any()


@pytest.mark.parametrize("which", ["compiled", "python"])
def test_a_ring_moved_back_without_an_index_load_forgets_the_table(which: str) -> None:
    """Loading an empty state that holds no episode index leaves the index (and its
    table) as they are while the ring's ids go back: the kernel sees ``hi`` above
    ``next_id`` and starts the table over, so the new items' windows are not read from
    the old cells."""
    step = {"obs": torch.zeros(2, 1), "reward": torch.ones(2)}
    rb = ReplayBuffer(64, num_envs=2, nstep=NStep(3, GAMMA), seed=0)
    for _ in range(20):
        rb.extend(step)
    _gather(rb, np.array([0]), which)
    assert _table(rb).state[0] == 36
    empty = ReplayBuffer(64, seed=0)
    empty.extend({"obs": torch.zeros(2, 1), "reward": torch.ones(2)})
    empty.clear()  # next_id 64, nothing live, no index in its state
    state = empty.state_dict()
    state["ring"]["next_id"] = 0
    rb.load_state_dict(state)
    for _ in range(5):
        rb.extend({"obs": torch.zeros(2, 1), "reward": torch.full((2,), 2.0)})
    got = _gather(rb, np.arange(10), which)
    _assert_same(got, _gather(rb, np.arange(10), "numpy"))
    assert got["nstep_return"][0].item() == pytest.approx(2 * (1 + GAMMA + GAMMA**2))


@pytest.mark.parametrize("which", ["compiled", "python"])
def test_an_empty_state_without_an_index_forgets_the_table(which: str) -> None:
    """As above, but the new items are written past the table's old ``hi`` before the
    next sample: the kernel cannot tell, so the load itself forgets the table (regression:
    ids 0 .. 35 were read from the old items' cells, returns of reward 1 for reward 2)."""

    def step(reward: float, end: bool = False) -> dict[str, torch.Tensor]:
        return {
            "obs": torch.zeros(2, 1),
            "reward": torch.full((2,), reward),
            "terminated": torch.tensor([end, end]),
        }

    rb = ReplayBuffer(64, num_envs=2, nstep=NStep(3, GAMMA), seed=0)
    for t in range(20):
        rb.extend(step(1.0, t == 10))  # the open episodes start at ids 22 and 23
    _gather(rb, np.array([0]), which)
    assert _table(rb).state[0] == 36
    empty = ReplayBuffer(64, seed=0)
    empty.extend(step(1.0))
    empty.clear()
    state = empty.state_dict()
    state["ring"]["next_id"] = 0
    rb.load_state_dict(state)
    for _ in range(20):
        rb.extend(step(2.0))
    ids = np.arange(40)
    got = _gather(rb, ids, which)
    _assert_same(got, _gather(rb, ids, "numpy"))
    assert got["nstep_return"][0].item() == pytest.approx(2 * (1 + GAMMA + GAMMA**2))
    # the index starts over too: the new items' episodes start at 0 and 1, not at the
    # old items' (whose ids the new ones reuse)
    assert rb.episodes.episode_start([0, 1, 38, 39]).tolist() == [0, 1, 0, 1]
    assert rb.episodes.predecessors([0, 1, 2]).tolist() == [-1, -1, 0]


@pytest.mark.parametrize("which", ["compiled", "python"])
def test_the_kernel_restarts_a_table_above_next_id(which: str) -> None:
    """The kernel's own guard: a ring moved back under the table with no load at all
    (``Ring.load_state_dict`` alone, as nothing in xpbank does now) has ``hi`` above
    ``next_id``: the table starts over instead of reading the old items' cells."""
    rb = ReplayBuffer(64, num_envs=2, nstep=NStep(3, GAMMA), seed=0)
    for _ in range(20):
        rb.extend({"obs": torch.zeros(2, 1), "reward": torch.ones(2)})
    _gather(rb, np.array([0]), which)
    assert _table(rb).state[0] == 36
    rb._ring.load_state_dict({"next_id": 0, "size": 0})
    rb.episodes.clear()
    for _ in range(10):
        rb.extend({"obs": torch.zeros(2, 1), "reward": torch.full((2,), 2.0)})
    got = _gather(rb, np.arange(20), which)
    _assert_same(got, _gather(rb, np.arange(20), "numpy"))
    assert got["nstep_return"][0].item() == pytest.approx(2 * (1 + GAMMA + GAMMA**2))
    assert _table(rb).state[0] == 16


def test_an_nstep_sample_is_not_written_back_whole() -> None:
    """``update(batch["index"], batch)`` of an n-step sample would move each window's
    last next fields onto its item: it raises, naming why, and writes nothing."""
    rb = ReplayBuffer(20, num_envs=1, nstep=NStep(2, GAMMA), seed=0)
    rb.extend({"obs": torch.zeros(5, 1), "next_obs": torch.arange(5.0)[:, None], "reward": torch.ones(5)})
    batch = rb.sample(4)
    # bits, not values: the 15 slots never written hold whatever the allocator gave,
    # NaN included, and NaN != NaN
    before = rb.storage.view("next_obs").view(torch.int32).clone()
    with pytest.raises(
        SpecError, match=r"got an n-step sample \(it has 'nstep_return'\).*pass only the fields"
    ):
        rb.update(batch["index"], batch)
    assert torch.equal(rb.storage.view("next_obs").view(torch.int32), before)
    rb.update(batch["index"], {"reward": batch["reward"] * 2})  # a field subset is fine


def test_switching_the_kernel_off_takes_effect_on_a_warm_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """``NStep``'s cached fused entry is valid only for the kernel it was made with:
    after ``_compiled`` is switched off, the next sample takes the NumPy path (which
    reads no table: a changed cell does not show), without setting the entry aside."""
    rb = ReplayBuffer(64, num_envs=2, nstep=NStep(3, GAMMA), seed=0)
    rb.extend({"obs": torch.zeros(20, 1), "reward": torch.ones(20)})
    ids = torch.tensor([4])
    with _kernel("compiled"):
        rb._nstep.gather(rb._storage, rb._ring, ids % 64, ids, None)  # warm: entry and table made
        _table(rb).returns[4] = 123.0
        assert rb._nstep.gather(rb._storage, rb._ring, ids % 64, ids, None)["nstep_return"].item() == 123.0
    monkeypatch.setattr(nstep_kernel, "_compiled", [None])
    got = rb._nstep.gather(rb._storage, rb._ring, ids % 64, ids, None)["nstep_return"].item()
    assert got == pytest.approx(1 + GAMMA + GAMMA**2)
