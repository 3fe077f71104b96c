"""The ``xpbank`` command line (also ``python -m xpbank``).

``xpbank ls | inspect | merge | export | import | plot | verify | bench`` look into
banks (:mod:`xpbank.tools.commands`; the ``cli`` extra: typer, rich, tqdm; ``plot``
needs matplotlib, ``--to/--from minari`` the ``minari`` extra); ``xpbank demo`` trains
agents (the ``demo`` extra). Without an extra a command fails with its ``pip install``
line. ``xpbank --debug CMD`` shows tracebacks instead of one-line errors. A plain
``xpbank ls [--long] [DIR]`` runs without typer (see :func:`main`), so it starts in a
fraction of a second.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from xpbank.errors import MissingExtraError, require

__all__ = ["main", "build_app", "run_demo"]

log = logging.getLogger(__name__)

DEFAULT_OUT = Path("xpbank-demo")
AGENTS = ("dqn", "ppo")


def run_demo(
    env_id: str = "CartPole-v1",
    steps: int | None = None,
    seed: int = 0,
    out: Path = DEFAULT_OUT,
    agents: tuple[str, ...] = AGENTS,
    progress: bool | None = None,
) -> list[Any]:
    """Train the chosen agents, save and reload their replay, print a summary, draw curves.

    Args:
        env_id: a gymnasium env id with discrete actions.
        steps: env steps per agent (default: the agent's tuned default).
        seed: seeds the env, the networks and the buffer.
        out: where the replay bank, the PNG and the summary (``summary.md``) go (created,
            parents too).
        agents: which agents to run.
        progress: show progress bars; default only when stderr is a terminal.

    Returns:
        One :class:`~xpbank.demo.report.AgentSummary` per agent.
    """
    import torch

    from xpbank.demo import dqn, ppo
    from xpbank.demo.report import AgentSummary, plot_curves, summary_markdown, summary_table

    unknown = sorted(set(agents) - set(AGENTS))
    if unknown or not agents:
        raise ValueError(f"agents: expected some of {list(AGENTS)}, got {list(agents)}")
    tqdm = require("tqdm", "demo").tqdm
    show = sys.stderr.isatty() if progress is None else progress
    console = require("rich.console", "demo").Console(width=None if sys.stdout.isatty() else 160)
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    trainers: dict[str, Any] = {"dqn": (dqn.DQNConfig, dqn.train), "ppo": (ppo.PPOConfig, ppo.train)}
    rows, files = [], []
    for agent in agents:
        config_cls, train = trainers[agent]
        config = config_cls(env_id=env_id, seed=seed, **({"steps": steps} if steps else {}))
        with tqdm(total=config.steps, desc=agent, unit="step", disable=not show, leave=False) as bar:

            def tick(done: int, last: float | None, bar: Any = bar) -> None:
                bar.update(done - bar.n)
                if last is not None:
                    bar.set_postfix(last_return=f"{last:.0f}", refresh=False)

            result = train(config, progress=tick)
        bank_bytes = None
        if agent == "dqn":
            path = out / f"{agent}_replay_bank"
            bank_bytes = save_and_reload(result.buffer, path)
            files.append(path)
        rows.append(
            AgentSummary(
                agent=agent.upper(),
                env_id=env_id,
                env_steps=result.env_steps,
                seconds=result.seconds,
                cpu_seconds=result.cpu_seconds,
                buffer_ops=result.buffer_ops,
                buffer_seconds=result.buffer_seconds,
                final_return=result.final_return,
                eval_return=result.eval_return,
                bank_bytes=bank_bytes,
                curve=result.curve,
            )
        )
    files.append(plot_curves(rows, out / "learning_curves.png"))
    files.append(out / "summary.md")  # the table below, beside the PNG
    files[-1].write_text(summary_markdown(rows, seed))
    console.print(summary_table(rows, files, seed))
    return rows


def save_and_reload(buffer: Any, path: Path) -> int:
    """Save the buffer as a bank at ``path``, load it back, check that both sample the
    same items next; returns the bank's size on disk in bytes."""
    import torch

    import xpbank

    xpbank.save(buffer, path)
    fresh = xpbank.load(path)
    if not torch.equal(fresh.sample(64)["index"], buffer.sample(64)["index"]):
        raise RuntimeError(f"{path}: the reloaded bank does not sample what the saved buffer does")
    from xpbank.tools.commands import bank_bytes

    return bank_bytes(Path(path))


def build_app(extra: str = "cli") -> Any:
    """The typer application (needs typer: ``extra`` is the extra a missing one names)."""
    typer = require("typer", extra)
    from xpbank.tools import commands

    app = typer.Typer(
        help="xpbank: the experience store for reinforcement learning.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode=None,  # click's plain help: no "<bool>" metavars on flags
    )

    @app.callback()
    def root(
        debug: bool = typer.Option(False, "--debug", help="show tracebacks instead of one-line errors"),
    ) -> None:
        """xpbank command line."""
        commands.DEBUG["on"] = debug

    @app.command()
    def demo(
        env_id: str = typer.Option("CartPole-v1", "--env-id", help="gymnasium env id (discrete actions)"),
        steps: int = typer.Option(0, "--steps", help="env steps per agent; 0: the tuned default"),
        seed: int = typer.Option(0, "--seed", help="seed of envs, networks and buffers"),
        out: Path = typer.Option(DEFAULT_OUT, "--out", help="output directory"),  # noqa: B008
        agents: str = typer.Option(",".join(AGENTS), "--agents", help=f"comma list of {', '.join(AGENTS)}"),
        progress: bool | None = typer.Option(None, "--progress/--no-progress", help="default: on a terminal"),
    ) -> None:
        """Train agents on experience stored in xpbank; print a summary; draw learning curves."""
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        names = tuple(a.strip() for a in agents.split(",") if a.strip())
        try:
            run_demo(env_id, steps or None, seed, out, names, progress)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc

    commands.register(app, typer)
    return app


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``xpbank`` console script."""
    args = sys.argv[1:] if argv is None else argv
    plain = _plain_ls(args)
    if plain is not None:
        raise SystemExit(_ls(*plain))
    try:
        app = build_app("demo" if "demo" in args else "cli")
    except MissingExtraError as exc:
        sys.stderr.write(f"{exc}\n")
        raise SystemExit(2) from exc
    app(args=argv)


def _plain_ls(args: list[str]) -> tuple[Path, bool] | None:
    """``(directory, long)`` for ``ls [-l | --long] [DIRECTORY]``, else ``None``.

    Those run without typer: it checks every non-flag parameter through pydantic, whose
    import (0.1-0.2 s) would be a third of ``xpbank ls``. Anything else (``--help``,
    ``--debug``, a typo) goes through typer as every other command does.
    """
    if not args or args[0] != "ls":
        return None
    flags = [a for a in args[1:] if a in ("-l", "--long")]
    rest = [a for a in args[1:] if a not in ("-l", "--long")]
    if len(flags) > 1 or len(rest) > 1 or any(a.startswith("-") for a in rest):
        return None
    return Path(rest[0] if rest else "."), bool(flags)


def _ls(directory: Path, long: bool) -> int:
    """``xpbank ls`` as the typer command runs it (errors as one line, status 1)."""
    from xpbank.errors import XpbankError
    from xpbank.tools.listing import cmd_ls

    try:
        cmd_ls(directory, long)
    except MissingExtraError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    except (XpbankError, OSError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    return 0
