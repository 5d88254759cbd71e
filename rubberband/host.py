"""Asyncio hosts for the storage and super cores, on E-Cast's SDK.

A host owns one E-Cast client (a joined, listening application process) and one core.
Deliveries and direct messages go into one queue; a worker hands them to the core in
batches.  The storage core runs on a single worker thread, because its engine may block
(a scan, a Memcached round trip, a large receive): the event loop keeps confirming
deliveries to the routers and answering the supers' heartbeats meanwhile, so a busy
process is not mistaken for a dead one.  Outputs go back on the loop: direct messages
(awaiting the peer's pace, so a migration stream cannot flood a slow receiver),
configuration messages to submit, or a stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ecast import Client, NodeId, daemon_kit
from rubberband.storage import ABORT, CHUNK, PULL, REFUSE, StorageCore
from rubberband.super import Proposal, Refused, SuperCore

log = logging.getLogger("rubberband")
_MIGRATION = (PULL, CHUNK, ABORT, REFUSE)

PING = "ping"
PONG = "pong"
DESCRIBE = "describe"
CONFIG = "config"
LEAVE = "leave"
"""Storage to super: ``(LEAVE, rid, replace_with or None)``: take me off the ring."""
LEFT = "left"
"""Super to storage: ``(LEFT, rid, error or None, version or None)``, once it completed."""
BATCH = 512
INBOX_HIGH = 4 * BATCH
"""Deliveries waiting for the engine beyond which the host stops taking more from E-Cast:
the SDK's queue then fills, it stops reading from the routers, and E-Cast's flow control
slows the writers down to what the engine applies (an unbounded inbox hid a slow engine
from flow control: it grew without end, and a keyspace message behind it waited too)."""
FIGURES_EVERY = 0.25
"""Seconds between refreshes of a storage process's figures: an engine's ``stats`` may
sum over its blocks or ask its server (memcached), too dear for every batch; the
supers' heartbeats read them every 0.5 s."""
PEER_LAG = 16_384
"""Direct messages a peer may leave unacknowledged before this process waits for it."""
DELIVERIES = "d"
"""Inbox item ``(DELIVERIES, [Delivery, ...])``: a batch from the SDK, in ``t`` order."""
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
        self.stopped: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.done = asyncio.Event()
        self.figures: dict[str, int | float] = {}
        """What heartbeats report to the supers (a storage process: its load and size)."""

    async def _read_deliveries(self) -> None:
        """Deliveries go into the inbox a batch at a time, as the SDK hands them over."""
        try:
            while True:
                batch = await self.client.delivery_batch(BATCH)
                if not batch:
                    break
                self.inbox.put_nowait((DELIVERIES, batch))
                self._waiting += len(batch)
                if self._waiting >= INBOX_HIGH:
                    self._room.clear()
                    await self._room.wait()
        except Exception as e:  # the process was suspected, or lost every router
            self._stop(f"E-Cast stopped: {e}")
            return
        self._stop("E-Cast closed")

    async def _read_direct(self) -> None:
        while True:
            src, payload = await self.client.receive_direct()
            if type(payload) is tuple and payload and payload[0] == PING:
                # Heartbeats are answered on the loop, never behind the engine's work,
                # with this process's figures (load and size) when it has any.
                with contextlib.suppress(Exception):
                    self.client.send_direct_nowait(src, (PONG, *payload[1:2], self.figures))
                continue
            if self._intercept(src, payload):
                continue
            if self._urgent(payload):
                self.urgent.append(("x", src, payload))
                self.inbox.put_nowait(WAKE)
            else:
                self.inbox.put_nowait(("x", src, payload))

    def _urgent(self, payload: Any) -> bool:
        """A direct message the core takes ahead of waiting deliveries."""
        return False

    def _intercept(self, src: NodeId, payload: Any) -> bool:
        """A direct message the host itself answers, on the loop (True: consumed)."""
        return False

    def _stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
            log.warning("event=stop reason=%s", reason.replace(" ", "_")[:200])
        self.done.set()

    def _start(self, *coros: Any) -> None:
        for c in coros:
            self._tasks.append(asyncio.ensure_future(c))

    async def _batch(self) -> list[tuple[Any, ...]]:
        """Inbox items for one step of the core: ``(DELIVERIES, [Delivery, ...])`` and
        ``("x", src, payload)``: about ``BATCH`` deliveries, and at most ``BATCH`` items
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
        self._left: dict[int, asyncio.Future[tuple[Any, ...]]] = {}
        self._rid = 0
        self.step_seconds = daemon_kit.Histogram()
        """How long each batch of deliveries took on the engine thread."""
        self.queued_since: float | None = None
        """Since when delivered items have waited for their ranges (None: nothing waits)."""
        self._figured_at = -FIGURES_EVERY

    def _urgent(self, payload: Any) -> bool:
        """Migration traffic goes ahead of waiting deliveries: a pull answered, or a chunk
        taken in, only after thousands of writes made every round trip of a copy wait
        for the whole backlog (seconds on a slow engine).  It may: a source reads a
        snapshot taken at the keyspace message's position, and a receiver holds back
        every write to the ranges it receives until the copy is complete."""
        return type(payload) is tuple and bool(payload) and payload[0] in _MIGRATION

    def _intercept(self, src: NodeId, payload: Any) -> bool:
        if type(payload) is tuple and len(payload) == 4 and payload[0] == LEFT:
            fut = self._left.pop(payload[1], None)
            if fut is not None and not fut.done() and src.startswith("super:"):
                fut.set_result(payload)
            return True
        return False

    async def leave(self, replace_with: str | None = None, timeout: float = 300.0) -> str | None:
        """Take this process off the ring before it parts: a super contracts it (or
        replaces it with the standby ``replace_with``) and answers once every receiver
        has its data.  None when that is done (or there was nothing to do: a standby),
        else why not (a contract below the replication factor, no super, a timeout)."""
        loop = asyncio.get_running_loop()
        if not (await self._status())["active"]:
            return None
        deadline = time.monotonic() + timeout
        last = "no super answered"
        while time.monotonic() < deadline and self.stopped is None:
            supers = sorted(p for p in self.client.peers() if p.startswith("super:"))
            for s in supers:
                self._rid += 1
                fut: asyncio.Future[tuple[Any, ...]] = loop.create_future()
                self._left[self._rid] = fut
                try:
                    self.client.send_direct_nowait(s, (LEAVE, self._rid, replace_with))
                    _, _, error, version = await asyncio.wait_for(
                        fut, max(1.0, deadline - time.monotonic())
                    )
                except Exception as e:  # unreachable, or silent until the deadline
                    last = f"{s}: {type(e).__name__} {e}".strip()
                    self._left.pop(self._rid, None)
                    continue
                if error is not None:
                    return str(error)
                log.info("event=left_ring version=%s by=%s", version, s)
                await self._transfers_done(deadline)
                return None
            await asyncio.sleep(1.0)
        return f"not taken off the ring in {timeout:g} s ({last})"

    async def _transfers_done(self, deadline: float) -> None:
        """Wait until no copy streams out of this process (the receivers have their data)."""
        while (await self._status())["transfers_out"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def _status(self) -> dict[str, Any]:
        """The core's status, read on the engine thread (the core is not shared)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.core.status)

    async def run(self) -> str:
        """Until the process must stop; returns why."""
        self._start(self._read_deliveries(), self._read_direct(), self._work())
        await self.done.wait()
        await self.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        return self.stopped or "stopped"

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        me = self.core.me
        # An engine that never blocks for long runs on the loop: a thread hop per batch
        # cost more than its work (the null engine of the protocol benchmarks).
        inline = getattr(self.core.engine, "blocking", True) is False
        while self.stopped is None:
            items = await self._batch()
            if inline:
                outs = self._step(items, me)
            else:
                outs = await loop.run_in_executor(self._pool, self._step, items, me)
            await self._emit_all(outs)

    def _step(self, items: list[tuple[Any, ...]], me: NodeId) -> list[tuple[Any, ...]]:
        """On the engine thread: feed the core, safe deliveries in runs."""
        started = time.perf_counter()
        try:
            return self._feed(items, me)
        finally:
            self.step_seconds.observe(time.perf_counter() - started)
            if not self.core.queue:
                self.queued_since = None
            elif self.queued_since is None:
                self.queued_since = time.monotonic()

    def _feed(self, items: list[tuple[Any, ...]], me: NodeId) -> list[tuple[Any, ...]]:
        core = self.core
        out: list[tuple[Any, ...]] = []
        run: list[tuple[int, Any]] = []
        for item in items:
            if item[0] == DELIVERIES:
                for d in item[1]:
                    m = d.message
                    if d.unsafe:
                        if run:
                            out += core.deliver(run)
                            run = []
                        out += core.deliver_unsafe(m, d.frontier, d.accepted)
                    elif m.sender == me and m.kind == "join":
                        out += core.joined(m.payload)
                    else:
                        run.append((d.t, m))
            else:
                if run:
                    out += core.deliver(run)
                    run = []
                out += core.direct(item[1], item[2])
        if run:
            out += core.deliver(run)
        now = time.monotonic()
        if now - self._figured_at >= FIGURES_EVERY:
            self._figured_at = now
            self.figures = self._figures()
        return out

    def _figures(self) -> dict[str, int | float]:
        """Load and size, on the engine thread: operations applied so far (the supers
        turn it into a rate), the engine's items and bytes, items waiting for ranges."""
        f: dict[str, int | float] = {"applied": self.core.stats.applied}
        with contextlib.suppress(Exception):
            e = self.core.engine.stats()
            f["items"] = int(e.get("items", 0))
            f["bytes"] = int(e.get("bytes", 0))
        f["queued"] = len(self.core.queue)
        return f

    async def _emit_all(self, outs: list[tuple[Any, ...]]) -> None:
        """A batch's outputs in order.  Direct messages go out at once: answers are
        bounded by what clients asked and chunks by what receivers pulled.  Only then,
        a peer that lags by more than ``PEER_LAG`` messages (a client that does not read
        its answers) is waited for; waiting per message, at a lag of 1,024, paced a
        client with a thousand snapshot reads in flight to a few thousand a second
        while every core idled."""
        sent: set[NodeId] = set()
        for o in outs:
            try:
                if o[0] == "direct":
                    self.client.send_direct_nowait(o[1], o[2])
                    sent.add(o[1])
                elif o[0] == "submit":
                    await self.client.enqueue(o[2], o[1], timeout=None)
                else:
                    self._stop(str(o[1]))
            except Exception as e:
                what = str(e).replace(" ", "_")
                log.warning("event=output_failed what=%s error=%s", o[0], what)
        for peer in sent:
            with contextlib.suppress(Exception):
                await self.client.send_direct_drained(peer, PEER_LAG)


class SuperHost(_Host):
    """Runs a :class:`SuperCore`: the replica, heartbeats and suspect votes, clients'
    keyspace queries, and reconfiguration requests (from the admin API)."""

    def __init__(
        self,
        client: Client,
        core: SuperCore,
        *,
        heartbeat: float = 0.5,
        suspect_after: float = 3.0,
        auto_repair: bool = True,
        repair_after: float = 2.0,
    ) -> None:
        super().__init__(client)
        self.core = core
        self.heartbeat = heartbeat
        self.suspect_after = suspect_after
        self.auto_repair = auto_repair
        self.repair_after = repair_after
        self.counts = {"votes": 0, "repairs": 0, "repairs_refused": 0, "reconfigurations": 0}
        self.heard: dict[NodeId, float] = {}
        self.loads: dict[NodeId, dict[str, Any]] = {}
        self.voted: set[NodeId] = set()
        self.changed = asyncio.Event()
        self.joined = asyncio.Event()
        self.reconfiguration_seconds = daemon_kit.Histogram()
        """Submitted reconfigurations, from planning until every receiver was ready."""
        self.pending_since: dict[int, float] = {}
        """When each pending keyspace version was first seen pending."""

    async def run(self) -> str:
        self._start(self._read_deliveries(), self._read_direct(), self._work(), self._beat())
        if self.auto_repair:
            self._start(self._repair())
        await self.done.wait()
        await self.close()
        return self.stopped or "stopped"

    async def _work(self) -> None:
        me = self.core.me
        while self.stopped is None:
            for item in await self._batch():
                if item[0] != DELIVERIES:
                    self._direct(item[1], item[2])
                    continue
                for d in item[1]:
                    m = d.message
                    if d.unsafe:
                        continue
                    if m.sender == me and m.kind == "join":
                        self.core.joined(m.payload)
                        self.joined.set()
                    else:
                        self.core.deliver([(d.t, m)])
            c = self.core.config
            if c is not None:
                now = time.monotonic()
                self.pending_since = {v: self.pending_since.get(v, now) for v in c.pending}
            self.changed.set()
            self.changed = asyncio.Event()

    def _direct(self, src: NodeId, payload: Any) -> None:
        if type(payload) is not tuple or not payload:
            return
        if payload[0] == PONG:
            now = time.monotonic()
            self.heard[src] = now
            if len(payload) >= 3 and type(payload[2]) is dict and payload[2]:
                self._load(src, now, payload)
        elif payload[0] == DESCRIBE and len(payload) == 2:
            c = self.core.config
            if c is None:
                return
            reply = (CONFIG, payload[1], c.version, c.keyspace.to_state(), c.partitioning)
            with contextlib.suppress(Exception):
                self.client.send_direct_nowait(src, reply)
        elif payload[0] == LEAVE and len(payload) == 3 and type(payload[1]) is int:
            new = payload[2]
            if src.startswith("storage:") and (new is None or type(new) is str):
                self._tasks.append(asyncio.ensure_future(self._leave(src, payload[1], new)))

    async def _leave(self, src: NodeId, rid: int, new: str | None) -> None:
        """A storage process asked to leave (SIGTERM): contract it, or replace it with
        ``new``, and answer once that completed.  Only the process itself can ask: the
        sender is the name its connection proved."""
        error: str | None = None
        version: int | None = None
        try:
            c = self.core.config
            if c is None:
                raise Refused("this super has not joined yet")
            if src in c.keyspace:
                op, args = ("replace", (src, new)) if new is not None else ("contract", (src,))
                log.info("event=leave process=%s op=%s", src, op)
                result = await self.reconfigure(op, *args, timeout=240.0)
                version = result.get("version")
            else:  # already off the ring (a repeated request): wait for what is pending
                deadline = time.monotonic() + 240.0
                while (c := self.core.config) is not None and c.pending:
                    if time.monotonic() > deadline:
                        raise TimeoutError("reconfigurations still pending after 240 s")
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.changed.wait(), 0.2)
                version = c.version if c is not None else None
        except (Refused, TimeoutError) as e:
            error = str(e)
            log.warning("event=leave_refused process=%s reason=%s", src, error.replace(" ", "_"))
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        with contextlib.suppress(Exception):
            self.client.send_direct_nowait(src, (LEFT, rid, error, version))

    def _load(self, src: NodeId, now: float, payload: tuple[Any, ...]) -> None:
        """A storage process's figures from its heartbeat answer: size, and the rate of
        operations it applied since the last answer; the round trip of the ping."""
        figures = payload[2]
        prev = self.loads.get(src)
        rate = 0.0
        applied = figures.get("applied")
        if prev is not None and type(applied) is int and now > prev["at"]:
            rate = max(0.0, (applied - prev["applied"]) / (now - prev["at"]))
            rate = 0.5 * rate + 0.5 * prev["ops_per_s"]  # smooth over two beats
        rtt = None
        if type(payload[1]) is int:
            rtt = max(0.0, time.time() * 1000 - payload[1])
        self.loads[src] = {
            "at": now,
            "applied": applied if type(applied) is int else 0,
            "ops_per_s": round(rate, 1),
            "items": figures.get("items"),
            "bytes": figures.get("bytes"),
            "queued": figures.get("queued"),
            "rtt_ms": None if rtt is None else round(rtt, 2),
        }

    def status(self) -> dict[str, Any]:
        """The core's status with what this host knows besides: each storage process's
        load and size (from heartbeats) and the leading router."""
        st = self.core.status()
        if not st.get("joined"):
            return st
        now = time.monotonic()
        st["load"] = {
            p: {k: v for k, v in f.items() if k not in ("at", "applied")}
            | {"age_s": round(now - f["at"], 1)}
            for p, f in sorted(self.loads.items())
        }
        st["leader"] = self.client.leader
        return st

    async def _beat(self) -> None:
        """Heartbeat every storage process and super; vote against the silent ones."""
        await self.joined.wait()
        started = time.monotonic()
        previous = started
        while self.stopped is None:
            c = self.core.config
            now = time.monotonic()
            if now - previous > self.suspect_after:
                # This super itself did not run (paused, or starved of CPU or memory):
                # the silence it would measure is its own, and answers may be waiting
                # unread.  Nobody is suspected on that evidence; listen afresh.
                log.warning("event=beat_stalled seconds=%.1f", now - previous)
                for p in self.heard:
                    self.heard[p] = now
            previous = now
            if c is not None:
                watched = (c.storage() | c.supers()) - {self.core.me}
                for p in sorted(watched):
                    with contextlib.suppress(Exception):
                        self.client.send_direct_nowait(p, (PING, int(time.time() * 1000)))
                    last = self.heard.setdefault(p, max(now, started))
                    if now - last > self.suspect_after and p not in self.voted:
                        self.voted.add(p)
                        self.counts["votes"] += 1
                        log.warning("event=vote_suspect process=%s silent_s=%.1f", p, now - last)
                        self._tasks.append(asyncio.ensure_future(self._vote(p)))
                for p in list(self.heard):
                    if p not in watched:
                        del self.heard[p]
                        self.voted.discard(p)
                for p in list(self.loads):
                    if p not in watched:
                        del self.loads[p]
            await asyncio.sleep(self.heartbeat)

    async def _vote(self, p: NodeId) -> None:
        try:
            await self.client.suspect([p], timeout=None)
        except Exception as e:
            log.warning("event=vote_failed process=%s error=%s", p, str(e).replace(" ", "_"))

    async def _repair(self) -> None:
        """Replace (or contract) holders that stay failed or incomplete for
        ``repair_after`` seconds: :meth:`SuperCore.repairs` decides what, and only the
        first super acts.  A refused repair (it would lose data) waits for an operator."""
        await self.joined.wait()
        broken_since: dict[tuple[str, tuple[Any, ...]], float] = {}
        while self.stopped is None:
            todo = self.core.repairs()
            now = time.monotonic()
            broken_since = {r: broken_since.get(r, now) for r in todo}
            for r, since in broken_since.items():
                if now - since < self.repair_after:
                    continue
                op, args = r
                log.warning("event=repair op=%s args=%s", op, ",".join(map(str, args)))
                try:
                    result = await self.reconfigure(op, *args, wait=False, timeout=30.0)
                    self.counts["repairs"] += 1
                    log.info("event=repaired op=%s version=%s", op, result.get("version"))
                except Refused as e:
                    self.counts["repairs_refused"] += 1
                    log.warning("event=repair_refused reason=%s", str(e).replace(" ", "_"))
                    await asyncio.sleep(5 * self.repair_after)
                except Exception as e:  # timeouts, E-Cast errors: try again later
                    log.warning("event=repair_failed error=%s", str(e).replace(" ", "_"))
                broken_since = {}
                break
            await asyncio.sleep(min(self.heartbeat, self.repair_after / 2))

    # ------------------------------------------------------------------ reconfiguration
    async def reconfigure(
        self,
        op: str,
        *args: Any,
        force: bool = False,
        dry_run: bool = False,
        wait: bool = True,
        timeout: float = 60.0,
        attempts: int = 8,
    ) -> dict[str, Any]:
        """Plan, submit, retry while stale, and (with ``wait``) wait until every involved
        storage process is ready.  Raises :class:`Refused`."""
        await asyncio.wait_for(self.joined.wait(), timeout)
        started = time.monotonic()
        deadline = started + timeout
        for _ in range(attempts):
            proposal: Proposal = self.core.plan(op, *args, force=force)
            summary = {
                "op": op,
                "args": list(args),
                "version_from": proposal.header["v"],
                "instructions": proposal.plan.describe(),
                "lost": bool(proposal.plan.lost),
            }
            if dry_run:
                return {**summary, "submitted": False}
            ack = await self.client.submit(
                None, proposal.header, timeout=max(1.0, deadline - time.monotonic())
            )
            if not ack.delivered:
                await self._caught_up(proposal.header["v"] + 1, deadline)
                continue  # stale: another reconfiguration came first; plan again
            version = proposal.header["v"] + 1
            self.counts["reconfigurations"] += 1
            await self._caught_up(version, deadline)
            if wait:
                while True:
                    c = self.core.config
                    if c is not None and version not in c.pending:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"version {version} not ready in {timeout:.0f} s")
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.changed.wait(), 0.2)
                self.reconfiguration_seconds.observe(time.monotonic() - started)
            return {**summary, "submitted": True, "version": version}
        raise Refused(f"the configuration kept changing under {attempts} plans; try again")

    async def _caught_up(self, version: int, deadline: float) -> None:
        """Wait until the replica reached ``version`` (our own message's delivery)."""
        while (c := self.core.config) is None or c.version < version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the configuration did not reach version {version}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.2)
