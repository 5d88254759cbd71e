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

from typing import Any, Protocol

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
