"""Every compat front-end that makes its own generator seeds it from torch's global RNG,
so two runs after the same ``torch.manual_seed`` sample alike (as the originals, which
draw from that RNG, do). rsl_rl's and metta's are in their own test files; TorchRL's hook
drives the user's buffer and makes none."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from xpbank.compat.objectrl import ReplayBuffer
from xpbank.compat.rose import ExperienceBank, create_experience


def _rose_samples(seed: int, grow: bool) -> list[float]:
    torch.manual_seed(seed)
    bank = ExperienceBank(max_size=None if grow else 64)
    n = 1500 if grow else 50  # past the first 1024: the bank grows into a new buffer
    bank.add_batch([create_experience([float(i)], 0, float(i), [float(i + 1)], False) for i in range(n)])
    return [e.reward for e in bank.sample(32)]


def test_rose_bank_samples_repeat_after_the_same_torch_seed():
    for grow in (False, True):
        assert _rose_samples(0, grow) == _rose_samples(0, grow)
        assert _rose_samples(0, grow) != _rose_samples(1, grow)


def _objectrl_samples(seed: int) -> list[float]:
    torch.manual_seed(seed)
    cpu = torch.device("cpu")
    buffer = ReplayBuffer(cpu, cpu, buffer_size=100)
    buffer.add_batch(TensorDict({"reward": torch.arange(50.0)}, batch_size=[50]))
    out = buffer.sample_batch(16)["reward"].tolist()
    buffer.reset()  # a new buffer: seeded again from torch
    buffer.add_batch(TensorDict({"reward": torch.arange(50.0)}, batch_size=[50]))
    return out + buffer.sample_random(16)["reward"].tolist()


def test_objectrl_buffer_samples_repeat_after_the_same_torch_seed():
    assert _objectrl_samples(0) == _objectrl_samples(0)
    assert _objectrl_samples(0) != _objectrl_samples(1)
