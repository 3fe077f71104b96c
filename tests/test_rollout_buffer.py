"""RolloutBuffer ``[T, E]``: writes, per-env cursors, errors, returns, update, stats."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from xpbank import (
    BufferChangedError,
    CapacityError,
    Field,
    NotReadyError,
    RolloutBuffer,
    RolloutKeys,
    Spec,
    SpecError,
    StaleIndexError,
    gae,
)

E, T = 3, 4


def _step(
    e: int = E, t: float = 0.0, term: list[bool] | None = None, trunc: list[bool] | None = None
) -> dict:
    """Step ``t`` of ``e`` envs; ``obs`` encodes (t, env) so reads can be checked."""
    return {
        "obs": torch.stack([torch.full((e,), t), torch.arange(e, dtype=torch.float32)], 1),
        "action": torch.full((e, 1), t),
        "reward": torch.full((e,), t + 1.0),
        "value": torch.full((e,), 0.5 * t),
        "log_prob": torch.full((e,), -t),
        "terminated": torch.tensor(term if term is not None else [False] * e),
        "truncated": torch.tensor(trunc if trunc is not None else [False] * e),
        "final_value": torch.zeros(e),
    }


def _full(seed: int = 0, e: int = E, t: int = T) -> tuple[RolloutBuffer, list[dict]]:
    g = torch.Generator().manual_seed(seed)
    rb = RolloutBuffer(e, t, seed=seed)
    steps = []
    for i in range(t):
        s = _step(e, float(i))
        s["reward"] = torch.randn(e, generator=g)
        s["value"] = torch.randn(e, generator=g)
        s["terminated"] = torch.rand(e, generator=g) < 0.2
        s["final_value"] = torch.randn(e, generator=g)
        s["truncated"] = (torch.rand(e, generator=g) < 0.2) & ~s["terminated"]
        rb.add(s)
        steps.append(s)
    return rb, steps


def _stack(steps: list[dict], key: str) -> torch.Tensor:
    return torch.stack([s[key] for s in steps])


def test_add_fills_time_major_and_ready() -> None:
    rb = RolloutBuffer(E, T)
    assert rb.spec is None and not rb.ready() and len(rb) == 0
    for t in range(T):
        rb.add(_step(t=float(t)))
    assert rb.ready() and len(rb) == T * E and rb.shape == torch.Size([T, E])
    for t, td in enumerate(rb.steps()):
        assert td["obs"][:, 0].tolist() == [t] * E and td["obs"][:, 1].tolist() == list(range(E))
        assert td["index"].tolist() == [t * E + e for e in range(E)]


def test_writing_past_the_horizon_names_the_env_and_changes_nothing() -> None:
    rb, _ = _full()
    before = [td.clone() for td in rb.steps()]
    with pytest.raises(CapacityError, match=r"env 0 already holds horizon=4 steps; .* call clear\(\)"):
        rb.add(_step())
    with pytest.raises(CapacityError, match="env 2 already holds horizon=4"):
        rb.store(_step(1), [2])
    assert all((a == b).all() for a, b in zip(before, rb.steps(), strict=True))


def test_store_out_of_step_envs_each_at_its_own_cursor() -> None:
    rb = RolloutBuffer(E, T)
    ref: dict[int, list[float]] = {e: [] for e in range(E)}
    # env 2 runs ahead, envs 0 and 1 catch up in different groupings
    plan = [[2], [2], [0, 1], [2], [1], [0, 2], [0], [1], [1, 0]]
    tick = 0.0
    for ids in plan:
        step = _step(len(ids), t=tick)
        step["obs"][:, 1] = torch.tensor(ids, dtype=torch.float32)
        rb.store(step, torch.tensor(ids))
        for e in ids:
            ref[e].append(tick)
        tick += 1
        assert rb.ready() == all(len(v) == T for v in ref.values())
    assert rb.ready()
    obs = torch.stack([td["obs"] for td in rb.steps()])  # [T, E, 2]
    for e in range(E):
        assert obs[:, e, 0].tolist() == ref[e]  # every env's steps in its own order
        assert obs[:, e, 1].tolist() == [e] * T  # ...in its own column


def test_store_slices_ranges_and_lists() -> None:
    rb = RolloutBuffer(4, 1)
    rb.store(_step(2, 1.0), slice(1, 3))
    rb.store(_step(1, 2.0), [0])
    rb.store(_step(1, 3.0), range(3, 4))
    assert rb.ready()
    assert next(rb.steps())["action"][:, 0].tolist() == [2.0, 1.0, 1.0, 3.0]


def test_store_rejects_bad_ids_and_row_counts_without_writing() -> None:
    rb = RolloutBuffer(E, T)
    rb.add(_step())
    with pytest.raises(CapacityError, match=r"env_ids: id 3 is out of range \[0, 3\)"):
        rb.store(_step(1), [3])
    with pytest.raises(CapacityError, match="env_ids: ids repeat"):
        rb.store(_step(2), [1, 1])
    with pytest.raises(CapacityError, match="env_ids: expected integer ids"):
        rb.store(_step(1), torch.tensor([True, False, False]))
    with pytest.raises(SpecError, match=r"store: expected one row per env \(2\), got 3 rows"):
        rb.store(_step(3), [0, 1])
    with pytest.raises(SpecError, match=r"add: expected one row per env \(3\), got 2 rows"):
        rb.add(_step(2))
    assert len(rb) == E


def test_spec_from_first_step_then_enforced() -> None:
    rb = RolloutBuffer(E, T)
    rb.add(_step())
    bad = _step()
    bad["obs"] = torch.zeros(E, 3)
    with pytest.raises(SpecError, match=r"field 'obs': expected \(\*, 2\) float32, got \(3, 3\) float32"):
        rb.add(bad)
    missing = _step()
    del missing["value"]
    with pytest.raises(SpecError, match="missing field"):
        rb.add(missing)
    assert len(rb) == E


def test_given_spec_and_reserved_names() -> None:
    spec = Spec({"obs": Field((2,)), "reward": Field(())})
    rb = RolloutBuffer(2, 2, spec)
    assert rb.spec == spec
    with pytest.raises(SpecError, match=r"field 'advantage' is reserved"):
        RolloutBuffer(2, 2, Spec({"advantage": Field(())}))
    with pytest.raises(SpecError, match=r"field 'index' is reserved"):
        RolloutBuffer(2, 2).add({"index": torch.zeros(2)})
    with pytest.raises(CapacityError, match="horizon: expected a positive int, got 0"):
        RolloutBuffer(2, 0)


def test_reading_before_the_rollout_is_complete_is_an_error() -> None:
    rb = RolloutBuffer(E, T)
    rb.add(_step())
    rb.store(_step(1), [1])
    with pytest.raises(NotReadyError, match=r"minibatches: the rollout is not complete: env 0 has 1 of"):
        rb.minibatches(2)
    with pytest.raises(NotReadyError, match="compute_returns: the rollout is not complete"):
        rb.compute_returns(torch.zeros(E))


def test_compute_returns_matches_gae_with_true_final_values() -> None:
    rb, steps = _full(1)
    last = torch.tensor([0.3, -0.2, 1.0])
    adv, ret = rb.compute_returns(last, 0.9, 0.8)
    v, trunc = _stack(steps, "value"), _stack(steps, "truncated")
    nv = torch.cat([v[1:], last[None]])
    nv = torch.where(trunc, _stack(steps, "final_value"), nv)
    want_adv, want_ret = gae(_stack(steps, "reward"), v, nv, _stack(steps, "terminated"), trunc, 0.9, 0.8)
    torch.testing.assert_close(adv, want_adv)
    torch.testing.assert_close(ret, want_ret)
    # what minibatches carry is what was computed, slot by slot
    for mb in rb.minibatches(2, epochs=1):
        t, e = mb["index"] // E, mb["index"] % E
        torch.testing.assert_close(mb["advantage"], adv[t, e])
        torch.testing.assert_close(mb["return"], ret[t, e])


def test_truncation_needs_a_final_value() -> None:
    rb = RolloutBuffer(2, 2)
    for step in (_step(2, trunc=[True, False]), _step(2, 1.0)):
        del step["final_value"]
        rb.add(step)
    with pytest.raises(SpecError, match=r"some steps are truncated: .* or store a 'final_value'"):
        rb.compute_returns(torch.zeros(2))
    final = torch.tensor([[10.0, 0.0], [0.0, 0.0]])
    adv, _ = rb.compute_returns(torch.zeros(2), gamma=0.5, lam=1.0, final_values=final)
    # env 0, step 0: r=1, truncated: bootstrap 0.5 * 10, minus V=0
    assert float(adv[0, 0]) == pytest.approx(1.0 + 5.0)
    with pytest.raises(SpecError, match=r"final_values: expected \[2, 2\] values"):
        rb.compute_returns(torch.zeros(2), final_values=torch.zeros(3))
    with pytest.raises(SpecError, match=r"last_values: expected one value per env \(2\), got shape \[3\]"):
        rb.compute_returns(torch.zeros(3), final_values=final)


def test_global_normalization_of_stored_advantages() -> None:
    rb, _ = _full(2)
    raw, ret = rb.compute_returns(torch.zeros(E))
    adv, ret2 = rb.compute_returns(torch.zeros(E), normalize=True)
    torch.testing.assert_close(ret, ret2)
    assert float(adv.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(adv.std()) == pytest.approx(1.0, abs=1e-4)
    torch.testing.assert_close(adv, (raw - raw.mean()) / (raw.std() + 1e-8))


def test_compute_vtrace_from_stored_behaviour_and_ratios() -> None:
    rb, steps = _full(3)
    rb2 = RolloutBuffer(E, T)
    for s in steps:
        rb2.add({**s, "ratio": torch.ones(E)})
    last = torch.zeros(E)
    on_adv, on_vs = rb2.compute_vtrace(None, last, gamma=0.9, lam=0.8)  # ratio 1: on-policy
    _, ret = rb.compute_returns(last, 0.9, 0.8)
    torch.testing.assert_close(on_vs, ret)
    target = _stack(steps, "log_prob") - 0.3  # rho = exp(-0.3) < rho_bar: really off-policy
    adv, vs = rb.compute_vtrace(target, last, gamma=0.9, rho_bar=1.0, c_bar=1.0, lam=0.8)
    assert not torch.allclose(vs, on_vs)
    mb = next(rb.minibatches(1, shuffle=False))
    torch.testing.assert_close(mb["advantage"], adv.reshape(-1))
    torch.testing.assert_close(mb["return"], vs.reshape(-1))
    with pytest.raises(SpecError, match="field 'ratio' is needed here"):
        rb.compute_vtrace(None, last)
    del on_adv


def test_update_really_writes_and_minibatches_never_mutate() -> None:
    rb, _ = _full(4)
    rb.compute_returns(torch.zeros(E))
    mb = next(rb.minibatches(2, shuffle=True))
    mb["value"] += 100.0  # a copy: storage unchanged
    fresh = next(rb.minibatches(1, shuffle=False))
    assert float(fresh["value"].abs().max()) < 50
    rb.update(mb["index"], {"value": mb["value"], "advantage": torch.full_like(mb["advantage"], 7.0)})
    after = next(rb.minibatches(1, shuffle=False))
    hit = torch.zeros(T * E, dtype=torch.bool)
    hit[mb["index"]] = True
    assert (after["value"][hit] > 50).all() and (after["value"][~hit] < 50).all()
    assert (after["advantage"][hit] == 7.0).all() and (after["advantage"][~hit] != 7.0).all()
    rb.update(mb["index"], mb)  # a whole minibatch passes back; reserved entries ignored


def test_update_repeated_ids_keep_the_last_and_padding_is_skipped() -> None:
    rb, _ = _full(5)
    rb.update(torch.tensor([1, 1, -1]), {"value": torch.tensor([1.0, 2.0, 3.0])})
    got = next(rb.minibatches(1, shuffle=False))["value"]
    assert float(got[1]) == 2.0 and 3.0 not in got.tolist()


def test_update_errors_leave_storage_unchanged() -> None:
    rb, _ = _full(6)
    before = next(rb.minibatches(1, shuffle=False)).clone()
    ids = torch.tensor([0, 1])
    with pytest.raises(SpecError, match="advantages/returns are written back before compute_returns"):
        rb.update(ids, {"value": torch.full((2,), 99.0), "advantage": torch.zeros(2)})
    assert torch.equal(next(rb.minibatches(1, shuffle=False))["value"], before["value"])
    with pytest.raises(SpecError, match=r"field 'value' has leading shape \(3,\), expected the indices"):
        rb.update(ids, {"value": torch.zeros(3)})
    with pytest.raises(SpecError, match="unknown field"):
        rb.update(ids, {"nope": torch.zeros(2)})
    rb.clear()
    with pytest.raises(StaleIndexError, match=r"update: index 0 is from an earlier rollout .* \[12, 24\)"):
        rb.update(ids, {"value": torch.zeros(2)})
    for t in range(T):
        rb.add(_step(t=float(t)))
    assert before["obs"].shape == next(rb.minibatches(1, shuffle=False))["obs"].shape


def test_reset_importance_sampling_ratios() -> None:
    rb = RolloutBuffer(2, 2)
    for _ in range(2):
        rb.add({"ratio": torch.full((2,), 3.0), "reward": torch.zeros(2)})
    rb.reset_importance_sampling_ratios()
    assert next(rb.minibatches(1))["ratio"].tolist() == [1.0] * 4
    with pytest.raises(SpecError, match="reset_importance_sampling_ratios: no field 'ratio'"):
        _full()[0].reset_importance_sampling_ratios()


def test_stats_are_means_over_stored_steps_and_episode_lengths() -> None:
    rb = RolloutBuffer(2, 3)
    rb.add(_step(2, 0.0))
    rb.add(_step(2, 1.0, term=[True, False]))
    rb.add(_step(2, 2.0, trunc=[False, True]))
    s = rb.stats()
    assert s["reward"] == pytest.approx(2.0) and s["value"] == pytest.approx(0.5)
    assert s["log_prob"] == pytest.approx(-1.0)
    assert s["episode_length"] == pytest.approx((2 + 3) / 2)
    assert s["action_mean"] == pytest.approx(1.0)
    assert s["action_std"] == pytest.approx(float(torch.tensor([0.0, 0, 1, 1, 2, 2]).std()))
    assert "advantage" not in s
    rb.clear()
    # episodes run across rollouts: env 0 had 1 step since its end, env 1 none
    rb.add(_step(2, 0.0, term=[True, True]))
    assert rb.stats()["episode_length"] == pytest.approx((2 + 1) / 2)
    assert RolloutBuffer(2, 2).stats() == {}


def test_custom_keys() -> None:
    keys = RolloutKeys(reward="rew", value="v", terminated="done", truncated="timeout")
    rb = RolloutBuffer(1, 2, keys=keys)
    for _ in range(2):
        rb.add({"rew": torch.ones(1), "v": torch.zeros(1), "done": torch.zeros(1, dtype=torch.bool)})
    _, ret = rb.compute_returns(torch.zeros(1), gamma=0.5, lam=1.0)
    assert ret[:, 0].tolist() == [1.5, 1.0]


def test_flat_minibatches_cover_every_step_with_a_fresh_order_each_epoch() -> None:
    rb, _ = _full(7, e=4, t=6)
    batches = list(rb.minibatches(num_minibatches=5, epochs=3))
    assert len(batches) == 15 and [b.batch_size[0] for b in batches[:5]] == [5, 5, 5, 5, 4]
    orders = [torch.cat([b["index"] for b in batches[i * 5 : (i + 1) * 5]]) for i in range(3)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(24))
    assert not torch.equal(orders[0], orders[1]) and not torch.equal(orders[1], orders[2])
    # the data of each row is the data of the slot its index names
    steps = list(rb.steps())
    for b in batches[:5]:
        for i, idx in enumerate(b["index"].tolist()):
            assert torch.equal(b["obs"][i], steps[idx // 4]["obs"][idx % 4])
    dropped = list(rb.minibatches(num_minibatches=5, epochs=1, drop_last=True))
    assert [b.batch_size[0] for b in dropped] == [4] * 5
    with pytest.raises(CapacityError, match="num_minibatches 25 is more than the 24 stored steps"):
        rb.minibatches(25)


def test_flat_minibatches_are_seeded_and_normalize_per_minibatch() -> None:
    a = [b["index"] for b in _full(8)[0].minibatches(2, 2)]
    b = [b["index"] for b in _full(8)[0].minibatches(2, 2)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    rb, _ = _full(9)
    with pytest.raises(SpecError, match="no advantages yet"):
        next(rb.minibatches(2, normalize_advantages=True))
    raw, _ = rb.compute_returns(torch.zeros(E))
    for mb in rb.minibatches(2, normalize_advantages=True):
        assert float(mb["advantage"].mean()) == pytest.approx(0.0, abs=1e-5)
    stored = next(rb.minibatches(1, shuffle=False))["advantage"]
    torch.testing.assert_close(stored, raw.reshape(-1))


def test_clear_during_iteration_raises_and_clear_restarts() -> None:
    rb, _ = _full(10)
    it = rb.minibatches(2, epochs=2)
    next(it)
    rb.clear()
    with pytest.raises(BufferChangedError, match="minibatches: the buffer was cleared during iteration"):
        next(it)
    assert len(rb) == 0 and not rb.ready()
    for t in range(T):
        rb.add(_step(t=float(t)))
    assert next(rb.minibatches(1, shuffle=False))["index"][:3].tolist() == [12, 13, 14]


def test_distillation_steps_yield_each_time_step_in_order() -> None:
    rb = RolloutBuffer(2, 3)
    for t in range(3):
        rb.add({"student": torch.full((2, 1), float(t)), "teacher": torch.full((2, 1), -float(t))})
    got = [(td["student"][:, 0].tolist(), td["teacher"][:, 0].tolist()) for td in rb.steps()]
    assert got == [([0.0, 0.0], [-0.0, -0.0]), ([1.0, 1.0], [-1.0, -1.0]), ([2.0, 2.0], [-2.0, -2.0])]


def test_numpy_input_and_repr() -> None:
    rb = RolloutBuffer(2, 1)
    rb.add({"obs": np.ones((2, 3), np.float32)})
    assert "RolloutBuffer(shape=[1, 2], filled=2" in repr(rb)


def test_readme_rollout_example_runs() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "rollouts.md").read_text()
    match = re.search(r"# On-policy rollouts.*?```python\n(.*?)```", text, re.S)
    assert match is not None, "the rollouts guide has no example"
    scope: dict[str, object] = {}
    exec(compile(match.group(1), "docs/guides/rollouts.md", "exec"), scope)
    rb = scope["rb"]
    assert isinstance(rb, RolloutBuffer) and rb.ready()
    assert scope["ret"].shape == (16, 8) and "advantage" in rb.stats()


def test_tensordict_steps_and_nested_keys() -> None:
    from tensordict import TensorDict

    rb = RolloutBuffer(2, 2)
    for t in range(2):
        step = TensorDict(
            {"obs": torch.full((2, 3), float(t)), "next": {"obs": torch.full((2, 3), t + 1.0)}}, [2]
        )
        rb.store(step[1:], [1])
        rb.store(step[:1], slice(0, 1))
    mb = next(rb.minibatches(1, shuffle=False))
    assert mb["next", "obs"][:, 0].tolist() == [1.0, 1.0, 2.0, 2.0]
    rb.update(mb["index"][:1], TensorDict({"next": {"obs": torch.zeros(1, 3)}}, [1]))
    assert next(rb.minibatches(1, shuffle=False))["next", "obs"][0].tolist() == [0.0, 0.0, 0.0]


def test_every_public_method_says_what_it_does_under_threads():
    """RolloutBuffer has no lock: each public method's docstring says so ("Threads:")."""
    import inspect

    missing = []
    for name in dir(RolloutBuffer):
        attr = inspect.getattr_static(RolloutBuffer, name)
        if name.startswith("_") or isinstance(attr, property):
            continue
        if "Threads:" not in (inspect.getdoc(getattr(RolloutBuffer, name)) or ""):
            missing.append(name)
    assert not missing, f"no 'Threads:' note: {missing}"
