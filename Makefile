# `make demo` and `make test` are the two commands a new machine needs; both
# create .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip --disable-pip-version-check
STAMP  := $(VENV)/.installed

.PHONY: demo test install wheels bench docs typecheck clean

# Both wheels' projects, editable: the device runtime (this directory, with the test tools) and
# the workstation (packaging/workstation: trainer, exporters, demos, torch), which pip resolves
# against the editable device project, so nothing of ours is fetched from the package index.
$(STAMP): pyproject.toml packaging/workstation/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	rm -rf edge_sdk.egg-info  # metadata of the pre-rename "edge-sdk" editable install, if any
	$(PIP) install --no-compile -q -e '.[dev,docs]' -e ./packaging/workstation
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/edge-sdk demo

test: $(STAMP)
	$(PY) -m pytest -q

# dist/nested_edge_sdk-*.whl (device) and dist/nested_edge_sdk_workstation-*.whl, offline
wheels: $(STAMP)
	rm -f dist/nested_edge_sdk-*.whl dist/nested_edge_sdk_workstation-*.whl
	$(PY) packaging/build_wheels.py dist

# The documentation site (mkdocs.yml: docs/ + the API reference from docstrings) into site/;
# --strict: a broken link or an unrenderable docstring fails the build. Its code blocks run
# in the test suite (tests/docs).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# mypy --strict on the device runtime, which must report no errors (CI's typecheck step); the
# settings ([tool.mypy]: strict, files = edge_sdk, the stub-less imports) are in pyproject.toml
typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) benchmarks/train_speed.py

clean:
	rm -rf $(VENV) runs .pytest_cache dist build site *.egg-info packaging/workstation/*.egg-info
