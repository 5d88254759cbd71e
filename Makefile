# Two commands set everything up on a fresh machine (each creates the virtualenv it needs;
# both run ./run, which works without make too):
#   make demo   the main job: a local Rubberband cluster on the scan engine works through an
#               expand, a leader kill, a storage kill and its repair, and a contract, then
#               checks that nothing acknowledged was lost or reordered and replicas agree
#   make test   the test suite (ECAST_LONG=1 make test runs thousands of schedules)
#   make test-ecast   E-Cast's own tests only (about 3 minutes)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo ecast-demo sim-demo test test-ecast lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# `./run` holds the set-up logic, so that a machine without make works too.
demo:
	./run demo

ecast-demo: $(STAMP)
	$(PY) -m ecast demo

sim-demo: $(STAMP)
	$(PY) -m ecast.sim.demo

test:
	./run test

test-ecast:
	./run test ecast

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
