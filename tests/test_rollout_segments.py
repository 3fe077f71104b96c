"""The segmented layout (metta's ``[segments, bptt_horizon]``) and BPTT segment minibatches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xpbank import CapacityError, RolloutBuffer, gae
from xpbank.rollout import anneal_beta, segment_sizes
from xpbank.rollout.minibatch import segment_plan


def test_segment_sizes_follow_metta() -> None:
    s = segment_sizes(total_agents=4, batch_size=64, bptt_horizon=8, minibatch_size=32, max_minibatch_size=16)
    assert (s.segments, s.minibatch_size, s.minibatch_segments) == (8, 16, 2)
    assert (s.num_minibatches, s.accumulate_minibatches) == (4, 2)
    same = segment_sizes(4, 64, 8, 32, 32)
    assert (same.minibatch_segments, same.num_minibatches, same.accumulate_minibatches) == (4, 2, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((4, 60, 8, 16, 16), "batch_size 60 is not a multiple of bptt_horizon 8"),
        ((9, 64, 8, 16, 16), r"gives 8 segments, fewer than total_agents 9"),
        ((4, 64, 8, 12, 12), "minibatch_size 12 is not a multiple of bptt_horizon 8"),
        ((4, 64, 8, 48, 16), None),
        ((4, 64, 8, 40, 16), "minibatch_size 40 is not a multiple of max_minibatch_size 16"),
        ((4, 48, 8, 32, 32), "batch_size 48 is not a multiple of minibatch_size 32"),
        ((0, 64, 8, 16, 16), "total_agents: expected a positive int, got 0"),
    ],
)
def test_segment_sizes_errors(args: tuple[int, ...], message: str | None) -> None:
    if message is None:
        assert segment_sizes(*args).accumulate_minibatches == 3
        return
    with pytest.raises(CapacityError, match=message):
        segment_sizes(*args)


def _ref_rows(schedule: list[list[int]], agents: int, segments: int, horizon: int):
    """List model: each agent fills its row; a full row takes the next free row, in order."""
    rows: list[list[tuple[int, int]]] = [[] for _ in range(segments)]  # (agent, step number)
    row_of = list(range(agents))
    next_free = agents
    chain: dict[int, list[int]] = {a: [a] for a in range(agents)}
    counts = [0] * agents
    for ids in schedule:
        filled_now = []
        for a in ids:
            rows[row_of[a]].append((a, counts[a]))
            counts[a] += 1
            if len(rows[row_of[a]]) == horizon:
                filled_now.append(a)
        for a in filled_now:  # fresh rows go to filling agents in the order of the ids
            if next_free < segments:
                row_of[a] = next_free
                chain[a].append(next_free)
                next_free += 1
            else:
                row_of[a] = -1
    return rows, chain


def _seg_step(ids: list[int], counts: list[int]) -> dict:
    return {
        "agent": torch.tensor(ids, dtype=torch.int64),
        "t": torch.tensor([counts[a] for a in ids], dtype=torch.int64),
        "reward": torch.tensor([float(a + counts[a]) for a in ids]),
        "value": torch.tensor([0.1 * counts[a] for a in ids]),
        "terminated": torch.tensor([counts[a] % 5 == 4 for a in ids]),
        "truncated": torch.tensor([counts[a] % 7 == 2 for a in ids]),
        "final_value": torch.tensor([100.0 + counts[a] for a in ids]),  # V(true final obs)
    }


def _drive(rb: RolloutBuffer, schedule: list[list[int]], agents: int) -> list[list[int]]:
    """Store the schedule's agents that have room, until ready; returns what was stored."""
    counts, done = [0] * agents, []
    for wanted in schedule:
        room = rb.room()
        ids = [a for a in wanted if room[a]]
        if rb.ready():
            break
        if not ids:
            continue
        rb.store(_seg_step(ids, counts), ids)
        done.append(ids)
        for a in ids:
            counts[a] += 1
    return done


def _out_of_step_schedule(agents: int, seed: int, length: int = 200) -> list[list[int]]:
    g = np.random.default_rng(seed)
    weights = g.random(agents) + 0.2  # some agents step more often than others
    return [[a for a in range(agents) if g.random() < weights[a] / weights.max()] for _ in range(length)]


@pytest.mark.parametrize("seed", range(4))
def test_out_of_step_agents_fill_their_own_rows_at_their_own_positions(seed: int) -> None:
    agents, bptt, segments = 3, 4, 6
    rb = RolloutBuffer.segmented(agents, segments * bptt, bptt, minibatch_size=8)
    schedule = _drive(rb, _out_of_step_schedule(agents, seed), agents)
    assert rb.ready() and not rb.room().any()
    ref_rows, _ = _ref_rows(schedule, agents, segments, bptt)
    got = next(rb.segment_minibatches(minibatch_segments=segments))  # all rows, in order
    for s in range(segments):
        assert list(zip(got["agent"][s].tolist(), got["t"][s].tolist(), strict=True)) == ref_rows[s]
    with pytest.raises(CapacityError, match=r"agent 1: its segment is full and all 6 segments are taken"):
        rb.store(_seg_step([1], [99] * agents), [1])


def test_agents_in_one_slice_do_not_drift() -> None:
    # metta's flaw: a slice of agents at different positions was written at the first
    # agent's position. Here agent 1 is one step ahead of agent 0 in the same slice.
    rb = RolloutBuffer.segmented(2, 16, 4, minibatch_size=4)
    rb.store({"x": torch.tensor([10.0])}, [1])
    for k in range(3):
        rb.store({"x": torch.tensor([float(k), 11.0 + k])}, slice(0, 2))
    rb.store({"x": torch.tensor([3.0, 20.0])}, [0, 1])  # agent 1 starts its 2nd row
    while not rb.ready():
        ids = torch.nonzero(rb.room()).squeeze(1)
        rb.store({"x": torch.full((len(ids),), -1.0)}, ids)
    rows = next(rb.segment_minibatches(minibatch_segments=4))["x"]
    assert rows[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert rows[1].tolist() == [10.0, 11.0, 12.0, 13.0]
    assert rows[2].tolist() == [20.0, -1.0, -1.0, -1.0]  # agent 1 filled first: next free row


@pytest.mark.parametrize("seed", range(3))
def test_segmented_returns_bootstrap_across_each_agents_rows(seed: int) -> None:
    agents, bptt, segments = 2, 3, 6
    rb = RolloutBuffer.segmented(agents, segments * bptt, bptt, minibatch_size=6)
    schedule = _drive(rb, _out_of_step_schedule(agents, seed), agents)
    last = torch.tensor([0.7, -0.4])
    adv, ret = rb.compute_returns(last, gamma=0.9, lam=0.8)
    assert adv.shape == (segments, bptt)
    rows_in_order = next(rb.segment_minibatches(minibatch_segments=segments))
    given = rb.compute_returns(last, gamma=0.9, lam=0.8, final_values=rows_in_order["final_value"] * 1.0)[0]
    torch.testing.assert_close(given, adv)  # final_values in the buffer's [S, H] shape
    zeros = rb.compute_returns(last, gamma=0.9, lam=0.8, final_values=torch.zeros(segments, bptt))[0]
    assert not torch.allclose(zeros, adv)  # the given values are the ones used
    adv, ret = rb.compute_returns(last, gamma=0.9, lam=0.8)
    rows, chain = _ref_rows(schedule, agents, segments, bptt)
    for a in range(agents):
        # each row is GAE over its bptt steps, bootstrapped with V of the agent's next step
        for i, s in enumerate(r for r in chain[a] if r >= 0):
            steps = [c for _, c in rows[s]]
            r = torch.tensor([[float(a + c)] for c in steps])
            v = torch.tensor([[0.1 * c] for c in steps])
            term = torch.tensor([[c % 5 == 4] for c in steps])
            trunc = torch.tensor([[c % 7 == 2] for c in steps])
            nxt = 0.1 * (steps[-1] + 1) if i + 1 < len(chain[a]) and chain[a][i + 1] >= 0 else float(last[a])
            nv = torch.cat([v[1:], torch.tensor([[nxt]])])
            nv = torch.where(trunc, torch.tensor([[100.0 + c] for c in steps]), nv)
            want_adv, want_ret = gae(r, v, nv, term, trunc, 0.9, 0.8)
            torch.testing.assert_close(adv[s], want_adv[:, 0])
            torch.testing.assert_close(ret[s], want_ret[:, 0])


def _ready_segmented(seed: int = 0) -> RolloutBuffer:
    rb = RolloutBuffer.segmented(4, 64, 4, minibatch_size=16, seed=seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(16):
        rb.add(
            {"reward": torch.randn(4, generator=g), "value": torch.zeros(4), "terminated": torch.zeros(4) > 1}
        )
    return rb


def test_sequential_segments_visit_rows_in_order() -> None:
    rb = _ready_segmented()
    batches = list(rb.segment_minibatches(epochs=2))
    assert len(batches) == 8 and batches[0].batch_size == (4, 4)
    rows = torch.cat([b["index"][:, 0] // 4 for b in batches[:4]])
    assert rows.tolist() == list(range(16))
    assert all((b["weight"] == 1).all() for b in batches)
    assert (batches[0]["index"][0] == torch.arange(4)).all()


def test_prioritized_segments_weights_follow_the_formula() -> None:
    rb = _ready_segmented(1)
    adv, _ = rb.compute_returns(torch.zeros(4))
    alpha, beta0, progress = 0.7, 0.4, 0.5
    beta = anneal_beta(beta0, alpha, progress)
    assert beta == pytest.approx(0.4 + 0.6 * 0.7 * 0.5)
    prio = adv.abs().sum(1).double() ** alpha
    p = (prio + 1e-6) / (prio.sum() + 1e-6 * 16)
    for b in rb.segment_minibatches(alpha=alpha, beta0=beta0, progress=progress):
        rows = b["index"][:, 0] // 4
        assert len(set(rows.tolist())) == 4  # distinct rows in a minibatch
        want = ((16 * p[rows]) ** -beta).float()
        torch.testing.assert_close(b["weight"][:, 0], want)
        assert (b["weight"] == b["weight"][:, :1]).all()
    with pytest.raises(CapacityError, match="prioritized segments"):
        _ready_segmented().segment_minibatches(alpha=0.5)


def test_prioritized_segment_frequencies_match_priorities() -> None:
    # seeded: 8000 draws of one row; each frequency within 0.02 (4 sigma) of its probability
    adv = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0], [3.0, 3.0]])
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for rows, _ in segment_plan(adv, 1, 8000, alpha=1.0, beta=1.0, generator=g):
        counts[rows] += 1
    prio = adv.abs().sum(1).double()
    p = (prio + 1e-6) / (prio.sum() + 4e-6)
    assert torch.allclose(counts.double() / 8000, p, atol=0.02)


def test_time_major_buffer_cut_into_bptt_windows() -> None:
    rb = RolloutBuffer(2, 6)
    for t in range(6):
        rb.add({"t": torch.full((2,), t), "e": torch.arange(2)})
    got = list(rb.segment_minibatches(bptt_horizon=3, minibatch_segments=2))
    windows = torch.cat([b["t"] for b in got]).tolist()
    envs = torch.cat([b["e"][:, 0] for b in got]).tolist()
    assert windows == [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]] and envs == [0, 0, 1, 1]
    with pytest.raises(CapacityError, match="bptt_horizon 4 does not divide the 6 steps"):
        rb.segment_minibatches(bptt_horizon=4, minibatch_segments=1)
    with pytest.raises(CapacityError, match="minibatch_segments 3 does not divide the 4 segments"):
        rb.segment_minibatches(bptt_horizon=3, minibatch_segments=3)
    with pytest.raises(CapacityError, match="minibatch_segments: expected a positive int"):
        rb.segment_minibatches(bptt_horizon=3)


def test_segmented_update_and_ratio_reset() -> None:
    rb = RolloutBuffer.segmented(2, 8, 2, minibatch_size=4)
    for _ in range(4):
        rb.add({"ratio": torch.full((2,), 2.0), "value": torch.zeros(2)})
    b = next(rb.segment_minibatches())
    rb.update(b["index"], {"value": torch.full((2, 2), 5.0), "ratio": torch.ones(2, 2)})
    again = next(rb.segment_minibatches())
    assert (again["value"] == 5.0).all() and (again["ratio"] == 1.0).all()
    rb.reset_importance_sampling_ratios()
    assert all((b["ratio"] == 1.0).all() for b in rb.segment_minibatches())
    assert rb.stats()["ratio"] == 1.0
