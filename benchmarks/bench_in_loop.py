"""Whole training loops of the real peer libraries, with their own buffer and with xpbank's.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_in_loop.py --threads 1            # minutes
    PYTHONPATH=src .venv/bin/python benchmarks/bench_in_loop.py --threads 1 --quick    # a smoke run

On a shared machine add ``--clock thread`` (this thread's CPU time: the waits while other
processes run are left out; cache and memory contention stay in). ``--control`` runs the
original a second time in every round (an A/A run): the ratio of its two runs is the
measurement's own spread, against which the xpbank ratio is read.

Each case runs the library's own loop twice per round, once with its buffer and once
with xpbank's drop-in, in one process, rounds interleaved (original, xpbank, original,
xpbank ...) so both see the same machine load:

- **SB3 DQN / CartPole-v1**, rl-zoo's hyperparameters (``MlpPolicy`` [256, 256],
  batch 64, ``train_freq=256``, ``gradient_steps=128``, ``learning_starts=1000``),
  ``learn(--dqn-steps)``: SB3's ``ReplayBuffer`` vs ``XpbankReplayBuffer``.
- **SB3 SAC / Pendulum-v1** (SB3's defaults, batch 256, one gradient step per env step):
  the same two buffers.
- **SB3 DQN, images, ``optimize_memory_usage=True``**: a synthetic gymnasium env of
  ``uint8[4, 84, 84]`` frame stacks (each step shifts in one new frame, so consecutive
  observations share three frames, as an Atari stack), ``CnnPolicy``, batch 32,
  ``train_freq=4``: SB3's optimized buffer (which needs
  ``handle_timeout_termination=False``) vs xpbank's dedup adapter.
- **rsl_rl PPO**, MLP and recurrent (LSTM) actor-critic, 16 and 4096 envs: rsl_rl's own
  ``PPO`` and its rollout loop (``act`` / ``process_env_step`` / ``compute_returns`` /
  ``update``, what ``OnPolicyRunner.learn`` runs) over a torch-vectorized synthetic task
  (obs float32[48], 12 actions, random terminations and time limits): rsl_rl's
  ``PPO`` on its ``RolloutStorage`` vs the runner's one-line switch,
  ``xpbank.compat.rsl_rl.PPO`` (rsl_rl's PPO on ``xpbank.compat.rsl_rl``'s storage, its
  returns in one compiled pass, bit for bit rsl_rl's).
- **TorchRL DQN ``Trainer``** on CartPole-v1 (``Collector``, ``QValueActor``,
  ``DQNLoss``, Adam): TorchRL's ``ReplayBufferTrainer`` over its
  ``TensorDictReplayBuffer(LazyTensorStorage, RandomSampler)`` vs
  ``xpbank.compat.torchrl.ReplayBufferTrainer`` over an ``xpbank.ReplayBuffer``.

Reported per case: the whole loop's seconds (median over rounds) with each buffer, the
ratio xpbank / original (median, and the range of the per-round ratios), and the
buffer's share of the loop: the time spent inside the buffer's calls (``add`` /
``sample`` / ``_get_samples`` for SB3; ``add_transition``, ``clear``, the returns
(``PPO.compute_returns`` over the storage) and each minibatch drawn from the
generators for rsl_rl; the hook's ``extend`` / ``sample`` / priority update for
TorchRL), measured by wrapping those calls. The same seed is used for both buffers.
No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import statistics
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

import xpbank
from _common import clock, environment, fmt_ratio, freeze_heap, log, markdown_table, set_clock, settle

_END = object()  # a wrapped generator's end


class CallTimer:
    """Seconds spent inside wrapped calls (and inside each ``next`` of wrapped generators).

    A wrapped call made inside another (SB3's ``sample`` calls its ``_get_samples``) is
    counted once, in the outer call."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.depth = 0  # wrapped calls in progress

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:  # inside a timed call: its time is already counted
                return fn(*args, **kwargs)
            self.depth += 1
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += clock() - start
                self.depth -= 1

        return timed

    def wrap_generator(self, fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def timed(*args: Any, **kwargs: Any) -> Iterator[Any]:
            it = self.wrap(fn)(*args, **kwargs)
            timed_next = self.wrap(next)  # each item's time, counted once as a call's
            while True:
                item = timed_next(it, _END)
                if item is _END:
                    return
                yield item

        return timed


# -- SB3 --------------------------------------------------------------------------------------
def sb3_model(case: str, xp: bool) -> Any:
    from stable_baselines3 import DQN, SAC

    from xpbank.integrations.sb3 import XpbankReplayBuffer

    kw: dict[str, Any] = {"seed": 0, "device": "cpu", "verbose": 0}
    if xp:
        kw["replay_buffer_class"] = XpbankReplayBuffer
    if case == "sb3-dqn":  # rl-zoo's dqn.yml, CartPole-v1
        return DQN(
            "MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
            learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
            gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
            policy_kwargs={"net_arch": [256, 256]}, **kw,
        )  # fmt: skip
    if case == "sb3-sac":
        return SAC("MlpPolicy", "Pendulum-v1", learning_starts=100, batch_size=256, **kw)
    if not xp:  # SB3's optimized buffer refuses handle_timeout_termination=True
        kw["replay_buffer_kwargs"] = {"handle_timeout_termination": False}
    return DQN(
        "CnnPolicy", FrameEnv(), buffer_size=20_000, learning_starts=200, batch_size=32, train_freq=4,
        gradient_steps=1, target_update_interval=500, optimize_memory_usage=True, **kw,
    )  # fmt: skip


def run_sb3(case: str, xp: bool, steps: int) -> tuple[float, float]:
    model = sb3_model(case, xp)
    timer, buf = CallTimer(), model.replay_buffer
    for name in ("add", "sample", "_get_samples"):
        setattr(buf, name, timer.wrap(getattr(buf, name)))
    settle()
    start = clock()
    model.learn(steps)
    return clock() - start, timer.seconds


def _frame_env_class() -> Any:
    import gymnasium as gym

    class _FrameEnv(gym.Env):
        """uint8[4, 84, 84] frame stacks: each step shifts in one new frame; 200-step episodes
        end by a 1% chance of termination or a time limit (truncation)."""

        observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        action_space = gym.spaces.Discrete(4)

        def __init__(self) -> None:
            self._rng = np.random.default_rng(0)
            self._frames = [self._rng.integers(0, 256, (84, 84), dtype=np.uint8) for _ in range(64)]
            self._stack = np.zeros((4, 84, 84), np.uint8)
            self._t = 0

        def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
            super().reset(seed=seed)
            self._t = 0
            for i in range(4):
                self._stack[i] = self._frames[int(self._rng.integers(64))]
            return self._stack.copy(), {}

        def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
            self._stack[:-1] = self._stack[1:]
            self._stack[-1] = self._frames[int(self._rng.integers(64))]
            self._t += 1
            terminated = bool(self._rng.random() < 0.01)
            return self._stack.copy(), float(action == 1), terminated, self._t >= 200, {}

    return _FrameEnv


def FrameEnv() -> Any:  # a class made on first use: gymnasium is imported lazily
    return _frame_env_class()()


# -- rsl_rl -----------------------------------------------------------------------------------
def rsl_storage_class(xp: bool) -> Any:
    """The storage class rsl_rl's PPO is given: rsl_rl's own, or xpbank's drop-in.

    The one place that knows how xpbank's storage reaches rsl_rl (today: the class
    ``xpbank.compat.rsl_rl.RolloutStorage``, passed to ``PPO`` as rsl_rl's is).
    """
    if xp:
        from xpbank.compat.rsl_rl import RolloutStorage
    else:
        from rsl_rl.storage import RolloutStorage
    return RolloutStorage


def synthetic_task(num_envs: int, seed: int = 0) -> Any:
    """A torch-vectorized task as rsl_rl's ``VecEnv`` (as Isaac Lab's are): obs float32[48],
    12 actions, a random linear drift, 0.5% terminations, a 100-step time limit."""
    from rsl_rl.env import VecEnv
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)

    class Task(VecEnv):
        def __init__(self) -> None:
            self.num_envs, self.num_actions, self.device, self.cfg = num_envs, 12, "cpu", {}
            self.max_episode_length = 100
            self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
            self.a = torch.randn(12, 48, generator=g) * 0.1
            self.obs = torch.randn(num_envs, 48, generator=g)

        def get_observations(self) -> TensorDict:
            return TensorDict({"policy": self.obs}, batch_size=[num_envs])

        def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
            self.obs = (
                0.9 * self.obs + actions.clamp(-1, 1) @ self.a + 0.1 * torch.randn(num_envs, 48, generator=g)
            )
            reward = -self.obs[:, :4].pow(2).mean(1)
            self.episode_length_buf += 1
            terminated = torch.rand(num_envs, generator=g) < 0.005
            time_outs = self.episode_length_buf >= self.max_episode_length
            done = terminated | time_outs
            self.episode_length_buf[done] = 0
            self.obs[done] = torch.randn(int(done.sum()), 48, generator=g)
            return self.get_observations(), reward, done, {"time_outs": time_outs & ~terminated}

    return Task()


def rsl_ppo(env: Any, xp: bool, recurrent: bool, steps: int) -> Any:
    """rsl_rl's PPO on its storage, or (``xp``) the runner's switch: ``xpbank.compat.rsl_rl.PPO``
    (``"class_name": "xpbank.compat.rsl_rl:PPO"``), rsl_rl's PPO on xpbank's storage with its
    returns in one compiled pass (bit for bit rsl_rl's)."""
    from rsl_rl.algorithms import PPO as RslPPO
    from rsl_rl.models import MLPModel, RNNModel
    from rsl_rl.modules.distribution import GaussianDistribution

    torch.manual_seed(0)
    obs = env.get_observations()
    groups = {"actor": ["policy"], "critic": ["policy"]}
    dist = {"class_name": GaussianDistribution, "init_std": 1.0}
    if recurrent:
        rnn = {"rnn_type": "lstm", "rnn_hidden_dim": 64}
        actor = RNNModel(obs, groups, "actor", 12, hidden_dims=[64, 64], distribution_cfg=dist, **rnn)
        critic = RNNModel(obs, groups, "critic", 1, hidden_dims=[64, 64], **rnn)
    else:
        actor = MLPModel(obs, groups, "actor", 12, hidden_dims=[128, 128], distribution_cfg=dist)
        critic = MLPModel(obs, groups, "critic", 1, hidden_dims=[128, 128])
    storage = rsl_storage_class(xp)("rl", env.num_envs, steps, obs, [12])
    if xp:
        from xpbank.compat.rsl_rl import PPO
    else:
        PPO = RslPPO
    return PPO(actor, critic, storage, num_learning_epochs=5, num_mini_batches=4)


def run_rsl(num_envs: int, recurrent: bool, xp: bool, iterations: int, steps: int) -> tuple[float, float]:
    env = synthetic_task(num_envs)
    ppo = rsl_ppo(env, xp, recurrent, steps)
    timer, st = CallTimer(), ppo.storage
    for name in ("add_transition", "clear"):
        setattr(st, name, timer.wrap(getattr(st, name)))
    for name in ("mini_batch_generator", "recurrent_mini_batch_generator"):
        setattr(st, name, timer.wrap_generator(getattr(st, name)))
    compute_returns = timer.wrap(ppo.compute_returns)  # the returns loop over the storage
    obs = env.get_observations()
    settle()
    start = clock()
    for _ in range(iterations):  # OnPolicyRunner.learn's loop, without its logging
        with torch.inference_mode():
            for _ in range(steps):
                actions = ppo.act(obs)
                obs, rewards, dones, extras = env.step(actions)
                ppo.process_env_step(obs, rewards, dones, extras)
            compute_returns(obs)
        ppo.update()
    return clock() - start, timer.seconds


# -- TorchRL ----------------------------------------------------------------------------------
def run_torchrl(xp: bool, frames: int) -> tuple[float, float]:
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer
    from torchrl.envs import GymEnv
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss
    from torchrl.trainers import ReplayBufferTrainer as TorchRLHook
    from torchrl.trainers import Trainer

    from xpbank.compat.torchrl import ReplayBufferTrainer as XpbankHook

    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    actor = QValueActor(
        MLP(in_features=4, out_features=2, num_cells=[64, 64]), in_keys=["observation"], spec=env.action_spec
    )
    loss = DQNLoss(actor, action_space=env.action_spec, delay_value=False)
    trainer = Trainer(
        collector=Collector(env, actor, frames_per_batch=64, total_frames=frames),
        total_frames=frames, frame_skip=1, optim_steps_per_batch=8, loss_module=loss,
        optimizer=torch.optim.Adam(loss.parameters(), 1e-3), progress_bar=False,
        save_trainer_file=None, log_interval=10**9,
    )  # fmt: skip
    if xp:
        hook: Any = XpbankHook(xpbank.ReplayBuffer(100_000, seed=0), batch_size=64, flatten_tensordicts=True)
    else:
        storage = LazyTensorStorage(100_000)
        rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=64)
        hook = TorchRLHook(rb, batch_size=64, flatten_tensordicts=True)
    timer = CallTimer()
    for name in ("extend", "sample", "update_priority", "update_last_priority"):
        if hasattr(hook, name):
            setattr(hook, name, timer.wrap(getattr(hook, name)))
    hook.register(trainer)
    settle()
    start = clock()
    trainer.train()
    return clock() - start, timer.seconds


# -- driver -----------------------------------------------------------------------------------
def cases(args: argparse.Namespace) -> dict[str, tuple[str, Callable[[bool], tuple[float, float]]]]:
    """name -> (what the original is, run(xp) -> (loop seconds, buffer seconds))."""
    out: dict[str, tuple[str, Callable[[bool], tuple[float, float]]]] = {
        f"SB3 DQN / CartPole-v1 (rl-zoo), {args.dqn_steps} steps": (
            "SB3 ReplayBuffer",
            lambda xp: run_sb3("sb3-dqn", xp, args.dqn_steps),
        ),
        f"SB3 SAC / Pendulum-v1, {args.sac_steps} steps": (
            "SB3 ReplayBuffer",
            lambda xp: run_sb3("sb3-sac", xp, args.sac_steps),
        ),
        f"SB3 DQN, uint8[4,84,84], optimize_memory_usage, {args.image_steps} steps": (
            "SB3 ReplayBuffer (optimized)",
            lambda xp: run_sb3("sb3-image", xp, args.image_steps),
        ),
    }
    for e in args.rsl_envs:
        iters = args.rsl_iters * (8 if e <= 256 else 1)  # small rollouts: more iterations per run
        for recurrent in (False, True):
            name = f"rsl_rl PPO {'LSTM' if recurrent else 'MLP'}, {e} envs x 24 steps, {iters} iterations"
            out[name] = (
                "rsl_rl RolloutStorage",
                lambda xp, e=e, r=recurrent, n=iters: run_rsl(e, r, xp, n, 24),
            )
    if torchrl_runs():
        out[f"TorchRL DQN Trainer / CartPole-v1, {args.torchrl_frames} frames"] = (
            "TorchRL TensorDictReplayBuffer",
            lambda xp: run_torchrl(xp, args.torchrl_frames),
        )
    return out


def warm_up(name: str, xp: bool) -> None:
    """A short run of the case's code path (both buffers), so round 0 pays no first calls."""
    if name.startswith("SB3"):
        case = "sb3-dqn" if "CartPole" in name else "sb3-sac" if "SAC" in name else "sb3-image"
        run_sb3(case, xp, 150)
    elif name.startswith("rsl_rl"):
        run_rsl(16, "LSTM" in name, xp, 1, 4)
    else:
        run_torchrl(xp, 128)


def torchrl_runs() -> bool:
    try:
        import torchrl.trainers  # noqa: F401
    except Exception as exc:  # its C extension or a dependency: say so and skip the case
        log(f"TorchRL trainer skipped: {type(exc).__name__}: {exc}")
        return False
    return True


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few hundred steps per case: a smoke run")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument(
        "--clock", choices=["wall", "thread"], default="wall", help="wall time, or this thread's CPU time"
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    p.add_argument("--dqn-steps", type=int, default=None, help="DQN env steps (default 15000; quick 1300)")
    p.add_argument("--sac-steps", type=int, default=None, help="SAC env steps (default 2000; quick 300)")
    p.add_argument("--image-steps", type=int, default=None, help="image DQN steps (default 2000; quick 300)")
    p.add_argument("--rsl-envs", type=int, nargs="+", default=[16, 4096], help="rsl_rl env counts")
    p.add_argument(
        "--rsl-iters", type=int, default=None, help="PPO iterations, 8x at <= 256 envs (default 2; quick 1)"
    )
    p.add_argument("--torchrl-frames", type=int, default=None, help="frames (default 4096; quick 512)")
    p.add_argument("--only", default=None, help="run only the cases whose name contains this")
    p.add_argument(
        "--control", action="store_true", help="also run the original twice per round (an A/A noise floor)"
    )
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    q = args.quick
    args.rounds = args.rounds or (1 if q else 3)
    args.dqn_steps = args.dqn_steps or (1300 if q else 15_000)
    args.sac_steps = args.sac_steps or (300 if q else 2000)
    args.image_steps = args.image_steps or (300 if q else 2000)
    args.rsl_iters = args.rsl_iters or (1 if q else 2)
    args.torchrl_frames = args.torchrl_frames or (512 if q else 4096)
    return args


def summarize(name: str, original: str, runs: dict[str, list[tuple[float, float]]]) -> list[str]:
    o, x = runs["original"], runs["xpbank"]
    ratios = [xt / ot for (ot, _), (xt, _) in zip(o, x, strict=True)]
    buffer_ratios = [xb / ob for (_, ob), (_, xb) in zip(o, x, strict=True)]
    share = [b / t for t, b in o], [b / t for t, b in x]
    med = statistics.median
    row = [
        name,
        original,
        f"{med(t for t, _ in o):.2f}",
        f"{med(t for t, _ in x):.2f}",
        _ratio(ratios),
        f"{100 * med(share[0]):.1f}%",
        f"{100 * med(share[1]):.1f}%",
        _ratio(buffer_ratios),
    ]
    if "again" in runs:  # the A/A control: the original's second run over its first
        row.append(_ratio([at / ot for (ot, _), (at, _) in zip(o, runs["again"], strict=True)]))
    return row


def _ratio(ratios: list[float]) -> str:
    """The median ratio, with the range of the per-round ratios when there are several."""
    spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    return fmt_ratio(statistics.median(ratios)) + spread


def notes_for(rounds: int, threads: int, clock_name: str = "wall") -> str:
    return (
        f"{rounds} round(s), interleaved (the order rotates per round); seconds: median of the "
        "rounds; ratios: median of the per-round ratios (range in brackets); buffer share: time inside "
        "the buffer's calls / the loop's time; buffer time: the seconds inside the buffer's calls, "
        "xpbank's over the original's (the rest of the loop is the same work, so this is the ratio the "
        f"buffer decides; the whole-loop ratio also carries the machine's load). torch threads: {threads}; "
        f"clock: {clock_name}."
    )


CONTROL_HEADER = "A/A: original again / original (range)"
HEADERS = [
    "loop",
    "original buffer",
    "original s",
    "xpbank s",
    "xpbank / original (range)",
    "buffer share, original",
    "buffer share, xpbank",
    "buffer time, xpbank / original (range)",
]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    set_clock(args.clock)
    warnings.filterwarnings("ignore")
    logging.getLogger("torchrl").setLevel(logging.ERROR)
    freeze_heap()
    chosen = {k: v for k, v in cases(args).items() if args.only is None or args.only in k}
    runs: dict[str, dict[str, list[tuple[float, float]]]]
    who_runs = ["original", "xpbank"] + ["again"] * args.control
    runs = {k: {who: [] for who in who_runs} for k in chosen}
    for name in chosen:  # warm-up, not reported: imports, env registration, torch's first calls
        log(f"warm-up: {name}")
        for xp in (False, True):
            warm_up(name, xp)
    for r in range(args.rounds):
        for name, (_, run) in chosen.items():
            shift = r % len(who_runs)  # rotate who goes first
            for who in who_runs[shift:] + who_runs[:shift]:
                total, buffer = run(who == "xpbank")
                runs[name][who].append((total, buffer))
                log(f"round {r} {name} {who}: {total:.2f} s, buffer {buffer:.2f} s")
    rows = [summarize(name, chosen[name][0], runs[name]) for name in chosen]
    notes = notes_for(args.rounds, args.threads, args.clock)
    headers = HEADERS + [CONTROL_HEADER] * args.control
    if args.control:
        notes += (
            " A/A: the original buffer's loop run a second time in the same round; its ratio is the "
            "spread of the measurement itself (a whole-loop ratio within it is no difference)."
        )
    print("## Whole training loops: the peer's own buffer vs xpbank's\n")
    print(markdown_table(headers, rows) + "\n\n" + notes)
    if args.json:
        from importlib.metadata import version

        import gymnasium
        import rsl_rl  # noqa: F401
        import stable_baselines3

        versions = {
            "xpbank": xpbank.__version__,
            "stable_baselines3": stable_baselines3.__version__,
            "gymnasium": gymnasium.__version__,
            "rsl-rl-lib": version("rsl-rl-lib"),
            "torchrl": version("torchrl"),
        }
        out = {
            "benchmark": "bench_in_loop",
            "command": "PYTHONPATH=src python benchmarks/bench_in_loop.py " + " ".join(sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "environment": environment(versions),
            "tables": [{"title": "Whole training loops", "headers": headers, "rows": rows, "notes": notes}],
            "runs": runs,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
