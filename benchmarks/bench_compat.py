"""Compat front-ends benchmark: what the metta and rsl_rl seed APIs cost on xpbank.

- rsl_rl: ``xpbank.compat.rsl_rl.RolloutStorage`` against rsl_rl's own storage, in one
  process, on identical transitions: ``E`` envs x ``T`` steps (4096 x 24; ``--quick``:
  256 x 8), obs float32[48], actions float32[12], two distribution parameters. Phases:
  ``add_transition`` (per call), returns (rsl_rl's ``PPO.compute_returns`` loop over
  each storage's tensors, and xpbank's ``RolloutStorage.compute_returns``),
  ``mini_batch_generator`` (5 epochs x 4, every field touched).
- metta: ``xpbank.compat.metta.Experience`` against a raw TensorDict ``[segments,
  bptt]`` written as metta does (``update_at_`` at the slice's row and time index):
  ``store`` of every agent (per call) and reading every minibatch of segments
  (``buffer[idx]``, metta's losses' way, and xpbank's ``segment_minibatches``).

No timing is asserted anywhere: this prints a markdown report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, fastest_block, fmt_ratio, fmt_us, freeze_heap, log, markdown_table, run_main
from xpbank import Field, Spec
from xpbank.compat.metta import Experience
from xpbank.compat.rsl_rl import RolloutStorage

GAMMA, LAM, EPOCHS, MINIBATCHES = 0.99, 0.95, 5, 4


def _transitions(e: int, t: int) -> list:
    from rsl_rl.storage import RolloutStorage as Ref

    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(t):
        tr = Ref.Transition()
        tr.observations = TensorDict({"policy": torch.randn(e, 48, generator=g)}, batch_size=[e])
        tr.actions = torch.randn(e, 12, generator=g)
        tr.rewards, tr.values = torch.randn(e, generator=g), torch.randn(e, 1, generator=g)
        tr.dones = (torch.rand(e, generator=g) < 0.02).float()
        tr.actions_log_prob = torch.randn(e, generator=g)
        tr.distribution_params = (torch.randn(e, 12, generator=g), torch.rand(e, 12, generator=g))
        out.append(tr)
    return out


def _rsl_returns(st: object, last: torch.Tensor) -> None:
    """rsl_rl's ``PPO.compute_returns`` body (rsl-rl-lib 5.5), over its storage."""
    advantage = 0
    for step in reversed(range(st.num_transitions_per_env)):  # type: ignore[attr-defined]
        nxt = last if step == st.num_transitions_per_env - 1 else st.values[step + 1]  # type: ignore[attr-defined]
        not_done = 1.0 - st.dones[step].float()  # type: ignore[attr-defined]
        delta = st.rewards[step] + not_done * GAMMA * nxt - st.values[step]  # type: ignore[attr-defined]
        advantage = delta + not_done * GAMMA * LAM * advantage
        st.returns[step] = advantage + st.values[step]  # type: ignore[attr-defined]
    adv = st.returns - st.values  # type: ignore[attr-defined]
    st.advantages = (adv - adv.mean()) / (adv.std() + 1e-8)  # type: ignore[attr-defined]


def bench_rsl_rl(e: int, t: int, repeats: int) -> list[list[str]]:
    from rsl_rl.storage import RolloutStorage as Ref

    trs = _transitions(e, t)
    obs = trs[0].observations
    last = torch.randn(e, 1)
    rows = []
    timings = {}
    for name, cls in (("rsl_rl RolloutStorage", Ref), ("xpbank.compat.rsl_rl", RolloutStorage)):
        st = cls("rl", e, t, obs, [12])

        def fill(st=st) -> None:
            st.clear()
            for tr in trs:
                st.add_transition(tr)

        fill()
        add = fastest_block(fill, 3, repeats) / t
        ppo_ret = fastest_block(lambda st=st: _rsl_returns(st, last), 3, repeats)  # PPO.compute_returns
        ret = (
            None
            if cls is Ref
            else fastest_block(lambda st=st: st.compute_returns(last, GAMMA, LAM), 3, repeats)
        )

        def read(st=st) -> None:
            for b in st.mini_batch_generator(MINIBATCHES, EPOCHS):
                assert b.actions.shape[0] == e * t // MINIBATCHES
                for x in (
                    b.observations["policy"],
                    b.values,
                    b.advantages,
                    b.returns,
                    *b.old_distribution_params,
                ):
                    x.sum()

        mb = fastest_block(read, 1, repeats) / (EPOCHS * MINIBATCHES)
        timings[name] = (add, ppo_ret, ret, mb)
    base = timings["rsl_rl RolloutStorage"]
    for name, (add, ppo_ret, ret, mb) in timings.items():
        own = "n/a" if ret is None else fmt_us(ret)
        rows.append(
            [
                name,
                fmt_us(add),
                fmt_us(ppo_ret),
                own,
                fmt_us(mb),
                fmt_ratio(base[0] / add),
                fmt_ratio(base[3] / mb),
            ]
        )
    return rows


def bench_metta(agents: int, bptt: int, repeats: int) -> list[list[str]]:
    segments = 2 * agents
    spec = Spec(
        {"env_obs": Field((48,), torch.uint8), "actions": Field((2,), torch.int64), "rewards": Field(())}
    )
    spec = Spec({**dict(spec.items()), "values": Field(()), "dones": Field(()), "act_log_prob": Field(())})
    g = torch.Generator().manual_seed(0)
    steps = [
        TensorDict(
            {k: (torch.rand((agents, *f.shape), generator=g) * 100).to(f.dtype) for k, f in spec.items()},
            [agents],
        )
        for _ in range(2 * bptt)
    ]
    mb_segments = max(1, segments // 8)

    raw = TensorDict(
        {k: torch.zeros(segments, bptt, *f.shape, dtype=f.dtype) for k, f in spec.items()}, [segments, bptt]
    )

    def raw_fill() -> None:  # metta's store: every agent at (its row, the first agent's time)
        for i, td in enumerate(steps):
            rows = torch.arange(agents) + agents * (i // bptt)
            raw.update_at_(td, (rows, i % bptt))

    exp = Experience(agents, segments * bptt, bptt, mb_segments * bptt, mb_segments * bptt, spec, "cpu")

    def fill() -> None:
        exp.reset_for_rollout()
        for td in steps:
            exp.store(td, slice(0, agents))

    fill()
    idx = [torch.randperm(segments, generator=g)[:mb_segments] for _ in range(segments // mb_segments)]
    store_raw = fastest_block(raw_fill, 3, repeats) / len(steps)
    store = fastest_block(fill, 3, repeats) / len(steps)
    read_raw = fastest_block(lambda: [raw[i]["rewards"].sum() for i in idx], 3, repeats) / len(idx)
    read_view = fastest_block(lambda: [exp.buffer[i]["rewards"].sum() for i in idx], 3, repeats) / len(idx)
    read_mb = fastest_block(
        lambda: [td["rewards"].sum() for td in exp.rollout.segment_minibatches()], 3, repeats
    ) / len(idx)
    return [
        ["raw TensorDict (metta's writes)", fmt_us(store_raw), fmt_us(read_raw), "n/a", "1.00x"],
        [
            "xpbank.compat.metta",
            fmt_us(store),
            fmt_us(read_view),
            fmt_us(read_mb),
            fmt_ratio(store_raw / store),
        ],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    e, t, agents, bptt, repeats = (256, 8, 64, 8, 2) if args.quick else (4096, 24, 1024, 32, 5)
    freeze_heap()
    env = environment({"threads": str(args.threads)})
    log(f"rsl_rl: {e} envs x {t} steps")
    rsl = bench_rsl_rl(e, t, repeats)
    log(f"metta: {agents} agents, bptt {bptt}")
    metta = bench_metta(agents, bptt, repeats)
    print(f"## rsl_rl storage, {e} envs x {t} steps (best of {repeats})\n")
    head = [
        "storage",
        "add_transition",
        "returns (rsl_rl PPO loop)",
        "returns (compute_returns)",
        "minibatch",
        "add speed-up",
        "minibatch speed-up",
    ]
    print(markdown_table(head, rsl))
    print(f"\n## metta Experience, {agents} agents, {2 * agents} segments x {bptt} (best of {repeats})\n")
    print(
        markdown_table(
            ["storage", "store", "minibatch (buffer[idx])", "segment_minibatches", "store speed-up"], metta
        )
    )
    print(f"\n{env}")


if __name__ == "__main__":
    sys.exit(run_main(main))
