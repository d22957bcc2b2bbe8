# pyllm: `make install` sets up .venv with pyllm (C core built) and the default
# model; `make test` runs the tests; `make run PROMPT="..."` answers a prompt.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= The three primary colors are
CSRC := $(wildcard csrc/*.c csrc/*.h csrc/x86/*.c csrc/arm/*.c)

.PHONY: install models test run build bench clean

install: $(VENV)/.installed models

$(VENV)/.installed: pyproject.toml setup.py pyllm/_build_native.py $(CSRC)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

# rebuild the C core in place (faster than reinstalling while working on csrc/)
build: $(VENV)/.installed
	$(BIN)/python setup.py -q build_ext --inplace

models: $(VENV)/.installed
	$(BIN)/pyllm pull smollm2-135m

test: install
	$(BIN)/python -m pytest -q

run: install
	$(BIN)/pyllm run -p "$(PROMPT)" -n 64

bench: install
	$(BIN)/pyllm bench

clean:
	rm -rf build pyllm/_native*.so pyllm/_native.c *.egg-info
