# The two set-up commands of the README: `make demo` (the main job) and `make test` (the suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.core-installed
TEST   := $(VENV)/.test-installed

.PHONY: demo test install bench clean

$(CORE): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(TEST): $(CORE)
	$(BIN)/pip install -q -e '.[test,finetune,report,ray]'
	# real pretrained models for the integration tests: only the .onnx files inside the wheel
	$(BIN)/pip install -q --no-deps rapidocr-onnxruntime==1.4.4
	# the font the OCR test lines are rendered with (Debian; CI runs as root)
	[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || \
	  { apt-get update -qq && apt-get install -y -qq fonts-dejavu-core; }
	touch $@

install: $(CORE)

demo: $(CORE)
	$(BIN)/mixq demo

test: $(TEST)
	$(BIN)/python -m pytest

bench: $(TEST)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench --suite quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
