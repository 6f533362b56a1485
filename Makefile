# searchloop developer entry points. `make demo` and `make test` create .venv on a fresh machine first.
PY ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
BIN := $(VENV)/bin

.PHONY: demo test lint venv clean-venv

$(STAMP): requirements/cpu.lock.txt requirements/cpu-nodeps.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -r requirements/cpu.lock.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -r requirements/cpu-nodeps.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@! $(BIN)/pip list 2>/dev/null | grep -qiE '^(nvidia-|torchvision|torchaudio)' || (echo "CUDA/vision packages leaked into the CPU env" && exit 1)
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/searchloop demo

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)
