"""The asyncio runtime that drives sans-IO cores over real connections.

One :class:`Runtime` per OS process holds the cluster secret, TLS settings and an address
directory, and hosts one or more :class:`Node` s.  A node is one logical process: a core
(router, endpoint, ...), its :class:`~ecast.link.LinkLayer` and its connections.

Batching: everything a node's core emits during one turn of the event loop leaves in one
frame per peer, flushed by a single ``call_soon`` callback, each frame encoded once (with
objects shared between frames encoded once per flush).  There is no task per message:
frames are handled in the protocol callback that read them.

Colocated nodes (many receivers in one benchmark process, a test hosting several
endpoints) exchange frames in memory, without encoding.

Timers: a core reports its earliest deadline in ``Effects.wake_at``; the node keeps one
``call_at`` handle for the earlier of that and the link layer's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
import traceback
from collections.abc import Callable
from typing import Any

from ecast.codec import MAX_FRAME, DecodeError, Encoder, decode_frame
from ecast.effects import Effects, NodeId
from ecast.link import Frame, LinkLayer, LinkParams
from ecast.proto import Direct, Directory
from ecast.transport import HANDSHAKE_TIMEOUT, Connection, PeerInfo, split_address

log = logging.getLogger("ecast.runtime")

TCP_LINK = LinkParams(resend_timeout=float("inf"), ack_delay=0.1)
"""Over TCP nothing is lost inside a connection: resend only after a reconnect."""

DeliverFn = Callable[["Node", list[Any]], None]


def new_incarnation() -> int:
    """Larger for every new process of a node id (a restarted process is a new process)."""
    return time.time_ns() // 1000


class Runtime:
    def __init__(
        self,
        secret: bytes,
        *,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
        max_frame: int = MAX_FRAME,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        if not secret:
            raise ValueError("a cluster secret is required")
        self.secret = secret
        self.handshake_timeout = handshake_timeout
        self.server_ssl = server_ssl
        self.client_ssl = client_ssl
        self.max_frame = max_frame
        self.nodes: dict[NodeId, Node] = {}
        self.directory: dict[NodeId, str] = {}
        self.encoder = Encoder()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

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
        if node_id in self.nodes:
            raise ValueError(f"node {node_id} already runs here")
        node = Node(self, node_id, core, listen, on_deliver, advertise, keep_connected)
        self.nodes[node_id] = node
        if listen:
            self.directory[node_id] = listen
        return node

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


class Node:
    """One logical process: a core, its link layer, its connections."""

    def __init__(
        self,
        runtime: Runtime,
        node_id: NodeId,
        core: Any,
        listen: str | None,
        on_deliver: DeliverFn | None,
        advertise: bool,
        keep_connected: Callable[[], list[NodeId]] | None,
    ) -> None:
        self.runtime = runtime
        self.node_id = node_id
        self.core = core
        self.listen = listen
        self.secret = runtime.secret
        self.max_frame = runtime.max_frame
        self.handshake_timeout = runtime.handshake_timeout
        self.incarnation = new_incarnation()
        self.link = LinkLayer(node_id, self.incarnation, TCP_LINK)
        self.on_deliver = on_deliver
        self.advertise = advertise
        self.keep_connected = keep_connected
        self.on_direct: Callable[[NodeId, Any], None] | None = None
        """Receives ``Direct`` payloads from other application processes."""
        self.conns: dict[NodeId, Connection] = {}
        self._dialing: dict[NodeId, asyncio.Task[None]] = {}
        self._backoff: dict[NodeId, float] = {}
        self._server: asyncio.AbstractServer | None = None
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._core_wake: float | None = None
        self._stopped = False
        self.stats = {
            "frames_in": 0,
            "frames_out": 0,
            "bytes_out": 0,
            "decode_errors": 0,
            "core_errors": 0,
            "connections_refused": 0,
            "connections_opened": 0,
        }

    # ------------------------------------------------------------------ lifecycle
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.runtime.loop

    async def start(self) -> None:
        if self.listen:
            host, port = split_address(self.listen)
            self._server = await self.loop.create_server(
                lambda: Connection(self, dialer=False),
                host,
                port,
                ssl=self.runtime.server_ssl,
                reuse_address=True,
            )
            if port == 0:  # an ephemeral port: advertise the real one
                real = self._server.sockets[0].getsockname()[1]
                self.listen = f"{host}:{real}"
                self.runtime.directory[self.node_id] = self.listen
        self._arm_timer(self.loop.time())
        self.feed(lambda core, now: core.on_tick(now))

    async def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        for task in self._dialing.values():
            task.cancel()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for conn in list(self.conns.values()):
            conn.close("node stopping")
        self.runtime.nodes.pop(self.node_id, None)

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
        self._core_wake = fx.wake_at
        if fx.deliver and self.on_deliver is not None:
            self.on_deliver(self, fx.deliver)
        if fx.send and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)
        self._rearm()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._stopped:
            return
        self._send_frames(self.link.flush(self.loop.time()))

    def _send_frames(self, frames: list[tuple[NodeId, Frame]]) -> None:
        if not frames:
            return
        runtime = self.runtime
        encoder = runtime.encoder
        try:
            for peer, frame in frames:
                local = runtime.nodes.get(peer)
                if local is not None:
                    self.loop.call_soon(local._on_frame, self.node_id, frame)
                    continue
                conn = self.conns.get(peer)
                if conn is None or conn.state != "open":
                    self._want(peer)  # kept by the link layer; resent once connected
                    continue
                body = encoder.pack(frame)
                conn.send(body)
                self.stats["frames_out"] += 1
                self.stats["bytes_out"] += len(body) + 4
        finally:
            encoder.reset()
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
        self._send_frames(self.link.on_tick(now))
        self._maintain(now)
        self._rearm()
        if self._timer is None:
            self._arm_timer(now + 0.25)  # a heartbeat for connection upkeep

    # ------------------------------------------------------------------ receiving
    def _on_frame(self, src: NodeId, frame: Frame) -> None:
        if self._stopped:
            return
        self.stats["frames_in"] += 1
        msgs = self.link.on_frame(src, frame, self.loop.time())
        if not msgs:
            self._rearm()
            return
        if any(type(m) is Directory or type(m) is Direct for m in msgs):
            for m in msgs:
                if type(m) is Directory:
                    if self.runtime.learn_addresses(m.entries):
                        self._gossip()
                elif type(m) is Direct and self.on_direct is not None:
                    self.on_direct(src, m.payload)
            msgs = [m for m in msgs if type(m) is not Directory and type(m) is not Direct]
            if not msgs:
                return
        try:
            self.feed(lambda core, now: core.on_messages(src, msgs, now))
        except Exception:
            self.stats["core_errors"] += 1
            log.error(
                "event=core_error node=%s peer=%s detail=%r",
                self.node_id,
                src,
                traceback.format_exc(limit=5),
            )
            conn = self.conns.get(src)
            if conn is not None:
                conn.close("input the protocol could not handle")

    # Connection callbacks (see ecast.transport.Endpoint).
    def check_peer(self, peer: PeerInfo) -> str | None:
        if peer.node == self.node_id:
            return f"peer claims this node's own id {peer.node}"
        known = self.link.known_incarnation(peer.node)
        if known and peer.incarnation < known:
            self.stats["connections_refused"] += 1
            return f"stale incarnation {peer.incarnation} of {peer.node} (current {known})"
        return None

    def received_from(self, peer: PeerInfo) -> int:
        return self.link.received_from(peer.node, peer.incarnation)

    def connection_open(self, conn: Connection, peer_ack: int) -> None:
        peer = conn.peer
        assert peer is not None
        old = self.conns.get(peer.node)
        if old is not None and old is not conn and old.state == "open":
            # Both sides dialed: keep the connection dialed by the smaller id, everywhere.
            def dialer(c: Connection) -> NodeId:
                return self.node_id if c.dialer else peer.node

            if dialer(old) <= dialer(conn):
                conn.close("duplicate connection")
                return
            old.close("replaced by a duplicate connection")
        self.conns[peer.node] = conn
        self.stats["connections_opened"] += 1
        self._backoff.pop(peer.node, None)
        if peer.listen and self.runtime.learn_addresses([(peer.node, peer.listen)]):
            self._gossip()
        log.info(
            "event=connected node=%s peer=%s incarnation=%d dialer=%s",
            self.node_id,
            peer.node,
            peer.incarnation,
            conn.dialer,
        )
        if self.advertise:
            self.link.send(peer.node, Directory(tuple(sorted(self.runtime.directory.items()))))
            self._flush_soon()
        self._send_frames(self.link.on_connected(peer.node, peer.incarnation, peer_ack, self.now()))

    def frame_received(self, conn: Connection, body: bytes) -> None:
        peer = conn.peer
        assert peer is not None
        try:
            frame = decode_frame(body)
        except DecodeError as e:
            self.stats["decode_errors"] += 1
            log.warning(
                "event=bad_frame node=%s peer=%s reason=%r", self.node_id, peer.node, str(e)
            )
            conn.close(f"bad frame: {e}")
            return
        self._on_frame(peer.node, frame)

    def connection_closed(self, conn: Connection, reason: str) -> None:
        peer = conn.peer
        if peer is not None and self.conns.get(peer.node) is conn:
            del self.conns[peer.node]
            log.info(
                "event=disconnected node=%s peer=%s reason=%r", self.node_id, peer.node, reason
            )

    def send_direct(self, peer: NodeId, payload: Any) -> None:
        """Send ``payload`` to another application process over an authenticated link."""
        self.link.send(peer, Direct(payload))
        self._flush_soon()

    def pause_reading(self, paused: bool) -> None:
        """Stop (or resume) reading from every connection: backpressure from the owner."""
        for conn in self.conns.values():
            t = conn.transport
            if t is not None and conn.state == "open":
                if paused:
                    t.pause_reading()
                else:
                    t.resume_reading()

    # ------------------------------------------------------------------ dialing
    def _flush_soon(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _gossip(self) -> None:
        if not self.advertise:
            return
        entries = Directory(tuple(sorted(self.runtime.directory.items())))
        for peer, conn in self.conns.items():
            if conn.state == "open":
                self.link.send(peer, entries)
        self._flush_soon()

    def _want(self, peer: NodeId) -> None:
        """We have something for ``peer``: dial it if we know where it listens."""
        if peer in self._dialing or self._stopped:
            return
        address = self.runtime.directory.get(peer)
        if address is None:
            return
        self._dialing[peer] = self.loop.create_task(self._dial(peer, address))

    def _maintain(self, now: float) -> None:
        if self.keep_connected is not None:
            for peer in self.keep_connected():
                if peer not in self.conns and peer != self.node_id:
                    self._want(peer)

    async def _dial(self, peer: NodeId, address: str) -> None:
        try:
            delay = self._backoff.get(peer, 0.0)
            if delay:
                await asyncio.sleep(delay)
            self._backoff[peer] = min(max(delay * 2, 0.05), 1.0)
            await self.connect(address, expect=peer)
        except (TimeoutError, OSError, ConnectionError) as e:
            log.debug("event=dial_failed node=%s peer=%s reason=%r", self.node_id, peer, str(e))
        finally:
            self._dialing.pop(peer, None)

    async def connect(
        self, address: str, expect: NodeId | None = None, timeout: float = 5.0
    ) -> NodeId:
        """Dial ``address`` and wait for the handshake; return the peer's node id."""
        host, port = split_address(address)
        done: asyncio.Future[NodeId] = self.loop.create_future()

        def failed(conn: Connection, reason: str) -> None:
            if not done.done():
                done.set_exception(ConnectionError(reason))

        def factory() -> Connection:
            conn = Connection(self, dialer=True, expect=expect, on_fail=failed)
            original = self.connection_open

            def opened(c: Connection, ack: int) -> None:
                original(c, ack)
                if not done.done() and c.peer is not None:
                    done.set_result(c.peer.node)

            conn.local = _OpenHook(self, opened)  # type: ignore[assignment]
            return conn

        server_hostname = host if self.runtime.client_ssl is not None else None
        await asyncio.wait_for(
            self.loop.create_connection(
                factory, host, port, ssl=self.runtime.client_ssl, server_hostname=server_hostname
            ),
            timeout,
        )
        return await asyncio.wait_for(done, timeout)


class _OpenHook:
    """Forwards a connection's callbacks to its node, with one hook on ``connection_open``."""

    def __init__(self, node: Node, opened: Callable[[Connection, int], None]) -> None:
        self._node = node
        self._opened = opened

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    def connection_open(self, conn: Connection, peer_ack: int) -> None:
        self._opened(conn, peer_ack)


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
