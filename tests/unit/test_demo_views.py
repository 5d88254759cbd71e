"""The demo's change feed ends only once the workload has settled: a write still in
flight when the demo stops, and seen by a view read still in flight, must be in the
history the view reads are checked against."""

from __future__ import annotations

import asyncio
from typing import Any

from rubberband.changelog import Event, Page
from rubberband.tools.demo_views import BankViews


class _Log:
    """The total order's writes to the accounts, read as pages of a change feed."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.position = 10

    def write(self, key: Any, value: int) -> None:
        self.position += 1
        self.events.append(Event(self.position, ((key, "put", value),)))

    async def changes(self, since: int, lo: Any, hi: Any) -> Page:
        await asyncio.sleep(0)
        self.position += 1  # the page's read is a message of its own
        return Page(self.position, [e for e in self.events if e.position > since])

    async def close(self) -> None:
        pass


class _Demo:
    def __init__(self, log: _Log) -> None:
        self.log = log
        self.stop = asyncio.Event()

    async def connect(self, name: str) -> _Log:
        return self.log


def test_a_write_landing_after_the_stop_is_in_the_feed() -> None:
    async def go() -> list[Event]:
        log = _Log()
        bank = BankViews(_Demo(log), seed=1)
        events: list[Event] = []
        feed = asyncio.ensure_future(bank._follow(log.position, None, None, events, None))
        await asyncio.sleep(0.01)
        bank.demo.stop.set()
        await asyncio.sleep(0.12)  # the feed reads empty pages, the demo stopped
        log.write(("acct", 1), 5)  # a transfer in flight at the stop returns now
        await asyncio.sleep(0.01)
        assert not feed.done(), "the feed ended before the workload had returned"
        bank.settled.set()
        await asyncio.wait_for(feed, 5)
        return events

    events = asyncio.run(go())
    assert [e.changes for e in events] == [((("acct", 1), "put", 5),)]


def test_a_page_read_begun_before_the_workload_settled_does_not_end_the_feed() -> None:
    """Whether the workload had settled is taken before a page's read, not after: a
    read begun before the last write, answered empty once everything has settled,
    must not end the feed (the write comes after its position)."""

    class Gated(_Log):
        def __init__(self) -> None:
            super().__init__()
            self.gate: asyncio.Event | None = None
            self.asked = asyncio.Event()

        async def changes(self, since: int, lo: Any, hi: Any) -> Page:
            self.position += 1
            page = Page(self.position, [e for e in self.events if e.position > since])
            if self.gate is not None:  # held, answered as of when it was asked
                gate, self.gate = self.gate, None
                self.asked.set()
                await gate.wait()
            await asyncio.sleep(0)
            return page

    async def go() -> list[Event]:
        log = Gated()
        bank = BankViews(_Demo(log), seed=1)
        events: list[Event] = []
        bank.demo.stop.set()
        held = log.gate = asyncio.Event()
        feed = asyncio.ensure_future(bank._follow(log.position, None, None, events, None))
        await log.asked.wait()  # a page's read is on its way
        log.write(("acct", 2), 7)  # the last transfer, after that read's position
        bank.settled.set()
        held.set()  # the read answers: empty
        await asyncio.wait_for(feed, 5)
        return events

    events = asyncio.run(go())
    assert [e.changes for e in events] == [((("acct", 2), "put", 7),)]
