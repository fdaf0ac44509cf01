# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv when it is missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# The CPU build of torch lies on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH   := torch==2.13.0
# The llama.cpp whose graph layout (moespec/model/llama_cpp.py GgmlTensor) and flags moespec was checked against.
LLAMA   := llama-cpp-python==0.3.36
STAMP   := $(VENV)/.installed

.PHONY: install llama test test-quick demo clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[dev]"
	# Optional peers (mlx-lm's SwitchGLU, ggml's MUL_MAT_ID): installed where they install, so CI exercises them.
	$(BIN)/python -m pip install -q -e ".[peers]" || echo "make: optional peer kernels not installed; their tests skip"
	# Optional Ray (more than one machine): CI tests moespec on a local Ray instance.
	$(BIN)/python -m pip install -q -e ".[ray]" || echo "make: ray not installed; the --ray tests skip"
	touch $(STAMP)

install: $(STAMP)

# Optional: llama.cpp through llama-cpp-python (builds llama.cpp, ~10 min on 2 cores; pip caches the wheel).
llama: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[llama]" "$(LLAMA)" || echo "make: llama-cpp-python not installed; its tests skip"

test: $(STAMP)
	$(BIN)/python -m pytest

# The suite without the tests marked slow (end-to-end runs of the README's recipes, training, the demo): minutes
# less; `make test` still runs everything.
test-quick: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

demo: $(STAMP)
	$(BIN)/moespec demo

clean:
	rm -rf $(VENV) build *.egg-info
