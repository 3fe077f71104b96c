"""RayWriter's batching and routing, against a fake link that records what would be sent."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

pytest.importorskip("ray")

from xpbank import Field, ShardUnavailableError, Spec, SpecError
from xpbank.distributed.ray.writer import RayWriter

SPEC = Spec({"obs": Field((4,), torch.float32), "env_id": Field((), torch.int64)})
ROW_BYTES = 4 * 4 + 8


class FakeLink:
    """Records every flush instead of calling actors; ``down`` shards answer an error."""

    def __init__(self, num_shards: int, down: frozenset[int] = frozenset()):
        self.num_shards, self.down = num_shards, down
        self.sent: list[dict[int, dict[Any, torch.Tensor]]] = []
        self.admitted: list[int] = []

    def admit_insert(self, n: int) -> None:
        self.admitted.append(n)

    def call_each(self, calls: dict[int, tuple[str, tuple[Any, ...]]]) -> dict[int, Any]:
        self.sent.append({s: args[0] for s, (method, args) in calls.items() if method == "extend"})
        return {
            s: ShardUnavailableError(f"shard {s} is down")
            if s in self.down
            else {"first": 0, "count": args[0]["obs"].shape[0]}
            for s, (_, args) in calls.items()
        }


def batch(n: int, envs: int, start: int = 0) -> dict[str, torch.Tensor]:
    obs = torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1).expand(n, 4)
    return {"obs": obs, "env_id": torch.arange(start, start + n) % envs}


def test_rows_of_one_env_go_to_one_shard_in_order() -> None:
    link = FakeLink(3)
    writer = RayWriter(link, SPEC, 0, pinned=False, flush_bytes=1 << 20)
    for step in range(4):
        writer.extend(batch(5, envs=5, start=5 * step))  # envs 0..4, time-major steps
    assert link.sent == [] and writer.pending == 20
    assert writer.flush() == 20
    (sent,) = link.sent
    for s, part in sent.items():
        assert (part["env_id"] % 3 == s).all()
        for env in part["env_id"].unique().tolist():  # each env's rows in the order written
            mine = part["obs"][part["env_id"] == env, 0]
            assert torch.equal(mine, torch.arange(env, 20, 5, dtype=torch.float32))
    assert sorted(torch.cat([p["obs"][:, 0] for p in sent.values()]).tolist()) == list(range(20))
    assert link.admitted == [20] and writer.pending == 0


def test_a_flush_happens_once_flush_bytes_are_pending() -> None:
    link = FakeLink(2)
    writer = RayWriter(link, SPEC, 0, pinned=False, flush_bytes=10 * ROW_BYTES)
    writer.extend(batch(9, envs=2))
    assert link.sent == []
    writer.extend(batch(1, envs=2, start=9))
    assert len(link.sent) == 1 and writer.pending == 0
    assert sum(p["obs"].shape[0] for p in link.sent[0].values()) == 10


def test_without_an_env_field_extends_take_turns_or_stay_pinned() -> None:
    spec = Spec({"obs": Field((4,), torch.float32)})
    link = FakeLink(3)
    turns = RayWriter(link, spec, 1, pinned=False, flush_bytes=1)  # flush at every extend
    for _ in range(4):
        turns.extend({"obs": torch.zeros(2, 4)})
    assert [sorted(sent) for sent in link.sent] == [[1], [2], [0], [1]]
    link.sent.clear()
    pinned = RayWriter(link, spec, 4, pinned=True, flush_bytes=1)
    for _ in range(3):
        pinned.extend({"obs": torch.zeros(2, 4)})
    assert [sorted(sent) for sent in link.sent] == [[1], [1], [1]]  # writer 4 % 3


def test_queued_rows_are_copies() -> None:
    link = FakeLink(1)
    writer = RayWriter(link, Spec({"obs": Field((4,), torch.float32)}), 0, pinned=False, flush_bytes=1 << 20)
    obs = torch.zeros(3, 4)
    writer.extend({"obs": obs})
    obs += 1
    writer.flush()
    assert torch.equal(link.sent[0][0]["obs"], torch.zeros(3, 4))


@pytest.mark.parametrize(
    ("bad", "msg"),
    [
        ({"obs": torch.zeros(2, 3), "env_id": torch.zeros(2, dtype=torch.int64)}, r"field 'obs'.*\(\*, 4\)"),
        ({"obs": torch.zeros(2, 4)}, r"missing.*env_id"),
        ({"obs": torch.zeros(2, 4), "env_id": torch.tensor([0, -1])}, r"field 'env_id' \(env id\): .*got -1"),
        ({"obs": torch.zeros(2, 4), "env_id": torch.tensor([0.0, 1.0])}, r"field 'env_id'"),
    ],
)
def test_a_bad_batch_raises_and_queues_nothing(bad: dict[str, torch.Tensor], msg: str) -> None:
    link = FakeLink(2)
    writer = RayWriter(link, SPEC, 0, pinned=False, flush_bytes=1 << 20)
    writer.extend(batch(3, envs=2))
    with pytest.raises(SpecError, match=msg):
        writer.extend(bad)
    assert writer.pending == 3
    writer.flush()
    assert sum(p["obs"].shape[0] for p in link.sent[0].values()) == 3


def test_rows_for_a_down_shard_are_counted_lost() -> None:
    link = FakeLink(2, down=frozenset({1}))
    writer = RayWriter(link, SPEC, 0, pinned=False, flush_bytes=1 << 20)
    writer.extend(batch(6, envs=2))
    assert writer.flush() == 3
    assert writer.lost == [0, 3]


def test_a_lazy_spec_comes_from_the_first_batch_and_pickling_needs_an_empty_queue() -> None:
    link = FakeLink(2)
    writer = RayWriter(link, None, 0, pinned=False, flush_bytes=1 << 20)
    writer.extend(batch(2, envs=2))
    assert writer.spec == SPEC
    with pytest.raises(SpecError, match=r"writer: 2 rows are still pending; call flush\(\)"):
        pickle.dumps(writer)
    with pytest.raises(SpecError, match=r"'index'"):
        RayWriter(link, None, 0, pinned=False, flush_bytes=1).extend({"index": torch.zeros(2)})
