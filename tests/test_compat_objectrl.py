"""xpbank.compat.objectrl against the real objectrl ReplayBuffer on identical inputs.

objectrl needs Python >= 3.12 and many heavy packages; its replay buffer module needs
only torch, tensordict and torchrl. ``make test`` installs it with
``pip install --no-deps --ignore-requires-python objectrl==0.2.0``.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import xpbank
from xpbank.compat.objectrl import ReplayBuffer

objectrl_memory = pytest.importorskip(
    "objectrl.replay_buffers.experience_memory",
    reason="pip install --no-deps --ignore-requires-python objectrl==0.2.0",
)
CPU = torch.device("cpu")


def _batch(lo: int, n: int) -> TensorDict:
    ids = torch.arange(lo, lo + n)
    return TensorDict(
        {
            "obs": torch.stack([ids.float(), -ids.float()], 1),
            "action": ids % 3,
            "reward": ids.float() / 10,
            "done": ids % 4 == 3,
        },
        batch_size=[n],
    )


def _pair(size: int, writes: list[int]) -> tuple[ReplayBuffer, object]:
    ours, theirs = ReplayBuffer(CPU, CPU, size), objectrl_memory.ReplayBuffer(CPU, CPU, size)
    lo = 0
    for n in writes:
        if n == 1:
            item = _batch(lo, 1)[0]
            ours.add(item.clone())
            theirs.add(item.clone())
        else:
            ours.add_batch(_batch(lo, n))
            theirs.add_batch(_batch(lo, n))
        lo += n
    return ours, theirs


FIELDS = ["obs", "action", "reward", "done"]


def _equal(a: TensorDict, b: TensorDict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in FIELDS)


def _physical_to_logical(theirs, positions):
    """objectrl indexes physical slots; position p (0 = oldest) is slot (pointer + p) % size once full."""
    start = theirs.pointer if theirs.data_size == theirs.buffer_size else 0
    return [(start + p) % theirs.buffer_size for p in positions]


# -- the document's examples, as written (imports aside) -------------------------------
def test_document_examples_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train_steps: list[int] = []
    train_step = lambda batch: train_steps.append(len(batch))  # noqa: E731
    single_experience, batch_experience = _batch(0, 1)[0], _batch(1, 200)
    if not torch.cuda.is_available():  # as written, the example trains on CUDA
        with pytest.raises(xpbank.DeviceError, match="'cuda' was asked for, but CUDA is not available"):
            ReplayBuffer(device=torch.device("cuda"), storing_device=torch.device("cpu"), buffer_size=100_000)
    training = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    buffer = ReplayBuffer(
        device=training,  # Training device
        storing_device=torch.device("cpu"),  # Storage device
        buffer_size=100_000,  # Maximum number of transitions
    )
    buffer.add(single_experience)  # Single transition
    buffer.add_batch(batch_experience)  # Batch of transitions
    batch = buffer.sample_batch(64)
    batch = buffer.sample_by_index([0, 5, 9])
    obs_act = buffer.sample_by_index_fields([0, 5], fields=["obs", "action"])
    all_data = buffer.sample_all()
    iterator = buffer.create_epoch_iterator(batch_size=64, n_epochs=5)
    for batch in iterator:
        train_step(batch)
    n_steps = buffer.get_steps_and_iterator(n_epochs=10, max_iter=0, batch_size=64)
    n_steps_iter = buffer.get_steps_and_iterator(
        n_epochs=0,  # Disables epoch-based iterator
        max_iter=1,  # Number of learning updates at each step
        batch_size=64,
    )
    random_batch = buffer.get_next_batch(64)
    (tmp_path / "checkpoints").mkdir()
    buffer.save("checkpoints/buffer")  # Saves to checkpoints/buffer.metadata
    buffer.load("checkpoints/buffer")  # Loads metadata only

    assert batch.device.type == training.type and obs_act[0].shape == (2, 2) and obs_act[1].tolist() == [0, 2]
    assert len(all_data) == 201 and train_steps == [64, 64, 64, 9] * 5
    assert (n_steps, n_steps_iter, random_batch.batch_size) == (40, 1, torch.Size([64]))
    assert len(buffer) == buffer.size == 201  # print(len(buffer)) / print(buffer.size)
    assert _equal(buffer.sample_all(), all_data)  # load restored the contents, not only metadata


# -- differential: the same inputs, the same outputs -----------------------------------
WRITES = [[1], [5, 1, 1], [3, 7], [12], [1, 1, 1, 1, 1, 1, 1, 1, 1]]


@pytest.mark.parametrize("writes", WRITES)
def test_status_matches(writes):
    ours, theirs = _pair(8, writes)
    assert (len(ours), ours.size, ours.data_size, ours.pointer, ours.buffer_size) == (
        len(theirs),
        theirs.size,
        theirs.data_size,
        theirs.pointer,
        theirs.buffer_size,
    )
    for bs in (1, 3, 8, 50):
        assert ours.calculate_num_batches(bs) == theirs.calculate_num_batches(bs)
    for n_epochs, max_iter in [(0, 7), (1, 0), (3, 5)]:
        assert ours.get_steps_and_iterator(n_epochs, max_iter, 3) == theirs.get_steps_and_iterator(
            n_epochs, max_iter, 3
        )


@pytest.mark.parametrize("writes", WRITES)
def test_sample_by_index_and_all_match_after_mapping_slots(writes):
    ours, theirs = _pair(8, writes)
    n = len(ours)
    positions = list(range(n))[::-1]
    for idx in (positions, torch.tensor(positions), range(n)):
        want = list(idx)
        got = ours.sample_by_index(idx)
        assert _equal(got, theirs.sample_by_index(_physical_to_logical(theirs, want)))
    assert _equal(ours.sample_all(), theirs.sample_by_index(_physical_to_logical(theirs, range(n))))
    full = theirs.data_size == theirs.buffer_size and theirs.pointer != 0
    assert _equal(ours.sample_all(), theirs.sample_all()) != full  # same unless wrapped mid-ring


@pytest.mark.parametrize("writes", WRITES)
def test_sample_by_index_fields(writes):
    ours, theirs = _pair(8, writes)
    positions = [0, len(ours) - 1]
    want = theirs.sample_by_index(_physical_to_logical(theirs, positions))
    obs, action = ours.sample_by_index_fields(positions, fields=["obs", "action"])
    assert torch.equal(obs, want["obs"]) and torch.equal(action, want["action"])
    assert torch.equal(ours.sample_by_index_fields(positions, fields=["reward"]), want["reward"])
    with pytest.raises(RuntimeError):  # objectrl's documented call fails: select() wants *keys
        theirs.sample_by_index_fields(positions, fields=["obs", "action"])
    with pytest.raises(xpbank.SpecError, match=r"fields: unknown field\(s\) \['nope'\]"):
        ours.sample_by_index_fields(positions, fields=["nope"])


@pytest.mark.parametrize("writes", [[7], [1, 1, 1, 1, 1]])
@pytest.mark.parametrize(("bs", "epochs"), [(2, 1), (3, 2), (10, 1)])
def test_epoch_iterators_match_before_the_ring_wraps(writes, bs, epochs):
    ours, theirs = _pair(8, writes)
    a, b = list(ours.create_epoch_iterator(bs, epochs)), list(theirs.create_epoch_iterator(bs, epochs))
    assert len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    ours.get_steps_and_iterator(epochs, 0, bs)
    theirs.get_steps_and_iterator(epochs, 0, bs)
    for y in b:
        assert _equal(ours.get_next_batch(bs), theirs.get_next_batch(bs)) and len(y)
    with pytest.raises(StopIteration):
        ours.get_next_batch(bs)
    with pytest.raises(StopIteration):
        theirs.get_next_batch(bs)


def test_epoch_iterator_after_wrap_is_oldest_first():
    ours, _ = _pair(8, [5, 6])  # items 3..10 stored
    got = torch.cat([b["action"] for b in ours.create_epoch_iterator(3)])
    assert got.tolist() == [i % 3 for i in range(3, 11)]


def test_sample_batch_shapes_keys_and_values_match():
    ours, theirs = _pair(8, [5, 6])
    a, b = ours.sample_batch(64), theirs.sample_batch(64)
    assert set(a.keys()) == set(b.keys()) == {*FIELDS, "index"}
    assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in FIELDS)
    stored = {tuple(r.tolist()) for r in ours.sample_all()["obs"]}
    assert {tuple(r.tolist()) for r in a["obs"]} <= stored
    assert {tuple(r.tolist()) for r in ours.sample_random(64)["obs"]} <= stored


def test_reset_matches_and_resizes():
    ours, theirs = _pair(8, [5])
    ours.reset(buffer_size=3)
    theirs.reset(buffer_size=3)
    ours.add_batch(_batch(0, 5))
    theirs.add_batch(_batch(0, 5))
    assert (len(ours), ours.pointer, ours.buffer_size) == (len(theirs), theirs.pointer, theirs.buffer_size)


# -- deliberate differences ----------------------------------------------------------------
def test_get_next_batch_without_iterator_falls_back_to_random():
    ours, theirs = _pair(8, [5])
    assert ours.get_next_batch(4).batch_size == torch.Size([4])
    with pytest.raises(AttributeError):  # objectrl never sets epoch_iterator before this
        theirs.get_next_batch(4)


def test_save_load_restores_contents_where_objectrl_keeps_metadata(tmp_path):
    ours, theirs = _pair(8, [5, 6])
    ours.save(str(tmp_path / "ours"))
    theirs.save(str(tmp_path / "theirs"))
    fresh, fresh_theirs = ReplayBuffer(CPU, CPU, 2), objectrl_memory.ReplayBuffer(CPU, CPU, 2)
    fresh.load(str(tmp_path / "ours"))
    fresh_theirs.load(str(tmp_path / "theirs"))
    meta = (fresh.buffer_size, fresh.data_size, fresh.pointer)
    assert meta == (fresh_theirs.buffer_size, fresh_theirs.data_size, fresh_theirs.pointer) == (8, 8, 3)
    assert _equal(fresh.sample_all(), ours.sample_all())
    fresh.add_batch(_batch(100, 2))  # the cursor came back too: the two oldest go
    assert fresh.sample_all()["action"].tolist()[-3:] == [10 % 3, 100 % 3, 101 % 3]
    with pytest.raises(xpbank.BankError, match=r"theirs\.metadata is objectrl's metadata-only save"):
        fresh.load(str(tmp_path / "theirs"))


def test_bad_batch_leaves_the_buffer_unchanged():
    ours, _ = _pair(8, [5])
    before = ours.sample_all()
    bad = _batch(0, 3)
    bad["obs"] = torch.zeros(3, 5)
    with pytest.raises(xpbank.SpecError, match="obs"):
        ours.add_batch(bad)
    assert (len(ours), ours.pointer) == (5, 5) and _equal(ours.sample_all(), before)
    with pytest.raises(xpbank.CapacityError, match="buffer_size: expected a positive int, got 0"):
        ReplayBuffer(CPU, CPU, 0)


def test_an_add_after_the_epoch_iterator_is_made_raises_at_the_next_batch():
    """The iterator visits the transitions stored when it was made; objectrl's (and the
    old one here) went on reading positions of the new contents after an add."""
    ours = ReplayBuffer(CPU, CPU, 6)
    ours.add_batch(_batch(0, 6))
    batches = ours.create_epoch_iterator(2)
    assert next(batches)["action"].tolist() == [0, 1]
    ours.add_batch(_batch(6, 2))
    with pytest.raises(xpbank.BufferChangedError, match="during iteration"):
        ours.get_next_batch(2)
    assert list(ReplayBuffer(CPU, CPU, 6).create_epoch_iterator(2)) == []  # empty: nothing to visit
