# Two commands for a fresh machine: `make fit` and `make test`.
# Both create .venv if it is missing and install the project into it with pip.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: fit test lint clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Train the embedded default, then evaluate the best checkpoint on the test split, once.
fit: $(STAMP)
	$(BIN)/template fit
	$(BIN)/template test --ckpt_path best

test: $(STAMP)
	$(BIN)/python -m pytest --nbmake tests notebooks

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf runs .pytest_cache
