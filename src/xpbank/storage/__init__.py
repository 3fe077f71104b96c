"""Where the bytes live. See :class:`~xpbank.storage.base.Storage` for the protocol."""

from __future__ import annotations

from xpbank.storage.base import Storage
from xpbank.storage.frames import FrameStorage
from xpbank.storage.memmap import MemmapStorage
from xpbank.storage.tensor import TensorStorage

__all__ = ["Storage", "TensorStorage", "MemmapStorage"]
__all__ += ["FrameStorage"]
