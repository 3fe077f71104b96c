"""Replay-buffer throughput: xpbank against a raw-tensor baseline, TorchRL, cpprb and SB3.

Run from the repository root::

    .venv/bin/python benchmarks/bench_replay.py [--quick] [--workload a|b|all] [--json out.json]

For each workload and library: build the buffer, prefill it to capacity (timed, with the
build, as "fill"), extend it further once full ("extend", the steady-state number) and
sample from it ("sample B=..."). Each library's sampled batch is checked for shapes and
non-empty observations before anything is timed. The whole library sweep is repeated
``--rounds`` times (library order rotated each round, one buffer alive at a time), each
phase timed as ``--chunks`` blocks; the tables show the fastest block (``--stat best``)
or the median. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

import xpbank
from _common import (
    environment,
    fmt_rate,
    fmt_ratio,
    fmt_us,
    freeze_heap,
    load_average,
    log,
    markdown_table,
    median,
    rss_gb,
    run_main,
    settle,
    time_calls,
    time_repeat,
)

Batch = dict[str, torch.Tensor]  # flat field name -> [n, *shape] tensor
RAW = "raw torch"


# -- workloads ---------------------------------------------------------------------------
@dataclass(frozen=True)
class FieldDef:
    name: str  # flat name (raw, cpprb)
    key: str | tuple[str, ...]  # xpbank / TorchRL key
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    capacity: int
    extend_batch: int
    sample_sizes: tuple[int, ...]
    n_steady: int  # extend calls once full
    n_sample: int  # sample calls per batch size
    fields: tuple[FieldDef, ...]
    n_actions: int = 0  # > 0: discrete action (int64 scalar)

    @property
    def item_bytes(self) -> int:
        return sum(math.prod(f.shape) * f.dtype.itemsize for f in self.fields)


def _fields(obs_shape: tuple[int, ...], obs_dtype: torch.dtype, action: FieldDef) -> tuple[FieldDef, ...]:
    return (
        FieldDef("obs", "obs", obs_shape, obs_dtype),
        action,
        FieldDef("reward", "reward", (), torch.float32),
        FieldDef("terminated", "terminated", (), torch.bool),
        FieldDef("truncated", "truncated", (), torch.bool),
        FieldDef("next_obs", ("next", "obs"), obs_shape, obs_dtype),
    )


def make_workloads(quick: bool) -> dict[str, Workload]:
    a = Workload(
        name="a",
        title="(a) vector obs: obs/next_obs float32[64], action float32[8], reward, terminated, truncated",
        capacity=100_000 if quick else 1_000_000,
        extend_batch=256,
        sample_sizes=(256,),
        n_steady=200 if quick else 1000,
        n_sample=200 if quick else 2000,
        fields=_fields((64,), torch.float32, FieldDef("action", "action", (8,), torch.float32)),
    )
    b = Workload(
        name="b",
        title="(b) Atari-like: obs/next_obs uint8[4,84,84], action int64, reward, terminated, truncated",
        capacity=10_000 if quick else 50_000,
        extend_batch=256,
        sample_sizes=(32, 256),
        n_steady=40 if quick else 400,
        n_sample=30 if quick else 300,
        fields=_fields((4, 84, 84), torch.uint8, FieldDef("action", "action", (), torch.int64)),
        n_actions=18,
    )
    return {"a": a, "b": b}


def make_batches(wl: Workload, count: int, seed: int) -> list[Batch]:
    """``count`` distinct input batches, made once, cycled through by every library."""
    gen = torch.Generator().manual_seed(seed)
    n = wl.extend_batch
    batches = []
    for _ in range(count):
        batch: Batch = {}
        for f in wl.fields:
            size = (n, *f.shape)
            if f.dtype == torch.bool:
                batch[f.name] = torch.rand(size, generator=gen) < 0.01
            elif f.dtype == torch.uint8:
                batch[f.name] = torch.randint(0, 256, size, generator=gen, dtype=torch.uint8)
            elif f.dtype == torch.int64:
                batch[f.name] = torch.randint(0, max(wl.n_actions, 2), size, generator=gen)
            else:
                batch[f.name] = torch.randn(size, generator=gen, dtype=f.dtype)
        batches.append(batch)
    return batches


def nest(wl: Workload, batch: Batch) -> dict[str, Any]:
    """A flat batch as the nested mapping xpbank and TorchRL take (``next.obs``)."""
    out: dict[str, Any] = {}
    for f in wl.fields:
        if isinstance(f.key, str):
            out[f.key] = batch[f.name]
        else:
            out.setdefault(f.key[0], {})[f.key[1]] = batch[f.name]
    return out


# -- libraries ---------------------------------------------------------------------------
class Skip(Exception):
    """A library that cannot run this workload here (the message says why)."""


@dataclass
class Handle:
    """A built buffer, reduced to what the timing loops call."""

    extend: Callable[[Any], object]
    sample: Callable[[int], Callable[[], object]]  # batch size -> argument-less sample call
    view: Callable[[object], dict[str, Any]]  # sampled batch -> {flat field name: array}
    stored: Callable[[], int]
    capacity: int  # items it holds when full
    missing: frozenset[str] = frozenset()  # fields the library does not return


@dataclass(frozen=True)
class Lib:
    name: str
    convert: Callable[[Workload, Batch], Any]  # done outside the timed region
    build: Callable[[Workload], Handle]
    note: str = ""
    version: str = ""  # a peer's version, for the report header


class RawBuffer:
    """Baseline: one preallocated tensor per field, slice-copy writes, index_select reads."""

    def __init__(self, capacity: int, fields: Sequence[FieldDef]):
        self.capacity = capacity
        self.bufs = {f.name: torch.empty((capacity, *f.shape), dtype=f.dtype) for f in fields}
        self.pos = 0
        self.size = 0
        self.gen = torch.Generator().manual_seed(0)

    def extend(self, batch: Batch) -> None:
        n = next(iter(batch.values())).shape[0]
        pos, cap = self.pos, self.capacity
        first = min(n, cap - pos)
        for name, buf in self.bufs.items():
            x = batch[name]
            buf[pos : pos + first].copy_(x[:first])
            if first < n:
                buf[: n - first].copy_(x[first:])
        self.pos = (pos + n) % cap
        self.size = min(self.size + n, cap)

    def sample(self, batch_size: int) -> Batch:
        idx = torch.randint(self.size, (batch_size,), generator=self.gen)
        return {name: buf.index_select(0, idx) for name, buf in self.bufs.items()}


def _plain_view(out: object) -> dict[str, Any]:
    """A sampled batch that is already a dict of arrays (raw, cpprb)."""
    if not isinstance(out, dict):
        raise AssertionError(f"sample returned {type(out).__name__}, expected a dict")
    return out


def build_raw(wl: Workload) -> Handle:
    rb = RawBuffer(wl.capacity, wl.fields)
    return Handle(
        extend=rb.extend,
        sample=lambda b: functools.partial(rb.sample, b),
        view=_plain_view,
        stored=lambda: rb.size,
        capacity=wl.capacity,
    )


def _xpbank_view(wl: Workload) -> Callable[[object], dict[str, Any]]:
    def view(out: object) -> dict[str, Any]:
        if not isinstance(out, TensorDict):
            raise AssertionError(f"sample returned {type(out).__name__}, expected a TensorDict")
        got = {f.name: out[f.key] for f in wl.fields}
        got["index"] = out["index"]
        return got

    return view


def _tensordict_handle(wl: Workload, rb: Any) -> Handle:
    """A buffer with ``extend``, ``sample(batch_size)`` and ``len`` returning TensorDicts."""
    return Handle(
        extend=rb.extend,
        sample=lambda b: functools.partial(rb.sample, b),
        view=_xpbank_view(wl),
        stored=lambda: len(rb),
        capacity=wl.capacity,
    )


def build_xpbank(wl: Workload, storage: str = "memory") -> Handle:
    spec = xpbank.Spec({f.key: xpbank.Field(f.shape, f.dtype) for f in wl.fields})
    return _tensordict_handle(wl, xpbank.ReplayBuffer(wl.capacity, spec, storage=storage, seed=0))


def to_tensordict(wl: Workload, batch: Batch) -> TensorDict:
    return TensorDict(nest(wl, batch), batch_size=[wl.extend_batch])


def torchrl_lib() -> Lib:
    try:
        import torchrl
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import RandomSampler
    except Exception as exc:  # the compiled extension or a dependency may not load
        raise Skip(f"torchrl import failed: {type(exc).__name__}: {exc}") from exc
    logging.getLogger("torchrl").setLevel(logging.WARNING)

    def build(wl: Workload) -> Handle:
        # batch_size given to sample(): one buffer serves both sample sizes of (b);
        # torchrl's sample(batch_size) is the same code path as a constructor batch_size.
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(wl.capacity), sampler=RandomSampler())
        return _tensordict_handle(wl, rb)

    note = "TensorDictReplayBuffer + LazyTensorStorage + RandomSampler, sample(batch_size=B)"
    return Lib("torchrl", to_tensordict, build, note, torchrl.__version__)


def cpprb_lib() -> Lib:
    try:
        from importlib.metadata import version

        import cpprb
    except Exception as exc:
        raise Skip(f"cpprb import failed: {type(exc).__name__}: {exc}") from exc

    def build(wl: Workload) -> Handle:
        env_dict = {
            f.name: {"shape": f.shape or 1, "dtype": torch.empty((), dtype=f.dtype).numpy().dtype}
            for f in wl.fields
        }
        rb = cpprb.ReplayBuffer(wl.capacity, env_dict)

        def add(batch: dict[str, np.ndarray]) -> None:
            rb.add(**batch)

        return Handle(
            extend=add,
            sample=lambda b: functools.partial(rb.sample, b),
            view=_plain_view,
            stored=rb.get_stored_size,
            capacity=wl.capacity,
        )

    def convert(wl: Workload, batch: Batch) -> dict[str, np.ndarray]:
        return {name: t.numpy() for name, t in batch.items()}

    return Lib("cpprb", convert, build, "add(**numpy arrays); sample returns numpy", version("cpprb"))


def sb3_lib() -> Lib:
    try:
        import stable_baselines3
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
    except Exception as exc:
        raise Skip(f"stable-baselines3 import failed: {type(exc).__name__}: {exc}") from exc

    def spaces_of(wl: Workload) -> tuple[Any, Any]:
        obs = wl.fields[0]
        if obs.dtype == torch.uint8:
            obs_space = spaces.Box(0, 255, obs.shape, np.uint8)
        else:
            obs_space = spaces.Box(-np.inf, np.inf, obs.shape, np.float32)
        act = next(f for f in wl.fields if f.name == "action")
        if wl.n_actions:
            return obs_space, spaces.Discrete(wl.n_actions)
        return obs_space, spaces.Box(-1.0, 1.0, act.shape, np.float32)

    def build(wl: Workload) -> Handle:
        # SB3 stores [buffer_size // n_envs, n_envs, ...]; n_envs = the extend batch, so
        # one add() writes a whole batch. Truncation goes in through infos (timeouts).
        obs_space, act_space = spaces_of(wl)
        n = wl.extend_batch
        rb = SB3ReplayBuffer(
            wl.capacity, obs_space, act_space, device="cpu", n_envs=n, optimize_memory_usage=False
        )

        def add(args: tuple[Any, ...]) -> None:
            rb.add(*args)

        def view(out: Any) -> dict[str, Any]:
            return {
                "obs": out.observations,
                "action": out.actions,
                "reward": out.rewards,
                "terminated": out.dones,
                "next_obs": out.next_observations,
            }

        return Handle(
            extend=add,
            sample=lambda b: functools.partial(rb.sample, b),
            view=view,
            stored=lambda: rb.size() * n,
            capacity=rb.buffer_size * n,
            missing=frozenset({"truncated"}),
        )

    def convert(wl: Workload, batch: Batch) -> tuple[Any, ...]:
        term, trunc = batch["terminated"].numpy(), batch["truncated"].numpy()
        infos = [{"TimeLimit.truncated": bool(tr and not te)} for te, tr in zip(term, trunc, strict=True)]
        done = (term | trunc).astype(np.float32)
        return (
            batch["obs"].numpy(),
            batch["next_obs"].numpy(),
            batch["action"].numpy(),
            batch["reward"].numpy(),
            done,
            infos,
        )

    note = "n_envs = extend batch; capacity rounded down to a multiple of it"
    return Lib("sb3", convert, build, note, stable_baselines3.__version__)


def make_libs() -> tuple[list[Lib], dict[str, str]]:
    """Every library that imports here, and why the others were skipped."""
    libs = [
        Lib(RAW, lambda wl, b: b, build_raw, "per-field tensors, slice copy / index_select"),
        Lib("xpbank (dict)", nest, build_xpbank),
        Lib("xpbank (TensorDict)", to_tensordict, build_xpbank),
        Lib("xpbank-memmap (dict)", nest, functools.partial(build_xpbank, storage="memmap")),
    ]
    skipped: dict[str, str] = {}
    for name, factory in (("torchrl", torchrl_lib), ("cpprb", cpprb_lib), ("sb3", sb3_lib)):
        try:
            libs.append(factory())
        except Skip as exc:
            skipped[name] = str(exc)
            log(f"skipping {name}: {exc}")
    return libs, skipped


# -- correctness guard -------------------------------------------------------------------
def check_sample(wl: Workload, handle: Handle, out: object, batch_size: int) -> None:
    """Shapes of every field, and no all-zero observation row (= never written)."""
    got = handle.view(out)
    for f in wl.fields:
        if f.name in handle.missing:
            continue
        if f.name not in got:
            raise AssertionError(f"field {f.name!r} missing from the sampled batch")
        shape = tuple(got[f.name].shape)
        ok = shape == (batch_size, *f.shape) or (f.shape == () and shape == (batch_size, 1))
        if not ok:
            raise AssertionError(f"field {f.name!r}: shape {shape}, expected {(batch_size, *f.shape)}")
    for name in ("obs", "next_obs"):
        rows = torch.as_tensor(np.asarray(got[name])).reshape(batch_size, -1)
        if not bool(rows.ne(0).any(dim=1).all()):
            raise AssertionError(f"field {name!r}: a sampled row is all zeros (slot never written?)")
    if "index" in got and tuple(got["index"].shape) != (batch_size,):
        raise AssertionError(f"index: shape {tuple(got['index'].shape)}, expected {(batch_size,)}")


# -- measuring ---------------------------------------------------------------------------
STATS = ("best", "median")


@dataclass
class Phase:
    """Seconds per call of every timed chunk of one phase, over all rounds."""

    items_per_call: int
    per_call_s: list[float] = field(default_factory=list)

    def seconds(self, stat: str) -> float:
        """``best``: the fastest chunk (least disturbed by other processes); or the median."""
        return min(self.per_call_s) if stat == "best" else median(self.per_call_s)

    def rate(self, stat: str) -> float:
        return self.items_per_call / self.seconds(stat)


def chunk_sizes(n: int, chunks: int) -> list[int]:
    chunks = max(1, min(chunks, n))
    return [n // chunks + (1 if i < n % chunks else 0) for i in range(chunks)]


def timed_chunks(run: Callable[[int], float], n: int, chunks: int) -> list[float]:
    """Per-call seconds of ``n`` calls timed as ``chunks`` separate blocks."""
    return [run(k) / k for k in chunk_sizes(n, chunks)]


@dataclass
class LibResult:
    name: str
    note: str = ""
    phases: dict[str, Phase] = field(default_factory=dict)  # "fill", "extend", "sample 32" ...
    error: str = ""

    def phase(self, name: str, items_per_call: int) -> Phase:
        return self.phases.setdefault(name, Phase(items_per_call))


def measure(wl: Workload, lib: Lib, batches: list[Batch], res: LibResult, chunks: int, warmup: int) -> None:
    """One build-prefill-extend-sample pass of ``lib``; appends its timings to ``res``."""
    inputs = [lib.convert(wl, b) for b in batches]
    settle()
    t0 = time.perf_counter()
    handle = lib.build(wl)
    try:
        n_fill = math.ceil(handle.capacity / wl.extend_batch)
        time_calls(handle.extend, inputs, n_fill)
        fill_s = time.perf_counter() - t0
        res.phase("fill", n_fill * wl.extend_batch).per_call_s.append(fill_s)
        if handle.stored() != handle.capacity:
            raise AssertionError(f"{handle.stored()} items stored after prefill, expected {handle.capacity}")
        for b in wl.sample_sizes:
            check_sample(wl, handle, handle.sample(b)(), b)
        settle()
        extend = functools.partial(time_calls, handle.extend, inputs)
        res.phase("extend", wl.extend_batch).per_call_s += timed_chunks(extend, wl.n_steady, chunks)
        for b in wl.sample_sizes:
            call = handle.sample(b)
            time_repeat(call, warmup)
            settle()
            sample = functools.partial(time_repeat, call)
            res.phase(f"sample {b}", b).per_call_s += timed_chunks(sample, wl.n_sample, chunks)
        log(f"    {lib.name:<22} {time.perf_counter() - t0:6.1f} s  rss {rss_gb():.2f} GB")
    finally:
        del handle
        settle()


def run_workload(wl: Workload, libs: list[Lib], rounds: int, chunks: int) -> list[LibResult]:
    batches = make_batches(wl, count=4, seed=0)
    results = {lib.name: LibResult(lib.name, lib.note) for lib in libs}
    for r in range(rounds):
        order = libs[r % len(libs) :] + libs[: r % len(libs)]  # rotate: no fixed position
        log(f"workload {wl.name}: round {r + 1}/{rounds} (load average {load_average()})")
        for lib in order:
            res = results[lib.name]
            if res.error:
                continue
            try:
                measure(wl, lib, batches, res, chunks, warmup=10)
            except Exception as exc:  # a broken peer must not stop the others; reported, exit 1
                res.error = f"{type(exc).__name__}: {exc}"
                log(f"    {lib.name}: FAILED {res.error}")
    return [results[lib.name] for lib in libs]


# -- reporting ---------------------------------------------------------------------------
def phase_names(wl: Workload) -> list[str]:
    return ["extend"] + [f"sample {b}" for b in wl.sample_sizes]


def _vs(res: LibResult, raw: LibResult | None, name: str, stat: str) -> float | None:
    if raw is None or name not in raw.phases or name not in res.phases:
        return None
    return res.phases[name].rate(stat) / raw.phases[name].rate(stat)


def _raw(results: list[LibResult]) -> LibResult | None:
    return next((r for r in results if r.name == RAW and not r.error), None)


def report_table(wl: Workload, results: list[LibResult], stat: str) -> str:
    raw = _raw(results)
    names = phase_names(wl)
    labels = ["extend"] + [f"sample B={b}" for b in wl.sample_sizes]
    headers = ["library"] + [f"{label} (transitions/s)" for label in labels]
    headers += [f"{label} vs raw" for label in labels] + ["fill incl. build (transitions/s)"]
    rows = []
    for res in results:
        if res.error:
            rows.append([res.name, f"**{res.error}**"] + [""] * (len(headers) - 2))
            continue
        row = [res.name]
        for name in names:
            phase = res.phases[name]
            row.append(f"{fmt_rate(phase.rate(stat))} ({fmt_us(phase.seconds(stat))}/call)")
        row += [fmt_ratio(_vs(res, raw, name, stat)) for name in names]
        row.append(fmt_rate(res.phases["fill"].rate(stat)))
        rows.append(row)
    return markdown_table(headers, rows)


def workload_json(wl: Workload, results: list[LibResult]) -> dict[str, Any]:
    raw = _raw(results)
    libs: dict[str, Any] = {}
    for res in results:
        if res.error:
            libs[res.name] = {"error": res.error}
            continue
        phases = {}
        for name, phase in res.phases.items():
            phases[name] = {
                "items_per_call": phase.items_per_call,
                **{f"{stat}_per_s": phase.rate(stat) for stat in STATS},
                **{f"{stat}_vs_raw": _vs(res, raw, name, stat) for stat in STATS},
                "per_call_s": phase.per_call_s,
            }
        libs[res.name] = {"note": res.note, "phases": phases}
    config: dict[str, Any] = {k: v for k, v in vars(wl).items() if k != "fields"}
    config["fields"] = [
        {"key": list(f.key) if isinstance(f.key, tuple) else f.key, "shape": f.shape, "dtype": str(f.dtype)}
        for f in wl.fields
    ]
    config["item_bytes"] = wl.item_bytes
    return {"config": config, "libraries": libs}


def header(env: dict[str, Any], args: argparse.Namespace, skipped: dict[str, str]) -> str:
    how = "fastest" if args.stat == "best" else "median"
    lines = ["# xpbank replay-buffer benchmark", ""]
    lines.append(" · ".join(f"{k} {v}" for k, v in env.items()))
    lines.append("")
    lines.append(
        f"Numbers: the {how} ({args.stat}) of {args.rounds} rounds x {args.chunks} timed chunks per phase "
        "(a round builds, prefills and measures every library in turn, order rotated, one buffer "
        "alive at a time); fill is one chunk per round. extend = steady state (buffer already full); "
        "fill = build + prefill from empty, first-touch page faults included. "
        "Time per call in parentheses; vs raw = rate / raw torch's rate."
    )
    lines += [f"Skipped {name}: {why}" for name, why in skipped.items()]
    load, cores = env.get("load_average_at_start", 0.0), env.get("cpu_count") or 1
    if load > 0.5 and torch.get_num_threads() >= cores:
        lines.append(
            f"\nWarning: load average {load} at start: other processes are running. torch's "
            f"{torch.get_num_threads()} intra-op threads then wait on a busy core and torch-based rows "
            "can slow down by orders of magnitude; rerun on a quiet machine or with --threads 1."
        )
    return "\n".join(lines)


def workload_report(wl: Workload, results: list[LibResult], stat: str) -> str:
    lines = [f"## Workload {wl.title}", ""]
    lines.append(
        f"capacity {wl.capacity:,} ({wl.item_bytes:,} B/transition, "
        f"{wl.capacity * wl.item_bytes / 1e9:.2f} GB), extend batch {wl.extend_batch}, "
        f"{wl.n_steady} steady extend calls and {wl.n_sample} sample calls per batch size per round"
    )
    lines += ["", report_table(wl, results, stat), ""]
    lines += [f"- {r.name}: {r.note}" for r in results if r.note and not r.error]
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small capacities and few calls (< 30 s)")
    p.add_argument("--workload", choices=["a", "b", "all"], default="all")
    p.add_argument("--json", metavar="PATH", help="also write the results (every chunk) as JSON")
    p.add_argument("--rounds", type=int, default=None, help="repeats of the whole sweep (default 3; quick 1)")
    p.add_argument("--chunks", type=int, default=5, help="timed blocks per phase and round (default 5)")
    p.add_argument("--stat", choices=STATS, default="best", help="what the tables show (default best)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning, module="torchrl")
    torch.manual_seed(0)
    np.random.seed(0)
    libs, skipped = make_libs()
    freeze_heap()
    env = environment({"xpbank": xpbank.__version__} | {lib.name: lib.version for lib in libs if lib.version})
    print(header(env, args, skipped), flush=True)
    workloads = make_workloads(args.quick)
    chosen = list(workloads) if args.workload == "all" else [args.workload]
    out: dict[str, Any] = {"environment": env, "args": vars(args), "workloads": {}}
    failed = False
    for name in chosen:
        wl = workloads[name]
        t0 = time.perf_counter()
        results = run_workload(wl, libs, args.rounds, args.chunks)
        log(f"workload {name}: {time.perf_counter() - t0:.1f} s")
        failed |= any(r.error for r in results)
        print("\n" + workload_report(wl, results, args.stat), flush=True)
        out["workloads"][name] = workload_json(wl, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
        log(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
