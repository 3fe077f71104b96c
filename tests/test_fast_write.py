"""The write fast path (replay/fast_write.py): after a good call, a batch with the same
signature skips the full checks. It must refuse exactly what the full path refuses (same
error, nothing written) and store exactly what the full path stores.

Each test runs the same calls into two buffers, one with the fast path switched off
(``rb._fast_write = False``, the private switch), and compares errors and results.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from xpbank import Field, NStep, ReplayBuffer, Spec
from xpbank.errors import XpbankError
from xpbank.replay import fast_values, fast_write, raw_rows, writing
from xpbank.sampler import PrioritizedSampler

SPEC = Spec(
    {
        "obs": Field((3,)),
        "action": Field((), torch.int64),
        "reward": Field(()),
        "next_obs": Field((3,)),
        "terminated": Field((), torch.bool),
        "truncated": Field((), torch.bool),
    }
)


def pair(capacity: int = 16, spec: Spec = SPEC, **kw) -> tuple[ReplayBuffer, ReplayBuffer]:
    """A buffer with the fast path and one without (the reference), built alike."""
    fast = ReplayBuffer(capacity, spec, seed=0, **{k: v() if callable(v) else v for k, v in kw.items()})
    slow = ReplayBuffer(capacity, spec, seed=0, **{k: v() if callable(v) else v for k, v in kw.items()})
    slow._fast_write = False
    return fast, slow


def item(rng: np.random.Generator, kind: str = "numpy", end: float = 0.2):
    obs, nxt = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    term, trunc = bool(rng.random() < end), bool(rng.random() < end / 2)
    action, reward = int(rng.integers(0, 5)), float(rng.standard_normal())
    if kind == "numpy":  # what a gymnasium loop has: arrays and Python numbers
        return {
            "obs": obs,
            "action": action,
            "reward": reward,
            "next_obs": nxt,
            "terminated": term,
            "truncated": trunc,
        }
    if kind == "numpy64":  # float64 observations and NumPy scalars (MuJoCo-like envs)
        return {
            "obs": obs.astype(np.float64), "action": np.int64(action), "reward": np.float64(reward),
            "next_obs": nxt.astype(np.float64), "terminated": np.bool_(term), "truncated": np.bool_(trunc),
        }  # fmt: skip
    t = {
        "obs": torch.from_numpy(obs), "action": torch.tensor(action),
        "reward": torch.tensor(reward, dtype=torch.float32), "next_obs": torch.from_numpy(nxt),
        "terminated": torch.tensor(term), "truncated": torch.tensor(trunc),
    }  # fmt: skip
    return TensorDict(t, batch_size=[]) if kind == "td" else t


def step(rng: np.random.Generator, n: int, kind: str = "numpy", end: float = 0.2):
    s = {
        "obs": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.integers(0, 5, n),
        "reward": rng.standard_normal(n).astype(np.float32),
        "next_obs": rng.standard_normal((n, 3)).astype(np.float32),
        "terminated": rng.random(n) < end,
        "truncated": rng.random(n) < end / 2,
    }
    if kind == "numpy64":
        s["obs"], s["reward"] = s["obs"].astype(np.float64), s["reward"].astype(np.float64)
        return s
    if kind == "numpy":
        return s
    t = {k: torch.from_numpy(v) for k, v in s.items()}
    return TensorDict(t, batch_size=[n]) if kind == "td" else t


def call(rb: ReplayBuffer, method: str, batch) -> tuple[str, object]:
    """What the call returned, or the error it raised (type and message)."""
    try:
        out = getattr(rb, method)(batch)
        return "ok", list(out) if isinstance(out, range) else out
    except XpbankError as exc:
        return type(exc).__name__, str(exc)


def _bytes(x: torch.Tensor) -> bytes:
    dense = torch.empty(x.shape, dtype=x.dtype).copy_(x)  # canonical strides, any dtype
    return dense.reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(fast: ReplayBuffer, slow: ReplayBuffer) -> None:
    """Same ring, same stored bytes of every live item, same episode index and sampler."""
    assert (fast._ring.next_id, fast._ring.size) == (slow._ring.next_id, slow._ring.size)
    if len(slow) == 0:
        return
    a, b = fast.sample_all(), slow.sample_all()
    for key in slow.spec:
        x, y = a[key], b[key]
        assert x.dtype == y.dtype
        # the raw bytes, so NaN and -0.0 compare too
        assert _bytes(x) == _bytes(y), key
    assert torch.equal(a["index"], b["index"])
    if slow.episodes is not None:
        sa, sb = fast.episodes.state_dict(), slow.episodes.state_dict()
        assert sa.keys() == sb.keys()
        for k in sb:
            assert sa[k] == sb[k] if not isinstance(sb[k], torch.Tensor) else torch.equal(sa[k], sb[k]), k
    pa, pb = fast.sampler.state_dict(), slow.sampler.state_dict()
    assert pa.keys() == pb.keys()
    for k in pb:
        va, vb = pa[k], pb[k]
        same = (
            torch.equal(va, vb)
            if isinstance(vb, torch.Tensor)
            else np.array_equal(va, vb)
            if isinstance(vb, np.ndarray)
            else va == vb
        )
        assert same, k


def test_fast_path_is_taken_and_keyed_on_the_last_good_batch():
    rng = np.random.default_rng(0)
    rb = ReplayBuffer(8, SPEC)
    assert rb.add(item(rng)) == 0
    sig = rb._signature
    assert sig is not None and sig.n == 0
    assert rb.add(item(rng)) == 1 and rb._signature is sig  # matched: not rebuilt
    assert rb.extend(step(rng, 3)) == range(2, 5)  # a new signature: the full path, then keyed on it
    assert rb._signature is not sig and rb._signature.n == 3
    fast = ReplayBuffer(8, SPEC)
    fast._fast_write = False
    fast.add(item(rng))
    assert fast.__dict__.get("_signature") is None


# a good first call, then a second one that changes the signature or a value: each must
# give the full path's error (type and message) and write nothing
def _bad_items():
    rng = np.random.default_rng(1)
    good = item(rng)
    yield "dtype", good, {**good, "obs": good["obs"].astype(np.complex64)}
    yield "dtype (a safe cast: accepted)", good, {**good, "obs": good["obs"].astype(np.float16)}
    yield "int dtype (a safe cast: accepted)", good, {**good, "action": np.int32(3)}
    yield "float for int", good, {**good, "action": 1.5}
    yield "int into bool", good, {**good, "terminated": 1}
    yield "shape", good, {**good, "obs": np.zeros(4, np.float32)}
    yield "batch dim", good, {**good, "obs": np.zeros((1, 3), np.float32)}
    yield "missing key", good, {k: v for k, v in good.items() if k != "reward"}
    yield "extra key", good, {**good, "extra": 1.0}
    yield "renamed key", good, {**{k: v for k, v in good.items() if k != "reward"}, "rewards": 1.0}
    yield "overflow float", good, {**good, "reward": np.float64(1e300)}
    yield "Python float overflow", good, {**good, "reward": 1e300}
    yield "overflow int", good, {**good, "action": 2**70}
    yield "object array", good, {**good, "obs": np.array([1, "a", None], dtype=object)}
    yield "string", good, {**good, "reward": "1.0"}
    yield "None", good, {**good, "reward": None}
    yield "uint64", good, {**good, "action": np.uint64(3)}
    t = item(rng, "torch")
    yield "torch dtype", t, {**t, "action": t["action"].float()}
    yield "torch dtype (a safe cast: accepted)", t, {**t, "obs": t["obs"].half()}
    yield "torch shape", t, {**t, "obs": torch.zeros(1, 3)}
    yield "torch 0-d shape", t, {**t, "reward": torch.zeros(1)}
    yield "meta device", t, {**t, "obs": torch.zeros(3, device="meta")}
    yield "meta device 0-d", t, {**t, "reward": torch.zeros((), device="meta")}
    yield "sparse", t, {**t, "obs": torch.zeros(3).to_sparse()}
    yield "sparse 0-d", t, {**t, "reward": torch.tensor(1.0).to_sparse()}
    yield "mkldnn", t, {**t, "obs": torch.zeros(3).to_mkldnn()}
    yield "conj bit", t, {**t, "obs": torch.zeros(3, dtype=torch.complex64).conj()}
    yield "nested", t, {**t, "obs": torch.nested.nested_tensor([torch.zeros(3)])}
    yield "torch overflow", t, {**t, "reward": torch.tensor(1e300, dtype=torch.float64)}
    td = item(rng, "td")
    bad_td = td.clone()
    bad_td["obs"] = torch.zeros(3, dtype=torch.complex64)
    yield "TensorDict dtype", td, bad_td
    yield "TensorDict nested", td, td.clone().set(("next", "x"), torch.zeros(()))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("name,good,bad", list(_bad_items()), ids=[c[0] for c in _bad_items()])
def test_a_changed_signature_gets_the_full_paths_error_with_nothing_written(name, good, bad):
    fast, slow = pair()
    for rb in (fast, slow):
        rb.add(good)
        rb.add(good)  # the second good call takes the fast path in `fast`
    got_fast, got_slow = call(fast, "add", bad), call(slow, "add", bad)
    assert got_fast == got_slow
    assert (got_fast[0] == "ok") == ("accepted" in name), got_fast
    assert_same(fast, slow)
    assert call(fast, "add", good) == call(slow, "add", good)
    assert_same(fast, slow)


def _bad_steps():
    rng = np.random.default_rng(2)
    good = step(rng, 4)
    yield "rows differ", good, {**good, "reward": good["reward"][:3]}
    yield "float for int", good, {**good, "action": good["action"].astype(np.float32)}
    yield "narrowing int", good, {**good, "action": good["action"].astype(np.int32).astype(np.uint64)}
    yield "overflow", good, {**good, "obs": np.full((4, 3), 1e300)}
    t = step(rng, 4, "torch")
    yield "torch rows differ", t, {**t, "obs": t["obs"][:2]}
    yield "torch wrong dtype", t, {**t, "terminated": t["terminated"].float()}


@pytest.mark.parametrize("name,good,bad", list(_bad_steps()), ids=[c[0] for c in _bad_steps()])
def test_a_changed_step_gets_the_full_paths_error(name, good, bad):
    fast, slow = pair()
    for rb in (fast, slow):
        rb.extend(good)
        rb.extend(good)
    got = call(fast, "extend", bad)
    assert got == call(slow, "extend", bad) and got[0] != "ok", name
    assert_same(fast, slow)


def test_env_ids_and_env_steps_are_checked_on_every_fast_call():
    spec = Spec({**dict(SPEC.items()), "env_id": Field((), torch.int64)})
    fast, slow = pair(16, spec, num_envs=4)
    good = {**step(np.random.default_rng(3), 4), "env_id": np.arange(4)}
    bad = {**good, "env_id": np.array([0, 1, 2, 7])}  # same signature, an id out of range
    for rb in (fast, slow):
        rb.extend(good)
        rb.extend(good)
    got = call(fast, "extend", bad)
    assert got == call(slow, "extend", bad) and got[0] == "SpecError" and "[0, 4)" in got[1]
    assert_same(fast, slow)


def test_values_that_are_not_errors_still_match_the_full_path():
    """NaN, infinities, -0.0, the float32 edge and int64's edge: stored as the full path
    stores them (some go to the full path: the result is the same either way)."""
    fast, slow = pair()
    rng = np.random.default_rng(4)
    base = item(rng)
    f32max = float(np.finfo(np.float32).max)
    for reward in (
        float("nan"),
        float("inf"),
        -float("inf"),
        -0.0,
        f32max,
        -f32max,
        1e-45,
    ):
        for rb in (fast, slow):
            rb.add({**base, "reward": reward})
    for action in (2**63 - 1, -(2**63), 0, True):
        for rb in (fast, slow):
            rb.add({**base, "action": action})
    assert_same(fast, slow)
    # past float32's edge (the first is halfway to the next power of two: it rounds to inf)
    for reward in (3.4028235677973366e38, 3.5e38, 1e300):
        got = call(fast, "add", {**base, "reward": reward})
        assert got == call(slow, "add", {**base, "reward": reward})
        assert got[0] == "SpecError" and "overflows float32" in got[1], got


def test_requires_grad_and_noncontiguous_tensors():
    fast, slow = pair()
    rng = np.random.default_rng(5)
    for _ in range(3):
        t = item(rng, "torch")
        t["obs"] = torch.randn(3, 2)[:, 0]  # strided
        t["next_obs"] = torch.randn(3, requires_grad=True)
        t["reward"] = torch.tensor(0.5, requires_grad=True)
        for rb in (fast, slow):
            rb.add(t)
    assert_same(fast, slow)


def test_a_relaid_or_unpickled_storage_is_never_written_through_a_stale_signature():
    import pickle

    rng = np.random.default_rng(6)
    rb = ReplayBuffer(8, SPEC)
    rb.add(item(rng))
    rb.add(item(rng))
    copy = pickle.loads(pickle.dumps(rb))
    assert copy.__dict__.get("_signature") is None  # never pickled: it holds views of the storage
    x = item(rng)
    assert copy.add(x) == 2 and rb.add(x) == 2
    assert torch.equal(copy.sample_by_index([2])["obs"], rb.sample_by_index([2])["obs"])
    assert torch.equal(copy.sample_by_index([2])["obs"][0], torch.from_numpy(x["obs"]))
    rb.storage.initialize(SPEC)  # a new layout: the signature's block is stale
    y = item(rng)
    rb.add(y)
    assert torch.equal(rb.storage.gather(torch.tensor([3]))["obs"][0], torch.from_numpy(y["obs"]))


KINDS = ["numpy", "numpy64", "torch", "td"]
OPTIONS = {
    "plain": {},
    "prioritized": {"sampler": PrioritizedSampler},
    "num_envs": {"num_envs": 2},
    "nstep": {"num_envs": 2, "nstep": lambda: NStep(3, 0.9)},
    "env_field": {"env_id": True},
    "no_cast": {"cast": False},
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("seed", range(3))
def test_random_streams_give_the_full_paths_results(option, seed, monkeypatch):
    """Brute force: a random stream of adds and extends (every input kind, sizes that
    change now and then, the ring wrapping, now and then a bad batch) into a buffer with
    the fast path and one without: every call returns or raises the same, and the
    buffers hold the same bytes, ring, episode index, priorities and samples."""
    taken = []
    real = fast_write.try_write

    def counted(rb, batch, add):
        first = real(rb, batch, add)
        taken.append(first is not None)
        return first

    monkeypatch.setattr(writing, "try_write", counted)
    rng = np.random.default_rng(seed)
    kw = dict(OPTIONS[option])
    env_field = kw.pop("env_id", False)
    spec = Spec({**dict(SPEC.items()), "env_id": Field((), torch.int64)}) if env_field else SPEC
    fast, slow = pair(24, spec, **kw)
    envs = kw.get("num_envs", 1)
    kind, size = "numpy", envs
    for i in range(150):
        if rng.random() < 0.1:  # a new signature now and then
            kind, size = KINDS[rng.integers(len(KINDS))], envs * int(rng.integers(1, 4))
        single = envs == 1 and rng.random() < 0.5
        batch = item(rng, kind) if single else step(rng, size, kind)
        if env_field:
            ids = rng.integers(0, 3, 1 if single else size)
            value = int(ids[0]) if single else ids
            if rng.random() < 0.05:
                value = 5 if single else np.full(size, -1)  # out of range: refused
            batch = (
                {**batch, "env_id": value}
                if not isinstance(batch, TensorDict)
                else batch.set("env_id", torch.as_tensor(value))
            )
        if rng.random() < 0.05 and not isinstance(batch, TensorDict):
            batch = {**batch, "reward": 1e300 if single else np.full(size, 1e300)}  # refused: overflow
        method = "add" if single else "extend"
        got = call(fast, method, batch)
        assert got == call(slow, method, batch), (i, method, kind)
        if i % 10 == 0:
            assert_same(fast, slow)
    assert_same(fast, slow)
    assert sum(taken) > 30, "the fast path was hardly taken: this test would check nothing"
    if "nstep" in kw or "sampler" in kw:  # n-step targets and prioritized draws come out the same
        a, b = fast.sample(64), slow.sample(64)
        assert a.keys() == b.keys()
        for key in b.keys(include_nested=True, leaves_only=True):
            assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("odd", [False, True])
def test_other_dtypes_and_empty_fields_match_the_full_path(odd):
    """uint8, int8/16/32, float16 and float64 fields take the fast path with their own
    dtypes; a spec with a bfloat16, complex or empty field is left to the full path."""
    fields = {
        "img": Field((2, 2), torch.uint8), "small": Field((), torch.int8),
        "mid": Field((2,), torch.int16), "i32": Field((), torch.int32),
        "half": Field((2,), torch.float16), "f64": Field((), torch.float64),
    }  # fmt: skip
    if odd:
        fields.update(
            {"bf": Field((2,), torch.bfloat16), "cx": Field((), torch.complex64), "empty": Field((0,))}
        )
    fast, slow = pair(8, Spec(fields))
    rng = np.random.default_rng(7)
    for i in range(20):
        batch = {
            "img": rng.integers(0, 256, (2, 2), dtype=np.uint8), "small": np.int8(i),
            "mid": np.arange(2, dtype=np.int16), "i32": np.int32(-i),
            "half": rng.standard_normal(2).astype(np.float16), "f64": np.float64(i / 3),
        }  # fmt: skip
        if odd:
            batch.update({"bf": torch.randn(2, dtype=torch.bfloat16), "cx": np.complex64(1j * i)})
            batch["empty"] = np.zeros(0, np.float32)
        if i >= 10:
            batch = {k: torch.as_tensor(v) for k, v in batch.items()}
        assert call(fast, "add", batch) == call(slow, "add", batch)
        assert (fast.__dict__.get("_signature") is None) == odd
    assert_same(fast, slow)


def test_a_tensordict_with_batch_dims_of_its_own_is_refused_after_a_good_one():
    spec = Spec({"obs": Field((2,)), "reward": Field((2,))})
    fast, slow = pair(8, spec)
    good = TensorDict({"obs": torch.ones(2), "reward": torch.zeros(2)}, batch_size=[])
    # leaves of the item's shapes, but a batch dim of their own: check_item_dims refuses it
    bad = TensorDict({"obs": torch.ones(2), "reward": torch.zeros(2)}, batch_size=[2])
    for rb in (fast, slow):
        rb.add(good)
    assert fast._signature is not None
    got = call(fast, "add", bad)
    assert got == call(slow, "add", bad) and got[0] == "SpecError" and "batch dims" in got[1]
    assert_same(fast, slow)
    steps = TensorDict({"obs": torch.ones(3, 2), "reward": torch.zeros(3, 2)}, batch_size=[3])
    for rb in (fast, slow):
        rb.extend(steps)
    windows = TensorDict({"obs": torch.ones(3, 2), "reward": torch.zeros(3, 2)}, batch_size=[3, 2])
    got = call(fast, "extend", windows)
    assert got == call(slow, "extend", windows) and got[0] == "SpecError"
    assert_same(fast, slow)


@pytest.mark.parametrize("kind", ["numpy", "numbers", "tensor"])
def test_keys_that_read_as_code_are_only_values_in_the_generated_reader(kind):
    """fast_values.reader writes each field's checks out as Python text: a key of
    quotes, newlines and calls is one of the reader's globals, never part of its text;
    every kind of value under such keys is written as the full path writes it."""
    odd = ["a'); raise SystemExit('ran'); ('", 'b"\nimport os', "c{__import__('os')}"]
    spec = Spec({odd[0]: Field((3,)), odd[1]: Field(()), odd[2]: Field((), torch.int64)})

    def batch(i: int) -> dict:
        if kind == "numpy":
            return {odd[0]: np.full(3, i, np.float32), odd[1]: np.float32(i), odd[2]: np.int64(i)}
        if kind == "numbers":
            return {odd[0]: np.full(3, i, np.float32), odd[1]: float(i), odd[2]: i}
        return {odd[0]: torch.full((3,), float(i)), odd[1]: torch.tensor(float(i)), odd[2]: torch.tensor(i)}

    fast, slow = pair(8, spec)
    for i in range(6):
        assert call(fast, "add", batch(i)) == call(slow, "add", batch(i))
        assert_same(fast, slow)
    sig = fast.__dict__["_signature"]
    assert sig is not None and sig.read(batch(7)) is not None  # the reader took them
    assert sig.read({**batch(7), odd[2]: "x"}) is None


def _grad_item(i: int, base: torch.Tensor) -> dict:
    """An item the fast path declines on every call and the full path writes: its obs is
    a strided view requiring grad (no raw copy: not contiguous; no numpy(): grad), as a
    CUDA tensor of more than 8 values declines (numpy() raises), so each add re-keys."""
    obs = (base * (i + 1))[::2].reshape(3, 3)
    return {"obs": obs, "action": torch.tensor(i), "reward": torch.tensor(float(i))}


def test_a_signature_made_again_compiles_no_code_again(monkeypatch):
    """A buffer whose batches the fast path declines on every call (a CUDA tensor of more
    than 8 values, a strided one requiring grad) makes its signature again on every call:
    the generated reader and checker are compiled once per shape of text (the text holds
    no keys), not once per signature (~0.5 ms a signature: 3.3x an add's time)."""
    spec = Spec({"obs": Field((3, 3)), "action": Field((), torch.int64), "reward": Field(())})
    compiled = []

    def counting(*a, **kw):
        compiled.append(a[1])
        return compile(*a, **kw)

    monkeypatch.setattr(fast_values, "compile", counting, raising=False)
    monkeypatch.setattr(raw_rows, "compile", counting, raising=False)
    fast, slow = pair(16, spec)
    base = torch.randn(18, requires_grad=True)
    sigs = []
    for i in range(6):
        assert call(fast, "add", _grad_item(i, base)) == call(slow, "add", _grad_item(i, base))
        assert_same(fast, slow)
        sigs.append(fast.__dict__["_signature"])
    assert len({id(s) for s in sigs}) == len(sigs)  # made again each call
    assert len(compiled) <= 2, compiled  # the reader's and the checker's text, once each at most


def test_a_replaced_signature_s_generated_functions_are_freed_at_once():
    """A generated function whose globals hold the function itself is a reference cycle:
    with the cycle collector off (as some training loops run), every signature a buffer
    replaced kept its functions, globals and code (~7 KB) until a gc.collect()."""
    spec = Spec({"obs": Field((3,)), "action": Field((), torch.int64), "reward": Field(())})
    rb = ReplayBuffer(16, spec, seed=0)
    torch_item = {"obs": torch.ones(3), "action": torch.tensor(1), "reward": torch.tensor(0.5)}
    numpy_item = {"obs": np.ones(3, np.float32), "action": 1, "reward": 0.5}
    was = gc.isenabled()
    gc.disable()
    try:
        refs = []
        for _ in range(3):
            for it in (torch_item, numpy_item):
                rb.add(it)
                sig = rb.__dict__["_signature"]
                refs.append(weakref.ref(sig.read))
                if sig.raw is not None:
                    refs.append(weakref.ref(sig.raw[2]))
                del sig
        rb.add(torch_item)
        assert [r() is None for r in refs] == [True] * len(refs)
    finally:
        if was:
            gc.enable()
