"""``XpbankHerReplayBuffer``: SB3's ``HerReplayBuffer`` arguments over an xpbank buffer.

``DQN(..., replay_buffer_class=XpbankHerReplayBuffer, replay_buffer_kwargs=dict(
n_sampled_goal=4, goal_selection_strategy="future"))`` works as with SB3's
``HerReplayBuffer`` (it subclasses it, so SB3 hands it the env whose ``compute_reward``
rewards the relabelled goals, and ``load_replay_buffer`` calls ``set_env``). The data
lives in an :class:`xpbank.ReplayBuffer` of ``(buffer_size // n_envs) * n_envs`` items
(``num_envs=n_envs``), its sampler a :class:`~xpbank.her.HerSampler`: goals are chosen
at sample time from each item's own env and episode through the episode index, and
nothing is stored twice (SB3 keeps the same design).

Differences from SB3's buffer:

- every stored transition can be sampled, the episode being written included: its goals
  come only from steps already written (SB3 samples only finished episodes, and raises
  before the first one ends);
- a goal of ``"episode"`` is drawn from the episode's live steps where the ring has
  overwritten its start (SB3 drops such an episode whole);
- the relabelled rows come first in a batch (SB3's come last);
- ``save_bank`` / ``load_bank`` keep it as an xpbank bank (the buffer, its cursor, its
  sampler and the RNG: the loaded buffer samples the same items and goals);
  ``copy_info_dict`` infos are kept beside the bank's data in memory only (a bank holds
  no pickled objects).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from xpbank.errors import SpecError, require
from xpbank.her.sampler import HerSampler
from xpbank.integrations.sb3.buffer import transition_spec
from xpbank.integrations.sb3.cursor import RingCursor
from xpbank.replay.buffer import ReplayBuffer
from xpbank.replay.state import seed_from
from xpbank.sampler import Sampler
from xpbank.spec.spec import Field, Spec

__all__ = ["XpbankHerReplayBuffer"]

require("stable_baselines3", "sb3")

from stable_baselines3.common.type_aliases import DictReplayBufferSamples  # noqa: E402
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer as _SB3Her  # noqa: E402

_GOALS = ("achieved_goal", "desired_goal")


def her_spec(observation_space: Any, action_space: Any) -> Spec:
    """The item layout of a goal-conditioned SB3 transition: ``("obs", key)`` and
    ``("next", "obs", key)`` per key of the ``Dict`` observation space (SB3's shapes and
    dtypes), ``action``, ``reward``, ``terminated``, ``truncated``."""
    spaces = getattr(observation_space, "spaces", None)
    if not isinstance(spaces, dict) or any(k not in spaces for k in _GOALS):
        raise SpecError(
            "observation_space: expected a Dict space with 'achieved_goal' and 'desired_goal', "
            f"got {observation_space}"
        )
    fields: dict[Any, Field] = {}
    for key, sub in spaces.items():
        one = transition_spec(sub, action_space)
        fields[("obs", key)] = fields[("next", "obs", key)] = one["obs"]
    base = transition_spec(spaces["achieved_goal"], action_space)
    for key in ("action", "reward", "terminated", "truncated"):
        fields[key] = base[key]
    return Spec(fields)


# type-ignore: SB3 writes pos/full; here they are read-only properties (RingCursor)
class XpbankHerReplayBuffer(RingCursor, _SB3Her):  # type: ignore[override]
    """SB3's ``HerReplayBuffer`` (``replay_buffer_class=``) over an :class:`xpbank.ReplayBuffer`.

    Args:
        buffer_size: transitions held in all (SB3's meaning).
        observation_space: a ``Dict`` space with ``observation``, ``achieved_goal`` and
            ``desired_goal``.
        action_space: the env's action space.
        env: the (vector) env whose ``compute_reward`` rewards relabelled goals (SB3
            passes it); may be set later with ``set_env``.
        device: where sampled tensors go.
        n_envs: envs in the vector env.
        optimize_memory_usage: not supported (neither by SB3's Dict buffers).
        handle_timeout_termination: a time limit is not a termination (SB3's default).
        n_sampled_goal: relabelled transitions per real one (``k``).
        goal_selection_strategy: ``"future"``, ``"final"`` or ``"episode"`` (or SB3's
            ``GoalSelectionStrategy``).
        copy_info_dict: keep each step's info dict and pass the relabelled steps' to
            ``compute_reward`` (copied, as SB3 does).
        storage: ``"memory"`` or ``"memmap"``.
        sampler: the xpbank sampler that picks items (default uniform; e.g. prioritized).
        seed: seeds the xpbank buffer's generator (default: from torch's global one).

    Example:
        >>> from stable_baselines3 import DQN
        >>> from stable_baselines3.common.envs import BitFlippingEnv
        >>> env = BitFlippingEnv(n_bits=4)
        >>> model = DQN("MultiInputPolicy", env, learning_starts=8, seed=0,
        ...             replay_buffer_class=XpbankHerReplayBuffer,
        ...             replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"))
        >>> _ = model.learn(32)
        >>> model.replay_buffer.size()
        32
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: Any,
        action_space: Any,
        env: Any = None,
        device: torch.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        n_sampled_goal: int = 4,
        goal_selection_strategy: Any = "future",
        copy_info_dict: bool = False,
        *,
        storage: str = "memory",
        sampler: Sampler | None = None,
        seed: int | None = None,
        _xp: ReplayBuffer | None = None,
    ):
        if optimize_memory_usage:
            raise SpecError("optimize_memory_usage: not supported with Dict observations (nor by SB3's HER)")
        # SB3's BaseBuffer.__init__ is not called: its arrays are the xpbank buffer (RingCursor)
        self._init_sb3(
            buffer_size, observation_space, action_space, device, n_envs, handle_timeout_termination
        )
        strategy = getattr(goal_selection_strategy, "name", goal_selection_strategy)
        strategy = strategy.lower() if isinstance(strategy, str) else strategy
        spec = her_spec(observation_space, action_space)
        self.obs_shape = {k: spec["obs", k].shape for k in observation_space.spaces}
        self.optimize_memory_usage = False
        self.env = env
        self.copy_info_dict = bool(copy_info_dict)
        self.n_sampled_goal = int(n_sampled_goal)
        self.goal_selection_strategy = goal_selection_strategy
        self.her_ratio = 1 - (1.0 / (self.n_sampled_goal + 1))
        capacity = self.buffer_size * self.n_envs
        self._infos: np.ndarray | None = np.empty(capacity, dtype=object) if copy_info_dict else None
        her = HerSampler(
            sampler, strategy=strategy, n_sampled_goal=self.n_sampled_goal,
            compute_reward=self._compute_reward, info_keys=("index",) if copy_info_dict else (),
        )  # fmt: skip
        if _xp is None:
            if seed is None:
                seed = seed_from()
            _xp = ReplayBuffer(capacity, spec, storage=storage, sampler=her, seed=seed, num_envs=self.n_envs)
        elif _xp.spec != spec or _xp.capacity != capacity or not isinstance(_xp.sampler, HerSampler):
            raise SpecError(
                f"bank: expected {capacity} items of {spec} with a HerSampler, got "
                f"{_xp.capacity} items of {_xp.spec} with {_xp.sampler!r}"
            )
        else:
            _xp.sampler.compute_reward = self._compute_reward
        self._attach(_xp)

    # -- writing (pos, full, size, reset: RingCursor) ------------------------------
    def add(  # type: ignore[override]
        self,
        obs: dict[str, np.ndarray],
        next_obs: dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: Sequence[dict[str, Any]],
    ) -> None:
        """Store one vector step (row ``e`` of each array is env ``e``'s transition).

        Raises:
            SpecError: wrong shapes, keys or number of infos; the buffer is unchanged.
        """
        e = self.n_envs
        done_a = np.asarray(done).astype(bool, copy=False).reshape(-1)
        if done_a.shape != (e,):
            raise SpecError(f"field 'done': expected shape ({e},), got {np.shape(done)}")
        term, trunc = self._step_flags(infos, done_a)
        batch: dict[Any, Any] = {
            "action": np.asarray(action).reshape(e, self.action_dim),
            "reward": np.asarray(reward, dtype=np.float32).reshape(e),
            "terminated": term,
            "truncated": trunc,
        }
        for key, shape in self.obs_shape.items():
            batch["obs", key] = np.asarray(obs[key]).reshape(e, *shape)
            batch["next", "obs", key] = np.asarray(next_obs[key]).reshape(e, *shape)
        ids = self.xp.extend(batch)
        if self._infos is not None:
            self._infos[np.arange(ids.start, ids.stop) % self.xp.capacity] = [copy.deepcopy(i) for i in infos]
        self._next_id = ids.stop

    def truncate_last_trajectory(self) -> None:
        """End each env's open episode at its newest step, as a truncation (SB3's
        ``load_replay_buffer(truncate_last_traj=True)``): later steps start new episodes."""
        eps = self.xp.episodes
        cut = eps.truncate_newest() if eps is not None else np.zeros(0, dtype=np.int64)
        if cut.size:
            self.xp.update(torch.from_numpy(cut), {"truncated": torch.ones(cut.size, dtype=torch.bool)})

    # -- reading -------------------------------------------------------------------
    def _compute_reward(self, achieved: np.ndarray, desired: np.ndarray, info: Any) -> Any:
        """The env's own ``compute_reward`` (of its first sub-env, as SB3 calls it)."""
        if self.env is None:
            raise SpecError("XpbankHerReplayBuffer: no env to compute rewards; call set_env(env) first")
        n = achieved.shape[0]
        if self._infos is not None and info is not None:
            infos = [copy.deepcopy(i) for i in self._infos[info["index"] % self.xp.capacity]]
        else:
            infos = [{} for _ in range(n)]
        return self.env.env_method("compute_reward", achieved, desired, infos, indices=[0])[0]

    def sample(self, batch_size: int, env: Any = None) -> DictReplayBufferSamples:  # type: ignore[override]
        """``batch_size`` transitions, a fraction ``k / (k + 1)`` of them relabelled."""
        batch = self.xp.sample(batch_size)
        obs = {k: batch["obs", k].numpy() for k in self.obs_shape}
        next_obs = {k: batch["next", "obs", k].numpy() for k in self.obs_shape}
        reward = batch["reward"].numpy().reshape(-1, 1)
        if env is not None:
            obs, next_obs = self._normalize_obs(obs, env), self._normalize_obs(next_obs, env)  # type: ignore[assignment]
            reward = self._normalize_reward(reward, env)
        dones = batch["terminated"]
        if not self.handle_timeout_termination:
            dones = dones | batch["truncated"]
        to = self.device
        return DictReplayBufferSamples(
            observations={k: torch.as_tensor(v).to(to) for k, v in obs.items()},
            actions=batch["action"].to(to),
            next_observations={k: torch.as_tensor(v).to(to) for k, v in next_obs.items()},
            dones=dones.to(device=to, dtype=torch.float32).reshape(-1, 1),
            rewards=torch.as_tensor(reward).to(to),
        )

    # -- banks (save_bank: RingCursor) ---------------------------------------------
    @classmethod
    def load_bank(
        cls,
        path: str | os.PathLike[str],
        observation_space: Any,
        action_space: Any,
        env: Any = None,
        device: torch.device | str = "auto",
        handle_timeout_termination: bool = True,
    ) -> XpbankHerReplayBuffer:
        """A buffer restored from :meth:`save_bank` (same transitions, goals drawn, RNG).

        Raises:
            SpecError: the bank's layout or sampler differs from what the spaces give.
        """
        from xpbank.bank import load

        xp = load(path)
        her = xp.sampler
        if not isinstance(her, HerSampler):
            raise SpecError(f"bank: expected a HerSampler, got {her!r}")
        n_envs = int(xp.config().get("num_envs", 1))
        return cls(
            xp.capacity, observation_space, action_space, env, device, n_envs,
            handle_timeout_termination=handle_timeout_termination,
            n_sampled_goal=her.n_sampled_goal or 4, goal_selection_strategy=her.strategy, _xp=xp,
        )  # fmt: skip
