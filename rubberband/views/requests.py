"""What the views' steps (:mod:`rubberband.views.steps`) ask a driver for: a read, a
write, both, a pipelined pair, a read sent ahead, a wait.  Each driver (the asyncio
client, the simulator) carries out these alone, so the steps run unchanged on both."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, NamedTuple


class Read(NamedTuple):
    """Read ``op`` at ``isolation`` (``within``: part of it); the reply is the result,
    or ``(result, position)`` with ``with_position``."""

    op: Any
    isolation: str
    within: Any = None
    with_position: bool = False
    long: bool = False
    """The step after the reply computes much: a driver runs it off its event loop."""
    ahead: bool = False
    """The step after the reply is short whatever the page: it sends the next page's
    read ahead (:class:`Ahead`) and computes this one the step after."""
    aside: bool = False
    """A read made while one sent ahead is out (a maintainer's look at its
    definitions): that one stays ahead, for the request that takes it.  Short unless
    ``long`` (a start's look, after which the view is computed whole)."""


class Write(NamedTuple):
    """Write every op (in one batch; their order between segments is free); the reply
    comes once all are stable, or the first failure is thrown."""

    ops: tuple[Any, ...]


class Both(NamedTuple):
    """A write and a read at once (neither waits for the other); the reply is the
    read's, once the write is stable too, or the first failure is thrown."""

    write: Write
    read: Read


class Pipe(NamedTuple):
    """A write sent now and a read (a maintainer's next page): the reply is the read's,
    once it is answered and the write of the *previous* ``Pipe`` is stable, or the first
    failure of either is thrown.  A page's rows thus go out while the next page is read
    and are waited for a round later: one round trip a page, not the longer of a read
    and a write.  A failed ``Pipe`` leaves nothing in flight (the steps make its write
    again).  A client's writes are ordered as it sends them and none is delivered
    before an earlier one (E-Cast's gap-free sessions, 3.4.3), so a write that carries
    a view's ordered progress is never seen before the rows written ahead of it."""

    write: Write
    read: Read


class Ahead(NamedTuple):
    """Send ``read`` now and go on (the reply is None at once): the next :class:`Read`,
    :class:`Pipe` or :class:`Both` whose read is this very object waits for its answer
    instead of sending it again, and one with another read leaves it unanswered (but
    for an ``aside`` read, which leaves it ahead).  A
    maintainer asks for its next page before it computes the rows of the last: that
    read is then ordered before those rows, not behind their application at every
    storage process, and its round trip overlaps the computing (which was two fifths
    of a round at the views benchmark's half peak).  ``changes``: the page the next
    step computes (a driver runs a long one off its event loop)."""

    read: Read
    changes: int


class Settle(NamedTuple):
    """Wait for the last :class:`Pipe`'s write to be stable (its failure is thrown)."""


class Sleep(NamedTuple):
    seconds: float


Steps = Generator[Read | Write | Both | Pipe | Ahead | Settle | Sleep, tuple[Any, float], Any]
