# Two commands on a fresh machine (Python 3.11, pip, apt):
#   make book   builds the HTML book into _build/html
#   make test   runs the whole test suite
# Both create (or reuse) the virtual environment .venv and install what they need.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# nbgrader runs `alembic` as a command: the environment's bin must be on PATH.
export PATH := $(CURDIR)/$(BIN):$(PATH)
export PYTHONHASHSEED := 0

.PHONY: book pdf test bench venv clean
venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[all]"
	touch $@

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going

pdf: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going --builder pdflatex

test: $(STAMP)
	ATTN_REQUIRE_MLX=1 $(BIN)/python -m pytest -n 2 --dist loadfile

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_backward.py

clean:
	rm -rf _build
