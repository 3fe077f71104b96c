"""A command line for an agent's config dataclass: one ``--option`` per field.

Example:
    >>> from xpbank.demo.ppo import PPOConfig
    >>> parse_config(PPOConfig, ["--steps", "1000", "--env-id", "Acrobot-v1"]).steps
    1000
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

__all__ = ["parse_config"]

C = TypeVar("C")


def parse_config(cls: type[C], argv: list[str] | None = None, description: str | None = None) -> C:
    """Parse ``argv`` into ``cls`` (a frozen dataclass); defaults and types from its fields."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    defaults = cls()  # type: ignore[call-arg]
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value: Any = getattr(defaults, f.name)
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(value), default=value, help=f.name)
    return cls(**vars(parser.parse_args(argv)))
