"""The client SDK against real router daemons: what applications and the layers above
rely on, and every way a caller can get it wrong failing at the call."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import ecast
from ecast.tools.local import LocalCluster
from tests.integration.cluster import SECRET

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three routers whose config lets processes that never joined submit too."""
    c = LocalCluster(
        tmp_path_factory.mktemp("sdk"),
        SECRET,
        ["--config", "ecast:BroadcastConfig", "--config-arg", "senders=anyone"],
    )
    c.start_group(3)
    yield c
    c.stop_all()


def connect(group: LocalCluster, name: str, **kw: object) -> ecast.sdk._Connecting:
    return ecast.connect(group.addresses(), name=name, secret=SECRET, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the surface
async def test_the_package_exports_its_api_and_a_version() -> None:
    assert "connect" in dir(ecast) and "SuspectedError" in dir(ecast)
    assert ecast.__version__


async def test_one_await_for_the_common_case_and_async_with(group: LocalCluster) -> None:
    async with connect(group, "one-await") as c:
        ack = await c.submit(b"hello", {"key": 1})
        assert isinstance(ack, ecast.Ack) and ack.delivered and ack.t is not None
        fut = await c.enqueue(b"pipelined")
        assert (await asyncio.wait_for(fut, 10)).delivered
        assert c.state == "connected"
    assert c.state == "closed"
    with pytest.raises(ecast.ClosedError):
        await c.submit(b"after close")


async def test_membership_deliveries_have_a_kind_and_members_are_known(
    group: LocalCluster,
) -> None:
    async with connect(group, "m-alice") as alice:
        assert "m-alice" in alice.members()
        async with connect(group, "m-bob") as bob:
            assert {"m-alice", "m-bob"} <= bob.members()  # from bob's own join
            kinds = []
            async for d in alice.deliveries():
                kinds.append((d.kind, d.message.sender))
                if d.kind == "join" and d.message.sender == "m-bob":
                    break
            assert ("join", "m-bob") in kinds
            assert "m-bob" in alice.members()
        deadline = time.monotonic() + 10
        while "m-bob" in alice.members() and time.monotonic() < deadline:
            async for d in alice.deliveries():
                if d.kind == "part":
                    break
        assert "m-bob" not in alice.members()


async def test_deliveries_come_in_batches_in_order_and_end_with_the_client(
    group: LocalCluster,
) -> None:
    """``delivery_batch`` hands over what waits, in ``t`` order, at most as many as
    asked; once the client is closed, what was still waiting (here its own part), then
    ``[]``, every time."""
    async with connect(group, "batch-bob") as bob:
        async with connect(group, "batch-alice") as alice:
            await asyncio.wait_for(
                asyncio.gather(*(alice.submit(b"%d" % i) for i in range(300))), 30
            )
        got: list[ecast.Delivery] = []
        mine: list[object] = []
        while len(mine) < 300:
            batch = await asyncio.wait_for(bob.delivery_batch(100), 10)
            assert 1 <= len(batch) <= 100
            got += batch
            mine = [d.message.payload for d in got
                    if d.kind is None and d.message.sender == "batch-alice"]  # fmt: skip
        ts = [d.t for d in got]
        assert ts == sorted(ts) and len(set(ts)) == len(ts)
        assert mine == [b"%d" % i for i in range(300)]
    rest = await asyncio.wait_for(bob.delivery_batch(), 10)
    assert [d.kind for d in rest] in ([], ["part"])
    if rest:
        rest = await asyncio.wait_for(bob.delivery_batch(), 10)
    assert rest == [] and await bob.delivery_batch() == []


async def test_leaving_the_delivery_loop_loses_nothing(group: LocalCluster) -> None:
    """``break`` out of ``deliveries()`` and iterate again: the next loop starts with the
    delivery after the last one taken."""
    async with connect(group, "loop-bob") as bob:
        async with connect(group, "loop-alice") as alice:
            await asyncio.wait_for(
                asyncio.gather(*(alice.submit(b"%d" % i) for i in range(10))), 30
            )

        async def next_from_alice() -> object:
            async for d in bob.deliveries(include_membership=False):
                if d.message.sender == "loop-alice":
                    return d.message.payload  # leaves the loop
            return None

        got = [await asyncio.wait_for(next_from_alice(), 10) for _ in range(10)]
        assert got == [b"%d" % i for i in range(10)]


async def test_a_sender_is_acknowledged_once_a_durable_destination_has_it_on_disk(
    group: LocalCluster,
) -> None:
    """A process connected with ``confirm_when_durable`` confirms a delivery only when it
    calls ``durable()``: until then the message is delivered but not stable, and its
    sender waits for the acknowledgement."""
    params = ecast.EndpointParams(confirm_when_durable=True)
    async with connect(group, "durable-keeper", params=params) as keeper:
        holding = True
        data: list[ecast.Delivery] = []

        async def keep() -> None:
            async for d in keeper.deliveries():
                if d.kind is not None:
                    keeper.durable(d.t)  # a membership message: nothing to write down
                else:
                    data.append(d)
                    if not holding:
                        keeper.durable(d.t)

        task = asyncio.ensure_future(keep())
        try:
            async with connect(group, "durable-sender") as sender:
                fut = await sender.enqueue(b"kept")
                deadline = time.monotonic() + 10
                while not data and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert [d.message.payload for d in data] == [b"kept"]
                await asyncio.sleep(1.0)
                assert not fut.done()  # delivered, not on disk: not stable
                holding = False
                keeper.durable(data[-1].t)
                assert (await asyncio.wait_for(fut, 10)).delivered
        finally:
            task.cancel()


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("payload", "header", "error", "text"),
    [
        (b"x", {1, 2}, ecast.InvalidMessage, "a header is a dict"),
        (b"x", {"k": {1, 2}}, ecast.InvalidMessage, "header cannot be encoded"),
        ({1, 2}, None, ecast.InvalidMessage, "payload cannot be encoded"),
        (b"x", {"kind": "join"}, ecast.InvalidMessage, "reserved for membership"),
        (b"x", ["not", "a", "dict"], ecast.InvalidMessage, "a header is a dict"),
        (b"x" * (20 * 1024 * 1024), None, ecast.MessageTooLarge, "exceeds the routers' limit"),
    ],
)
async def test_bad_messages_fail_at_the_call(
    group: LocalCluster, payload: object, header: object, error: type, text: str
) -> None:
    async with connect(group, f"bad-{error.__name__}-{len(str(header))}-{id(payload)}") as c:
        for call in (
            lambda: c.submit_nowait(payload, header),  # type: ignore[arg-type]
            lambda: c.submit_batch([(payload, header)]),
        ):
            with pytest.raises(error, match=text):
                call()
        with pytest.raises(error, match=text):
            await c.submit(payload, header)  # type: ignore[arg-type]
        # Nothing went wrong inside the loop: the client still works.
        assert (await c.submit(b"fine", timeout=10)).delivered


@pytest.mark.parametrize(
    ("name", "text"),
    [("", "non-empty"), ("@routers", "reserved"), ("x" * 300, "at most 255"), (7, "str")],
)
async def test_bad_names_fail_at_the_call(group: LocalCluster, name: object, text: str) -> None:
    with pytest.raises(ecast.InvalidName, match=text):
        ecast.connect(group.addresses(), name=name, secret=SECRET)  # type: ignore[arg-type]


async def test_a_retired_name_fails_fast(group: LocalCluster) -> None:
    c = await connect(group, "once-only")
    await c.close()
    start = time.monotonic()
    with pytest.raises(ecast.NameRetiredError, match="unique for ever"):
        await connect(group, "once-only")
    assert time.monotonic() - start < 5


async def test_the_backlog_of_submit_nowait_is_bounded(group: LocalCluster) -> None:
    async with connect(group, "bounded", max_queued=50) as c:
        with pytest.raises(ecast.Backpressure, match="await enqueue"):
            for i in range(100_000):
                c.submit_nowait(f"m{i}".encode())


async def test_no_secret_a_wrong_secret_and_a_wrong_port_say_what_to_change(
    group: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ECAST_SECRET", raising=False)
    with pytest.raises(ecast.AuthenticationError, match=r"secret= .*ECAST_SECRET"):
        await ecast.connect(group.addresses(), name="no-secret")
    with pytest.raises(ecast.AuthenticationError, match="ECAST_SECRET"):
        await ecast.connect(group.addresses(), name="wrong", secret=SECRET[::-1])
    with pytest.raises(ecast.AuthenticationError, match=r"too weak.*ecast credentials secret"):
        await ecast.connect(group.addresses(), name="weak", secret="not-the-secret")
    metrics = f"127.0.0.1:{group.routers['r1'].metrics}"
    with pytest.raises(ecast.NotARouterError, match="HTTP answered"):
        await ecast.connect([metrics], name="http", secret=SECRET)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(ecast.Unavailable, match="no router reachable"):
        await ecast.connect([closed], name="nowhere", secret=SECRET)
    assert time.monotonic() - start < 5


# ------------------------------------------------------------------ sessions
async def test_close_sessions_answers_and_later_messages_of_them_are_refused(
    group: LocalCluster,
) -> None:
    session = ("ingest-q1", 4, "part-0")
    async with connect(group, "closer", join=False, session=session) as c:
        assert (await c.submit(b"before", timeout=10)).t is not None  # ordered (no members)
        reply = await c.close_sessions("ingest-q1", 4, timeout=10)
        assert (reply.namespace, reply.epoch) == ("ingest-q1", 4)
        with pytest.raises(ecast.SessionClosedError, match="closed"):
            await c.submit(b"after", timeout=10)


async def test_a_session_handed_to_a_new_process_lands_once(group: LocalCluster) -> None:
    session = ("spark-job", 7, "partition-3")
    async with connect(group, "watcher") as watcher:
        first = await connect(group, "task-attempt-1", join=False, session=session)
        acks = [await first.submit(f"row-{i}".encode(), timeout=10) for i in range(5)]
        await first.detach()
        # A retry from another process: the same session and sequence numbers, same rows.
        # Its join (it does join) takes no data sequence number.
        second = await connect(group, "task-attempt-2", session=session)
        again = [await second.submit(f"row-{i}".encode(), timeout=10) for i in range(7)]
        assert [a.t for a in again[:5]] == [a.t for a in acks]  # the first copies' places
        assert again[5].t is not None and again[5].t > acks[-1].t
        await second.close()
        seen = []
        async for d in watcher.deliveries(include_membership=False):
            seen.append(d.message.payload)
            if d.message.payload == b"row-6":
                break
        assert seen == [f"row-{i}".encode() for i in range(7)]  # once each, in order


async def test_a_light_client_submits_without_joining_and_detaches(group: LocalCluster) -> None:
    async with connect(group, "listener") as listener:
        light = await connect(group, "light-1", join=False)
        assert light.members() == frozenset()
        assert (await light.submit(b"from a light client", timeout=10)).delivered
        await light.detach()
        assert light.state == "closed"
        async for d in listener.deliveries(include_membership=False):
            assert d.message.sender == "light-1" and d.message.payload == b"from a light client"
            break
        # No part message: the listener never sees light-1 leave.
        assert "light-1" not in listener.members()


# ------------------------------------------------------------------ direct channel
async def test_a_process_that_listens_is_reachable_by_name(group: LocalCluster) -> None:
    async with (
        connect(group, "storage-a", listen="127.0.0.1:0") as server,
        connect(group, "client-b") as client,
    ):
        deadline = time.monotonic() + 10
        while "storage-a" not in client.runtime.directory and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the routers gossip the address
        await client.send_direct("storage-a", {"read": [1, 2]})
        sender, payload = await server.receive_direct(timeout=10)
        assert sender == "client-b" and payload == {"read": (1, 2)}
        with pytest.raises(ecast.InvalidMessage, match="cannot be encoded"):
            client.send_direct_nowait("storage-a", {"set": {1, 2}})
        with pytest.raises(ecast.MessageTooLarge):
            client.send_direct_nowait("storage-a", ["x" * (20 * 1024 * 1024)])


async def test_a_burst_of_direct_messages_over_the_frame_limit_arrives_whole(
    group: LocalCluster,
) -> None:
    """Direct messages sent in one go whose sum passes the wire's frame limit (a
    migration's history of a big range) leave in several frames: before, the link put
    them in one frame the peer refused, again after every reconnect, for good."""
    async with (
        connect(group, "storage-burst", listen="127.0.0.1:0") as server,
        connect(group, "client-burst") as client,
    ):
        deadline = time.monotonic() + 10
        while "storage-burst" not in client.runtime.directory and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        part = "y" * (3 * 1024 * 1024)
        for n in range(8):  # 24 MiB in one flush
            client.send_direct_nowait("storage-burst", [n, part])
        got = [await server.receive_direct(timeout=20) for _ in range(8)]
        assert [(s, p[0], len(p[1])) for s, p in got] == [
            ("client-burst", n, len(part)) for n in range(8)
        ]


async def test_a_burst_of_large_messages_bigger_than_a_packet_is_delivered(
    group: LocalCluster,
) -> None:
    """24 messages of 2 MiB submitted at once: the client's routes, the leader's
    proposal and the receiver's deliveries each make a frame over the packet limit,
    which crosses in parts; before, the peer refused it, again after every reconnect."""
    async with connect(group, "big-bob") as bob:
        async with connect(group, "big-alice") as alice:
            big = b"z" * (2 * 1024 * 1024)
            await asyncio.wait_for(
                asyncio.gather(*(alice.submit(big + b"%d" % i) for i in range(24))), 60
            )
        got: list[bytes] = []
        while len(got) < 24:
            batch = await asyncio.wait_for(bob.delivery_batch(100), 30)
            got += [d.message.payload for d in batch if d.kind is None]
        assert got == [big + b"%d" % i for i in range(24)]


@contextlib.asynccontextmanager
async def colocated(
    group: LocalCluster, first: str, second: str
) -> AsyncIterator[tuple[ecast.Client, ecast.Client]]:
    """Two connected processes sharing one runtime (their direct messages skip the wire)."""
    rt = ecast.Runtime(ecast.load_auth(secret=SECRET), host_id=f"{first}+{second}")
    await rt.serve("127.0.0.1:0")
    try:
        async with (
            connect(group, first, runtime=rt) as a,
            connect(group, second, runtime=rt) as b,
        ):
            yield a, b
    finally:
        await rt.close()


async def test_colocated_processes_get_direct_payloads_as_the_wire_gives_them(
    group: LocalCluster,
) -> None:
    """Two processes on one runtime exchange direct messages without the wire: the
    payload the sender packed once arrives decoded exactly as it would from afar."""
    async with colocated(group, "co-a", "co-b") as (a, b):
        value = {"rows": [[1, "x"], [2, b"y"]], "n": 2.5, "none": None}
        await a.send_direct("co-b", value)
        sender, payload = await b.receive_direct(timeout=10)
        assert sender == "co-a"
        assert payload == {"rows": ((1, "x"), (2, b"y")), "n": 2.5, "none": None}


async def test_a_direct_listener_takes_each_message_as_it_arrives(group: LocalCluster) -> None:
    """With ``direct_listener`` set, direct messages go to it in order and never to the
    receive queue; a listener that raises loses that message only."""
    async with colocated(group, "li-a", "li-b") as (a, b):
        got: list[tuple[str, object]] = []
        arrived = asyncio.Event()

        def listener(sender: str, payload: object) -> None:
            if payload == {"n": 3}:
                raise RuntimeError("the application's own bug")
            got.append((sender, payload))
            if len(got) == 9:
                arrived.set()

        b.direct_listener = listener
        for n in range(10):
            a.send_direct_nowait("li-b", {"n": n})
        await asyncio.wait_for(arrived.wait(), 10)
        assert got == [("li-a", {"n": n}) for n in range(10) if n != 3]
        with pytest.raises(TimeoutError):
            await b.receive_direct(timeout=0.2)  # nothing went to the queue
        b.direct_listener = None
        await a.send_direct("li-b", {"n": 10})
        assert await b.receive_direct(timeout=10) == ("li-a", {"n": 10})


async def test_a_direct_batch_listener_takes_a_frames_messages_in_one_call(
    group: LocalCluster,
) -> None:
    """With ``direct_batch_listener`` set, the direct messages sent in one go arrive in
    their order, several to a call, ahead of ``direct_listener`` and never in the
    receive queue."""
    async with colocated(group, "bl-a", "bl-b") as (a, b):
        calls: list[tuple[str, list[object]]] = []
        arrived = asyncio.Event()

        def batch(sender: str, payloads: list[object]) -> None:
            calls.append((sender, list(payloads)))
            if sum(len(p) for _, p in calls) == 50:
                arrived.set()

        b.direct_batch_listener = batch
        b.direct_listener = lambda sender, payload: pytest.fail("one at a time")
        for n in range(50):
            a.send_direct_nowait("bl-b", {"n": n})
        await asyncio.wait_for(arrived.wait(), 10)
        assert [p for _, ps in calls for p in ps] == [{"n": n} for n in range(50)]
        assert {sender for sender, _ in calls} == {"bl-a"}
        assert len(calls) < 50  # (sent in one go: a frame carries many)
        with pytest.raises(TimeoutError):
            await b.receive_direct(timeout=0.2)


async def test_a_new_process_under_a_name_gets_the_direct_messages_sent_to_it(
    group: LocalCluster,
) -> None:
    """A light client that listens stops; another process starts under its name, on
    another port.  A long-running process that talked to the first one reaches the new
    one by the name: nothing of the stopped incarnation (its channel, route or address)
    stands in the way."""
    async with connect(group, "reuse-holder", listen="127.0.0.1:0") as holder:
        for attempt in range(3):
            light = await connect(group, "reuse-light", listen="127.0.0.1:0", join=False)
            try:
                deadline = time.monotonic() + 10
                while (
                    holder.runtime.directory.get("reuse-light") != light.runtime.listen
                    and time.monotonic() < deadline
                ):
                    await asyncio.sleep(0.05)  # the routers gossip the new address
                await asyncio.wait_for(holder.send_direct("reuse-light", {"n": attempt}), 10)
                sender, payload = await light.receive_direct(timeout=10)
                assert sender == "reuse-holder" and payload == {"n": attempt}
            finally:
                await light.detach()
        assert holder.state == "connected"


async def test_the_direct_channel_pushes_back_and_never_stalls_deliveries(
    group: LocalCluster,
) -> None:
    async with (
        connect(group, "slow-reader", listen="127.0.0.1:0", direct_queue_size=100) as rd,
        connect(group, "fast-writer") as wr,
    ):
        peer = await wr.connect_peer(rd.runtime.listen or "")
        with pytest.raises(ecast.MessageTooLarge):
            await wr.send_direct(peer, b"x" * (20 * 1024 * 1024))
        blob = b"y" * 2048
        sent = 0

        async def flood() -> None:
            nonlocal sent
            while True:
                await wr.send_direct(peer, blob, high_water=64)
                sent += 1

        flooder = asyncio.create_task(flood())
        await asyncio.sleep(1.5)
        stalled_at = sent
        await asyncio.sleep(0.5)
        # The reader reads nothing: its queue filled, reading from that one peer paused,
        # and the writer's sends now wait instead of buffering without bound.
        assert sent == stalled_at and sent < 100 + 64 + 400
        # Deliveries from the routers still flow to the reader meanwhile.
        ack = await wr.submit(b"ordered", timeout=10)
        assert ack.delivered
        async for d in rd.deliveries(include_membership=False):
            assert d.message.payload == b"ordered"
            break
        got = 0
        while got < 200:  # draining the queue lets the writer go on
            await rd.receive_direct(timeout=10)
            got += 1
        assert sent > stalled_at
        flooder.cancel()


# ------------------------------------------------------------------ failures
async def test_losing_every_router_fails_pending_calls_and_close_says_so(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, SECRET)
    try:
        c.start_group(3)
        client = await ecast.connect(
            c.addresses(), name="orphan", secret=SECRET, unavailable_after=2.0
        )
        assert client.state == "connected"
        for rid in ("r1", "r2", "r3"):
            c.kill(rid)
        fut = client.submit_nowait(b"into the void")
        deadline = time.monotonic() + 10
        while client.state != "unavailable" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert client.state == "unavailable"
        with pytest.raises(ecast.Unavailable, match="no router reachable for 2 s"):
            await asyncio.wait_for(fut, 5)
        with pytest.raises(TimeoutError, match="did not come within 1 s"):
            await client.submit(b"still nothing", timeout=1.0)
        pending = client.submit_nowait(b"pending at close")
        with pytest.raises(ecast.PartFailedError, match="not delivered within 1 s"):
            await client.close(timeout=1.0)
        with pytest.raises(ecast.ClosedError):
            await asyncio.wait_for(pending, 1)
        assert client.state == "closed"
    finally:
        c.stop_all()
