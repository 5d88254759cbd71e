"""The one driver of Rubberband's cores: what their :class:`~ecast.Effects` mean, carried
out the same way by the asyncio daemons (:mod:`rubberband.host`), the SDK
(:mod:`rubberband.sdk`) and the simulator (:mod:`rubberband.sim`).

A core's effects are direct messages (``send``: ``Direct`` values to other application
processes), a wake-up time, and in ``deliver``, in the order they arose: E-Cast messages
to submit (:class:`~rubberband.outputs.Submit`), votes
(:class:`~rubberband.outputs.Suspect`), a stop (:class:`~rubberband.outputs.Stop`), and
upcalls for the host or the application (a
read's completion, a reconfiguration's end).  Only the :class:`IO` differs between
drivers: a socket or a simulated link, an asyncio timer or the simulator's clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ecast import Effects, NodeId
from rubberband.outputs import Stop, Submit, Suspect


class IO(Protocol):
    """Where a core's effects go."""

    def send(self, dst: NodeId, msg: Any) -> None:
        """A direct message (a ``Direct``) to another application process."""

    def submit(self, submissions: list[Submit]) -> None:
        """E-Cast messages to submit, in order (a token comes back with each ack)."""

    def suspect(self, who: tuple[NodeId, ...]) -> None:
        """Ask the group to declare ``who`` faulty (E-Cast's control path)."""

    def upcall(self, item: Any) -> None:
        """A completion or notice for the host or the application."""

    def stop(self, reason: str) -> None:
        """The process must stop."""

    def wake(self, at: float | None) -> None:
        """Call the core's ``on_tick`` no later than ``at`` (None: nothing due)."""


def carry_out(fx: Effects, io: IO) -> None:
    """Hand a core's effects to ``io``: sends first (answers and migration traffic are
    what peers wait for), then submissions, stops and upcalls in the order the core
    made them (a submission batch never passes a stop), then the wake-up."""
    send = io.send
    for dst, msg in fx.send:
        send(dst, msg)
    if fx.deliver:
        batch: list[Submit] = []
        for item in fx.deliver:
            t = type(item)
            if t is Submit:
                batch.append(item)
                continue
            if batch:
                io.submit(batch)
                batch = []
            if t is Stop:
                io.stop(item.reason)
            elif t is Suspect:
                io.suspect(item.who)
            else:
                io.upcall(item)
        if batch:
            io.submit(batch)
    io.wake(fx.wake_at)


# ---------------------------------------------------------------- loop or thread
# When a step runs on the event loop, and when on a worker thread.
#
# A storage process's batch of short deliveries and a maintainer's step after a short feed
# page cost less than the hop to a thread and back (a future, a wake-up of the thread,
# another of the loop: a fifth of a storage process's CPU a write, a tenth of a
# maintainer's).  A long step on the loop, though, holds every connection of the process
# (heartbeats among them: the routers would take the process for dead).  So a caller
# runs a step it judges short on the loop through a :class:`LoopGate`, and a second step
# that uses more than :data:`SLOW` seconds of CPU there within :data:`REPEAT` seconds of
# another sends every step to the thread for :data:`BACKOFF` seconds.  CPU, not wall
# time: on a machine with more busy processes than cores a short step took 20-35 ms of
# wall time when the process was preempted mid-way, a few times a minute, and each sent
# every step to the thread for the backoff (with a view at 4,000 writes/s, two thirds of
# a storage process's busy time was on the thread, an eighth of it in handing results
# back to the loop).  A second one, not the first: a step that pays for something its
# engine does once in a great many puts (the memory engine's dict grown to twice its
# table at 350,000 keys: 27 ms, every replica of the write-vs-storage benchmark at the
# same step) is no sign the next steps are long, and it would be no shorter on the
# thread, which holds the interpreter as long.  It sent a storage process's steps to the
# thread from the eighth second of the benchmark's sixteen on.

T = TypeVar("T")

INTAKE_BATCH = 512
"""Deliveries a storage process's host takes in at a time: each batch confirmed as taken,
then paused for as long as the holds say (:mod:`rubberband.holds`); the simulator's
storage processes take theirs in alike."""

SLOW = 0.02
"""Seconds of CPU a step may take on the loop; more, twice within :data:`REPEAT`, and
the next ones go to the thread."""
REPEAT = 1.0
"""Seconds within which a second slow step on the loop closes the gate: steps that are
long in themselves come many to a second under load; a rare costly one does not."""
BACKOFF = 10.0
"""Seconds the thread then takes every step, before the loop tries again."""


class LoopGate:
    """Whether the next step may run on the loop; :meth:`run` runs one there and closes
    the gate for :data:`BACKOFF` if it used more than :data:`SLOW` of CPU within
    :data:`REPEAT` of another that did."""

    __slots__ = ("_clock", "_slow_at", "_until")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock  # the loop's clock
        self._until = 0.0
        self._slow_at = -math.inf  # the last slow step's end: none yet

    def open(self) -> bool:
        return self._clock() >= self._until

    def run(self, step: Callable[..., T], *args: Any) -> T:
        started = time.thread_time()
        try:
            return step(*args)
        finally:
            if time.thread_time() - started > SLOW:
                now = self._clock()
                if now - self._slow_at < REPEAT:
                    self._until = now + BACKOFF
                self._slow_at = now
