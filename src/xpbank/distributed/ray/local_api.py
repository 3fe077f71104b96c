"""The rest of :class:`~xpbank.ReplayBuffer`'s API on a Ray buffer: positions, epochs,
in-place updates, ``state_dict``.

Mixed into :class:`~xpbank.distributed.ray.RayReplayBuffer` (kept apart from its
writing and sampling). What "oldest first" means across shards: a shard keeps its own
items oldest first; the buffer's positions run over shard 0's items, then shard 1's,
and so on (there is no global write order between shards). With one shard this is the
local buffer's order, ids and messages exactly.

Costs: every call here is one or two round trips (a status call for the shards' sizes,
then the reads in parallel); an epoch's minibatch re-checks the sizes, so a write on any
shard during the iteration is noticed.

Threads/processes: a read by positions takes the shards' sizes in one round trip and
reads in another; each shard it reads from checks, under its lock, that its ring is
still as the sizes said (next id and size) and reads nothing otherwise. ``sample_all``
and ``sample_by_index`` then take the sizes again and retry (:data:`TRIES` times in all,
then :class:`~xpbank.StaleIndexError` naming the shard and what changed); an epoch's
minibatch raises the "extended or cleared during iteration" error. So no read mixes two
states of a shard, and none fails on positions a concurrent write or clear moved.

Example:
    >>> locate(np.array([0, 4, 2, 3]), [3, 2])
    (array([0, 1, 0, 1]), array([0, 1, 2, 0]))
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.distributed.ray.ids import id_problem, split_by_shard
from xpbank.errors import (
    BufferChangedError,
    CapacityError,
    EmptyBufferError,
    ShardUnavailableError,
    SpecError,
    StaleIndexError,
    check_positive_int,
)
from xpbank.ring.ids import _as_index_array, check_positions
from xpbank.spec.batch import flatten, to_tensordict
from xpbank.spec.spec import NestedKey, Spec, check_fields

__all__ = ["LocalApi", "locate", "TRIES"]

#: how often ``sample_all``/``sample_by_index`` take the sizes and read before giving up
#: (a shard written or cleared between the two round trips every time)
TRIES = 5

_STATE_VERSION = 1  # a one-shard state is a ReplayBuffer's (plus "ray" and "offset")
_RESERVED = frozenset({"index"})


def locate(positions: np.ndarray, sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, local position)`` of non-negative buffer positions over shards of ``sizes``."""
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    shard = np.searchsorted(ends, positions, side="right")
    return shard, positions - (ends - np.asarray(sizes, dtype=np.int64))[shard]


class LocalApi:
    """``sample_by_index``, ``sample_all``, ``epochs``, ``update``, ``state_dict`` over shards."""

    _link: Any
    _writer: Any
    _rng: np.random.Generator
    _samples: int
    _max_priority: float
    _capacity: int
    _device: torch.device

    @property
    def device(self) -> torch.device:
        """Where sampled batches are delivered."""
        return self._device

    @property
    def is_full(self) -> bool:
        """Every shard holds as many items as it can (then writes overwrite the oldest)."""
        return sum(int(st["size"]) for st in self._stats().values()) == self._capacity

    def _stats(self) -> dict[int, dict[str, Any]]:
        """Every shard's stats (flushes this client's writer first); a down shard raises."""
        self._writer.flush()
        answers = self._link.call_each({s: ("stats", ()) for s in range(self._link.num_shards)})
        down = sorted(s for s, a in answers.items() if isinstance(a, ShardUnavailableError))
        if down:
            raise ShardUnavailableError(f"shard(s) {down} are down; positions over all shards are undefined")
        return answers

    def _read(
        self, what: str, indices: Any, keys: Any, stats: dict[int, dict[str, Any]]
    ) -> TensorDict | tuple[int, dict[str, Any]]:
        """The items at ``indices`` as positions over the shards' sizes in ``stats``; or
        ``(shard, its ring now)`` where a shard's ring moved since ``stats`` (nothing read)."""
        sizes = [int(stats[s]["size"]) for s in range(self._link.num_shards)]
        total = sum(sizes)
        if total == 0:
            raise EmptyBufferError(f"{what}: the buffer is empty; add or extend first")
        pos = check_positions(indices, total)
        keys = check_fields(self._writer.spec, keys) if not isinstance(keys, _Checked) else keys.keys
        shard, local = locate(pos, sizes)
        involved = sorted(set(shard.tolist())) or [0]
        rows = {s: np.flatnonzero(shard == s) for s in involved}
        expect = {s: (int(stats[s]["next"]), int(stats[s]["size"])) for s in involved}
        answers = self._link.call_each(
            {s: ("sample_by_index", (local[rows[s]], keys, expect[s])) for s in involved}
        )
        down = sorted(s for s, a in answers.items() if isinstance(a, ShardUnavailableError))
        if down:
            raise ShardUnavailableError(f"{what}: shard(s) {down} are down")
        moved = [s for s in involved if "changed" in answers[s]]
        if moved:
            return moved[0], answers[moved[0]]["changed"]
        num = self._link.num_shards
        if len(involved) == 1:  # one shard: its rows are the batch, in order
            s = involved[0]
            flat = dict(answers[s]["data"])
            flat["index"] = answers[s]["ids"] * num + s
        else:
            first = answers[involved[0]]["data"]
            flat = {k: torch.empty((pos.size, *v.shape[1:]), dtype=v.dtype) for k, v in first.items()}
            flat["index"] = torch.empty(pos.size, dtype=torch.int64)
            for s in involved:
                at = torch.from_numpy(rows[s])
                for k, v in answers[s]["data"].items():
                    flat[k][at] = v
                flat["index"][at] = answers[s]["ids"] * num + s
        return self._batch(flat, pos.size)

    def _batch(self, flat: dict[Any, torch.Tensor], size: int) -> TensorDict:
        td = to_tensordict(flat, (size,), torch.device("cpu"))
        return td if self._device.type == "cpu" else td.to(self._device)

    def _consistent(self, what: str, read: Any) -> TensorDict:
        """``read(stats)`` on fresh stats until no shard it read from moved in between."""
        for _ in range(TRIES):
            stats = self._stats()
            got = read(stats)
            if not isinstance(got, tuple):
                return got
        s, now = got
        raise StaleIndexError(
            f"{what}: shard {s} was written or cleared between reading the shards' sizes and "
            f"reading its items, {TRIES} times in a row (next id {stats[s]['next']} -> {now['next']}, "
            f"size {stats[s]['size']} -> {now['size']}); pause the writers or retry"
        )

    def sample_by_index(self, indices: Any, fields: Sequence[Any] | None = None) -> TensorDict:
        """The items at positions ``indices``: 0 is the oldest (of shard 0), -1 the newest
        (of the last shard); see the module docstring for the order across shards.

        Threads/processes: the positions are of one state of every shard read from (one
        round trip with one shard; more: sizes and reads again while a write or clear
        lands between the two round trips).

        Raises:
            EmptyBufferError: nothing stored.
            XpbankIndexError: a position outside ``[-len(self), len(self))``.
            ShardUnavailableError: a shard is down (positions would shift).
            StaleIndexError: a shard changed between the sizes and the read :data:`TRIES` times.
        """
        if self._link.num_shards == 1:  # one round trip: the shard's buffer checks as a local one
            self._writer.flush()
            calls = {0: ("sample_by_index", (_as_index_array(indices, "indices"), fields))}
            answer = self._raise_down(self._link.call_each(calls), "sample_by_index")[0]
            return self._batch({**answer["data"], "index": answer["ids"]}, answer["ids"].shape[0])
        return self._consistent(
            "sample_by_index", lambda st: self._read("sample_by_index", indices, fields, st)
        )

    def sample_all(self, fields: Sequence[Any] | None = None) -> TensorDict:
        """Every stored item: shard 0's oldest first, then shard 1's, and so on.

        Threads/processes: every item each shard held when the sizes were taken, none
        missing or added (a write or clear between the sizes and the read: both again).

        Raises:
            EmptyBufferError: nothing stored.
            StaleIndexError: a shard changed between the sizes and the read :data:`TRIES` times.
        """

        def read(stats: dict[int, dict[str, Any]]) -> TensorDict | tuple[int, dict[str, Any]]:
            total = sum(int(st["size"]) for st in stats.values())
            return self._read("sample_all", np.arange(total), fields, stats)

        return self._consistent("sample_all", read)

    def epochs(
        self,
        batch_size: int,
        n_epochs: int = 1,
        shuffle: bool = True,
        drop_last: bool = False,
        fields: Sequence[Any] | None = None,
    ) -> Iterator[TensorDict]:
        """Minibatches that visit every stored item once per epoch (as :meth:`ReplayBuffer.epochs`).

        The shuffled order of each epoch is drawn by shard 0's generator (with one shard:
        the local buffer's draws). A write to or clear of any shard while iterating
        raises :class:`~xpbank.BufferChangedError` at the next minibatch; :meth:`update` is allowed.

        Threads/processes: each minibatch is read from the state the epochs were planned
        on (every shard it reads checks so under its lock); one written or cleared
        before or while it is read raises that error instead.
        """
        batch_size = check_positive_int("batch_size", batch_size)
        n_epochs = check_positive_int("n_epochs", n_epochs)
        stats = self._stats()
        if sum(int(st["size"]) for st in stats.values()) == 0:
            raise EmptyBufferError("epochs: the buffer is empty; add or extend first")
        keys = _Checked(check_fields(self._writer.spec, fields))
        return self._epochs(stats, batch_size, n_epochs, shuffle, drop_last, keys)

    def _epochs(
        self,
        stats: dict[int, dict[str, Any]],
        batch_size: int,
        n_epochs: int,
        shuffle: bool,
        drop_last: bool,
        keys: Any,
    ) -> Iterator[TensorDict]:
        marker = {s: (st["next"], st["size"]) for s, st in stats.items()}
        n = sum(int(st["size"]) for st in stats.values())
        stop = n - n % batch_size if drop_last else n
        for _ in range(n_epochs):
            order = self._link.call_each({0: ("permutation", (n,))})[0] if shuffle else torch.arange(n)
            if isinstance(order, ShardUnavailableError):
                raise order
            for start in range(0, stop, batch_size):
                now = self._stats()
                if {s: (st["next"], st["size"]) for s, st in now.items()} != marker:
                    raise BufferChangedError("epochs: the buffer was extended or cleared during iteration")
                got = self._read("epochs", order[start : start + batch_size], keys, now)
                if isinstance(got, tuple):
                    raise BufferChangedError("epochs: the buffer was extended or cleared during iteration")
                yield got

    def update(self, indices: Any, batch: Any) -> None:
        """Overwrite fields of stored items in place, by the ids a sample returned.

        As :meth:`ReplayBuffer.update`: the values are checked against the spec, and the
        ids and values against their shards (never written, overwritten, cleared; an
        indexed item's env id or episode-end flag changed) before any shard writes; on
        error nothing is written. One shard: one round trip; more: a check round and a
        write round, in parallel over the shards involved.

        Threads/processes: one shard: one step under its lock. More: the update takes
        effect at the check round (every id live then); an item a writer overwrites
        between the two rounds is dropped, as if the update came first (no error, no
        shard half-written); a shard that goes down between them misses its rows.

        Raises:
            StaleIndexError, XpbankIndexError, SpecError, EmptyBufferError: as the local buffer.
        """
        ids = _as_index_array(indices, "indices")
        flat = {k: _plain(v) for k, v in flatten(batch).items() if k not in _RESERVED}
        self._writer.flush()
        if self._link.num_shards == 1:  # the shard's own buffer checks everything, as a local one
            self._raise_down(self._link.call_each({0: ("update", (ids, flat))}), "update")
            return
        spec = self._writer.spec
        if spec is None:
            raise EmptyBufferError("update: the buffer is empty (nothing has been written yet)")
        lead, flat = spec.conform(flat, 1, partial=True)
        if lead and lead[0] != ids.shape[0]:
            raise SpecError(f"update: got {ids.shape[0]} indices but {lead[0]} rows of values")
        num = self._link.num_shards
        routed, rows = split_by_shard(ids, num)
        parts = {
            s: (routed[r] // num, {k: v[torch.from_numpy(r)] for k, v in flat.items()})
            for s, r in enumerate(rows)
            if r.size
        }
        checks = self._link.call_each({s: ("check_update", part) for s, part in parts.items()})
        for s, problem in self._raise_down(checks, "update").items():
            error = None if problem is None else id_problem(s, problem, num, "raise")
            if error is not None:
                raise error
        writes = {s: ("update", (*part, True)) for s, part in parts.items()}
        self._raise_down(self._link.call_each(writes), "update")

    @staticmethod
    def _raise_down(answers: dict[int, Any], what: str) -> dict[int, Any]:
        down = sorted(s for s, a in answers.items() if isinstance(a, ShardUnavailableError))
        if down:
            raise ShardUnavailableError(f"{what}: shard(s) {down} are down")
        return answers

    # -- state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every shard's ``ReplayBuffer.state_dict`` plus the client's draws.

        One shard: that shard's state (a :class:`~xpbank.ReplayBuffer` loads it, and this
        buffer loads a ``ReplayBuffer``'s) with ``"ray"`` (the client's generator) and
        ``"offset"`` added. More shards: ``{"version", "num_shards", "shards": [...],
        "ray"}``. For checkpoints that survive a crash use :meth:`checkpoint` (banks).
        Threads/processes: per shard (each part one state of its shard).
        """
        self._writer.flush()
        calls = {s: ("state_dict", ()) for s in range(self._link.num_shards)}
        states = self._raise_down(self._link.call_each(calls), "state_dict")
        ray = {
            "rng": self._rng.bit_generator.state,
            "samples": self._samples,
            "max_priority": self._max_priority,
        }
        if self._link.num_shards == 1:
            return {**states[0], "ray": ray}
        shards = [states[s] for s in range(self._link.num_shards)]
        return {"version": _STATE_VERSION, "num_shards": self._link.num_shards, "shards": shards, "ray": ray}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of a buffer with as many shards (one shard: also a
        ``ReplayBuffer``'s). Each shard checks its part as ``ReplayBuffer.load_state_dict``
        does; if one refuses, the shards already loaded are put back as they were.
        Threads/processes: per shard.

        Raises:
            CapacityError: another number of shards, or another capacity.
            SpecError: another version or spec.
        """
        num = self._link.num_shards
        parts = state.get("shards", [state])
        if len(parts) != num or ("shards" in state and state.get("version") != _STATE_VERSION):
            if "shards" in state and state.get("version") != _STATE_VERSION:
                raise SpecError(f"state version: expected {_STATE_VERSION}, got {state.get('version')!r}")
            raise CapacityError(f"state is of a buffer of {len(parts)} shard(s), this one has {num}")
        backup = self.state_dict() if num > 1 else None
        try:
            specs = self._raise_down(
                self._link.call_each({s: ("load_state_dict", (parts[s],)) for s in range(num)}),
                "load_state_dict",
            )
        except Exception:
            if backup is not None:
                self._link.call_each({s: ("load_state_dict", (backup["shards"][s],)) for s in range(num)})
            raise
        spec = specs[0]
        if spec is not None:
            self._writer.adopt_spec(Spec.from_dict(spec))
        ray = state.get("ray")
        if ray is not None:
            self._rng.bit_generator.state = ray["rng"]
            self._samples, self._max_priority = int(ray["samples"]), float(ray["max_priority"])


class _Checked:
    """Field keys already checked (so an epoch's minibatches do not check them again)."""

    def __init__(self, keys: list[NestedKey] | None):
        self.keys = keys


def _plain(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value
