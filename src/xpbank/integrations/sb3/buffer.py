"""``XpbankReplayBuffer``: SB3's replay buffer interface over an :class:`xpbank.ReplayBuffer`.

SB3's off-policy algorithms (DQN, SAC, TD3) build their buffer as
``replay_buffer_class(buffer_size, observation_space, action_space, device=, n_envs=,
optimize_memory_usage=, **replay_buffer_kwargs)``, call ``add(obs, next_obs, action,
reward, done, infos)`` once per vector step and ``sample(batch_size, env)`` for each
gradient step. This class answers those calls and keeps the data in an xpbank buffer of
``(buffer_size // n_envs) * n_envs`` items laid out like SB3's: the items of one
``add`` are one time step of the ``n_envs`` envs (``num_envs=n_envs``), so row ``pos``
of SB3's ``[buffer_size, n_envs]`` arrays is slots ``pos * n_envs ... + n_envs - 1``.

Episode ends are stored as they happened: ``terminated = done and not
info["TimeLimit.truncated"]`` and ``truncated = done and info["TimeLimit.truncated"]``.
A sample's ``dones`` is SB3's ``done * (1 - timeout)``: ``terminated`` with
``handle_timeout_termination=True`` (a time limit bootstraps from the true final
observation SB3 passes as ``next_obs``), ``terminated or truncated`` without.

With ``optimize_memory_usage=True`` the data lives in a ``FrameStorage(stacked=False)``
(each observation stored once), and SB3's ``dones[pos - 1] = True`` between ``learn()``
calls cuts each env's episode as a truncation
(:meth:`EpisodeIndex.truncate_newest <xpbank.EpisodeIndex.truncate_newest>`).

SB3's arrays (``observations``, ``rewards``, ``dones`` ...) are views of the stored
fields where the layout allows (:mod:`xpbank.integrations.sb3.views`); SB3's n-step
arguments (``n_steps``, ``gamma``) give ``NStepReplayBuffer``'s targets
(:mod:`xpbank.integrations.sb3.nstep`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.errors import SpecError, require
from xpbank.integrations.sb3 import fast as _fast
from xpbank.integrations.sb3 import nstep as _nstep
from xpbank.integrations.sb3 import views as _views
from xpbank.integrations.sb3.cursor import RingCursor
from xpbank.replay.buffer import ReplayBuffer
from xpbank.replay.state import seed_from
from xpbank.sampler import Sampler
from xpbank.spec.spaces import field_from_space
from xpbank.spec.spec import Field, Spec
from xpbank.storage.frames import FrameStorage

__all__ = ["XpbankReplayBuffer", "transition_spec"]

require("stable_baselines3", "sb3")  # a MissingExtraError naming the extra, before the imports below

from stable_baselines3.common import preprocessing as _preprocessing  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer as _SB3ReplayBuffer  # noqa: E402
from stable_baselines3.common.type_aliases import ReplayBufferSamples  # noqa: E402

_NEXT_OBS = ("next", "obs")
_BOOL, _FLOAT32 = np.dtype(bool), np.dtype(np.float32)  # add compares dtypes by identity


def transition_spec(observation_space: Any, action_space: Any) -> Spec:
    """The item layout of an SB3 transition: SB3's own shapes and dtypes.

    ``action`` is ``(action_dim,)`` (a ``Discrete`` action is ``(1,)`` int64, a float64
    ``Box`` is kept as float32, as SB3 does); ``reward`` float32; episode ends as bools.

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("CartPole-v1")
        >>> transition_spec(env.observation_space, env.action_space)["action"]
        Field(shape=(1,), dtype=torch.int64)
    """
    obs = field_from_space(observation_space, "observation_space")  # SB3 keeps its dtype
    act = field_from_space(action_space, "action_space")
    action_dtype = torch.float32 if act.dtype == torch.float64 else act.dtype
    shape = _preprocessing.get_obs_shape(observation_space)  # Discrete: (1,), as SB3 stores it
    obs_shape = tuple(int(d) for d in shape) if isinstance(shape, tuple) else obs.shape
    return Spec(
        {
            "obs": Field(obs_shape, obs.dtype),
            "action": Field((_preprocessing.get_action_dim(action_space),), action_dtype),
            "reward": Field((), torch.float32),
            "terminated": Field((), torch.bool),
            "truncated": Field((), torch.bool),
            _NEXT_OBS: Field(obs_shape, obs.dtype),
        }
    )


# type-ignore: SB3 writes pos/full; here they are read-only properties (RingCursor)
class XpbankReplayBuffer(RingCursor, _SB3ReplayBuffer):  # type: ignore[override]
    """SB3's ``ReplayBuffer`` API (``replay_buffer_class=``) over an :class:`xpbank.ReplayBuffer`.

    Args:
        buffer_size: transitions held in all (SB3's meaning): ``buffer_size // n_envs``
            steps of ``n_envs`` envs.
        observation_space: a ``Box``, ``Discrete``, ``MultiDiscrete`` or ``MultiBinary``
            space (``Dict`` spaces are not supported: SB3 has a separate class for them).
        action_space: the env's action space.
        device: where sampled tensors go (SB3's ``"auto"`` too).
        n_envs: envs in the vector env; each ``add`` holds one step of each.
        optimize_memory_usage: store each observation once (a
            :class:`~xpbank.FrameStorage`): ``next_obs`` is read from the env's next
            step, or from a small side store at episode ends (the true final
            observation) and for each env's newest step. Unlike SB3's own buffer it
            works with ``handle_timeout_termination=True``, and every transition stays
            valid (SB3's drops the one at ``pos``). In memory only (not with
            ``storage="memmap"``). See :attr:`dones` for SB3's cut between ``learn()``
            calls.
        handle_timeout_termination: a time limit (``info["TimeLimit.truncated"]``) is not
            a termination: the sample's ``dones`` is 0 there (SB3's default). ``False``:
            every ``done`` counts. Both are stored either way.
        storage: ``"memory"`` or ``"memmap"`` (a buffer larger than RAM, one ``.npy``
            per field in a temporary directory).
        sampler: any xpbank sampler, e.g. :class:`~xpbank.PrioritizedSampler` (see
            :class:`~xpbank.integrations.sb3.PrioritizedDQN`); default uniform.
        seed: seeds the xpbank buffer's generator; default: drawn from torch's global
            generator, so SB3's ``seed=`` makes the samples reproducible.
        n_steps: n-step returns as SB3's ``NStepReplayBuffer`` (``replay_buffer_kwargs=
            {"n_steps": 3, "gamma": 0.99}``): samples carry the window's return as
            ``rewards``, ``gamma ** k`` as ``discounts`` and the window's last step's
            ``next_observations`` and ``dones`` (see :mod:`xpbank.integrations.sb3.nstep`
            for where it differs). ``1``: one-step samples (``discounts`` ``None``).
        gamma: the n-step discount (SB3's argument; used with ``n_steps > 1``).

    SB3's arrays ``observations``, ``next_observations``, ``actions``, ``rewards``,
    ``dones``, ``timeouts`` are there with SB3's shapes ``(buffer_size, n_envs, ...)``
    and dtypes: views of the stored fields where the layout allows, copies with
    ``optimize_memory_usage`` and for the flags (:mod:`xpbank.integrations.sb3.views`).

    What is copied: ``add`` copies; a sample is a fresh batch (modifying it changes
    nothing stored). ``buffer.xp`` is the xpbank buffer itself (e.g. for
    ``xpbank.save``, ``update_priority`` or ``sample_all``).

    Example:
        >>> import gymnasium as gym, numpy as np
        >>> env = gym.make("CartPole-v1")
        >>> rb = XpbankReplayBuffer(100, env.observation_space, env.action_space, "cpu", seed=0)
        >>> obs = np.zeros((1, 4), np.float32)
        >>> rb.add(obs, obs + 1, np.array([1]), np.array([1.0]), np.array([True]),
        ...        [{"TimeLimit.truncated": True}])
        >>> rb.size(), rb.pos, rb.sample(2).dones.flatten().tolist()
        (1, 1, [0.0, 0.0])
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: Any,
        action_space: Any,
        device: torch.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        *,
        storage: str = "memory",
        sampler: Sampler | None = None,
        seed: int | None = None,
        n_steps: int = 1,
        gamma: float = 0.99,
        _xp: ReplayBuffer | None = None,
    ):
        if optimize_memory_usage and (storage != "memory" or _xp is not None):
            raise SpecError(
                f"optimize_memory_usage: True keeps observations in memory (FrameStorage), got "
                f"storage={storage!r}{' and a loaded bank' if _xp is not None else ''}"
            )
        # SB3's BaseBuffer.__init__ is not called: its pos/full are derived from the ring (RingCursor)
        self._init_sb3(
            buffer_size, observation_space, action_space, device, n_envs, handle_timeout_termination
        )
        spec = transition_spec(observation_space, action_space)
        self.obs_shape = spec["obs"].shape
        self.optimize_memory_usage = bool(optimize_memory_usage)
        nstep = _nstep.make_nstep(n_steps, gamma)
        self.n_steps, self.gamma = int(n_steps), float(gamma)
        if _xp is None:
            if seed is None:
                seed = seed_from()
            capacity = self.buffer_size * self.n_envs
            store: Any = FrameStorage(capacity, spec, stacked=False) if optimize_memory_usage else storage
            _xp = ReplayBuffer(
                capacity, spec, storage=store, sampler=sampler, seed=seed, num_envs=self.n_envs,
                nstep=nstep,
            )  # fmt: skip
        elif _xp.spec != spec or _xp.capacity != self.buffer_size * self.n_envs:
            raise SpecError(
                f"bank: expected {self.buffer_size * self.n_envs} items of {spec}, got "
                f"{_xp.capacity} items of {_xp.spec}"
            )
        self._attach(_xp)

    # -- SB3's arrays (pos, full, size, reset: RingCursor) -------------------------
    @property
    def dones(self) -> _views.Dones:  # type: ignore[override]
        """SB3's ``dones`` (``terminated or truncated``, float32 ``(buffer_size, n_envs)``),
        read like an array; ``dones[pos - 1] = True`` is SB3's cut between ``learn()``
        calls, a truncation here (see :class:`~xpbank.integrations.sb3.views.Dones`)."""
        return _views.Dones(self)

    @property
    def timeouts(self) -> np.ndarray:  # type: ignore[override]
        """SB3's ``timeouts`` (``truncated``), a float32 copy ``(buffer_size, n_envs)``."""
        return _views.timeouts(self)

    @property
    def observations(self) -> np.ndarray:  # type: ignore[override]
        """SB3's ``observations`` ``(buffer_size, n_envs, *obs_shape)``: a view (a copy
        with ``optimize_memory_usage``)."""
        return _views.sb3_array(self, "obs")

    @property
    def next_observations(self) -> np.ndarray:  # type: ignore[override]
        """SB3's ``next_observations`` (the true next observations): a view (a copy with
        ``optimize_memory_usage``, where SB3's is ``None``)."""
        return _views.sb3_array(self, _NEXT_OBS)

    @property
    def actions(self) -> np.ndarray:  # type: ignore[override]
        """SB3's ``actions`` ``(buffer_size, n_envs, action_dim)``: a view."""
        return _views.sb3_array(self, "action")

    @property
    def rewards(self) -> np.ndarray:  # type: ignore[override]
        """SB3's ``rewards`` ``(buffer_size, n_envs)`` float32: a view."""
        return _views.sb3_array(self, "reward")

    # -- writing -------------------------------------------------------------------
    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: Sequence[dict[str, Any]],
    ) -> None:
        """Store one vector step: row ``e`` of each array is env ``e``'s transition.

        ``next_obs`` is the true next observation (SB3 puts the final observation there
        for envs that just ended). Everything is checked before anything is written.

        Raises:
            SpecError: an array with the wrong number of envs or shape, or ``infos`` not
                one dict per env; the buffer is unchanged.
        """
        if not _fast.add(self, obs, next_obs, action, reward, done, infos):  # SB3's usual arrays
            self._add_checked(obs, next_obs, action, reward, done, infos)

    def _add_checked(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: Sequence[dict[str, Any]],
    ) -> None:
        """:meth:`add` of any input: each array converted and checked, then stored."""
        e = self.n_envs
        action = np.asarray(action)
        if action.size != e * self.action_dim:
            raise SpecError(
                f"field 'action': expected {e} envs x {self.action_dim} values, got shape {action.shape}"
            )
        obs_a, next_a = np.asarray(obs), np.asarray(next_obs)
        if self.obs_shape == (1,) and obs_a.shape == (e,):  # Discrete observations
            obs_a, next_a = obs_a.reshape(e, 1), next_a.reshape(e, 1)
        done_a = np.asarray(done)
        if done_a.dtype is not _BOOL:
            done_a = done_a.astype(bool)
        if done_a.shape != (e,):  # one value per env in any shape ((1, 1), 0-d for one env), as SB3
            if done_a.size != e:
                raise SpecError(f"field 'done': expected shape ({e},), got {done_a.shape}")
            done_a = done_a.reshape(e)
        term, trunc = self._step_flags(infos, done_a)
        if type(reward) is not np.ndarray or reward.dtype is not _FLOAT32:
            reward = np.asarray(reward, dtype=np.float32)
        if reward.shape != (e,) and reward.size == e:  # as done (another size: extend refuses it)
            reward = reward.reshape(e)
        if action.shape != self._action_shape:
            action = action.reshape(self._action_shape)
        ids = self.xp.extend(
            {
                "obs": obs_a,
                "action": action,
                "reward": reward,
                "terminated": term,
                "truncated": trunc,
                _NEXT_OBS: next_a,
            }
        )
        self._next_id = ids.stop

    # -- reading -------------------------------------------------------------------
    def sample(self, batch_size: int, env: Any = None) -> Any:
        """``batch_size`` transitions as SB3's ``ReplayBufferSamples`` (on ``device``).

        ``env``: a ``VecNormalize`` normalizes observations and rewards, as SB3 does.
        A uniform one-step sample on the CPU is read straight from the records
        (:mod:`xpbank.integrations.sb3.fast`): the samples :meth:`samples_of` gives of
        ``buffer.xp.sample(batch_size)``, without the batch (a subclass or an instance that overrides
        :meth:`samples_of` gets its own).
        """
        if (
            env is None
            and self.device.type == "cpu"
            and type(self).samples_of is _SAMPLES_OF
            and "samples_of" not in self.__dict__  # (nor one set on the instance)
        ):
            samples = _fast.sample(self, batch_size, ReplayBufferSamples)
            if samples is not None:
                return samples
        return self.samples_of(self.xp.sample(batch_size), env)

    def sample_batch(self, batch_size: int, env: Any = None) -> tuple[Any, TensorDict]:
        """Like :meth:`sample`, plus the xpbank batch (``"index"``, sampler entries such as
        ``"weight"``): what :class:`~xpbank.integrations.sb3.PrioritizedDQN` uses."""
        batch = self.xp.sample(batch_size)
        return self.samples_of(batch, env), batch

    def samples_of(self, batch: TensorDict, env: Any = None) -> Any:
        """SB3's ``ReplayBufferSamples`` of an xpbank batch of this buffer's spec."""
        dones = batch["terminated"]  # with n-step: the window's last step's flags
        if not self.handle_timeout_termination:
            dones = dones | batch["truncated"]
        obs, next_obs, reward = batch["obs"], batch[_NEXT_OBS], batch["reward"].reshape(-1, 1)
        discounts = None
        if "nstep_return" in batch.keys():  # noqa: SIM118 (a TensorDict has no __contains__)
            reward, discounts = _nstep.nstep_targets(batch, self.gamma)
        if env is not None:  # VecNormalize works on NumPy
            obs = torch.from_numpy(np.asarray(self._normalize_obs(obs.numpy(), env)))
            next_obs = torch.from_numpy(np.asarray(self._normalize_obs(next_obs.numpy(), env)))
            reward = torch.from_numpy(self._normalize_reward(reward.numpy(), env))
        to = self.device
        return ReplayBufferSamples(
            observations=obs.to(to),
            actions=batch["action"].to(to),
            next_observations=next_obs.to(to),
            dones=dones.to(device=to, dtype=torch.float32).reshape(-1, 1),
            rewards=reward.to(to),
            discounts=None if discounts is None else discounts.to(to),
        )

    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> Any:
        """SB3's ``_get_samples``: rows ``batch_inds``, each of an env drawn from NumPy's
        global generator as SB3 does (n-step targets with ``n_steps > 1``).

        Raises:
            SpecError: a row that holds no transition yet.
        """
        rows = np.asarray(batch_inds, dtype=np.int64).reshape(-1)
        envs = np.random.randint(0, high=self.n_envs, size=(len(rows),))
        return self.samples_of(_nstep.read_slots(self, rows * self.n_envs + envs), env)

    # -- banks (save_bank: RingCursor) ---------------------------------------------
    @classmethod
    def load_bank(
        cls,
        path: str | os.PathLike[str],
        observation_space: Any,
        action_space: Any,
        device: torch.device | str = "auto",
        handle_timeout_termination: bool = True,
    ) -> XpbankReplayBuffer:
        """A buffer restored from :meth:`save_bank` (same transitions, cursor and RNG).

        Use it to resume training: ``model.replay_buffer = XpbankReplayBuffer.load_bank(
        path, model.observation_space, model.action_space, model.device)``.

        Raises:
            SpecError: the bank's layout differs from what the spaces give.
            BankError, CorruptBankError: see :func:`xpbank.load`.
        """
        return cls(
            observation_space=observation_space, action_space=action_space, device=device,
            handle_timeout_termination=handle_timeout_termination, **cls._bank_arguments(path),
        )  # fmt: skip

    @staticmethod
    def _bank_arguments(path: str | os.PathLike[str]) -> dict[str, Any]:
        """The bank at ``path`` loaded (``_xp``) and the constructor arguments it fixes:
        ``buffer_size``, ``n_envs``, ``n_steps`` and ``gamma`` (for :meth:`load_bank`)."""
        from xpbank.bank import load

        xp = load(path)
        config = xp.config()
        n_steps, gamma = (config["nstep"]["n"], config["nstep"]["gamma"]) if "nstep" in config else (1, 0.99)
        n_envs = int(config.get("num_envs", 1))
        return {"buffer_size": xp.capacity, "n_envs": n_envs, "n_steps": n_steps, "gamma": gamma, "_xp": xp}


_SAMPLES_OF = XpbankReplayBuffer.samples_of  # sample's short path is this one's
