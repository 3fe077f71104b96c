"""Mutations of a bank directory for the adversarial fuzz: bytes, files and manifest JSON.

A mutation is a plain tuple (``kind``, ``target``, parameters...) that hypothesis draws
and :func:`apply` carries out on a copy of a bank. ``target`` is an index into the sorted
entries of the bank (files and directories) or into the manifest's JSON paths, taken
modulo their number, so any draw means something.

This code never opens a path it did not check with ``os.lstat`` first (a FIFO made by an
earlier mutation would block it), opens files ``O_NOFOLLOW | O_NONBLOCK``, and never
parses JSON nested deeper than its own ``json`` can (a deep value is spliced in as text).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

__all__ = [
    "N_VALUES",
    "BYTE_KINDS",
    "FILE_KINDS",
    "JSON_KINDS",
    "PRESERVING_KINDS",
    "apply",
    "entries",
    "real_bytes",
]

BYTE_KINDS = ("flip", "truncate", "extend", "sparse")  # the content of a regular file
FILE_KINDS = ("fifo", "directory", "missing", "link_inside", "link_outside", "link_zero", "link_loop")
JSON_KINDS = ("json_set", "json_remove", "json_deep", "digit")
PRESERVING_KINDS = ("reformat", "session", "metadata")  # a bank that means the same

_VALUES: list[Any] = [
    None, True, False, 0, -1, 1.5, -(2**63), 2**64, 10**12, float("nan"), float("inf"), 1e308,
    "", "x", "NaN", "Infinity", "-1e309", "1" * 400, [], {}, [1, 2], {"a": 1}, ["x"], [[0]],
]  # fmt: skip
N_VALUES = len(_VALUES)  # json_set draws 0..N_VALUES: N_VALUES is a huge integer


def entries(bank: Path) -> list[str]:
    """Every path under ``bank`` (relative, sorted), files and directories, no link followed."""
    found = []
    for where, dirs, files in os.walk(bank):  # lists links, never follows them
        for name in dirs + files:
            found.append(os.path.relpath(os.path.join(where, name), bank))
    return sorted(found)


def real_bytes(bank: Path) -> int:
    """The bytes the regular files under ``bank`` really hold on disk (sparse holes: none)."""
    total = 0
    for rel in entries(bank):
        info = os.lstat(bank / rel)
        if stat.S_ISREG(info.st_mode):
            total += info.st_blocks * 512
    return total


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        assert stat.S_ISREG(os.fstat(fd).st_mode)
        size = os.fstat(fd).st_size
        assert size < 64 << 20, "the fuzz never reads a large file"
        return os.read(fd, size) if size else b""
    finally:
        os.close(fd)


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def apply(bank: Path, outside: Path, mutation: tuple[Any, ...]) -> str:
    """Carry out ``mutation`` on ``bank``; ``outside`` is a directory next to it (link
    targets). Returns what was done (``"skip: ..."`` when it did not apply)."""
    kind = mutation[0]
    if kind in JSON_KINDS or kind in PRESERVING_KINDS:
        return _json(bank, mutation)
    names = entries(bank)
    if not names:
        return "skip: empty bank"
    rel = names[mutation[1] % len(names)]
    path = bank / rel
    if kind in BYTE_KINDS:
        if not _is_regular(path):
            return f"skip: {rel} is not a regular file"
        return _bytes(path, rel, mutation)
    _remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "link_inside":
        os.symlink(bank / names[mutation[2] % len(names)], path)
    elif kind == "link_outside":  # to a copy outside: a write through it shows in the snapshot
        target = outside / f"target-{len(os.listdir(outside))}"
        target.write_bytes(b"outside the bank")
        os.symlink(target, path)
    elif kind == "link_zero":
        os.symlink("/dev/zero", path)
    elif kind == "link_loop":
        os.symlink(path.name, path)
    elif kind != "missing":
        raise ValueError(kind)
    return f"{kind} {rel}"


def _bytes(path: Path, rel: str, mutation: tuple[Any, ...]) -> str:
    kind, size = mutation[0], os.lstat(path).st_size
    if kind == "sparse":  # a hole: huge, costs no disk
        os.truncate(path, size + (1 << mutation[2]))
        return f"sparse {rel} +2**{mutation[2]}"
    if kind == "truncate":
        new = int(size * mutation[2])
        os.truncate(path, new)
        return f"truncate {rel} {size} -> {new}"
    if kind == "extend":
        with open(path, "ab") as f:  # regular: checked by the caller
            f.write(bytes([mutation[3]]) * mutation[2])
        return f"extend {rel} +{mutation[2]}"
    if size == 0:
        return f"skip: {rel} is empty"
    at = min(int(size * mutation[2]), size - 1)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)  # one byte: a huge sparse file too
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ mutation[3]]), at)
    finally:
        os.close(fd)
    return f"flip {rel} @{at} ^{mutation[3]:#x}"


def _json_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_json_paths(child, (*prefix, key)))
    return out


def _json(bank: Path, mutation: tuple[Any, ...]) -> str:
    path, kind = bank / "manifest.json", mutation[0]
    if not _is_regular(path):
        return "skip: manifest.json is not a regular file"
    if os.lstat(path).st_size > 16 << 20:  # made sparse and huge: the readers refuse it
        return "skip: manifest.json is too large to edit"
    text = _read(path)
    if kind == "digit":
        digits = [i for i, c in enumerate(text) if chr(c).isdigit()]
        if not digits:
            return "skip: no digit in manifest.json"
        at = digits[mutation[1] % len(digits)]
        new = ord("0") + (text[at] - ord("0") + mutation[2]) % 10
        _write(path, text[:at] + bytes([new]) + text[at + 1 :])
        return f"digit @{at} -> {chr(new)}"
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError):  # flipped or deeply nested: nothing to edit
        return "skip: manifest.json is not JSON the test reads"
    if kind in PRESERVING_KINDS:
        return _preserving(path, manifest, mutation)
    if not isinstance(manifest, dict):
        return "skip: manifest.json is not an object"
    paths = _json_paths(manifest)
    where = paths[mutation[1] % len(paths)]
    parent = manifest
    for key in where[:-1]:
        parent = parent[key]
    splice = None  # text too deep or too long for this process's json: spliced in as text
    if kind == "json_remove":
        del parent[where[-1]]
    elif kind == "json_set" and mutation[2] == len(_VALUES):
        splice = "9" * mutation[3]  # more digits than int() takes from text (4300)
    elif kind == "json_set":
        parent[where[-1]] = _VALUES[mutation[2] % len(_VALUES)]
    else:
        splice = "[" * mutation[2] + "]" * mutation[2]
    if splice is not None:
        parent[where[-1]] = "@@SPLICE@@"
    out = json.dumps(manifest, allow_nan=True)
    if splice is not None:
        out = out.replace('"@@SPLICE@@"', splice, 1)
    _write(path, out.encode())
    return f"{kind} {list(where)}"


def _preserving(path: Path, manifest: Any, mutation: tuple[Any, ...]) -> str:
    kind = mutation[0]
    if not isinstance(manifest, dict):
        return "skip: manifest.json is not an object"
    if kind == "reformat":  # other whitespace and key order: the same JSON
        out = json.dumps(manifest, indent=mutation[1] % 4 or None, sort_keys=bool(mutation[1] % 2))
    elif kind == "session":
        manifest.update(session_id=f"renamed-{mutation[1]}", updated="2030-01-01T00:00:00+00:00")
        out = json.dumps(manifest)
    else:
        manifest["metadata"] = {"note": "x" * (mutation[1] % 1000), "n": [mutation[1]]}
        out = json.dumps(manifest)
    _write(path, out.encode())
    return f"{kind} manifest.json"
