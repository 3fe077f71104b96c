"""The lock of a :class:`~xpbank.distributed.shm.ShmReplayBuffer`: an ``RLock`` whose
outermost acquire first moves the writers' published rows into the ring.

Why at the lock: every public call of a :class:`~xpbank.ReplayBuffer` holds ``rb.lock``
for its whole length, and a multi-step operation (``xpbank.save``, a merge reading the
buffer, a user's ``with rb.lock:``) holds it around all its steps. Pulling when a thread
first takes the lock, and never in a call nested inside a hold, gives each such
operation one state: what was published before it began, nothing that arrives while it
runs (that waits in its channel for the next hold). A save that read ``len(rb)``, wrote
the data files and only then pulled inside ``state_dict()`` wrote a ring that claimed
more items than its files held.
"""

from __future__ import annotations

import _thread
import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["PullingLock", "weak_take"]


class PullingLock(_thread.RLock):  # type: ignore[misc]  # final in typeshed; subclassable at runtime
    """A reentrant lock that calls ``take()`` each time a thread takes it from free.

    ``take`` runs holding the lock (so its own use of the lock nests); if it raises, the
    lock is released and the error propagates. The depth is only touched by the holder.

    Example:
        >>> taken = []
        >>> lock = PullingLock(lambda: taken.append(1) or 0)
        >>> with lock:
        ...     with lock:  # nested: no second take
        ...         pass
        >>> with lock.plain():  # held without taking
        ...     pass
        >>> len(taken)
        1
    """

    def __new__(cls, take: Callable[[], int]) -> PullingLock:
        return super().__new__(cls)

    def __init__(self, take: Callable[[], int]) -> None:
        self._take = take
        self._depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._hold(blocking, timeout):
            return False
        if self._depth == 1:
            try:
                self._take()
            except BaseException:
                self.release()
                raise
        return True

    def _hold(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not super().acquire(blocking, timeout):
            return False
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        super().release()

    # a threading.Condition on this lock (a Table's waits) releases it whole while it
    # waits: the depth goes with it, so another thread's acquire meanwhile pulls
    def _release_save(self) -> Any:
        depth, self._depth = self._depth, 0
        return super()._release_save(), depth  # type: ignore[misc]

    def _acquire_restore(self, state: Any) -> None:
        inner, depth = state
        super()._acquire_restore(inner)  # type: ignore[misc]
        self._depth = depth

    def __enter__(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self.acquire(blocking, timeout)

    def __exit__(self, *exc: Any) -> None:
        self.release()

    @contextlib.contextmanager
    def plain(self) -> Iterator[None]:
        """Hold the lock without the take (``pull()`` counts the rows it moves itself)."""
        self._hold()
        try:
            yield
        finally:
            self.release()


def weak_take(owner: Any, method: str) -> Callable[[], int]:
    """``owner.<method>()`` through a weak reference (the lock must not keep its buffer alive)."""
    ref = weakref.ref(owner)

    def take() -> int:
        target = ref()
        return 0 if target is None else int(getattr(target, method)())

    return take
