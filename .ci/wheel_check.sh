#!/usr/bin/env bash
# The install a user gets: build the sdist and the wheel, check them with twine, install the
# wheel into a clean temporary venv (no system site-packages) and run .ci/smoke.py there.
# Usage: .ci/wheel_check.sh [PYTHON_WITH_BUILD_AND_TWINE] (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${1:-.venv/bin/python}
base=${PYTHON:-python3}
rm -rf dist
"$py" -m build --outdir dist . > /dev/null
"$py" -m twine check --strict dist/*
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$base" -m venv "$tmp/venv"
wheel=$(ls dist/*.whl)
"$tmp/venv/bin/python" -m pip install --quiet -c constraints.txt torch==2.13.0 "${wheel}[cli]"
cd "$tmp" && "$tmp/venv/bin/python" "$root/.ci/smoke.py"
