"""The asyncio runtime that drives sans-IO cores over real connections.

One :class:`Runtime` per OS process (a *host*) holds the cluster secret, TLS settings, an
address directory and one authenticated connection per peer host, and it runs one or
more :class:`Node` s.  A node is one logical process: a core (router, endpoint, ...) and
its :class:`~ecast.core.link.LinkLayer`, whose channels are per node pair.

Why connections per host rather than per node: Python pays per system call and per
callback.  A leader forwarding to sixteen receivers that live in one benchmark process
would otherwise write sixteen small frames per turn and read sixteen acknowledgements;
multiplexed, it writes one packet and reads one.

A packet is a msgpack array of items:

- ``(src, dst, src_inc, dst_inc, seq, ack, msgs)``: a link-layer frame
  (:class:`~ecast.core.link.Frame`, flattened) from node ``src`` (on the sending host) to node
  ``dst`` (on the receiving host);
- ``("nodes", ((node, incarnation), ...))``: nodes that now run on the sending host;
- ``("gone", (node, ...))``: nodes that stopped there;
- ``("acks", ((sender_node, receiver_node, count), ...))``: "my node ``sender_node`` holds
  ``count`` frames in order from your node ``receiver_node``", the per-channel resend
  point, exchanged once both ends of a node pair are known;
- ``("error", reason)``: why the sender is about to close the connection;
- ``("m", (message, ...))``: the packet's message table, first if present, which the
  packet's ``Deliver`` messages index into (``Encoder.pack_packet``).

A channel ``(local, remote)`` carries frames only after the peer's ``acks`` for it arrived,
so after a reconnect exactly the frames the peer misses are resent (the link layer keeps
them until then).

Batching: everything the nodes of a process emit during one turn of the event loop leaves
in one packet per peer host, flushed by a single ``call_soon`` callback, each object
encoded once per flush.  There is no task per message: packets are decoded in the
protocol callback that read them, and the frames of one turn go to each node in one step
at the end of the turn (or as soon as ``QUANTUM`` bytes came in, whose output is written
at once).  Colocated nodes exchange frames in memory, without encoding.

Timers: a core reports its earliest deadline in ``Effects.wake_at``; each node keeps one
``call_at`` handle for the earlier of that and its link layer's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import ssl
import time
import traceback
from collections.abc import Callable
from typing import Any

from ecast.core.effects import Effects, NodeId, UnexpectedMessage
from ecast.core.link import Frame, LinkLayer, LinkParams
from ecast.core.proto import Direct, Directory
from ecast.runtime.transport import HANDSHAKE_TIMEOUT, Connection, PeerInfo, split_address
from ecast.wire.codec import (
    MAX_FRAME,
    DecodeError,
    Encoder,
    array_header,
    decode_packet,
    frame_item,
)

log = logging.getLogger("ecast.runtime")

TCP_LINK = LinkParams(resend_timeout=float("inf"), ack_delay=0.1)
"""Over TCP nothing is lost inside a connection: resend only after a reconnect."""

CONGESTED = 1 << 30
"""What ``Node.lag`` adds for a peer whose connection is congested."""
QUANTUM = 64 * 1024
"""Packet bytes a loop turn takes in before it feeds its nodes and writes their output."""

DeliverFn = Callable[["Node", list[Any]], None]


def tune_process() -> None:
    """Settings for a process whose main work is running E-Cast nodes (daemons, workers).

    uvloop when it is installed.  And a garbage collector that runs rarely: the protocol
    allocates many short-lived tuples and small objects that do not form cycles, and with
    the default thresholds (a young collection every 700 allocations) the collector ran
    hundreds of times a second, its older collections walking every unstable message and
    Paxos log entry.  At 5,000 messages/s that took p99 latency from 15 ms to 30 ms
    (docs/benchmarks.md).  What exists at start-up (modules, classes) is frozen out of
    every collection.  Applications that embed the SDK decide for themselves.
    """
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1_000)


def new_incarnation() -> int:
    """Larger for every new process of a node id (a restarted process is a new process)."""
    return time.time_ns() // 1000


class ProtocolViolation(Exception):
    """A well-formed packet that breaks the multiplexing rules; the peer is dropped."""


class Runtime:
    """One OS process: its connections to other processes and the nodes it runs."""

    def __init__(
        self,
        secret: bytes,
        *,
        host_id: str | None = None,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
        max_frame: int = MAX_FRAME,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        if not secret:
            raise ValueError("a cluster secret is required")
        self.secret = secret
        self.host_id = host_id or f"host-{os.getpid()}-{os.urandom(4).hex()}"
        self.incarnation = new_incarnation()
        self.listen: str | None = None
        self.handshake_timeout = handshake_timeout
        self.server_ssl = server_ssl
        self.client_ssl = client_ssl
        self.max_frame = max_frame
        self.nodes: dict[NodeId, Node] = {}
        self.directory: dict[NodeId, str] = {}
        self.conns: dict[str, Connection] = {}
        """Open connections by peer host id."""
        self.routes: dict[NodeId, Connection] = {}
        """The connection each remote node is reached through."""
        self.encoder = Encoder()
        self.stats = {
            "packets_in": 0,
            "packets_out": 0,
            "bytes_out": 0,
            "decode_errors": 0,
            "connections_refused": 0,
            "connections_opened": 0,
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._host_incs: dict[str, int] = {}
        self._dialed: dict[str, Connection] = {}
        self._pending: dict[str, asyncio.Task[Connection]] = {}
        self._backoff: dict[str, float] = {}
        self._announced: dict[Connection, asyncio.Future[None]] = {}
        self._dirty: dict[Node, None] = {}
        self._outbox: dict[Connection, list[Any]] = {}
        self._flush_scheduled = False
        self._frames_in: dict[Node, list[tuple[NodeId, Frame]]] = {}
        """Frames received this loop turn, per node, in arrival order."""
        self._feed_scheduled = False
        self._bytes_in = 0
        self._closed = False
        self._congested: set[Connection] = set()
        self._writable: asyncio.Event | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    # ------------------------------------------------------------------ nodes
    def add_node(
        self,
        node_id: NodeId,
        core: Any,
        *,
        listen: str | None = None,
        on_deliver: DeliverFn | None = None,
        advertise: bool = False,
        keep_connected: Callable[[], list[NodeId]] | None = None,
    ) -> Node:
        """Run a new logical node here; ``listen`` makes this process accept connections."""
        if node_id in self.nodes:
            raise ValueError(f"node {node_id} already runs here")
        if listen and self.listen is not None and listen != self.listen:
            raise ValueError(f"this process already listens on {self.listen}")
        node = Node(self, node_id, core, on_deliver, advertise, keep_connected)
        node._listen = listen
        self.nodes[node_id] = node
        self.directory.pop(node_id, None)
        if self.listen:
            self.directory[node_id] = self.listen
        for conn in self.conns.values():
            self._announce(conn, [node])
        return node

    def _remove_node(self, node: Node) -> None:
        if self.nodes.get(node.node_id) is not node:
            return
        del self.nodes[node.node_id]
        self._dirty.pop(node, None)
        for conn in self.conns.values():
            conn.ready = {pair for pair in conn.ready if pair[0] != node.node_id}
            self._queue(conn, ("gone", (node.node_id,)))

    async def serve(self, listen: str) -> None:
        """Accept connections on ``listen`` (HOST:PORT; port 0 picks a free one)."""
        if self._server is not None:
            return
        host, port = split_address(listen)
        self._server = await self.loop.create_server(
            lambda: Connection(self, dialer=False),
            host,
            port,
            ssl=self.server_ssl,
            reuse_address=True,
        )
        if port == 0:  # an ephemeral port: advertise the real one
            port = self._server.sockets[0].getsockname()[1]
        self.listen = f"{host}:{port}"
        for node_id in self.nodes:
            self.directory[node_id] = self.listen

    def learn_addresses(
        self, entries: list[tuple[NodeId, str]] | tuple[tuple[NodeId, str], ...]
    ) -> bool:
        changed = False
        for node, addr in entries:
            if node not in self.nodes and self.directory.get(node) != addr:
                self.directory[node] = addr
                changed = True
        return changed

    async def close(self) -> None:
        for node in list(self.nodes.values()):
            await node.stop()
        self._flush()
        self._closed = True
        for task in self._pending.values():
            task.cancel()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for conn in list(self.conns.values()):
            conn.close("process stopping")

    # ------------------------------------------------------------------ sending
    def schedule(self, node: Node) -> None:
        """``node`` has queued messages: flush them (with everyone else's) this turn."""
        self._dirty[node] = None
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _queue(self, conn: Connection, item: Any) -> None:
        box = self._outbox.get(conn)
        if box is None:
            self._outbox[conn] = [item]
        else:
            box.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def route(self, node: Node, frames: list[tuple[NodeId, Frame]]) -> None:
        """Hand ``node``'s frames to colocated nodes or to the outbox of their host."""
        if not frames:
            return
        src = node.node_id
        nodes = self.nodes
        routes = self.routes
        outbox = self._outbox
        for peer, frame in frames:
            local = nodes.get(peer)
            if local is not None:
                self.loop.call_soon(local._on_frame, src, frame)
                continue
            conn = routes.get(peer)
            if conn is None or (src, peer) not in conn.ready:
                self._want(peer)  # kept by the link layer; resent once the channel is up
                continue
            item = frame_item(src, peer, frame)
            box = outbox.get(conn)
            if box is None:
                outbox[conn] = [item]
            else:
                box.append(item)
        node.stats["frames_out"] += len(frames)
        if outbox and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._dirty:
            dirty, self._dirty = self._dirty, {}
            now = self.loop.time()
            for node in dirty:
                if not node._stopped:
                    self.route(node, node.link.flush(now))
                    node._rearm()
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, {}
        encoder = self.encoder
        pack = encoder.pack
        limit = self.max_frame - 16
        try:
            for conn, items in outbox.items():
                if conn.state != "open":
                    continue  # closed meanwhile; the link layers resend after a reconnect
                parts = encoder.pack_packet(items)
                size = sum(map(len, parts))
                if size <= limit:
                    self._write(conn, parts, size)
                    continue
                # Too big for one packet: pack the messages inline, so that every piece
                # stands on its own (a message table serves only its own packet).
                parts = [pack(item) for item in items]
                chunk: list[bytes] = []
                size = 0
                for part in parts:  # split, keeping order, so no packet tops the limit
                    if chunk and size + len(part) > limit:
                        self._write(conn, chunk, size)
                        chunk, size = [], 0
                    chunk.append(part)
                    size += len(part)
                self._write(conn, chunk, size)
        finally:
            encoder.reset()

    def _write(self, conn: Connection, parts: list[bytes], size: int) -> None:
        head = array_header(len(parts))
        size += len(head)
        conn.send(head, parts, size)
        self.stats["packets_out"] += 1
        self.stats["bytes_out"] += size + 4

    # ------------------------------------------------------------------ receiving
    def frame_received(self, conn: Connection, body: bytes | memoryview) -> None:
        """One packet from an open connection (see ``ecast.runtime.transport.Endpoint``)."""
        self.stats["packets_in"] += 1
        try:
            items = decode_packet(body)
        except DecodeError as e:
            self.stats["decode_errors"] += 1
            log.warning(
                "event=bad_frame host=%s peer=%s reason=%r", self.host_id, _host(conn), str(e)
            )
            conn.close(f"bad frame: {e}")
            return
        # Frames wait for the end of the loop turn and go to their node together, after
        # the control items before them: a router takes what every connection brought in
        # one turn (the sixteen endpoints of a receiver process, both followers' votes,
        # a client's routes) in one step, and its step costs are paid once per turn.
        pending = self._frames_in
        try:
            for item in items:
                if conn.state != "open":
                    return
                if len(item) == 3:
                    src, dst, frame = item
                    if src not in conn.nodes:
                        raise ProtocolViolation(f"frame from unannounced node {src!r:.40}")
                    node = self.nodes.get(dst)
                    if node is not None:
                        box = pending.get(node)
                        if box is None:
                            pending[node] = [(src, frame)]
                            if not self._feed_scheduled:
                                self._feed_scheduled = True
                                self.loop.call_soon(self._feed_frames)
                        else:
                            box.append((src, frame))
                elif len(item) == 2:
                    if pending:
                        self._feed_frames()
                        pending = self._frames_in
                        if conn.state != "open":
                            return
                    self._control(conn, item[0], item[1])
            self._bytes_in += len(body)
            if self._bytes_in >= QUANTUM and self._frames_in:
                # A large input is worked off and its output written before the next:
                # the next process in the pipeline starts on it while we go on.
                self._feed_frames()
                self._flush()
        except ProtocolViolation as e:
            self.stats["decode_errors"] += 1
            log.warning(
                "event=bad_frame host=%s peer=%s reason=%r", self.host_id, _host(conn), str(e)
            )
            self.refuse(conn, str(e))
        except (ValueError, TypeError) as e:  # a control item of the wrong shape
            self.stats["decode_errors"] += 1
            log.warning(
                "event=bad_frame host=%s peer=%s reason=%r", self.host_id, _host(conn), str(e)
            )
            self.refuse(conn, f"malformed control item: {e}")

    def _feed_frames(self) -> None:
        self._feed_scheduled = False
        self._bytes_in = 0
        pending = self._frames_in
        if not pending:
            return
        self._frames_in = {}
        for node, frames in pending.items():
            node._on_frames(frames)

    def _control(self, conn: Connection, kind: Any, data: Any) -> None:
        if kind == "nodes":
            self._on_nodes(conn, data)
        elif kind == "acks":
            self._on_acks(conn, data)
        elif kind == "gone":
            for node in data:
                conn.nodes.pop(node, None)
                if self.routes.get(node) is conn:
                    del self.routes[node]
                conn.ready = {pair for pair in conn.ready if pair[1] != node}
        elif kind == "error":
            log.warning(
                "event=refused_by_peer host=%s peer=%s reason=%r",
                self.host_id,
                _host(conn),
                str(data)[:200],
            )
        else:
            raise ProtocolViolation(f"unknown control item {kind!r:.40}")

    def _on_nodes(self, conn: Connection, data: Any) -> None:
        entries = [(str(n), int(i)) for n, i in data if type(n) is str and type(i) is int]
        if len(entries) != len(data):
            raise ProtocolViolation("nodes: expected (node id, incarnation) pairs")
        for node, inc in entries:
            if node in self.nodes:
                raise ProtocolViolation(f"peer claims node {node}, which runs here")
            known = max((n.link.known_incarnation(node) for n in self.nodes.values()), default=0)
            if known and inc < known:
                self.stats["connections_refused"] += 1
                raise ProtocolViolation(f"stale incarnation {inc} of {node} (current {known})")
        listen = conn.peer.listen if conn.peer is not None else None
        acks = []
        for node, inc in entries:
            old = self.routes.get(node)
            if old is not None and old is not conn:  # it moved (or restarted) elsewhere
                old.nodes.pop(node, None)
                old.ready = {pair for pair in old.ready if pair[1] != node}
            conn.nodes[node] = inc
            conn.ready = {pair for pair in conn.ready if pair[1] != node}
            self.routes[node] = conn
            for local in self.nodes.values():
                acks.append((local.node_id, node, local.link.received_from(node, inc)))
        if acks:
            self._queue(conn, ("acks", tuple(acks)))
        if listen and self.learn_addresses([(n, listen) for n, _ in entries]):
            self._gossip()
        conn.announced = True
        fut = self._announced.pop(conn, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _on_acks(self, conn: Connection, data: Any) -> None:
        now = self.loop.time()
        for remote, local, count in data:
            if type(count) is not int or count < 0:
                raise ProtocolViolation(f"acks: bad count {count!r:.20}")
            inc = conn.nodes.get(remote)
            node = self.nodes.get(local)
            if inc is None or node is None or node._stopped:
                continue  # gone meanwhile
            conn.ready.add((local, remote))
            self.route(node, node.link.on_connected(remote, inc, count, now))
            if node.advertise:
                node.link.send(remote, Directory(tuple(sorted(self.directory.items()))))
                self.schedule(node)
            node._rearm()

    # Connection callbacks (see ecast.runtime.transport.Endpoint).
    def check_peer(self, peer: PeerInfo) -> str | None:
        if peer.host == self.host_id:
            return f"peer claims this process's own host id {peer.host}"
        known = self._host_incs.get(peer.host, 0)
        if peer.incarnation < known:
            self.stats["connections_refused"] += 1
            return f"stale incarnation {peer.incarnation} of {peer.host} (current {known})"
        self._host_incs[peer.host] = peer.incarnation
        return None

    def connection_open(self, conn: Connection) -> None:
        peer = conn.peer
        assert peer is not None
        old = self.conns.get(peer.host)
        if old is not None and old is not conn and old.state == "open":
            # Both sides dialed: keep the connection dialed by the smaller id, everywhere.
            def dialer(c: Connection) -> str:
                return self.host_id if c.dialer else peer.host

            same_process = old.peer is not None and old.peer.incarnation == peer.incarnation
            if same_process and dialer(old) <= dialer(conn):
                conn.close("duplicate connection")
                return
            old.close("replaced by a newer connection")
            self._forget_conn(old)
        self.conns[peer.host] = conn
        self.stats["connections_opened"] += 1
        log.info(
            "event=connected host=%s peer=%s incarnation=%d dialer=%s",
            self.host_id,
            peer.host,
            peer.incarnation,
            conn.dialer,
        )
        self._announce(conn, list(self.nodes.values()))

    def _announce(self, conn: Connection, nodes: list[Node]) -> None:
        if not nodes:
            return
        self._queue(conn, ("nodes", tuple((n.node_id, n.incarnation) for n in nodes)))
        acks = [
            (n.node_id, remote, n.link.received_from(remote, inc))
            for n in nodes
            for remote, inc in conn.nodes.items()
        ]
        if acks:
            self._queue(conn, ("acks", tuple(acks)))

    def connection_closed(self, conn: Connection, reason: str) -> None:
        self._forget_conn(conn)
        fut = self._announced.pop(conn, None)
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionError(reason))
        log.info("event=disconnected host=%s peer=%s reason=%r", self.host_id, _host(conn), reason)

    def _forget_conn(self, conn: Connection) -> None:
        if conn.peer is not None and self.conns.get(conn.peer.host) is conn:
            del self.conns[conn.peer.host]
        for node in conn.nodes:
            if self.routes.get(node) is conn:
                del self.routes[node]
        conn.ready = set()
        for address, c in list(self._dialed.items()):
            if c is conn:
                del self._dialed[address]

    def refuse(self, conn: Connection, reason: str) -> None:
        """Tell the peer why (best effort), log, and close the connection."""
        log.warning("event=refused host=%s peer=%s reason=%r", self.host_id, _host(conn), reason)
        with contextlib.suppress(Exception):
            error = self.encoder.pack(("error", reason))
            conn.send(array_header(1), [error], 1 + len(error))
        conn.close(reason)

    def congested(self, peer: NodeId) -> bool:
        """True while the connection that reaches ``peer`` holds more unsent bytes than its
        high-water mark (the peer's process does not read as fast as we write)."""
        conn = self.routes.get(peer)
        return conn is not None and conn in self._congested

    def writing_paused(self, conn: Connection, paused: bool) -> None:
        if paused:
            self._congested.add(conn)
            if self._writable is not None:
                self._writable.clear()
        else:
            self._congested.discard(conn)
            if not self._congested and self._writable is not None:
                self._writable.set()

    async def writable(self) -> None:
        """Wait while some connection's send buffer is above its high-water mark.

        Messages that bypass E-Cast's congestion window (unsafe messages) wait here, so a
        fast sender cannot grow its buffers without bound.
        """
        if not self._congested:
            return
        if self._writable is None:
            self._writable = asyncio.Event()
        self._writable.clear()
        await self._writable.wait()

    def pause_reading(self, paused: bool) -> None:
        """Stop (or resume) reading from every connection: backpressure from the owner."""
        for conn in self.conns.values():
            if conn.state == "open":
                conn.set_reading(paused)

    # ------------------------------------------------------------------ dialing
    def _gossip(self) -> None:
        entries = Directory(tuple(sorted(self.directory.items())))
        for conn in self.conns.values():
            for local, remote in conn.ready:
                node = self.nodes.get(local)
                if node is not None and node.advertise:
                    node.link.send(remote, entries)
                    self.schedule(node)

    def _want(self, peer: NodeId) -> None:
        """Some node has frames for ``peer``: dial its host if we know where it listens."""
        if self._closed:
            return
        address = self.directory.get(peer)
        if address is None or address == self.listen or address in self._pending:
            return
        conn = self._dialed.get(address)
        if conn is not None and conn.state == "open":
            return  # connected; the peer has not announced ``peer`` (yet)
        self._track(address, self.loop.create_task(self._dial(address)))

    async def _dial(self, address: str) -> Connection:
        delay = self._backoff.get(address, 0.0)
        if delay:
            await asyncio.sleep(delay)
        self._backoff[address] = min(max(delay * 2, 0.05), 1.0)
        try:
            conn = await self._open(address, 5.0)
        except (TimeoutError, OSError, ConnectionError) as e:
            log.debug("event=dial_failed host=%s address=%s reason=%r", self.host_id, address, e)
            raise
        self._backoff.pop(address, None)
        return conn

    async def connect(self, address: str, timeout: float = 5.0) -> Connection:
        """A connection to the process at ``address`` whose node list has arrived."""
        conn = self._dialed.get(address)
        if conn is not None and conn.state == "open" and conn.announced:
            return conn
        task = self._pending.get(address)
        if task is None:
            task = self._track(address, self.loop.create_task(self._open(address, timeout)))
        return await asyncio.shield(task)

    def _track(self, address: str, task: asyncio.Task[Connection]) -> asyncio.Task[Connection]:
        """One dial per address at a time; its failure is logged by the dialer, not asyncio."""
        self._pending[address] = task

        def done(t: asyncio.Task[Connection]) -> None:
            if self._pending.get(address) is t:
                del self._pending[address]
            if not t.cancelled():
                t.exception()  # retrieved: a failed dial is routine, retried with backoff

        task.add_done_callback(done)
        return task

    async def _open(self, address: str, timeout: float) -> Connection:
        host, port = split_address(address)
        failed: asyncio.Future[None] = self.loop.create_future()

        def on_fail(_conn: Connection, reason: str) -> None:
            if not failed.done():
                failed.set_exception(ConnectionError(reason))

        server_hostname = host if self.client_ssl is not None else None
        _t, conn = await asyncio.wait_for(
            self.loop.create_connection(
                lambda: Connection(self, dialer=True, on_fail=on_fail),
                host,
                port,
                ssl=self.client_ssl,
                server_hostname=server_hostname,
            ),
            timeout,
        )
        announced = self._announced.setdefault(conn, self.loop.create_future())
        if conn.announced and not announced.done():
            announced.set_result(None)
        done, _ = await asyncio.wait(
            (failed, announced), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        self._announced.pop(conn, None)
        for f in (failed, announced):
            if not f.done():
                f.cancel()
            else:
                f.exception()  # retrieved: a duplicate's failure is routine
        if not done:
            conn.close("no node list in time")
            raise TimeoutError(f"{address}: no node list within {timeout:g}s")
        if failed in done or conn.state != "open":
            exc = failed.exception() if failed in done else None
            # Both sides dialed at once and the other connection won: use that one.
            other = self.conns.get(conn.peer.host) if conn.peer is not None else None
            if other is not None and other.state == "open":
                if not other.announced:
                    await asyncio.sleep(0.05)
                self._dialed[address] = other
                return other
            raise exc or ConnectionError(conn.closed_reason or "connection closed")
        self._dialed[address] = conn
        return conn


def _host(conn: Connection) -> str:
    return conn.peer.host if conn.peer is not None else "?"


class Node:
    """One logical process: a core, its link layer, its timer."""

    def __init__(
        self,
        runtime: Runtime,
        node_id: NodeId,
        core: Any,
        on_deliver: DeliverFn | None,
        advertise: bool,
        keep_connected: Callable[[], list[NodeId]] | None,
    ) -> None:
        self.runtime = runtime
        self.node_id = node_id
        self.core = core
        self.incarnation = new_incarnation()
        self.link = LinkLayer(node_id, self.incarnation, TCP_LINK)
        self.on_deliver = on_deliver
        self.advertise = advertise
        self.keep_connected = keep_connected
        self.on_direct: Callable[[NodeId, Any], None] | None = None
        """Receives ``Direct`` payloads from other application processes."""
        self._listen: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._core_wake: float | None = None
        self._stopped = False
        self.stats = {"frames_in": 0, "frames_out": 0, "core_errors": 0}

    # ------------------------------------------------------------------ lifecycle
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.runtime.loop

    @property
    def listen(self) -> str | None:
        return self.runtime.listen

    async def start(self) -> None:
        if self._listen:
            await self.runtime.serve(self._listen)
        self._arm_timer(self.loop.time())
        self.feed(lambda core, now: core.on_tick(now))

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        self.runtime._remove_node(self)

    # ------------------------------------------------------------------ driving the core
    def now(self) -> float:
        return self.loop.time()

    def feed(self, call: Callable[[Any, float], Effects]) -> Effects | None:
        """Run ``call(core, now)`` and carry out its effects."""
        if self._stopped or self.core is None:
            return None
        fx = call(self.core, self.loop.time())
        self._apply(fx)
        return fx

    def _apply(self, fx: Effects) -> None:
        link = self.link
        for dst, msg in fx.send:
            link.send(dst, msg)
        for peer in fx.forget:
            link.forget(peer)
        for peer in fx.drop:
            link.drop(peer)
        self._core_wake = fx.wake_at
        if fx.deliver and self.on_deliver is not None:
            self.on_deliver(self, fx.deliver)
        if fx.send:
            self.runtime.schedule(self)
        self._rearm()

    def _rearm(self) -> None:
        wake = self._core_wake
        deadline = self.link.next_deadline()
        if deadline is not None and (wake is None or deadline < wake):
            wake = deadline
        if wake is not None:
            self._arm_timer(wake)

    def _arm_timer(self, at: float) -> None:
        if at >= self._timer_at or self._stopped:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        if self._stopped:
            return
        now = self.loop.time()
        self.feed(lambda core, t: core.on_tick(t))
        self.runtime.route(self, self.link.on_tick(now))
        if self.keep_connected is not None:
            routes = self.runtime.routes
            for peer in self.keep_connected():
                if peer not in routes and peer != self.node_id:
                    self.runtime._want(peer)
        self._rearm()
        if self._timer is None:
            self._arm_timer(now + 0.25)  # a heartbeat for connection upkeep

    # ------------------------------------------------------------------ receiving
    def _on_frame(self, src: NodeId, frame: Frame) -> None:
        self._on_frames(((src, frame),))

    def _on_frames(
        self, frames: list[tuple[NodeId, Frame]] | tuple[tuple[NodeId, Frame], ...]
    ) -> None:
        if self._stopped:
            return
        self.stats["frames_in"] += len(frames)
        now = self.loop.time()
        link = self.link
        batch: list[tuple[NodeId, list[Any]]] = []
        for src, frame in frames:
            msgs = link.on_frame(src, frame, now)
            if msgs:
                msgs = self._side_channel(src, msgs)
                if msgs:
                    batch.append((src, msgs))
        if not batch:
            self._rearm()
            return
        self._feed_batch(batch)

    def _side_channel(self, src: NodeId, msgs: list[Any]) -> list[Any]:
        """Handle what the runtime itself consumes (directories, direct payloads)."""
        if not any(type(m) is Directory or type(m) is Direct for m in msgs):
            return msgs
        for m in msgs:
            if type(m) is Directory:
                if self.runtime.learn_addresses(m.entries):
                    self.runtime._gossip()
            elif type(m) is Direct and self.on_direct is not None:
                self.on_direct(src, m.payload)
        return [m for m in msgs if type(m) is not Directory and type(m) is not Direct]

    def _feed_batch(self, batch: list[tuple[NodeId, list[Any]]]) -> None:
        on_batch = getattr(self.core, "on_batch", None)
        if on_batch is None or len(batch) == 1:
            for src, msgs in batch:
                try:
                    self.feed(lambda core, now, s=src, m=msgs: core.on_messages(s, m, now))
                except Exception:
                    self._core_error((src,))
            return
        try:
            self.feed(lambda core, now: core.on_batch(batch, now))
        except UnexpectedMessage as e:
            # The core refused the batch before changing anything: drop the offender only.
            self._core_error((e.peer,))
            rest = [(s, m) for s, m in batch if s != e.peer]
            if rest:
                self._feed_batch(rest)
        except Exception:
            self._core_error(tuple(dict.fromkeys(s for s, _ in batch)))

    def _core_error(self, peers: tuple[NodeId, ...]) -> None:
        self.stats["core_errors"] += 1
        log.error(
            "event=core_error node=%s peer=%s detail=%r",
            self.node_id,
            ",".join(peers),
            traceback.format_exc(limit=5),
        )
        for peer in peers:
            conn = self.runtime.routes.get(peer)
            if conn is not None:
                conn.close("input the protocol could not handle")

    # ------------------------------------------------------------------ conveniences
    def lag(self, peer: NodeId) -> int:
        """How far ``peer`` lags: link messages it has not acknowledged, or "very far" while
        the connection to its process is congested.  A link message may carry thousands of
        copies, so the count alone let a flood of unsafe messages fill the send buffers of
        a slow receiver process (the leader grew to 300 MB); cores that shed best-effort
        traffic (``Router.link_lag``) read this."""
        n = self.link.unacked_messages(peer)
        return n + CONGESTED if self.runtime.congested(peer) else n

    def send_direct(self, peer: NodeId, payload: Any) -> None:
        """Send ``payload`` to another application process over an authenticated link."""
        self.link.send(peer, Direct(payload))
        self.runtime.schedule(self)

    def pause_reading(self, paused: bool) -> None:
        """Backpressure from the owner: this process stops (or resumes) reading."""
        self.runtime.pause_reading(paused)

    async def connect(self, address: str, timeout: float = 5.0) -> NodeId:
        """Reach the process at ``address``; return the (first) node that runs there."""
        conn = await self.runtime.connect(address, timeout)
        if not conn.nodes:
            raise ConnectionError(f"no node runs at {address}")
        return sorted(conn.nodes)[0]


def read_secret(path: str | None = None, env: str = "ECAST_SECRET") -> bytes:
    """The cluster secret from a file or an environment variable."""
    if path:
        with open(path, "rb") as f:
            secret = f.read().strip()
    else:
        secret = os.environ.get(env, "").encode()
    if not secret:
        raise SystemExit(f"no cluster secret: pass --secret-file or set {env}")
    return secret
