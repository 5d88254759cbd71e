"""Real router daemons and SDK clients on 127.0.0.1, with routers killed and added."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import time
from pathlib import Path

import pytest

import ecast
from ecast.tools.local import LocalCluster
from tests.integration.cluster import SECRET, Cluster, Recorder, check_guarantees


@pytest.fixture
def cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path)
    yield c
    c.stop_all()


async def connect(cluster: Cluster, name: str) -> Recorder:
    client = await ecast.connect(cluster.addresses(), name=name, secret=SECRET.encode())
    return Recorder(client)


async def pump(rec: Recorder, n: int, stop: asyncio.Event, tag: str) -> None:
    """Submit up to ``n`` messages as fast as the window allows, recording acks."""
    pending = []
    for i in range(n):
        if stop.is_set():
            break
        fut = await rec.client.enqueue(f"{tag}-{i}".encode())
        pending.append(fut)
        if i % 50 == 0:
            await asyncio.sleep(0)
    for fut in pending:
        ack = await asyncio.wait_for(fut, 30)
        rec.acked[ack.id] = ack.t


async def test_clients_agree_while_the_group_loses_and_gains_routers(cluster: Cluster) -> None:
    routers = cluster.start_group(5)
    clients = [await connect(cluster, f"c{i}") for i in range(3)]
    assert clients[0].client.leader == "r1"
    stop = asyncio.Event()
    work = [asyncio.create_task(pump(c, 3000, stop, c.name)) for c in clients]
    await asyncio.sleep(1.0)
    cluster.kill("r1")  # the leader, mid-stream
    await asyncio.sleep(1.8)
    cluster.start("r6", routers[1].address)  # a router joins the smaller group
    cluster.wait_healthy("r6")
    new_leader = clients[0].client.leader
    assert new_leader not in (None, "r1")
    cluster.kill(new_leader)  # the new leader
    await asyncio.sleep(1.8)
    follower = next(r for r in ("r3", "r4", "r5") if r != new_leader and cluster.routers[r].alive())
    cluster.kill(follower)  # and a follower
    await asyncio.wait_for(asyncio.gather(*work), 90)
    await asyncio.sleep(0.5)
    total = sum(len(c.acked) for c in clients)
    assert total == 9000, f"only {total} of 9000 acknowledged"
    problems = check_guarantees(clients, clients)
    assert problems == []
    first, second, third = (c.payloads() for c in clients)
    assert first == second == third
    for c in clients:
        await c.client.close()
    alive = [r for r in cluster.routers.values() if r.alive()]
    views = {r.id: r.health()["view"] for r in alive}
    assert len(set(views.values())) == 1, views


async def test_sigterm_parts_a_router_gracefully(cluster: Cluster) -> None:
    cluster.start_group(3)
    client = await connect(cluster, "c1")
    await client.client.submit(b"before", timeout=10)
    code = cluster.terminate("r3")
    assert code == 0
    h = cluster.wait_healthy("r1", members=2)
    assert h["members"] == ["r1", "r2"]
    ack = await client.client.submit(b"after", timeout=10)
    assert ack.delivered
    log = cluster.routers["r3"].log.read_text()
    assert "event=leaving" in log and "event=stopped" in log
    await client.client.close()


async def test_metrics_and_health_describe_the_router(cluster: Cluster) -> None:
    cluster.start_group(3)
    client = await connect(cluster, "c1")
    for i in range(20):
        await client.client.submit(f"m{i}".encode(), timeout=10)
    text = cluster.routers["r1"].metrics_text()
    for name in (
        "ecast_messages_routed_total",
        "ecast_unstable_messages",
        "ecast_paxos_active_instances",
        "ecast_view",
        "ecast_leader",
        "ecast_congestion_notices_total",
        "ecast_peer_unacked_frames",
        "ecast_peer_unacked_messages",
        'ecast_leader_info{leader="r1"} 1',
        'ecast_peer_unacked_messages{peer="c1"}',
        "# TYPE ecast_commit_seconds histogram",
        "# TYPE ecast_stable_seconds histogram",
    ):
        assert name in text, name
    # Twenty acknowledged messages: the router that routed them counted their batches'
    # ordering and stability latency (at least one batch each; each ack waited for both).
    counts = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("ecast_commit_seconds_count", "ecast_stable_seconds_count"))
    }
    assert counts["ecast_commit_seconds_count"] >= 1, counts
    assert counts["ecast_stable_seconds_count"] >= 1, counts
    h = cluster.routers["r2"].health()
    assert h is not None and h["leader"] == "r1" and h["status"] == "ok" and not h["leading"]
    await client.client.close()
    t0 = time.monotonic()
    while cluster.routers["r1"].health()["unstable"] and time.monotonic() - t0 < 5:
        await asyncio.sleep(0.05)
    assert cluster.routers["r1"].health()["unstable"] == 0


def policies(cluster: Cluster) -> dict[str, str]:
    names = {os.SCHED_OTHER: "normal", os.SCHED_BATCH: "batch"}
    return {
        rid: names.get(os.sched_getscheduler(r.proc.pid), "?")
        for rid, r in cluster.routers.items()
        if r.alive()
    }


async def wait_policies(cluster: Cluster, want: dict[str, str]) -> None:
    deadline = time.monotonic() + 5
    while policies(cluster) != want and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert policies(cluster) == want


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling policies")
async def test_followers_yield_the_cpu_to_the_leader_and_a_new_leader_takes_it(
    cluster: Cluster,
) -> None:
    cluster.start_group(3)
    await wait_policies(cluster, {"r1": "normal", "r2": "batch", "r3": "batch"})
    cluster.kill("r1")
    cluster.wait_healthy("r2", members=2)
    leader = cluster.leader()
    assert leader in ("r2", "r3")
    follower = "r3" if leader == "r2" else "r2"
    await wait_policies(cluster, {leader: "normal", follower: "batch"})


async def test_an_unsafe_flood_neither_stalls_nor_splits_the_group(cluster: Cluster) -> None:
    """Unsafe messages bypass flow control.  A client sending them as fast as it can must
    not stall a router's event loop past the failure timeout (its group would part it)."""
    routers = cluster.start_group(3)
    sink = await connect(cluster, "sink")  # a slow-ish destination: it records everything
    flood = await connect(cluster, "flood")
    payload = b"x" * 256
    loop = asyncio.get_running_loop()
    end = loop.time() + 4.0
    sent = 0
    while loop.time() < end:
        await flood.client.submit_unsafe_batch([(payload, None)] * 512)
        sent += 512
        await asyncio.sleep(0)
    ack = await flood.client.submit(b"still ordered", timeout=10)
    assert ack.delivered
    for r in routers:
        h = r.health()
        assert h is not None and sorted(h["members"]) == ["r1", "r2", "r3"], h
        lag = [
            float(line.split()[1])
            for line in r.metrics_text().splitlines()
            if line.startswith("ecast_loop_lag_max_seconds")
        ]
        assert lag and lag[0] < 1.0, f"{r.id} stalled for {lag}s"
    assert sent > 10_000
    assert sink.client.endpoint is not None
    assert sink.client.endpoint.stats["unsafe_accepted"] > 0
    await flood.client.close()
    await sink.client.close()


async def test_a_slow_consumer_pauses_its_routers_and_loses_nothing(cluster: Cluster) -> None:
    cluster.start_group(3)
    slow = await ecast.connect(
        cluster.addresses(), name="slow", secret=SECRET.encode(), queue_size=50
    )
    fast = await connect(cluster, "fast")
    # One frame of 300 unsafe copies lands on a queue that pauses at 50: all must go in.
    await fast.client.submit_unsafe_batch([(b"u", None)] * 300)
    futs = [fast.client.submit_nowait(f"m{i}".encode()) for i in range(600)]
    await asyncio.sleep(2.0)  # slow consumes nothing yet: its reading is paused
    assert not all(f.done() for f in futs), "stability must wait for the slow destination"
    got = []
    unsafe = 0
    async with asyncio.timeout(30):
        async for d in slow.deliveries():
            if d.unsafe:
                unsafe += 1
            elif d.message.sender == "fast" and d.message.kind is None:
                got.append(d.message.payload)
                if len(got) == 600:
                    break
    assert got == [f"m{i}".encode() for i in range(600)]
    assert unsafe == 300
    acks = [await asyncio.wait_for(f, 10) for f in futs]
    assert all(a.delivered for a in acks)
    assert slow.terminated is None and slow.endpoint is not None
    for r in cluster.routers.values():
        assert "core_error" not in r.log.read_text()
    await fast.client.close()
    await slow.close()


async def test_application_processes_talk_directly_over_an_authenticated_channel(
    cluster: Cluster,
) -> None:
    cluster.start_group(3)
    alice, bob = [await connect(cluster, n) for n in ("alice", "bob")]
    assert alice.client.node.runtime is not bob.client.node.runtime  # two processes' worth
    address = await bob.client.serve()
    peer = await alice.client.connect_peer(address)
    assert peer == "bob"
    payload = {"rows": [(1, b"x" * 1000), (2, None)], "range": ["a", "m"]}
    await alice.client.send_direct(peer, payload)
    sender, got = await asyncio.wait_for(bob.client.receive_direct(), 10)
    assert sender == "alice"
    assert got == {"rows": ((1, b"x" * 1000), (2, None)), "range": ("a", "m")}
    await bob.client.send_direct(sender, "thanks")  # and back over the same connection
    assert await asyncio.wait_for(alice.client.receive_direct(), 10) == ("bob", "thanks")
    with pytest.raises(ConnectionError):  # a process that does not know the secret
        stranger = await ecast.connect(cluster.addresses(), name="eve", secret=SECRET[::-1])
        await stranger.close()
    for c in (alice, bob):
        await c.client.close()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_routers_and_clients_speak_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    tls_args = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(cert)]
    cluster = LocalCluster(tmp_path, args=tls_args)  # credentials inside mutual TLS
    try:
        cluster.start_group(2)  # r2 joins r1 over TLS, checking r1's host name
        plain = await asyncio.wait_for(
            asyncio.gather(
                ecast.connect(cluster.addresses(), name="plain", **cluster.client_auth("plain")),
                return_exceptions=True,
            ),
            30,
        )
        assert isinstance(plain[0], ConnectionError)  # no TLS, no entry
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(cert))
        anonymous = await asyncio.gather(
            ecast.connect(cluster.addresses(), name="anon", tls=ctx, timeout=5,
                          **cluster.client_auth("anon")),
            return_exceptions=True,
        )  # fmt: skip
        assert isinstance(anonymous[0], ConnectionError)  # TLS without a client certificate
        ctx.load_cert_chain(str(cert), str(key))
        client = await ecast.connect(
            cluster.addresses(), name="secure", tls=ctx, **cluster.client_auth("secure")
        )
        ack = await client.submit(b"over tls", timeout=10)
        assert ack.delivered
        await client.close()
    finally:
        cluster.stop_all()


async def test_the_direct_channel_speaks_mutual_tls(tmp_path: Path) -> None:
    """Two application processes that serve with ``tls_server`` talk over TLS with
    client certificates, found by name through the routers' gossip; a peer that does not
    speak TLS, or has no certificate, is refused before any frame reaches the process."""
    cert, key = self_signed(tmp_path)
    tls_args = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(cert)]
    cluster = LocalCluster(tmp_path, args=tls_args)

    def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
        client_ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(cert))
        client_ctx.load_cert_chain(str(cert), str(key))
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(cert))
        server_ctx.load_cert_chain(str(cert), str(key))
        server_ctx.verify_mode = ssl.CERT_REQUIRED
        return client_ctx, server_ctx

    try:
        cluster.start_group(2)
        procs = []
        for name in ("tls-alice", "tls-bob"):
            client_ctx, server_ctx = contexts()
            procs.append(
                await ecast.connect(
                    cluster.addresses(),
                    name=name,
                    tls=client_ctx,
                    tls_server=server_ctx,
                    listen="127.0.0.1:0",
                    **cluster.client_auth(name),
                )
            )
        alice, bob = procs
        address = alice.runtime.listen
        assert address
        deadline = time.monotonic() + 10
        while bob.runtime.directory.get("tls-alice") != address:
            assert time.monotonic() < deadline, "alice's address never reached bob"
            await asyncio.sleep(0.1)
        await bob.send_direct("tls-alice", {"rows": (1, 2, 3)})
        assert await alice.receive_direct(timeout=10) == ("tls-bob", {"rows": (1, 2, 3)})
        await alice.send_direct("tls-bob", "back")
        assert await bob.receive_direct(timeout=10) == ("tls-alice", "back")
        host, _, port = address.rpartition(":")
        # Plain TCP: the TLS server wants a ClientHello and drops the connection.
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"\x00\x00\x00\x05hello")
        assert await asyncio.wait_for(reader.read(100), 10) == b""
        writer.close()
        # TLS without a client certificate: the handshake fails (mutual TLS).
        no_cert = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(cert))
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            reader, writer = await asyncio.open_connection(host, int(port), ssl=no_cert)
            writer.write(b"\x00\x00\x00\x05hello")
            await writer.drain()
            if await asyncio.wait_for(reader.read(100), 10) == b"":
                raise ConnectionError("closed")
        # Both processes still work after the refusals.
        await bob.send_direct("tls-alice", "still here")
        assert await alice.receive_direct(timeout=10) == ("tls-bob", "still here")
        for p in procs:
            await p.close()
    finally:
        cluster.stop_all()


async def test_dropped_connections_are_resumed_without_loss_or_duplicates(
    cluster: Cluster,
) -> None:
    # The link layer over TCP: after each reconnect exactly what the peer misses is
    # resent, and what arrives twice is suppressed.
    cluster.start_group(3)
    clients = [await connect(cluster, n) for n in ("c1", "c2")]
    stop = asyncio.Event()
    work = [asyncio.create_task(pump(c, 3000, stop, c.name)) for c in clients]
    node = clients[0].client.node
    cut = 0
    while not all(w.done() for w in work) and cut < 5:
        await asyncio.sleep(0.15)
        for conn in list(node.runtime.conns.values()):
            if conn.transport is not None and conn.state == "open":
                conn.transport.abort()  # every connection of c1's process, mid-stream
                cut += 1
    await asyncio.wait_for(asyncio.gather(*work), 60)
    await asyncio.sleep(0.5)
    assert cut >= 3, "the messages went through before the connections could be cut"
    assert sum(len(c.acked) for c in clients) == 6000
    assert check_guarantees(clients, clients) == []
    for c in clients:  # each client delivered every message exactly once
        assert len(c.payloads()) == len(set(c.payloads())) == 6000
    # (Whether a cut costs frames in flight, and so resends, depends on timing: the
    # handshake's counts resend only what the peer misses. Loss or duplicates fail above.)
    for c in clients:
        await c.client.close()


def test_a_lone_router_with_nothing_owed_stops_at_once_on_sigterm(tmp_path: Path) -> None:
    # Its own part is never executed (a group's last member cannot part), so it used to
    # wait out --leave-timeout: a whole cluster stopped router after router did, at the end.
    c = Cluster(tmp_path)
    try:
        r = c.start("r1", None, "--leave-timeout", "60")
        c.wait_healthy("r1")

        async def one_message() -> None:
            rec = await connect(c, "app:lone")
            fut = await rec.client.enqueue(b"x")
            await asyncio.wait_for(fut, 10)
            await rec.client.close()

        asyncio.run(one_message())
        t0 = time.monotonic()
        r.daemon.terminate(timeout=50)
        assert time.monotonic() - t0 < 20, "waited for a part that is never executed"
        assert "event=stopped router=r1 code=0" in r.daemon.log_text()
    finally:
        c.stop_all()
