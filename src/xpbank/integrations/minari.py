"""Minari datasets (the offline-RL standard) from banks and back, one episode at a time.

A bank item is a transition: ``obs``, ``action``, ``reward``, ``terminated``,
``truncated``, ``("next", "obs")`` (the true next observation) and optional
``("info", name)`` fields, the layout :class:`~xpbank.Collector` writes. A Minari
episode of ``T`` steps holds ``T + 1`` observations: the episode's ``obs`` followed by
the last item's ``("next", "obs")``. Dict observations become nested fields
(``("obs", "pos")``) and back.

Both directions stream: :func:`export_minari` finds episodes with
:func:`~xpbank.tools.episode_scan.iter_episodes` (positions only) and gathers one
episode at a time; :func:`import_minari` reads ``iterate_episodes()`` and appends each
episode to a bank opened in place. Only complete episodes are exported (one cut by the
ring's wrap or unfinished is skipped, and counted in the log). An imported episode that
ends neither terminated nor truncated is marked truncated at its last step, so its end
stays an episode end in the bank.

Needs the ``minari`` extra (minari with h5py; from a clone: ``pip install -e '.[minari]'``).

Example:
    >>> import tempfile, torch, xpbank
    >>> rb = xpbank.ReplayBuffer(10)
    >>> _ = rb.extend({"obs": torch.arange(3.0)[:, None], ("next", "obs"): torch.arange(1.0, 4.0)[:, None],
    ...                "action": torch.zeros(3, dtype=torch.int64), "reward": torch.ones(3),
    ...                "terminated": torch.tensor([False, False, True]), "truncated": torch.zeros(3).bool()})
    >>> out = export_minari(rb, tempfile.mkdtemp() + "/ds")
    >>> bank = xpbank.load(import_minari(out, tempfile.mkdtemp() + "/b"))
    >>> bank.sample_all()["next", "obs"][:, 0].tolist()
    [1.0, 2.0, 3.0]
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xpbank.errors import BankError, SpecError, require
from xpbank.replay.buffer import ReplayBuffer
from xpbank.spec.spec import NestedKey, Spec, key_str
from xpbank.storage.dtypes import to_numpy
from xpbank.tools.episode_scan import CHUNK, flag_keys, iter_episodes
from xpbank.tools.import_bank import check_new_bank_path, write_bank

__all__ = ["export_minari", "import_minari", "REQUIRED"]

log = logging.getLogger(__name__)

REQUIRED = ("obs", "action", "reward", ("next", "obs"))


def _subtree(spec: Spec, prefix: str) -> dict[tuple[str, ...], Any]:
    """Fields under ``prefix`` (the field itself as ``()``), by the rest of their key."""
    out = {}
    for key in spec:
        parts = _parts(key)
        if parts[0] == prefix:
            out[parts[1:]] = spec[key]
    return out


def _space(fields: dict[tuple[str, ...], Any]) -> Any:
    spaces = require("gymnasium.spaces", "minari")
    if () in fields:
        f = fields[()]
        dtype = np.dtype(to_numpy(torch.zeros((), dtype=f.dtype)).dtype)
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return spaces.Box(info.min, info.max, tuple(f.shape), dtype)
        if dtype.kind == "b":
            return spaces.MultiBinary(list(f.shape) or 1) if f.shape else spaces.Box(0, 1, (), np.int8)
        return spaces.Box(-np.inf, np.inf, tuple(f.shape), dtype)
    heads = sorted({k[0] for k in fields})
    return spaces.Dict({h: _space({k[1:]: v for k, v in fields.items() if k[0] == h}) for h in heads})


def _check_exportable(buffer: ReplayBuffer) -> tuple[Spec, NestedKey | None, NestedKey | None]:
    spec = buffer.spec
    if spec is None or len(buffer) == 0:
        raise BankError("export: the bank holds no items; nothing to export")
    keys = [(k,) if isinstance(k, str) else k for k in spec]
    missing = [key_str(r) for r in REQUIRED if not any(k[: len(_parts(r))] == _parts(r) for k in keys)]
    term, trunc, _ = flag_keys(buffer)
    if term is None and trunc is None:
        missing.append("terminated/truncated")
    if missing:
        raise SpecError(
            f"export --to minari: the bank lacks field(s) {sorted(set(missing))}; a Minari episode "
            f"needs obs, action, reward, next.obs and terminated/truncated; got {[key_str(k) for k in spec]}"
        )
    return spec, term, trunc


def _parts(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else key


def _last_only(n: int, flag: bool) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[-1] = flag
    return out


def _take(batch: Any, spec: Spec, head: tuple[str, ...]) -> Any:
    """The numpy value(s) of the fields under ``head``: an array, or a dict for nested fields."""
    fields = {_parts(k) for k in spec}
    if head in fields:
        key = head[0] if len(head) == 1 else head
        return to_numpy(batch[key])
    subs = sorted({k[len(head)] for k in fields if k[: len(head)] == head and len(k) > len(head)})
    return {s: _take(batch, spec, (*head, s)) for s in subs}


def _cat_last(obs: Any, nxt: Any) -> Any:
    if isinstance(obs, dict):
        return {k: _cat_last(obs[k], nxt[k]) for k in obs}
    return np.concatenate([obs, nxt[-1:]])


def _episodes(buffer: ReplayBuffer, spec: Spec, chunk: int, progress: Any) -> Iterator[Any]:
    episode_buffer = require("minari.data_collector", "minari").EpisodeBuffer
    skipped = 0
    for i, ep in enumerate(iter_episodes(buffer, chunk=chunk, partial=True)):
        if not ep.complete:
            skipped += 1
            continue
        batch = buffer.sample_by_index(ep.positions)
        infos = _take(batch, spec, ("info",)) if _subtree(spec, "info") else {}
        yield episode_buffer(
            id=i - skipped,
            observations=_cat_last(_take(batch, spec, ("obs",)), _take(batch, spec, ("next", "obs"))),
            actions=_take(batch, spec, ("action",)),
            rewards=to_numpy(batch["reward"]).reshape(-1).astype(np.float64),
            terminations=_last_only(len(ep), ep.terminated),
            truncations=_last_only(len(ep), ep.truncated),
            infos=infos if isinstance(infos, dict) else {"info": infos},
        )
        if progress is not None:
            progress(len(ep))
    if skipped:
        log.warning("export: skipped %d episode(s) cut by the ring's wrap or not finished", skipped)


def export_minari(
    buffer: ReplayBuffer,
    path: str | os.PathLike[str],
    *,
    dataset_id: str | None = None,
    chunk: int = CHUNK,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Write the complete episodes of ``buffer`` as a Minari dataset directory at ``path``.

    The directory (``metadata.json`` and the HDF5 data) opens with
    ``minari.MinariDataset(path)``; copy it under ``$MINARI_DATASETS_PATH/<id>/data``
    to use it by id.

    Args:
        buffer: any buffer (an opened bank streams from its files).
        path: the new dataset directory (must not exist).
        dataset_id: the Minari id in its metadata; default ``xpbank/<directory name>-v0``.
        chunk: items per step of the episode scan.
        progress: called with each exported episode's length.

    Raises:
        SpecError: a field a Minari episode needs is missing (naming it).
        BankError: ``path`` exists; the buffer holds nothing.
    """
    target = check_new_bank_path(path)
    spec, _, _ = _check_exportable(buffer)
    storage_cls = require("minari.dataset.minari_storage", "minari").MinariStorage
    obs_space = _space(_subtree(spec, "obs"))
    act_space = _space(_subtree(spec, "action"))
    target.parent.mkdir(parents=True, exist_ok=True)  # like save and merge: parents are made
    try:
        # absolute: Minari resolves a relative directory against itself (a/a/main_data.hdf5)
        storage = storage_cls.new(
            target.absolute(), obs_space, act_space, data_format="hdf5", jpeg_encoding=False
        )
        storage.update_episodes(_episodes(buffer, spec, chunk, progress))
        version = require("minari", "minari").__version__
        storage.update_metadata(
            {"dataset_id": dataset_id or f"xpbank/{target.name}-v0", "minari_version": version}
        )
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def _fields(prefix: NestedKey, value: Any) -> dict[NestedKey, np.ndarray]:
    parts = (prefix,) if isinstance(prefix, str) else prefix
    if isinstance(value, dict):
        out: dict[NestedKey, np.ndarray] = {}
        for k, v in value.items():
            out.update(_fields((*parts, str(k)), v))
        return out
    return {parts[0] if len(parts) == 1 else parts: np.asarray(value)}


def _rows(value: Any, lo: int, hi: int) -> Any:
    if isinstance(value, dict):
        return {k: _rows(v, lo, hi) for k, v in value.items()}
    return np.asarray(value)[lo:hi]


def _transitions(dataset: Any, progress: Any) -> Iterator[dict[NestedKey, Any]]:
    for ep in dataset.iterate_episodes():
        t = len(ep.rewards)
        term = np.asarray(ep.terminations, dtype=bool).reshape(t)
        trunc = np.asarray(ep.truncations, dtype=bool).reshape(t).copy()
        if t and not (term[-1] or trunc[-1]):
            trunc[-1] = True  # keep the episode boundary: an end without termination
        batch: dict[NestedKey, Any] = {
            **_fields("obs", _rows(ep.observations, 0, t)),
            **_fields(("next", "obs"), _rows(ep.observations, 1, t + 1)),
            **_fields("action", _rows(ep.actions, 0, t)),
            "reward": np.asarray(ep.rewards, dtype=np.float32).reshape(t),
            "terminated": term,
            "truncated": trunc,
        }
        for name, value in (ep.infos or {}).items():
            rows = np.asarray(value) if not isinstance(value, dict) else None
            if rows is not None and rows.dtype != object and rows.shape[:1] in ((t,), (t + 1,)):
                batch[("info", str(name))] = rows[-t:]
        if progress is not None:
            progress(t)
        yield batch


def import_minari(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    capacity: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """A new bank at ``out`` with every episode of the Minari dataset at ``path``, as transitions.

    Args:
        path: a Minari dataset directory (holding ``metadata.json``).
        out: the new bank (must not exist).
        capacity: of the bank; default the dataset's ``total_steps``.
        progress: called with each episode's step count.

    Raises:
        BankError: ``path`` is not a Minari dataset; ``out`` exists.
    """
    src = Path(os.fspath(path))
    if not (src / "metadata.json").is_file():
        raise BankError(f"source: {src} is not a Minari dataset directory (no metadata.json)")
    check_new_bank_path(out)
    dataset = require("minari", "minari").MinariDataset(src)
    total = int(dataset.total_steps)
    if total == 0:
        raise BankError(f"source: {src} holds no steps")
    return write_bank(out, capacity or total, _transitions(dataset, progress), progress=None)
