# clusterplan: `make demo` sets up and runs the built-in example; `make test` sets up and tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test bench setup clean

$(BIN)/clusterplan: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

setup: $(BIN)/clusterplan

demo: setup
	$(BIN)/clusterplan topology show dgx-a100:nodes=2
	$(BIN)/clusterplan collective allreduce --size 1GiB --topology dgx-a100:nodes=2
	$(BIN)/clusterplan simulate dp-step --topology dgx-a100:nodes=2 --trace dp-step.trace.json
	$(BIN)/clusterplan simulate gpt3-175b --topology selene-a100 --gpus 512 --parallel tp=8,pp=8,dp=8 --trace gpt3.trace.json

test: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python tests/bench/bench_simulator.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache *.trace.json
