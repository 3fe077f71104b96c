# Two commands for a newcomer on a fresh clone:
#   make demo   set up .venv with what the demo needs (the `demo` extra) and run it
#               (xpbank demo: DQN and PPO on CartPole-v1)
#   make test   set up .venv with everything and run ruff, mypy, the strict docs build,
#               the test suite (the numeric kernel tests also under NumPy's other CPU
#               routines: tests/cpu_variants.py), then build the sdist and wheel and
#               smoke-test the wheel in a clean venv (.ci/wheel_check.sh)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test lint typecheck docs bench wheel clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# the demo's own set-up: xpbank and the `demo` extra only (no Ray, docs tooling, TorchRL ...)
$(DEMO_STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0 -e '.[demo]'
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0 -e '.[dev,gym,bench,demo,cli,minari,docs,ray,fast]'
	# objectrl (differential tests of xpbank.compat.objectrl): it pins Python >= 3.12 and
	# pulls in mujoco/metaworld/pyqt6; its replay buffer needs only torch/tensordict/torchrl
	$(PY) -m pip install --quiet --no-deps --ignore-requires-python objectrl==0.2.0
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m xpbank demo

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m ruff format --check src

typecheck: $(STAMP)
	$(PY) -m mypy

# mkdocs prints Material's end-of-life notice on every build; it stays visible on purpose
# (the plan is in mkdocs.yml)
test: lint typecheck
	$(PY) -m mkdocs build --strict --quiet --site-dir .site
	OMP_NUM_THREADS=1 $(PY) tests/cpu_variants.py
	OMP_NUM_THREADS=1 $(PY) -m pytest -q
	PYTHON=$(PYTHON) .ci/wheel_check.sh $(PY)

docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

# the sdist and wheel in dist/, checked by twine, the wheel smoke-tested in a clean venv
wheel: $(STAMP)
	PYTHON=$(PYTHON) .ci/wheel_check.sh $(PY)

bench: $(STAMP)
	$(PY) benchmarks/bench_replay.py --threads 1
	$(PY) benchmarks/bench_rollout.py --threads 1

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site .site dist
