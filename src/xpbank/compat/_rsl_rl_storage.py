"""The storage of :mod:`xpbank.compat.rsl_rl`: rsl_rl's ``RolloutStorage`` on an xpbank buffer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import chain
from typing import Any

import torch
from tensordict import TensorDict

from xpbank.compat._rsl_rl_class import class_for, pending, restore, user_class
from xpbank.compat._rsl_rl_read import env_groups, flat_batches, recurrent_batches
from xpbank.compat._rsl_rl_steps import (
    gives_time_outs,
    is_hidden,
    obs_fields,
    time_out_fields,
    transition_step,
)
from xpbank.compat._rsl_rl_types import Batch, Transition
from xpbank.compat._rsl_rl_views import TIME_OUT_FIELDS, Views
from xpbank.errors import BufferChangedError, NotReadyError, SpecError, check_positive_int
from xpbank.replay.state import seed_from
from xpbank.rollout import RolloutBuffer, RolloutKeys
from xpbank.rollout.minibatch import flat_plan
from xpbank.spec.spec import Field, NestedKey, Spec

__all__ = ["RolloutStorage", "KEYS"]

KEYS = RolloutKeys(
    reward="rewards",
    value="values",
    log_prob="actions_log_prob",
    action="actions",
    terminated="terminated",
    truncated="time_outs",
    final_value="final_values",
)
_PLAIN_KEYS = replace(KEYS, terminated="dones")  # no time-out fields: every done ends an episode
_TYPES = ("rl", "distillation")

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
            of ``device`` (as rsl_rl's ``randperm(device=...)``: CUDA's own generator
            on a GPU) reused every epoch, the remainder dropped, recurrent envs in
            fixed groups (bit for bit rsl_rl's after the same ``torch.manual_seed``,
            on the CPU and on CUDA).
        drop_last: drop the remainder (``T * E % num_mini_batches`` steps, or envs
            of recurrent minibatches) instead of spreading it over the minibatches.
        seed: seeds the storage's own generator (minibatch orders; unused with
            ``parity``). ``None`` draws it from torch's global generator, so runs after
            the same ``torch.manual_seed`` are the same runs.

    The buffer's layout (distribution parameters, hidden states, time-out fields) is
    fixed at the first ``add_transition``; the tensor attributes exist from then on
    (plain attributes, read as cheaply as rsl_rl's; before, reading one raises
    :class:`~xpbank.NotReadyError`, or gives ``None`` where rsl_rl's is ``None``):
    ``observations`` (``[T, E]`` TensorDict of the groups), ``actions``, ``rewards``,
    ``dones`` (uint8), ``values``, ``actions_log_prob``, ``returns`` (``[T, E, 1]``, or
    ``[T, E, *actions_shape]``), ``privileged_actions`` (distillation), ``time_outs``
    (with time-out fields), ``distribution_params``, ``saved_hidden_state_a`` /
    ``_c`` (``[T, layers, E, H]`` each) and ``advantages`` (a property: its shape is
    checked when assigned). Assigning ``returns`` or ``advantages`` rebinds them, as in rsl_rl.
    What is copied: ``add_transition`` copies in; the attributes are views (writes go
    into the buffer); flat minibatches are fresh memory; distillation steps and, with
    ``parity``, the fields of recurrent minibatches are views, as rsl_rl's are.

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

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """Pickled as the user's class (its class before/after the layout is chosen anew)."""
        return restore, (user_class(type(self)), self.__dict__)

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
        # until the layout is fixed, a subclass of the user's class whose __getattr__ answers
        # (:mod:`~xpbank.compat._rsl_rl_class`: plain attribute reads after that)
        self.__class__ = pending(user_class(type(self)))
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
        if seed is None and not parity:  # reproducible after torch.manual_seed, as rsl_rl's own
            seed = seed_from()
        self._seed = seed
        self._rb: RolloutBuffer | None = None
        self._views: Views | None = None
        self._hidden: dict[str, list[NestedKey]] = {"a": [], "c": []}
        self._num_params = 0
        self._t = 0  # steps stored in this rollout
        self._clears = 0  # rollouts started: a generator refuses to read the next one
        self._targets = False  # returns/advantages set (computed, or written through the views)
        self._adv: torch.Tensor | None = None  # the advantages (the buffer's view until assigned)
        self._adv_shape: torch.Size | None = None

    # -- writing ---------------------------------------------------------------
    def add_transition(self, transition: Any) -> None:
        """Copy one step of every env in at the current step (the whole step is checked
        first: nothing is written when a field is missing or has the wrong shape).

        Raises:
            SpecError: a field is missing, or its shape differs from the layout.
            CapacityError: the rollout already holds ``num_transitions_per_env`` steps.
        """
        views = self._views
        if views is not None and views.write(transition, self._t, time_out_fields):
            views.rb.advance()
            self._t += 1
            return
        # rsl_rl's runners roll out under torch.inference_mode(); the buffer and its views
        # are made here, and must be normal tensors as rsl_rl's are (allocated in its
        # constructor): autograd may save them (Distillation's loss reads the storage's
        # views) and users may write them in place outside inference mode
        with torch.inference_mode(False):
            self._add_checked(transition)

    def _add_checked(self, transition: Any) -> None:
        """The general path: the layout's first step, a growing layout, other inputs, errors."""
        rl = self.training_type == "rl"
        time_outs = rl and (gives_time_outs(transition) or (self._rb is not None and self._has("time_outs")))
        step = transition_step(transition, self.training_type, self.num_envs, time_outs)
        if self._rb is None:
            self._rb = self._new_buffer(
                Spec.merge(
                    self._declared,
                    Spec.from_batch(step, batch_ndim=1),
                    names=["the constructor's obs/actions_shape", "the first transition"],
                )
            )
        else:
            if any((is_hidden(k) or k in TIME_OUT_FIELDS) and not self._has(k) for k in step):
                self._grow(step)  # a recurrent model's first step has no hidden state yet
            spec = self._rb.spec or Spec()
            for key in spec:
                if is_hidden(key) and key not in step:  # rsl_rl: the saved state stays zero
                    field = spec[key]
                    step[key] = torch.zeros(
                        (self.num_envs, *field.shape), dtype=field.dtype, device=self.device
                    )
        self._rb.add(step)
        self._t += 1
        self._track(step)
        self._views = Views(self._rb, self._num_params, self._hidden)
        attributes = self._views.attributes()
        self.__dict__.update(attributes)  # plain attributes: read as cheaply as rsl_rl's
        self.__class__ = class_for(user_class(type(self)), attributes)
        self._adv = self._views.advantages
        self._adv_shape = self._adv.shape

    def _has(self, key: NestedKey) -> bool:
        return self._rb is not None and self._rb.spec is not None and key in self._rb.spec

    def _new_buffer(self, spec: Spec) -> RolloutBuffer:
        rb = RolloutBuffer(
            self.num_envs, self.num_transitions_per_env, spec, device=self.device,
            keys=KEYS if "time_outs" in spec else _PLAIN_KEYS, seed=self._seed, pack=False,
        )  # fmt: skip
        for key in spec:  # rsl_rl's tensors start at zero
            rb.view(key).zero_()
        return rb

    def _grow(self, step: dict[NestedKey, torch.Tensor]) -> None:
        """Add the hidden-state and time-out fields that appeared in ``step``: a new buffer
        with them (zero for the steps stored so far, ``terminated`` = their ``dones``), the
        stored steps copied over (once per storage)."""
        old = self._rb
        assert old is not None and old.spec is not None  # called once a step is stored
        extra = Spec.from_batch({k: v for k, v in step.items() if k not in old.spec})
        new = self._new_buffer(Spec({**dict(old.spec.items()), **dict(extra.items())}))
        for t in range(self._t):
            row = {k: old.view(k)[t] for k in old.spec}
            fill = {k: torch.zeros_like(step[k]) for k in extra}
            if "terminated" in fill:
                fill["terminated"] = row["dones"].float()
            new.add({**row, **fill})
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
        self._t, self._targets = 0, False
        self._clears += 1

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
        views = self._v("compute_returns")
        views.rb.compute_returns(last_values.reshape(-1), gamma, lam, normalize=normalize_advantages)
        self.returns, self._adv = views.returns, views.advantages  # where they were computed
        self._targets = True

    # -- views -----------------------------------------------------------------
    def _v(self, what: str) -> Views:
        if self._views is None:
            raise self._not_ready(what)
        return self._views

    @staticmethod
    def _not_ready(what: str) -> NotReadyError:
        return NotReadyError(
            f"{what}: no transition stored yet; the layout is fixed by the first add_transition"
        )

    @property
    def step(self) -> int:
        """Steps stored in this rollout."""
        return self._t

    def _get_advantages(self) -> torch.Tensor:
        adv = self._adv
        if adv is None:
            raise self._not_ready("advantages")
        self._targets = True  # rsl_rl's PPO computes them through this attribute
        return adv

    def _set_advantages(self, value: torch.Tensor) -> None:
        """Rebind them, as rsl_rl does (``PPO.compute_returns`` assigns a new tensor twice),
        after checking the shape (cheaply: this is in rsl_rl's returns loop)."""
        want = self._adv_shape
        if want is None:
            raise self._not_ready("advantages")
        if value.shape != want:
            raise SpecError(f"advantages: expected shape {list(want)}, got {list(value.shape)}")
        self._adv, self._targets = value, True

    advantages = property(_get_advantages, _set_advantages, doc="``[T, E, 1]`` (a view until assigned).")

    # -- reading ---------------------------------------------------------------
    def _require(self, training_type: str) -> Views:
        if self.training_type != training_type:
            what = "reinforcement learning" if training_type == "rl" else "distillation"
            raise SpecError(
                f"This function is only available for {what} training (training_type={self.training_type!r})."
            )
        views = self._v("generator")
        if training_type == "rl" and not self._targets:
            raise NotReadyError(
                "minibatches: no advantages/returns yet; compute them (PPO.compute_returns) first"
            )
        return views

    def _check(self) -> Callable[[], None]:
        """Raises at the next minibatch once the storage is cleared (the next rollout)."""
        clears = self._clears

        def check() -> None:
            if self._clears != clears:
                raise BufferChangedError("minibatches: the storage was cleared during iteration")

        return check

    def generator(self) -> Iterator[_Batch]:
        """Per-step batches ``[E]`` in time order (distillation; views, as rsl_rl's)."""
        views, check = self._require("distillation"), self._check()
        obs, fields = views.observations, views.fields
        for t in range(self.num_transitions_per_env):
            check()
            yield Batch(
                observations=obs[t],
                privileged_actions=fields["privileged_actions"][t],
                dones=fields["dones"][t],
            )

    def mini_batch_generator(self, num_mini_batches: int, num_epochs: int = 8) -> Iterator[_Batch]:
        """Flat minibatches over all ``T * E`` steps, ``num_epochs`` passes (a fresh
        permutation each, unless ``parity``)."""
        views, check = self._require("rl"), self._check()
        rb = views.rb
        # parity: rsl_rl's randperm(device=self.device), from that device's global generator
        generator = _global_generator(rb.device) if self.parity else rb.generator
        plan = flat_plan(
            rb.capacity, num_mini_batches, num_epochs, True, self.drop_last, generator, self.parity
        )
        first = next(plan, None)  # draws the order now (rsl_rl draws before its first batch)
        if first is not None:
            yield from flat_batches(views, chain([first], plan), check, self.returns, self.advantages)

    def recurrent_mini_batch_generator(self, num_mini_batches: int, num_epochs: int = 8) -> Iterator[_Batch]:
        """Trajectories of groups of envs: padded observations ``[T, N]`` with ``masks``,
        the other fields ``[T, envs]``, hidden states at each trajectory's start."""
        views, check = self._require("rl"), self._check()
        groups = env_groups(
            self.num_envs, num_mini_batches, num_epochs, not self.parity, self.drop_last, views.rb.generator
        )
        yield from recurrent_batches(views, groups, self.parity, check, self.returns, self.advantages)


def _global_generator(device: torch.device) -> torch.Generator:
    """torch's global generator for ``device``: the one ``torch.randperm(n, device=device)``
    draws from (a CUDA device's own, seeded by ``torch.manual_seed`` too)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator
