"""The minibatch generators of :mod:`xpbank.compat.rsl_rl`, over the storage's views.

The order of the steps comes from xpbank's plans (:func:`~xpbank.rollout.minibatch.flat_plan`,
or envs in groups as :func:`~xpbank.rollout.minibatch.trajectory_plan` by env); each
field of a minibatch is one gather from its contiguous view (a NumPy ``take`` on the
CPU). Recurrent minibatches pad every trajectory once per call (one scatter per
observation group, zeros as rsl_rl's padding) and then gather (or, in rsl_rl's fixed
env groups, slice) the trajectories of each group of envs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from xpbank.compat._rsl_rl_types import Batch
from xpbank.compat._rsl_rl_views import Views
from xpbank.errors import CapacityError, check_positive_int
from xpbank.rollout.direct import host
from xpbank.spec.batch import flat_tensordict, to_tensordict

__all__ = ["flat_batches", "recurrent_batches", "env_groups"]


def flat_batches(
    views: Views,
    plan: Iterator[torch.Tensor],
    check: Callable[[], None],
    returns: torch.Tensor,
    advantages: torch.Tensor,
) -> Iterator[Batch]:
    """rsl_rl's flat minibatches: the steps ``plan`` gives, every field gathered
    (``returns``/``advantages``: the storage's, ``[T, E, 1]``).

    ``check()`` runs before each minibatch (it raises once the storage was cleared).
    """
    flat = [views.flat("actions"), views.flat("values"), advantages.flatten(0, 1), returns.flatten(0, 1)]
    flat += [views.flat("actions_log_prob"), *(p.flatten(0, 1) for p in views.dist)]
    obs = {k: v.flatten(0, 1) for k, v in views.obs.items()}
    device, n = views.rb.device, len(flat)
    # the observation groups' TensorDict: made directly where every group is top-level
    make_td: Callable[..., Any] = flat_tensordict if all(isinstance(k, str) for k in obs) else to_tensordict
    arrays: list[Any] = [host(x) for x in flat] if views.is_host else []
    groups: list[tuple[Any, Any]] = [(k, host(v)) for k, v in obs.items()] if views.is_host else []
    # NumPy's take of contiguous rows (CPU): a fraction of torch's per-call cost
    use_numpy = views.is_host and all(a is not None for a in [*arrays, *(g for _, g in groups)])
    from_numpy = torch.from_numpy
    for idx in plan:
        check()
        groups_got: dict[Any, torch.Tensor]
        if use_numpy:
            rows = idx.numpy()
            got = [from_numpy(a.take(rows, axis=0)) for a in arrays]
            groups_got = {k: from_numpy(a.take(rows, axis=0)) for k, a in groups}
        else:
            sel = idx.to(device)
            got = [x.index_select(0, sel) for x in flat]
            groups_got = {k: v.index_select(0, sel) for k, v in obs.items()}
        yield Batch(
            observations=make_td(groups_got, idx.shape, device),
            actions=got[0],
            values=got[1],
            advantages=got[2],
            returns=got[3],
            old_actions_log_prob=got[4],
            old_distribution_params=tuple(got[5:n]),
        )


def env_groups(
    num_envs: int, k: int, epochs: int, shuffle: bool, drop_last: bool, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """Envs of each recurrent minibatch, ascending: ``k`` groups a pass, ``epochs`` passes.

    Near-equal groups covering every env, permuted each epoch when ``shuffle``; with
    ``drop_last``, rsl_rl's ``num_envs // k`` each, the remainder left out (the same
    draws as :func:`~xpbank.rollout.minibatch.trajectory_plan` by env).

    Example:
        >>> [g.tolist() for g in env_groups(5, 2, 1, False, False, torch.Generator())]
        [[0, 1], [2, 3, 4]]
    """
    check_positive_int("num_mini_batches", k)
    check_positive_int("num_epochs", epochs)
    if k > num_envs:
        raise CapacityError(f"num_minibatches {k} is more than the {num_envs} envs to split")
    bounds = [i * (num_envs // k) if drop_last else i * num_envs // k for i in range(k + 1)]
    for _ in range(epochs):
        cols = torch.randperm(num_envs, generator=generator) if shuffle else torch.arange(num_envs)
        for i in range(k):
            yield cols[bounds[i] : bounds[i + 1]].sort().values


def recurrent_batches(
    views: Views,
    groups: Iterator[torch.Tensor],
    contiguous: bool,
    check: Callable[[], None],
    returns: torch.Tensor,
    advantages: torch.Tensor,
) -> Iterator[Batch]:
    """rsl_rl's recurrent minibatches, one per group of envs ``groups`` yields.

    Observations ``[T, N]`` (trajectories split at ``dones``, zero-padded to ``T``) with
    ``masks``; the other fields ``[T, envs]``; hidden states at each trajectory's first
    step, ``[layers, N, H]`` (a tuple of them where there are several, as an LSTM's).
    ``contiguous``: the groups are ranges of envs (rsl_rl's), read as views, as rsl_rl does.
    """
    t_len, e = views.shape
    ends = host(views.fields["dones"].view(t_len, e) != 0).T.copy()  # type: ignore[union-attr]
    ends[:, -1] = True  # [E, T]: trajectories in env-major order, as rsl_rl's
    flat_ends = ends.reshape(-1)
    traj = np.cumsum(flat_ends) - flat_ends  # the trajectory of each (env, t)
    n = int(flat_ends.sum())
    first = np.concatenate(([0], np.flatnonzero(flat_ends)[:-1] + 1))  # env-major position of each start
    steps = np.arange(t_len * e)
    t_of, env_of = steps % t_len, steps // t_len
    pos = t_of - (first[traj] % t_len)
    dst = torch.from_numpy(pos * n + traj)  # in the padded [T, N]
    src = torch.from_numpy(t_of * e + env_of)  # the step's slot
    padded = {}
    for key, v in views.obs.items():
        flat = v.flatten(0, 1)
        out = torch.zeros((t_len * n, *v.shape[2:]), dtype=v.dtype, device=v.device)
        out.index_copy_(0, dst.to(v.device), flat.index_select(0, src.to(v.device)))
        padded[key] = out.view(t_len, n, *v.shape[2:])
    mask = torch.zeros(t_len * n, dtype=torch.bool)
    mask[dst] = True
    mask = mask.view(t_len, n).to(views.rb.device)
    device = views.rb.device
    start_slot = torch.from_numpy((first % t_len) * e + first // t_len)  # [N]
    env_traj = torch.from_numpy(np.concatenate(([0], np.cumsum(flat_ends.reshape(e, t_len).sum(1)))))
    states = {part: [h.flatten(0, 1) for h in views.hidden[part]] for part in "ac"}
    stored = _fields(views, returns, advantages)
    for envs in groups:
        check()
        if contiguous:
            a, b = (int(envs[0]), int(envs[-1]) + 1) if envs.numel() else (0, 0)
            lo, hi = int(env_traj[a]), int(env_traj[b])
            starts = start_slot[lo:hi]
            fields = {k: v[:, a:b] for k, v in stored.items()}
            groups_got = {k: v[:, lo:hi] for k, v in padded.items()}
            batch_mask = mask[:, lo:hi]
        else:
            pick = _trajectories_of(envs, env_traj)
            starts = start_slot[pick]
            cols, traj = envs.to(device), pick.to(device)
            fields = {k: v.index_select(1, cols) for k, v in stored.items()}
            groups_got = {k: v.index_select(1, traj) for k, v in padded.items()}
            batch_mask = mask.index_select(1, traj)
        batch_obs = to_tensordict(groups_got, (t_len, starts.shape[0]), device)
        yield Batch(
            observations=batch_obs,
            actions=fields["actions"],
            values=fields["values"],
            advantages=fields["advantages"],
            returns=fields["returns"],
            old_actions_log_prob=fields["actions_log_prob"],
            old_distribution_params=tuple(fields[i] for i in range(len(views.dist))),
            hidden_states=(_start(states["a"], starts), _start(states["c"], starts)),
            masks=batch_mask,
        )


def _fields(views: Views, returns: torch.Tensor, advantages: torch.Tensor) -> dict[Any, torch.Tensor]:
    out: dict[Any, torch.Tensor] = {k: views.fields[k] for k in ("actions", "values", "actions_log_prob")}
    out.update({"advantages": advantages, "returns": returns})
    out.update(enumerate(views.dist))
    return out


def _trajectories_of(envs: torch.Tensor, env_traj: torch.Tensor) -> torch.Tensor:
    """The trajectories of ``envs`` (ascending), env by env: ``env_traj[e] ... env_traj[e + 1] - 1``."""
    lo, hi = env_traj[envs], env_traj[envs + 1]
    counts = hi - lo
    offsets = torch.repeat_interleave(lo - torch.cumsum(counts, 0) + counts, counts)
    return torch.arange(int(counts.sum())) + offsets


def _start(states: list[torch.Tensor], starts: torch.Tensor) -> Any:
    """The hidden states ``[T * E, layers, H]`` at ``starts``, as ``[layers, N, H]``."""
    if not states:
        return None
    out = [h.index_select(0, starts.to(h.device)).transpose(0, 1).contiguous() for h in states]
    return out[0] if len(out) == 1 else tuple(out)
