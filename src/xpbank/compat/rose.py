"""ROSE's ``Experience`` / ``ExperienceBank``, on an xpbank :class:`~xpbank.ReplayBuffer`.

Switch with one import line: ``from xpbank.compat.rose import Experience,
ExperienceBank, create_experience``. States, actions, rewards and done flags are stored
as tensors in a buffer (spec taken from the first experience); ``info`` dicts of
JSON-able values are kept beside it. Banks are saved in xpbank's bank format (no
pickle); ``max_size`` and the session id survive the round trip. Differences from ROSE:
``docs/compat/rose.md``.

Example:
    >>> import tempfile
    >>> from xpbank.compat.rose import ExperienceBank, create_experience
    >>> bank = ExperienceBank(max_size=3, session_id="demo")
    >>> bank.add_batch([create_experience([0.0, i], 1, 0.5, [1.0, i], False, {"i": i}) for i in range(5)])
    >>> len(bank), [e.info["i"] for e in bank]
    (3, [2, 3, 4])
    >>> back = ExperienceBank.load(bank.save(tempfile.mkdtemp()))
    >>> back.max_size, back.session_id, back[-1].state
    (3, 'demo', tensor([0., 4.]))
"""

from __future__ import annotations

import datetime as _dt
import os
import pickle
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.bank import bank_metadata, bank_of, list_banks, load, new_session_id, save
from xpbank.bank.manifest import json_problem
from xpbank.errors import BankError, SpecError, check_positive_int
from xpbank.replay.buffer import ReplayBuffer
from xpbank.replay.state import seed_from
from xpbank.spec.spec import NestedKey

__all__ = ["Experience", "ExperienceBank", "create_experience"]

_META = "xpbank.compat.rose"  # the key of this module's entry in a bank's metadata
_FIRST_CAPACITY = 1024  # an unbounded bank's first buffer; it doubles when full
_TENSOR_FIELDS = ("state", "action", "next_state")


@dataclass
class Experience:
    """One environment step, as ROSE's dataclass (same fields, same order)."""

    state: Any
    action: Any
    reward: float
    next_state: Any
    done: bool
    info: dict[str, Any] | None = None


def create_experience(
    state: Any, action: Any, reward: float, next_state: Any, done: bool, info: dict[str, Any] | None = None
) -> Experience:
    """An :class:`Experience` (ROSE's helper; nothing is checked until ``add``)."""
    return Experience(state, action, reward, next_state, done, info)


def _tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        out = torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise SpecError(
            f"{name}: expected a number, a list or an array of numbers, got {value!r:.60}"
        ) from exc
    if out.dtype == torch.float64 and not isinstance(value, np.ndarray):
        out = out.float()  # Python floats/lists: float32, as torch.tensor would make them
    return out


def _scalar(name: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
    t = _tensor(name, value)
    if t.numel() != 1 or t.is_complex():
        raise SpecError(f"{name}: expected one real number, got {value!r:.60}")
    if dtype == torch.bool and t.dtype != torch.bool and t.item() not in (0, 1):
        raise SpecError(f"{name}: expected a bool (or 0/1), got {value!r:.60}")
    return t.reshape(()).to(dtype)


def _check_info(info: Any) -> dict[str, Any] | None:
    problem = None if info is None else json_problem(info)
    if problem is not None:
        raise SpecError(f"info: {info!r:.80} {problem} (info is saved in the bank's JSON manifest)")
    return info


def _row(exp: Any, i: int) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    if not isinstance(exp, Experience):
        raise SpecError(f"experience {i}: expected an Experience, got {type(exp).__name__}")
    try:
        row = {name: _tensor(name, getattr(exp, name)) for name in _TENSOR_FIELDS}
        row["reward"] = _scalar("reward", exp.reward, torch.float64)
        row["done"] = _scalar("done", exp.done, torch.bool)
        return row, _check_info(exp.info)
    except SpecError as exc:
        raise SpecError(f"experience {i}: {exc}") from None


def _stack(rows: list[dict[str, torch.Tensor]]) -> dict[NestedKey, torch.Tensor]:
    out: dict[NestedKey, torch.Tensor] = {}
    for name in rows[0]:
        shapes = {tuple(r[name].shape) for r in rows}
        if len(shapes) > 1:
            raise SpecError(f"{name}: experiences in one batch differ in shape: {sorted(shapes)}")
        out[name] = torch.stack([r[name] for r in rows])
    return out


class ExperienceBank:
    """A bank of :class:`Experience`: FIFO up to ``max_size`` items, unbounded with ``None``.

    Args:
        max_size: the most experiences kept (the oldest go first); ``None``: no limit.
        session_id: names the bank's saves; default a new ``YYYYmmdd_HHMMSS_<8 hex>``.

    Example:
        >>> from xpbank.compat.rose import ExperienceBank, create_experience
        >>> bank = ExperienceBank()
        >>> bank.add(create_experience([1.0, 2.0], 0, 1.0, [2.0, 3.0], True))
        >>> batch = bank.sample(batch_size=4, replace=True)
        >>> len(batch), batch[0].reward, batch[0].done
        (4, 1.0, True)
    """

    def __init__(self, max_size: int | None = None, session_id: str | None = None):
        if max_size is not None:
            max_size = check_positive_int("max_size", max_size)
        if session_id is not None and (
            not isinstance(session_id, str) or not session_id or "/" in session_id
        ):
            raise SpecError(f"session_id: expected a non-empty string without '/', got {session_id!r}")
        self.max_size = max_size
        self.session_id = session_id or new_session_id()
        # seeded from torch's global RNG: runs after the same torch.manual_seed sample alike
        self._rb = ReplayBuffer(max_size or _FIRST_CAPACITY, seed=seed_from())
        self._infos: list[dict[str, Any] | None] = [None] * self._rb.capacity  # by slot

    @property
    def buffer(self) -> ReplayBuffer:
        """The xpbank buffer holding the tensors (oldest first at logical position 0)."""
        return self._rb

    # -- writing ---------------------------------------------------------------
    def add(self, experience: Experience) -> None:
        """Store one experience. A bad field raises :class:`~xpbank.SpecError`, nothing stored."""
        self.add_batch([experience])

    def add_batch(self, experiences: Iterable[Experience]) -> None:
        """Store experiences in order; all are checked first (on error, nothing is stored)."""
        rows, infos = [], []
        for i, exp in enumerate(experiences):
            row, info = _row(exp, i)
            rows.append(row)
            infos.append(info)
        if not rows:
            return
        batch = _stack(rows)
        if self._rb.spec is not None:
            self._rb.spec.conform(batch, 1)  # checked before the buffer may grow
        self._grow(len(rows))
        self._put_infos(self._rb.extend(batch), infos)

    def _put_infos(self, ids: Iterable[int], infos: list[dict[str, Any] | None]) -> None:
        cap = self._rb.capacity
        for i, info in zip(ids, infos, strict=True):
            self._infos[i % cap] = info

    def _live_ids(self) -> range:
        first = int(self._rb.sample_by_index([0], fields=["done"])["index"][0]) if len(self) else 0
        return range(first, first + len(self))

    def _ordered_infos(self) -> list[dict[str, Any] | None]:
        """The infos of the stored experiences, oldest first."""
        cap = self._rb.capacity
        return [self._infos[i % cap] for i in self._live_ids()]

    def _grow(self, n: int) -> None:
        if self.max_size is not None or len(self._rb) + n <= self._rb.capacity:
            return
        infos = self._ordered_infos()
        seed = seed_from(self._rb.generator)  # its stream goes on
        bigger = ReplayBuffer(max(2 * self._rb.capacity, len(self._rb) + n), self._rb.spec, seed=seed)
        self._rb = bigger.merge_(self._rb)  # new ids 0 .. len - 1, oldest first
        self._infos = infos + [None] * (bigger.capacity - len(infos))

    def clear(self) -> None:
        """Drop every experience."""
        self._rb.clear()
        self._infos = [None] * self._rb.capacity

    # -- reading ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._rb)

    def _experiences(self, td: TensorDict) -> list[Experience]:
        cap = self._rb.capacity
        infos = [self._infos[i % cap] for i in td["index"].tolist()]
        columns = (td["state"].unbind(0), td["action"].unbind(0), td["reward"].tolist())
        rest = (td["next_state"].unbind(0), td["done"].tolist(), infos)
        return [Experience(*row) for row in zip(*columns, *rest, strict=True)]

    def _at(self, positions: list[int]) -> list[Experience]:
        if not positions:
            return []
        return self._experiences(self._rb.sample_by_index(np.asarray(positions)))

    def sample(self, batch_size: int, replace: bool = True) -> list[Experience]:
        """``batch_size`` experiences drawn uniformly (distinct ones with ``replace=False``).

        Raises:
            EmptyBufferError: the bank is empty.
            CapacityError: ``replace=False`` and more asked for than are stored.
        """
        return self._experiences(self._rb.sample(batch_size, replace=replace))

    def __getitem__(self, i: int | slice) -> Any:
        n = len(self)
        if isinstance(i, slice):
            return self._at(list(range(n))[i])
        try:
            pos = int(i)
        except TypeError:
            raise SpecError(f"index: expected an int or a slice, got {type(i).__name__}") from None
        if not -n <= pos < n:
            raise IndexError(f"index {pos} out of range for a bank of {n} experiences")
        return self._at([pos % n])[0]

    def __iter__(self) -> Iterator[Experience]:
        chunk = 4096
        for lo in range(0, len(self), chunk):
            yield from self._at(list(range(lo, min(len(self), lo + chunk))))

    def get_recent(self, n: int) -> list[Experience]:
        """The newest ``n`` experiences (all if fewer are stored), oldest first."""
        n = check_positive_int("n", n)
        return self._at(list(range(max(0, len(self) - n), len(self))))

    # -- merging ---------------------------------------------------------------
    def merge(self, other: ExperienceBank) -> ExperienceBank:
        """A new bank with this bank's experiences, then ``other``'s (new session id).

        Its ``max_size`` is ``None`` when either bank is unbounded, else the sum of both:
        a merge keeps every experience of both banks.
        """
        _check_bank(other)
        size = None if self.max_size is None or other.max_size is None else self.max_size + other.max_size
        out = ExperienceBank(max_size=size)
        out.merge_inplace(self)
        out.merge_inplace(other)
        return out

    def merge_inplace(self, other: ExperienceBank) -> None:
        """Append ``other``'s experiences, oldest first, as if added one by one.

        An unbounded bank keeps them all; a bounded one drops its oldest past ``max_size``.
        """
        _check_bank(other)
        if other is self:
            raise SpecError("merge_inplace: a bank cannot be merged into itself")
        if len(other) == 0:
            return
        self._grow(len(other))
        infos = other._ordered_infos()
        self._rb.merge_(other._rb)
        k = min(len(infos), self._rb.capacity)  # a bounded bank keeps the newest
        self._put_infos(self._live_ids()[len(self) - k :], infos[len(infos) - k :])

    # -- persistence -----------------------------------------------------------
    def save(self, work_dir: str | os.PathLike[str] = ".", bank_file: str | None = None) -> str:
        """Save as an xpbank bank (a directory; no pickle); returns its path.

        Args:
            work_dir: the directory to save in (created if needed).
            bank_file: the bank's name; default ``experience_bank_{date}_{session_id}``
                (``date`` is ``YYYYmmdd``, UTC). A name such as ``experiences.pkl`` names
                a bank directory all the same.
        """
        name = bank_file or f"experience_bank_{_dt.datetime.now(_dt.timezone.utc):%Y%m%d}_{self.session_id}"
        ordered = self._ordered_infos()
        infos = ordered if any(i is not None for i in ordered) else None
        meta = {_META: {"version": 1, "max_size": self.max_size, "infos": infos}}
        return str(
            save(self._rb, Path(os.fspath(work_dir)) / name, session_id=self.session_id, metadata=meta)
        )

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], max_size: int | None = None, *, allow_pickle: bool = False
    ) -> ExperienceBank:
        """Load a saved bank; ``max_size=None`` keeps the saved bound, a number re-bounds it.

        Args:
            path: a bank saved by :meth:`save`, or a legacy ROSE pickle file.
            max_size: a new bound (the newest experiences are kept); default the saved one.
            allow_pickle: load a legacy ROSE pickle. Unpickling runs code from the file:
                only for files you trust; a warning is issued. Then :meth:`save` it.

        Raises:
            BankError: ``path`` is a pickle and ``allow_pickle`` is false, or not a bank.
        """
        p = Path(os.fspath(path))
        if p.is_file():
            return _load_pickle(cls, p, max_size, allow_pickle)
        rb = load(p)
        meta = bank_metadata(rb).get(_META)
        if not isinstance(meta, dict) or meta.get("version") != 1:
            raise BankError(
                f"{p}: not a bank saved by xpbank.compat.rose.ExperienceBank (no {_META!r} metadata)"
            )
        infos = meta.get("infos") or [None] * len(rb)
        saved = cls(max_size=meta.get("max_size"), session_id=_session_of(rb))
        saved._rb = rb  # an unbounded bank's buffer grows from the saved capacity when full
        saved._infos = [None] * rb.capacity
        saved._put_infos(saved._live_ids(), infos)
        return saved if max_size is None else _rebound(saved, max_size)

    @staticmethod
    def list_saved_banks(directory: str | os.PathLike[str] = ".") -> list[str]:
        """The paths of the banks in ``directory`` (saved by any xpbank code), newest first."""
        return [str(b.path) for b in list_banks(directory) if b.error is None]


def _session_of(rb: ReplayBuffer) -> str:
    origin = bank_of(rb)
    return origin[2] if origin is not None else new_session_id()


def _check_bank(other: Any) -> None:
    if not isinstance(other, ExperienceBank):
        raise SpecError(f"merge: expected an ExperienceBank, got {type(other).__name__}")


def _rebound(bank: ExperienceBank, max_size: int) -> ExperienceBank:
    out = ExperienceBank(max_size=max_size, session_id=bank.session_id)
    out.merge_inplace(bank)
    return out


class _LegacyUnpickler(pickle.Unpickler):
    """Maps ROSE's ``rose.rl.experience.Experience`` to ours (ROSE need not be installed)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "rose.rl.experience" and name == "Experience":
            return Experience
        return super().find_class(module, name)


def _load_pickle(cls: type[ExperienceBank], path: Path, max_size: int | None, allow: bool) -> ExperienceBank:
    if not allow:
        raise BankError(
            f"{path} is a file, not an xpbank bank: a legacy ROSE pickle? Unpickling can run arbitrary "
            f"code, so it is refused by default; if you trust the file, pass allow_pickle=True and save() "
            f"the bank to convert it"
        )
    warnings.warn(
        f"unpickling {path} (allow_pickle=True): only do this for files you trust; save() converts it "
        f"to a pickle-free bank",
        UserWarning,
        stacklevel=3,
    )
    with open(path, "rb") as f:
        raw = _LegacyUnpickler(f).load()
    items = raw.get("experiences") if isinstance(raw, dict) else raw
    if not isinstance(items, (list, tuple, deque)):
        raise BankError(
            f"{path}: expected a pickled list of Experience (or {{'experiences': [...]}}), "
            f"got {type(raw).__name__}"
        )
    meta = raw if isinstance(raw, dict) else {}
    bank = cls(
        max_size=max_size if max_size is not None else meta.get("max_size"), session_id=meta.get("session_id")
    )
    bank.add_batch(items)
    return bank
