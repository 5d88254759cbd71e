"""What Rubberband's cores ask of their host besides sending direct messages.

A core returns ``ecast`` :class:`~ecast.Effects`: direct messages in ``send`` (each a
``Direct`` holding a :mod:`rubberband.proto` message), a wake-up time in ``wake_at``,
and in ``deliver`` these requests and upcalls, in the order they arose.  The one driver
(:mod:`rubberband.driver`) carries them out for the asyncio daemons, the SDK and the
simulator alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Submit:
    """Submit an E-Cast message (in order with the core's other submissions).  ``token``,
    when given, comes back with its acknowledgement (:meth:`on_acked` of the core)."""

    header: dict[str, Any]
    payload: Any = None
    token: Any = None
    unsafe: bool = False
    """Forwarded without agreement (a snapshot read, 3.5.7); a shed one comes back
    through the core's ``on_shed``."""


@dataclass(frozen=True, slots=True)
class Suspect:
    """Ask the group to declare ``who`` faulty (a super's vote, 4.2.3).  A membership
    message, which E-Cast sends on its own control path (never behind this process's
    data), so not a :class:`Submit`."""

    who: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Stop:
    """The process must stop (fail-stop: an engine failed, the keyspace cannot be
    followed)."""

    reason: str
