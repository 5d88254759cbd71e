"""When a step runs on the event loop, and when on a worker thread.

A storage process's batch of short deliveries and a maintainer's step after a short feed
page cost less than the hop to a thread and back (a future, a wake-up of the thread,
another of the loop: a fifth of a storage process's CPU a write, a tenth of a
maintainer's).  A long step on the loop, though, holds every connection of the process
(heartbeats among them: the routers would take the process for dead).  So a caller
runs a step it judges short on the loop through a :class:`LoopGate`, and a step that
turns out to use more than :data:`SLOW` seconds of CPU there sends every step to the
thread for :data:`BACKOFF` seconds.  CPU, not wall time: on a machine with more busy
processes than cores a short step took 20-35 ms of wall time when the process was
preempted mid-way, a few times a minute, and each sent every step to the thread for
the backoff (with a view at 4,000 writes/s, two thirds of a storage process's busy time
was on the thread, an eighth of it in handing results back to the loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

SLOW = 0.02
"""Seconds of CPU a step may take on the loop before the next ones go to the thread."""
BACKOFF = 10.0
"""Seconds the thread then takes every step, before the loop tries again."""


class LoopGate:
    """Whether the next step may run on the loop; :meth:`run` runs one there and closes
    the gate for :data:`BACKOFF` if it used more than :data:`SLOW` of CPU."""

    __slots__ = ("_clock", "_until")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock  # the loop's clock
        self._until = 0.0

    def open(self) -> bool:
        return self._clock() >= self._until

    def run(self, step: Callable[..., T], *args: Any) -> T:
        started = time.thread_time()
        try:
            return step(*args)
        finally:
            if time.thread_time() - started > SLOW:
                self._until = self._clock() + BACKOFF
