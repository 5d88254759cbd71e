# Two commands set everything up on a fresh machine (each creates the virtualenv it needs):
#   make demo   the main job: a real local router group orders a replicated bank, survives a
#               leader kill and a router join, and checks the replicas agree
#   make test   the test suite (ECAST_LONG=1 make test runs thousands of schedules)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo sim-demo test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m ecast demo

sim-demo: $(STAMP)
	$(PY) -m ecast.sim.demo

# pytest exits 5 when it collects no tests; that is not a failure of the suite.
test: $(STAMP)
	$(PY) -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; else exit $$rc; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
