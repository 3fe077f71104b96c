"""``XpbankMixtureReplayBuffer``: SB3's replay buffer whose batches mix in banks of earlier runs.

Offline-to-online training with SB3's SAC, TD3 or DQN (a warm start from an old run's
replay, RLPD-style 50/50 batches, an offline share annealed to 0): the new run writes
into its own buffer as with :class:`~xpbank.integrations.sb3.XpbankReplayBuffer`, and
each ``sample`` is drawn by a :class:`~xpbank.Mixture` over that live buffer and the
offline sources, in exact shares per batch. A bank path is opened read-only and
memory-mapped (:func:`xpbank.open_bank`), so a large bank is read page by page as
sampled, never loaded::

    model = SAC("MlpPolicy", env, replay_buffer_class=XpbankMixtureReplayBuffer,
                replay_buffer_kwargs={"offline": ["runs/old_bank"], "weights": [0.5, 0.5]})

The offline sources must store SB3 transitions of the same spaces (a bank saved with
``XpbankReplayBuffer.save_bank``, ``xpbank.save(model.replay_buffer.xp, path)``, or any
buffer of the same :func:`~xpbank.integrations.sb3.buffer.transition_spec`) and the same
n-step option; that is checked when the buffer is built.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.errors import BankError, SpecError, require
from xpbank.integrations.sb3.buffer import XpbankReplayBuffer
from xpbank.mix.mixture import METADATA_KEY as MIX_KEY
from xpbank.mix.mixture import Mixture
from xpbank.mix.schedule import Schedule
from xpbank.replay.buffer import ReplayBuffer
from xpbank.sampler import Sampler

__all__ = ["XpbankMixtureReplayBuffer", "METADATA_KEY"]

METADATA_KEY = "xpbank.integrations.sb3.mix"  # the offline sources' generators, in a saved bank

require("stable_baselines3", "sb3")


class XpbankMixtureReplayBuffer(XpbankReplayBuffer):
    """SB3's ``replay_buffer_class=`` whose samples mix the live buffer with offline sources.

    Writing (``add``), SB3's cursor and arrays, and ``dones`` / timeouts are those of
    :class:`~xpbank.integrations.sb3.XpbankReplayBuffer` (the live buffer, ``self.xp``).
    ``sample(batch_size)`` draws ``self.mixture.sample(batch_size)``: source 0 is the
    live buffer, sources ``1 ...`` are ``offline`` in order, and each batch holds exactly
    ``split_counts(weights, batch_size)`` items of each (see :class:`~xpbank.Mixture`).
    A schedule's step is the number of ``sample`` calls (gradient steps).

    Args:
        buffer_size, observation_space, action_space, device, n_envs,
            optimize_memory_usage, handle_timeout_termination, storage, sampler, seed,
            n_steps, gamma: as :class:`~xpbank.integrations.sb3.XpbankReplayBuffer`
            (the live buffer).
        offline: the offline sources: bank paths (opened ``"r"``, memory-mapped) or
            :class:`xpbank.ReplayBuffer` objects (used as they are, not copied).
        weights: one per source, the live buffer's first: numbers >= 0 or schedules
            (:class:`~xpbank.mix.Constant`, :class:`~xpbank.mix.Linear`), e.g.
            ``[0.5, 0.5]`` or ``[Linear(0.5, 1.0, steps=N), Linear(0.5, 0.0, steps=N)]``.
        mix_seed: seeds the mixture's generator (used only with ``exact=False``).
        exact: exact counts per batch (default) or a multinomial draw per batch.

    Raises:
        SpecError: an offline source stores other fields, shapes or dtypes than this
            buffer's transitions, holds nothing, or has another n-step option;
            ``weights`` not one per source (a ``CapacityError``).

    What is copied: ``add`` copies into the live buffer; a sample is new memory; the
    offline sources are only read (a bank opened ``"r"`` cannot be written).

    Threads: ``add`` is atomic under ``self.xp.lock``; ``sample`` under the mixture's
    lock, each source's share under that source's lock.

    Example:
        >>> import tempfile, gymnasium as gym, numpy as np
        >>> env = gym.make("Pendulum-v1")
        >>> old = XpbankReplayBuffer(100, env.observation_space, env.action_space, "cpu", seed=0)
        >>> for _ in range(20):
        ...     o = np.zeros((1, 3), np.float32)
        ...     old.add(o, o, np.zeros((1, 1)), np.array([-1.0]), np.array([False]), [{}])
        >>> path = old.save_bank(tempfile.mkdtemp() + "/old")
        >>> rb = XpbankMixtureReplayBuffer(100, env.observation_space, env.action_space, "cpu",
        ...                                offline=[path], weights=[0.5, 0.5], seed=1)
        >>> rb.add(o + 1, o + 1, np.zeros((1, 1)), np.array([0.0]), np.array([False]), [{}])
        >>> rb.sample(4).rewards.flatten().tolist()  # 2 live items, then 2 from the bank
        [0.0, 0.0, -1.0, -1.0]
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
        offline: Sequence[str | os.PathLike[str] | ReplayBuffer],
        weights: Sequence[float | Schedule],
        mix_seed: int | None = None,
        exact: bool = True,
        storage: str = "memory",
        sampler: Sampler | None = None,
        seed: int | None = None,
        n_steps: int = 1,
        gamma: float = 0.99,
        _xp: ReplayBuffer | None = None,
    ):
        if isinstance(offline, (str, os.PathLike, ReplayBuffer)):
            raise SpecError(
                f"offline: expected a list of bank paths or buffers, got one {type(offline).__name__}; "
                "pass [offline]"
            )
        super().__init__(
            buffer_size, observation_space, action_space, device, n_envs, optimize_memory_usage,
            handle_timeout_termination, storage=storage, sampler=sampler, seed=seed, n_steps=n_steps,
            gamma=gamma, _xp=_xp,
        )  # fmt: skip
        self.mixture = Mixture([self.xp, *offline], weights, seed=mix_seed, exact=exact)
        for i, source in enumerate(self.mixture.sources[1:]):
            self._check_offline(i, source)

    def _check_offline(self, i: int, source: ReplayBuffer) -> None:
        """Refuse an offline source that cannot give this buffer's transitions."""
        spec, theirs = self.xp.spec, source.spec
        if spec is None or theirs is None or len(source) == 0:
            raise SpecError(f"offline[{i}]: holds no transitions (an empty source cannot be mixed in)")
        for key in [*spec, *(k for k in theirs if k not in spec.keyset)]:  # this buffer's order first
            want, got = spec.get(key), theirs.get(key)
            if want != got:
                raise SpecError(
                    f"offline[{i}]: field {key!r}: expected {_describe(want)} (this buffer's "
                    f"transitions), got {_describe(got)}"
                )
        nstep, other = self.xp.config().get("nstep"), source.config().get("nstep")
        if nstep != other:
            raise SpecError(f"offline[{i}]: n-step option: expected {nstep}, got {other}")

    # -- reading -------------------------------------------------------------------
    def sample(self, batch_size: int, env: Any = None) -> Any:
        """``batch_size`` transitions in the mixture's shares, as SB3's ``ReplayBufferSamples``.

        Items are grouped by source (the live buffer's first).

        Args:
            batch_size: items in all, split in the mixture's shares.
            env: a ``VecNormalize`` normalizes observations and rewards, as SB3 does.

        Returns:
            SB3's ``ReplayBufferSamples`` on ``device`` (new memory).

        Raises:
            EmptyBufferError: the live buffer is empty and its weight is not 0.

        Threads: atomic under the mixture's lock (each share under its source's lock).
        """
        return self.samples_of(self.mixture.sample(batch_size), env)

    def sample_batch(self, batch_size: int, env: Any = None) -> tuple[Any, TensorDict]:
        """Like :meth:`sample`, plus the mixed xpbank batch (``"source"``, ``"index"``).

        Route priorities back with ``self.mixture.update_priority(batch["source"],
        batch["index"], p)``, never ``self.xp.update_priority`` (ids are per source).
        :class:`~xpbank.integrations.sb3.PrioritizedDQN` does the latter, so it refuses
        this buffer (its live sampler must keep priorities, and then this raises).

        Returns:
            ``(samples, batch)``: SB3's ``ReplayBufferSamples`` and the xpbank batch.

        Raises:
            SpecError: the live buffer's sampler keeps priorities (PrioritizedDQN would
                send the offline items' priorities to the live buffer).

        Threads: as :meth:`sample`.
        """
        if hasattr(self.xp.sampler, "update_priority"):
            raise SpecError(
                "sample_batch: a mixture's ids are per source; route priorities with "
                "mixture.update_priority(batch['source'], batch['index'], p) (PrioritizedDQN "
                "does not, so it cannot train from this buffer)"
            )
        batch = self.mixture.sample(batch_size)
        return self.samples_of(batch, env), batch

    # -- banks ---------------------------------------------------------------------
    def save_bank(self, path: str | os.PathLike[str]) -> os.PathLike[str]:
        """Save the live buffer as a bank, with the mixture's state (step, generator) and
        the offline sources' generators in its metadata; the offline data is not copied.
        Resume with :meth:`load_bank` and the same ``offline``: the next samples are the
        ones this buffer would draw (an offline source's other sampler state, such as a
        prioritized sampler's beta schedule, is not saved).

        Args:
            path: the bank directory (an existing bank there is replaced).

        Returns:
            The bank's path.

        Raises:
            BankError: as :func:`xpbank.save` (the target cannot be written).

        Threads: atomic under the mixture's lock and each source's lock.
        """
        from xpbank.bank import bank_metadata, save

        with self.mixture._lock:
            generators = []
            for rb in self.mixture.sources[1:]:
                with rb.lock:
                    generators.append(bytes(rb.generator.get_state().numpy()).hex())
            metadata = {
                **bank_metadata(self.xp),
                MIX_KEY: self.mixture.state_dict(),
                METADATA_KEY: {"offline_generators": generators},
            }
            return save(self.xp, path, metadata=metadata)

    @classmethod
    def load_bank(
        cls,
        path: str | os.PathLike[str],
        observation_space: Any,
        action_space: Any,
        device: torch.device | str = "auto",
        handle_timeout_termination: bool = True,
        *,
        offline: Sequence[str | os.PathLike[str] | ReplayBuffer] = (),
        weights: Sequence[float | Schedule] = (),
        mix_seed: int | None = None,
        exact: bool = True,
    ) -> XpbankMixtureReplayBuffer:
        """A buffer restored from :meth:`save_bank`: the live transitions, cursor and RNG,
        and the mixture's step (schedules go on where they were), over ``offline``.

        Args:
            path: a bank written by :meth:`save_bank`.
            observation_space, action_space, device, handle_timeout_termination: as the
                constructor.
            offline, weights, mix_seed, exact: as the constructor; the same ``offline``
                and ``weights`` as the saved buffer's.

        Returns:
            The restored buffer: its next samples are the saved one's.

        Raises:
            SpecError: as the constructor; the saved mixture had other weights.
            BankError: the bank was not saved by :meth:`save_bank` (no mixture state or
                no offline generators).

        Threads: builds a new buffer; nothing is shared with the saved one.
        """
        from xpbank.bank import bank_metadata

        arguments = cls._bank_arguments(path)
        xp = arguments["_xp"]
        buf = cls(
            observation_space=observation_space, action_space=action_space, device=device,
            handle_timeout_termination=handle_timeout_termination,
            offline=offline, weights=weights, mix_seed=mix_seed, exact=exact, **arguments,
        )  # fmt: skip
        buf.mixture.load_saved(xp)
        entry = bank_metadata(xp).get(METADATA_KEY)
        if entry is None:
            raise BankError(
                f"load_bank: the bank's metadata holds no {METADATA_KEY!r} entry (not saved by "
                "XpbankMixtureReplayBuffer.save_bank): the offline sources' draws cannot be resumed"
            )
        for rb, state in zip(buf.mixture.sources[1:], entry["offline_generators"], strict=True):
            raw = np.frombuffer(bytes.fromhex(state), dtype=np.uint8).copy()
            with rb.lock:
                rb.generator.set_state(torch.from_numpy(raw))
        return buf


def _describe(field: Any) -> str:
    return "no such field" if field is None else f"{tuple(field.shape)} {field.dtype}"
