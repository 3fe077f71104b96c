"""How tests/data/bank_v1 was made (format version 1). Do not re-run to "update" it:
the committed bank is the reference every later version of xpbank must keep loading.

    PYTHONPATH=src python tests/data/make_golden_bank.py tests/data/bank_v1
"""

from __future__ import annotations

import sys

import torch

import xpbank
from xpbank import Field, Spec


def main(path: str) -> None:
    spec = Spec(
        {
            "obs": Field((2,), torch.float32),
            "action": Field((), torch.int64),
            "terminated": Field((), torch.bool),
            "logits": Field((2,), torch.bfloat16),
            "frame": Field((2, 2), torch.uint8),
            ("next", "obs"): Field((2,), torch.float32),
        }
    )
    rb = xpbank.ReplayBuffer(6, spec, seed=12345)
    i = torch.arange(8)
    rb.extend(
        {
            "obs": torch.stack([i, -i], 1).float(),
            "action": i * 10,
            "terminated": i % 3 == 0,
            "logits": torch.stack([i, i + 1], 1).to(torch.bfloat16),
            "frame": (i[:, None, None] + torch.arange(4).reshape(1, 2, 2)).to(torch.uint8),
            ("next", "obs"): torch.stack([i + 1, -i - 1], 1).float(),
        }
    )
    xpbank.save(rb, path, session_id="20261122_060000_0123abcd")


if __name__ == "__main__":
    main(sys.argv[1])
