# Quick start: `make serve` (install, prepare the default model, serve on 127.0.0.1:8000)
# and `make test`. Every target depends on `install`, which is a no-op when nothing changed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?=

.PHONY: install serve test test-fast model bench sim clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip "setuptools>=68" wheel
	$(BIN)/pip install -q -e ".[cpu,dev]"
	# PyPI's torchvision/torchaudio/torchcodec break `transformers` beside CPU torch.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

model: install
	$(BIN)/kvserve model prepare

serve: model
	$(BIN)/kvserve serve --dev $(if $(CONFIG),--config $(CONFIG))

test: model
	$(BIN)/python -m pytest -q tests

test-fast: install
	$(BIN)/python -m pytest -q -m "not integration and not slow" tests

clean:
	rm -rf $(VENV) build *.egg-info
