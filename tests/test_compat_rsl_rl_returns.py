"""xpbank.compat.rsl_rl.PPO's one-pass returns against rsl_rl's own ``PPO.compute_returns``:
the same float32 operations in the same order, so equal bit for bit (returns, advantages,
normalized advantages), on rsl_rl's storage and on xpbank's."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from xpbank.compat import _rsl_rl_returns
from xpbank.compat.rsl_rl import RolloutStorage

pytest.importorskip("rsl_rl")
from rsl_rl.algorithms import PPO as RslPPO
from rsl_rl.storage import RolloutStorage as RslStorage

from xpbank.compat.rsl_rl import PPO

if _rsl_rl_returns._KERNELS is None:
    pytest.skip("numba is off: the one-pass returns are not used", allow_module_level=True)

# another rsl-rl-lib release whose PPO.compute_returns differs: the switch runs rsl_rl's loop
# (test_declines_before_touching_anything checks that); read the new method, check the kernel
# against it and add its SHA-256 to KNOWN_SOURCES
known = pytest.mark.skipif(
    not _rsl_rl_returns._source_known(RslPPO.compute_returns),
    reason="this rsl-rl-lib's PPO.compute_returns is not the source the one-pass kernel repeats",
)

OBS, ACT = 5, 2


class Critic:
    """rsl_rl's critic as compute_returns uses it: a value per env, a hidden state kept."""

    def __init__(self, last: torch.Tensor) -> None:
        self.last, self.hidden, self.calls = last, ("h",), 0

    def get_hidden_state(self):
        return self.hidden

    def reset(self, hidden_state=None) -> None:
        self.hidden = hidden_state

    def __call__(self, obs):
        self.calls += 1
        return self.last


def _filled(cls, envs: int, steps: int, g: torch.Generator, p_done: float, scale: float = 1.0):
    obs = TensorDict({"policy": torch.zeros(envs, OBS)}, [envs])
    kw = {} if cls is RslStorage else {"seed": 0}
    st = cls("rl", envs, steps, obs, [ACT], **kw)
    for _ in range(steps):
        tr = RslStorage.Transition()
        tr.observations = TensorDict({"policy": torch.randn(envs, OBS, generator=g)}, [envs])
        tr.actions = torch.randn(envs, ACT, generator=g)
        tr.rewards = torch.randn(envs, generator=g) * scale
        tr.dones = (torch.rand(envs, generator=g) < p_done).float()
        tr.values = torch.randn(envs, 1, generator=g) * scale
        tr.actions_log_prob = torch.randn(envs, generator=g)
        tr.distribution_params = (torch.randn(envs, ACT, generator=g), torch.rand(envs, ACT, generator=g))
        st.add_transition(tr)
    return st


def _ppo(st, last, gamma: float, lam: float, per_minibatch: bool):
    return SimpleNamespace(
        storage=st,
        critic=Critic(last),
        gamma=gamma,
        lam=lam,
        normalize_advantage_per_mini_batch=per_minibatch,
    )


CASES = [  # envs, steps, p_done, gamma, lam, per-minibatch normalization, scale
    (16, 24, 0.05, 0.99, 0.95, False, 1.0),
    (7, 24, 0.3, 0.998, 0.95, True, 1.0),
    (1, 1, 0.0, 0.99, 0.95, False, 1.0),
    (64, 5, 1.0, 0.9, 1.0, True, 1.0),
    (33, 17, 0.5, 0.0, 0.5, True, 1.0),
    (9, 24, 0.1, 0.97, 0.9, True, 1e30),  # overflows to inf and nan the same way
    (9, 24, 0.1, 0.97, 0.9, True, 1e-42),  # subnormal values
]


@known
@pytest.mark.parametrize("storage_cls", [RslStorage, RolloutStorage], ids=["rsl_rl", "xpbank"])
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_one_pass_equals_rsl_rl_bit_for_bit(storage_cls, case):
    envs, steps, p_done, gamma, lam, per_minibatch, scale = case
    g = torch.Generator().manual_seed(envs * 100 + steps)
    ref, ours = (_filled(c, envs, steps, torch.Generator().manual_seed(g.initial_seed()), p_done, scale)
                 for c in (RslStorage, storage_cls))  # fmt: skip
    last = torch.randn(envs, 1, generator=g) * scale
    pr, po = _ppo(ref, last, gamma, lam, per_minibatch), _ppo(ours, last, gamma, lam, per_minibatch)
    RslPPO.compute_returns(pr, None)
    assert _rsl_rl_returns.compute_returns(po, None, RslPPO.compute_returns)  # the one pass ran
    assert po.critic.calls == 1 and po.critic.hidden == ("h",)
    for name in ("returns", "advantages"):
        a, b = getattr(ref, name), getattr(ours, name)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name  # the bits, nan and -0 included


@known
def test_bool_dones_and_the_switch_class():
    """``dones`` as bool (a user's storage) and :class:`xpbank.compat.rsl_rl.PPO` itself."""
    g = torch.Generator().manual_seed(3)
    ref, ours = (_filled(RslStorage, 12, 10, torch.Generator().manual_seed(3), 0.2) for _ in range(2))
    ours.dones = ours.dones.bool()
    last = torch.randn(12, 1, generator=g)
    RslPPO.compute_returns(_ppo(ref, last, 0.99, 0.95, False), None)
    fake = _ppo(ours, last, 0.99, 0.95, False)
    PPO.compute_returns(fake, None)  # the method, on anything with PPO's attributes
    assert torch.equal(ref.returns, ours.returns) and torch.equal(ref.advantages, ours.advantages)


def _changed(st, fn) -> bool:
    before = copy.deepcopy((st.returns, getattr(st, "advantages", None)))
    taken = fn()
    assert not taken
    after = (st.returns, getattr(st, "advantages", None))
    return not all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize(
    "spoil",
    ["source", "float64", "grad", "strided", "shape"],
)
def test_declines_before_touching_anything(spoil):
    """Where the pass is not known to be rsl_rl's arithmetic it computes nothing and says so
    (the caller then runs rsl_rl's loop); the critic is not called either."""
    st = _filled(RslStorage, 4, 6, torch.Generator().manual_seed(0), 0.2)
    ppo = _ppo(st, torch.randn(4, 1), 0.99, 0.95, False)
    reference = RslPPO.compute_returns
    if spoil == "source":
        reference = lambda self, obs: None  # noqa: E731 (another rsl_rl's method)
    elif spoil == "float64":
        st.values = st.values.double()
    elif spoil == "grad":
        st.rewards = st.rewards.clone().requires_grad_()
    elif spoil == "strided":
        st.rewards = torch.randn(4, 6, 1).transpose(0, 1)
    else:
        st.dones = st.dones[:, :3]
    assert not _changed(st, lambda: _rsl_rl_returns.compute_returns(ppo, None, reference))
    assert ppo.critic.calls == 0


@known
def test_an_odd_critic_value_takes_rsl_rl_loop_on_the_value_it_gave():
    """A critic answering float64 (or another shape): the critic runs once, and rsl_rl's own
    loop continues from its value, as rsl_rl's method does."""
    ref, ours = (_filled(RslStorage, 5, 8, torch.Generator().manual_seed(1), 0.3) for _ in range(2))
    last = torch.randn(5, 1, dtype=torch.float64)
    RslPPO.compute_returns(_ppo(ref, last, 0.99, 0.95, False), None)
    po = _ppo(ours, last, 0.99, 0.95, False)
    assert _rsl_rl_returns.compute_returns(po, None, RslPPO.compute_returns)
    assert po.critic.calls == 1
    assert torch.equal(ref.returns, ours.returns) and torch.equal(ref.advantages, ours.advantages)


def test_real_ppo_iteration_equals_rsl_rl_with_the_switch():
    """rsl_rl's PPO on its storage and the switch's PPO (xpbank storage, parity order): the
    same returns after a rollout and the same parameters after the update."""
    from rsl_rl.models import MLPModel
    from rsl_rl.modules.distribution import GaussianDistribution

    envs, steps = 8, 12
    obs0 = TensorDict({"policy": torch.zeros(envs, OBS)}, [envs])
    groups = {"actor": ["policy"], "critic": ["policy"]}

    def make(cls, storage):
        torch.manual_seed(0)
        dist = {"class_name": GaussianDistribution}
        actor = MLPModel(obs0, groups, "actor", ACT, hidden_dims=[16], distribution_cfg=dist)
        critic = MLPModel(obs0, groups, "critic", 1, hidden_dims=[16])
        return cls(actor, critic, storage, num_mini_batches=2, num_learning_epochs=2)

    ref = make(RslPPO, RslStorage("rl", envs, steps, obs0, [ACT]))
    ours = make(PPO, RslStorage("rl", envs, steps, obs0, [ACT]))
    ours_parity = make(PPO, RolloutStorage("rl", envs, steps, obs0, [ACT], parity=True))
    assert isinstance(ours.storage, RolloutStorage)
    g = torch.Generator().manual_seed(7)
    rollout = [
        (TensorDict({"policy": torch.randn(envs, OBS, generator=g)}, [envs]), torch.randn(envs, generator=g),
         (torch.rand(envs, generator=g) < 0.2).float())
        for _ in range(steps)
    ]  # fmt: skip
    for algo in (ref, ours_parity):
        torch.manual_seed(5)
        obs = obs0
        with torch.inference_mode():
            for nxt, rew, done in rollout:
                algo.act(obs)
                algo.process_env_step(nxt, rew, done, {})
                obs = nxt
            algo.compute_returns(obs)
        if algo is ours_parity:
            assert torch.equal(ref.storage.returns, algo.storage.returns)
            assert torch.equal(ref.storage.advantages, algo.storage.advantages)
        algo.update()
    for a, b in zip(ref.actor.parameters(), ours_parity.actor.parameters(), strict=True):
        assert torch.equal(a, b)
