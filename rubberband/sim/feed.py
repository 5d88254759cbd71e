"""A change feed followed through the simulator's faults, and its check.

One more client process reads the feed of every key page after page (the client core's
changes reads: :mod:`rubberband.changelog`), from before the first append to after the
final reads, through router and storage crashes, partitions and migrations.  The check
(:func:`feed_violations`) needs no model: every write of the list-append workload appends
one value to one key, so each event of a list key must extend that key's list by exactly
one value (a missing event is a jump, a repeated one a list that does not grow), events
come at increasing positions, and the last list of every key is what the final
sequential read of it returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ecast import NodeId
from rubberband.client import Changes, Event, ReadDone
from rubberband.errors import Compacted

if TYPE_CHECKING:
    from rubberband.sim.process import RbNode
    from rubberband.sim.run import RubberbandRun

FEED: NodeId = "client:feed"
IDLE = 0.05
"""Seconds between two pages while the feed has nothing new (the SDK's ``poll``)."""


class Follower:
    """The feed's reader: one page in flight at a time, each from the last one's end."""

    def __init__(self, run: RubberbandRun, node: RbNode) -> None:
        self.run = run
        self.node = node
        self.position: int | None = None
        """Where the next page starts (None: the first, from its own position)."""
        self.request: Any = None
        self.sent_at = 0.0
        self.next_at = 0.0
        self.answered_from = -1.0
        """When the last page that was answered had been sent."""
        self.events: list[Event] = []
        self.first: int | None = None
        """The first page's position: the feed holds every write after it."""
        self.compacted: list[str] = []
        node.on_upcall = self._upcall
        node.next_wake = lambda: None if self.request is not None else self.next_at
        node.on_step = self.tick

    @property
    def started(self) -> bool:
        return self.position is not None

    def tick(self, now: float) -> None:
        if self.request is not None or now < self.next_at:
            return
        core = self.node.client
        assert core is not None
        if core.keyspace is None or not len(core.keyspace):
            # Before the first holder is placed there is nothing to follow yet.
            self.next_at = now + 0.2
            self.node.feed(core.refresh(now))
            return
        self.sent_at = now
        self.request, fx = core.read(Changes(self.position), "sequential", now)
        self.node.feed(fx)

    def _upcall(self, node: RbNode, item: Any, now: float) -> None:
        if type(item) is not ReadDone or item.request != self.request:
            return
        self.request = None
        if item.error is not None:
            if isinstance(item.error, Compacted):
                self.compacted.append(f"at {now:.3f}: {item.error}")
            self.next_at = now + IDLE  # a page is a read: read it again
            return
        self.events.extend(item.result.events)
        if self.first is None:
            self.first = item.result.position
        self.position = item.result.position
        self.answered_from = self.sent_at
        self.next_at = now if item.result.events else now + IDLE


def feed_violations(
    events: list[Event], finals: dict[int, list[Any]], is_list_key: Any
) -> list[str]:
    """What the followed feed got wrong (see the module docstring)."""
    out: list[str] = []
    positions = [e.position for e in events]
    if positions != sorted(set(positions)):
        out.append("change feed: events out of order or repeated")
    lists: dict[Any, list[Any]] = {}
    for e in events:
        for key, kind, value in e.changes:
            if not is_list_key(key):
                continue
            before = lists.get(key, [])
            after = list(value) if kind == "put" and isinstance(value, list | tuple) else None
            if after is None or after[:-1] != before or len(after) != len(before) + 1:
                out.append(
                    f"change feed: at position {e.position} key {key} went from "
                    f"{before[-3:]} ({len(before)} values) to {kind} {value!r:.80}"
                )
                return out
            lists[key] = after
    for key, final in sorted(finals.items()):
        if lists.get(key, []) != final:
            out.append(
                f"change feed: key {key} ends with {len(lists.get(key, []))} values in the "
                f"feed, {len(final)} in its final read"
            )
            break
    return out
