"""The handles of a :class:`~xpbank.distributed.shm.ShmReplayBuffer`'s writer processes
(:class:`ShmWriter`) and what the learner knows of each channel (:class:`WriterStatus`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xpbank.distributed.channel import Channel, record_dtype
from xpbank.errors import ChannelError
from xpbank.spec.batch import flatten
from xpbank.spec.spec import Spec
from xpbank.storage.dtypes import to_numpy

__all__ = ["ShmWriter", "WriterStatus"]


@dataclass(frozen=True)
class WriterStatus:
    """What the learner knows of one channel.

    ``state``: ``"free"`` (no writer yet, or the last one closed), ``"attached"`` (a
    live process holds it) or ``"crashed"`` (its writer died without closing; the
    channel is free again). ``crashes`` and ``lost_rows`` count every writer of this
    channel that died and the reserved rows it never published.
    """

    index: int
    state: str
    pid: int
    published: int
    crashes: int
    lost_rows: int


class ChannelHandle:
    """What a process holds of one shared-memory channel of a :class:`ShmReplayBuffer`:
    picklable (the channel's path, spec and size), mapped on first use in the process
    that uses it, one live process per channel at a time. :class:`ShmWriter` publishes
    rows through it; :class:`~xpbank.distributed.shm_readers.ShmReader` asks for and
    takes rows."""

    ROLE = "writer"  # the channel's user, for messages (Channel.attach_writer)

    def __init__(self, path: Path, spec: Spec, rows: int, timeout: float = 60.0):
        self._path, self._spec, self._rows, self.timeout = path, spec, rows, timeout
        self._keys = list(spec)
        self._channel: Channel | None = None

    def _record(self) -> np.dtype:
        return record_dtype(self._spec)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": str(self._path),
            "spec": self._spec.to_dict(),
            "rows": self._rows,
            "timeout": self.timeout,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(Path(state["path"]), Spec.from_dict(state["spec"]), state["rows"], state["timeout"])  # type: ignore[misc]

    def _open(self) -> Channel:
        if self._channel is None:
            if not self._path.exists():
                raise ChannelError(f"{self.ROLE}: channel {self._path} is gone (was the buffer closed?)")
            channel = Channel(self._path, self._record(), self._rows)
            channel.attach_writer(timeout=self.timeout, role=self.ROLE)
            self._channel = channel
        return self._channel

    def close(self) -> None:
        """Detach (marks a clean exit: the owner will not count a crash)."""
        if self._channel is not None:
            self._channel.close_writer()
            self._channel.close()
            self._channel = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ShmWriter(ChannelHandle):
    """A collector process's handle on one channel of a :class:`ShmReplayBuffer`.

    Picklable (it holds the channel's path, spec and size); it maps the channel on
    first use, in the process that uses it. One live process per channel at a time.

    Args:
        timeout: seconds ``extend`` waits for room when the learner falls behind
            before raising :class:`~xpbank.BufferTimeoutError`.
    """

    def extend(self, batch: Any) -> int:
        """Check ``batch`` (leading dim = items) against the spec and publish it; returns its rows.

        The whole batch is checked before anything is written. A batch larger than the
        channel is published in channel-sized parts, each part whole.

        Raises:
            SpecError: as :meth:`ReplayBuffer.extend`.
            BufferTimeoutError: no room in the channel for ``timeout`` seconds.
            ChannelError: the learner closed the buffer (at once, every call after its
                ``close``); rows of a part published as it closed may not be taken.
        """
        (n,), flat = self._spec.conform(flatten(batch, self._spec), 1)
        channel = self._open()
        columns = {f"f{i}": to_numpy(flat[k].detach().cpu()) for i, k in enumerate(self._keys)}
        done = 0
        while done < n:
            k = min(n - done, self._rows)
            start = channel.reserve(k, self.timeout)
            channel.write(start, columns, done, k)
            channel.publish(start, k)
            done += k
        return n

    def add(self, item: Any) -> int:
        """Publish one item (no batch dim)."""
        return self.extend({k: torch.as_tensor(v).unsqueeze(0) for k, v in flatten(item, self._spec).items()})
