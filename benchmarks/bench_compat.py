"""Compat front-ends in the training loop: rsl_rl's and metta's storage calls, xpbank against the originals.

Every row times one call of the original and of xpbank's drop-in in the same process,
in interleaved rounds (the order flips every round; garbage collected before each
block), on identical inputs, and reports the ratio ``xpbank / original`` per round as a
range (min-max) and its median: below 1.00x xpbank is faster. Each row also checks that
both give the same result (bit for bit where the row says so).

- rsl_rl (rsl-rl-lib's ``RolloutStorage`` against ``xpbank.compat.rsl_rl.RolloutStorage``),
  ``E`` envs x 24 steps, obs float32[48], actions float32[12], two distribution
  parameters: ``add_transition`` (per call); returns by rsl_rl's own
  ``PPO.compute_returns`` over each storage (timed in blocks of 10 calls; the same
  operations on tensors of the same shapes and strides on both sides), with an A/A row:
  a second rsl_rl storage timed in the same rounds, whose ratio is the row's noise floor;
  ``mini_batch_generator`` (5 epochs x 4, every field read; xpbank's default order and
  ``parity=True``); ``recurrent_mini_batch_generator`` (an LSTM actor's and a GRU
  critic's states stored; 5 x 4); a whole PPO iteration (rsl_rl's ``PPO``: act +
  process_env_step x 24, compute_returns, update; MLP and recurrent models, a synthetic
  env), with an A/A row: a second rsl_rl PPO on rsl_rl's own storage timed as the others,
  whose ratio is the rows' noise floor (the networks are ~90% of an iteration).
- metta: ``xpbank.compat.metta.Experience.store`` against metta's write (a TensorDict
  ``[segments, bptt]`` written with ``update_at_`` at each agent's row and time index),
  and a minibatch read as metta's losses do (``buffer[idx]``).

    PYTHONPATH=src python benchmarks/bench_compat.py --threads 1 [--quick] [--clock thread] [--json PATH]

No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import clock, environment, freeze_heap, log, markdown_table, median, set_clock, settle
from xpbank import Field, Spec
from xpbank.compat.metta import Experience
from xpbank.compat.rsl_rl import RolloutStorage

T, OBS, ACT, EPOCHS, MINIBATCHES, GAMMA, LAM = 24, 48, 12, 5, 4, 0.99, 0.95


def interleaved(fns: dict[str, Callable[[], float]], rounds: int, reps: int = 3) -> dict[str, list[float]]:
    """Seconds per call of each ``fn`` (it times itself), round by round, the order flipped
    each round; a round's number is the fastest of ``reps`` blocks (the least disturbed)."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else reversed(list(fns)):
            settle()
            out[name].append(min(fns[name]() for _ in range(reps)))
    return out


def ratio_cells(base: list[float], ours: list[float]) -> list[str]:
    ratios = [b / a for a, b in zip(base, ours, strict=True)]
    return [
        f"{median(base) * 1e6:,.1f} µs",
        f"{median(ours) * 1e6:,.1f} µs",
        f"{min(ratios):.2f}-{max(ratios):.2f}x",
        f"{median(ratios):.2f}x",
    ]


def timed(fn: Callable[[], object], per: int = 1) -> Callable[[], float]:
    def run() -> float:
        start = clock()
        fn()
        return (clock() - start) / per

    return run


# -- rsl_rl ------------------------------------------------------------------------------
def transitions(e: int, recurrent: bool, seed: int = 0) -> list[Any]:
    from rsl_rl.storage import RolloutStorage as Ref

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(T):
        tr = Ref.Transition()
        tr.observations = TensorDict({"policy": torch.randn(e, OBS, generator=g)}, batch_size=[e])
        tr.actions = torch.randn(e, ACT, generator=g)
        tr.rewards, tr.values = torch.randn(e, generator=g), torch.randn(e, 1, generator=g)
        tr.dones = (torch.rand(e, generator=g) < 0.05).float()
        tr.actions_log_prob = torch.randn(e, generator=g)
        tr.distribution_params = (torch.randn(e, ACT, generator=g), torch.rand(e, ACT, generator=g))
        if recurrent:  # an LSTM actor (h, c) and a GRU critic, 1 layer of 64
            h = [torch.randn(1, e, 64, generator=g) for _ in range(3)]
            tr.hidden_states = ((h[0], h[1]), h[2])
        out.append(tr)
    return out


class FixedCritic:
    """A critic whose value of the last observation is given (rsl_rl's critic calls)."""

    def __init__(self, last: torch.Tensor) -> None:
        self.last = last

    def __call__(self, obs: Any) -> torch.Tensor:
        return self.last

    def get_hidden_state(self) -> None:
        return None

    def reset(self, hidden_state: Any = None) -> None:
        return None


def ppo_steps(e: int) -> list[tuple[TensorDict, torch.Tensor, torch.Tensor]]:
    """A synthetic env's ``T`` steps of ``e`` envs: (observations, rewards, dones), seeded."""
    g = torch.Generator().manual_seed(0)
    return [
        (
            TensorDict({"policy": torch.randn(e, OBS, generator=g)}, [e]),
            torch.randn(e, generator=g),
            (torch.rand(e, generator=g) < 0.05).float(),
        )
        for _ in range(T)
    ]


def make_ppo(obs0: TensorDict, recurrent: bool, storage: Any, switch: bool = False, **kw: Any) -> Any:
    """rsl_rl's PPO over ``storage`` (``switch``: ``xpbank.compat.rsl_rl.PPO``, the runner's
    one-line switch): MLP or recurrent actor and critic, made after ``torch.manual_seed(0)``
    (the same networks for every storage)."""
    from rsl_rl.algorithms import PPO as RslPPO

    from xpbank.compat.rsl_rl import PPO as SwitchPPO

    PPO = SwitchPPO if switch else RslPPO
    from rsl_rl.models import MLPModel, RNNModel
    from rsl_rl.modules.distribution import GaussianDistribution

    torch.manual_seed(0)
    groups = {"actor": ["policy"], "critic": ["policy"]}
    dist = {"class_name": GaussianDistribution}
    if recurrent:
        actor = RNNModel(
            obs0, groups, "actor", ACT, hidden_dims=[64], distribution_cfg=dist, rnn_hidden_dim=64
        )
        critic = RNNModel(obs0, groups, "critic", 1, hidden_dims=[64], rnn_type="gru", rnn_hidden_dim=64)
    else:
        actor = MLPModel(obs0, groups, "actor", ACT, hidden_dims=[64, 64], distribution_cfg=dist)
        critic = MLPModel(obs0, groups, "critic", 1, hidden_dims=[64, 64])
    return PPO(actor, critic, storage, num_mini_batches=MINIBATCHES, **kw)


def stub_ppo(st: Any, last: torch.Tensor) -> Any:
    """What rsl_rl's ``PPO.compute_returns`` reads of its ``self``: the storage, the
    critic (its value of the last observation), gamma, lam."""
    return SimpleNamespace(
        storage=st, critic=FixedCritic(last), gamma=GAMMA, lam=LAM, normalize_advantage_per_mini_batch=False
    )


def filled(cls: Any, trs: list[Any], **kw: Any) -> Any:
    """A storage holding ``trs``, its returns computed by rsl_rl's PPO."""
    from rsl_rl.algorithms import PPO

    e = trs[0].observations.batch_size[0]
    st = cls("rl", e, T, trs[0].observations, [ACT], **kw)
    for tr in trs:
        st.add_transition(tr)
    PPO.compute_returns(stub_ppo(st, torch.linspace(-1, 1, e).unsqueeze(1)), None)
    return st


def batches_equal(a: Any, b: Any) -> bool:
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, tuple):
            return all(same(p, q) for p, q in zip(x, y, strict=True))
        if x is None or y is None:
            return x is y
        if isinstance(x, TensorDict):
            return all(torch.equal(x[k], y[k]) for k in x.keys())  # noqa: SIM118 (iterating a TensorDict gives rows)
        return torch.equal(x, y)

    names = ["observations", "actions", "values", "advantages", "returns", "old_actions_log_prob"]
    names += ["old_distribution_params", "hidden_states", "masks"]
    return all(same(getattr(a, n), getattr(b, n)) for n in names)


def read_all(gen: Any) -> int:
    n = 0
    for b in gen:  # every field touched, as PPO's update does
        for x in (
            b.observations["policy"],
            b.actions,
            b.values,
            b.advantages,
            b.returns,
            *b.old_distribution_params,
        ):
            x.sum()
        n += 1
    return n


def rsl_rows(e: int, rounds: int) -> list[list[str]]:
    from rsl_rl.algorithms import PPO
    from rsl_rl.storage import RolloutStorage as Ref

    from xpbank.compat.rsl_rl import PPO as SwitchPPO

    rows = []
    trs = transitions(e, recurrent=False)
    obs = trs[0].observations
    ref, ours = Ref("rl", e, T, obs, [ACT]), RolloutStorage("rl", e, T, obs, [ACT], seed=0)

    def fill(st: Any) -> None:
        st.clear()
        for tr in trs:
            st.add_transition(tr)

    fill(ref), fill(ours)
    same = all(
        torch.equal(getattr(ref, n), getattr(ours, n)) for n in ("actions", "rewards", "dones", "values")
    )
    t = interleaved({"ref": timed(lambda: fill(ref), T), "xp": timed(lambda: fill(ours), T)}, rounds)
    rows.append([f"add_transition, {e} envs", *ratio_cells(t["ref"], t["xp"]), _eq(same)])

    last = torch.linspace(-1, 1, e).unsqueeze(1)
    control = Ref("rl", e, T, obs, [ACT])  # A/A: a second rsl_rl storage, the row's noise floor
    fill(control)
    pr, px, pc = stub_ppo(ref, last), stub_ppo(ours, last), stub_ppo(control, last)
    PPO.compute_returns(pr, None), PPO.compute_returns(px, None), PPO.compute_returns(pc, None)
    same = torch.equal(ref.returns, ours.returns) and torch.equal(ref.advantages, ours.advantages)
    on_switch = RolloutStorage("rl", e, T, obs, [ACT], seed=0)
    fill(on_switch)
    switched = stub_ppo(on_switch, last)  # the switch's PPO.compute_returns (one compiled pass)
    SwitchPPO.compute_returns(switched, None)
    same_switch = torch.equal(ref.returns, switched.storage.returns)
    same_switch &= torch.equal(ref.advantages, switched.storage.advantages)
    k = 10  # a block of calls per timing: one call (~0.7 ms) is too short to time alone
    t = interleaved(
        {
            "ref": timed(lambda: [PPO.compute_returns(pr, None) for _ in range(k)], k),
            "xp": timed(lambda: [PPO.compute_returns(px, None) for _ in range(k)], k),
            "switch": timed(lambda: [SwitchPPO.compute_returns(switched, None) for _ in range(k)], k),
            "control": timed(lambda: [PPO.compute_returns(pc, None) for _ in range(k)], k),
        },
        rounds,
    )
    rows.append(
        [f"returns: rsl_rl's PPO.compute_returns, {e} envs", *ratio_cells(t["ref"], t["xp"]), _eq(same)]
    )
    rows.append(
        [
            f"returns: xpbank.compat.rsl_rl.PPO (the runner switch), {e} envs",
            *ratio_cells(t["ref"], t["switch"]),
            _eq(same_switch),
        ]
    )
    rows.append(
        [
            f"returns, A/A: rsl_rl's storage twice, {e} envs",
            *ratio_cells(t["ref"], t["control"]),
            "noise floor (no xpbank)",
        ]
    )

    parity = filled(RolloutStorage, trs, parity=True)
    torch.manual_seed(3)
    a = list(ref.mini_batch_generator(MINIBATCHES, EPOCHS))
    torch.manual_seed(3)
    same = all(
        batches_equal(x, y) for x, y in zip(a, parity.mini_batch_generator(MINIBATCHES, EPOCHS), strict=True)
    )
    k = EPOCHS * MINIBATCHES
    t = interleaved(
        {
            "ref": timed(lambda: read_all(ref.mini_batch_generator(MINIBATCHES, EPOCHS)), k),
            "xp": timed(lambda: read_all(ours.mini_batch_generator(MINIBATCHES, EPOCHS)), k),
            "parity": timed(lambda: read_all(parity.mini_batch_generator(MINIBATCHES, EPOCHS)), k),
        },
        rounds,
    )
    rows.append([f"mini_batch_generator, {e} envs", *ratio_cells(t["ref"], t["xp"]), "same steps, own order"])
    rows.append([f"mini_batch_generator, parity, {e} envs", *ratio_cells(t["ref"], t["parity"]), _eq(same)])

    rtrs = transitions(e, recurrent=True)
    rref, rours, rpar = (
        filled(Ref, rtrs),
        filled(RolloutStorage, rtrs, seed=0),
        filled(RolloutStorage, rtrs, parity=True),
    )
    same = all(
        batches_equal(x, y)
        for x, y in zip(
            rref.recurrent_mini_batch_generator(MINIBATCHES, 2),
            rpar.recurrent_mini_batch_generator(MINIBATCHES, 2),
            strict=True,
        )
    )
    t = interleaved(
        {
            "ref": timed(lambda: read_all(rref.recurrent_mini_batch_generator(MINIBATCHES, EPOCHS)), k),
            "xp": timed(lambda: read_all(rours.recurrent_mini_batch_generator(MINIBATCHES, EPOCHS)), k),
            "parity": timed(lambda: read_all(rpar.recurrent_mini_batch_generator(MINIBATCHES, EPOCHS)), k),
        },
        rounds,
    )
    rows.append(
        [
            f"recurrent_mini_batch_generator, {e} envs",
            *ratio_cells(t["ref"], t["xp"]),
            "every env, own groups",
        ]
    )
    rows.append(
        [f"recurrent_mini_batch_generator, parity, {e} envs", *ratio_cells(t["ref"], t["parity"]), _eq(same)]
    )
    return rows


def _eq(same: bool) -> str:
    return "bit for bit" if same else "DIFFERENT"


def ppo_rows(e: int, recurrent: bool, rounds: int) -> list[list[str]]:
    """A whole rsl_rl PPO iteration over a synthetic env (random observations and rewards)."""
    from rsl_rl.storage import RolloutStorage as Ref

    steps = ppo_steps(e)
    obs0 = steps[0][0]

    def make(storage_cls: Any, switch: bool = False, **kw: Any) -> Any:
        return make_ppo(obs0, recurrent, storage_cls("rl", e, T, obs0, [ACT], **kw), switch=switch)

    def iteration(ppo: Any) -> None:
        obs = obs0
        with torch.inference_mode():
            for nxt, rew, done in steps:
                ppo.act(obs)
                ppo.process_env_step(nxt, rew, done, {})
                obs = nxt
            ppo.compute_returns(obs)
        ppo.update()

    ref, ours, par = make(Ref), make(RolloutStorage, seed=0), make(RolloutStorage, parity=True)
    control = make(Ref)  # A/A: a second rsl_rl PPO on rsl_rl's storage, the rows' noise floor
    switch = make(RolloutStorage, switch=True, parity=True)  # xpbank.compat.rsl_rl:PPO, the runner's switch
    for algo in (ref, par, switch):  # one iteration each from the same networks and seed
        torch.manual_seed(5)
        iteration(algo)
    params = {name: list(algo.actor.parameters()) for name, algo in {"parity": par, "switch": switch}.items()}
    same = {
        name: all(torch.equal(a, b) for a, b in zip(ref.actor.parameters(), theirs, strict=True))
        for name, theirs in params.items()
    }
    t = interleaved(
        {
            "ref": timed(lambda: iteration(ref)),
            "xp": timed(lambda: iteration(ours)),
            "parity": timed(lambda: iteration(par)),
            "switch": timed(lambda: iteration(switch)),
            "control": timed(lambda: iteration(control)),
        },
        rounds,
    )
    kind = "recurrent" if recurrent else "MLP"
    return [
        [f"PPO iteration, {kind}, {e} envs", *ratio_cells(t["ref"], t["xp"]), "own minibatch order"],
        [
            f"PPO iteration, {kind}, parity, {e} envs",
            *ratio_cells(t["ref"], t["parity"]),
            "parameters " + _eq(same["parity"]),
        ],
        [
            f"PPO iteration, {kind}, the switch (xpbank.compat.rsl_rl:PPO, parity), {e} envs",
            *ratio_cells(t["ref"], t["switch"]),
            "parameters " + _eq(same["switch"]),
        ],
        [
            f"PPO iteration, {kind}, A/A: rsl_rl's storage twice, {e} envs",
            *ratio_cells(t["ref"], t["control"]),
            "noise floor (no xpbank)",
        ],
    ]


# -- metta -------------------------------------------------------------------------------
def metta_rows(agents: int, bptt: int, rounds: int) -> list[list[str]]:
    segments = 2 * agents
    spec = Spec(
        {
            "env_obs": Field((48,), torch.uint8),
            "actions": Field((2,), torch.int64),
            "rewards": Field(()),
            "values": Field(()),
            "dones": Field(()),
            "act_log_prob": Field(()),
        }
    )
    g = torch.Generator().manual_seed(0)
    steps = [
        TensorDict(
            {k: (torch.rand((agents, *f.shape), generator=g) * 100).to(f.dtype) for k, f in spec.items()},
            [agents],
        )
        for _ in range(2 * bptt)
    ]
    mb = max(1, segments // 8)
    # metta's buffer: ``experience_spec.expand(segments, bptt).to(device).zero()``, a
    # TensorDict on the trainer's device (indexing it makes TensorDicts with that device)
    raw = TensorDict(
        {k: torch.zeros(segments, bptt, *f.shape, dtype=f.dtype) for k, f in spec.items()},
        [segments, bptt],
        device="cpu",
    )

    def raw_fill() -> None:  # metta's store: every agent at (its row, its time index)
        for i, td in enumerate(steps):
            raw.update_at_(td, (torch.arange(agents) + agents * (i // bptt), i % bptt))

    exp = Experience(agents, segments * bptt, bptt, mb * bptt, mb * bptt, spec, "cpu")

    def fill() -> None:
        exp.reset_for_rollout()
        for td in steps:
            exp.store(td, slice(0, agents))

    raw_fill(), fill()
    same = all(torch.equal(raw[k], exp.buffer[k]) for k in spec)
    t = interleaved({"ref": timed(raw_fill, len(steps)), "xp": timed(fill, len(steps))}, rounds)
    rows = [[f"metta Experience.store, {agents} agents", *ratio_cells(t["ref"], t["xp"]), _eq(same)]]
    idx = [torch.randperm(segments, generator=g)[:mb] for _ in range(segments // mb)]
    t = interleaved(
        {
            "ref": timed(lambda: [raw[i]["rewards"].sum() for i in idx], len(idx)),
            "xp": timed(lambda: [exp.buffer[i]["rewards"].sum() for i in idx], len(idx)),
        },
        rounds,
    )
    rows.append([f"metta minibatch buffer[idx], {agents} agents", *ratio_cells(t["ref"], t["xp"]), _eq(same)])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 rounds (seconds)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--clock", choices=["wall", "thread"], default="wall", help="wall time, or this thread's CPU time"
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7; quick 2)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    set_clock(args.clock)
    rounds = args.rounds or (2 if args.quick else 7)
    envs = [16, 256] if args.quick else [16, 256, 4096]
    ppo_runs = (
        [(16, False), (16, True)] if args.quick else [(16, False), (4096, False), (16, True), (256, True)]
    )
    agents = [64] if args.quick else [64, 1024]
    freeze_heap()
    from importlib.metadata import version

    import rsl_rl  # noqa: F401  (its version below)

    env = environment(
        {
            "threads": str(args.threads),
            "rsl-rl-lib": version("rsl-rl-lib"),
            "tensordict": version("tensordict"),
        }
    )
    rows: list[list[str]] = []
    for e in envs:
        log(f"rsl_rl storage: {e} envs x {T} steps")
        rows += rsl_rows(e, rounds)
    ppo: list[list[str]] = []
    for e, recurrent in ppo_runs:
        log(f"rsl_rl PPO iteration: {e} envs, {'recurrent' if recurrent else 'MLP'}")
        ppo += ppo_rows(e, recurrent, rounds)
    metta: list[list[str]] = []
    for a in agents:
        log(f"metta: {a} agents")
        metta += metta_rows(a, 16, rounds)
    head = ["call", "original (median)", "xpbank (median)", "xpbank / original (range)", "median", "result"]
    notes = (
        f"{rounds} interleaved rounds; per call; ratio < 1: xpbank faster; threads={args.threads}; "
        f"clock: {args.clock}"
    )
    tables = [
        {"title": f"rsl_rl storage calls, E envs x {T} steps", "headers": head, "rows": rows, "notes": notes},
        {
            "title": "rsl_rl PPO iteration (rsl_rl's PPO, synthetic env)",
            "headers": head,
            "rows": ppo,
            "notes": notes,
        },
        {"title": "metta Experience (16-step segments)", "headers": head, "rows": metta, "notes": notes},
    ]
    for table in tables:
        print(
            f"## {table['title']}\n\n{markdown_table(table['headers'], table['rows'])}\n\n{table['notes']}\n"
        )
    print(env)
    if args.json:
        result = {
            "benchmark": "bench_compat",
            "command": "PYTHONPATH=src python benchmarks/bench_compat.py " + " ".join(sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "environment": env,
            "tables": tables,
        }
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
