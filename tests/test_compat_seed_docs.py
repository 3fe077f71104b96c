"""The metta and rsl_rl seed documents (``shared/seeds/``), signature by signature.

The documents hold signatures, not code examples: each documented signature is copied
here as written, checked against ours (names, order, defaults), and called with its
documented keyword names.
"""

from __future__ import annotations

import ast
import inspect
import re

import pytest
import torch
from tensordict import TensorDict

from xpbank import Field, Spec
from xpbank.compat.metta import Experience
from xpbank.compat.rsl_rl import Batch, RolloutStorage, Transition

METTA = """
Experience(self, total_agents: int, batch_size: int, bptt_horizon: int, minibatch_size: int, max_minibatch_size: int, experience_spec: Composite, device: Any)
Experience.ready_for_training(self) -> bool
Experience.store(self, data_td: TensorDict, env_id: slice) -> Any
Experience.reset_for_rollout(self) -> Any
Experience.update(self, indices: Tensor, data_td: TensorDict) -> Any
Experience.reset_importance_sampling_ratios(self) -> Any
Experience.stats(self) -> Dict
Experience.give_me_empty_md_td(self) -> TensorDict
Experience.from_losses(total_agents: int, batch_size: int, bptt_horizon: int, minibatch_size: int, max_minibatch_size: int, policy_experience_spec: Composite, losses: Dict, device: Any) -> Any
"""  # noqa: E501

RSL_RL = """
RolloutStorage(training_type, num_envs, num_transitions_per_env, obs, actions_shape, device='cpu')
RolloutStorage.Transition()
RolloutStorage.Transition.clear()
RolloutStorage.Batch(observations=None, actions=None, values=None, advantages=None, returns=None, old_actions_log_prob=None, old_distribution_params=None, hidden_states=(None, None), masks=None, privileged_actions=None, dones=None)
RolloutStorage.add_transition(transition)
RolloutStorage.clear()
RolloutStorage.generator()
RolloutStorage.mini_batch_generator(num_mini_batches, num_epochs=8)
RolloutStorage.recurrent_mini_batch_generator(num_mini_batches, num_epochs=8)
"""  # noqa: E501


def _documented(line: str) -> tuple[str, list[tuple[str, str | None]]]:
    """``(dotted name, [(parameter, default or None)])`` of one documented signature."""
    name, args = re.match(r"([\w.]+)\((.*)\)", line).groups()  # type: ignore[union-attr]
    params = []
    for part in re.split(r",\s*(?![^()]*\))", args):
        if not part or part == "self":
            continue
        head, _, default = part.partition("=")
        params.append((head.split(":")[0].strip(), default.strip() or None))
    return name, params


def _ours(name: str) -> inspect.Signature:
    parts = name.split(".")
    obj = {"Experience": Experience, "RolloutStorage": RolloutStorage}[parts[0]]
    for part in parts[1:]:
        obj = inspect.getattr_static(obj, part)
        if isinstance(obj, property):
            return inspect.Signature([])
        if isinstance(obj, staticmethod):
            obj = obj.__func__
    return inspect.signature(obj)


@pytest.mark.parametrize("line", [ln for ln in (METTA + RSL_RL).splitlines() if ln])
def test_documented_signature_is_ours(line):
    name, params = _documented(line)
    ours = [p for p in _ours(name).parameters.values() if p.name != "self" and p.kind != p.KEYWORD_ONLY]
    assert [p.name for p in ours] == [p for p, _ in params], name
    for p, (_, default) in zip(ours, params, strict=True):
        if default is not None:
            assert p.default == ast.literal_eval(default), (name, p.name)


def test_metta_calls_with_documented_keywords():
    spec = Spec({"rewards": Field(()), "values": Field(()), "ratio": Field(())})
    exp = Experience(
        total_agents=2, batch_size=8, bptt_horizon=2, minibatch_size=4, max_minibatch_size=4,
        experience_spec=spec, device="cpu",
    )  # fmt: skip
    assert exp.ready_for_training is False
    while not exp.ready_for_training:
        exp.store(data_td=TensorDict({k: torch.ones(2) for k in spec}, [2]), env_id=slice(0, 2))
    exp.update(indices=torch.tensor([0]), data_td=TensorDict({"values": torch.full((1, 2), 3.0)}, [1, 2]))
    assert exp.buffer["values"][0].tolist() == [3.0, 3.0]
    exp.reset_importance_sampling_ratios()
    assert isinstance(exp.stats(), dict) and exp.give_me_empty_md_td().batch_size == (2, 2)
    exp.reset_for_rollout()
    assert not exp.ready_for_training

    class Loss:
        def get_experience_spec(self):
            return Spec({"act_log_prob": Field(())})

    made = Experience.from_losses(
        total_agents=2, batch_size=8, bptt_horizon=2, minibatch_size=4, max_minibatch_size=4,
        policy_experience_spec=spec, losses={"ppo": Loss()}, device="cpu",
    )  # fmt: skip
    assert "act_log_prob" in set(made.buffer.keys())


def test_rsl_rl_calls_with_documented_keywords():
    obs = TensorDict({"policy": torch.zeros(2, 3)}, batch_size=[2])
    st = RolloutStorage(
        training_type="rl", num_envs=2, num_transitions_per_env=2, obs=obs, actions_shape=[1], device="cpu"
    )
    tr = RolloutStorage.Transition()
    assert isinstance(tr, Transition)
    for _ in range(2):
        tr.observations, tr.actions, tr.rewards, tr.dones = (
            obs,
            torch.zeros(2, 1),
            torch.ones(2),
            torch.zeros(2),
        )
        tr.values, tr.actions_log_prob, tr.distribution_params = (
            torch.zeros(2, 1),
            torch.zeros(2),
            (torch.zeros(2, 1),),
        )
        st.add_transition(transition=tr)
        tr.clear()
    st.returns[:] = 1.0
    st.advantages = st.returns - st.values
    assert len(list(st.mini_batch_generator(num_mini_batches=2))) == 16  # num_epochs=8
    assert len(list(st.recurrent_mini_batch_generator(num_mini_batches=2, num_epochs=1))) == 2
    st.clear()
    assert st.step == 0
    b = RolloutStorage.Batch(observations=obs, hidden_states=(None, None), dones=torch.zeros(2))
    assert isinstance(b, Batch) and b.masks is None
    distill = RolloutStorage("distillation", 2, 1, obs, [1])
    tr.observations, tr.actions, tr.rewards, tr.dones = obs, torch.zeros(2, 1), torch.ones(2), torch.zeros(2)
    tr.privileged_actions = torch.ones(2, 1)
    distill.add_transition(tr)
    (step,) = list(distill.generator())
    assert step.privileged_actions.tolist() == [[1.0], [1.0]]
