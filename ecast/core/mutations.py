"""Planted bugs: one registry of named mutations that every core consults.

A mutation is a known bug that a test plants to show the suite catches it (a checker
fails, a scenario diverges).  Each layer declares the mutations its cores understand
(:func:`declare`, at import); a host plants some for the whole process
(:func:`plant`, from a daemon's ``--mutation`` flags) and a test for one run
(:func:`planted`); a core asks :func:`on` at the one place the bug lives.  Planting is
refused unless the process runs under ``ECAST_TEST_MUTATIONS=1``, so a production daemon
cannot be started with a bug by a stray flag.

Process-wide rather than per core: a router's config is rebuilt from a snapshot on every
router that joins, a storage core's engine runs on a thread of its own, and the
simulator runs every core of a schedule in one process; a bug planted in a process is in
every core of it, as a bug in the code would be.  Not part of ``ecast``'s public API:
tests, the simulators and the daemons' flags are its only users.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterable, Iterator
from typing import NamedTuple

ENV = "ECAST_TEST_MUTATIONS"
"""Planting is allowed only when this environment variable is ``1``."""


class Mutation(NamedTuple):
    name: str
    layer: str
    """Who consults it: ``ufabcast``, ``router``, ``endpoint``, ``rubberband-config``,
    ``storage``, ``client``, ``super``."""
    what: str


_REGISTRY: dict[str, Mutation] = {}
_active: frozenset[str] = frozenset()

ECAST_DECLARERS = ("ecast.core.endpoint", "ecast.core.router.params", "ecast.core.ufabcast.params")
"""E-Cast's modules that declare mutations.  A layer's mutations are declared when its
cores are imported; :func:`known` and :func:`check` import these first, so that a tool
that plants an E-Cast bug before it has loaded the core (a bench worker parsing its
flags) still knows it.  The layers above import their own cores before asking."""


def _load() -> None:
    for module in ECAST_DECLARERS:
        importlib.import_module(module)


def declare(name: str, layer: str, what: str) -> str:
    """Make a mutation known (once per name); returns the name, for a module constant."""
    known = _REGISTRY.get(name)
    if known is not None and known.layer != layer:
        raise ValueError(f"mutation {name!r} is already declared by {known.layer}")
    _REGISTRY[name] = Mutation(name, layer, what)
    return name


def known(layer: str | None = None) -> dict[str, Mutation]:
    """The declared mutations (of one ``layer``), by name."""
    _load()
    return {n: m for n, m in sorted(_REGISTRY.items()) if layer is None or m.layer == layer}


def allowed() -> bool:
    return os.environ.get(ENV) == "1"


def check(names: Iterable[str]) -> frozenset[str]:
    """``names`` as a set, every one declared (else :class:`ValueError` naming them)."""
    names = frozenset(names)
    _load()
    unknown = sorted(names - _REGISTRY.keys())
    if unknown:
        raise ValueError(
            f"unknown mutation(s) {', '.join(unknown)}; known: {', '.join(sorted(_REGISTRY))}"
        )
    return names


def plant(names: Iterable[str]) -> None:
    """Plant ``names`` in this process, for good (a daemon's ``--mutation``)."""
    global _active
    names = check(names)
    if names and not allowed():
        raise PermissionError(f"planting bugs is for tests: set {ENV}=1 to allow it")
    _active = _active | names


@contextlib.contextmanager
def planted(names: Iterable[str]) -> Iterator[frozenset[str]]:
    """Plant ``names`` for the duration of a ``with`` block (one test, one simulated
    run), then restore what was planted before.  Tests run with ``ECAST_TEST_MUTATIONS``
    set by their conftest."""
    global _active
    names = check(names)
    if names and not allowed():
        raise PermissionError(f"planting bugs is for tests: set {ENV}=1 to allow it")
    before = _active
    _active = before | names
    try:
        yield names
    finally:
        _active = before


def on(name: str) -> bool:
    """Whether the bug ``name`` is planted in this process (cores ask this)."""
    return name in _active


def active() -> frozenset[str]:
    return _active
