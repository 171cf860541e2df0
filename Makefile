# clusterplan: `make demo` sets up and runs the built-in example; `make test` sets up and tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test bench setup setup-torchrec clean

$(BIN)/clusterplan: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

setup: $(BIN)/clusterplan

# torch 2.13.0 (CPU wheel on these machines), fbgemm-gpu-cpu 1.8.0 and torchrec 1.8.0 (--no-deps):
# the measured embedding evaluation, TorchRec's planner as a baseline and the TorchRec export tests.
$(VENV)/.torchrec: $(BIN)/clusterplan
	$(BIN)/python -m pip install --quiet -e '.[test,torchrec]'
	$(BIN)/python -m pip install --quiet --no-deps torchrec==1.8.0
	$(BIN)/python -c "import torch, fbgemm_gpu, torchrec"
	touch $@

setup-torchrec: $(VENV)/.torchrec

demo: setup
	$(BIN)/clusterplan topology show dgx-a100:nodes=2
	$(BIN)/clusterplan collective allreduce --size 1GiB --topology dgx-a100:nodes=2
	$(BIN)/clusterplan simulate dp-step --topology dgx-a100:nodes=2 --trace dp-step.trace.json
	$(BIN)/clusterplan simulate gpt3-175b --topology selene-a100 --gpus 512 --parallel tp=8,pp=8,dp=8 --trace gpt3.trace.json

test: setup-torchrec
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python tests/bench/bench_simulator.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache *.trace.json
