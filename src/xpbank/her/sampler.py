"""``HerSampler``: hindsight experience replay as a sampler wrapper.

The wrapped sampler (uniform by default, or prioritized) picks the items as before; of
each batch of ``B``, the first ``int(B * k / (k + 1))`` are then relabelled with a goal
achieved later in their own episode (:mod:`xpbank.her.goals`), their rewards recomputed
by the user's ``compute_reward`` (:mod:`xpbank.her.relabel`). Nothing is stored twice:
the goals are read at sample time from the stored next achieved goals.

The buffer's read path calls :meth:`HerSampler.relabel` after reading the items (and
their n-step windows), so it composes with ``nstep=`` (each window relabelled with its
item's goal), with vector envs (``num_envs=`` or an env field), with prioritized
sampling (priorities stay per stored item: ``update_priority`` goes to the wrapped
sampler) and with any storage (``FrameStorage`` included: goals are plain fields).
Only :meth:`~xpbank.ReplayBuffer.sample` relabels; ``sample_all``, ``sample_by_index``
and ``epochs`` return the items as stored.

A relabelled sample carries ``"her_goal"``: the id of each row's goal step, ``-1`` for
rows left as stored. (So it cannot be passed back whole to ``update``, which refuses
that key: its goals and rewards are not the stored ones.)

Banks: ``xpbank.save`` keeps the sampler's ``config()`` (strategy, ``k``, keys, the
wrapped sampler) and state, and the buffer's generator, so a loaded buffer draws the
same items and goals; ``compute_reward`` is code, which a bank never holds: give it
again after loading (``rb.sampler.compute_reward = fn``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from xpbank.errors import PriorityError, SpecError, check_positive_int
from xpbank.her.goals import STRATEGIES, choose_goals, ends_table, stride_of
from xpbank.her.kernel import choose_rows, copy_rows
from xpbank.her.records import RecordLayout, sample_records
from xpbank.her.relabel import GoalKeys, GoalReader, RewardFn, relabel, relabel_rows
from xpbank.nstep.option import NStep
from xpbank.ring.ids import Ring
from xpbank.sampler import Sampler, UniformSampler
from xpbank.sampler.registry import make_sampler, register_sampler, sampler_config
from xpbank.spec.spec import NestedKey, normalize_key
from xpbank.storage.base import Slots, Storage

__all__ = ["HerSampler"]


@register_sampler("her")
class HerSampler:
    """Hindsight experience replay: relabel part of every sample with achieved goals.

    Args:
        base: the sampler that picks the items (default uniform); a bank passes its
            ``{"name", "config"}``.
        strategy: ``"future"`` (a step from the item to its episode's last written step,
            the item included), ``"final"`` (that last step) or ``"episode"`` (any live
            step of the episode).
        n_sampled_goal: ``k``, relabelled items per real one (SB3's name): a fraction
            ``k / (k + 1)`` of each batch is relabelled.
        relabel_fraction: that fraction given directly (in ``[0, 1]``), instead of ``k``.
        compute_reward: ``compute_reward(achieved_goal, desired_goal, info)``, vectorized
            over a leading batch dim, NumPy in (gymnasium-robotics' ``GoalEnv``
            signature); needed to sample, not to build (a bank cannot hold code).
        compute_terminated: the same signature, giving ``terminated`` under the new
            goal (e.g. success ends the episode); ``None``: keep the stored flag.
        keys: which fields hold the goals, reward and flags (:class:`GoalKeys`, or its
            ``config()`` dict); default: found by the usual names.
        info_keys: stored fields passed to the functions as ``info`` (a dict of arrays;
            ``"index"`` gives the transitions' ids); empty: ``info`` is ``None``.

    Example:
        >>> import torch
        >>> from xpbank import ReplayBuffer
        >>> from xpbank.her import HerSampler
        >>> reward = lambda achieved, desired, info: -(achieved != desired).any(-1).astype("float32")
        >>> her = HerSampler(strategy="final", n_sampled_goal=1, compute_reward=reward)
        >>> rb = ReplayBuffer(100, sampler=her, num_envs=1, seed=0)
        >>> pos = torch.arange(4.0).reshape(4, 1)  # one episode: positions 0 .. 3, goal 9
        >>> _ = rb.extend({"achieved_goal": pos, "next_achieved_goal": pos + 1,
        ...                "desired_goal": torch.full((4, 1), 9.0), "reward": -torch.ones(4),
        ...                "terminated": torch.tensor([False, False, False, True])})
        >>> batch = rb.sample(8)
        >>> batch["desired_goal"][:4].flatten().tolist(), batch["her_goal"][:4].tolist()
        ([4.0, 4.0, 4.0, 4.0], [3, 3, 3, 3])
        >>> batch["her_goal"][4:].tolist()
        [-1, -1, -1, -1]
    """

    needs_episodes = True
    # the read fast path's Shot of the last fused sample, its checks of this sampler's
    # settings passed (xpbank.her.records.sample_records); any attribute set drops it
    _hot: Any = None

    def __init__(
        self,
        base: Sampler | Mapping[str, Any] | None = None,
        *,
        strategy: str = "future",
        n_sampled_goal: int | None = None,
        relabel_fraction: float | None = None,
        compute_reward: RewardFn | None = None,
        compute_terminated: RewardFn | None = None,
        keys: GoalKeys | Mapping[str, Any] | None = None,
        info_keys: Sequence[Any] = (),
    ):
        made: Sampler | None = make_sampler(base) if isinstance(base, Mapping) else base
        self.base: Sampler = made if made is not None else UniformSampler()
        if isinstance(self.base, HerSampler):
            raise SpecError("base: a HerSampler cannot wrap another HerSampler")
        if strategy not in STRATEGIES:
            raise SpecError(f"strategy: expected one of {list(STRATEGIES)}, got {strategy!r}")
        self.strategy = strategy
        if n_sampled_goal is not None and relabel_fraction is not None:
            raise SpecError(
                "give n_sampled_goal or relabel_fraction, not both "
                f"(got {n_sampled_goal!r} and {relabel_fraction!r})"
            )
        if relabel_fraction is None:
            k = 4 if n_sampled_goal is None else check_positive_int("n_sampled_goal", n_sampled_goal)
            fraction = 1.0 - 1.0 / (k + 1)  # SB3's her_ratio, to the bit
        else:
            ok = isinstance(relabel_fraction, (int, float)) and not isinstance(relabel_fraction, bool)
            if not ok or not 0 <= relabel_fraction <= 1:  # NaN fails too
                raise SpecError(f"relabel_fraction: expected a number in [0, 1], got {relabel_fraction!r}")
            fraction = float(relabel_fraction)
        self.n_sampled_goal, self.relabel_fraction = n_sampled_goal, fraction
        self.compute_reward = compute_reward
        self.compute_terminated = compute_terminated
        self.keys = GoalKeys(**keys) if isinstance(keys, Mapping) else (keys or GoalKeys())
        self.info_keys: tuple[NestedKey, ...] = tuple(
            "index" if k == "index" else normalize_key(tuple(k) if isinstance(k, list) else k)
            for k in info_keys
        )
        # (spec, its keys, the index's stride, the goal reader) for the spec last seen
        self._resolved: tuple[Any, dict[str, NestedKey | None], int | None, GoalReader] | None = None
        self._uniform: tuple[torch.Tensor, np.ndarray] | None = None  # _draw's tensor
        self._records: RecordLayout | None = None  # sample_records' view of the storage

    def __setattr__(self, name: str, value: Any) -> None:
        # a changed setting (strategy, compute_reward, base ...) may end the fast path: the
        # next sample checks them again (records._sample_checked)
        self.__dict__["_hot"] = None
        object.__setattr__(self, name, value)

    def __getstate__(self) -> dict[str, Any]:
        # the caches hold views (the draw tensor's NumPy view, the storage's goal rows):
        # a pickled or copied sampler makes them again, or its view would not alias
        return {**self.__dict__, "_resolved": None, "_uniform": None, "_records": None, "_hot": None}

    # -- the Sampler protocol, delegated ------------------------------------------------
    def sample(
        self, ring: Ring, batch_size: int, generator: torch.Generator, replace: bool = True
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The wrapped sampler's items (relabelled later, by :meth:`relabel`).

        Raises:
            SpecError: no ``compute_reward`` (e.g. after loading a bank), before any
                randomness is drawn.
        """
        if self.compute_reward is None:
            raise SpecError(
                "HerSampler: no compute_reward (a sampler rebuilt from a bank holds no code); "
                "set it: rb.sampler.compute_reward = env.unwrapped.compute_reward"
            )
        slots, info = self.base.sample(ring, batch_size, generator, replace)
        if slots.ndim != 1:
            raise SpecError(
                f"HerSampler: the wrapped sampler gave {tuple(slots.shape)} slots; "
                "it relabels items, not windows"
            )
        return slots, info

    def on_write(self, slots: Slots, ring: Ring) -> None:
        self.base.on_write(slots, ring)

    def on_clear(self) -> None:
        self.base.on_clear()

    def bind_device(self, device: Any) -> None:
        """Passed on to the wrapped sampler (a prioritized one keeps its trees there)."""
        bind = getattr(self.base, "bind_device", None)
        if bind is not None:
            bind(device)

    def update_priority(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Priorities per stored item, kept by the wrapped sampler."""
        update = getattr(self.base, "update_priority", None)
        if update is None:
            raise PriorityError(
                f"update_priority: {self.base!r} keeps no priorities; wrap a PrioritizedSampler: "
                "HerSampler(PrioritizedSampler(), ...)"
            )
        update(slots, priorities)

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base.load_state_dict(state["base"])

    def config(self) -> dict[str, Any]:
        """JSON-able constructor arguments (not the functions: a bank holds no code)."""
        goals: dict[str, Any] = {"n_sampled_goal": self.n_sampled_goal}
        if self.n_sampled_goal is None:
            goals = {"relabel_fraction": self.relabel_fraction}
        return {
            "base": sampler_config(self.base),
            "strategy": self.strategy,
            **goals,
            "keys": self.keys.config(),
            "info_keys": [list(k) if isinstance(k, tuple) else k for k in self.info_keys],
        }

    # -- relabelling ----------------------------------------------------------------
    def relabel(
        self,
        storage: Storage,
        ring: Ring,
        slots: torch.Tensor,
        ids: torch.Tensor,
        keys: list[NestedKey] | None,
        info: dict[str, torch.Tensor],
        flat: dict[Any, torch.Tensor] | None,
        nstep: NStep | None,
        generator: torch.Generator,
    ) -> dict[Any, torch.Tensor]:
        """The sampled items' fields (``flat``, or read now), the first
        ``int(B * relabel_fraction)`` relabelled; adds ``info["her_goal"]``.

        Called by :meth:`ReplayBuffer.sample <xpbank.ReplayBuffer.sample>` holding the
        buffer's lock, after the items (and their n-step windows) are read.

        Raises:
            SpecError: no ``compute_reward`` (e.g. after loading a bank), the goal fields
                not found, or a reward function returning the wrong number of values.
        """
        spec, episodes = storage.spec, ring.episodes
        if spec is None or episodes is None:
            raise RuntimeError("HerSampler.relabel needs the buffer's spec and episode index")
        resolved = self._resolve(spec, episodes)
        reward = self.compute_reward
        if reward is None:  # sample() checked; a sampler changed in between
            raise SpecError("HerSampler: no compute_reward")
        b = slots.shape[0]
        m = int(self.relabel_fraction * b)
        goal_index = np.empty(b, dtype=np.int64)
        goal_index[m:] = -1
        info["her_goal"] = torch.from_numpy(goal_index)
        if m == 0:
            return storage.gather(slots, keys) if flat is None else flat
        uniform = self._draw(m, generator)
        cpu = ids.device.type == "cpu"
        item_ids = (ids.numpy() if cpu else ids.cpu().numpy())[:m]
        item_slots = (slots.numpy() if cpu else slots.cpu().numpy())[:m]
        achieved = resolved[1]["next_achieved"]
        fetch = None
        if achieved in (flat if flat is not None else (spec if keys is None else keys)):
            fetch = self._kernel_goals(
                storage, ring, nstep, resolved, item_ids, item_slots, uniform, goal_index
            )
        if flat is None:  # (the goal rows' lines arrive meanwhile)
            flat = storage.gather(slots, keys)
        if fetch is not None:
            relabel_rows(flat, resolved[1], m, fetch(), reward)
            return flat
        goals = choose_goals(
            episodes, ring, item_ids, self.strategy, uniform, resolved[2], item_slots, goal_index[:m]
        )
        relabel(
            storage, ring, resolved[1], flat, item_ids, goals,
            reward, self.compute_terminated, self.info_keys, nstep, resolved[3],
        )  # fmt: skip
        return flat

    def _resolve(
        self, spec: Any, episodes: Any
    ) -> tuple[Any, dict[str, NestedKey | None], int | None, GoalReader]:
        """``(spec, its keys, the index's stride, the goal reader)``, kept per spec.

        Raises:
            SpecError: the goal fields not found.
        """
        resolved = self._resolved
        if resolved is None or resolved[0] is not spec:
            found = self.keys.resolve(spec)
            resolved = self._resolved = (
                spec,
                found,
                stride_of(episodes, spec),
                GoalReader(found["next_achieved"] or ""),  # resolve() found it
            )
        return resolved

    # :meth:`sample` and :meth:`relabel` in one read of whole records, for the buffer's
    # read fast path: the function itself (its docstring), no method wrapping it (one
    # Python call less a sample)
    sample_records = sample_records

    def _reads_records(self) -> bool:
        """Whether :meth:`sample_records` may read for this sampler: not for a subclass
        that changes the draw or the relabelling (the general path)."""
        cls = type(self)
        return cls is HerSampler or (cls.relabel is HerSampler.relabel and cls.sample is HerSampler.sample)

    def _kernel_goals(
        self,
        storage: Storage,
        ring: Ring,
        nstep: NStep | None,
        resolved: tuple[Any, dict[str, NestedKey | None], int | None, GoalReader],
        item_ids: np.ndarray,
        item_slots: np.ndarray,
        uniform: np.ndarray,
        goal_index: np.ndarray,
    ) -> Callable[[], np.ndarray] | None:
        """The common case through the compiled kernel (:mod:`xpbank.her.kernel`): lockstep,
        ``future`` or ``final``, one step, no ``info``, no ``compute_terminated``, and the
        items' next achieved goals read with them. Chooses the goals (into
        ``goal_index``; the same as :func:`choose_goals`) and prefetches their rows now;
        returns the read of the rows (as :class:`GoalReader` gives them). ``None``: not
        this case, or no kernel (nothing written)."""
        stride, reader = resolved[2], resolved[3]
        if (
            stride is None
            or self.strategy == "episode"
            or nstep is not None
            or self.info_keys
            or self.compute_terminated is not None
            or ring.episodes is None
        ):
            return None
        host = reader.host(storage)
        if host is None:
            return None
        left = ends_table(ring.episodes, ring, stride).left
        rows = choose_rows(
            host[1], item_ids, item_slots, uniform, left, stride, ring.capacity, ring.next_id,
            self.strategy == "final", goal_index[: item_ids.shape[0]],
        )  # fmt: skip
        if rows is None:
            return None
        return lambda: copy_rows(host[1], host[0], rows)

    def _draw(self, m: int, generator: torch.Generator) -> np.ndarray:
        """``m`` uniform float64 draws from ``generator``: ``torch.rand(m, generator=...,
        dtype=torch.float64)``'s values, into a tensor kept per ``m`` (read before the next call)."""
        kept = self._uniform
        if kept is None or kept[0].shape[0] != m:
            t = torch.empty(m, dtype=torch.float64)
            kept = self._uniform = (t, t.numpy())
        kept[0].uniform_(generator=generator)  # what torch.rand does, without its allocation
        return kept[1]

    def __repr__(self) -> str:
        return (
            f"HerSampler({self.base!r}, strategy={self.strategy!r}, "
            f"relabel_fraction={self.relabel_fraction:.4g})"
        )
