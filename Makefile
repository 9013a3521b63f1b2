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

.PHONY: setup demo test test-full test-all bench clean

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

# Two tiers (tests/tiers.py lists the tests of the full tier and the fast test that proves the same property):
#   make test      the fast tier: every guarantee once, within 15 minutes on 2 cores; each test file under
#                  60 s (TFDP_FILE_BUDGET_S: a file over it fails the run, by name);
#   make test-all  the fast tier, then the full tier: everything (CI runs this through .ci/run).
# Each tier: tests/distributed in processes of their own (logical devices; parameter-server clusters inside a
# loopback-only network namespace, since tf.distribute.Server binds 0.0.0.0), then the main suite on both cores
# (pytest-xdist, one TensorFlow thread per worker, a file's tests in one worker so module fixtures are shared),
# then the Keras 3 suite the same way in processes of its own (the legacy switch is per process).
PYTEST := $(PY) -m pytest -q -p no:cacheprovider
ON_BOTH_CORES := TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 OMP_NUM_THREADS=1 $(PYTEST) -n 2 --dist loadfile
FAST := not full
FULL := full
# pytest exits 5 when a tier selects no test in a folder: for the full tier that is not an error.
NONE_IS_FINE := || [ $$? -eq 5 ]

test: setup
	TFDP_FILE_BUDGET_S=60 TFDP_DISTRIBUTED_TESTS=1 $(PYTEST) -m "$(FAST)" tests/distributed --ignore=tests/distributed/ps
	TFDP_FILE_BUDGET_S=60 TFDP_DISTRIBUTED_TESTS=1 unshare -rn sh -c 'ip link set lo up && exec $(PYTEST) -m "$(FAST)" tests/distributed/ps'
	TFDP_FILE_BUDGET_S=60 $(ON_BOTH_CORES) -m "$(FAST)"
	TFDP_FILE_BUDGET_S=60 TF_USE_LEGACY_KERAS=0 $(ON_BOTH_CORES) -m "$(FAST)" tests/keras3

test-full: setup
	TFDP_DISTRIBUTED_TESTS=1 $(PYTEST) -m "$(FULL)" tests/distributed --ignore=tests/distributed/ps $(NONE_IS_FINE)
	TFDP_DISTRIBUTED_TESTS=1 unshare -rn sh -c 'ip link set lo up && exec $(PYTEST) -m "$(FULL)" tests/distributed/ps' $(NONE_IS_FINE)
	$(ON_BOTH_CORES) -m "$(FULL)" $(NONE_IS_FINE)
	TF_USE_LEGACY_KERAS=0 $(ON_BOTH_CORES) -m "$(FULL)" tests/keras3 $(NONE_IS_FINE)

test-all: test test-full

bench: setup
	$(PY) -m benchmarks.step_time --algorithms=sgd,dpsgd --vocab=1e5,1e6,1e7

clean:
	rm -rf $(VENV) out
