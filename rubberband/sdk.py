"""``rubberband.connect``: the asyncio client of a Rubberband cluster.

```python
rb = await rubberband.connect(routers, name="client:app-1", secret=...)
await rb.put(key, value); await rb.put_many({k1: v1, k2: v2})      # atomic multi-key
await rb.append(key, value); await rb.append_many({k1: v1})          # list-append, atomic
await rb.add(key, 5); await rb.add_many({a: -5, b: 5})              # counters, atomic
await rb.delete(key); await rb.delete_range(lo, hi)
await rb.get(key, isolation="sequential")     # or "snapshot", "basic"
await rb.get_many([k1, k2]); await rb.scan(lo, hi, isolation=...)
await rb.write_batch([("put", ((k, v),)) for k, v in items])   # bulk: one outcome each
async for event in rb.watch(lo, hi, since=None):  # every write after now, in order
    event.position, event.changes  # ((key, "put", value) | (key, "delete", None), ...)
await rb.close()
```

With another engine's operations (``connect(..., ops="storage_adapters.scan:ScanOps")``)
the client also offers that engine's calls, e.g. the scan engine's tables::

    await rb.create_table("tickets", schema={"id": "int", "dep": "str"}, key="id")
    t = rb.table("tickets")
    await t.insert(rows); await t.select(where=[("dep", "=", "ZRH")], isolation="basic")

A client is light: it does not join (E-Cast's session and sequence numbers still make
every write land once) and it listens, so storage processes can stream answers back to
it.  It learns the keyspace (version, ring, partitioning) from a super at connect time,
and again whenever an answer or a storage process says it is behind.  Writes return
when stable (every unsuspected holder delivered them); many calls may be in flight.

This module is a driver: every decision (whom to believe, when to try a read again,
when a request has waited too long) is the client core's (:mod:`rubberband.client`);
here are futures, a timer, and E-Cast's client.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import ecast
from rubberband.client import (
    BUNDLE_LIMIT,
    Changed,
    Changes,
    ClientCore,
    Event,
    Gather,
    Page,
    ReadDone,
    Refreshed,
    Revisions,
    Unavailable,
    WriteDone,
    is_client_name,
)
from rubberband.driver import carry_out
from rubberband.errors import RubberbandError
from rubberband.outputs import Submit

log = logging.getLogger("rubberband.sdk")

__all__ = ["BUNDLE_LIMIT", "DEFAULT_OPS", "RubberbandClient", "connect", "load_ops"]

DEFAULT_OPS = "storage_adapters.memory:KVOps"
"""The operations of the key-value engine, named by path: Rubberband imports no engine."""
WATCH_READ_EVERY = 1.0
"""Seconds an idle :meth:`RubberbandClient.watch` goes at most without a read in the
total order: peeks are hints, and the read in order is what fails over (or raises)
when the cluster cannot answer; one small message a second, not one a ``poll``."""


class RubberbandClient:
    """Key-value calls over a generic ``write(op)`` / ``read(op, isolation)``."""

    def __init__(self, client: ecast.Client, core: ClientCore) -> None:
        self.ecast = client
        self.core = core
        self._loop = asyncio.get_running_loop()
        self._done: dict[int, asyncio.Future[Any]] = {}
        """Requests a caller awaits, by the core's request id."""
        self._tokens: dict[Any, Any] = {}
        """E-Cast message id -> the core's token, for acks and sheds."""
        self._refreshed: list[asyncio.Future[bool]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._backlog: collections.deque[Submit] = collections.deque()
        """Submissions waiting for room in E-Cast's send window (one pump feeds them)."""
        self._pump: asyncio.Task[None] | None = None
        self._closed = False
        self.writes_sent = 0
        """Write calls made (a view read at read-your-writes level reads past them)."""
        client.direct_batch_listener = self._on_directs
        client.shed_listener = self._on_shed
        client.ack_listener = self._on_acks
        client.reject_listener = self._on_rejected

    @property
    def answer_timeout(self) -> float:
        return self.core.answer_timeout

    @property
    def refused_answers(self) -> int:
        return self.core.refused_answers

    # ================================================================== the driver's IO
    def send(self, dst: str, msg: Any) -> None:
        try:
            self.ecast.send_direct_nowait(dst, msg.payload)
        except Exception as e:  # the client ended, or the peer is unknown: a read retries
            log.debug("event=send_failed to=%s error=%s", dst, e)

    def submit(self, submissions: list[Submit]) -> None:
        if self._backlog or not self._room_for(len(submissions)):
            self._backlog.extend(submissions)
            if self._pump is None or self._pump.done():
                self._pump = self._loop.create_task(self._drain_backlog())
            return
        self._submit_now(submissions)

    def _room_for(self, n: int) -> bool:
        ep = self.ecast.endpoint
        return ep is not None and len(ep.queued) + n <= self.ecast.max_queued

    def _submit_now(self, submissions: list[Submit]) -> None:
        safe = [s for s in submissions if not s.unsafe]
        unsafe = [s for s in submissions if s.unsafe]
        for group, nowait in (
            (safe, self.ecast.submit_batch),
            (unsafe, self.ecast.submit_unsafe_nowait),
        ):
            if not group:
                continue
            try:
                ids = nowait([(s.payload, s.header) for s in group])
            except Exception as e:  # no room (Backpressure) or the client ended
                now = self._loop.time()
                for s in group:
                    if s.token is not None:
                        carry_out(self.core.on_rejected(s.token, e, now), self)
                continue
            tokens = self._tokens
            for mid, s in zip(ids, group, strict=True):
                if s.token is not None:
                    tokens[mid] = s.token

    async def _drain_backlog(self) -> None:
        backlog = self._backlog
        while backlog and not self._closed:
            try:
                await self.ecast.room(None)
            except Exception:
                return
            n = max(1, self.ecast.max_queued - len(self.ecast.endpoint.queued))  # type: ignore[union-attr]
            batch = [backlog.popleft() for _ in range(min(n, len(backlog)))]
            self._submit_now(batch)
            await asyncio.sleep(0)

    def suspect(self, who: tuple[str, ...]) -> None:  # a client core never votes
        raise AssertionError("a client core asked to suspect processes")

    def upcall(self, item: Any) -> None:
        t = type(item)
        if t is ReadDone or t is WriteDone:
            fut = self._done.pop(item.request, None)
            if fut is not None and not fut.done():
                if item.error is not None:
                    fut.set_exception(item.error)
                else:
                    fut.set_result(item if t is ReadDone else None)
        elif t is Refreshed:
            waiters, self._refreshed = self._refreshed, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(item.ok)

    def stop(self, reason: str) -> None:  # a client core never stops itself
        log.warning("event=client_stopped reason=%s", reason)

    def wake(self, at: float | None) -> None:
        if at is None or (self._timer_at is not None and self._timer_at <= at):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._tick)

    # ================================================================== inputs
    def _tick(self) -> None:
        self._timer = self._timer_at = None
        if self._closed:
            return
        self.core.supers = self._supers()
        carry_out(self.core.on_tick(self._loop.time()), self)

    def _on_directs(self, src: str, payloads: list[Any]) -> None:
        def bad(payload: Any, error: Exception) -> None:
            # A malformed answer or a ``done`` callback that raised must not stop the
            # answers that follow.
            log.error("event=bad_answer from=%s error=%r payload=%.200r", src, error, payload,
                      exc_info=error)  # fmt: skip

        try:
            carry_out(self.core.on_directs(src, payloads, self._loop.time(), bad), self)
        except Exception:
            log.exception("event=bad_answer from=%s", src)

    def _on_acks(self, acks: list[Any]) -> None:
        pop = self._tokens.pop
        mine = [(token, ack.delivered) for ack in acks if (token := pop(ack.id, None)) is not None]
        if mine:
            carry_out(self.core.on_acks(mine, self._loop.time()), self)

    def _on_rejected(self, mid: Any, error: Exception) -> None:
        token = self._tokens.pop(mid, None)
        if token is not None:
            carry_out(self.core.on_rejected(token, error, self._loop.time()), self)

    def _on_shed(self, ids: tuple[Any, ...]) -> None:
        tokens = self._tokens
        now = self._loop.time()
        for mid in ids:
            token = tokens.pop(mid, None)
            if token is not None:
                carry_out(self.core.on_shed(token, now), self)

    def _supers(self) -> list[str]:
        return sorted(p for p in self.ecast.peers() if p.startswith("super:"))

    def tell_super(self, payload: Any) -> bool:
        """Send ``payload`` (a direct message of :mod:`rubberband.proto`) to one super
        this client knows; False if it knows none."""
        supers = self._supers()
        if supers:
            self.send(supers[0], ecast.Direct(payload))
        return bool(supers)

    def _future(self, rid: int) -> asyncio.Future[Any]:
        fut = self._done[rid] = self._loop.create_future()
        return fut

    async def _await(self, fut: asyncio.Future[Any], rid: int) -> Any:
        try:
            return await fut
        finally:
            self._done.pop(rid, None)

    # ================================================================== generic
    async def refresh(self, timeout: float = 10.0) -> None:
        """Learn the keyspace from a super (any one the routers told us of)."""
        self.core.supers = self._supers()
        fut: asyncio.Future[bool] = self._loop.create_future()
        self._refreshed.append(fut)
        carry_out(self.core.refresh(self._loop.time(), timeout), self)
        deadline = self._loop.time() + timeout
        while not fut.done():  # the directory may not know a super yet: look again
            await asyncio.sleep(0.1)
            if self._loop.time() > deadline:
                break
            supers = self._supers()
            if supers != self.core.supers:
                self.core.supers = supers
                carry_out(self.core.refresh(self._loop.time(), deadline - self._loop.time()), self)
        if not fut.done() or not fut.result():
            raise Unavailable("no super answered: is the cluster up?")

    async def write(self, op: Any, timeout: float | None = None) -> None:
        """Submit a write and wait until it is stable.  An operation whose validity
        depends on the data (such as an append), or that names a view's definition,
        also waits for a holder's answer (``self.core.answered(op)``), so a rejection
        raises :class:`Rejected` here."""
        await self.ecast.room(timeout if timeout else -1.0)
        rid, fx = self.core.write(op, self._loop.time(), timeout)
        self.writes_sent += 1
        fut = self._future(rid)
        carry_out(fx, self)
        return await self._await(fut, rid)  # type: ignore[no-any-return]

    async def write_batch(
        self, ops: list[Any], timeout: float | None = None, bundle: int = BUNDLE_LIMIT
    ) -> list[Exception | None]:
        """Many writes at once: one outcome per op, in order, None for a write that is
        stable, else the exception :meth:`write` would have raised for it.  Raises at
        once, sending nothing, for a bad op.

        Writes of one segment travel up to ``bundle`` to a message (1 sends each alone;
        see ``Messages.writes_of``): the writes of a batch are independent, so writes to
        different segments may take effect in either order, while writes that touch a
        common key keep their order in the batch, and the whole batch is ordered after
        every write of an earlier call from this client.  ``timeout`` (default: the
        E-Cast client's ``ack_timeout``) bounds the wait for all the acknowledgements."""
        return await self.write_batch_nowait(ops, timeout, bundle)

    def write_batch_nowait(
        self, ops: list[Any], timeout: float | None = None, bundle: int = BUNDLE_LIMIT
    ) -> Coroutine[Any, Any, list[Exception | None]]:
        """:meth:`write_batch`, its messages submitted before this returns (raises at
        once, sending nothing, for a bad op): whatever this client sends next is
        ordered after them.  Await the result for the outcomes."""
        ops = list(ops)
        wait = timeout if timeout else self.ecast.ack_timeout
        messages, fx = self.core.write_batch(ops, self._loop.time(), bundle, wait)
        self.writes_sent += 1
        futs = [(indices, self._future(rid), rid) for indices, rid in messages]
        carry_out(fx, self)
        return self._outcomes(futs, len(ops))

    async def _outcomes(
        self, futs: list[tuple[tuple[int, ...], asyncio.Future[Any], Any]], n: int
    ) -> list[Exception | None]:
        outcomes: list[Exception | None] = [None] * n
        for indices, fut, rid in futs:
            try:
                await self._await(fut, rid)
            except Exception as e:
                for i in indices:  # (a write sent in pieces: its first failure)
                    if outcomes[i] is None:
                        outcomes[i] = e
        return outcomes

    async def read(
        self,
        op: Any,
        isolation: str = "sequential",
        attempts: int = 5,
        within: Any = None,
        *,
        with_position: bool = False,
    ) -> Any:
        """Read at ``isolation``; ``within`` (a range set in placement space, such as one
        of :meth:`segments`) restricts the read to part of what ``op`` reads.  A read
        whose responder fails goes to another replica (the core's failover); a snapshot
        read refused ``attempts`` times is read sequentially.  ``with_position``: return
        ``(result, position)``: the read reflects every write up to that position in the
        total order and none after (None for a basic read), so a change feed from there
        (:meth:`watch`) goes on exactly after what it saw."""
        rid, fx = self.core.read(op, isolation, self._loop.time(), within=within, attempts=attempts)
        fut = self._future(rid)
        carry_out(fx, self)
        done = await self._await(fut, rid)
        return (done.result, done.position) if with_position else done.result

    async def changes(self, since: int | None, lo: Any = None, hi: Any = None) -> Page:
        """The changes of the keys in ``[lo, hi)`` after position ``since``, as one read
        in the total order: every write up to ``page.position`` is in it (or the read
        raises :class:`~rubberband.errors.Compacted`), and the next page starts there.
        That is the read's own position, or an earlier one where a holder's answer was
        cut (:data:`~rubberband.changelog.PAGE_CHANGES`): a page without changes is
        never cut, so it covers every write before the read."""
        return await self.read(Changes(since, lo, hi))  # type: ignore[no-any-return]

    async def changed(self, since: int, lo: Any = None, hi: Any = None) -> bool:
        """Has a key in ``[lo, hi)`` changed after position ``since``?  A basic read of
        each segment's change log at one replica, outside the total order: a hint for
        a follower waiting for changes (True also where a replica cannot tell), never a
        page: read the changes in order (:meth:`changes`) when it says True."""
        return bool(await self.read(Changed(since, lo, hi), "basic"))

    async def watch(
        self, lo: Any = None, hi: Any = None, since: int | None = None, poll: float = 0.05
    ) -> AsyncIterator[Event]:
        """Every write to the keys in ``[lo, hi)`` after position ``since`` (None: from
        now), one :class:`~rubberband.changelog.Event` per write, in the total order,
        with no gap and no duplicate across router, storage process and client
        failover (each page is a read, and reads fail over).  A page that fails as a
        read fails (no answer within ``answer_timeout``: the cluster is unavailable)
        raises here; resume, then or after a restart, with ``since`` = the last event's
        position.  Idle, it asks the replicas every ``poll`` seconds whether anything
        changed (:meth:`changed`, no place in the total order) and reads the next page
        once something did, or after :data:`WATCH_READ_EVERY` seconds in any case."""
        position = since
        while True:
            got = await self.changes(position, lo, hi)
            for event in got.events:
                yield event
            position = got.position
            if not got.events:
                await self._until_changed(position, lo, hi, poll)

    async def _until_changed(self, since: int, lo: Any, hi: Any, poll: float) -> None:
        """Wait, peeking every ``poll`` seconds, until a key in ``[lo, hi)`` changed
        after ``since``, a peek failed (the read in order then fails over, or says
        why), or :data:`WATCH_READ_EVERY` seconds passed."""
        loop = self._loop
        until = loop.time() + WATCH_READ_EVERY
        while True:
            await asyncio.sleep(poll)
            if loop.time() >= until:
                return
            try:
                if await self.changed(since, lo, hi):
                    return
            except RubberbandError:
                return

    async def read_batch(
        self,
        ops: list[Any],
        isolation: str,
        done: Callable[..., None],
        timeout: float | None = None,
        bundle: int = BUNDLE_LIMIT,
        grouped: bool = False,
    ) -> int:
        """Many reads at once, without waiting for them (see
        :meth:`ClientCore.read_batch`).  Returns the number of messages sent."""
        sent, fx = self.core.read_batch(
            ops, isolation, done, self._loop.time(), timeout=timeout, bundle=bundle,
            grouped=grouped,
        )  # fmt: skip
        carry_out(fx, self)
        return sent

    async def read_replica(self, process: str, op: Any, within: Any) -> Any:
        """``op`` within ``within`` (placement ranges) answered by ``process`` alone, from
        its current state (a basic read): audits compare the holders of a range with it
        once writes have stopped.  Raises :class:`Unavailable` if ``process`` does not
        hold all of ``within`` under this client's keyspace version."""
        rid, fx = self.core.read_replica(process, op, within, self._loop.time())
        fut = self._future(rid)
        carry_out(fx, self)
        return (await self._await(fut, rid)).result

    def segments(self) -> list[Any]:
        """The keyspace's primary segments as this client knows it (placement-space range
        sets that tile the keys once, in ring order): the unit of a parallel export."""
        ks = self.core.keyspace
        return [] if ks is None else list(ks.segments())

    @property
    def placement(self) -> Any:
        """How keys map to places (the cluster's partitioning, learned at connect)."""
        return self.core.placement

    # ================================================================== key-value
    async def put(self, key: Any, value: Any) -> None:
        await self.write(("put", ((key, value),)))

    async def put_many(self, items: dict[Any, Any]) -> None:
        await self.write(("put", tuple(items.items())))

    async def append(self, key: Any, value: Any) -> None:
        await self.write(("append", ((key, value),)))

    async def append_many(self, items: dict[Any, Any]) -> None:
        await self.write(("append", tuple(items.items())))

    async def add(self, key: Any, delta: int) -> None:
        """Add ``delta`` to the integer at ``key`` (absent counts as 0)."""
        await self.write(("add", ((key, delta),)))

    async def add_many(self, deltas: dict[Any, int]) -> None:
        """Add to several counters in one atomic write (a transfer: deltas summing to 0)."""
        await self.write(("add", tuple(deltas.items())))

    async def delete(self, key: Any) -> None:
        await self.write(("delete", (key,)))

    async def delete_range(self, lo: Any, hi: Any) -> None:
        await self.write(("delete_range", lo, hi))

    async def get(self, key: Any, isolation: str = "sequential") -> Any:
        return (await self.read(("get", (key,)), isolation)).get(key)

    async def get_many(self, keys: list[Any], isolation: str = "sequential") -> dict[Any, Any]:
        return await self.read(("get", tuple(keys)), isolation)  # type: ignore[no-any-return]

    async def get_revisions(
        self, keys: list[Any], isolation: str = "sequential"
    ) -> dict[Any, tuple[Any, int | None]]:
        """Each present key's ``(value, revision)``: the position of the write that
        last changed it (etcd's mod revision), read with the value at one position
        (sequential or snapshot).  The revision is None for a key written before any of
        its holders kept revisions (an engine that reports no changes keeps none, and
        the read is refused)."""
        values, revisions = await self.read(Revisions(("get", tuple(keys)), tuple(keys)), isolation)
        return {k: (v, revisions.get(k)) for k, v in values.items()}

    async def scan(
        self, lo: Any = None, hi: Any = None, isolation: str = "sequential"
    ) -> list[Any]:
        return await self.read(("scan", lo, hi), isolation)  # type: ignore[no-any-return]

    # ================================================================== views
    async def create_view(self, name: str, from_: Any, kind: str, **spec: Any) -> Any:
        """Define a materialized view of the keys in ``from_ = (lo, hi)``, or over the
        view named ``from_`` (:func:`rubberband.views.create_view`; ``docs/views.md``).
        A client connected as ``maintainer:...`` may: views' definitions are theirs."""
        from rubberband.views import create_view

        return await create_view(self, name, from_, kind, **spec)

    async def drop_view(self, name: str) -> None:
        """Forget a view and delete its rows (:func:`rubberband.views.drop_view`); a
        client connected as ``maintainer:...`` may."""
        from rubberband.views import drop_view

        await drop_view(self, name)

    async def views(self) -> list[Any]:
        """Every view's definition."""
        from rubberband.views import list_views

        return await list_views(self)

    def view(self, name: str) -> Any:
        """A view to read (:class:`rubberband.views.View`: ``get``, ``scan``,
        ``lookup``, each at a level)."""
        from rubberband.views import View

        return View(self, name)

    # ================================================================== the engine's own
    def __getattr__(self, name: str) -> Any:
        """The engine's own calls, such as the scan engine's ``rb.table(...)`` and
        ``rb.create_table(...)``: whatever its operations' ``bind(client)`` returns
        offers them, built on :meth:`write` and :meth:`read` (Rubberband itself knows
        no engine)."""
        api = self.__dict__.get("_api")
        if api is None:
            core = self.__dict__.get("core")
            bind = getattr(core.ops, "bind", None) if core is not None else None
            if name.startswith("_") or bind is None:
                raise AttributeError(
                    f"{type(self).__name__!r} has no attribute {name!r} (and the engine's "
                    "operations offer no calls of their own)"
                )
            api = self.__dict__["_api"] = bind(self)
        return getattr(api, name)

    # ================================================================== lifetime
    async def close(self, timeout: float = 10.0) -> None:
        """Leave, after waiting up to ``timeout`` for what was submitted to be
        acknowledged (a client giving up on a lost cluster waits less)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._pump is not None:
            self._pump.cancel()
        for fut in self._done.values():
            if not fut.done():
                fut.set_exception(ecast.ClosedError("the client was closed"))
        await self.ecast.detach(timeout)

    async def __aenter__(self) -> RubberbandClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def load_ops(ops: Any) -> Any:
    """An engine's client-side operations: an object, or ``module:Class`` to build one."""
    if ops is None:
        ops = DEFAULT_OPS
    if isinstance(ops, str):
        module, _, cls = ops.partition(":")
        return getattr(importlib.import_module(module), cls)()
    return ops


async def connect(
    routers: list[str] | str,
    name: str,
    *,
    ops: Any = None,
    listen: str = "127.0.0.1:0",
    answer_timeout: float = 10.0,
    retry_after: float = 1.0,
    connect_timeout: float = 15.0,
    **ecast_options: Any,
) -> RubberbandClient:
    """Connect a light client named ``client:...`` (or ``maintainer:...``: a client that
    may also write views' rows, as a view maintainer does).  ``ops`` are the engine's client-side
    operations (default: the key-value engine's); ``answer_timeout`` bounds every
    request, ``retry_after`` is how long a read waits for a responder before it tries
    another; ``ecast_options`` go to :func:`ecast.connect` (``secret``,
    ``credentials``, timeouts)."""
    if not is_client_name(name):
        raise ecast.InvalidName(
            f"a Rubberband client is named client:... or maintainer:..., not {name!r}"
        )
    client = await ecast.connect(routers, name=name, join=False, listen=listen, **ecast_options)
    ack = client.ack_timeout if client.ack_timeout is not None else 3600.0
    core = ClientCore(
        load_ops(ops), answer_timeout=answer_timeout, retry_after=retry_after, write_timeout=ack
    )
    rb = RubberbandClient(client, core)
    try:
        await rb.refresh(connect_timeout)
    except BaseException:
        await rb.close()
        raise
    return rb


__all__ += ["Gather"]
