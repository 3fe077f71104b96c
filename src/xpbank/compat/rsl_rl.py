"""rsl_rl's ``RolloutStorage`` (rsl-rl-lib 5.x) on an xpbank :class:`~xpbank.RolloutBuffer`.

Switch with one import line; rsl_rl's own ``PPO`` and ``Distillation`` take it as their
``storage``::

    from xpbank.compat.rsl_rl import RolloutStorage  # was: from rsl_rl.storage import RolloutStorage

The steps live in one ``[T, E]`` :class:`~xpbank.RolloutBuffer` (slot ``t * E + e``);
``observations``, ``actions``, ``rewards``, ``dones``, ``values``, ``returns``,
``advantages`` ... are views into it, so ``storage.returns[t] = ...`` and
``storage.advantages = ...`` (what rsl_rl's ``PPO.compute_returns`` does) write the
buffer, and the generators are the buffer's minibatch readers. Deliberate differences
(``docs/compat/rsl_rl.md``): a fresh permutation every epoch and no step left out, unless
``parity=True`` (rsl_rl's exact order from torch's global RNG, bit for bit) or
``drop_last=True``; :meth:`RolloutStorage.compute_returns` bootstraps time-outs from the
value of the true final observation, ``V(s_{t+1})``, where rsl_rl's PPO adds
``gamma * V(s_t)`` to the reward; errors are xpbank errors, raised before anything is
written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDict

from xpbank.compat._rsl_rl_steps import is_hidden, obs_fields, transition_step
from xpbank.compat._rsl_rl_types import Batch, Transition
from xpbank.errors import NotReadyError, SpecError, check_positive_int
from xpbank.rollout import RolloutBuffer, RolloutKeys, unpad
from xpbank.spec.batch import to_tensordict
from xpbank.spec.spec import Field, NestedKey, Spec

__all__ = ["RolloutStorage", "Transition", "Batch"]

KEYS = RolloutKeys(
    reward="rewards",
    value="values",
    log_prob="actions_log_prob",
    action="actions",
    terminated="terminated",
    truncated="time_outs",
    final_value="final_values",
)
_TYPES = ("rl", "distillation")
_RETURNS_INPUTS = ("rewards", "values", "terminated", "time_outs", "final_values")


_Batch = Batch  # the annotations' name (``Batch`` in the class body is the attribute)


class RolloutStorage:
    """rsl_rl's rollout storage over a ``[T, E]`` :class:`~xpbank.RolloutBuffer`.

    Args:
        training_type: ``"rl"`` (PPO) or ``"distillation"``.
        num_envs: envs per step (``E``).
        num_transitions_per_env: steps per rollout (``T``).
        obs: an observation of every env (a TensorDict ``[E]`` of groups): its layout.
        actions_shape: the shape of one env's action.
        device: where the steps live and minibatches are delivered.
        parity: rsl_rl's exact minibatches: one permutation from torch's global RNG
            reused every epoch, the remainder dropped, recurrent envs in fixed groups
            (bit for bit the same as rsl_rl after the same ``torch.manual_seed``, CPU).
        drop_last: drop the remainder (``T * E % num_mini_batches`` steps, or envs
            of recurrent minibatches) instead of spreading it over the minibatches.
        seed: seeds the storage's own generator (ignored with ``parity``).

    The buffer's layout (distribution parameters, hidden states) is fixed at the first
    ``add_transition``; the tensor attributes exist from then on. What is copied:
    ``add_transition`` copies in; the attributes are views (writes go into the
    buffer); minibatches are fresh memory.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> obs = TensorDict({"policy": torch.zeros(2, 3)}, batch_size=[2])
        >>> st = RolloutStorage("rl", 2, 4, obs, [1])
        >>> t = Transition()
        >>> for _ in range(4):
        ...     t.observations, t.actions, t.rewards = obs, torch.zeros(2, 1), torch.ones(2)
        ...     t.dones, t.values = torch.zeros(2), torch.zeros(2, 1)
        ...     t.actions_log_prob, t.distribution_params = torch.zeros(2), (torch.zeros(2, 1),)
        ...     st.add_transition(t)
        >>> st.compute_returns(torch.zeros(2, 1), gamma=0.5, lam=1.0, normalize_advantages=False)
        >>> st.returns[:, 0, 0].tolist()
        [1.875, 1.75, 1.5, 1.0]
        >>> [b.observations["policy"].shape for b in st.mini_batch_generator(2, num_epochs=1)]
        [torch.Size([4, 3]), torch.Size([4, 3])]
    """

    Transition = Transition
    Batch = Batch

    def __init__(
        self,
        training_type: str,
        num_envs: int,
        num_transitions_per_env: int,
        obs: TensorDict,
        actions_shape: tuple[int, ...] | list[int],
        device: str = "cpu",
        *,
        parity: bool = False,
        drop_last: bool = False,
        seed: int | None = None,
    ) -> None:
        if training_type not in _TYPES:
            raise SpecError(f"training_type: expected one of {list(_TYPES)}, got {training_type!r}")
        self.training_type = training_type
        self.num_envs = check_positive_int("num_envs", num_envs)
        self.num_transitions_per_env = check_positive_int("num_transitions_per_env", num_transitions_per_env)
        self.actions_shape = actions_shape
        self.device = device
        self.parity, self.drop_last = parity, drop_last or parity
        self._declared = Spec(
            {
                **{
                    ("obs", *((k,) if isinstance(k, str) else k)): Field(v.shape[1:], v.dtype)
                    for k, v in obs_fields(obs, num_envs).items()
                },
                "actions": Field(tuple(actions_shape)),
                **(
                    {"privileged_actions": Field(tuple(actions_shape))}
                    if training_type == "distillation"
                    else {}
                ),
            }
        )
        self._seed = seed
        self._rb: RolloutBuffer | None = None
        self._hidden: dict[str, list[NestedKey]] = {"a": [], "c": []}
        self._num_params = 0

    # -- writing ---------------------------------------------------------------
    def add_transition(self, transition: Any) -> None:
        """Copy one step of every env in at the current step (the whole step is checked
        first: nothing is written when a field is missing or has the wrong shape).

        Raises:
            SpecError: a field is missing, or its shape differs from the layout.
            CapacityError: the rollout already holds ``num_transitions_per_env`` steps.
        """
        step = transition_step(transition, self.training_type, self.num_envs)
        if self._rb is None:
            merged = Spec.merge(
                self._declared,
                Spec.from_batch(step, batch_ndim=1),
                names=["the constructor's obs/actions_shape", "the first transition"],
            )
            # the returns' inputs side by side in each packed row: read in one narrow pass
            first = [k for k in _RETURNS_INPUTS if k in merged]
            self._rb = self._new_buffer(
                Spec({k: merged[k] for k in [*first, *(k for k in merged if k not in first)]})
            )
        else:
            if any(is_hidden(k) and k not in (self._rb.spec or ()) for k in step):
                self._grow(step)  # a recurrent model's first step has no hidden state yet
            spec = self._rb.spec or Spec()
            for key in spec:
                if is_hidden(key) and key not in step:  # rsl_rl: the saved state stays zero
                    field = spec[key]
                    step[key] = torch.zeros(
                        (self.num_envs, *field.shape), dtype=field.dtype, device=self.device
                    )
        self._rb.add(step)
        self._track(step)

    def _new_buffer(self, spec: Spec) -> RolloutBuffer:
        rb = RolloutBuffer(
            self.num_envs, self.num_transitions_per_env, spec, device=self.device, keys=KEYS, seed=self._seed
        )
        for key in spec:  # rsl_rl's tensors start at zero
            rb.view(key).zero_()
        return rb

    def _grow(self, step: dict[NestedKey, torch.Tensor]) -> None:
        """Add the hidden-state fields that appeared in ``step``: a new buffer with them
        (zero for the steps stored so far), the stored steps copied over (once per storage)."""
        old = self._rb
        assert old is not None and old.spec is not None  # called once a step is stored
        extra = Spec.from_batch({k: v for k, v in step.items() if is_hidden(k) and k not in old.spec})
        new = self._new_buffer(Spec({**dict(old.spec.items()), **dict(extra.items())}))
        for t in range(self.step):
            row = {k: old.view(k)[t] for k in old.spec}
            new.add({**row, **{k: torch.zeros_like(step[k]) for k in extra}})
        self._rb = new

    def _track(self, step: dict[NestedKey, torch.Tensor]) -> None:
        """After a successful write: how many distribution parameters, which hidden states."""
        self._num_params = sum(1 for k in step if isinstance(k, tuple) and k[0] == "distribution_params")
        for part in "ac":
            keys: list[NestedKey] = [k for k in step if isinstance(k, tuple) and k[0] == f"hidden_{part}"]
            self._hidden[part] = keys or self._hidden[part]

    def clear(self) -> None:
        """Start the next rollout (the write cursor goes back to step 0)."""
        if self._rb is not None:
            self._rb.clear()

    def compute_returns(
        self,
        last_values: torch.Tensor,
        gamma: float = 0.99,
        lam: float = 0.95,
        normalize_advantages: bool = True,
    ) -> None:
        """GAE (:func:`xpbank.gae`) into ``returns`` and ``advantages``; time-outs bootstrap
        from the transitions' ``final_values`` (``V`` of the true final observation).

        ``last_values``: ``[E, 1]`` values after the last step. ``normalize_advantages``
        normalizes over the whole rollout, as rsl_rl's PPO does unless it normalizes per
        minibatch. Use it instead of rsl_rl's ``PPO.compute_returns`` (and do not add
        ``time_outs`` bootstraps to the rewards) to get time-outs right.
        """
        self._buffer("compute_returns").compute_returns(
            last_values.reshape(-1), gamma, lam, normalize=normalize_advantages
        )

    # -- views -----------------------------------------------------------------
    def _buffer(self, what: str) -> RolloutBuffer:
        if self._rb is None:
            raise NotReadyError(
                f"{what}: no transition stored yet; the layout is fixed by the first add_transition"
            )
        return self._rb

    @property
    def step(self) -> int:
        """Steps stored in this rollout."""
        return 0 if self._rb is None else len(self._rb) // self.num_envs

    @property
    def observations(self) -> TensorDict:
        rb = self._buffer("observations")
        obs = {
            k[1:] if len(k) > 2 else k[1]: rb.view(k)
            for k in rb.spec or ()
            if isinstance(k, tuple) and k[0] == "obs"
        }
        return to_tensordict(obs, tuple(rb.shape), rb.device)

    def _view(self, key: str) -> torch.Tensor:
        return self._buffer(key).view(key)

    actions = property(lambda self: self._view("actions"), doc="``[T, E, *actions_shape]`` (a view).")
    rewards = property(lambda self: self._view("rewards"), doc="``[T, E, 1]`` (a view).")
    dones = property(lambda self: self._view("dones"), doc="``[T, E, 1]`` uint8 (a view).")
    values = property(lambda self: self._view("values"), doc="``[T, E, 1]`` (a view).")
    actions_log_prob = property(lambda self: self._view("actions_log_prob"), doc="``[T, E, 1]`` (a view).")
    privileged_actions = property(
        lambda self: self._view("privileged_actions"), doc="``[T, E, ...]`` (a view)."
    )
    time_outs = property(lambda self: self._view("time_outs"), doc="``[T, E, 1]`` 0/1 float32 (a view).")

    @property
    def distribution_params(self) -> tuple[torch.Tensor, ...] | None:
        if self._rb is None:
            return None
        return tuple(self._rb.view(("distribution_params", str(i))) for i in range(self._num_params))

    def _target(self, key: str) -> torch.Tensor:
        return self._buffer(key).view(key).unsqueeze(-1)

    def _set_target(self, key: str, value: torch.Tensor) -> None:
        view = self._target(key)
        if tuple(value.shape) != tuple(view.shape):
            raise SpecError(f"{key}s: expected shape {list(view.shape)}, got {list(value.shape)}")
        view.copy_(value)

    returns = property(
        lambda self: self._target("return"),
        lambda self, v: self._set_target("return", v),
        doc="``[T, E, 1]`` (a view; assigning copies into the buffer).",
    )
    advantages = property(
        lambda self: self._target("advantage"),
        lambda self, v: self._set_target("advantage", v),
        doc="``[T, E, 1]`` (a view; assigning copies into the buffer).",
    )

    def _saved_hidden(self, part: str) -> list[torch.Tensor] | None:
        keys = self._hidden[part]
        if self._rb is None or not keys:
            return None
        return [self._rb.view(k).permute(0, 2, 1, 3) for k in keys]  # [T, layers, E, H]

    saved_hidden_state_a = property(lambda self: self._saved_hidden("a"), doc="Actor hidden states (views).")
    saved_hidden_state_c = property(lambda self: self._saved_hidden("c"), doc="Critic hidden states (views).")

    # -- reading ---------------------------------------------------------------
    def _require(self, training_type: str) -> RolloutBuffer:
        if self.training_type != training_type:
            what = "reinforcement learning" if training_type == "rl" else "distillation"
            raise SpecError(
                f"This function is only available for {what} training (training_type={self.training_type!r})."
            )
        return self._buffer("generator")

    def generator(self) -> Iterator[_Batch]:
        """Per-step batches ``[E]`` in time order (distillation)."""
        for td in self._require("distillation").steps():
            yield Batch(
                observations=td["obs"], privileged_actions=td["privileged_actions"], dones=td["dones"]
            )

    def mini_batch_generator(self, num_mini_batches: int, num_epochs: int = 8) -> Iterator[_Batch]:
        """Flat minibatches over all ``T * E`` steps, ``num_epochs`` passes (a fresh
        permutation each, unless ``parity``)."""
        rb = self._require("rl")
        with _global_rng(rb, self.parity):
            tds = rb.minibatches(
                num_mini_batches, num_epochs, drop_last=self.drop_last, reuse_order=self.parity
            )
            first = next(tds, None)  # draws the order (from the global RNG under parity)
        if first is None:
            return
        yield self._rl_batch(first)
        for td in tds:
            yield self._rl_batch(td)

    def _rl_batch(self, td: TensorDict, observations: TensorDict | None = None) -> _Batch:
        if "advantage" not in td:
            raise NotReadyError(
                "minibatches: no advantages/returns yet; compute them (PPO.compute_returns) first"
            )
        return Batch(
            observations=td["obs"] if observations is None else observations,
            actions=td["actions"],
            values=td["values"],
            advantages=td["advantage"].unsqueeze(-1),
            returns=td["return"].unsqueeze(-1),
            old_actions_log_prob=td["actions_log_prob"],
            old_distribution_params=tuple(td["distribution_params", str(i)] for i in range(self._num_params)),
        )

    def recurrent_mini_batch_generator(self, num_mini_batches: int, num_epochs: int = 8) -> Iterator[_Batch]:
        """Trajectories of groups of envs: padded observations ``[T, N]`` with ``masks``,
        the other fields ``[T, envs]``, hidden states at each trajectory's start."""
        rb = self._require("rl")
        hidden = self._hidden["a"] + self._hidden["c"]
        batches = rb.recurrent_minibatches(
            num_mini_batches, num_epochs, by="env", shuffle=not self.parity, hidden_keys=hidden,
            pad_to=self.num_transitions_per_env, drop_last=self.drop_last,
        )  # fmt: skip
        for data, start in batches:
            mask = data["mask"]
            flat = data.exclude("obs", "mask", "index")
            steps = unpad(flat, mask)  # env by env, each env's T steps in order
            steps = steps.view(-1, self.num_transitions_per_env).transpose(0, 1)  # [T, envs]
            batch = self._rl_batch(steps, _zero_padding(data["obs"], mask))
            batch.masks = mask
            batch.hidden_states = (self._start(start, "a"), self._start(start, "c"))
            yield batch

    def _start(self, start: TensorDict, part: str) -> Any:
        states = [start[k].transpose(0, 1).contiguous() for k in self._hidden[part]]  # [layers, N, H]
        if not states:
            return None
        return states[0] if len(states) == 1 else tuple(states)


class _global_rng:
    """Under ``parity``, draw from torch's global RNG (as rsl_rl does) and advance it."""

    def __init__(self, rb: RolloutBuffer, active: bool):
        self.rb, self.active = rb, active

    def __enter__(self) -> None:
        if self.active:
            self.rb.generator.set_state(torch.default_generator.get_state())

    def __exit__(self, *exc: object) -> None:
        if self.active:
            torch.default_generator.set_state(self.rb.generator.get_state())


def _zero_padding(td: TensorDict, mask: torch.Tensor) -> TensorDict:
    """rsl_rl pads trajectories with zeros (xpbank repeats the last real step)."""

    def fill(x: torch.Tensor) -> torch.Tensor:
        keep = mask.reshape(*mask.shape, *([1] * (x.dim() - mask.dim())))
        return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))

    return td.apply(fill)
