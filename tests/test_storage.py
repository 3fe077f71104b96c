"""Storages: one shared suite over every backend, then what is specific to each."""

from __future__ import annotations

import gc
import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import make_batch, transition_spec
from xpbank import CapacityError, DeviceError, Field, MemmapStorage, Spec, SpecError, Storage, TensorStorage
from xpbank.spec.batch import flatten
from xpbank.storage.dtypes import numpy_dtype

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Same dtype, shape and values (bit-exact; no tolerance)."""
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert torch.equal(got.cpu(), want.cpu())


def read_flat(storage: Storage, slots: list[int] | torch.Tensor, keys: list | None = None) -> dict:
    index = torch.as_tensor(slots, dtype=torch.int64)
    td = storage.read(index, keys)
    assert td.batch_size == torch.Size([index.shape[0]])
    return flatten(td)


# -- the shared suite: every storage ----------------------------------------------


def test_every_storage_follows_the_protocol(storage_factory, rich_spec):
    st = storage_factory(8, rich_spec)
    assert isinstance(st, Storage)
    assert st.capacity == 8
    assert st.spec == rich_spec
    assert st.device == torch.device("cpu")


def test_write_slice_then_read_arbitrary_slots(storage_factory, rich_spec):
    st = storage_factory(16, rich_spec)
    st.write(slice(0, 16), make_batch(rich_spec, 16, start=500))  # something to overwrite
    batch = make_batch(rich_spec, 10, start=100)
    st.write(slice(3, 13), batch)

    slots = [12, 3, 7, 7, 4, 2, 13]  # repeated slot, and the neighbours of the written run
    got = read_flat(st, slots)
    before = make_batch(rich_spec, 16, start=500)
    assert set(got) == set(rich_spec)
    for key in rich_spec:
        want = torch.stack([batch[key][s - 3] if 3 <= s < 13 else before[key][s] for s in slots])
        assert_same(got[key], want)


def test_values_of_every_dtype_survive_bit_exact(storage_factory):
    spec = Spec(
        {
            "f32": Field((2,), torch.float32),
            "bf16": Field((3,), torch.bfloat16),
            "u8": Field((2, 2), torch.uint8),
            "b": Field((), torch.bool),
            "i64": Field((), torch.int64),
            "f64": Field((), torch.float64),
        }
    )
    batch = {
        "f32": torch.tensor([[1.5, -0.0], [float("inf"), 3.0e-38]]),
        "bf16": torch.tensor([[1.0, -2.5, 3.0e38], [0.1, 65504.0, -1.0e-30]], dtype=torch.bfloat16),
        "u8": torch.tensor([[[0, 255], [128, 1]], [[7, 8], [9, 254]]], dtype=torch.uint8),
        "b": torch.tensor([True, False]),
        "i64": torch.tensor([2**62, -(2**40)]),
        "f64": torch.tensor([1.0 / 3.0, -1.0e300], dtype=torch.float64),
    }
    st = storage_factory(4, spec)
    st.write(slice(1, 3), batch)
    got = read_flat(st, [2, 1])
    for key in spec:
        assert_same(got[key], batch[key].flip(0))


@pytest.mark.parametrize(
    "keys",
    [
        ["reward"],  # one narrow field of a packed float32 group
        [("next", "obs")],  # a nested key alone
        ["obs", ("next", "obs")],  # float32 fields, without reward: splits the float32 group
        ["terminated", ("next", "info", "flag")],  # bools, not the other bool
        ["image", "logits", "small", "value", "action", "obs"],  # most of the row
        "all-but-reward",
    ],
    ids=["one", "nested", "split-group", "bools", "wide", "all-but-one"],
)
def test_read_a_subset_of_keys(storage_factory, rich_spec, keys):
    if keys == "all-but-reward":
        keys = [k for k in rich_spec if k != "reward"]
    st = storage_factory(8, rich_spec)
    batch = make_batch(rich_spec, 8, start=40)
    st.write(slice(0, 8), batch)
    slots = [6, 0, 5]
    got = read_flat(st, slots, keys)
    assert set(got) == set(keys)
    for key in keys:
        assert_same(got[key], batch[key][slots])


@pytest.mark.parametrize("as_index", [True, False], ids=["index", "slice"])
def test_partial_write_updates_only_those_fields_and_slots(storage_factory, rich_spec, as_index):
    st = storage_factory(8, rich_spec)
    batch = make_batch(rich_spec, 8)
    st.write(slice(0, 8), batch)
    slots = [5, 1, 6] if as_index else [2, 3, 4]
    update = {
        "reward": torch.tensor([-1.0, -2.0, -3.0]),
        ("next", "obs"): torch.full((3, 3), 9.5),
        "truncated": torch.tensor([True, True, True]),
    }
    where = torch.tensor(slots) if as_index else slice(2, 5)
    st.write(where, update)

    got = read_flat(st, range(8))
    for key in rich_spec:
        want = batch[key].clone()
        if key in update:
            want[slots] = update[key]
        assert_same(got[key], want)


@pytest.mark.parametrize("keys", [None, ["reward", ("next", "info", "flag"), "obs"]], ids=["all", "some"])
def test_gather_is_a_flat_dict_in_spec_or_keys_order(storage_factory, rich_spec, keys):
    st = storage_factory(8, rich_spec)
    batch = make_batch(rich_spec, 8, start=1)
    st.write(slice(0, 8), batch)
    slots = torch.tensor([7, 2, 2])
    flat = st.gather(slots, keys)
    assert list(flat) == (list(rich_spec) if keys is None else keys)
    td = flatten(st.read(slots, keys))
    for key, value in flat.items():
        assert_same(value, batch[key][slots])
        assert_same(td[key], value)
    for value in flat.values():  # never aliases the storage
        value.zero_()
    again = st.gather(slots, keys)
    for key, value in again.items():
        assert_same(value, batch[key][slots])


def test_write_all_fields_by_index(storage_factory, rich_spec):
    st = storage_factory(6, rich_spec)
    st.write(slice(0, 6), make_batch(rich_spec, 6))
    new = make_batch(rich_spec, 2, start=70)
    st.write(torch.tensor([4, 0]), new)
    got = read_flat(st, [4, 0, 1])
    old = make_batch(rich_spec, 6)
    for key in rich_spec:
        assert_same(got[key][:2], new[key])
        assert_same(got[key][2], old[key][1])


def test_write_copies_non_contiguous_and_grad_inputs(storage_factory, spec):
    st = storage_factory(4, spec)
    batch = make_batch(spec, 3)
    batch["obs"] = torch.arange(9.0).reshape(3, 3).T  # transposed: not contiguous
    batch[("next", "obs")] = torch.tensor([1.0, 2.0, 3.0]).expand(3, 3)  # stride 0
    batch["reward"] = torch.tensor([0.5, 1.5, 2.5], requires_grad=True)
    st.write(slice(1, 4), batch)
    got = read_flat(st, [1, 2, 3])
    for key in spec:
        assert_same(got[key], batch[key].detach())


def test_storage_keeps_no_reference_to_written_values(storage_factory, spec):
    st = storage_factory(4, spec)
    batch = make_batch(spec, 4)
    saved = {k: v.clone() for k, v in batch.items()}
    st.write(slice(0, 4), batch)
    st.write(torch.tensor([1]), {"reward": batch["reward"][:1]})
    for value in batch.values():
        value.zero_() if value.dtype != torch.bool else value.fill_(False)
    got = read_flat(st, range(4))
    saved["reward"][1] = saved["reward"][0]
    for key in spec:
        assert_same(got[key], saved[key])


def test_read_result_does_not_alias_storage(storage_factory, rich_spec):
    st = storage_factory(4, rich_spec)
    batch = make_batch(rich_spec, 4)
    st.write(slice(0, 4), batch)
    td = st.read(torch.tensor([0, 1, 2, 3]))
    td["obs"].fill_(-7.0)
    td["image"].fill_(3)
    td["terminated"].logical_not_()
    td["next", "obs"].add_(100.0)
    # fields of one result do not overlap each other either (packed rows share a block)
    assert_same(td["reward"], batch["reward"])
    assert_same(td["truncated"], batch["truncated"])
    assert_same(td["logits"], batch["logits"])
    again = read_flat(st, range(4))
    for key in rich_spec:
        assert_same(again[key], batch[key])


def test_empty_write_is_a_no_op(storage_factory, spec):
    st = storage_factory(4, spec)
    batch = make_batch(spec, 4)
    st.write(slice(0, 4), batch)
    st.write(slice(2, 2), {k: v[:0] for k, v in make_batch(spec, 3, start=9).items()})
    got = read_flat(st, range(4))
    for key in spec:
        assert_same(got[key], batch[key])


def test_lazy_initialize(storage_factory, spec):
    st = storage_factory(5)
    assert isinstance(st, Storage)
    assert st.spec is None
    with pytest.raises(RuntimeError, match=r"write before initialize\(spec\)"):
        st.write(slice(0, 1), make_batch(spec, 1))
    with pytest.raises(RuntimeError, match=r"before initialize\(spec\)"):
        st.read(torch.tensor([0]))
    st.initialize(spec)
    assert st.spec == spec
    batch = make_batch(spec, 5, start=3)
    st.write(slice(0, 5), batch)
    got = read_flat(st, [4, 0])
    for key in spec:
        assert_same(got[key], batch[key][[4, 0]])


def test_state_dict_round_trip_into_a_fresh_storage(storage_factory, rich_spec):
    st = storage_factory(10, rich_spec)
    batch = make_batch(rich_spec, 10, start=20)
    st.write(slice(0, 10), batch)
    state = st.state_dict(6)
    # survives torch.save / torch.load(weights_only=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)

    fresh = storage_factory(10)
    fresh.load_state_dict(state)
    assert fresh.spec == rich_spec
    got = read_flat(fresh, range(6))
    for key in rich_spec:
        assert_same(got[key], batch[key][:6])


def test_state_dict_of_nothing(storage_factory, spec):
    assert storage_factory(4).state_dict(0) == {"spec": None, "data": []}
    lazy = storage_factory(4)
    lazy.load_state_dict({"spec": None, "data": []})
    assert lazy.spec is None

    st = storage_factory(4, spec)
    state = st.state_dict(0)
    assert state["spec"] == spec.to_dict()
    fresh = storage_factory(4)
    fresh.load_state_dict(state)
    assert fresh.spec == spec  # the layout comes back even with no items


@pytest.mark.parametrize("source", ["tensor", "memmap"])
def test_state_moves_between_backends(storage_factory, rich_spec, source, tmp_path):
    src = TensorStorage(6, rich_spec) if source == "tensor" else MemmapStorage(6, tmp_path / "src", rich_spec)
    batch = make_batch(rich_spec, 6, start=11)
    src.write(slice(0, 6), batch)
    dst = storage_factory(8)
    dst.load_state_dict(src.state_dict(6))
    got = read_flat(dst, range(6))
    for key in rich_spec:
        assert_same(got[key], batch[key])


def test_load_state_checks_spec_and_capacity(storage_factory, spec):
    st = storage_factory(6, spec)
    st.write(slice(0, 6), make_batch(spec, 6))
    state = st.state_dict(6)

    other = storage_factory(6, transition_spec(obs_shape=(4,)))
    with pytest.raises(SpecError, match="state holds Spec"):
        other.load_state_dict(state)
    small = storage_factory(4)
    with pytest.raises(CapacityError, match="state holds 6 items, more than this storage's capacity 4"):
        small.load_state_dict(state)


@pytest.mark.parametrize("capacity", [0, -3, 2.5, "8", True, None])
def test_capacity_must_be_a_positive_int(storage_factory, capacity):
    with pytest.raises(CapacityError, match=r"capacity: expected a positive int, got ") as info:
        storage_factory(capacity)
    assert repr(capacity) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_capacity_error_message(storage_factory):
    with pytest.raises(CapacityError, match=r"^capacity: expected a positive int, got 0$"):
        storage_factory(0)


# -- MemmapStorage --------------------------------------------------------------


def test_memmap_files_are_plain_npy(tmp_path, rich_spec):
    root = tmp_path / "bank"
    st = MemmapStorage(8, root, rich_spec)
    batch = make_batch(rich_spec, 8, start=3)
    st.write(slice(0, 8), batch)
    st.flush()

    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.npy"))
    assert files == sorted(
        [
            "obs.npy",
            "action.npy",
            "reward.npy",
            "terminated.npy",
            "truncated.npy",
            "image.npy",
            "logits.npy",
            "small.npy",
            "value.npy",
            "next/obs.npy",
            "next/info/flag.npy",
        ]
    )
    for key, field in rich_spec.items():
        parts = (key,) if isinstance(key, str) else key
        arr = np.load(root.joinpath(*parts[:-1], parts[-1] + ".npy"), mmap_mode="r", allow_pickle=False)
        assert arr.shape == (8, *field.shape)
        assert arr.dtype == numpy_dtype(field.dtype)
        want = batch[key].view(torch.int16) if field.dtype == torch.bfloat16 else batch[key]
        np.testing.assert_array_equal(np.asarray(arr), want.numpy())


def test_memmap_stores_bfloat16_as_int16_bits():
    assert numpy_dtype(torch.bfloat16) == np.dtype(np.int16)
    assert numpy_dtype(torch.float32) == np.dtype(np.float32)
    assert numpy_dtype(torch.bool) == np.dtype(np.bool_)


@pytest.mark.parametrize(
    "bad",
    ["..", "a/b", ".hidden", "", ("next", ".."), ("next", "a/b"), ("..", "obs"), "a\\b"],
    ids=["dotdot", "slash", "dot", "empty", "nested-dotdot", "nested-slash", "parent-dotdot", "backslash"],
)
@pytest.mark.parametrize("lazy", [False, True], ids=["constructor", "initialize"])
def test_memmap_rejects_unsafe_key_parts_before_creating_files(tmp_path, bad, lazy):
    root = tmp_path / "bank"
    spec = Spec({"obs": Field((3,)), bad: Field(())})  # a safe field first: it must not be created
    with pytest.raises(SpecError, match="is not a safe file name"):
        if lazy:
            MemmapStorage(4, root).initialize(spec)
        else:
            MemmapStorage(4, root, spec)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert not (tmp_path / "obs.npy").exists()


def test_memmap_rejects_key_with_trailing_newline(tmp_path):
    with pytest.raises(SpecError, match="is not a safe file name"):
        MemmapStorage(4, tmp_path / "bank", Spec({"obs\n": Field(())}))


def _supports_sparse_files(directory: Path) -> bool:
    probe = directory / "sparse-probe"
    with open(probe, "wb") as f:
        f.truncate(64 << 20)
    sparse = os.stat(probe).st_blocks * 512 < (1 << 20)
    probe.unlink()
    return sparse


def test_memmap_large_capacity_is_sparse(tmp_path):
    if not _supports_sparse_files(tmp_path):
        pytest.skip("the file system of tmp_path has no sparse files")
    capacity = 10_000_000
    st = MemmapStorage(capacity, tmp_path / "big", Spec({"x": Field((64,), torch.float32)}))
    path = tmp_path / "big" / "x.npy"
    logical = capacity * 64 * 4  # 2.56 GB
    st.write(slice(capacity - 2, capacity), {"x": torch.full((2, 64), 3.0)})
    st.write(torch.tensor([5_000_000]), {"x": torch.ones(1, 64)})
    st.flush()
    stat = os.stat(path)
    assert stat.st_size >= logical
    assert stat.st_blocks * 512 < logical // 100  # only the written pages take disk
    got = read_flat(st, [capacity - 1, 5_000_000, 0])
    assert_same(got["x"], torch.stack([torch.full((64,), 3.0), torch.ones(64), torch.zeros(64)]))


def test_memmap_temp_dir_removed_after_gc(spec):
    st = MemmapStorage(4, spec=spec)
    path = Path(st.path)
    st.write(slice(0, 4), make_batch(spec, 4))
    td = st.read(torch.tensor([0, 1]))
    assert (path / "obs.npy").is_file()
    assert (path / "next" / "obs.npy").is_file()
    del st
    gc.collect()
    assert not path.exists()
    assert_same(td["action"], torch.tensor([0, 1]))  # a read result outlives the files


def test_memmap_explicit_path_is_kept_after_gc(tmp_path, spec):
    root = tmp_path / "keep"
    st = MemmapStorage(4, root, spec)
    st.write(slice(0, 4), make_batch(spec, 4))
    st.flush()
    del st
    gc.collect()
    arr = np.load(root / "action.npy", mmap_mode="r", allow_pickle=False)
    np.testing.assert_array_equal(np.asarray(arr), np.arange(4))


# -- TensorStorage --------------------------------------------------------------


@pytest.mark.parametrize("pack", [True, False])
def test_tensor_storage_shared_memory(spec, pack):
    st = TensorStorage(4, spec, shared=True, pack=pack)
    assert st._blocks
    assert all(block.data.is_shared() for block in st._blocks)
    batch = make_batch(spec, 4)
    st.write(slice(0, 4), batch)
    got = read_flat(st, [3, 1])
    for key in spec:
        assert_same(got[key], batch[key][[3, 1]])


def test_tensor_storage_shared_when_initialized_lazily(spec):
    st = TensorStorage(4, shared=True)
    st.initialize(spec)
    assert all(block.data.is_shared() for block in st._blocks)


def test_tensor_storage_unshared_by_default(spec):
    st = TensorStorage(4, spec)
    assert not any(block.data.is_shared() for block in st._blocks)


def test_pin_memory_and_shared_together_is_an_error():
    with pytest.raises(DeviceError, match="pin_memory and shared cannot both be set; choose one"):
        TensorStorage(4, pin_memory=True, shared=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_device_without_cuda_is_an_error(device):
    with pytest.raises(DeviceError, match=f"device '{device}' was asked for, but CUDA is not available here"):
        TensorStorage(4, device=device)


def test_unknown_device_is_an_error():
    with pytest.raises(DeviceError, match="device: expected a torch device or its name, got 'tpu9'"):
        TensorStorage(4, device="tpu9")


@pytest.mark.parametrize("pack", [True, False])
def test_tensor_storage_bytes(pack):
    spec = transition_spec()
    exact = sum(f.numel * f.dtype.itemsize for f in spec.values())  # 38 bytes per item
    st = TensorStorage(10, spec, pack=pack)
    if pack:  # one row per item, padded to the widest dtype
        assert 10 * exact <= st.nbytes() < 10 * (exact + 8)
        assert len(st._blocks) == 1
    else:
        assert st.nbytes() == 10 * exact
        assert len(st._blocks) == len(spec)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("pack", [True, False])
def test_cuda_storage_round_trip(rich_spec, pack):
    st = TensorStorage(8, rich_spec, device="cuda", pack=pack)
    assert st.device.type == "cuda"
    batch = make_batch(rich_spec, 8, start=30)
    st.write(slice(0, 8), batch)  # CPU values into CUDA storage
    st.write(torch.tensor([2, 5]), {"reward": torch.tensor([-1.0, -2.0]).cuda()})
    td = st.read(torch.tensor([5, 2, 0]))
    assert td.device.type == "cuda"
    got = flatten(td)
    for key in rich_spec:
        want = batch[key][[5, 2, 0]].clone()
        if key == "reward":
            want[:2] = torch.tensor([-2.0, -1.0])
        assert got[key].device.type == "cuda"
        assert_same(got[key], want)
    subset = read_flat(st, torch.tensor([1]).cuda(), ["image"])
    assert_same(subset["image"], batch["image"][[1]])

    state = st.state_dict(8)
    assert all(t.device.type == "cpu" for t in state["data"])
    cpu = TensorStorage(8)
    cpu.load_state_dict(state)
    back = read_flat(cpu, range(8))
    assert_same(back["image"], batch["image"])


@pytest.mark.cuda
@needs_cuda
def test_pinned_storage(spec):
    st = TensorStorage(4, spec, pin_memory=True)
    assert all(block.data.is_pinned() for block in st._blocks)
    batch = make_batch(spec, 4)
    st.write(slice(0, 4), batch)
    got = read_flat(st, [2])
    assert_same(got["obs"], batch["obs"][[2]])
