# Two commands for a newcomer on a fresh clone:
#   make demo   set up .venv and run the demo (xpbank demo: DQN and PPO on CartPole-v1)
#   make test   set up .venv and run ruff, mypy and the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0 -e '.[dev,gym,bench,demo]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m xpbank demo

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m ruff format --check src

typecheck: $(STAMP)
	$(PY) -m mypy

test: lint typecheck
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_replay.py --threads 1
	$(PY) benchmarks/bench_rollout.py --threads 1

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
