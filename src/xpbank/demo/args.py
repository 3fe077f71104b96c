"""A command line for an agent's config dataclass: one ``--option`` per field.

Example:
    >>> from xpbank.demo.ppo import PPOConfig
    >>> parse_config(PPOConfig, ["--steps", "1000", "--env-id", "Acrobot-v1"]).steps
    1000
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from xpbank.demo.report import NOTE

__all__ = ["parse_config", "run_agent"]

log = logging.getLogger(__name__)

C = TypeVar("C")


def parse_config(cls: type[C], argv: list[str] | None = None, description: str | None = None) -> C:
    """Parse ``argv`` into ``cls`` (a frozen dataclass); defaults and types from its fields."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    defaults = cls()
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value: Any = getattr(defaults, f.name)
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(value), default=value, help=f.name)
    return cls(**vars(parser.parse_args(argv)))


def run_agent(
    train: Callable[[Any], Any], cls: type[Any], argv: list[str] | None, doc: str | None
) -> dict[str, float]:
    """Parse ``argv`` into ``cls``, train with one torch thread, log and return a summary."""
    config = parse_config(cls, argv, doc.splitlines()[0] if doc else None)
    torch.set_num_threads(1)
    result = train(config)
    out = {
        "env_steps": result.env_steps,
        "episodes": len(result.curve),
        "buffer_items": len(result.buffer),
        "final_return": result.final_return,
        "eval_return": result.eval_return,
        "cpu_seconds": result.cpu_seconds,
    }
    seed = getattr(config, "seed", None)
    log.warning("%s, seed %s: %s\n%s Ranges over seeds: docs/demo.md.", cls.__name__, seed, out, NOTE)
    return out
