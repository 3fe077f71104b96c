"""rsl_rl's ``PPO.compute_returns`` in one compiled pass, bit for bit: the switch's returns.

rsl_rl's PPO computes GAE with a Python loop over the rollout's steps, ~10 tensor ops a
step (~25 µs a step at 16 envs, nearly all of it dispatch). :func:`compute_returns`
does the same arithmetic, in the same order and in float32, in one numba call over the
storage's tensors: the same ``returns`` and ``advantages`` bit for bit (each value is
the same IEEE operations on the same operands: torch multiplies a float32 tensor by a
Python float as ``float32(x) * float32(g)``, and so does the kernel), then rsl_rl's own
torch lines for the normalization (a reduction, whose order only torch knows).

It runs only where that equality is known to hold:

- rsl_rl's ``PPO.compute_returns`` is the source this kernel was written from (its
  SHA-256 is listed in :data:`KNOWN_SOURCES`; another rsl_rl version takes rsl_rl's own
  loop until its source is read and added here);
- numba is there (``XPBANK_NO_NUMBA`` unset);
- ``values``, ``rewards`` and ``returns`` are contiguous float32 CPU tensors ``[T, E, 1]``,
  ``dones`` one of uint8 or bool, the critic's last value float32 ``[E, 1]``, none of
  them requiring grad.

Anything else returns ``False`` before anything is computed, and the caller runs rsl_rl's
loop. Used by :class:`xpbank.compat.rsl_rl.PPO` (``"class_name": "xpbank.compat.rsl_rl:PPO"``).
"""

from __future__ import annotations

import hashlib
import inspect
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from xpbank import _jit

__all__ = ["KNOWN_SOURCES", "compute_returns", "gae_kernel"]

#: SHA-256 of ``inspect.getsource(rsl_rl.algorithms.PPO.compute_returns)`` for the
#: rsl-rl-lib versions whose arithmetic :func:`gae_kernel` repeats (5.5.1).
KNOWN_SOURCES = frozenset({"c2781a53c4e9c570df595b1585ad1ba90937337e39f6a3f70d8e0be1041e322d"})


def gae_kernel(
    values: np.ndarray,
    rewards: np.ndarray,
    dones: np.ndarray,
    last: np.ndarray,
    returns: np.ndarray,
    advantages: np.ndarray,
    gamma: np.float32,
    lam: np.float32,
) -> None:
    """rsl_rl's returns loop in float32, a step at a time over every env (as rsl_rl's):
    ``values``, ``rewards``, ``dones``, ``returns``, ``advantages`` are ``[T, E]``, ``last``
    is ``[E]``.

    The operations and their order are rsl_rl's, written out::

        not_terminal = 1 - float(dones[t])
        delta = (rewards[t] + (not_terminal * gamma) * next_values) - values[t]
        advantage = delta + ((not_terminal * gamma) * lam) * advantage   # 0 at the start
        returns[t] = advantage + values[t]
        advantages = returns - values
    """
    steps, envs = values.shape
    one = np.float32(1.0)
    advantage = np.zeros(envs, dtype=np.float32)  # each env's, carried back a step at a time
    for t in range(steps - 1, -1, -1):  # envs inner: contiguous rows, vectorized
        next_values = last if t == steps - 1 else values[t + 1]
        for e in range(envs):
            not_terminal = one - np.float32(dones[t, e])
            discount = not_terminal * gamma
            delta = (rewards[t, e] + discount * next_values[e]) - values[t, e]
            advantage[e] = delta + (discount * lam) * advantage[e]
            returns[t, e] = advantage[e] + values[t, e]
            advantages[t, e] = returns[t, e] - values[t, e]


_KERNELS = _jit.compile_kernels(gae_kernel)


def _source_known(method: Any) -> bool:
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):  # no source shipped: the arithmetic cannot be checked
        return False
    return hashlib.sha256(source.encode()).hexdigest() in KNOWN_SOURCES


_KNOWN: dict[Any, bool] = {}


class _Answered:
    """A critic whose value of the last observation is already computed (its hidden state
    already restored): rsl_rl's method, run on it, goes on from that value."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value

    def get_hidden_state(self) -> None:
        return None

    def reset(self, hidden_state: Any = None) -> None:
        pass

    def __call__(self, obs: Any) -> torch.Tensor:
        return self.value


def _plain(x: Any, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and x.dtype in dtypes
        and x.device.type == "cpu"
        and tuple(x.shape) == shape
        and x.is_contiguous()
        and not x.requires_grad
        and type(x) is torch.Tensor  # no subclass (a TensorDict-like or a tracer) hides behind it
    )


def compute_returns(ppo: Any, obs: Any, reference: Any) -> bool:
    """rsl_rl's ``PPO.compute_returns(obs)`` on ``ppo`` in one compiled pass; ``False``
    (nothing computed, nothing changed) where the pass is not known to equal
    ``reference`` (rsl_rl's method) bit for bit: see the module docstring.

    Threads: as rsl_rl's (the storage is the algorithm's own).
    """
    if _KERNELS is None:
        return False
    known = _KNOWN.get(reference)
    if known is None:
        known = _KNOWN[reference] = _source_known(reference)
    st = ppo.storage
    values = getattr(st, "values", None)
    if not known or not isinstance(values, torch.Tensor) or values.dim() != 3:
        return False
    steps, envs = st.num_transitions_per_env, values.shape[1]
    shape, f32 = (steps, envs, 1), (torch.float32,)
    if not (
        _plain(values, shape, f32)
        and _plain(st.rewards, shape, f32)
        and _plain(st.returns, shape, f32)
        and _plain(st.dones, shape, (torch.uint8, torch.bool))
    ):
        return False
    # rsl_rl's first lines, as they are: the critic's value of the last observation
    critic_hidden_state = ppo.critic.get_hidden_state()
    last_values = ppo.critic(obs).detach()
    ppo.critic.reset(hidden_state=critic_hidden_state)
    if not _plain(last_values, (envs, 1), f32):  # an odd critic: rsl_rl's own method, given the value
        answered = SimpleNamespace(  # what that (known) source reads of its ``self``
            storage=st,
            critic=_Answered(last_values),
            gamma=ppo.gamma,
            lam=ppo.lam,
            normalize_advantage_per_mini_batch=ppo.normalize_advantage_per_mini_batch,
        )
        reference(answered, obs)
        return True
    advantages = torch.empty_like(st.returns)
    dones = st.dones.view(torch.uint8) if st.dones.dtype == torch.bool else st.dones
    _KERNELS[0](
        values.numpy().reshape(steps, envs),
        st.rewards.numpy().reshape(steps, envs),
        dones.numpy().reshape(steps, envs),
        last_values.numpy().reshape(envs),
        st.returns.numpy().reshape(steps, envs),
        advantages.numpy().reshape(steps, envs),
        np.float32(ppo.gamma),
        np.float32(ppo.lam),
    )
    st.advantages = advantages
    if not ppo.normalize_advantage_per_mini_batch:  # rsl_rl's line
        st.advantages = (st.advantages - st.advantages.mean()) / (st.advantages.std() + 1e-8)
    return True
