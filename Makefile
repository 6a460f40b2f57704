# Arbiter — the two commands that work on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test bench bench-traces bench-gavel bench-alibaba bench-corpus lint clean

$(BIN)/arbiter: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,postgres]'
	@touch $@

setup: $(BIN)/arbiter

demo: setup
	$(BIN)/python -m gpu_arbiter.demo

test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

bench: setup
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.api_bench
	$(BIN)/python -m bench.ledger_bench

# Every policy on every Gavel `msr` trace (issue 3's question, trace by trace; ~15 min on 2 cores).
GAVEL_MSR ?= ../shared/traces/gavel/traces/msr
bench-traces: setup
	$(BIN)/python -m bench.trace_sweep $(GAVEL_MSR)

# The `gavel` baseline beside the real Gavel simulator on msr 2869ce and 0e4a51 (~8 min on 2 cores).
bench-gavel: setup
	$(BIN)/python -m bench.gavel_crosscheck --msr $(GAVEL_MSR)

# Every Alibaba v2023 pod list at `arbiter bench`'s setting for it (~10 min on 2 cores).
ALIBABA_CSV ?= ../shared/traces/alibaba-gpu-v2023/csv
bench-alibaba: setup
	$(BIN)/python -m bench.trace_sweep $(ALIBABA_CSV) --format alibaba-v2023 \
		--cluster alibaba-v2023@0.02 --arrival-scale 0.16 --out bench/results/alibaba-sweep

# Every trace in ../shared/traces under every policy, seeds 0-3, with and without tiers, judged
# by issue 49's goals; writes docs/results/corpus.md. Resumes from bench/results/corpus.
# A subset: make bench-corpus CORPUS_ARGS="--traces 'gavel/msr/*' --seeds 0".
TRACES ?= ../shared/traces
CORPUS_ARGS ?=
bench-corpus: setup
	$(BIN)/python -m bench.corpus --root $(TRACES) $(CORPUS_ARGS)

lint: setup
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) out bench/results
