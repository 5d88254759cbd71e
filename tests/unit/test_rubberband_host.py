"""The storage host between E-Cast and the core: flow control reaches the engine, and
migration traffic does not wait behind the backlog."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from rubberband.host import BATCH, DELIVERIES, DIRECT, INBOX_HIGH, WAKE, StorageHost
from rubberband.proto import BasicRead, Chunk, Peek, Pull, written
from rubberband.storage import StorageCore
from storage_adapters.memory import MemoryEngine


class FakeClient:
    """Deliveries and direct messages on demand, as the SDK hands them over."""

    def __init__(self, deliveries: int) -> None:
        self.n = deliveries
        self.taken = 0
        self.direct: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def delivery_batch(self, max_items: int = 512) -> list[Any]:
        await asyncio.sleep(0)
        first = self.taken
        self.taken = min(self.n, first + max_items)
        return [SimpleNamespace(i=i, t=i) for i in range(first, self.taken)]

    async def receive_direct(self) -> tuple[str, Any]:
        return await self.direct.get()

    @property
    def received(self) -> int:
        """Every delivery is in the SDK (confirmed) from the start."""
        return self.n

    def send_direct_nowait(self, *_: Any) -> None:
        pass

    def durable(self, upto: int) -> None:
        """The host confirms deliveries up to ``upto`` (the SDK waits for it to)."""
        self.confirmed = max(getattr(self, "confirmed", -1), upto)


async def until(condition: Callable[[], bool], timeout: float = 10) -> None:
    """Waits for a condition rather than a fixed time: under a full test run the loop may
    get far fewer turns in a few milliseconds than on an idle machine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.002)


def host(client: FakeClient) -> StorageHost:
    return StorageHost(client, StorageCore("storage:1", MemoryEngine()))  # type: ignore[arg-type]


async def test_the_host_stops_taking_deliveries_while_the_engine_is_behind() -> None:
    client = FakeClient(5 * INBOX_HIGH)
    h = host(client)
    reader = asyncio.ensure_future(h._read_deliveries())
    # Until the reader reaches the mark, then long enough for one that did not stop to
    # take more.
    await until(lambda: h._waiting >= INBOX_HIGH)
    for _ in range(50):
        await asyncio.sleep(0)
    # It stopped at the mark: the rest stays in the SDK, unconfirmed (unstable at the
    # routers, whose flow control then slows the writers).
    assert h._waiting == INBOX_HIGH and client.taken == INBOX_HIGH
    assert client.confirmed == INBOX_HIGH - 1  # each delivery is at its index
    got = []
    while len(got) < 5 * INBOX_HIGH:
        batch = await h._batch()
        ids = [d.i for item in batch for d in item[1]]
        assert all(item[0] == DELIVERIES for item in batch) and len(ids) <= BATCH
        got += ids
        await asyncio.sleep(0)
        assert h._waiting <= INBOX_HIGH
    assert got == list(range(5 * INBOX_HIGH))  # nothing lost, in order
    assert client.confirmed == 5 * INBOX_HIGH - 1
    reader.cancel()


async def test_migration_messages_go_ahead_of_waiting_deliveries() -> None:
    client = FakeClient(1000)
    h = host(client)
    reader = asyncio.ensure_future(h._read_deliveries())
    await until(lambda: client.taken == 1000)
    direct = asyncio.ensure_future(h._read_direct())
    client.direct.put_nowait(("client:c", BasicRead(1, ("get", (1,)), (), 0)))
    client.direct.put_nowait(("storage:2", Pull((5, 0), 1)))
    client.direct.put_nowait(("storage:3", Chunk((5, 1), 0, (), True)))
    await until(client.direct.empty)
    await asyncio.sleep(0)
    first = await h._batch()
    # The pull and the chunk first, in arrival order; then the deliveries in order; the
    # client's read keeps its place behind them.
    assert first[0] == (DIRECT, "storage:2", Pull((5, 0), 1))
    assert first[1] == (DIRECT, "storage:3", Chunk((5, 1), 0, (), True))
    assert [d.i for item in first[2:] for d in item[1]] == list(range(BATCH))
    rest: list[Any] = []
    while not rest or rest[-1][0] != DIRECT:
        rest += await h._batch()
    assert [d.i for item in rest[:-1] for d in item[1]] == list(range(BATCH, 1000))
    assert rest[-1][0] == DIRECT and type(rest[-1][2]) is BasicRead
    assert WAKE not in first + rest
    direct.cancel()
    reader.cancel()


@pytest.mark.parametrize(
    "read", [BasicRead(1, ("get", (1,)), (), 0), Peek(1, 0, (), None, 0)], ids=["read", "peek"]
)
async def test_a_basic_read_waits_for_the_deliveries_received_before_it(read: Any) -> None:
    """Under backpressure confirmed deliveries wait in the SDK: a basic read (or a peek
    at the change log) that came after them must not overtake them (a write
    acknowledged to its client would be missing from the read, a change from the
    peek); migration traffic still goes first."""
    client = FakeClient(3 * INBOX_HIGH)
    h = host(client)
    reader = asyncio.ensure_future(h._read_deliveries())
    await until(lambda: h._waiting >= INBOX_HIGH)
    direct = asyncio.ensure_future(h._read_direct())
    client.direct.put_nowait(("client:c", read))
    client.direct.put_nowait(("storage:2", Pull((5, 0), 1)))
    await until(client.direct.empty)
    got: list[Any] = []
    while not any(item[0] == DIRECT and item[2] is read for item in got):
        got += await h._batch()
        await asyncio.sleep(0)
    assert got[0] == (DIRECT, "storage:2", Pull((5, 0), 1))
    delivered = [d.i for item in got if item[0] == DELIVERIES for d in item[1]]
    assert delivered == list(range(3 * INBOX_HIGH)), "the read overtook deliveries"
    assert got[-1] == (DIRECT, "client:c", read)
    direct.cancel()
    reader.cancel()


async def test_the_inbox_is_a_fifo_whose_waiting_worker_wakes_and_loses_nothing() -> None:
    from rubberband.host import _Inbox

    inbox = _Inbox()
    inbox.put_nowait(("a",))
    inbox.put_nowait(("b",))
    assert await inbox.get() == ("a",) and inbox.get_nowait() == ("b",) and inbox.empty()
    # A worker waits for the next item, and wakes when it comes.
    waiting = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    inbox.put_nowait(("c",))
    assert await asyncio.wait_for(waiting, 1) == ("c",)
    # A worker cancelled while it waits takes nothing with it: the next one gets the item.
    cancelled = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    inbox.put_nowait(("d",))
    assert cancelled.cancelled() and await asyncio.wait_for(inbox.get(), 1) == ("d",)


async def test_a_loop_that_fails_stops_the_process_instead_of_leaving_it_half_alive() -> None:
    """An exception out of the core (a defect) ends the process with its reason, so the
    supers replace it, rather than leaving one that answers pings and applies nothing."""

    class Waiting(FakeClient):
        async def delivery_batch(self, max_items: int = 512) -> list[Any]:
            if self.taken >= self.n:
                await asyncio.Event().wait()  # no more, and E-Cast still open
            return await super().delivery_batch(max_items)

    h = host(Waiting(3))

    def broken(items: Any) -> Any:
        raise RuntimeError("a defect")

    h._feed = broken  # type: ignore[method-assign]
    h._start(h._read_deliveries(), h._work())
    await asyncio.wait_for(h.done.wait(), 10)
    assert h.stopped == "internal error: RuntimeError: a defect"
    for task in h._tasks:
        task.cancel()


async def test_a_step_that_waited_on_the_loop_keeps_the_loop_and_two_that_worked_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After two steps within ``driver.REPEAT`` that each took more than ``driver.SLOW``
    on the loop, the engine thread takes the steps for ``driver.BACKOFF``: judged by the
    CPU a step used, not the wall time it took.  On a machine with more busy processes
    than cores a short step preempted mid-way took 20-35 ms, and each such step sent a
    storage process's steps to the thread, paying the hop, for ten seconds.  One slow
    step alone keeps the loop: the memory engine's dict, grown at 350,000 keys, made
    one step of every replica take 27 ms, and the ones after it were short."""
    import threading
    import time

    from ecast import Effects
    from rubberband import driver
    from rubberband import host as host_module

    worked = {6: threading.Event(), 9: threading.Event()}

    class OneByOne(FakeClient):  # the deliveries after 6 (and 9) once it has run
        async def delivery_batch(self, max_items: int = 512) -> list[Any]:
            if self.taken >= self.n:
                await asyncio.Event().wait()
            for i, done in worked.items():
                while self.taken == i + 1 and not done.is_set():
                    await asyncio.sleep(0.001)
            return await super().delivery_batch(1)

    monkeypatch.setattr(host_module, "short_batches", lambda core, batches: True)
    # The two slow steps count as close together however long the machine takes to
    # give this process their CPU (the window is tested with a fake clock below).
    monkeypatch.setattr(driver, "REPEAT", 3600.0)
    h = host(OneByOne(12))
    steps: list[tuple[list[int], bool]] = []  # (deliveries, on the loop's thread)
    loop_thread = threading.get_ident()
    kept = [False]  # inside ``step_kept`` (what a step on the loop makes is frozen)
    through: list[bool] = []

    real = host_module.step_kept

    def recording(run: Any, *args: Any) -> Any:
        kept[0] = True
        try:
            return real(run, *args)
        finally:
            kept[0] = False

    monkeypatch.setattr(host_module, "step_kept", recording)

    def step(items: list[Any]) -> Effects:
        ids = [d.i for item in items for d in item[1]]
        through.append(kept[0])
        steps.append((ids, threading.get_ident() == loop_thread))
        if 2 in ids:  # waits (no CPU) three times the limit, as a preempted process does
            time.sleep(3 * driver.SLOW)
        for i in set(ids) & set(worked):  # works past the limit
            end = time.thread_time() + 1.5 * driver.SLOW
            while time.thread_time() < end:
                pass
            worked[i].set()
        return Effects()

    h._step = step  # type: ignore[method-assign]
    h._start(h._read_deliveries(), h._work())
    await until(lambda: sum(len(ids) for ids, _ in steps) == 12)
    assert [i for ids, _ in steps for i in ids] == list(range(12))
    at = next(n for n, (ids, _) in enumerate(steps) if 9 in ids)
    # the wait kept the loop, and so did the first slow step
    assert all(on_loop for _, on_loop in steps[: at + 1]), steps
    assert not any(on_loop for _, on_loop in steps[at + 1 :]), steps  # the second did not
    assert through == [on_loop for _, on_loop in steps]  # kept: the loop's steps alone
    for task in h._tasks:
        task.cancel()


def test_a_slow_step_long_after_another_keeps_the_loop() -> None:
    """Two slow steps further apart than ``driver.REPEAT`` are two rare costs, not a
    run of long steps: the gate stays open; a third soon after the second closes it for
    ``driver.BACKOFF``, and it opens again after that."""
    import time

    from rubberband import driver

    now = [100.0]
    gate = driver.LoopGate(lambda: now[0])

    def slow() -> None:
        end = time.thread_time() + 1.5 * driver.SLOW
        while time.thread_time() < end:
            pass

    gate.run(slow)
    assert gate.open()
    now[0] += driver.REPEAT + 0.1
    gate.run(slow)
    assert gate.open()
    gate.run(lambda: None)  # a short step between slow ones changes nothing
    now[0] += driver.REPEAT / 2
    gate.run(slow)
    assert not gate.open()
    now[0] += driver.BACKOFF - 0.01
    assert not gate.open()
    now[0] += 0.02
    assert gate.open()


def test_only_deliveries_of_single_keys_run_on_the_loop() -> None:
    """A batch runs on the event loop (an engine with ``inline_points``) only if every
    item is a delivered read or write of single keys, as the client's operations name
    them; a range, a keyspace message or a membership change keeps the engine thread
    (and so does a basic read, which the host sees apart), where a long one cannot
    stop the heartbeats."""
    import msgpack

    from ecast import Message
    from ecast.core.endpoint import Delivery
    from rubberband.engine import Placement
    from rubberband.proto import keyspace_header, read_header, write_header
    from rubberband.steps import INLINE_KEYS, points_only
    from storage_adapters.memory import KVOps

    ops, placement = KVOps(), Placement()

    def delivered(header: Any) -> list[Any]:
        wire = msgpack.unpackb(msgpack.packb(header), use_list=False)  # as a router sends it
        return [Delivery(1, Message("client:c", ("c", 1), wire, None))]

    def part(op: Any) -> Any:
        return ops.part_fun(op, placement).ranges

    puts = delivered(write_header(part(("put", ((5, "v"), ("k", 1))))))
    get = delivered(read_header(part(("get", (5,))), 0))
    scan = delivered(read_header(part(("scan", 0, 100)), 0))
    assert points_only(puts + get)
    assert not points_only(puts + scan)
    assert not points_only(puts + delivered(write_header(part(("delete_range", 0, 9)))))
    assert not points_only(delivered(keyspace_header(1, ("expand", "storage:2", (2, 5)), {})))
    most = write_header(part(("put", tuple((k, k) for k in range(INLINE_KEYS)))))
    assert points_only(delivered(most))  # a view's rows come hundreds to a message
    many = write_header(part(("put", tuple((k, k) for k in range(INLINE_KEYS + 1)))))
    assert not points_only(delivered(many))
    assert not points_only(delivered(most) + puts)  # the keys summed over the batch
    assert not points_only([object()])


def test_a_write_of_many_keys_under_one_hull_is_weighed_by_its_operation() -> None:
    """A view's rows, hundreds to a message, name one range around them in the header
    (``Messages.routable``): the engine counts the operation's keys (``point_keys``),
    and the write runs on the loop like as many single-key writes would; a range
    operation under a hull, a bundle, or an engine that cannot count keeps the thread."""
    from ecast import Message
    from ecast.core.endpoint import Delivery
    from rubberband.messages import EXACT_RANGES, Messages
    from rubberband.proto import H
    from rubberband.steps import INLINE_KEYS, points_only
    from rubberband.views.define import row_key
    from storage_adapters.memory import KVOps, MemoryEngine

    messages = Messages(KVOps())
    weigh = MemoryEngine.point_keys

    def delivered(op: Any) -> list[Any]:
        payload, header = messages.write_message(op)
        return [Delivery(1, Message("client:c", ("c", 1), header, payload))]

    rows = tuple((row_key("v", (g, g * 7)), [5, {"n": g}]) for g in range(500))
    hull = delivered(("version", rows, 0))
    assert len(hull[0].message.header[H.WRITES]) == 1 < 500  # one range around them
    assert type(hull[0].message.payload) is bytes  # packed: its keys are not read...
    packed = Message("client:c", ("c", 1), hull[0].message.header, b"\xc1")
    assert not points_only([Delivery(1, packed)], weigh=weigh)  # (bytes that are no op)
    assert points_only(hull, weigh=weigh)  # ... until it is judged, unpacked in its place
    assert hull[0].message.payload[::2] == ("version", 0) and len(hull[0].message.payload[1]) == 500
    assert not points_only(hull)
    assert points_only(hull * 4, weigh=weigh) and not points_only(hull * 5, weigh=weigh)
    assert 2_000 <= INLINE_KEYS < 2_500
    puts = delivered(("put", tuple((k, k) for k in range(EXACT_RANGES + 1))))
    assert points_only(puts, weigh=weigh)
    appends = delivered(("append", tuple((k, k) for k in range(EXACT_RANGES + 1))))
    assert not points_only(appends, weigh=weigh)  # copies its lists
    wide = delivered(("delete_range", 0, 10))
    assert not points_only(wide, weigh=weigh)
    bundle = Message("client:c", ("c", 2), {**hull[0].message.header, H.COUNT: 2}, b"")
    assert not points_only([Delivery(2, bundle)], weigh=weigh)
    point = written(delivered(("put", ((5, 5),)))[0].message.header)  # all to one key
    for count, short in ((INLINE_KEYS, True), (INLINE_KEYS + 1, False), ("2", False)):
        one = Message("client:c", ("c", 3), {H.WRITES: point, H.COUNT: count}, b"")
        assert points_only([Delivery(3, one)], weigh=weigh) is short, count


def test_a_storage_process_sums_a_steps_keys_and_counts_its_feed_pages_changes() -> None:
    """The storage core judges a step from its own engine and change log: a view's
    rows and a maintainer's page that walks the few changes since its last one run on
    the loop; the same page from far behind, a page after a bulk write (one position,
    many changes), or keys over the budget summed over the step's batches, keep the
    thread."""
    from ecast import Message
    from ecast.core.endpoint import Delivery
    from rubberband.messages import Messages
    from rubberband.proto import H
    from rubberband.steps import INLINE_FEED, INLINE_KEYS, short_batches
    from rubberband.views.define import row_key
    from storage_adapters.memory import KVOps

    core = host(FakeClient(0)).core
    for t in range(1, INLINE_FEED + 11):
        core.changes.record(t, 0.0, [(t, "put", t)])
    payload, header = Messages(KVOps()).write_message(
        ("version", tuple((row_key("v", (g, g)), [5, g]) for g in range(INLINE_KEYS // 2)), 0)
    )
    rows = [Delivery(1, Message("client:m", ("m", 1), header, payload))]

    def page(since: int) -> list[Any]:
        h = {H.READS: ((b"", b"\xff"),), H.OFFSET: 0, H.SINCE: since, H.REQUEST: 1}
        return [Delivery(2, Message("client:m", ("m", 2), h, None))]

    assert short_batches(core, [rows, page(INLINE_FEED + 10 - 5)])
    assert not short_batches(core, [rows, page(5)])  # a page from far behind
    assert short_batches(core, [rows, rows])
    assert not short_batches(core, [rows, rows, page(INLINE_FEED + 10 - 5)])
    puts = Messages(KVOps()).write_message(("put", tuple((k, k) for k in range(INLINE_FEED + 1))))
    bulk_now = [Delivery(3, Message("client:c", ("c", 3), puts[1], puts[0]))]
    tail = INLINE_FEED + 10
    assert short_batches(core, [rows, page(tail)])  # a view's rows are not logged
    assert not short_batches(core, [bulk_now, page(tail)])  # the step's own changes
    bulk = INLINE_FEED + 20  # one bulk write: one position, many changes
    core.changes.record(bulk, 0.0, [(k, "put", k) for k in range(1_000, 1_001 + INLINE_FEED)])
    assert short_batches(core, [page(bulk)])  # nothing since
    assert not short_batches(core, [page(bulk - 1)])  # one position, but its changes


def test_a_long_feed_page_a_revisions_read_and_a_long_batch_keep_the_thread() -> None:
    """A changes read or a revisions read may name one key yet walk a whole log or
    many keys; a batch of more than a few deliveries may be long however small each
    is: none runs on the loop.  A feed's page that walks only the few positions since
    the reader's last page (a view's maintainer that keeps up) does."""
    from ecast import Message
    from ecast.core.endpoint import Delivery
    from rubberband.changelog import FROM_NOW
    from rubberband.proto import H
    from rubberband.steps import INLINE_DELIVERIES, INLINE_FEED, points_only

    point = ((2, 5), (2, 5, 0))

    def delivered(header: Any, n: int = 1) -> list[Any]:
        return [Delivery(i, Message("client:c", ("c", i), header, None)) for i in range(n)]

    assert points_only(delivered({H.READS: (point,), H.OFFSET: 0}))
    assert not points_only(delivered({H.READS: (point,), H.OFFSET: 0, H.SINCE: 3}))
    held = {3: INLINE_FEED, 2: INLINE_FEED + 1}  # changes after each ``since``
    page = {H.READS: ((b"", b"\xff"),), H.OFFSET: 0}
    assert points_only(delivered({**page, H.SINCE: 3}), held.__getitem__)
    assert not points_only(delivered({**page, H.SINCE: 2}), held.__getitem__)
    assert points_only(delivered({**page, H.SINCE: FROM_NOW}), held.__getitem__)
    assert not points_only(delivered({**page, H.SINCE: "3"}), held.__getitem__)
    assert not points_only(delivered({H.READS: (point,), H.OFFSET: 0, H.REVISIONS: 1}))
    assert points_only(delivered({H.WRITES: (point,)}, INLINE_DELIVERIES))
    assert not points_only(delivered({H.WRITES: (point,)}, INLINE_DELIVERIES + 1))
    assert not points_only(delivered({H.WRITES: ({"lo": 1}, {"hi": 2})}))
    assert points_only(delivered({H.KEY: point[0]}, INLINE_DELIVERIES))  # a key named alone
    # Beside ranges, the ranges count, as they are what the routers and holders go by.
    assert not points_only(delivered({H.KEY: point[0], H.WRITES: (((2, 0), (2, 9)),)}))


async def test_metrics_and_health_read_the_core_on_the_engine_thread_between_steps() -> None:
    """``/metrics`` and ``/health`` read the core's tables and the engine's figures,
    which a step on the engine thread changes: they wait for the step and read on that
    thread; a step that outlasts ``HEALTH_WAIT`` makes ``/health`` say busy, not hang."""
    import threading

    from rubberband.tools import daemons

    h = host(FakeClient(0))
    async with h._busy:  # a step runs
        read = asyncio.ensure_future(h.inspect(lambda: threading.current_thread().name))
        health = asyncio.ensure_future(daemons.storage_health_between_steps(h.core, h))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not read.done() and not health.done()
    assert (await read).startswith("engine")
    assert (await health)["status"] == "ok"
    metrics = await h.inspect(lambda: daemons.storage_metrics(h.core, None, h))
    assert "rubberband_active" in metrics
    saved = daemons.HEALTH_WAIT
    daemons.HEALTH_WAIT = 0.05
    try:
        async with h._busy:
            busy = await daemons.storage_health_between_steps(h.core, h)
    finally:
        daemons.HEALTH_WAIT = saved
    assert busy["status"] == "busy" and "step" in busy["reasons"][0]
    assert (await daemons.storage_health_between_steps(h.core, h))["status"] == "ok"


async def test_a_read_given_up_on_keeps_the_engine_until_it_ends() -> None:
    """A ``/health`` that stops waiting leaves its read running on the engine thread:
    no step may start beside it, so the lock stays held until the read ends; after the
    pool is shut down (the process stopping) a read runs where it is asked."""
    import threading

    h = host(FakeClient(0))
    release = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "done"

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(h.inspect(slow), 0.05)
    assert h._busy.locked()  # the read still runs: no step now
    release.set()
    await until(lambda: not h._busy.locked())
    h._pool.shutdown(wait=True)
    assert await h.inspect(lambda: threading.current_thread().name) == "MainThread"


async def test_metrics_during_a_long_step_say_busy_and_nothing_older() -> None:
    from rubberband.tools import daemons

    h = host(FakeClient(0))
    saved = daemons.METRICS_WAIT
    daemons.METRICS_WAIT = 0.05
    try:
        async with h._busy:  # a step that outlasts the wait
            text = await daemons.storage_metrics_between_steps(h.core, None, h)
    finally:
        daemons.METRICS_WAIT = saved
    assert "rubberband_busy 1" in text and "rubberband_active" not in text
    assert "rubberband_active" in await daemons.storage_metrics_between_steps(h.core, None, h)


def test_a_steps_adjacent_delivery_batches_reach_the_engine_as_one() -> None:
    """The SDK hands deliveries over a packet at a time, and a step takes several: they
    go to the engine as one batch (on a durable engine one group commit, one sync), and
    a direct message between them still comes after the deliveries before it and before
    the ones after it."""
    from ecast import Message
    from ecast.core.endpoint import Delivery
    from rubberband.keys import EVERYTHING
    from rubberband.messages import Messages
    from storage_adapters.memory import KVOps

    batches: list[list[Any]] = []

    class Counted(MemoryEngine):
        def apply_logged(self, batch: Any) -> Any:
            batches.append([op[1][0][0] for op, *_ in batch])
            return super().apply_logged(batch)

    h = StorageHost(FakeClient(0), StorageCore("storage:1", Counted()))  # type: ignore[arg-type]
    h.core.joined({"rubberband": [1, "range", 0, [], [], [], [], [], [], [], []]})
    h.core.owned = EVERYTHING
    order: list[Any] = []
    on_directs = h.core.on_directs

    def directs(items: Any, now: float | None = None) -> Any:
        order.append(("direct", len(batches)))
        return on_directs(items, now)

    h.core.on_directs = directs  # type: ignore[method-assign]

    def put(t: int) -> Delivery:
        payload, header = Messages(KVOps()).write_message(("put", ((t, t),)))
        return Delivery(t, Message("client:c", (("c", 0, ""), t), header, payload))

    h._feed(
        [
            (DELIVERIES, [put(1), put(2)]),
            (DELIVERIES, [put(3)]),
            (DIRECT, "client:c", object()),
            (DELIVERIES, [put(4)]),
            (DELIVERIES, [put(5)]),
        ]
    )
    assert batches == [[1, 2, 3], [4, 5]]
    assert order == [("direct", 1)]


async def test_a_durable_engine_that_fails_a_batch_confirms_none_of_it() -> None:
    """A storage process on a durable engine confirms deliveries (E-Cast then
    acknowledges their writers) only once the batch is on disk: when the engine fails
    the batch, the process stops and confirms nothing of it."""
    from ecast import Message
    from ecast.core.endpoint import Delivery
    from rubberband.keys import EVERYTHING
    from rubberband.messages import Messages
    from storage_adapters.log import LogEngine
    from storage_adapters.memory import KVOps

    class Full(LogEngine):
        def apply_logged(self, batch: Any) -> Any:
            raise OSError("disk full")

    def put(t: int) -> Delivery:
        payload, header = Messages(KVOps()).write_message(("put", ((t, t),)))
        return Delivery(t, Message("client:c", (("c", 0, ""), t), header, payload))

    class Durable(FakeClient):
        def __init__(self) -> None:
            super().__init__(0)
            self.batches = [[put(1), put(2)], [put(3)]]
            self.confirmed: list[int] = []

        async def delivery_batch(self, max_items: int = 512) -> list[Any]:
            await asyncio.sleep(0)
            if self.batches:
                return self.batches.pop(0)
            await asyncio.sleep(3600)
            return []

        def durable(self, t: int) -> None:
            self.confirmed.append(t)

    client, engine = Durable(), Full(fsync="interval")
    try:
        h = StorageHost(client, StorageCore("storage:1", engine))  # type: ignore[arg-type]
        h.core.joined({"rubberband": [1, "range", 0, [], [], [], [], [], [], [], []]})
        h.core.owned = EVERYTHING
        why = await asyncio.wait_for(h.run(), 10)
    finally:
        engine.close()
    assert "engine failed" in why and "disk full" in why
    assert client.confirmed == []


def test_a_storage_process_keeps_changes_for_its_change_log_age_by_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host gives the core the time with each step: the change log's age bound
    (``--change-log-age``) held in the simulator, which passed the time, and in no
    daemon, whose core stood at 0 and so kept every change forever."""
    import time

    from ecast import Message
    from ecast.core.endpoint import Delivery
    from rubberband.changelog import ChangeLog
    from rubberband.keys import EVERYTHING
    from rubberband.messages import Messages
    from storage_adapters.memory import KVOps

    log = ChangeLog(max_age=60.0)
    h = StorageHost(FakeClient(0), StorageCore("storage:1", MemoryEngine(), changes=log))  # type: ignore[arg-type]
    h.core.joined({"rubberband": [1, "range", 0, [], [], [], [], [], [], [], []]})
    h.core.owned = EVERYTHING

    def put(t: int) -> Delivery:
        payload, header = Messages(KVOps()).write_message(("put", ((t, t),)))
        return Delivery(t, Message("client:c", (("c", 0, ""), t), header, payload))

    clock = [1_000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    h._feed([(DELIVERIES, [put(1), put(2)])])
    clock[0] += 30.0
    h._feed([(DELIVERIES, [put(3)])])
    assert log.floor < 1 and log.figures()["changes"] == 3  # none older than 60 s yet
    clock[0] += 45.0  # the first two are 75 s old, the third 45 s
    h._feed([(DELIVERIES, [put(4)])])
    assert log.floor == 2 and log.figures()["changes"] == 2


async def test_an_intake_held_for_a_view_takes_deliveries_at_the_holds_pace() -> None:
    """While a maintainer far behind holds the process (``core.holds.limit``, positions
    a second), the host takes deliveries from the SDK no faster; the rest wait there,
    where E-Cast's flow control slows the writers.  Released, it takes the rest at once."""
    import time

    client = FakeClient(100 * BATCH)  # positions 0, 1, 2, ...: one a delivery
    h = host(client)
    h.core.holds.limit = (20.0 * BATCH, time.monotonic() + 60)  # twenty batches a second

    async def drain() -> None:
        while True:
            await h._batch()

    reader = asyncio.ensure_future(h._read_deliveries())
    worker = asyncio.ensure_future(drain())
    await asyncio.sleep(0.5)
    held = client.taken
    assert BATCH <= held <= 16 * BATCH, held  # about ten batches; unheld, all hundred
    assert h.core.holds.held_seconds > 0.3
    h.core.holds.limit = None
    await until(lambda: client.taken == client.n)
    reader.cancel()
    worker.cancel()
