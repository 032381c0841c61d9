# Two commands for a fresh machine: `make fit` and `make test`.
# Both create .venv if it is missing and install the project into it with pip: `fit` what training
# needs, `test` the dev extra besides (the extras' tools, pytest, ruff...).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed

.PHONY: fit test lint clean

$(VENV)/bin/pip:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(RUNTIME): pyproject.toml | $(VENV)/bin/pip
	$(BIN)/pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): pyproject.toml | $(VENV)/bin/pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP) $(RUNTIME)

# Train the embedded default, then evaluate the best checkpoint on the test split, once.
fit: $(RUNTIME)
	$(BIN)/template fit
	$(BIN)/template test --ckpt_path best

test: $(STAMP)
	$(BIN)/python -m pytest --nbmake --durations=20 tests notebooks

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf runs .pytest_cache
