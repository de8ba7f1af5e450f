# Two commands for a new user: `make serve` and `make test`. Both set up .venv first.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 8000
# Rebuild the wheel (router extension) whenever the Rust side or the packaging changes.
BUILD_INPUTS := pyproject.toml Cargo.toml router/Cargo.toml $(shell find router/src -name '*.rs' 2>/dev/null)

.PHONY: setup serve test test-rust test-python browser lint gpu-test

setup: $(STAMP)

$(STAMP): $(BUILD_INPUTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -e '.[test]'
	touch $@

serve: $(STAMP)
	$(VENV)/bin/minisgl-router --host $(HOST) --port $(PORT)

test: test-rust test-python

test-rust: $(STAMP)
	cargo test --release --manifest-path router/Cargo.toml

test-python: $(STAMP) browser
	$(PY) -m pytest -ra

# Headless Chromium for the chat page's tests (Debian's packages; nothing when present).
browser:
	bash scripts/install-browser

lint: $(STAMP)
	$(VENV)/bin/ruff check python tests benches
	$(PY) -m mypy python/minisgl_worker
	cargo clippy --release --manifest-path router/Cargo.toml --all-targets -- -D warnings
	cargo fmt --manifest-path router/Cargo.toml --check

# On a CUDA machine: the GPU-marked tests (see scripts/gpu-test).
gpu-test:
	$(PY) -m pytest -ra -m gpu
