# tfdp_sparse — two commands: `make demo` (set up + private training demo) and
# `make test` (set up + test suite). Both create .venv/ from the pinned stack.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OUT ?= out/demo
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup demo test test-slow bench clean

$(STAMP): requirements.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)

# Private training of the pCTR model on the synthetic Criteo-like data:
# a non-private reference run, then the private run (AUC, epsilon, speed,
# SavedModel export), then a comparison table.
demo: export TF_CPP_MIN_LOG_LEVEL := 3
demo: setup
	mkdir -p $(OUT)
	$(PY) -m trainers.train_pctr --flagfile=configs/demo_sgd.cfg --metrics_out=$(OUT)/sgd.json
	$(PY) -m trainers.train_pctr --flagfile=configs/demo_private.cfg --metrics_out=$(OUT)/private.json --export_dir=$(OUT)/saved_model
	$(PY) -m trainers.report $(OUT)/sgd.json $(OUT)/private.json

# tests/distributed in processes of their own (logical devices; parameter-server clusters inside a
# loopback-only network namespace, since tf.distribute.Server binds 0.0.0.0), then the main suite,
# then the Keras 3 suite in a process of its own (the legacy switch is per process).
test: setup
	TFDP_DISTRIBUTED_TESTS=1 $(PY) -m pytest -q tests/distributed --ignore=tests/distributed/ps
	TFDP_DISTRIBUTED_TESTS=1 unshare -rn sh -c 'ip link set lo up && exec $(PY) -m pytest -q tests/distributed/ps'
	$(PY) -m pytest -q
	TF_USE_LEGACY_KERAS=0 $(PY) -m pytest -q tests/keras3

test-slow: setup
	$(PY) -m pytest -q -m slow

bench: setup
	$(PY) -m benchmarks.step_time --algorithms=sgd,dpsgd --vocab=1e5,1e6,1e7

clean:
	rm -rf $(VENV) out
