"""xpbank.compat.rsl_rl.RolloutStorage against rsl_rl's own storage and PPO."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from xpbank.compat.rsl_rl import Batch, RolloutStorage, Transition
from xpbank.errors import BufferChangedError, CapacityError, NotReadyError, SpecError

rsl_storage = pytest.importorskip("rsl_rl.storage")
Ref = rsl_storage.RolloutStorage

T, E, A = 6, 5, 2


@pytest.fixture
def one_thread():
    """Tiny networks: more torch threads only contend (on a loaded machine, 10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _obs(g: torch.Generator | None = None) -> TensorDict:
    make = (lambda *s: torch.randn(*s, generator=g)) if g is not None else torch.zeros
    return TensorDict({"policy": make(E, 3), "critic": make(E, 4)}, batch_size=[E])


def _transitions(seed: int = 0, recurrent: bool = False, p_done: float = 0.3) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(T):
        tr = Ref.Transition()
        tr.observations = _obs(g)
        tr.actions = torch.randn(E, A, generator=g)
        tr.rewards = torch.randn(E, generator=g)
        tr.dones = (torch.rand(E, generator=g) < p_done).float()
        tr.values = torch.randn(E, 1, generator=g)
        tr.actions_log_prob = torch.randn(E, generator=g)
        tr.distribution_params = (torch.randn(E, A, generator=g), torch.rand(E, A, generator=g))
        if recurrent:  # a GRU actor ([layers, E, H]) and an LSTM critic ((h, c))
            tr.hidden_states = (
                torch.randn(1, E, 8, generator=g),
                (torch.randn(2, E, 8, generator=g), torch.randn(2, E, 8, generator=g)),
            )
        out.append(tr)
    return out


def _pair(recurrent: bool = False, training_type: str = "rl", **kwargs) -> tuple:
    ref, ours = (
        Ref(training_type, E, T, _obs(), [A]),
        RolloutStorage(training_type, E, T, _obs(), [A], **kwargs),
    )
    for tr in _transitions(recurrent=recurrent):
        if training_type == "distillation":
            tr.privileged_actions = tr.actions * 2
        ref.add_transition(tr)
        ours.add_transition(tr)
    if training_type == "rl":
        for st in (ref, ours):  # what rsl_rl's PPO.compute_returns does to the storage
            for t in range(T):
                st.returns[t] = st.values[t] + t
            st.advantages = st.returns - st.values * 0.5
    return ref, ours


FIELDS = [
    "observations",
    "actions",
    "values",
    "advantages",
    "returns",
    "old_actions_log_prob",
    "masks",
    "dones",
]


def _same_layout(a, b) -> None:
    """Same fields set (non-None), shapes and dtypes, key sets of observations."""
    for name in [*FIELDS, "privileged_actions"]:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.shape == y.shape and x.dtype == y.dtype, name
    assert set(a.observations.keys()) == set(b.observations.keys())
    pa, pb = a.old_distribution_params, b.old_distribution_params
    assert (pa is None) == (pb is None)
    if pa is not None:
        assert [p.shape for p in pa] == [p.shape for p in pb]
    for ha, hb in zip(a.hidden_states, b.hidden_states, strict=True):
        ha, hb = (ha, hb) if isinstance(ha, tuple) else ((ha,), (hb,))
        assert [None if h is None else h.shape for h in ha] == [None if h is None else h.shape for h in hb]


def _same_bits(a, b) -> None:
    for key in a.observations.keys(include_nested=True, leaves_only=True):
        assert torch.equal(a.observations[key], b.observations[key]), key
    for name in [*FIELDS[1:], "privileged_actions"]:
        x, y = getattr(a, name), getattr(b, name)
        if x is not None:
            assert torch.equal(x, y), name
    for pa, pb in zip(a.old_distribution_params or (), b.old_distribution_params or (), strict=True):
        assert torch.equal(pa, pb)
    for ha, hb in zip(a.hidden_states, b.hidden_states, strict=True):
        ha, hb = (ha, hb) if isinstance(ha, tuple) else ((ha,), (hb,))
        for x, y in zip(ha, hb, strict=True):
            assert (x is None and y is None) or torch.equal(x, y)


# -- the attributes rsl_rl reads and writes are views with rsl_rl's values --------------
def test_attributes_match_rsl_rl_and_are_views():
    ref, ours = _pair(recurrent=True)
    assert torch.equal(ours.observations["policy"], ref.observations["policy"])
    for name in ["actions", "rewards", "dones", "values", "actions_log_prob", "returns", "advantages"]:
        x, y = getattr(ours, name), getattr(ref, name)
        assert x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y), name
    for x, y in zip(ours.distribution_params, ref.distribution_params, strict=True):
        assert torch.equal(x, y)
    for x, y in zip(ours.saved_hidden_state_c, ref.saved_hidden_state_c, strict=True):
        assert torch.equal(x, y)
    assert ours.step == ref.step == T
    ours.values[2, 1] = 42.0  # writes through the attribute reach the minibatches
    ours.observations["policy"][2, 1] = -7.0
    seen = torch.cat([b.values for b in ours.mini_batch_generator(1, num_epochs=1)])
    obs = torch.cat([b.observations["policy"] for b in ours.mini_batch_generator(1, num_epochs=1)])
    assert (seen == 42.0).sum() == 1 and (obs == -7.0).all(dim=1).sum() == 1


# -- every generator: same field set and shapes as rsl_rl's on identical inputs -------
@pytest.mark.parametrize("k", [1, 3, 4])
def test_mini_batch_generator_same_layout_as_rsl_rl(k):
    ref, ours = _pair()
    a, b = list(ref.mini_batch_generator(k, 2)), list(ours.mini_batch_generator(k, 2))
    assert len(a) == len(b) == 2 * k
    for x, y in zip(a, b, strict=True):
        if T * E % k == 0:
            _same_layout(x, y)


@pytest.mark.parametrize("k", [1, 5])
def test_recurrent_generator_same_layout_as_rsl_rl(k):
    ref, ours = _pair(recurrent=True)
    for x, y in zip(
        ref.recurrent_mini_batch_generator(k, 1), ours.recurrent_mini_batch_generator(k, 1), strict=True
    ):
        if k == E:  # one env each: the shuffled env has its own number of trajectories
            assert x.masks.shape[0] == y.masks.shape[0] == T
            assert x.actions.shape == y.actions.shape
        else:
            _same_layout(x, y)


def test_distillation_generator_same_as_rsl_rl():
    ref, ours = _pair(training_type="distillation")
    for x, y in zip(ref.generator(), ours.generator(), strict=True):
        _same_layout(x, y)
        _same_bits(x, y)


# -- the parity option: rsl_rl's own generator output, bit for bit ---------------------
@pytest.mark.parametrize("k", [3, 4, 7])
def test_parity_mini_batches_bit_for_bit(k):
    ref, ours = _pair(parity=True)
    torch.manual_seed(11)
    a = list(ref.mini_batch_generator(k, 3))
    after_ref = torch.rand(1)
    torch.manual_seed(11)
    b = list(ours.mini_batch_generator(k, 3))
    assert torch.equal(torch.rand(1), after_ref)  # the global RNG advanced the same way
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        _same_bits(x, y)


def test_parity_mini_batches_of_advantages_numpy_cannot_hold():
    """bfloat16 advantages (assigned, as rsl_rl allows): gathered by torch, as rsl_rl's."""
    ref, ours = _pair(parity=True)
    for st in (ref, ours):
        st.advantages = st.advantages.to(torch.bfloat16)
    torch.manual_seed(11)
    a = list(ref.mini_batch_generator(3, 2))
    torch.manual_seed(11)
    b = list(ours.mini_batch_generator(3, 2))
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert y.advantages.dtype == torch.bfloat16
        _same_bits(x, y)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_parity_recurrent_bit_for_bit(k):
    ref, ours = _pair(recurrent=True, parity=True)
    a, b = list(ref.recurrent_mini_batch_generator(k, 2)), list(ours.recurrent_mini_batch_generator(k, 2))
    assert len(a) == len(b) == 2 * k
    for x, y in zip(a, b, strict=True):
        _same_layout(x, y)
        _same_bits(x, y)


# -- the deliberate differences -------------------------------------------------------
def test_default_order_is_fresh_each_epoch_and_keeps_the_remainder():
    _, ours = _pair(seed=3)
    k = 4  # 30 steps: minibatches of 8, 8, 8, 6
    batches = list(ours.mini_batch_generator(k, num_epochs=3))
    rets = [b.returns[:, 0] for b in batches]
    epochs = [torch.cat(rets[i * k : (i + 1) * k]) for i in range(3)]
    for e in epochs:  # every step exactly once per epoch (returns are distinct per step)
        assert sorted(e.tolist()) == sorted(ours.returns.reshape(-1).tolist())
    assert not torch.equal(epochs[0], epochs[1])
    assert [len(r) for r in rets[:k]] == [8, 8, 8, 6]


def test_drop_last_drops_a_different_remainder():
    _, ours = _pair(seed=3, drop_last=True)
    sizes = [len(b.values) for b in ours.mini_batch_generator(4, num_epochs=2)]
    assert sizes == [7] * 8


def test_recurrent_default_covers_every_env():
    _, ours = _pair(recurrent=True, seed=0)
    envs = [b.actions.shape[1] for b in ours.recurrent_mini_batch_generator(2, num_epochs=1)]
    assert envs == [2, 3]  # rsl_rl: [2, 2], env 4 never trained on


def _returns_reference(rewards, values, last, dones, time_outs, final, gamma, lam):
    """Brute force GAE: termination never bootstraps, a time-out from V(true final obs)."""
    adv = torch.zeros(T, E)
    for e in range(E):
        running = 0.0
        for t in reversed(range(T)):
            if dones[t, e] and not time_outs[t, e]:
                nxt, cont = 0.0, 0.0
            elif time_outs[t, e]:
                nxt, cont = float(final[t, e]), 0.0
            else:
                nxt = float(last[e]) if t == T - 1 else float(values[t + 1, e])
                cont = 1.0
            delta = float(rewards[t, e]) + gamma * nxt - float(values[t, e])
            running = delta + gamma * lam * cont * running
            adv[t, e] = running
    return adv, adv + values


def _returns_match_reference(ours, outs: list, finals: list, g: torch.Generator) -> torch.Tensor:
    """``ours.compute_returns`` (a random last value from ``g``, gamma 0.9, lambda 0.8, not
    normalized) against :func:`_returns_reference` given each step's time-outs ``outs`` and
    final values ``finals``; returns the last value."""
    last = torch.randn(E, 1, generator=g)
    ours.compute_returns(last, gamma=0.9, lam=0.8, normalize_advantages=False)
    adv, ret = _returns_reference(
        ours.rewards[..., 0], ours.values[..., 0], last[:, 0], ours.dones[..., 0], torch.stack(outs),
        torch.stack(finals), 0.9, 0.8,
    )  # fmt: skip
    torch.testing.assert_close(ours.advantages[..., 0], adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.returns[..., 0], ret, rtol=1e-5, atol=1e-5)
    return last


def test_compute_returns_bootstraps_time_outs_from_the_true_final_value():
    ours = RolloutStorage("rl", E, T, _obs(), [A])
    g = torch.Generator().manual_seed(5)
    outs, finals = [], []
    for tr in _transitions(seed=5):
        tr.time_outs = (tr.dones > 0) & (torch.rand(E, generator=g) < 0.5)
        tr.final_values = torch.randn(E, 1, generator=g)
        outs.append(tr.time_outs)
        finals.append(tr.final_values[:, 0])
        ours.add_transition(tr)
    assert torch.stack(outs).any()
    last = _returns_match_reference(ours, outs, finals, g)
    ours.compute_returns(last, gamma=0.9, lam=0.8)
    a = ours.advantages
    assert abs(float(a.mean())) < 1e-5 and abs(float(a.std()) - 1) < 1e-4


# -- errors: clear, xpbank, nothing written -------------------------------------------
def test_time_outs_without_final_values_are_refused_before_writing():
    ours = RolloutStorage("rl", E, T, _obs(), [A])
    tr = _transitions()[0]
    tr.dones = torch.ones(E)
    tr.time_outs = torch.ones(E, dtype=torch.bool)
    with pytest.raises(SpecError, match=r"transition\.final_values: some envs timed out"):
        ours.add_transition(tr)
    assert ours.step == 0


def test_bad_transitions_leave_the_storage_as_it_was():
    ours = RolloutStorage("rl", E, T, _obs(), [A])
    good = _transitions()
    ours.add_transition(good[0])
    before = ours.values.clone()
    missing = _transitions()[1]
    missing.values = None
    with pytest.raises(SpecError, match=r"transition\.values: this training type stores it, got None"):
        ours.add_transition(missing)
    wrong = _transitions()[1]
    wrong.actions = torch.zeros(E, A + 1)
    with pytest.raises(SpecError, match="actions"):
        ours.add_transition(wrong)
    short = _transitions()[1]
    short.observations = TensorDict(
        {"policy": torch.zeros(E - 1, 3), "critic": torch.zeros(E - 1, 4)}, [E - 1]
    )
    with pytest.raises(SpecError, match=r"observations\['policy'\]: expected a leading dim of num_envs=5"):
        ours.add_transition(short)
    assert ours.step == 1 and torch.equal(ours.values, before)


def test_first_transition_must_match_the_constructor_layout():
    ours = RolloutStorage("rl", E, T, _obs(), [A + 1])
    with pytest.raises(SpecError, match=r"field 'actions' is .* in the constructor's obs/actions_shape but"):
        ours.add_transition(_transitions()[0])


def test_steps_in_other_forms_are_stored_as_rsl_rl_stores_them():
    """Groups in another order, rewards ``[E, 1]``, bool dones: the same tensors as rsl_rl's."""
    ref, ours = Ref("rl", E, T, _obs(), [A]), RolloutStorage("rl", E, T, _obs(), [A])
    for tr in _transitions():
        obs = tr.observations
        tr.observations = TensorDict({"critic": obs["critic"], "policy": obs["policy"]}, batch_size=[E])
        tr.rewards, tr.dones = tr.rewards.unsqueeze(1), tr.dones.bool()
        ref.add_transition(tr)
        ours.add_transition(tr)
    for name in ("actions", "rewards", "dones", "values", "actions_log_prob"):
        assert torch.equal(getattr(ours, name), getattr(ref, name)), name
    for key in ("policy", "critic"):
        assert torch.equal(ours.observations[key], ref.observations[key]), key


def test_attributes_before_and_after_the_layout_as_rsl_rl():
    ours = RolloutStorage("rl", E, T, _obs(), [A])
    ref = Ref("rl", E, T, _obs(), [A])
    for name in ("distribution_params", "saved_hidden_state_a", "saved_hidden_state_c"):
        assert getattr(ours, name) is None and getattr(ref, name) is None, name
    with pytest.raises(NotReadyError, match=r"^returns: no transition stored yet"):
        _ = ours.returns
    with pytest.raises(AttributeError, match="no attribute 'not_a_field'"):
        _ = ours.not_a_field
    ours.add_transition(_transitions()[0])
    assert "actions" in vars(ours) and ours.actions.shape == ref.actions.shape  # a plain attribute now
    with pytest.raises(SpecError, match=r"^privileged_actions: this storage holds no such field"):
        _ = ours.privileged_actions
    assert not hasattr(ours, "not_a_field")


class _Mine(RolloutStorage):
    """A user's subclass (module level: pickled by reference)."""

    def extra(self) -> str:
        return "mine"


def test_class_before_and_after_the_layout_pickles_and_keeps_subclasses():
    """Until its first step a storage's class answers rsl_rl's attributes through
    ``__getattr__``; once laid out it has none (reads specialize as on rsl_rl's plain
    class), only descriptors for the fields the layout lacks. Either way it is an
    instance of the user's class, keeps that class's methods and pickles as it."""
    import copy
    import pickle

    for cls in (RolloutStorage, _Mine):
        st = cls("rl", E, T, _obs(), [A])
        assert isinstance(st, cls) and "__getattr__" in dir(type(st))
        back = pickle.loads(pickle.dumps(st))
        assert isinstance(back, cls) and back.distribution_params is None
        with pytest.raises(NotReadyError):
            _ = back.values
        trs = _transitions()
        st.add_transition(trs[0])
        assert isinstance(st, cls) and not hasattr(type(st), "__getattr__")
        assert type(st).__name__ == cls.__name__
        for other in (pickle.loads(pickle.dumps(st)), copy.deepcopy(st)):
            assert type(other) is type(st) and torch.equal(other.actions, st.actions)
            with pytest.raises(SpecError, match=r"^time_outs: this storage holds no such field"):
                _ = other.time_outs
            other.add_transition(trs[1])  # its own buffer: the original is untouched
            assert other.step == 2 and st.step == 1
        if cls is _Mine:
            assert st.extra() == "mine"
    tr = _transitions()[0]
    tr.time_outs, tr.final_values = torch.zeros(E, dtype=torch.bool), torch.zeros(E, 1)
    st = RolloutStorage("rl", E, T, _obs(), [A])
    st.add_transition(tr)
    assert st.time_outs.shape == (T, E, 1) and "time_outs" not in vars(type(st))


def test_overflow_and_wrong_mode_and_empty():
    ours = RolloutStorage("rl", E, T, _obs(), [A])
    with pytest.raises(NotReadyError, match="no transition stored yet"):
        _ = ours.values
    for tr in _transitions():
        ours.add_transition(tr)
    with pytest.raises(CapacityError, match="already holds horizon=6 steps"):
        ours.add_transition(_transitions()[0])
    with pytest.raises(NotReadyError, match="no advantages/returns yet"):
        next(ours.mini_batch_generator(2))
    with pytest.raises(SpecError, match="only available for distillation training"):
        next(ours.generator())
    with pytest.raises(SpecError, match="training_type: expected one of"):
        RolloutStorage("bc", E, T, _obs(), [A])
    with pytest.raises(SpecError, match=r"advantages: expected shape \[6, 5, 1\], got \[6, 5\]"):
        ours.advantages = torch.zeros(T, E)
    ours.clear()
    assert ours.step == 0
    ours.add_transition(_transitions()[0])
    assert ours.step == 1


def test_own_transition_and_batch_classes():
    assert RolloutStorage.Transition is Transition and RolloutStorage.Batch is Batch
    tr = Transition()
    tr.values = torch.zeros(1)
    tr.clear()
    assert tr.values is None and tr.time_outs is None and tr.hidden_states == (None, None)
    b = Batch(values=torch.ones(2))
    assert b.values is not None and b.hidden_states == (None, None) and b.masks is None


# -- rsl_rl's real PPO learns with our storage in place of its own --------------------
@pytest.mark.slow
@pytest.mark.parametrize("true_final", [False, True])
def test_rsl_rl_ppo_learns_with_our_storage(true_final, one_thread):
    pytest.importorskip("gymnasium")
    from rsl_rl_task import TIME_LIMIT, make_env, make_ppo, train

    torch.manual_seed(0)
    env = make_env(num_envs=16, seed=0)
    ppo = make_ppo(env, RolloutStorage, steps=64, seed=0)
    assert isinstance(ppo.storage, RolloutStorage)
    lengths = train(ppo, env, iterations=15, steps=64, true_final=true_final)
    # a random policy keeps CartPole up ~22 steps; learning reaches the time limit
    assert lengths[0] < 30
    assert sum(lengths[-3:]) / 3 > 0.6 * TIME_LIMIT


def _recurrent_run(storage_class, **kwargs):
    from rsl_rl.algorithms import PPO
    from rsl_rl.models import RNNModel
    from rsl_rl.modules.distribution import GaussianDistribution

    from rsl_rl_task import make_env, train

    torch.manual_seed(0)
    env = make_env(num_envs=8, seed=0)
    obs = env.get_observations()
    groups = {"actor": ["policy"], "critic": ["policy"]}
    dist = {"class_name": GaussianDistribution}
    actor = RNNModel(obs, groups, "actor", 1, hidden_dims=[16], distribution_cfg=dist, rnn_hidden_dim=8)
    critic = RNNModel(obs, groups, "critic", 1, hidden_dims=[16], rnn_type="gru", rnn_hidden_dim=8)
    storage = storage_class("rl", 8, 16, obs, [1], **kwargs)
    ppo = PPO(actor, critic, storage, num_learning_epochs=2, num_mini_batches=2)
    train(ppo, env, iterations=2, steps=16, true_final=False)
    return [p.detach().clone() for p in actor.parameters()], storage


def test_recurrent_rsl_rl_ppo_runs_on_our_storage_as_on_its_own(one_thread):
    """An LSTM actor and a GRU critic: the first step has no hidden state yet (rsl_rl
    saves zeros there), the rest do; with ``parity`` the training matches rsl_rl's own
    storage up to float rounding (reductions over strided views)."""
    pytest.importorskip("gymnasium")
    theirs, ref = _recurrent_run(Ref)
    ours, st = _recurrent_run(RolloutStorage, parity=True)
    for a, b in zip(theirs, ours, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(ref.saved_hidden_state_a, st.saved_hidden_state_a, strict=True):
        assert a.shape == b.shape == (16, 1, 8, 8)
        assert (b[0] == 0).all() == (a[0] == 0).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# -- reproducible runs, and the runner's one-line switch --------------------------------
def test_unseeded_storages_draw_their_seed_from_torch():
    """Two storages made after the same ``torch.manual_seed`` shuffle alike (rsl_rl's own
    storage is reproducible that way); another seed shuffles differently."""

    def order(seed: int) -> list[float]:
        torch.manual_seed(seed)
        _, ours = _pair()
        return torch.cat([b.returns[:, 0] for b in ours.mini_batch_generator(3, num_epochs=2)]).tolist()

    assert order(0) == order(0)
    assert order(0) != order(1)


def _runner_run(class_name: str, iterations: int = 3, **algorithm):
    """rsl_rl's real ``OnPolicyRunner`` on the CartPole task, seeded as a user seeds it."""
    import contextlib
    import io

    import numpy as np
    from rsl_rl.runners import OnPolicyRunner

    from rsl_rl_task import make_env

    torch.manual_seed(0)
    env = make_env(num_envs=8, seed=0)
    cfg = {
        "num_steps_per_env": 16,
        "save_interval": 100,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "algorithm": {"class_name": class_name, "num_learning_epochs": 2, "num_mini_batches": 3, **algorithm},
        "actor": {
            "class_name": "MLPModel",
            "hidden_dims": [16, 16],
            "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0},
        },
        "critic": {"class_name": "MLPModel", "hidden_dims": [16, 16]},
    }
    lengths = []
    with contextlib.redirect_stdout(io.StringIO()):  # the runner prints its models and logs
        runner = OnPolicyRunner(env, cfg, log_dir=None)
        for _ in range(iterations):
            env.finished = []
            runner.learn(1)
            lengths.append(float(np.mean(env.finished)) if env.finished else 0.0)
    params = [p.detach().clone() for p in runner.alg.actor.parameters()]
    return runner.alg.storage, lengths, params


@pytest.mark.slow
def test_runner_with_xpbank_storage_is_reproducible(one_thread):
    """The runner builds the storage without a seed: two runs after the same
    ``torch.manual_seed`` are the same run (same episode lengths, same parameters)."""
    pytest.importorskip("gymnasium")
    st, a, pa = _runner_run("xpbank.compat.rsl_rl:PPO")
    assert isinstance(st, RolloutStorage) and not st.parity
    _, b, pb = _runner_run("xpbank.compat.rsl_rl:PPO")
    assert a == b
    for x, y in zip(pa, pb, strict=True):
        assert torch.equal(x, y)


@pytest.mark.slow
def test_runner_switch_with_parity_trains_as_rsl_rl(one_thread):
    """One config line puts xpbank's storage under rsl_rl's runner; with
    ``storage_cfg={"parity": True}`` the run is rsl_rl's own (float rounding aside)."""
    pytest.importorskip("gymnasium")
    ref, a, pa = _runner_run("PPO")
    st, b, pb = _runner_run("xpbank.compat.rsl_rl:PPO", storage_cfg={"parity": True})
    assert not isinstance(ref, RolloutStorage) and isinstance(st, RolloutStorage) and st.parity
    assert a == pytest.approx(b)
    for x, y in zip(pa, pb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_ppo_class_takes_rsl_rl_arguments_and_keeps_an_xpbank_storage():
    from rsl_rl.models import MLPModel
    from rsl_rl.utils import resolve_callable

    from xpbank.compat.rsl_rl import PPO, Distillation

    assert resolve_callable("xpbank.compat.rsl_rl:PPO") is PPO
    assert resolve_callable("xpbank.compat.rsl_rl:Distillation") is Distillation
    obs = _obs()
    groups = {"actor": ["policy"], "critic": ["policy"]}
    actor, critic = MLPModel(obs, groups, "actor", A), MLPModel(obs, groups, "critic", 1)
    ppo = PPO(actor, critic, Ref("rl", E, T, obs, [A]), storage_cfg={"seed": 3, "drop_last": True}, gamma=0.9)
    st = ppo.storage
    assert isinstance(st, RolloutStorage) and st.drop_last and st._seed == 3 and ppo.gamma == 0.9
    assert (st.num_envs, st.num_transitions_per_env, st.training_type) == (E, T, "rl")
    ours = RolloutStorage("rl", E, T, obs, [A])
    assert PPO(actor, critic, ours).storage is ours
    with pytest.raises(SpecError, match="storage_cfg: the storage is an xpbank RolloutStorage already"):
        PPO(actor, critic, ours, storage_cfg={"parity": True})


# -- the direct write path and the checked one store the same ----------------------------
def test_dict_observations_take_the_checked_path_and_store_the_same():
    ref, fast = _pair(recurrent=True)
    slow = RolloutStorage("rl", E, T, _obs(), [A])
    for tr in _transitions(recurrent=True):
        tr.observations = dict(tr.observations.items())  # not a TensorDict: checked path
        slow.add_transition(tr)
    for name in ["actions", "rewards", "dones", "values", "actions_log_prob"]:
        assert torch.equal(getattr(slow, name), getattr(fast, name)), name
    assert torch.equal(slow.observations["critic"], ref.observations["critic"])
    for x, y in zip(slow.saved_hidden_state_c, ref.saved_hidden_state_c, strict=True):
        assert torch.equal(x, y)


def test_time_outs_appearing_later_grow_the_layout():
    """Steps without time-out fields store ``dones`` only; the first step that sets them
    adds them (earlier steps: no time-out, terminated where done), then GAE is the reference."""
    ours = RolloutStorage("rl", E, T, _obs(), [A])
    g = torch.Generator().manual_seed(7)
    outs, finals = [], []
    for i, tr in enumerate(_transitions(seed=7)):
        out = torch.zeros(E, dtype=torch.bool)
        if i >= 3:
            out = (tr.dones > 0) & (torch.rand(E, generator=g) < 0.5)
            tr.time_outs, tr.final_values = out, torch.randn(E, 1, generator=g)
        outs.append(out)
        finals.append(tr.final_values[:, 0] if i >= 3 else torch.zeros(E))
        ours.add_transition(tr)
        assert ours.step == i + 1
    assert torch.stack(outs).any() and torch.equal(ours.time_outs[..., 0].bool(), torch.stack(outs))
    _returns_match_reference(ours, outs, finals, g)


def test_clear_during_iteration_raises_at_the_next_minibatch():
    _, ours = _pair(recurrent=True)
    for gen in (ours.mini_batch_generator(2, 2), ours.recurrent_mini_batch_generator(2, 2)):
        next(gen)
        ours.clear()
        with pytest.raises(BufferChangedError, match="cleared during iteration"):
            next(gen)
        for tr in _transitions(recurrent=True):
            ours.add_transition(tr)
        ours.advantages = ours.values.clone()


# -- rsl_rl's runners roll out under torch.inference_mode() -----------------------------
def _inference_fill(st, trs) -> None:
    with torch.inference_mode():  # as OnPolicyRunner / DistillationRunner do
        for tr in trs:
            st.add_transition(tr)


def test_storage_filled_in_inference_mode_holds_normal_tensors_as_rsl_rl():
    ref, ours = Ref("rl", E, T, _obs(), [A]), RolloutStorage("rl", E, T, _obs(), [A])
    for st in (ref, ours):
        _inference_fill(st, _transitions())
        assert not st.rewards.is_inference() and not st.observations["policy"].is_inference()
        st.rewards[0] += 1.0  # writable in place outside inference mode, as rsl_rl's
    assert torch.equal(ours.rewards, ref.rewards)


def test_rsl_rl_distillation_updates_on_our_storage_as_on_its_own(one_thread):
    """Distillation's loss reads the storage's views (autograd saves them): same loss."""
    from rsl_rl.algorithms import Distillation
    from rsl_rl.models import MLPModel

    losses, students = [], []
    for st in (
        Ref("distillation", E, T, _obs(), [A]),
        RolloutStorage("distillation", E, T, _obs(), [A], seed=0),
    ):
        torch.manual_seed(0)
        groups = {"student": ["policy", "critic"], "teacher": ["policy"]}
        student = MLPModel(_obs(), groups, "student", A, hidden_dims=[8])
        teacher = MLPModel(_obs(), groups, "teacher", A, hidden_dims=[8])
        alg = Distillation(student, teacher, st, num_learning_epochs=2, gradient_length=2)
        trs = _transitions()
        for tr in trs:
            tr.privileged_actions = tr.actions * 2
        _inference_fill(st, trs)
        losses.append(alg.update())
        students.append([p.detach().clone() for p in student.parameters()])
    assert losses[0] == losses[1]
    assert all(torch.equal(a, b) for a, b in zip(*students, strict=True))
