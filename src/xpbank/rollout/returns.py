"""Returns and advantages: pure functions over time-major ``[T, N]`` tensors.

Conventions shared by every function here:

- ``rewards[t]``, ``terminated[t]``, ``truncated[t]`` describe step ``t`` (the reward
  received after the action at ``t``, and whether that step ended the episode).
- ``next_values[t]`` is the value of the observation *after* step ``t``: ``values[t + 1]``
  inside an episode, the bootstrap value at the last step of the rollout, and the value
  of the **true final observation** where step ``t`` was truncated (the caller or the
  collector supplies it; the next row's value then belongs to a new episode).
- Termination never bootstraps; truncation bootstraps from ``next_values``; every
  recursion stops at an episode end (``terminated | truncated``).

The loops run in NumPy on the CPU (about ten times less per-op overhead than torch for
arrays this size; CUDA inputs are copied to the CPU and the results copied back).
Inputs are not modified; outputs are new float32 tensors on the inputs' device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.errors import SpecError

__all__ = ["gae", "vtrace", "discounted_returns", "nstep_targets", "normalize_advantages"]


def _np(x: Any, name: str, shape: tuple[int, ...] | None, mask: bool) -> np.ndarray:
    """``x`` as a NumPy ``[T, N]`` array: float32, or bool for a ``mask`` (views when possible)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if mask and arr.dtype != np.bool_:
        arr = arr != 0
    elif not mask and arr.dtype != np.float32:
        arr = arr.astype(np.float32)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim == 3 and arr.shape[2] == 1:  # rsl_rl-style [T, N, 1]
        arr = arr[:, :, 0]
    if not arr.flags.c_contiguous:  # e.g. a column of packed rows: one copy, then fast ops
        arr = np.ascontiguousarray(arr)
    if arr.ndim != 2 or (shape is not None and arr.shape != shape):
        want = "[T, N]" if shape is None else f"{list(shape)}"
        raise SpecError(f"{name}: expected shape {want} (time-major), got {list(arr.shape)}")
    return arr


def _inputs(
    floats: dict[str, Any], masks: dict[str, Any]
) -> tuple[list[np.ndarray], list[np.ndarray], torch.device]:
    """Float32 arrays for ``floats`` and bool arrays for ``masks``, all of one shape."""
    device = torch.device("cpu")
    for value in (*floats.values(), *masks.values()):
        if isinstance(value, torch.Tensor):
            device = value.device
            break
    shape = None
    out: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    for group, is_mask in ((floats, False), (masks, True)):
        for name, value in group.items():
            arr = _np(value, name, shape, is_mask)
            shape = arr.shape
            out[is_mask].append(arr)
    return out[0], out[1], device


def _where(mask: np.ndarray, if_true: float, if_false: float) -> np.ndarray:
    return np.where(mask, np.float32(if_true), np.float32(if_false))


def _check_discount(gamma: float, lam: float = 1.0) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise SpecError(f"gamma: expected a discount in [0, 1], got {gamma!r}")
    if not 0.0 <= lam <= 1.0:
        raise SpecError(f"lam: expected a value in [0, 1], got {lam!r}")


def _backward(delta: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """``x[t] = delta[t] + coef[t] * x[t + 1]`` with ``x[T] = 0``, in place into a new array.

    Two in-place NumPy ops per step over preallocated rows: ~0.2 ms for 4096 x 24.
    """
    out = np.empty_like(delta)
    out[-1] = delta[-1]
    for t in range(delta.shape[0] - 2, -1, -1):
        row = out[t]
        np.multiply(coef[t], out[t + 1], out=row)
        row += delta[t]
    return out


def _out(x: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(x).to(device)


def gae(
    rewards: Any,
    values: Any,
    next_values: Any,
    terminated: Any,
    truncated: Any,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016), time-major.

    ``delta[t] = r[t] + gamma * (1 - terminated[t]) * next_values[t] - values[t]`` and
    ``A[t] = delta[t] + gamma * lam * (1 - done[t]) * A[t + 1]``, ``done = terminated |
    truncated``. ``returns = A + values`` (the value targets).

    Args:
        rewards, values, next_values, terminated, truncated: ``[T, N]`` (or ``[T, N, 1]``)
            tensors or arrays; see the module docstring for ``next_values``.
        gamma: discount; lam: the GAE lambda.

    Returns:
        ``(advantages, returns)``, float32 ``[T, N]``.

    Example:
        >>> import torch
        >>> r = torch.tensor([[0.0], [1.0]]); v = torch.zeros(2, 1)
        >>> done = torch.tensor([[False], [True]])
        >>> adv, ret = gae(r, v, v, done, torch.zeros(2, 1, dtype=torch.bool), 0.5, 1.0)
        >>> adv[:, 0].tolist()
        [0.5, 1.0]
    """
    _check_discount(gamma, lam)
    (r, v, nv), (term, trunc), device = _inputs(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
    )
    delta = nv * _where(term, 0.0, gamma)
    delta += r
    delta -= v
    adv = _backward(delta, _where(term | trunc, 0.0, gamma * lam))
    return _out(adv, device), _out(adv + v, device)


def discounted_returns(
    rewards: Any, terminated: Any, truncated: Any, next_values: Any | None = None, gamma: float = 0.99
) -> torch.Tensor:
    """Discounted returns ``G[t] = r[t] + gamma * G[t + 1]``, cut at episode ends.

    Bootstraps with ``next_values`` where the return is cut without a termination (a
    truncation, or the last step of the rollout); ``None`` bootstraps with 0 (Monte Carlo
    returns of complete episodes).

    Example:
        >>> import torch
        >>> r = torch.ones(3, 1); no = torch.zeros(3, 1, dtype=torch.bool)
        >>> discounted_returns(r, no, no, gamma=0.5)[:, 0].tolist()
        [1.75, 1.5, 1.0]
    """
    _check_discount(gamma)
    if next_values is None:
        next_values = np.zeros(np.shape(rewards), np.float32)
    (r, nv), (term, trunc), device = _inputs(
        {"rewards": rewards, "next_values": next_values}, {"terminated": terminated, "truncated": truncated}
    )
    cut = trunc.copy()
    cut[-1] = True
    delta = r + nv * _where(cut & ~term, gamma, 0.0)
    return _out(_backward(delta, _where(term | trunc, 0.0, gamma)), device)


def nstep_targets(
    rewards: Any, next_values: Any, terminated: Any, truncated: Any, n: int, gamma: float = 0.99
) -> torch.Tensor:
    """n-step bootstrapped targets ``sum_k gamma^k r[t+k] + gamma^m V(s[t+m])``, ``m <= n``.

    The window stops early at an episode end (no bootstrap after a termination, the true
    final value after a truncation) and at the end of the rollout (``next_values[T-1]``).
    ``n = 1`` is the TD(0) target.

    Example:
        >>> import torch
        >>> r = torch.ones(3, 1); nv = torch.full((3, 1), 10.0)
        >>> no = torch.zeros(3, 1, dtype=torch.bool)
        >>> nstep_targets(r, nv, no, no, n=2, gamma=0.5)[:, 0].tolist()
        [4.0, 4.0, 6.0]
    """
    _check_discount(gamma)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise SpecError(f"n: expected a positive int, got {n!r}")
    (r, nv), (term, trunc), device = _inputs(
        {"rewards": rewards, "next_values": next_values}, {"terminated": terminated, "truncated": truncated}
    )
    cut = term | trunc
    cut[-1] = True
    keep = _where(term, 0.0, gamma)
    target = r + keep * nv  # n = 1
    for _ in range(int(n) - 1):
        ahead = np.empty_like(target)
        ahead[:-1] = target[1:]
        ahead[-1] = 0.0
        target = r + keep * np.where(cut, nv, ahead)
    return _out(target, device)


def vtrace(
    behaviour_log_probs: Any,
    target_log_probs: Any,
    rewards: Any,
    values: Any,
    next_values: Any,
    terminated: Any,
    truncated: Any,
    gamma: float = 0.99,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, IMPALA).

    With ``rho[t] = exp(target - behaviour)``, ``rho_c = min(rho_bar, rho)`` and
    ``c = lam * min(c_bar, rho)``: ``vs[t] = V[t] + delta[t] + gamma (1 - done[t]) c[t]
    (vs[t+1] - V[t+1])``, ``delta[t] = rho_c[t] (r[t] + gamma (1 - terminated[t])
    next_values[t] - V[t])``. The policy-gradient advantage is ``rho_c[t] (r[t] + gamma
    (1 - terminated[t]) vs'[t+1] - V[t])`` where ``vs'`` is ``vs[t+1]`` inside an episode
    and ``next_values[t]`` at a truncation or the rollout's end.

    On-policy (equal log-probs, ``rho_bar, c_bar >= 1``) ``vs - values`` is the GAE
    advantage with the same ``lam``, and with ``lam = 1`` so are the returned advantages.

    Returns:
        ``(advantages, vs)``: float32 ``[T, N]``; ``vs`` are the value targets.

    Example:
        >>> import torch
        >>> lp = torch.zeros(2, 1); r = torch.tensor([[0.0], [1.0]]); v = torch.zeros(2, 1)
        >>> done = torch.tensor([[False], [True]]); no = torch.zeros(2, 1, dtype=torch.bool)
        >>> adv, vs = vtrace(lp, lp, r, v, v, done, no, gamma=0.5)
        >>> vs[:, 0].tolist()
        [0.5, 1.0]
    """
    _check_discount(gamma, lam)
    if rho_bar <= 0 or c_bar <= 0:
        raise SpecError(f"rho_bar, c_bar: expected positive clipping levels, got {rho_bar!r}, {c_bar!r}")
    (blp, tlp, r, v, nv), (term, trunc), device = _inputs(
        {"behaviour_log_probs": behaviour_log_probs, "target_log_probs": target_log_probs,
         "rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
    )  # fmt: skip
    rho = np.exp(tlp - blp)
    rho_c = np.minimum(rho, np.float32(rho_bar))
    keep = _where(term, 0.0, gamma)
    done = term | trunc
    delta = rho_c * (r + keep * nv - v)
    c = np.minimum(rho, np.float32(c_bar)) * _where(done, 0.0, gamma * lam)
    vs = v + _backward(delta, c)
    vs_next = nv.copy()
    inside = ~done[:-1]
    vs_next[:-1][inside] = vs[1:][inside]
    adv = rho_c * (r + keep * vs_next - v)
    return _out(adv, device), _out(vs, device)


def normalize_advantages(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(a - mean) / (std + eps)`` over every element (a new tensor).

    Call it on the whole rollout (global) or on each minibatch's ``"advantage"``.

    Example:
        >>> import torch
        >>> normalize_advantages(torch.tensor([1.0, 3.0])).tolist()
        [-0.7071067690849304, 0.7071067690849304]
    """
    a = advantages.float()
    if a.numel() < 2:
        return a - a.mean()
    return (a - a.mean()) / (a.std() + eps)
