"""Asyncio hosts for the storage and super cores, on E-Cast's SDK: drivers.

A host owns one E-Cast client (a joined, listening application process) and one core,
feeds the core what arrives (deliveries, direct messages, the time) and carries out its
effects with the one driver (:func:`rubberband.driver.carry_out`); every protocol
decision is the core's.  Deliveries and direct messages go into one queue; a worker
hands them to the core in batches.  The storage core runs on a single worker thread,
because its engine may block (a scan, a Memcached round trip, a large receive): the event
loop keeps confirming deliveries to the routers and answering the supers' heartbeats
meanwhile, so a busy process is not mistaken for a dead one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import msgpack

from ecast import Client, Effects, MessageTooLarge, NodeId, daemon_kit, step_kept
from rubberband.driver import INTAKE_BATCH, LoopGate, carry_out
from rubberband.outputs import Submit
from rubberband.proto import Answer, Answers, BasicRead, Left, Peek, Ping, Whole
from rubberband.storage import StorageCore, short_batches
from rubberband.super import SuperCore
from rubberband.supervision import LeaveDone, Leaving, Reconfigured, Stalled, Voted, pong

log = logging.getLogger("rubberband")
T = TypeVar("T")

BATCH = INTAKE_BATCH
INBOX_HIGH = 4 * BATCH
"""Deliveries waiting for the engine beyond which the host stops taking more from E-Cast:
what the SDK then holds is unconfirmed (a storage process confirms deliveries as it
takes them), so unstable at the routers, and E-Cast's flow control slows the writers
down to what the engine applies (an unbounded inbox hid a slow engine from flow control:
it grew without end, and a keyspace message behind it waited too)."""
HISTORY = 3600
"""Seconds of load figures a super keeps for its console."""
EVENTS = 500
"""Events a super keeps for its console."""
FIGURES_EVERY = 0.25
"""Seconds between refreshes of a storage process's figures: an engine's ``stats`` may
sum over its blocks or ask its server (memcached), too dear for every batch; the
supers' heartbeats read them every 0.5 s."""
PEER_LAG = 16_384
"""Direct messages a peer may leave unacknowledged before this process waits for it."""
DELIVERIES = 0
"""Inbox item ``(DELIVERIES, [Delivery, ...])``: a batch from the SDK, in ``t`` order."""
DIRECT = 1
"""Inbox item ``(DIRECT, src, message)``: a direct message for the core."""
WAKE: tuple[Any, ...] = ("wake",)
"""Put in the inbox when an urgent direct message waits: the worker takes those first."""


class _Inbox:
    """A host's inbox: a FIFO with one consumer, its worker.

    Not an ``asyncio.Queue``: on Python 3.11 every wait of one asks for the running loop,
    which makes a ``getpid`` system call, and a process hosting sixteen storage processes
    waited thousands of times a second (2 % of its time).  This one keeps its loop."""

    __slots__ = ("_items", "_loop", "_waiter")

    def __init__(self) -> None:
        self._items: deque[tuple[Any, ...]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: tuple[Any, ...]) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> tuple[Any, ...]:
        return self._items.popleft()

    async def get(self) -> tuple[Any, ...]:
        while not self._items:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            await waiter
        return self._items.popleft()


def too_large(payload: Any, why: str) -> Any:
    """The answer a reader gets instead of ``payload``, an answer too big to send: each
    of its reads refused with ``why`` (None: not an answer)."""
    why = f"the answer is too large to send ({why}): read less at once"
    if type(payload) is Answer:
        return Answer(payload.request, payload.covered, None, why, payload.position, payload.ok)
    if type(payload) is Whole:
        rows = tuple((i, None, None, why) for i in range(len(payload.results)))
        return Answers(payload.request, payload.position, True, rows)
    if type(payload) is Answers:
        rows = tuple((row[0], row[1], None, why) for row in payload.rows)
        return Answers(payload.request, payload.position, payload.ok, rows)
    return None


class _Host:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.inbox = _Inbox()
        self._room = asyncio.Event()
        self._room.set()
        self.urgent: list[tuple[Any, ...]] = []
        """Direct messages that go ahead of the inbox (a ``WAKE`` in it says so)."""
        self._waiting = 0
        """Deliveries in the inbox (flow control counts these, not inbox items)."""
        self._taken = 0
        """Deliveries taken from the SDK into the inbox so far."""
        self._behind: deque[tuple[int, tuple[Any, ...]]] = deque()
        """Direct messages held until the deliveries received before them are in the
        inbox (:meth:`_after_deliveries`), with how many those are."""
        self.stopped: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.done = asyncio.Event()
        self.figures: dict[str, Any] = {}
        """What heartbeats report to the supers (a storage process: its load and size)."""
        self._sent: set[NodeId] = set()
        """Peers sent direct messages since the host last waited for slow ones."""
        self._tokens: dict[Any, Any] = {}
        """E-Cast message id -> the core's token, for its acknowledgement."""

    async def _read_deliveries(self) -> None:
        """Deliveries go into the inbox a batch at a time, as the SDK hands them over."""
        try:
            while True:
                batch = await self.client.delivery_batch(BATCH)
                if not batch:
                    break
                self.inbox.put_nowait((DELIVERIES, batch))
                self._waiting += len(batch)
                self._taken += len(batch)
                behind = self._behind
                while behind and behind[0][0] <= self._taken:
                    self.inbox.put_nowait(behind.popleft()[1])
                await self._on_taken(batch)
                if self._waiting >= INBOX_HIGH:
                    self._room.clear()
                    await self._room.wait()
        except Exception as e:  # the process was suspected, or lost every router
            self._stop(f"E-Cast stopped: {e}")
            return
        self._stop("E-Cast closed")

    async def _on_taken(self, batch: list[Any]) -> None:
        """``batch`` is in the inbox: what to do before taking more deliveries."""

    def pong_figures(self) -> dict[str, Any]:
        return self.figures

    async def _read_direct(self) -> None:
        while True:
            src, payload = await self.client.receive_direct()
            if type(payload) is Ping:
                # Heartbeats are answered on the loop, never behind the engine's work,
                # with this process's figures (load and size) when it has any.
                carry_out(pong(src, payload, self.pong_figures()), self)
                continue
            if self._intercept(src, payload):
                continue
            if self._urgent(payload):
                self.urgent.append((DIRECT, src, payload))
                self.inbox.put_nowait(WAKE)
            elif self._behind or (
                self._after_deliveries(payload) and self.client.received > self._taken
            ):  # (a direct message behind a held one waits too: directs keep their order)
                self._behind.append((self.client.received, (DIRECT, src, payload)))
            else:
                self.inbox.put_nowait((DIRECT, src, payload))

    def _urgent(self, payload: Any) -> bool:
        """A direct message the core takes ahead of waiting deliveries."""
        return False

    def _intercept(self, src: NodeId, payload: Any) -> bool:
        """A direct message the host itself answers, on the loop (True: consumed)."""
        return False

    def _after_deliveries(self, payload: Any) -> bool:
        """A direct message the core must take only after every delivery this process
        had received when it came (and so had confirmed: those writes may be
        acknowledged to their clients already)."""
        return False

    def _stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
            log.warning("event=stop reason=%s", reason.replace(" ", "_")[:200])
        self.done.set()

    def _start(self, *coros: Any) -> None:
        for c in coros:
            task = asyncio.ensure_future(c)
            task.add_done_callback(self._ended)
            self._tasks.append(task)

    def _ended(self, task: asyncio.Future[Any]) -> None:
        """A loop of the process ended by an exception: stop (fail-stop, so the supers
        see it gone and replace it), never run on without it, answering pings while
        applying nothing."""
        if task.cancelled() or task.exception() is None:
            return
        e = task.exception()
        log.error("event=internal_error error=%r", e, exc_info=e)
        self._stop(f"internal error: {type(e).__name__}: {e}")

    async def _batch(self) -> list[tuple[Any, ...]]:
        """Inbox items for one step of the core: ``(DELIVERIES, [Delivery, ...])`` and
        ``(DIRECT, src, payload)``: about ``BATCH`` deliveries, and at most ``BATCH`` items
        besides the urgent ones (a migration's pulls and chunks come one item each)."""
        first = await self.inbox.get()
        items: list[tuple[Any, ...]] = []
        if self.urgent:
            items += self.urgent
            self.urgent.clear()
        taken = 0
        if first is not WAKE:
            items.append(first)
            if first[0] == DELIVERIES:
                taken += len(first[1])
        while taken < BATCH and len(items) < BATCH and not self.inbox.empty():
            item = self.inbox.get_nowait()
            if item is not WAKE:
                items.append(item)
                if item[0] == DELIVERIES:
                    taken += len(item[1])
        self._waiting -= taken
        if self._waiting < INBOX_HIGH // 2:
            self._room.set()
        return items

    # The driver's IO (rubberband.driver.IO), on the loop.
    def send(self, dst: NodeId, msg: Any) -> None:
        try:
            self.client.send_direct_nowait(dst, msg.payload)
            self._sent.add(dst)
        except MessageTooLarge as e:
            # An answer too big for a message (a scan or a select of too much at once):
            # the reader gets an error that says so, not a read that never ends.
            refusal = too_large(msg.payload, str(e))
            log.warning("event=output_failed what=direct error=%s", str(e).replace(" ", "_"))
            if refusal is not None:
                with contextlib.suppress(Exception):
                    self.client.send_direct_nowait(dst, refusal)
        except Exception as e:
            log.warning("event=output_failed what=direct error=%s", str(e).replace(" ", "_"))

    def submit(self, submissions: list[Submit]) -> None:
        try:
            ids = self.client.submit_batch([(s.payload, s.header) for s in submissions])
        except Exception as e:
            log.warning("event=output_failed what=submit error=%s", str(e).replace(" ", "_"))
            return
        for mid, s in zip(ids, submissions, strict=True):
            if s.token is not None:
                self._tokens[mid] = s.token

    def suspect(self, who: tuple[NodeId, ...]) -> None:
        """A vote, on E-Cast's control path; its outcome is the config's business."""

        async def vote() -> None:
            try:
                await self.client.suspect(list(who))
            except Exception as e:
                log.warning("event=output_failed what=suspect error=%s", str(e).replace(" ", "_"))

        self._tasks.append(asyncio.ensure_future(vote()))
        self._tasks = [t for t in self._tasks if not t.done()]

    def upcall(self, item: Any) -> None:
        pass

    def stop(self, reason: str) -> None:
        self._stop(reason)

    def wake(self, at: float | None) -> None:
        pass

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t


class StorageHost(_Host):
    """Runs a :class:`StorageCore` under an E-Cast client that joined as ``storage:...``."""

    def __init__(self, client: Client, core: StorageCore) -> None:
        super().__init__(client)
        self.core = core
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="engine")
        self._busy = asyncio.Lock()
        """Held while the core steps (on the loop or the engine thread) and while
        :meth:`inspect` reads it on the engine thread: a step on the loop never runs
        beside that read."""
        self._leaving: Leaving | None = None
        self._left: asyncio.Future[LeaveDone] | None = None
        self.step_seconds = daemon_kit.Histogram()
        """How long each batch of deliveries took (on the engine thread or the loop)."""
        self.queued_since: float | None = None
        """Since when delivered items have waited for their ranges (None: nothing waits)."""
        self._figured_at = -FIGURES_EVERY
        self._durable = getattr(core.engine, "durable", False) is True

    def pong_figures(self) -> dict[str, Any]:
        """The figures and their age: an idle process refreshes none, so the clients
        they name are those of its last work, which the supers then count no more."""
        return {**self.figures, "age_s": round(time.monotonic() - self._figured_at, 2)}

    async def _on_taken(self, batch: list[Any]) -> None:
        # Confirmed as taken, not as received: what waits in the E-Cast client is
        # unstable at the routers, whose flow control then slows the writers as soon
        # as this process falls behind, not once the client's queue of 10,000 is full
        # (with the intake held for a slowed maintainer, below, its view was compacted
        # under in two runs of three so: tests/integration/test_view_holds.py).  A
        # durable engine's deliveries are confirmed once on disk, after their step.
        if not self._durable:
            self.client.durable(batch[-1].t)
        # A maintainer far behind this process's change log holds the intake back
        # (rubberband.holds); the core, on whichever thread steps it, replaces the
        # hold's limit whole, and only the intake reads it.
        wait = self.core.holds.pause(batch[-1].t, time.monotonic())
        if wait > 0:
            await asyncio.sleep(wait)

    def _urgent(self, payload: Any) -> bool:
        return type(payload) in self.core.URGENT

    def _after_deliveries(self, payload: Any) -> bool:
        # A basic read answers from the current state: a write its client (or anyone)
        # saw acknowledged must be in it.  Under backpressure deliveries wait in the
        # SDK, confirmed, while direct messages go on: a basic read overtook them, and
        # a view read at level `any` saw a progress and rows older than it.  A peek at
        # the change log likewise: a change delivered must be in its answer.
        return type(payload) is BasicRead or type(payload) is Peek

    def _intercept(self, src: NodeId, payload: Any) -> bool:
        if type(payload) is Left:
            if self._leaving is not None:
                carry_out(self._leaving.on_left(src, payload), self)
            return True
        return False

    async def leave(self, replace_with: str | None = None, timeout: float = 300.0) -> str | None:
        """Take this process off the ring before it parts (:class:`Leaving`): None when
        that is done, or there was nothing to do (a standby); else why not."""
        if not (await self._status())["active"]:
            return None
        loop = asyncio.get_running_loop()
        self._leaving = leaving = Leaving(replace_with, loop.time(), timeout)
        self._left = loop.create_future()
        try:
            while not self._left.done() and self.stopped is None:
                carry_out(leaving.on_tick(self._supers(), loop.time()), self)
                await asyncio.wait([self._left], timeout=0.5)
        finally:
            self._leaving = None
        if not self._left.done():
            return f"stopped before leaving: {self.stopped}"
        done = self._left.result()
        if done.error is not None:
            return done.error
        log.info("event=left_ring version=%s", done.version)
        await self._transfers_done(leaving.deadline - loop.time())
        return None

    def upcall(self, item: Any) -> None:
        if type(item) is LeaveDone and self._left is not None and not self._left.done():
            self._left.set_result(item)

    def _supers(self) -> list[str]:
        return sorted(p for p in self.client.peers() if p.startswith("super:"))

    async def _transfers_done(self, within: float) -> None:
        """Wait until no copy streams out of this process (the receivers have their data)."""
        deadline = time.monotonic() + within
        while (await self._status())["transfers_out"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def _status(self) -> dict[str, Any]:
        """The core's status, read on the engine thread (the core is not shared)."""
        return await self.inspect(self.core.status)

    async def inspect(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the engine thread between two steps: the core and the engine
        are not shared, and a reader on the loop (``/metrics``, ``/health``) could walk
        their tables while a step changes them."""
        loop = asyncio.get_running_loop()
        await self._busy.acquire()
        try:
            job = loop.run_in_executor(self._pool, fn)
        except RuntimeError:  # the pool is shut down: no step runs any more
            self._busy.release()
            return fn()
        except BaseException:
            self._busy.release()
            raise
        # The lock goes when the read ends, not when its caller stops waiting (a
        # timeout): a step on the loop must not run beside a read still on the thread.
        job.add_done_callback(self._inspected)
        return await asyncio.shield(job)

    def _inspected(self, job: asyncio.Future[Any]) -> None:
        self._busy.release()
        if not job.cancelled():
            job.exception()  # seen, if the caller stopped waiting

    async def run(self) -> str:
        """Until the process must stop; returns why."""
        self._start(self._read_deliveries(), self._read_direct(), self._work())
        await self.done.wait()
        await self.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        return self.stopped or "stopped"

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        # An engine that never blocks for long runs on the loop: a thread hop per batch
        # cost more than its work (the null engine of the protocol benchmarks).
        inline = getattr(self.core.engine, "blocking", True) is False
        # A durable engine has a batch on disk when it returns from it: only then are
        # the batch's deliveries confirmed (the client was connected so), and so an
        # acknowledged write is on disk at every replica.
        durable = self._durable
        # An engine whose operations on single keys are short runs a batch of nothing
        # else on the loop: the thread hop cost the storage processes about a fifth of
        # their CPU a write (6,000 writes/s, docs/benchmarks.md); scans and the rest
        # keep the thread.
        points = not durable and getattr(self.core.engine, "inline_points", False) is True
        gate = LoopGate(loop.time)  # after a slow step on the loop, the thread's turn
        while self.stopped is None:
            items = await self._batch()
            async with self._busy:
                if inline:
                    fx = self._step(items)
                elif (
                    points
                    and gate.open()
                    and all(i[0] == DELIVERIES for i in items)
                    and short_batches(self.core, [i[1] for i in items])
                ):
                    # What the step makes is frozen, never walked by the collector
                    # (a young collection runs first, outside the gate's CPU count).
                    fx = step_kept(gate.run, self._step, items)
                else:
                    fx = await loop.run_in_executor(self._pool, self._step, items)
            # (a core the engine failed in has stopped: what it did not sync is never
            # confirmed as synced)
            if durable and self.stopped is None and self.core.stopped is None:
                last = [item[1][-1].t for item in items if item[0] == DELIVERIES and item[1]]
                if last:
                    self.client.durable(max(last))
            await self._emit_all(fx)

    def _step(self, items: list[tuple[Any, ...]]) -> Effects:
        """On the engine thread: feed the core."""
        started = time.perf_counter()
        try:
            return self._feed(items)
        finally:
            self.step_seconds.observe(time.perf_counter() - started)
            if not self.core.queue:
                self.queued_since = None
            elif self.queued_since is None:
                self.queued_since = time.monotonic()

    def _feed(self, items: list[tuple[Any, ...]]) -> Effects:
        core = self.core
        fx = Effects()
        # The core's clock: its change log keeps changes for an age by it (at 0 it
        # kept every change, whatever --change-log-age said).
        now = time.monotonic()
        directs: list[tuple[NodeId, Any]] = []
        # Adjacent batches of deliveries go to the core as one: one engine batch, and on
        # a durable engine one group commit.  The SDK hands deliveries over a packet at
        # a time, and on the log engine at 2,000 writes/s a step took 3.5 of them, each
        # synced alone, and a write's median latency was twice what it is now.
        run: list[Any] = []
        for item in items:
            if item[0] == DELIVERIES:
                if directs:  # in order: a basic read before a keyspace change stays so
                    fx.extend(core.on_directs(directs, now))
                    directs = []
                run += item[1]
            else:
                if run:
                    fx.extend(core.on_deliveries(run, now))
                    run = []
                directs.append((item[1], item[2]))
        if run:
            fx.extend(core.on_deliveries(run, now))
        if directs:
            fx.extend(core.on_directs(directs, now))
        if now - self._figured_at >= FIGURES_EVERY:
            self._figured_at = now
            self.figures = core.figures()
        return fx

    async def _emit_all(self, fx: Effects) -> None:
        """A batch's effects, carried out on the loop.  Direct messages go out at once:
        answers are bounded by what clients asked and chunks by what receivers pulled.
        Only then, a peer that lags by more than ``PEER_LAG`` messages (a client that
        does not read its answers) is waited for, at most its ack timeout; waiting per
        message, at a lag of 1,024, paced a client with a thousand snapshot reads in
        flight to a few thousand a second while every core idled."""
        carry_out(fx, self)
        sent, self._sent = self._sent, set()
        for peer in sent:
            with contextlib.suppress(Exception):
                await self.client.send_direct_drained(peer, PEER_LAG)


class SuperHost(_Host):
    """Runs a :class:`SuperCore`: feeds it deliveries, direct messages and the time, and
    serves its reconfigurations to the admin API."""

    def __init__(self, client: Client, core: SuperCore) -> None:
        super().__init__(client)
        self.core = core
        self.joined = asyncio.Event()
        self.changed = asyncio.Event()
        self.keyspace_file: str | None = None
        """Where the keyspace is recorded at every change (None: nowhere)."""
        self._recorded: Any = None
        self._requests: dict[int, asyncio.Future[Reconfigured]] = {}
        self._next_request = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        client.ack_listener = self._on_acks
        self.samples: deque[tuple[float, float, float | None, int]] = deque(maxlen=HISTORY)
        """``(wall time, operations applied per second by the ring's storage processes,
        slowest heartbeat round trip in ms, items waiting for their ranges)``: one a
        second for the last hour, so an operator's console has charts at once."""
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS)
        """What happened to the cluster, as this super saw it: reconfigurations asked of
        it and their outcome, repairs, suspicions, keyspace versions and who they put
        on or took off the ring (wall times)."""
        self._ring_seen: tuple[int | None, tuple[NodeId, ...]] = (None, ())

    def event(self, what: str, **detail: Any) -> None:
        self.events.append({"t": round(time.time(), 3), "what": what, **detail})

    def routers(self) -> list[dict[str, Any]]:
        """The routers as this super's E-Cast endpoint knows them: the view's succession
        (leader first) and any router it knew that the view no longer holds, each with
        whether this process has a connection to it."""
        ep = self.client.endpoint
        if ep is None:
            return []
        routes = self.client.runtime.routes
        directory = self.client.runtime.directory
        view = list(ep.succession)
        gone = sorted(r for r in ep.known_routers if r not in view and r in directory)
        return [
            {
                "name": r,
                "role": "leader" if i == 0 else "follower" if r in view else "left the view",
                "connected": r in routes,
                "address": directory.get(r),
            }
            for i, r in enumerate([*view, *gone])
        ]

    async def _sample(self) -> None:
        """Once a second: the load figures into :attr:`samples`, and a new keyspace
        version into :attr:`events` (with who it put on or took off the ring)."""
        while self.stopped is None:
            await asyncio.sleep(1.0)
            c = self.core.config
            if c is None:
                continue
            ring = tuple(c.keyspace.processes)
            version, before = self._ring_seen
            if version is not None and c.version != version:
                self.event(
                    "version", version=c.version,
                    joined=[p for p in ring if p not in before],
                    left=[p for p in before if p not in ring],
                )  # fmt: skip
            self._ring_seen = (c.version, ring)
            loads = self.core.watch.loads
            mine = [loads[p] for p in ring if p in loads]
            rtts = [f["rtt_ms"] for f in mine if f.get("rtt_ms") is not None]
            self.samples.append(
                (
                    round(time.time(), 1),
                    round(sum(f.get("ops_per_s") or 0.0 for f in mine), 1),
                    max(rtts) if rtts else None,
                    sum(f.get("queued") or 0 for f in mine),
                )
            )

    @property
    def counts(self) -> dict[str, int]:
        r = self.core.reconfigurations
        return {"votes": self.core.watch.votes, **r.counts}

    @property
    def pending_since(self) -> dict[int, float]:
        return self.core.reconfigurations.pending_since

    @property
    def reconfiguration_seconds(self) -> daemon_kit.Histogram:
        h = self._histogram
        seconds = self.core.reconfigurations.seconds
        while seconds:
            h.observe(seconds.pop())
        return h

    _histogram = daemon_kit.Histogram()

    async def run(self) -> str:
        self._histogram = daemon_kit.Histogram()
        self._start(self._read_deliveries(), self._read_direct(), self._work(), self._sample())
        self._tick()
        await self.done.wait()
        await self.close()
        if self._timer is not None:
            self._timer.cancel()
        return self.stopped or "stopped"

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def _work(self) -> None:
        while self.stopped is None:
            fx = Effects()
            for item in await self._batch():
                if item[0] == DELIVERIES:
                    fx.extend(self.core.on_deliveries(item[1], self._now()))
                else:
                    fx.extend(self.core.on_direct(item[1], item[2], self._now()))
            carry_out(fx, self)
            if self.core.config is not None:
                self.joined.set()
                self._record()
            self.changed.set()
            self.changed = asyncio.Event()

    def _record(self) -> None:
        """Write the keyspace down (``keyspace_file``) when it changed: what a
        restart of the whole cluster restores.  Atomic (a new file renamed over the
        old, synced), so a crash leaves the old record or the new, never half."""
        record = self.core.record()
        if self.keyspace_file is None or record is None or record == self._recorded:
            return
        path = Path(self.keyspace_file)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(msgpack.packb(record, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._recorded = record

    def _on_acks(self, acks: list[Any]) -> None:
        now = self._now()
        for ack in acks:
            token = self._tokens.pop(ack.id, None)
            if token is not None:
                carry_out(self.core.on_acked(token, ack.delivered, now), self)

    def _tick(self) -> None:
        self._timer = self._timer_at = None
        if self.stopped is None:
            carry_out(self.core.on_tick(self._now()), self)

    # The driver's IO, besides _Host's.
    def upcall(self, item: Any) -> None:
        t = type(item)
        if t is Reconfigured:
            fut = self._requests.pop(item.request, None)
            if fut is not None and not fut.done():
                fut.set_result(item)
            elif type(item.request) is tuple and item.request[:1] == ("repair",):
                what = "repaired" if item.error is None else "repair_failed"
                detail = item.result.get("version") if item.result else item.error
                log.warning("event=%s detail=%s", what, str(detail).replace(" ", "_")[:200])
                self.event(what, request=list(item.request[1:]), detail=str(detail)[:300])
        elif t is Voted:
            log.warning("event=vote_suspect process=%s silent_s=%.1f", item.process, item.silent)
            self.event("suspected", process=item.process, silent_s=round(item.silent, 1))
        elif t is Stalled:
            log.warning("event=beat_stalled seconds=%.1f", item.seconds)
            self.event("stalled", seconds=round(item.seconds, 1))

    def wake(self, at: float | None) -> None:
        if at is None or (self._timer_at is not None and self._timer_at <= at):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._tick)

    def status(self) -> dict[str, Any]:
        """The core's status with what this host knows besides: each storage process's
        load and size (from heartbeats) and the leading router."""
        st = self.core.status(self._now())
        if st.get("joined"):
            st["leader"] = self.client.leader
            st["routers"] = self.routers()
        return st

    async def reconfigure(
        self,
        op: str,
        *args: Any,
        force: bool = False,
        dry_run: bool = False,
        wait: bool = True,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Plan, submit, retry while stale, and (with ``wait``) wait until every involved
        storage process is ready: the core's reconfiguration, awaited.  Raises
        :class:`~rubberband.errors.Refused` or ``TimeoutError``."""
        await asyncio.wait_for(self.joined.wait(), timeout)
        self._next_request += 1
        rid = self._next_request
        fut: asyncio.Future[Reconfigured] = asyncio.get_running_loop().create_future()
        self._requests[rid] = fut
        fx = self.core.reconfigure(
            rid, op, *args, now=self._now(), force=force, dry_run=dry_run, wait=wait,
            timeout=timeout,
        )  # fmt: skip
        carry_out(fx, self)
        asked = {"op": op, "args": [str(a)[:100] for a in args]}
        try:
            done = await asyncio.wait_for(fut, timeout + 5.0)
        except TimeoutError:
            if not dry_run:
                self.event("reconfigure_timeout", **asked)
            raise
        finally:
            self._requests.pop(rid, None)
        if done.error is not None:
            if not dry_run:
                self.event("refused", **asked, error=str(done.error)[:300])
            raise done.error
        assert done.result is not None
        if not dry_run:
            self.event("reconfigured", **asked, version=done.result.get("version"))
        return done.result
