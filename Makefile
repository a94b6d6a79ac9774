# The two quick-start commands: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-emu test-fake bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	@# the cuda extra lets NVRTC compile and API-name tests run without a GPU; optional
	$(BIN)/pip install -q -e '.[cuda]' || echo "make: cuda extra not installed; its tests will skip"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/streamrt demo

test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider
	@# the cuda backend's code and the cuda tests again, on the fake CUDA runtime (tests/cuda_fake)
	@why=$$($(BIN)/python -c "from tests.cuda_fake import unavailable; print(unavailable() or '')"); \
	if [ -z "$$why" ]; then STREAMRT_CUDA_FAKE=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m cuda; \
	else echo "make: the cuda tests on the fake CUDA runtime are skipped: $$why"; fi

# the operators' CUDA C built with g++ and run on the CPU (no GPU needed; a few minutes)
test-emu: $(VENV)/.installed-test
	STREAMRT_CUDA_EMU=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_ops_cuda_emulated.py

# every test with the cuda backend on the fake CUDA runtime (no GPU needed; about 2 minutes)
test-fake: $(VENV)/.installed-test
	STREAMRT_CUDA_FAKE=1 $(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(VENV)/.installed
	$(BIN)/streamrt bench

clean:
	rm -rf $(VENV) build *.egg-info
