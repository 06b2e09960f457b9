# The two set-up commands of the README: `make demo` and `make test` (each installs first).
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install demo test pytest lit bench

install:
	$(PIP) install --quiet --disable-pip-version-check torch==2.13.0
	$(PIP) install --quiet --disable-pip-version-check -e '.[test]'

# The main job on the embedded default: compile the example transformer block with
# backend="kope" and print, per operator, the kernel it runs and its latency against eager.
demo: install
	kope compile transformer_block

# pytest and the lit suite of the passes.
test: install pytest lit

pytest:
	$(PYTHON) -m pytest -q

lit:
	lit -sv test/lit

bench: install
	$(PYTHON) benchmarks/dispatch_overhead.py
