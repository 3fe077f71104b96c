"""On-policy rollout benchmark: xpbank's RolloutBuffer against a raw packed-tensor
baseline, rsl_rl's RolloutStorage, SB3's RolloutBuffer and TorchRL (GAE + buffer), in one run.

Workload (the PPO inner loop): ``E`` envs x ``T`` steps (4096 x 24; ``--quick``: 256 x 8),
obs float32[48], action float32[12], reward, value, log-prob, terminated. Phases, each
timed separately on the CPU:

- add: one step of every env written into the rollout storage (per call);
- GAE: advantages and returns of the whole rollout (gamma 0.99, lambda 0.95);
- minibatches: 5 epochs x 4 flat shuffled minibatches, every field gathered.

Every library gets the same pre-made steps; the GAE of each is checked against xpbank's
(same inputs, terminations only, where all agree) and each minibatch's size is checked.
No timing is asserted anywhere: this prints a markdown report.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import xpbank
from _common import (
    environment,
    fastest_block,
    fmt_ratio,
    fmt_us,
    freeze_heap,
    log,
    markdown_table,
    run_main,
)

GAMMA, LAM, EPOCHS, MINIBATCHES = 0.99, 0.95, 5, 4


@dataclass
class Data:
    """One rollout's inputs, pre-made in every form a library takes."""

    e: int
    t: int
    steps: list[dict[str, torch.Tensor]]
    last_values: torch.Tensor
    grids: dict[str, torch.Tensor] = field(default_factory=dict)  # [T, E] time-major


def make_data(e: int, t: int, seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(t):
        steps.append(
            {
                "obs": torch.randn(e, 48, generator=g),
                "action": torch.randn(e, 12, generator=g),
                "reward": torch.randn(e, generator=g),
                "value": torch.randn(e, generator=g),
                "log_prob": torch.randn(e, generator=g),
                "terminated": torch.rand(e, generator=g) < 0.02,
            }
        )
    data = Data(e, t, steps, torch.randn(e, generator=g))
    data.grids = {k: torch.stack([s[k] for s in steps]) for k in ("reward", "value", "terminated")}
    return data


class Candidate:
    """A library under test: ``fill`` writes the rollout, ``gae`` returns advantages [T, E]."""

    name = ""
    note = ""

    def fill(self, data: Data) -> None:
        raise NotImplementedError

    def gae(self, data: Data) -> torch.Tensor:
        raise NotImplementedError

    def iterate(self) -> int:
        """Run 5 epochs x 4 minibatches; return how many items were delivered."""
        raise NotImplementedError


class RawPacked(Candidate):
    name = "raw packed tensors"
    note = "one float32 block [T*E, 66]; add = a slice copy per field; GAE = plain NumPy loop"

    def __init__(self, data: Data):
        self.e, self.t = data.e, data.t
        self.block = torch.empty(data.t * data.e, 66)
        cols = {"obs": (0, 48), "action": (48, 60), "reward": (60, 61), "value": (61, 62)}
        cols |= {"log_prob": (62, 63), "terminated": (63, 64), "advantage": (64, 65), "return": (65, 66)}
        self.views = {
            k: self.block[:, a:b].squeeze(1) if b - a == 1 else self.block[:, a:b]
            for k, (a, b) in cols.items()
        }
        self.cursor = 0

    def add(self, step: dict[str, torch.Tensor]) -> None:
        rows = slice(self.cursor * self.e, (self.cursor + 1) * self.e)
        for key, value in step.items():
            self.views[key][rows].copy_(value)
        self.cursor += 1

    def fill(self, data: Data) -> None:
        self.cursor = 0
        for step in data.steps:
            self.add(step)

    def gae(self, data: Data) -> torch.Tensor:
        r, v = data.grids["reward"].numpy(), data.grids["value"].numpy()
        term = data.grids["terminated"].numpy()
        last_v = data.last_values.numpy()
        adv = np.zeros_like(r)
        last = np.zeros(data.e, np.float32)
        for t in reversed(range(data.t)):
            nv = last_v if t == data.t - 1 else v[t + 1]
            keep = 1.0 - term[t]
            delta = r[t] + GAMMA * nv * keep - v[t]
            last = delta + GAMMA * LAM * keep * last
            adv[t] = last
        ret = adv + v
        self.views["advantage"].copy_(torch.from_numpy(adv).reshape(-1))
        self.views["return"].copy_(torch.from_numpy(ret).reshape(-1))
        return torch.from_numpy(adv)

    def iterate(self) -> int:
        n, size, total = self.block.shape[0], self.block.shape[0] // MINIBATCHES, 0
        for _ in range(EPOCHS):
            order = torch.randperm(n)
            for i in range(MINIBATCHES):
                rows = self.block.index_select(0, order[i * size : (i + 1) * size])
                total += rows[:, 0:48].shape[0]
        return total


class Xpbank(Candidate):
    name = "xpbank RolloutBuffer"
    note = "add(dict); compute_returns (NumPy GAE); minibatches(4, epochs=5): TensorDicts with index"

    def __init__(self, data: Data):
        self.rb = xpbank.RolloutBuffer(data.e, data.t, seed=0)

    def fill(self, data: Data) -> None:
        self.rb.clear()
        for step in data.steps:
            self.rb.add(step)

    def add(self, step: dict[str, torch.Tensor]) -> None:
        self.rb.add(step)

    def gae(self, data: Data) -> torch.Tensor:
        return self.rb.compute_returns(data.last_values, GAMMA, LAM)[0]

    def iterate(self) -> int:
        return sum(mb.batch_size[0] for mb in self.rb.minibatches(MINIBATCHES, epochs=EPOCHS))


class _Critic:
    def __init__(self, last: torch.Tensor):
        self.last = last

    def __call__(self, obs: object) -> torch.Tensor:
        return self.last

    def get_hidden_state(self) -> None:
        return None

    def reset(self, dones: object = None, hidden_state: object = None) -> None:
        return None


class RslRl(Candidate):
    name = "rsl_rl RolloutStorage"
    note = "add_transition; PPO.compute_returns (torch loop, no normalization); mini_batch_generator(4, 5)"

    def __init__(self, data: Data):
        from rsl_rl.algorithms.ppo import PPO
        from rsl_rl.storage.rollout_storage import RolloutStorage
        from tensordict import TensorDict

        self.ppo_returns = PPO.compute_returns
        self.storage = RolloutStorage(
            "rl", data.e, data.t, TensorDict({"policy": data.steps[0]["obs"]}, [data.e]), [12]
        )
        self.transitions = []
        for s in data.steps:
            tr = RolloutStorage.Transition()
            tr.observations = TensorDict({"policy": s["obs"]}, [data.e])
            tr.actions, tr.rewards, tr.dones = s["action"], s["reward"], s["terminated"]
            tr.values, tr.actions_log_prob = s["value"][:, None], s["log_prob"]
            tr.distribution_params = (s["action"], s["action"])  # mean, std
            self.transitions.append(tr)
        self.fake = SimpleNamespace(
            storage=self.storage, critic=_Critic(data.last_values[:, None]), gamma=GAMMA, lam=LAM,
            normalize_advantage_per_mini_batch=True,
        )  # fmt: skip

    def fill(self, data: Data) -> None:
        self.storage.clear()
        for tr in self.transitions:
            self.storage.add_transition(tr)

    def gae(self, data: Data) -> torch.Tensor:
        self.ppo_returns(self.fake, None)
        return self.storage.advantages[..., 0]

    def iterate(self) -> int:
        gen = self.storage.mini_batch_generator(MINIBATCHES, num_epochs=EPOCHS)
        return sum(b.actions.shape[0] for b in gen)


class Sb3(Candidate):
    name = "SB3 RolloutBuffer"
    note = "add(NumPy); compute_returns_and_advantage (NumPy loop); get(T*E/4) x 5 epochs"

    def __init__(self, data: Data):
        from gymnasium import spaces
        from stable_baselines3.common.buffers import RolloutBuffer

        box = spaces.Box(-np.inf, np.inf, (48,), np.float32)
        act = spaces.Box(-np.inf, np.inf, (12,), np.float32)
        self.buf = RolloutBuffer(data.t, box, act, "cpu", LAM, GAMMA, data.e)
        done = data.grids["terminated"].numpy()
        starts = np.concatenate([np.zeros((1, data.e), bool), done[:-1]])
        self.args = [
            (s["obs"].numpy(), s["action"].numpy(), s["reward"].numpy(), starts[t], s["value"], s["log_prob"])
            for t, s in enumerate(data.steps)
        ]
        self.last_done = done[-1]
        self.size = data.t * data.e // MINIBATCHES

    def fill(self, data: Data) -> None:
        self.buf.reset()
        for a in self.args:
            self.buf.add(*a)

    def gae(self, data: Data) -> torch.Tensor:
        self.buf.compute_returns_and_advantage(data.last_values, self.last_done)
        return torch.from_numpy(self.buf.advantages)

    def iterate(self) -> int:
        return sum(b.actions.shape[0] for _ in range(EPOCHS) for b in self.buf.get(self.size))


class TorchRL(Candidate):
    name = "TorchRL (GAE + buffer)"
    note = (
        "functional generalized_advantage_estimate on [E, T, 1]; TensorDictReplayBuffer("
        "LazyTensorStorage, SamplerWithoutReplacement): extend per step, sample 4 x 5"
    )

    def __init__(self, data: Data):
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, SamplerWithoutReplacement, TensorDictReplayBuffer
        from torchrl.objectives.value.functional import generalized_advantage_estimate

        self.gae_fn = generalized_advantage_estimate
        n = data.t * data.e
        self.make = lambda: TensorDictReplayBuffer(
            storage=LazyTensorStorage(n), sampler=SamplerWithoutReplacement(), batch_size=n // MINIBATCHES
        )
        self.rb = self.make()
        self.tds = [TensorDict(s, [data.e]) for s in data.steps]
        v = data.grids["value"].T[..., None].contiguous()  # [E, T, 1]: TorchRL's time_dim=-2
        self.inputs = {
            "state_value": v,
            "next_state_value": torch.cat([v[:, 1:], data.last_values[:, None, None]], 1),
            "reward": data.grids["reward"].T[..., None].contiguous(),
            "done": data.grids["terminated"].T[..., None].contiguous(),
        }

    def fill(self, data: Data) -> None:
        self.rb = self.make()
        for td in self.tds:
            self.rb.extend(td)

    def gae(self, data: Data) -> torch.Tensor:
        adv, _ = self.gae_fn(GAMMA, LAM, terminated=self.inputs["done"], **self.inputs)
        return adv[..., 0].T

    def iterate(self) -> int:
        return sum(self.rb.sample().batch_size[0] for _ in range(EPOCHS * MINIBATCHES))


def make_candidates(data: Data) -> tuple[list[Candidate], dict[str, str]]:
    out: list[Candidate] = [RawPacked(data), Xpbank(data)]
    skipped = {}
    for cls in (RslRl, Sb3, TorchRL):
        try:
            out.append(cls(data))
        except ImportError as exc:  # a peer library that is not installed
            skipped[cls.name] = str(exc)
    return out, skipped


def measure(c: Candidate, data: Data, args: argparse.Namespace) -> dict[str, Any]:
    c.fill(data)
    adv = c.gae(data)
    want = xpbank.gae(data.grids["reward"], data.grids["value"], _next_values(data), data.grids["terminated"],
                      torch.zeros_like(data.grids["terminated"]), GAMMA, LAM)[0]  # fmt: skip
    agrees = bool(torch.allclose(adv.float(), want, atol=1e-4))
    delivered = c.iterate()
    ok = delivered == EPOCHS * data.t * data.e
    fill_s = fastest_block(lambda: c.fill(data), 1, args.chunks)
    return {
        "add_s": fill_s / data.t,
        "gae_s": fastest_block(lambda: c.gae(data), args.gae_calls, args.chunks),
        "minibatch_s": fastest_block(c.iterate, 1, args.chunks),
        "gae_agrees": agrees,
        "items_ok": ok,
    }


def _next_values(data: Data) -> torch.Tensor:
    v = data.grids["value"]
    return torch.cat([v[1:], data.last_values[None]])


def report(results: dict[str, dict[str, Any]], notes: dict[str, str]) -> str:
    raw = results["raw packed tensors"]
    rows = []

    def cell(r: dict[str, Any], key: str) -> str:
        return "n/a" if key not in r else f"{fmt_us(r[key])} ({fmt_ratio(r[key] / raw[key])})"

    for name, r in results.items():
        rows.append(
            [
                name,
                cell(r, "add_s"),
                cell(r, "gae_s"),
                cell(r, "minibatch_s"),
                "yes" if r["gae_agrees"] else "NO",
                "yes" if r["items_ok"] else "NO",
            ]
        )
    head = [
        "library",
        "add (one step, all envs)",
        "GAE",
        f"{EPOCHS} x {MINIBATCHES} minibatches",
        "GAE = xpbank's",
        "sizes ok",
    ]
    table = markdown_table(head, rows)
    return (
        table
        + "\n\nTimes per call (fastest block); in parentheses: time / raw packed time (lower is better).\n\n"
        + "\n".join(f"- {k}: {v}" for k, v in notes.items())
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="256 envs x 8 steps, 2 chunks (seconds)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (use 1 on a busy machine)"
    )
    p.add_argument("--chunks", type=int, default=None, help="timed blocks per phase (default 7; quick 2)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.chunks = args.chunks or (2 if args.quick else 7)
    args.gae_calls = 5 if args.quick else 20
    warnings.filterwarnings("ignore", category=UserWarning)
    e, t = (256, 8) if args.quick else (4096, 24)
    data = make_data(e, t)
    candidates, skipped = make_candidates(data)
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # set on import; its INFO goes to stdout
    freeze_heap()
    env = environment({"xpbank": xpbank.__version__})
    print("# xpbank rollout benchmark\n\n" + " · ".join(f"{k} {v}" for k, v in env.items()))
    print(
        f"\nWorkload: {e} envs x {t} steps, obs float32[48], action float32[12]; GAE; "
        f"{EPOCHS} epochs x {MINIBATCHES} flat minibatches.\n"
    )
    results, notes = {}, {}
    for c in candidates:
        log(f"measuring {c.name}")
        results[c.name] = measure(c, data, args)
        notes[c.name] = c.note
    pure = "xpbank.gae (pure function)"
    g, nv = data.grids, _next_values(data)
    no = torch.zeros_like(g["terminated"])
    results[pure] = {
        "gae_s": fastest_block(
            lambda: xpbank.gae(g["reward"], g["value"], nv, g["terminated"], no, GAMMA, LAM),
            args.gae_calls, args.chunks,
        ),
        "gae_agrees": True, "items_ok": True,
    }  # fmt: skip
    notes[pure] = "GAE alone on contiguous [T, E] tensors (what compute_returns runs after reading the rows)"
    notes.update({k: f"skipped: {v}" for k, v in skipped.items()})
    print(report(results, notes))
    return 0 if all(r["gae_agrees"] and r["items_ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
