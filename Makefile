# The two set-up commands of the README: `make demo` (the main job) and `make test` (the suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	# real pretrained models for the integration tests: only the .onnx files inside the wheel
	$(BIN)/pip install -q --no-deps rapidocr-onnxruntime==1.4.4
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/mixq demo

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/formats_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
