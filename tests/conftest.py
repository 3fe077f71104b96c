"""Shared fixtures: factories that build every storage backend and every buffer front-end.

A test that takes ``storage_factory`` (or ``buffer_factory``) runs once per backend, so
one suite covers them all.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bank_cases import small_bank
from helpers import transition_spec
from xpbank import Field, MemmapStorage, ReplayBuffer, Spec, Storage, TensorStorage

StorageFactory = Callable[..., Storage]
BufferFactory = Callable[..., ReplayBuffer]


def _fresh_dirs(root: Path, prefix: str) -> Callable[[], Path]:
    counter = itertools.count()
    return lambda: root / f"{prefix}-{next(counter)}"


@pytest.fixture(params=["tensor", "tensor-unpacked", "memmap"])
def storage_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StorageFactory:
    """``make(capacity, spec=None) -> Storage`` for each storage backend."""
    kind = request.param
    next_dir = _fresh_dirs(tmp_path, "storage")

    def make(capacity: int, spec: Spec | None = None) -> Storage:
        if kind == "tensor":
            return TensorStorage(capacity, spec, pack=True)
        if kind == "tensor-unpacked":
            return TensorStorage(capacity, spec, pack=False)
        return MemmapStorage(capacity, path=next_dir(), spec=spec)

    make.kind = kind  # type: ignore[attr-defined]
    return make


def _ray_param() -> Any:
    """The ``"ray"`` buffer param, skipped with the reason when Ray is not importable."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return pytest.param(
            "ray", marks=pytest.mark.skip(reason="ray is not installed (pip install 'xpbank[ray]')")
        )
    return "ray"


# Tests of the shared buffer suite that cannot apply to a RayReplayBuffer, and why.
_MANY_CALLS = (
    "thousands of sample/epochs calls, each a Ray round trip (several ms on a loaded machine): "
    "past the suite's time budget; a one-shard Ray buffer draws with its shard's local sampler "
    "and generator (these statistics run on the local params), and the draws over several "
    "shards are tested in tests/test_ray.py"
)
RAY_SKIPS: dict[str, str] = {
    "test_epoch_shuffle_puts_every_item_first_equally_often": _MANY_CALLS,
    "test_sampling_without_replacement_includes_each_item_at_rate_k_over_n": _MANY_CALLS,
}


class _RayPool:
    """Shard actors started once per session and reset for each buffer (no start-up per test)."""

    def __init__(self) -> None:
        self.actors: list[Any] = []

    def take(self, count: int, first: int) -> list[Any]:
        from xpbank.distributed.ray import start_shards

        if len(self.actors) < first + count:
            self.actors += start_shards(first + count - len(self.actors))
        return self.actors[first : first + count]


@pytest.fixture(scope="session")
def ray_pool(ray_session: Any) -> Iterator[_RayPool]:
    """Idle shard actors that ``buffer_factory``'s ``"ray"`` buffers reuse (grown on demand)."""
    pool = _RayPool()
    yield pool
    for actor in pool.actors:
        ray_session.kill(actor)


@pytest.fixture(params=["memory", "memmap", "shm", _ray_param()])
def buffer_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BufferFactory]:
    """``make(capacity, spec=None, **kw) -> ReplayBuffer`` for each buffer storage.

    ``"shm"``: a :class:`~xpbank.distributed.shm.ShmReplayBuffer` (with one writer
    channel) used through the ReplayBuffer API. ``"ray"``: a one-shard
    :class:`~xpbank.distributed.ray.RayReplayBuffer` with synchronous writes
    (``flush_bytes=0``) over actors of the session's ``ray_pool`` (tests in
    ``RAY_SKIPS`` are skipped, with their reason).
    """
    kind = request.param
    next_dir = _fresh_dirs(tmp_path, "buffer")
    made: list[Any] = []
    if kind == "ray":
        reason = RAY_SKIPS.get(request.node.originalname)
        if reason is not None:
            pytest.skip(reason)
        pool = request.getfixturevalue("ray_pool")

    def make(capacity: int, spec: Spec | None = None, **kw: Any) -> ReplayBuffer:
        if kind == "ray":
            from xpbank.distributed.ray import RayReplayBuffer

            shards = pool.take(1, first=len(made))
            made.append(
                RayReplayBuffer(
                    1, capacity, spec, flush_bytes=0, shards=shards, checkpoint_dir=next_dir(), **kw
                )
            )
            return made[-1]
        if kind == "shm":
            from xpbank.distributed.shm import ShmReplayBuffer

            made.append(ShmReplayBuffer(capacity, spec, num_writers=1, channel_rows=64, **kw))
            return made[-1]
        storage: str | Storage = "memory" if kind == "memory" else MemmapStorage(capacity, next_dir())
        return ReplayBuffer(capacity, spec, storage=storage, **kw)

    make.kind = kind  # type: ignore[attr-defined]
    yield make
    for rb in made:
        rb.close()


@pytest.fixture
def spec() -> Spec:
    """The default transition spec (obs float32[3])."""
    return transition_spec()


@pytest.fixture
def rich_spec() -> Spec:
    """A spec with every kind of field the storages must keep apart.

    Nested keys, a bool, a uint8 image, a bfloat16, an int8, a float64 and scalars:
    several same-dtype fields share a packed group in a packed TensorStorage.
    """
    return Spec(
        {
            "obs": Field((3,), torch.float32),
            "action": Field((), torch.int64),
            "reward": Field((), torch.float32),
            "terminated": Field((), torch.bool),
            "truncated": Field((), torch.bool),
            "image": Field((2, 4, 4), torch.uint8),
            "logits": Field((5,), torch.bfloat16),
            "small": Field((2,), torch.int8),
            "value": Field((), torch.float64),
            ("next", "obs"): Field((3,), torch.float32),
            ("next", "info", "flag"): Field((), torch.bool),
        }
    )


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray (2 CPUs, no dashboard) for every test that needs it, shut down at the end.

    Ray takes seconds to start and each actor seconds to import xpbank: tests share this.
    """
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def bank(tmp_path: Path) -> Path:
    """A saved transition bank at ``tmp_path / "bank"`` that has wrapped (capacity 8,
    items 3..10 live): :func:`bank_cases.small_bank`."""
    return small_bank(tmp_path / "bank")
