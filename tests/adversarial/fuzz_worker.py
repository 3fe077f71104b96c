"""The process that runs each reader of a bank for the adversarial fuzz (tests/adversarial).

It reads one JSON case a line from stdin (``{"reader": ..., "bank": ..., "out": ...,
"limit": bytes}``), runs the reader under an address-space limit of ``limit`` bytes more
than the process holds before the call (``RLIMIT_AS``), and writes one JSON line back:

* ``{"ok": digest}``: the reader returned; ``digest`` describes what it returned (items,
  ring, a hash of every field), for the test to compare with the intact bank's;
* ``{"error": type, "xpbank": bool, "message": str}``: the exception it raised;
* ``{"cli": exit code, "stdout": ..., "stderr": ..., "exception": type or None}``: a CLI command.

A reader that hangs is killed by the test (its wall-time limit), which restarts the worker.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

import xpbank
from xpbank.errors import XpbankError


def _digest(buffer: Any) -> dict[str, Any]:
    """What a loaded buffer holds: enough to tell two buffers apart, and it must be usable."""
    fields = {}
    if len(buffer):  # a bank that loads must sample (an empty buffer refuses to)
        items = buffer.sample_all()
        for key in sorted(items.keys(include_nested=True, leaves_only=True), key=str):
            tensor = items[key].detach().cpu().contiguous()
            fields[str(key)] = hashlib.sha256(tensor.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        buffer.sample(4)
    ring = buffer.state_dict(data=False)["ring"]
    return {
        "len": len(buffer),
        "capacity": buffer.capacity,
        "next_id": int(ring["next_id"]),
        "fields": fields,
    }


def _listing(directory: Path) -> dict[str, Any]:
    """``list_banks``, and whether ``xpbank ls``'s quick check (no torch) says the same of
    each bank (``None``: it left the bank to the full check)."""
    from xpbank.bank.summary import quick_summary

    out = {}
    for b in xpbank.list_banks(directory):
        quick = quick_summary(b.path)
        out[b.path.name] = {
            "error": b.error,
            "size": b.size,
            "capacity": b.capacity,
            "session": b.session_id,
            "quick_agrees": None if quick is None else quick == b,
        }
    return out


def _cli(args: list[str]) -> dict[str, Any]:
    from typer.testing import CliRunner

    from xpbank.tools.cli import build_app

    result = CliRunner().invoke(build_app(), args)
    exc = result.exception
    return {
        "cli": result.exit_code,
        "stdout": result.stdout[-4000:],
        "stderr": result.stderr[-4000:],
        "exception": None if exc is None or isinstance(exc, SystemExit) else type(exc).__name__,
        "traceback": None
        if exc is None or isinstance(exc, SystemExit)
        else "".join(traceback.format_exception(exc))[-3000:],
    }


def run(reader: str, bank: Path, out: Path) -> dict[str, Any]:
    """Run ``reader`` on ``bank``; ``out`` is where a reader that writes a new file puts it."""
    calls = {
        "load": lambda: _digest(xpbank.load(bank)),
        "load_unverified": lambda: _digest(xpbank.load(bank, verify=False)),
        "open_r": lambda: _digest(xpbank.open_bank(bank, "r")),
        "open_verify": lambda: _digest(xpbank.open_bank(bank, "r", verify=True)),
        "open_rw": lambda: _digest(xpbank.open_bank(bank, "r+")),
        "merge": lambda: _digest(xpbank.merge(bank, bank)),
        "list_banks": lambda: {"banks": _listing(bank.parent)},
    }
    if reader in calls:
        return {"ok": calls[reader]()}
    args = {
        "cli_ls": ["ls", str(bank.parent)],
        "cli_inspect": ["inspect", str(bank)],
        "cli_verify": ["verify", str(bank)],
        "cli_export": ["export", str(bank), str(out / "export.npz"), "--to", "npz"],
        "cli_merge": ["merge", str(bank), str(bank), "--out", str(out / "merged")],
    }[reader]
    return _cli(args)


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def main() -> None:
    torch.set_num_threads(1)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    for n, line in enumerate(sys.stdin):
        case = json.loads(line)
        if n % 64 == 63:
            gc.collect()  # a full collection costs ~0.5 s with torch loaded: not every case
        resource.setrlimit(resource.RLIMIT_AS, (_address_space() + int(case["limit"]), hard))
        try:
            reply = run(case["reader"], Path(case["bank"]), Path(case["out"]))
        except MemoryError:
            reply = {"error": "MemoryError", "xpbank": False, "message": "address-space limit reached"}
        except BaseException as exc:  # reported, judged by the test
            reply = {
                "error": type(exc).__name__,
                "xpbank": isinstance(exc, XpbankError),
                "message": str(exc)[:4000],
                "traceback": "".join(traceback.format_exception(exc))[-3000:],
            }
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
