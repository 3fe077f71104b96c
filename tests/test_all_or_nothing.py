"""Every write is all-or-nothing: what can fail is refused before the first byte is
written, with an xpbank error naming the field (the "every call all-or-nothing" issue)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xpbank import (
    BatchTypeError,
    CapacityError,
    DeviceError,
    Field,
    FrameStorage,
    MemmapStorage,
    ReplayBuffer,
    RolloutBuffer,
    Spec,
    SpecError,
    TensorStorage,
    XpbankIndexError,
)
from xpbank.spec.cast import is_safe_cast

SPEC = Spec({"obs": Field((2,)), "reward": Field(())})


def _storage(kind: str):
    return TensorStorage(8, SPEC) if kind == "memory" else MemmapStorage(8, spec=SPEC)


def _filled(kind: str) -> ReplayBuffer:
    rb = ReplayBuffer(8, SPEC, storage=_storage(kind))
    rb.extend({"obs": torch.arange(8.0).view(4, 2), "reward": torch.arange(4.0)})
    return rb


def _snapshot(rb: ReplayBuffer):
    td = rb.sample_all()
    return len(rb), rb._ring.next_id, td["obs"].clone(), td["reward"].clone()


def _same(a, b) -> None:
    assert a[:2] == b[:2]
    assert torch.equal(a[2], b[2]) and torch.equal(a[3], b[3])


BAD = [
    (
        lambda: torch.zeros(2, device="meta"),
        DeviceError,
        r"field 'reward': expected a tensor on the CPU .* got device 'meta'",
    ),
    (
        lambda: torch.zeros(2).to_sparse(),
        BatchTypeError,
        r"field 'reward': expected a dense \(strided\) tensor, got a torch.sparse_coo",
    ),
    (lambda: torch.zeros(2).to_mkldnn(), BatchTypeError, r"field 'reward': .* got a torch._mkldnn layout"),
    (
        lambda: torch.nested.nested_tensor([torch.zeros(()), torch.zeros(())]),
        BatchTypeError,
        r"field 'reward': expected a dense \(strided\) tensor, got a nested tensor",
    ),
    (
        lambda: torch._efficientzerotensor(2),
        BatchTypeError,
        r"field 'reward': expected a tensor with data, got an efficient zero tensor",
    ),
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", ["memory", "memmap"])
@pytest.mark.parametrize(("make", "error", "match"), BAD)
def test_uncopyable_tensor_leaves_buffer_unchanged(kind, make, error, match):
    rb = _filled(kind)
    before = _snapshot(rb)
    with pytest.raises(error, match=match):  # obs comes first and would be written first
        rb.extend({"obs": torch.full((2, 2), -1.0), "reward": make()})
    _same(_snapshot(rb), before)
    with pytest.raises(error, match=match):
        rb.update([0, 1], {"obs": torch.full((2, 2), -1.0), "reward": make()})
    _same(_snapshot(rb), before)


@pytest.mark.parametrize("kind", ["memory", "memmap"])
def test_uncopyable_add_leaves_buffer_unchanged(kind):
    rb = _filled(kind)
    before = _snapshot(rb)
    with pytest.raises(DeviceError, match="field 'reward'"):
        rb.add({"obs": torch.full((2,), -1.0), "reward": torch.zeros((), device="meta")})
    with pytest.raises(BatchTypeError, match="field 'obs'"):
        rb.add({"obs": torch.zeros(2).to_sparse(), "reward": torch.zeros(())})
    _same(_snapshot(rb), before)


def test_uncopyable_lazy_first_write_leaves_no_spec():
    rb = ReplayBuffer(8)
    with pytest.raises(DeviceError, match="field 'reward'"):
        rb.extend({"obs": torch.zeros(2, 2), "reward": torch.zeros(2, device="meta")})
    assert rb.spec is None and len(rb) == 0
    rb.extend({"obs": torch.zeros(2, 3), "reward": torch.zeros(2)})  # a fresh layout is taken
    assert rb.spec["obs"].shape == (3,)


def test_frame_storage_refuses_meta_before_writing():
    rb = ReplayBuffer(16, storage=FrameStorage(16, stacked=False), num_envs=1)
    frame = torch.zeros(1, 2, 2, dtype=torch.uint8)
    item = {"obs": frame, ("next", "obs"): frame + 1, "terminated": torch.zeros(1, dtype=torch.bool)}
    rb.extend(item)
    with pytest.raises(DeviceError, match="field 'terminated'"):
        rb.extend({**item, "terminated": torch.zeros(1, dtype=torch.bool, device="meta")})
    assert len(rb) == 1 and rb._ring.next_id == 1


def test_rollout_first_add_refused_leaves_spec_unset():
    rb = RolloutBuffer(num_envs=2, horizon=2)
    with pytest.raises(DeviceError, match="field 'reward'"):
        rb.add({"obs": torch.zeros(2, 3), "reward": torch.zeros(2, device="meta")})
    assert rb.spec is None
    with pytest.raises(BatchTypeError, match="field 'obs'"):
        rb.add({"obs": torch.zeros(2, 3).to_sparse(), "reward": torch.zeros(2)})
    assert rb.spec is None
    rb.add({"obs": torch.zeros(2, 4), "reward": torch.zeros(2)})
    assert rb.spec["obs"].shape == (4,)


# -- unsigned inputs -------------------------------------------------------------------
@pytest.mark.parametrize("positions", [np.array([2**64 - 1], dtype=np.uint64), [2**64 - 1]])
def test_uint64_position_above_int64_is_out_of_range(positions):
    rb = _filled("memory")
    with pytest.raises(XpbankIndexError, match="18446744073709551615 is out of range"):
        rb.sample_by_index(positions)


def test_uint64_positions_and_ids_convert_exactly():
    rb = _filled("memory")
    td = rb.sample_by_index(torch.tensor([3], dtype=torch.uint64))
    assert td["reward"].tolist() == [3.0]
    with pytest.raises(XpbankIndexError, match="out of range"):
        rb.update(np.array([2**63], dtype=np.uint64), {"reward": torch.zeros(1)})
    rb.update(np.array([1], dtype=np.uint64), {"reward": torch.full((1,), 9.0)})
    assert rb.sample_by_index([1])["reward"].tolist() == [9.0]


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_field_is_refused_naming_it(dtype):
    rb = ReplayBuffer(8, Spec({"x": Field((), torch.int64)}))
    if dtype == torch.uint64:  # not every value fits int64: refused by dtype, cast or not
        with pytest.raises(
            SpecError, match=r"field 'x': expected .* int64, got .* uint64; uint16/32/64 are not storable"
        ):
            rb.extend({"x": torch.ones(2, dtype=dtype)})
    else:  # every value fits int64: converted
        rb.extend({"x": np.ones(2, dtype=str(dtype).removeprefix("torch."))})
        assert rb.sample_by_index([0, 1])["x"].dtype == torch.int64
    with pytest.raises(SpecError, match=r"field .x.: expected .* int64, got .*uint16/32/64 are not storable"):
        ReplayBuffer(8, Spec({"x": Field((), torch.int64)}), cast=False).extend(
            {"x": torch.ones(2, dtype=dtype)}
        )
    lazy = ReplayBuffer(8)
    with pytest.raises(
        SpecError, match=f"field 'y': dtype {str(dtype)[6:]} cannot be stored .* storable: bool, uint8"
    ):
        lazy.extend({"y": torch.ones(2, dtype=dtype)})
    assert lazy.spec is None
    with pytest.raises(SpecError, match=r"a field: dtype .* cannot be stored"):
        Field((), dtype)


def test_is_safe_cast_unsigned():
    assert is_safe_cast(torch.uint16, torch.int32) and is_safe_cast(torch.uint32, torch.int64)
    assert not is_safe_cast(torch.uint64, torch.int64) and not is_safe_cast(torch.uint32, torch.int32)
    assert not is_safe_cast(torch.uint16, torch.int16) and is_safe_cast(torch.uint64, torch.float32)


# -- overflowing casts -----------------------------------------------------------------
def test_cast_that_overflows_is_refused():
    rb = _filled("memory")
    before = _snapshot(rb)
    with pytest.raises(SpecError, match=r"field 'obs': value 1e\+300 overflows float32"):
        rb.extend({"obs": torch.full((2, 2), 1e300, dtype=torch.float64), "reward": torch.zeros(2)})
    _same(_snapshot(rb), before)
    rb.extend(
        {
            "obs": torch.tensor([[1.0, float("inf")], [-float("inf"), 2.0]], dtype=torch.float64),
            "reward": torch.zeros(2),
        }
    )  # an infinity given stays one: no overflow
    half = ReplayBuffer(4, Spec({"x": Field((), torch.float16)}))
    with pytest.raises(SpecError, match="field 'x': value 70000 overflows float16"):
        half.extend({"x": torch.tensor([1, 70000], dtype=torch.int32)})
    half.extend({"x": torch.tensor([1, 60000], dtype=torch.int32)})
    assert half.sample_by_index([1])["x"].item() == 60000


# -- sizes past what can be allocated --------------------------------------------------
@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_capacity_past_int64_bytes(storage):
    with pytest.raises(
        CapacityError,
        match=r"capacity.*4611686018427387904 items x \d+ bytes = \d+ bytes; at most 2\*\*63 - 1",
    ):
        ReplayBuffer(2**62, SPEC, storage=storage)


def test_sample_larger_than_memory():
    rb = _filled("memory")
    with pytest.raises(
        CapacityError,
        match=r"sample: batch_size: 1000000000000 items x 28 bytes = .* more than the \d+ bytes "
        r"of memory of device 'cpu'",
    ):
        rb.sample(10**12)
    assert rb.sample(2**20 + 1)["obs"].shape == (2**20 + 1, 2)


# -- Spec.merge both ways --------------------------------------------------------------
def test_merge_as_instance_call_keeps_self():
    extra = Spec({"env_id": Field((), torch.int64)})
    want = ["obs", "reward", "env_id"]
    assert list(SPEC.merge(extra)) == list(Spec.merge(SPEC, extra)) == list(SPEC | extra) == want
    assert list(SPEC.with_field("env_id", Field((), torch.int64))) == want
    with pytest.raises(SpecError, match=r"field 'obs' is .* in base but .* in other"):
        SPEC.merge(Spec({"obs": Field((3,))}), names=["base", "other"])
    with pytest.raises(SpecError, match="field 'reward' is"):
        SPEC.with_field("reward", Field((), torch.int64))
    with pytest.raises(SpecError, match="merge: expected 2 names, got 1"):
        SPEC.merge(extra, names=["one"])
    assert SPEC.with_field("reward", Field(())) == SPEC
    with pytest.raises(TypeError):
        SPEC | {"x": Field(())}


def test_gymnasium_unsigned_boxes_are_stored_widened():
    # a uint16 depth image (uint16 is not storable): int32, and the env's arrays are cast on write
    gym = pytest.importorskip("gymnasium")
    depth = gym.spaces.Box(0, 65535, (2, 3), dtype=np.uint16)
    counts = gym.spaces.Box(0, 2**32 - 1, (2,), dtype=np.uint32)
    spec = Spec.from_gymnasium(gym.spaces.Dict({"depth": depth, "counts": counts}), gym.spaces.Discrete(2))
    assert spec[("obs", "depth")] == Field((2, 3), torch.int32)
    assert spec[("obs", "counts")] == Field((2,), torch.int64)
    rb = ReplayBuffer(4, spec)
    obs = {
        "depth": np.full((1, 2, 3), 65535, dtype=np.uint16),
        "counts": np.full((1, 2), 2**32 - 1, dtype=np.uint32),
    }
    rb.extend(
        {
            "obs": obs,
            "action": np.zeros(1, dtype=np.int64),
            "reward": np.zeros(1, dtype=np.float32),
            "terminated": np.zeros(1, dtype=bool),
            "truncated": np.zeros(1, dtype=bool),
            "next": {"obs": obs},
        }
    )
    got = rb.sample_by_index([0])
    assert got["obs", "depth"].tolist() == [[[65535] * 3] * 2] and got["obs", "counts"].tolist() == [
        [2**32 - 1] * 2
    ]
    with pytest.raises(SpecError, match=r"observation_space: dtype uint64: dtype uint64 cannot be stored"):
        Spec.from_gymnasium(gym.spaces.Box(0, 1, (1,), dtype=np.uint64), gym.spaces.Discrete(2))


@pytest.mark.parametrize("kind", ["memory", "memmap", "one-field"])
def test_conjugate_bit_tensor_is_stored_resolved(kind):
    """NumPy refuses a tensor whose conjugate (``z.conj()``) or negative bit
    (``z.conj().imag``) is set: the copy resolves it, so the values are stored right."""
    spec = Spec({"z": Field((), torch.complex64), "x": Field((), torch.float32)})
    if kind == "one-field":  # one member per block: the per-field copy path
        spec = Spec({"z": Field((), torch.complex64)})
    storage = MemmapStorage(8, spec=spec) if kind == "memmap" else TensorStorage(8, spec)
    rb = ReplayBuffer(8, spec, storage=storage)
    first = {"z": torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64), "x": torch.tensor([0.0, 1.0])}
    rb.extend({k: v for k, v in first.items() if k in spec})
    z = torch.tensor([5 + 6j, 7 + 8j], dtype=torch.complex64).conj()
    second = {"z": z, "x": torch.tensor([2.0, 3.0])}
    rb.extend({k: v for k, v in second.items() if k in spec})
    got = rb.sample_all()
    assert got["z"].tolist() == [1 + 2j, 3 + 4j, 5 - 6j, 7 - 8j]
    if "x" in spec:
        assert got["x"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_negative_bit_tensor_is_stored_resolved():
    """The imaginary part of a conjugate view has its negative bit set (NumPy refuses it too)."""
    spec = Spec({"f": Field((), torch.float32), "x": Field(())})
    rb = ReplayBuffer(4, spec, storage=TensorStorage(4, spec))
    z = torch.tensor([5 + 6j, 7 + 8j], dtype=torch.complex64).conj()
    rb.extend({"f": z.imag, "x": torch.ones(2)})
    assert rb.sample_all()["f"].tolist() == [-6.0, -8.0]
