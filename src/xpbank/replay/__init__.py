"""The replay front-end: :class:`ReplayBuffer`, a FIFO ring writer wired to a storage
and a sampler."""

from xpbank.replay.buffer import ReplayBuffer

__all__ = ["ReplayBuffer"]
