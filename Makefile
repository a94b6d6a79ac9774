# The two quick-start commands: `make demo` and `make test`.
PYTHON ?= python3.11
TORCH ?= 2.13.0
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-emu test-fake test-sanitize test-bindings gpu-check-fake bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py src/streamrt/_viewcache.c
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	@# the cuda extra lets NVRTC compile and API-name tests run without a GPU; optional
	$(BIN)/pip install -q -e '.[cuda]' || echo "make: cuda extra not installed; its tests will skip"
	@# PyTorch (CPU) for the DLPack interop tests, only where this machine has its wheel (pip's
	@# find-links; --no-index: never a download of its own), then its small dependencies
	@if $(BIN)/pip install -q --no-index --no-deps torch==$(TORCH) >/dev/null 2>&1; then \
	  $(BIN)/pip install -q torch==$(TORCH) || echo "make: torch's dependencies not installed; its interop tests will skip"; \
	else echo "make: torch not installed (no local wheel); its interop tests will skip"; fi
	touch $@

demo: $(VENV)/.installed
	$(BIN)/streamrt demo

# each step says what it is; a pytest run ends with its skips grouped by reason (tests/conftest.py)
test: $(VENV)/.installed-test
	@echo "make: ruff"
	@$(BIN)/ruff check .
	@# the public API as a typed user program sees it (py.typed): mypy --strict on one
	@echo "make: mypy --strict on the typed program (examples/typed_program.py)"
	@$(BIN)/mypy --strict --follow-imports=silent --no-incremental examples/typed_program.py
	@# the layering (DESIGN.md §1): no module-level import cycle in the package
	@echo "make: import cycles"
	@$(BIN)/python scripts/import_cycles.py src/streamrt
	@STREAMRT_MAKE_STEP="pytest (cpu, {n} tests)" $(BIN)/python -m pytest -q -p no:cacheprovider
	@# the cuda backend's code and the cuda tests again, on the fake CUDA runtime (tests/cuda/fake)
	@why=$$($(BIN)/python -c "from tests.cuda.fake import unavailable; print(unavailable() or '')"); \
	if [ -z "$$why" ]; then STREAMRT_CUDA_FAKE=1 STREAMRT_MAKE_STEP="cuda tests on the fake CUDA runtime ({n} tests)" \
	  $(BIN)/python -m pytest -q -p no:cacheprovider -m cuda; \
	else echo "make: the cuda tests on the fake CUDA runtime are skipped: $$why"; fi

# the operators' CUDA C built with g++ and run on the CPU (no GPU needed; a few minutes)
test-emu: $(VENV)/.installed-test
	@# the per-test timeout raised: with a cold build cache the first test's fixture compiles every
	@# operator's kernels (minutes on 2 cores)
	STREAMRT_CUDA_EMU=1 $(BIN)/python -m pytest -q -p no:cacheprovider --timeout=1800 tests/cuda/test_ops_cuda_emulated.py

# every test with the cuda backend on the fake CUDA runtime (no GPU needed; about 2 minutes)
test-fake: $(VENV)/.installed-test
	STREAMRT_CUDA_FAKE=1 $(BIN)/python -m pytest -q -p no:cacheprovider

# every test with the sanitizer on in raise mode (about 2 minutes): a finding fails its test
test-sanitize: $(VENV)/.installed-test
	STREAMRT_SANITIZE=1 $(BIN)/python -m pytest -q -p no:cacheprovider

# the cuda tests on the fake runtime under the oldest cuda-bindings of each extra (cuda12, cuda),
# each in its own venv: the backend's calls are checked against those versions' signatures
BINDINGS ?= 12.9.1 13.0.0
test-bindings:
	@for v in $(BINDINGS); do \
	  env=$(VENV)-cb$$v; \
	  case $$v in 12.*) nvrtc="nvidia-cuda-nvrtc-cu12==12.9.*";; *) nvrtc="nvidia-cuda-nvrtc==$${v%.*}.*";; esac; \
	  echo "make: cuda-bindings $$v in $$env"; \
	  [ -x $$env/bin/python ] || $(PYTHON) -m venv $$env || python3 -m venv $$env || exit 1; \
	  $$env/bin/pip install -q -e '.[test]' "cuda-bindings==$$v" "$$nvrtc" || exit 1; \
	  STREAMRT_CUDA_FAKE=1 $$env/bin/python -m pytest -q -p no:cacheprovider -m cuda || exit 1; \
	done

# scripts/gpu_check.sh rehearsed on the fake CUDA runtime (smoke-sized benchmarks; results in
# gpu-check-out/fake): the script's whole flow, before a GPU run spends its minutes on it
gpu-check-fake: $(VENV)/.installed-test
	PYTHON=$(CURDIR)/$(BIN)/python PYTHONPATH=$(CURDIR)/tests/cuda/fake/site STREAMRT_CUDA_FAKE=1 \
	STREAMRT_BENCH_SMOKE=1 GPU_CHECK_QUICK=1 bash scripts/gpu_check.sh $(CURDIR)/gpu-check-out/fake

bench: $(VENV)/.installed
	$(BIN)/streamrt bench

clean:
	rm -rf $(VENV) $(VENV)-cb* build *.egg-info
