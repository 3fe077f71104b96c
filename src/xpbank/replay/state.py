"""The state of a :class:`~xpbank.ReplayBuffer`: what :func:`state_dict` saves (data,
cursor, ids, sampler, RNG, episode index), restoring it (:func:`load_state_dict`), and
the constructor options a bank rebuilds a buffer from (:func:`config`).

Each function takes the buffer (its :class:`~xpbank.replay.parts.BufferParts`); the
buffer's public methods call them holding its lock.

A bank rebuilds the buffer from :func:`config` (JSON-able: ``capacity``, the sampler as
``{"name", "config"}``, ``num_envs`` ...), so a new constructor option is one more key
there; ``state_dict(data=False)``, everything but the stored items, is what a bank keeps
in its state files. Loading an empty state that holds no episode index resets the
index's derived structures (the ring's ids may move back).
"""

from __future__ import annotations

from typing import Any

import torch

from xpbank.errors import CapacityError, SpecError
from xpbank.replay.parts import BufferParts
from xpbank.ring.episodes import EpisodeIndex, EpisodeKeys
from xpbank.sampler import sampler_config

__all__ = ["STATE_VERSION", "config", "load_state_dict", "seed_from", "state_dict"]


def seed_from(generator: torch.Generator | None = None) -> int:
    """A seed for a new buffer, drawn from ``generator`` (torch's global one by default).

    Front-ends that build buffers the user gave no seed for (the SB3 buffers, the seed
    APIs) use it, so runs after the same ``torch.manual_seed`` sample alike, as the
    libraries they mirror do.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> a = seed_from()
        >>> _ = torch.manual_seed(0)
        >>> a == seed_from()
        True
    """
    return int(torch.randint(2**62, (), dtype=torch.int64, generator=generator))


#: the layout version of a state dict; :func:`load_state_dict` accepts only this one
STATE_VERSION = 1


def state_dict(rb: BufferParts, data: bool = True) -> dict[str, Any]:
    """:meth:`ReplayBuffer.state_dict <xpbank.ReplayBuffer.state_dict>`'s work."""
    spec = rb._storage.spec
    storage = (
        rb._storage.state_dict(rb._ring.rows)
        if data
        else {"spec": None if spec is None else spec.to_dict(), "data": []}
    )
    return {
        "version": STATE_VERSION,
        "ring": rb._ring.state_dict(),
        "generator": rb._generator.get_state(),
        "sampler": rb._sampler.state_dict(),
        "storage": storage,
        **({"episodes": rb._ring.episodes.state_dict()} if rb._ring.episodes is not None else {}),
    }


def load_state_dict(rb: BufferParts, state: dict[str, Any]) -> None:
    """:meth:`ReplayBuffer.load_state_dict <xpbank.ReplayBuffer.load_state_dict>`'s work.

    Raises:
        SpecError: another state version, or a state without the episode index the
            buffer keeps (and items to index).
        CapacityError: a state of a buffer of another capacity.
    """
    if state.get("version") != STATE_VERSION:
        raise SpecError(f"state version: expected {STATE_VERSION}, got {state.get('version')!r}")
    capacity = int(state["ring"]["capacity"])
    if capacity != rb.capacity:
        raise CapacityError(f"state is of a buffer of capacity {capacity}, this one has {rb.capacity}")
    if rb._ring.episodes is not None and "episodes" not in state and int(state["ring"]["size"]):
        raise SpecError(
            "state holds no episode index, but this buffer keeps one (num_envs, an env field or "
            "nstep): its items' envs and episode ends cannot be recovered; build it without them"
        )
    rb._storage.load_state_dict(state["storage"])
    rb._ring.load_state_dict(state["ring"])
    rb._sampler.load_state_dict(state["sampler"])
    rb._generator.set_state(state["generator"])
    if "episodes" in state:
        if rb._ring.episodes is None:
            rb._ring.episodes = EpisodeIndex(rb._ring, rb._num_envs, rb._episode_keys)
        rb._ring.episodes.load_state_dict(state["episodes"])
    elif rb._ring.episodes is not None:  # an empty state: the ring's ids may have moved
        rb._ring.episodes.restart()


def config(rb: BufferParts) -> dict[str, Any]:
    """:meth:`ReplayBuffer.config <xpbank.ReplayBuffer.config>`: the JSON-able constructor options."""
    out: dict[str, Any] = {"capacity": rb.capacity, "sampler": sampler_config(rb._sampler)}
    if rb._num_envs is not None:
        out["num_envs"] = rb._num_envs
    if rb._episode_keys != EpisodeKeys():
        out["episode_keys"] = rb._episode_keys.config()
    if rb._nstep is not None:
        out["nstep"] = rb._nstep.config()
    if not rb._cast:
        out["cast"] = False
    return out
