# Two commands for a newcomer on a fresh clone:
#   make demo   set up .venv and run the demo (xpbank demo: DQN and PPO on CartPole-v1)
#   make test   set up .venv and run ruff, mypy and the test suite (the numeric kernel
#               tests also under NumPy's other CPU routines: tests/cpu_variants.py)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck docs bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0 -e '.[dev,gym,bench,demo,cli,minari,docs,ray,fast]'
	# objectrl (differential tests of xpbank.compat.objectrl): it pins Python >= 3.12 and
	# pulls in mujoco/metaworld/pyqt6; its replay buffer needs only torch/tensordict/torchrl
	$(PY) -m pip install --quiet --no-deps --ignore-requires-python objectrl==0.2.0
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m xpbank demo

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m ruff format --check src

typecheck: $(STAMP)
	$(PY) -m mypy

test: lint typecheck
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir .site
	OMP_NUM_THREADS=1 $(PY) tests/cpu_variants.py
	OMP_NUM_THREADS=1 $(PY) -m pytest -q

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) benchmarks/bench_replay.py --threads 1
	$(PY) benchmarks/bench_rollout.py --threads 1

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site .site
