"""FrameStorage's lockstep-step check (storage/frame_check.py): the compiled kernel
answers as the NumPy reference does, on good steps and on steps with one byte changed
anywhere (shifted frames, padding, the previous next observation's stored frames), for
frames of several word widths and both paddings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_frames import StackedEnvs
from xpbank import FrameStorage, ReplayBuffer
from xpbank.storage import frame_check, frame_write

pytestmark = pytest.mark.skipif(frame_check._compiled is None, reason="numba is not installed")


@pytest.mark.parametrize(
    "frame,pad,dtype,stack",
    [
        ((3, 4), "repeat", torch.uint8, 4),
        ((5, 3), "zero", torch.uint8, 3),
        ((2, 4), "repeat", torch.int16, 4),
        ((3, 4), "repeat", torch.uint8, 1),  # whole observations (stacked=False): the SB3 adapter's
    ],
)
def test_kernel_answers_as_numpy_on_good_and_broken_steps(frame, pad, dtype, stack, monkeypatch) -> None:
    envs = StackedEnvs(4, stack, seed=len(frame) + frame[0], pad=pad, lengths=(1, 5), frame=frame)
    storage = FrameStorage(40, pad=pad, stacked=stack > 1)
    rb = ReplayBuffer(40, storage=storage, num_envs=4, seed=0)
    rng = np.random.default_rng(0)
    answers: list[tuple[bool, bool]] = []

    def both(st, o, x, start, slots):
        cases = [(o, x)]
        for _ in range(12):  # one byte changed in the observation or the next observation
            o2, x2 = o.copy(), x.copy()
            target = o2 if rng.random() < 0.5 else x2
            flat = target.reshape(-1).view(np.uint8)
            flat[rng.integers(flat.size)] ^= np.uint8(1 << int(rng.integers(8)))
            cases.append((o2, x2))
        for a, b in cases:
            answers.append(
                (
                    frame_check._step_obeys_numpy(st, a, b, start, slots),
                    frame_check.step_obeys(st, a, b, start, slots),
                )
            )
        return frame_check.step_obeys(st, o, x, start, slots)

    monkeypatch.setattr(frame_write, "step_obeys", both)
    for _ in range(40):
        step = envs.step(range(4))
        if dtype != torch.uint8:
            step = {k: v.to(dtype) * 257 if k in ("obs", ("next", "obs")) else v for k, v in step.items()}
        if stack == 1:
            step = {k: v[:, -1] if k in ("obs", ("next", "obs")) else v for k, v in step.items()}
        rb.extend(step)
    assert len(answers) > 300
    assert all(a == b for a, b in answers)
    assert sum(a for a, _ in answers) > 20 and sum(not a for a, _ in answers) > 100  # both answers seen


def test_words_view_the_same_bytes() -> None:
    a = np.arange(48, dtype=np.uint8).reshape(2, 3, 8)
    for width in (1, 2, 4, 8):
        w = frame_check.words(a, width)
        assert w.shape == (2, 24 // width) and w.tobytes() == a.tobytes()
