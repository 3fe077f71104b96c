"""SB3's buffer calls with cold caches, as they run inside ``learn()``: SB3's own
``ReplayBuffer`` against ``XpbankReplayBuffer``'s short path and its general path.

    PYTHONPATH=src .venv/bin/python benchmarks/profile_sb3_cold.py --threads 1 [--quick] [--case dqn]

In SB3's training loop each buffer call runs between network updates, which evict the
buffer's code and data from the caches: a call then costs several times what it costs in
a tight loop (SAC's ``sample(256)``: ~55 µs hot, ~150-300 µs cold), and what matters is
how much code and how many objects it goes through. Here each timed call follows a
cache-thrashing step, a small MLP's forward, backward and Adam step (SAC's critic size:
[256, 256], the batch size), and the calls of the buffers are interleaved, the order
rotating each round. Also timed hot (after 50 untimed calls, back to back).

Rows: ``sample(B)`` and ``add`` of one env step (Pendulum-v1's spaces and SAC's batch
256 with ``--case sac``; CartPole-v1's and rl-zoo DQN's batch 64 with ``--case dqn``),
each for SB3's buffer, the adapter (``sample`` / ``add``: the short path of
:mod:`xpbank.integrations.sb3.fast`) and the adapter's general path
(``samples_of(xp.sample(B))``: an xpbank batch split into SB3's samples; ``_add_checked``:
every array converted and checked). Buffers of SAC's and DQN's default sizes, 3,000
steps stored. No timing is asserted.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from _common import clock, environment, log, markdown_table, report, run_main, set_clock

CASES = {  # env, batch, buffer size, obs dim, action dim (Box) or None (Discrete)
    "sac": ("Pendulum-v1", 256, 1_000_000, 3, 1),
    "dqn": ("CartPole-v1", 64, 100_000, 4, None),
}


def buffers(case: str) -> tuple[Any, Any, int, Callable[[int], tuple]]:
    """SB3's buffer and the adapter, each fed the same 3,000 steps; the batch size and
    a maker of one env step (SB3's arguments)."""
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer

    from xpbank.integrations.sb3 import XpbankReplayBuffer

    name, batch, size, obs_dim, act_dim = CASES[case]
    env = gym.make(name)
    sb3 = ReplayBuffer(size, env.observation_space, env.action_space, "cpu")
    xp = XpbankReplayBuffer(size, env.observation_space, env.action_space, "cpu", seed=0)
    rng = np.random.default_rng(0)

    def step(i: int) -> tuple:
        obs = rng.standard_normal((1, obs_dim)).astype(np.float32)
        if act_dim is None:  # SB3's DQN passes a Discrete action as (1,) int64
            action = rng.integers(0, 2, (1,))
        else:  # SAC's as (1, action_dim) float32
            action = rng.standard_normal((1, act_dim)).astype(np.float32)
        reward = rng.standard_normal(1).astype(np.float32)
        infos = [{"TimeLimit.truncated": i % 400 == 399}]
        return obs, obs + 1, action, reward, np.array([i % 200 == 199]), infos

    for i in range(3000):
        args = step(i)
        sb3.add(*args)
        xp.add(*args)
    return sb3, xp, batch, step


def thrasher(batch: int, width: int) -> Callable[[], None]:
    """One forward, backward and Adam step of a [width, width] MLP on ``batch`` rows."""
    net = torch.nn.Sequential(
        torch.nn.Linear(width, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    )  # fmt: skip
    opt = torch.optim.Adam(net.parameters())
    x = torch.randn(batch, width)

    def thrash() -> None:
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return thrash


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), default="sac")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--clock", choices=["wall", "thread"], default="thread")
    p.add_argument("--rounds", type=int, default=None, help="cold calls per row (default 400; quick 40)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    set_clock(args.clock)
    rounds = args.rounds or (40 if args.quick else 400)
    sb3, xp, batch, step = buffers(args.case)
    steps = [step(i) for i in range(64)]
    calls: dict[str, Callable[[int], Any]] = {
        f"SB3 sample({batch})": lambda i: sb3.sample(batch),
        f"xpbank sample({batch})": lambda i: xp.sample(batch),
        f"xpbank general sample({batch})": lambda i: xp.samples_of(xp.xp.sample(batch)),
        "SB3 add": lambda i: sb3.add(*steps[i % 64]),
        "xpbank add": lambda i: xp.add(*steps[i % 64]),
        "xpbank general add": lambda i: xp._add_checked(*steps[i % 64]),
    }
    names = list(calls)
    thrash = thrasher(batch, CASES[args.case][3] + (CASES[args.case][4] or 1))
    cold: dict[str, list[float]] = {n: [] for n in names}
    log(f"{rounds} cold rounds of {len(names)} calls ({args.case})")
    for r in range(rounds + 10):  # the first 10 rounds untimed
        for name in names[r % len(names) :] + names[: r % len(names)]:
            thrash()
            start = clock()
            calls[name](r)
            took = clock() - start
            if r >= 10:
                cold[name].append(took)
    hot: dict[str, float] = {}
    for name in names:
        for i in range(50):
            calls[name](i)
        times = []
        for i in range(200 if not args.quick else 20):
            start = clock()
            calls[name](i)
            times.append(clock() - start)
        hot[name] = float(np.median(times))
    rows, results = [], {}
    for name in names:
        med = float(np.median(cold[name]))
        base = float(np.median(cold[name.replace("xpbank general", "SB3").replace("xpbank", "SB3")]))
        results[name] = {"cold_us": med * 1e6, "hot_us": hot[name] * 1e6}
        rows.append([name, f"{med * 1e6:.1f}", f"{med / base:.2f}x", f"{hot[name] * 1e6:.1f}"])
    lines = [
        f"## SB3 buffer calls, cold and hot ({CASES[args.case][0]}, {args.clock} clock)",
        "",
        markdown_table(["call", "cold µs (median)", "cold vs SB3's", "hot µs (median)"], rows),
        "",
        f"Cold: each call after one {CASES[args.case][1]}-row MLP [256, 256] update, {rounds} "
        "interleaved rounds; hot: back to back after 50 untimed calls.",
    ]
    results["environment"] = environment({})
    return report(lines, results, args.json)


if __name__ == "__main__":
    raise SystemExit(run_main(main))
