"""xpbank.compat.metta.Experience: metta's API, its sizes and errors, and the three fixes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from xpbank import Field, Spec
from xpbank.compat.metta import Experience
from xpbank.errors import CapacityError, SpecError, XpbankIndexError

SPEC = Spec(
    {
        "env_obs": Field((3,), torch.uint8),
        "actions": Field((2,), torch.int64),
        "rewards": Field(()),
        "values": Field(()),
        "act_log_prob": Field(()),
        "dones": Field(()),
        "truncateds": Field(()),
        "ratio": Field(()),
    }
)


def _step(n: int, value: float, spec: Spec = SPEC) -> TensorDict:
    """A step of ``n`` agents whose every field holds ``value``."""
    data = {k: torch.full((n, *f.shape), value).to(f.dtype) for k, f in spec.items()}
    return TensorDict(data, batch_size=[n])


def _exp(agents: int = 2, batch: int = 16, bptt: int = 4, mb: int = 8, cap: int = 8, spec=SPEC) -> Experience:
    return Experience(agents, batch, bptt, mb, cap, spec, "cpu")


# -- construction: both spec kinds, metta's sizes, metta's errors ----------------------
def test_torchrl_composite_and_xpbank_spec_give_the_same_buffer():
    torchrl = pytest.importorskip("torchrl.data")
    comp = torchrl.Composite({k: torchrl.Unbounded(shape=f.shape, dtype=f.dtype) for k, f in SPEC.items()})
    a, b = _exp(spec=comp), _exp(spec=SPEC)
    assert a.buffer.batch_size == b.buffer.batch_size == (4, 4)
    for key in SPEC:
        assert a.buffer[key].shape == b.buffer[key].shape and a.buffer[key].dtype == b.buffer[key].dtype
        assert (a.buffer[key] == 0).all()  # metta's spec.zero()


@pytest.mark.parametrize(
    ("agents", "batch", "bptt", "mb", "cap"),
    [(2, 16, 4, 8, 8), (4, 64, 8, 32, 16), (3, 48, 4, 24, 8), (1, 8, 2, 8, 2), (5, 40, 4, 4, 16)],
)
def test_sizes_are_metta_formulas(agents, batch, bptt, mb, cap):
    exp = _exp(agents, batch, bptt, mb, cap)
    segments = batch // bptt
    minibatch_size = min(mb, cap)
    assert exp.segments == segments
    assert exp.minibatch_size == minibatch_size
    assert exp.accumulate_minibatches == max(1, mb // cap)
    assert exp.minibatch_segments == minibatch_size // bptt
    assert exp.num_minibatches == segments // (minibatch_size // bptt)
    assert exp.buffer.batch_size == (segments, bptt)
    assert exp.give_me_empty_md_td().batch_size == (exp.minibatch_segments, bptt)
    assert len(exp.give_me_empty_md_td().keys()) == 0


def test_constructor_errors_name_the_numbers_as_metta_does():
    with pytest.raises(
        CapacityError,
        match=r"batch_size \(16\) is too small for 5 agents\.\nSegments = batch_size // bptt_horizon",
    ) as err:
        _exp(agents=5, batch=16, bptt=4)
    assert "segments >= total_agents (5)" in str(err.value) and "trainer.batch_size >= 20" in str(err.value)
    with pytest.raises(CapacityError, match="minibatch_size 6 must be divisible by bptt_horizon 4"):
        _exp(mb=6, cap=8)
    with pytest.raises(CapacityError, match=r"segments \(6\) must be divisible by minibatch_segments \(4\)"):
        _exp(batch=24, mb=16, cap=16)
    dup = Spec({"a.b": Field(()), ("a", "b"): Field(())})
    with pytest.raises(SpecError, match=r"Duplicate keys found in experience_spec: \['a\.b'\]"):
        _exp(spec=dup)
    with pytest.raises(SpecError, match="experience_spec: expected an xpbank Spec or a torchrl Composite"):
        _exp(spec={"rewards": 1})


def test_sizes_metta_accepts_silently_are_refused():  # deliberate differences, documented
    with pytest.raises(CapacityError, match="batch_size 18 is not a multiple of bptt_horizon 4"):
        _exp(batch=18)
    with pytest.raises(CapacityError, match="minibatch_size 12 is not a multiple of max_minibatch_size 8"):
        _exp(batch=48, mb=12, cap=8)


# -- storing: each agent at its own row and time index ---------------------------------
def _reference(
    agents: int, segments: int, bptt: int, calls: list[list[int]]
) -> tuple[torch.Tensor, list[int]]:
    """Brute force: every agent fills a row, then takes the next free row; agents with no
    row left are skipped. Cell = the call number that wrote it (0 = never)."""
    cells = torch.zeros(segments, bptt)
    row, pos, free, full = list(range(agents)), [0] * agents, agents, 0
    for n, ids in enumerate(calls, start=1):
        for a in ids:
            if row[a] < 0:
                continue
            cells[row[a], pos[a]] = n
            pos[a] += 1
            if pos[a] == bptt:
                full += 1
                row[a], pos[a] = (free, 0) if free < segments else (-1, 0)
                free = min(segments, free + 1)
    return cells, [full]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_store_matches_a_reference_with_agents_out_of_step(data):
    agents = data.draw(st.integers(1, 4))
    exp = _exp(agents=agents, batch=24, bptt=3, mb=3, cap=3)
    calls = data.draw(st.lists(st.lists(st.integers(0, agents - 1), unique=True, min_size=1), max_size=40))
    for n, ids in enumerate(calls, start=1):
        exp.store(_step(len(ids), float(n)), torch.tensor(ids))
    want, (full,) = _reference(agents, exp.segments, 3, calls)
    assert torch.equal(exp.buffer["rewards"], want)
    assert exp.ready_for_training == (full >= exp.segments)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_slices_take_the_direct_write_and_store_as_ids_do(data):
    """``store(td, slice)`` of every field writes straight into the views: the same cells,
    episode counts and skipped agents as the checked path (ids as a tensor), and the reference."""
    agents = data.draw(st.integers(1, 4))
    direct, checked = (_exp(agents=agents, batch=24, bptt=3, mb=3, cap=3) for _ in range(2))
    calls = []
    for n in range(1, data.draw(st.integers(0, 40)) + 1):
        lo = data.draw(st.integers(0, agents - 1))
        hi = data.draw(st.integers(lo + 1, agents))
        step = _step(hi - lo, float(n))
        step["dones"] = torch.tensor([float((n + a) % 4 == 0) for a in range(lo, hi)])
        direct.store(step, slice(lo, hi))
        checked.store(step.clone(), torch.arange(lo, hi))
        calls.append(list(range(lo, hi)))
    want, (full,) = _reference(agents, direct.segments, 3, calls)
    assert torch.equal(direct.buffer["rewards"], want)
    for key in SPEC:
        assert torch.equal(direct.buffer[key], checked.buffer[key]), key
    assert direct.stats() == checked.stats()
    assert direct.ready_for_training == checked.ready_for_training == (full >= direct.segments)


def test_unseeded_experiences_draw_their_seed_from_torch():
    """Prioritized segment orders repeat after the same ``torch.manual_seed``."""

    def order(seed: int) -> list[float]:
        torch.manual_seed(seed)
        exp = _exp(agents=2, batch=32, bptt=4, mb=8, cap=8)
        n = 0
        while not exp.ready_for_training:
            n += 1
            step = _step(2, float(n))
            step["dones"], step["truncateds"] = torch.zeros(2), torch.zeros(2)
            exp.store(step, slice(0, 2))
        exp.rollout.compute_returns(torch.zeros(2), 0.9, 0.9)
        batches = exp.rollout.segment_minibatches(epochs=3, alpha=1.0)
        return torch.cat([td["rewards"][:, 0] for td in batches]).tolist()

    assert order(0) == order(0)
    assert order(0) != order(1)


def test_out_of_step_agents_each_write_at_their_own_time_index():
    exp = _exp(agents=2, batch=16, bptt=4)
    exp.store(_step(1, 1.0), slice(0, 1))  # agent 0 is one step ahead
    exp.store(_step(2, 2.0), slice(0, 2))
    # metta writes both at agent 0's index 1 (agent 1's index 0 stays empty)
    assert exp.buffer["rewards"][0].tolist() == [1.0, 2.0, 0.0, 0.0]
    assert exp.buffer["rewards"][1].tolist() == [2.0, 0.0, 0.0, 0.0]


def test_store_ignores_extra_keys_and_zeroes_missing_ones():
    exp = _exp()
    td = _step(2, 3.0).exclude("values")
    td["_segment_indices"] = torch.zeros(2)
    exp.store(td, slice(0, 2))
    assert exp.buffer["rewards"][:2, 0].tolist() == [3.0, 3.0]
    assert exp.buffer["values"][:2, 0].tolist() == [0.0, 0.0]


def test_bad_steps_leave_the_buffer_as_it_was():
    exp = _exp()
    exp.store(_step(2, 1.0), slice(0, 2))
    before = exp.buffer.clone()
    bad = _step(2, 5.0)
    bad["env_obs"] = torch.zeros(2, 4, dtype=torch.uint8)
    with pytest.raises(SpecError, match="env_obs"):
        exp.store(bad, slice(0, 2))
    with pytest.raises(CapacityError, match=r"env_id: agent 7 is out of range \[0, 2\)"):
        exp.store(_step(1, 5.0), [7])
    with pytest.raises(SpecError, match="one row per env"):
        exp.store(_step(3, 5.0), slice(0, 2))
    assert (exp.buffer == before).all()
    exp.store(_step(2, 2.0), slice(0, 2))  # the agents' positions did not move
    assert exp.buffer["rewards"][0, :2].tolist() == [1.0, 2.0]


def test_agents_without_a_free_segment_are_skipped():
    exp = _exp(agents=3, batch=8, bptt=2, mb=2, cap=2)  # 4 segments for 3 agents
    n = 0
    while not exp.ready_for_training:
        n += 1
        exp.store(_step(3, float(n)), slice(0, 3))
    assert n == 4  # agent 0 fills row 3; agents 1 and 2 had no row left for steps 3, 4
    assert exp.buffer["rewards"].tolist() == [[1, 2], [1, 2], [1, 2], [3, 4]]


def test_reset_for_rollout_starts_over():
    exp = _exp()
    while not exp.ready_for_training:
        exp.store(_step(2, 1.0), slice(0, 2))
    exp.reset_for_rollout()
    assert not exp.ready_for_training
    exp.store(_step(2, 9.0), slice(0, 2))
    assert exp.buffer["rewards"][:2, 0].tolist() == [9.0, 9.0]


# -- fix 1: update writes into buffer ------------------------------------------------
def test_update_writes_into_buffer():
    exp = _exp()
    while not exp.ready_for_training:
        exp.store(_step(2, 1.0), slice(0, 2))
    idx = torch.tensor([3, 1])
    new = TensorDict({"values": torch.arange(8.0).view(2, 4), "ratio": torch.full((2, 4), 0.5)}, [2, 4])
    exp.update(idx, new)
    assert exp.buffer["values"][3].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert exp.buffer["values"][1].tolist() == [4.0, 5.0, 6.0, 7.0]
    assert exp.buffer["values"][0].tolist() == [1.0] * 4
    assert (exp.buffer["ratio"][idx] == 0.5).all()
    mb = next(exp.rollout.segment_minibatches())  # the minibatch readers see it too
    assert mb["values"].shape == (2, 4)
    exp.reset_importance_sampling_ratios()
    assert (exp.buffer["ratio"] == 1.0).all()
    # metta's way, on a plain TensorDict, changes nothing: it updates a copy
    plain = exp.buffer.clone()
    plain[idx].update(TensorDict({"values": torch.zeros(2, 4)}, [2, 4]))
    assert plain["values"][3].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_update_refuses_bad_input_before_writing():
    exp = _exp()
    while not exp.ready_for_training:
        exp.store(_step(2, 1.0), slice(0, 2))
    before = exp.buffer.clone()
    with pytest.raises(SpecError, match="nope"):
        exp.update(
            torch.tensor([0]), TensorDict({"values": torch.zeros(1, 4), "nope": torch.zeros(1, 4)}, [1, 4])
        )
    with pytest.raises(SpecError, match="leading shape"):
        exp.update(torch.tensor([0, 1]), TensorDict({"values": torch.zeros(1, 4)}, [1, 4]))
    with pytest.raises(XpbankIndexError, match="out of range"):
        exp.update(torch.tensor([4]), TensorDict({"values": torch.zeros(1, 4)}, [1, 4]))
    assert (exp.buffer == before).all()


# -- fix 3: from_losses refuses conflicting declarations ------------------------------
class _Loss:
    def __init__(self, spec):
        self.spec, self.attached = spec, None

    def get_experience_spec(self):
        return self.spec

    def attach_replay_buffer(self, experience):
        self.attached = experience


def test_from_losses_merges_and_attaches():
    policy = Spec({"rewards": Field(()), "values": Field(())})
    ppo = _Loss(Spec({"values": Field(()), "act_log_prob": Field(())}))
    aux = _Loss(Spec({"aux": Field((2,))}))
    exp = Experience.from_losses(2, 16, 4, 8, 8, policy, {"ppo": ppo, "aux": aux}, "cpu")
    assert set(exp.buffer.keys()) == {"rewards", "values", "act_log_prob", "aux"}
    assert ppo.attached is exp and aux.attached is exp


def test_from_losses_with_conflicting_keys_names_both_losses():
    policy = Spec({"rewards": Field(())})
    a = _Loss(Spec({"values": Field(())}))
    b = _Loss(Spec({"values": Field((2,), torch.float64)}))
    with pytest.raises(SpecError, match=r"field 'values' is .* in loss 'ppo' but .* in loss 'critic'"):
        Experience.from_losses(2, 16, 4, 8, 8, policy, {"ppo": a, "critic": b}, "cpu")
    with pytest.raises(SpecError, match=r"'rewards' is .* in policy_experience_spec but .* in loss 'x'"):
        Experience.from_losses(
            2, 16, 4, 8, 8, policy, {"x": _Loss(Spec({"rewards": Field((), torch.int64)}))}, "cpu"
        )


def test_from_losses_takes_torchrl_composites():
    torchrl = pytest.importorskip("torchrl.data")
    policy = torchrl.Composite({"rewards": torchrl.Unbounded(shape=(), dtype=torch.float32)})
    loss = _Loss(torchrl.Composite({"values": torchrl.Unbounded(shape=(), dtype=torch.float32)}))
    exp = Experience.from_losses(2, 16, 4, 8, 8, policy, {"ppo": loss}, "cpu")
    assert set(exp.buffer.keys()) == {"rewards", "values"}


# -- stats -------------------------------------------------------------------------------
def test_stats_against_brute_force():
    exp = _exp()
    g = torch.Generator().manual_seed(0)
    n = 0
    while not exp.ready_for_training:
        n += 1
        td = _step(2, 0.0)
        for key in ("rewards", "values", "act_log_prob", "ratio"):
            td[key] = torch.randn(2, generator=g)
        td["actions"] = torch.randint(0, 5, (2, 2), generator=g)
        td["dones"] = torch.tensor([float(n % 3 == 0), 0.0])
        exp.store(td, slice(0, 2))
    s, buf = exp.stats(), exp.buffer
    for key in ("rewards", "values", "act_log_prob", "ratio", "dones", "truncateds"):
        assert s[key] == pytest.approx(float(buf[key].float().mean()), abs=1e-6), key
    assert s["actions_mean"] == pytest.approx(float(buf["actions"].float().mean()))
    assert s["actions_std"] == pytest.approx(float(buf["actions"].float().std()), rel=1e-5)
    assert s["ep_lengths"] == pytest.approx(3.0)  # agent 0 ended an episode every 3 steps
