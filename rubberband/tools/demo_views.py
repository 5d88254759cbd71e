"""The demo's views: a bank's accounts, two views of them kept by a ``rubberband views
maintain`` process, and a check that every view read was exact.

The accounts are keys ``("acct", i)`` holding integer balances; clients move money with
atomic ``add`` transfers (deltas summing to 0), so the bank's total never changes.  The
views (``docs/views.md``): ``bank``, an aggregate of every account (how many, their
total, the lowest balance), and ``overdrawn``, a selection of the accounts below 0; and
over the demo's Ticket table, ``tickets_n``, an index by booking status of the tickets
whose code starts with N (the demo's inserts among them), kept from the rows' feed.
Readers read both at every level (sequential, read-your-writes, snapshot, any) through
every fault of the demo, the maintainer's SIGKILL among them; a client follows the
accounts' change feed from the load on.  At the end every read is recomputed from that
feed at the position the read reports (:mod:`rubberband.checkers.views`): nothing
missing, nothing extra, no aggregate off by one change; and every ``bank`` read shows
the bank's whole total.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
from collections import Counter
from typing import Any

from rubberband.engine import ROWS, row_key

ACCOUNTS = 40
START = 1_000
TOTAL = ACCOUNTS * START
LO, HI = ("acct", 0), ("acct", ACCOUNTS)
TICKETS = ("tickets", "rloc")
T_LO, T_HI = "N", "O"
"""The tickets of the table view: codes from N up to O (a 36th of the loaded ones, and
every ticket the demo inserts)."""
LEVELS = ("sequential", "read-your-writes", "snapshot", "any")


def views() -> list[Any]:
    from rubberband.views import view_def

    return [
        view_def("bank", "aggregate", (LO, HI), aggregates={
            "accounts": ["count", None], "total": ["sum", None], "lowest": ["min", None]}),
        view_def("overdrawn", "selection", (LO, HI), where=[(None, "<", 0)]),
        view_def("tickets_n", "index", (T_LO, T_HI), on="bookingStatus", columns=["rloc"],
                 table=TICKETS),
    ]  # fmt: skip


class BankViews:
    """The views' part of the demo: ``demo`` lends its clients, clock and stop event."""

    def __init__(self, demo: Any, seed: int) -> None:
        self.demo = demo
        self.rng = random.Random(seed)
        self.views = views()
        self.reads: dict[str, list[Any]] = {v.name: [] for v in self.views}
        self.events: list[Any] = []
        self.base: dict[Any, Any] = {}
        self.start = 0
        self.table_events: list[Any] = []
        self.table_base: dict[Any, Any] = {}
        self.table_start = 0
        self.transfers = 0
        self.maintainer: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._feeds: list[asyncio.Task[None]] = []
        self.settled = asyncio.Event()
        """Set once the workload's every operation has returned: a feed's page read
        after it holds every write a view read can have seen."""

    # ------------------------------------------------------------------ set-up
    async def setup(self) -> None:
        """The accounts, the views over them and the maintainer that backfills them;
        the change feed followed from the accounts' first state."""
        rb = await self.demo.connect("bank-load", "maintainer")  # (it defines the views)
        try:
            await rb.put_many({("acct", i): START for i in range(ACCOUNTS)})
            rows, self.start = await rb.read(("scan", LO, HI), with_position=True)
            self.base = dict(rows)
            # The table's rows as the feed names them, at one position (the engine's
            # operations build the select: Rubberband names no engine).
            select, pairs = rb.core.ops.rows_read(*TICKETS, T_LO, T_HI)
            result, self.table_start = await rb.read(select, "sequential", with_position=True)
            self.table_base = {row_key(TICKETS[0], k): {"row": r} for k, r in pairs(result)}
            for v in self.views:
                spec = {k: x for k, x in v.to_dict().items()
                        if k not in ("name", "kind", "source", "tables")}  # fmt: skip
                table = v.table_of(0)
                await rb.create_view(v.name, v.source, v.kind, table=table, **spec)
        finally:
            await rb.close()
        self.maintainer = self._maintain()
        self._feeds = [
            asyncio.ensure_future(self._follow(self.start, LO, HI, self.events, None)),
            asyncio.ensure_future(self._follow(
                self.table_start, T_LO, T_HI, self.table_events, TICKETS[0])),
        ]  # fmt: skip

    def _maintain(self) -> subprocess.Popen[bytes]:
        d = self.demo.d
        with (d / "maintainer.log").open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "rubberband.tools.cli", "views", "maintain",
                 "--state-dir", str(d)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def _follow(
        self, since: int, lo: Any, hi: Any, events: list[Any], table: str | None
    ) -> None:
        """A change feed (the accounts', or ``table``'s rows in ``[lo, hi)``), every
        write once, until a page read after :attr:`settled` comes back empty (a read
        that fails is retried: the feed goes on from where it was).  Not at the demo's
        stop: a write a view read saw may land after it."""
        rb = await self.demo.connect("bank-feed")
        try:
            while True:
                final = self.settled.is_set()
                try:
                    page = await rb.changes(since, lo, hi)
                except Exception:
                    await asyncio.sleep(0.2)
                    with contextlib.suppress(Exception):
                        await rb.close()
                    rb = await self.demo.connect("bank-feed")
                    continue
                events.extend(page.events if table is None else _rows_of(table, page.events))
                since = page.position
                if final and not page.events:
                    return
                await asyncio.sleep(0.05)
        finally:
            with contextlib.suppress(Exception):
                await rb.close()

    # ------------------------------------------------------------------ workload
    async def transfer(self) -> None:
        """Atomic transfers between two accounts: the total stays ``TOTAL``."""
        rb = await self.demo.connect("bank")
        try:
            while not self.demo.stop.is_set():
                a, b = self.rng.sample(range(ACCOUNTS), 2)
                amount = self.rng.randrange(1, 400)
                t = self.demo.now()
                try:
                    await rb.add_many({("acct", a): -amount, ("acct", b): amount})
                    self.transfers += 1
                    self.demo.timed(t, True)
                except Exception:
                    self.demo.timed(t, False)
                    await asyncio.sleep(0.05)
                    with contextlib.suppress(Exception):
                        await rb.close()
                    rb = await self.demo.connect("bank")
        finally:
            with contextlib.suppress(Exception):
                await rb.close()

    async def read(self) -> None:
        """Both views at every level in turn, each read kept with the position it
        reports."""
        from rubberband.checkers.views import ViewRead

        rb = await self.demo.connect("bank-reader")
        n = 0
        try:
            while not self.demo.stop.is_set():
                n += 1
                view = self.views[n % len(self.views)]
                level = LEVELS[(n // len(self.views)) % len(LEVELS)]
                t = self.demo.now()
                try:
                    rows, at = await rb.view(view.name).scan(level=level, with_position=True)
                    self.reads[view.name].append(ViewRead(at, rows, level=level))
                    self.demo.timed(t, True)
                except Exception:  # through the faults: not judged, counted as failed
                    self.demo.timed(t, False)
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.02)
        finally:
            with contextlib.suppress(Exception):
                await rb.close()

    # ------------------------------------------------------------------ the fault
    async def kill_maintainer(self) -> None:
        """SIGKILL the maintainer and start another: it starts over from a snapshot,
        and a sequential read waits until it has caught up."""
        if self.maintainer is not None:
            self.maintainer.kill()
            self.maintainer.wait()
        self.maintainer = self._maintain()
        self.restarts += 1
        rb = await self.demo.connect("bank-wait")
        try:

            async def caught_up() -> bool:
                try:
                    await asyncio.wait_for(rb.view("bank").get([None]), 5)
                except Exception:
                    return False
                return True

            await self.demo.wait_until("the new maintainer's first view", caught_up)
        finally:
            await rb.close()

    # ------------------------------------------------------------------ checks
    async def verify(self) -> dict[str, Any]:
        """The checks, once every worker of the workload has returned."""
        from rubberband.checkers.views import check_view_reads

        self.settled.set()
        for feed in self._feeds:
            try:
                await asyncio.wait_for(feed, 30)
            except Exception as e:
                self.demo.failures.append(f"a change feed did not end: {e!r:.100}")
        self.close()
        problems: list[str] = []
        for v in self.views:
            if v.table_of(0) is None:
                problems += check_view_reads(
                    v, (self.base, self.start), self.events, self.reads[v.name]
                )
            else:
                problems += check_view_reads(
                    v, (self.table_base, self.table_start), self.table_events, self.reads[v.name]
                )
        whole = [r for r in self.reads["bank"] if r.rows]
        off = [r.position for r in whole if r.rows[0][1].get("total") != TOTAL
               or r.rows[0][1].get("accounts") != ACCOUNTS]  # fmt: skip
        levels = Counter(r.level for rs in self.reads.values() for r in rs)
        return {
            "view_reads": sum(levels.values()),
            "view_levels": dict(levels),
            "view_problems": problems[:5],
            "view_total_off": off[:5],
            "overdrawn_sizes": sorted({len(r.rows) for r in self.reads["overdrawn"]}),
            "transfers": self.transfers,
            "feed_events": len(self.events),
            "table_events": len(self.table_events),
            "ticket_view_sizes": sorted({len(r.rows) for r in self.reads["tickets_n"]})[-3:],
            "maintainer_restarts": self.restarts,
        }

    def close(self) -> None:
        """Stop the maintainer (SIGTERM, then SIGKILL after 10 s); again is harmless."""
        m, self.maintainer = self.maintainer, None
        if m is not None:
            m.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                m.wait(10)
            m.kill()
            m.wait()

    @staticmethod
    def valid(checks: dict[str, Any]) -> bool:
        levels = checks["view_levels"]
        return (
            not checks["view_problems"]
            and not checks["view_total_off"]
            and all(levels.get(level, 0) > 0 for level in LEVELS)
        )

    @staticmethod
    def summary(checks: dict[str, Any]) -> list[str]:
        levels = ", ".join(f"{n} {level}" for level, n in sorted(checks["view_levels"].items()))
        exact = "every one exact" if not checks["view_problems"] else "NOT EXACT"
        return [
            f"  views: {checks['view_reads']:,} reads of bank, overdrawn and tickets_n "
            f"({levels}), {exact} against the accounts' change feed "
            f"({checks['feed_events']:,} writes) and the Ticket rows' "
            f"({checks['table_events']:,}) {checks['view_problems'] or ''}",
            f"  tickets_n (an index of a table): largest reads {checks['ticket_view_sizes']} rows",
            f"  bank: {checks['transfers']:,} transfers; the total {TOTAL:,} in every read "
            f"{'yes' if not checks['view_total_off'] else checks['view_total_off']}; "
            f"overdrawn accounts seen: {checks['overdrawn_sizes'][:8]}; maintainer "
            f"SIGKILLed and replaced {checks['maintainer_restarts']} time(s)",
        ]


def _rows_of(table: str, events: list[Any]) -> list[Any]:
    """The events' changes of ``table``'s rows (a feed of a key range has key-value
    data and every table's rows in it)."""
    from rubberband.changelog import Event

    out = []
    for e in events:
        mine = tuple(c for c in e.changes if type(c[0]) is tuple and c[0][:2] == (ROWS, table))
        if mine:
            out.append(Event(e.position, mine))
    return out
