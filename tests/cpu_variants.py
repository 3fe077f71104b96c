"""Run the numeric kernel tests again with NumPy's CPU-specific routines switched off.

NumPy picks some routines by CPU at import (``x ** y`` is a vector routine on AVX-512
machines and the C library's ``pow`` elsewhere; they differ in the last bit), so a test
that passes on one CI machine can fail on the next. This runs the tests that compare
the compiled kernels, the NumPy paths and the torch paths bit for bit under several
``NPY_DISABLE_CPU_FEATURES`` settings taken from what this NumPy dispatches and this CPU
has: none off, the best one off, and every one off (the baseline routines only). Each
setting is checked to have taken effect before its tests run.

Run by ``make test``; by hand: ``python tests/cpu_variants.py [pytest args]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

TESTS = [
    "tests/test_prioritized_kernels.py",
    "tests/test_sumtree_numba.py",
    "tests/test_sumtree.py",
    "tests/test_prioritized_torch.py",
    "tests/test_prioritized.py",
    "tests/test_lazymin.py",
    "tests/test_nstep_kernel.py",
    "tests/test_nstep_fused.py",
]

_PROBE = (
    "import json; from numpy._core._multiarray_umath import __cpu_dispatch__ as d, __cpu_features__ as f; "
    "print(json.dumps([k for k in d if f.get(k)]))"
)


def active_features(disabled: str) -> list[str]:
    """The dispatched CPU features NumPy uses in a fresh process with ``disabled`` off."""
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": disabled}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def settings() -> list[str]:
    """``NPY_DISABLE_CPU_FEATURES`` values: "" (none off), the best feature off, all off."""
    on = active_features("")
    out = [""]
    if len(on) > 1:
        out.append(on[-1])
    if on:
        out.append(" ".join(on))
    return out


def main(extra: list[str]) -> int:
    for disabled in settings():
        left = active_features(disabled)
        gone = [k for k in disabled.split() if k in left]
        if gone:
            print(f"NPY_DISABLE_CPU_FEATURES={disabled!r} did not switch off {gone}", flush=True)
            return 1
        used = left or "baseline only"
        print(f"== NPY_DISABLE_CPU_FEATURES={disabled!r}: NumPy dispatches {used}", flush=True)
        env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": disabled}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *extra]
        code = subprocess.run(cmd, env=env, check=False).returncode
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
