# Two commands set everything up on a fresh machine (each creates the virtualenv it needs):
#   make demo   the main job: a local Rubberband cluster on the scan engine works through an
#               expand, a leader kill, a storage kill and its repair, and a contract, then
#               checks that nothing acknowledged was lost or reordered and replicas agree
#   make test   the test suite (ECAST_LONG=1 make test runs thousands of schedules)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SPARK  := $(VENV)/.installed-spark

.PHONY: demo ecast-demo sim-demo test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The Spark data source's tests need PySpark (a large download): the test suite installs
# it, the demo does not.
$(SPARK): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(SPARK)

demo: $(STAMP)
	$(PY) -m rubberband.tools.cli demo

ecast-demo: $(STAMP)
	$(PY) -m ecast demo

sim-demo: $(STAMP)
	$(PY) -m ecast.sim.demo

# The sans-IO, simulator and unit tests are CPU-bound and run in virtual time: they run
# on every core (pytest-xdist).  The tests of real daemons measure timeouts and latencies
# on the wall clock: they run one at a time afterwards.  pytest exits 5 when it collects
# no tests; that is not a failure of the suite.
test: $(SPARK)
	$(PY) -m pytest -n auto tests/unit tests/sim; rc=$$?; \
	  if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi
	$(PY) -m pytest tests/integration; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; else exit $$rc; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
