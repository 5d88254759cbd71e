"""The runtime of one OS process: its nodes, its connections, and the packets between them.

One :class:`Runtime` per OS process (a *host*) holds its credential (or the development
secret), TLS settings, an address directory and one authenticated connection per peer
host, and runs one or more
:class:`~ecast.runtime.node.Node` s.  A node is one logical process: a core (router,
endpoint, ...) and its link layer, whose channels are per node pair.

Why connections per host rather than per node: Python pays per system call and per
callback.  A leader forwarding to sixteen receivers that live in one benchmark process
would otherwise write sixteen small frames per turn and read sixteen acknowledgements;
multiplexed, it writes one packet and reads one.  The packet format is in
:mod:`ecast.wire.packet`.

What a connection proved limits what it may do: it may announce only the nodes its
credential covers (a name announced under a router credential moves only to another
router credential), and the cores learn each peer's role through :meth:`Runtime.role_of`.
Address directories are taken only from routers, bounded, and never override the address
a node's own process announced in its handshake.

A channel ``(local, remote)`` carries frames only after the peer's ``acks`` item for it
arrived, so after a reconnect exactly the frames the peer misses are resent (the link
layer keeps them until then).

Batching: everything the nodes of a process emit during one turn of the event loop leaves
in one packet per peer host, flushed by a single ``call_soon`` callback, each object
encoded once per flush.  There is no task per message: packets are decoded in the
protocol callback that read them, and the frames of one turn go to each node in one step
at the end of the turn (or as soon as ``QUANTUM`` bytes came in, whose output is written
at once).  Colocated nodes exchange frames in memory, without encoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Callable
from typing import Any

from ecast.core.effects import Core, NodeId
from ecast.core.link import Frame
from ecast.core.proto import Directory
from ecast.core.roles import ROUTER, acts_as_router
from ecast.runtime.dial import Dialer
from ecast.runtime.handshake import MAX_HOST, Auth, Identity, SecretAuth
from ecast.runtime.node import CONGESTED, TCP_LINK, DeliverFn, Node
from ecast.runtime.process import new_incarnation, read_secret, tune_process
from ecast.runtime.transport import HANDSHAKE_TIMEOUT, Connection, PeerInfo, split_address
from ecast.security.secret import secret_problem
from ecast.wire.codec import MAX_FRAME, DecodeError, Encoder
from ecast.wire.packet import (
    MAX_ASSEMBLED,
    Acks,
    FrameItem,
    Gone,
    Nodes,
    Part,
    PeerError,
    array_header,
    control_item,
    decode_packet,
    encode_items,
    frame_item,
    join_part,
    split_item,
)

__all__ = [
    "CONGESTED",
    "QUANTUM",
    "TCP_LINK",
    "Node",
    "Runtime",
    "read_secret",
    "tune_process",
]

log = logging.getLogger("ecast.runtime")

QUANTUM = 64 * 1024
"""Packet bytes a loop turn takes in before it feeds its nodes and writes their output."""
MAX_CONNECTIONS = 4096
"""Open and opening connections a process keeps at most; more are closed at once."""
MAX_HANDSHAKES = 128
"""Connections at most that have not proven themselves yet (each may hold a handshake
frame for up to the handshake timeout)."""
MAX_HANDSHAKES_PER_SOURCE = 16
"""Connections from one address at most that have not proven themselves yet: one
address cannot hold the handshake slots that everyone else needs."""
MAX_DIRECTORY = 65_536
"""Addresses a process keeps at most (the oldest learned by gossip go first)."""
MAX_GOSSIP = 8192
"""Entries one directory message may carry; a larger one is ignored."""
MAX_NODES_PER_CONNECTION = 1024
"""Nodes one connection may announce at most (a benchmark process runs tens; more is a
flood, and the connection is refused)."""
MAX_NODES_PER_CREDENTIAL = 4096
"""Nodes announced at most under one credential, over all its connections (a wildcard
client credential shared by many processes runs one node per connection; a holder that
announces thousands of names only fills the directory that everyone is gossiped)."""
MAX_INCARNATIONS = 65_536
"""Peer processes whose latest incarnation a process remembers (the oldest are forgotten)."""


class ProtocolViolation(Exception):
    """A well-formed packet that breaks the multiplexing rules; the peer is dropped."""


class Runtime:
    """One OS process: its connections to other processes and the nodes it runs."""

    def __init__(
        self,
        auth: Auth | bytes,
        *,
        host_id: str | None = None,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
        max_frame: int = MAX_FRAME,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        max_handshakes: int = MAX_HANDSHAKES,
        source_address: str | None = None,
        max_nodes_per_credential: int = MAX_NODES_PER_CREDENTIAL,
        max_handshakes_per_source: int = MAX_HANDSHAKES_PER_SOURCE,
    ) -> None:
        """``source_address``: the local address outgoing connections leave from (a
        multi-homed host, or a test that cuts one process's links); None: the kernel's
        choice."""
        if isinstance(auth, bytes | bytearray):
            problem = secret_problem(bytes(auth))
            if problem:
                raise ValueError(problem)
            auth = SecretAuth(bytes(auth))
        self.auth: Auth = auth
        self.identity = auth.identity
        self.host_id = host_id or f"host-{os.getpid()}-{os.urandom(4).hex()}"
        if not self.host_id.isprintable() or not 0 < len(self.host_id) <= MAX_HOST:
            raise ValueError(f"host id {self.host_id!r:.60}: 1 to {MAX_HOST} printable characters")
        self.incarnation = new_incarnation()
        self.listen: str | None = None
        self.handshake_timeout = handshake_timeout
        self.server_ssl = server_ssl
        self.client_ssl = client_ssl
        self.max_frame = max_frame
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self.max_nodes_per_credential = max_nodes_per_credential
        self.max_handshakes_per_source = max_handshakes_per_source
        self.source_address = source_address
        self.nodes: dict[NodeId, Node] = {}
        self.directory: dict[NodeId, str] = {}
        self.conns: dict[str, Connection] = {}
        """Open connections by their peer's key (``PeerInfo.key``: host id and credential)."""
        self.routes: dict[NodeId, Connection] = {}
        """The connection each remote node is reached through."""
        self.identities: dict[NodeId, Identity] = {}
        """The credential each remote node was last announced under; kept while its
        frames may still be on their way to a core, dropped when it is gone."""
        self._announced_at: dict[NodeId, str] = {}
        """Where nodes listen, as their own process said in its handshake (gossip never
        overrides it)."""
        self._gossiped: dict[NodeId, str] = {}
        """What the routers last said about nodes in ``_announced_at`` (one entry at most
        per such node): where to look once that announcement is void (its connection
        closed, or the node stopped), since the routers may have told of a newer
        incarnation meanwhile and say nothing again until their directory changes."""
        self._handshaking: dict[Connection, None] = {}
        """Accepted connections in their handshake, oldest first."""
        self._handshakes_from: dict[str, int] = {}
        """How many of them each source address holds."""
        self.encoder = Encoder()
        self.dialer = Dialer(self)
        self.stats = {
            "packets_in": 0,
            "packets_out": 0,
            "bytes_out": 0,
            "decode_errors": 0,
            "connections_refused": 0,
            "connections_opened": 0,
            "directories_ignored": 0,
            "names_refused": 0,
            "handshakes_evicted": 0,
            "packets_oversize": 0,
            "items_split": 0,
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._host_incs: dict[str, int] = {}
        self._dirty: dict[Node, None] = {}
        self._outbox: dict[Connection, list[Any]] = {}
        self._flush_scheduled = False
        self._frames_in: dict[Node, list[tuple[NodeId, Frame, int]]] = {}
        """Frames received this loop turn, per node, in arrival order, each with its
        share of its packet's bytes."""
        self._feed_scheduled = False
        self._bytes_in = 0
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
        core: Core,
        *,
        on_deliver: DeliverFn | None = None,
        on_directs: Callable[[NodeId, list[Any]], None] | None = None,
        advertise: bool = False,
        keep_connected: Callable[[], list[NodeId]] | None = None,
    ) -> Node:
        """Run a new logical node here, announced to every connected process; call
        ``node.start()`` to give its core its first tick."""
        if node_id in self.nodes:
            raise ValueError(f"node {node_id} already runs here")
        if not self.identity.covers(node_id):
            raise ValueError(
                f"node {node_id!r}: this process's credential covers only "
                f"{', '.join(self.identity.names)}"
            )
        node = Node(
            self,
            node_id,
            core,
            on_deliver=on_deliver,
            on_directs=on_directs,
            advertise=advertise,
            keep_connected=keep_connected,
        )
        self.nodes[node_id] = node
        self.directory.pop(node_id, None)
        if self.listen:
            self.directory[node_id] = self.listen
        for conn in self.conns.values():
            self._announce(conn, [node])
        return node

    def remove_node(self, node: Node) -> None:
        if self.nodes.get(node.node_id) is not node:
            return
        del self.nodes[node.node_id]
        self._dirty.pop(node, None)
        for conn in self.conns.values():
            conn.ready = {pair for pair in conn.ready if pair[0] != node.node_id}
            self._queue(conn, control_item(Gone((node.node_id,))))

    async def serve(self, listen: str) -> str:
        """Accept connections on ``listen`` (HOST:PORT; port 0 picks a free one); return
        the address peers reach this process at.  Serve before dialing anyone, so the
        handshake carries the address and routers gossip it."""
        if self._server is not None:
            if listen != self.listen and not listen.endswith(":0"):
                raise ValueError(f"this process already listens on {self.listen}")
            assert self.listen is not None
            return self.listen
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
        return self.listen

    def learn_addresses(
        self, entries: list[tuple[NodeId, str]] | tuple[tuple[NodeId, str], ...]
    ) -> bool:
        """Take gossiped addresses, except for nodes that run here and nodes whose own
        process told us where it listens."""
        changed = False
        directory = self.directory
        own = self._announced_at
        for node, addr in entries:
            if node in self.nodes or not _plausible_address(addr):
                continue
            if node in own:
                self._gossiped[node] = addr  # kept aside; the node's own word stands
                continue
            if directory.get(node) == addr:
                continue
            directory.pop(node, None)  # re-inserted last: the newest goes last
            directory[node] = addr
            changed = True
        while len(directory) > MAX_DIRECTORY:
            oldest = next((n for n in directory if n not in own and n not in self.nodes), None)
            if oldest is None:
                break
            del directory[oldest]
        return changed

    def directory_from(self, src: NodeId, entries: tuple[tuple[NodeId, str], ...]) -> None:
        """A peer node gossiped where nodes listen; only routers may."""
        if not acts_as_router(self.role_of(src)) or len(entries) > MAX_GOSSIP:
            self.stats["directories_ignored"] += 1
            return
        if self.learn_addresses(entries):
            self._gossip()

    async def close(self) -> None:
        for node in list(self.nodes.values()):
            await node.stop()
        self._flush()
        self.dialer.close()
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
                self.loop.call_soon(local.on_frames, ((src, frame, 0),))
                continue
            conn = routes.get(peer)
            if conn is None or (src, peer) not in conn.ready:
                self.dialer.want(peer)  # kept by the link layer; resent once the channel is up
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

    def flush(self) -> None:
        """Write everything queued now rather than at the end of the loop turn."""
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._dirty:
            dirty, self._dirty = self._dirty, {}
            now = self.loop.time()
            for node in dirty:
                if not node.stopped:
                    self.route(node, node.link.flush(now))
                    node.rearm()
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
                parts = encode_items(encoder, items)
                size = sum(map(len, parts))
                if size <= limit:
                    self._write(conn, parts, size)
                    continue
                # Too big for one packet: pack the messages inline, so that every piece
                # stands on its own (a message table serves only its own packet).
                parts = [pack(item) for item in items]
                chunk: list[bytes] = []
                size = 0
                for whole in parts:  # split, keeping order, so no packet tops the limit
                    for part in self._parts(conn, whole, limit):
                        if chunk and size + len(part) > limit:
                            self._write(conn, chunk, size)
                            chunk, size = [], 0
                        chunk.append(part)
                        size += len(part)
                self._write(conn, chunk, size)
        finally:
            encoder.reset()

    def _parts(self, conn: Connection, item: bytes, limit: int) -> list[bytes]:
        """One packed item as packet pieces: itself, or its ``part`` slices when it tops
        the limit (a frame a core filled with a burst of large messages)."""
        if len(item) <= limit:
            return [item]
        self.stats["items_split"] += 1
        if len(item) > MAX_ASSEMBLED:
            # The peer refuses it, and again when the link layer resends it: say so.
            self.stats["packets_oversize"] += 1
            log.error(
                "event=packet_oversize host=%s peer=%s bytes=%d limit=%d",
                self.host_id, conn.peer_name(), len(item), MAX_ASSEMBLED,
            )  # fmt: skip
        return split_item(self.encoder, item, limit)

    def _write(self, conn: Connection, parts: list[bytes], size: int) -> None:
        head = array_header(len(parts))
        size += len(head)
        conn.send(head, parts, size)
        self.stats["packets_out"] += 1
        self.stats["bytes_out"] += size + 4

    # ------------------------------------------------------------------ receiving
    def frame_received(self, conn: Connection, body: bytes | memoryview) -> None:
        """One packet from an open connection (see ``ecast.runtime.transport``)."""
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
        # What a frame held ahead of a gap is charged: its share of the packet.
        share = len(body) // len(items) if items else 0
        try:
            for item in items:
                if conn.state != "open":
                    return
                if type(item) is Part:
                    try:
                        conn.assembled, joined = join_part(conn.pieces, conn.assembled, item)
                    except DecodeError as e:
                        raise ProtocolViolation(str(e)) from None
                    if joined is None:
                        continue
                    item = joined[0]
                if type(item) is FrameItem:
                    src, dst, frame = item
                    if src not in conn.nodes:
                        raise ProtocolViolation(f"frame from unannounced node {src!r:.40}")
                    node = self.nodes.get(dst)
                    if node is not None:
                        box = pending.get(node)
                        if box is None:
                            pending[node] = [(src, frame, share)]
                            if not self._feed_scheduled:
                                self._feed_scheduled = True
                                self.loop.call_soon(self._feed_frames)
                        else:
                            box.append((src, frame, share))
                else:
                    if pending:
                        self._feed_frames()
                        pending = self._frames_in
                        if conn.state != "open":
                            return
                    self._control(conn, item)
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

    def _feed_frames(self) -> None:
        self._feed_scheduled = False
        self._bytes_in = 0
        pending = self._frames_in
        if not pending:
            return
        self._frames_in = {}
        for node, frames in pending.items():
            node.on_frames(frames)

    def _control(self, conn: Connection, item: Any) -> None:
        t = type(item)
        if t is Nodes:
            self._on_nodes(conn, item.nodes)
        elif t is Acks:
            self._on_acks(conn, item.acks)
        elif t is Gone:
            for node in item.nodes:
                inc = conn.nodes.pop(node, None)
                if inc is None:
                    continue
                if self.routes.get(node) is conn:
                    del self.routes[node]
                    # Stopped for good, as far as anyone knows here: no longer gossiped,
                    # unless the routers told of another process under the name.
                    self.directory.pop(node, None)
                    listen = self._announced_at.pop(node, None)
                    self._fall_back_to_gossip(node, listen)
                    self.identities.pop(node, None)
                conn.ready = {pair for pair in conn.ready if pair[1] != node}
                # What is sent to the name from now on is for its next incarnation.
                for local in self.nodes.values():
                    local.link.peer_stopped(node, inc)
        elif t is PeerError:
            log.warning(
                "event=refused_by_peer host=%s peer=%s reason=%r",
                self.host_id,
                _host(conn),
                item.reason[:200],
            )

    def _on_nodes(self, conn: Connection, entries: tuple[tuple[str, int], ...]) -> None:
        peer = conn.peer
        assert peer is not None
        identity = peer.identity
        new = {node for node, _ in entries if node not in conn.nodes}
        if len(conn.nodes) + len(new) > MAX_NODES_PER_CONNECTION:
            self.stats["names_refused"] += len(new)
            raise ProtocolViolation(
                f"{len(conn.nodes) + len(new)} nodes on one connection (at most "
                f"{MAX_NODES_PER_CONNECTION})"
            )
        if new and identity.serial:
            # Per credential, over its connections (the development mode's one identity
            # is every process's: there, each connection's own cap is the bound).
            mine = sum(
                len(c.nodes)
                for c in self.conns.values()
                if c is not conn
                and c.peer is not None
                and c.peer.identity.serial == identity.serial
            )
            if mine + len(conn.nodes) + len(new) > self.max_nodes_per_credential:
                self.stats["names_refused"] += len(new)
                raise ProtocolViolation(
                    f"{identity.describe()} announces more than "
                    f"{self.max_nodes_per_credential} nodes"
                )
        for node, inc in entries:
            if node in self.nodes:
                raise ProtocolViolation(f"peer claims node {node!r:.60}, which runs here")
            if not identity.covers(node) or not node.isprintable() or len(node) > MAX_HOST:
                self.stats["connections_refused"] += 1
                raise ProtocolViolation(
                    f"node {node!r:.60} is not covered by the peer's {identity.describe()}"
                )
            known_as = self.identities.get(node)
            if known_as is not None and known_as.role == ROUTER and identity.role != ROUTER:
                self.stats["connections_refused"] += 1
                raise ProtocolViolation(
                    f"node {node!r:.60} runs under a router credential, not the peer's "
                    f"{identity.describe()}"
                )
            known = max((n.link.known_incarnation(node) for n in self.nodes.values()), default=0)
            if known and inc < known:
                self.stats["connections_refused"] += 1
                raise ProtocolViolation(f"stale incarnation {inc} of {node} (current {known})")
            ended = max((n.link.ended_incarnation(node) for n in self.nodes.values()), default=0)
            if ended and inc <= ended:
                self.stats["connections_refused"] += 1
                raise ProtocolViolation(f"incarnation {inc} of {node} stopped (up to {ended})")
        listen = peer.listen
        acks = []
        changed = False
        for node, inc in entries:
            old = self.routes.get(node)
            if old is not None and old is not conn:  # it moved (or restarted) elsewhere
                old.nodes.pop(node, None)
                old.ready = {pair for pair in old.ready if pair[1] != node}
            conn.nodes[node] = inc
            conn.ready = {pair for pair in conn.ready if pair[1] != node}
            self.routes[node] = conn
            self.identities[node] = identity
            if listen:
                self._announced_at[node] = listen
                self._gossiped.pop(node, None)  # older than this announcement
                if self.directory.get(node) != listen:
                    self.directory.pop(node, None)
                    self.directory[node] = listen
                    changed = True
            for local in self.nodes.values():
                acks.append((local.node_id, node, local.link.received_from(node, inc)))
        if acks:
            self._queue(conn, control_item(Acks(tuple(acks))))
        if changed:
            self._gossip()
        conn.announced = True
        self.dialer.announced(conn)

    def _on_acks(self, conn: Connection, acks: tuple[tuple[str, str, int], ...]) -> None:
        now = self.loop.time()
        for remote, local, count in acks:
            inc = conn.nodes.get(remote)
            node = self.nodes.get(local)
            if inc is None or node is None or node.stopped:
                continue  # gone meanwhile
            conn.ready.add((local, remote))
            self.route(node, node.link.on_connected(remote, inc, count, now))
            if node.advertise:
                for chunk in self._directory_messages():
                    node.link.send(remote, chunk)
                self.schedule(node)
            node.rearm()

    # Connection callbacks (the owner interface of ``ecast.runtime.transport``).
    def admit(self, conn: Connection) -> str | None:
        """Caps on connections that have not proven themselves: per source address, and
        in all.  When all the slots are taken, the oldest handshake of the source that
        holds the most goes, unless the newcomer's source is that one: a flood from a
        few addresses delays the others by at most a handshake, never locks them out."""
        source = _source_of(conn)
        from_source = self._handshakes_from.get(source, 0)
        if from_source >= self.max_handshakes_per_source:
            self.stats["connections_refused"] += 1
            return f"{from_source} connections from {source} already in their handshake"
        if len(self.conns) + len(self._handshaking) >= self.max_connections:
            self.stats["connections_refused"] += 1
            return f"{self.max_connections} connections already"
        if len(self._handshaking) >= self.max_handshakes:
            heavy = max(self._handshakes_from, key=self._handshakes_from.__getitem__)
            if self._handshakes_from[heavy] <= from_source + 1:
                self.stats["connections_refused"] += 1
                return f"{len(self._handshaking)} connections already in their handshake"
            victim = next(c for c in self._handshaking if c.source == heavy)
            self.stats["handshakes_evicted"] += 1
            victim.close(f"handshake slot taken back from {heavy}, which held the most")
            self.handshake_over(victim)
        conn.source = source
        self._handshaking[conn] = None
        self._handshakes_from[source] = from_source + 1
        return None

    def pre_auth_timeout(self) -> float:
        """The handshake timeout, and under pressure (half the slots taken) at most one
        second: a process proves itself in milliseconds, a squatter waits out the timer."""
        if len(self._handshaking) * 2 >= self.max_handshakes:
            return min(self.handshake_timeout, 1.0)
        return self.handshake_timeout

    def handshake_over(self, conn: Connection) -> None:
        if self._handshaking.pop(conn, 0) is None:
            n = self._handshakes_from.get(conn.source, 0) - 1
            if n > 0:
                self._handshakes_from[conn.source] = n
            else:
                self._handshakes_from.pop(conn.source, None)

    def check_peer(self, peer: PeerInfo) -> str | None:
        """A proven peer: refuse our own host id and earlier incarnations of the process.
        Only now is its incarnation recorded, keyed by its host id and credential."""
        if peer.host == self.host_id:
            return f"peer claims this process's own host id {peer.host}"
        key = peer.key
        incs = self._host_incs
        known = incs.get(key, 0)
        if peer.incarnation < known:
            self.stats["connections_refused"] += 1
            return f"stale incarnation {peer.incarnation} of {peer.host} (current {known})"
        incs.pop(key, None)
        incs[key] = peer.incarnation
        if len(incs) > MAX_INCARNATIONS:
            del incs[next(iter(incs))]
        return None

    def role_of(self, node: NodeId) -> str | None:
        """The role of the credential ``node`` was announced under (a node that runs here
        has this process's), or None for a node never announced."""
        if node in self.nodes:
            return self.identity.role
        identity = self.identities.get(node)
        return identity.role if identity is not None else None

    def speaks_for(self, node: NodeId, name: str) -> bool | None:
        """Whether the credential ``node`` runs under covers ``name`` (``SpeaksFor`` of
        ``ecast.core.roles``), or None for a node not announced (any more)."""
        if node in self.nodes:
            return self.identity.covers(name)
        identity = self.identities.get(node)
        return identity.covers(name) if identity is not None else None

    def connection_open(self, conn: Connection) -> None:
        peer = conn.peer
        assert peer is not None
        key = peer.key
        old = self.conns.get(key)
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
        self.conns[key] = conn
        self.stats["connections_opened"] += 1
        log.info(
            "event=connected host=%s peer=%s incarnation=%d dialer=%s identity=%r",
            self.host_id,
            peer.host,
            peer.incarnation,
            conn.dialer,
            peer.identity.describe(),
        )
        self._announce(conn, list(self.nodes.values()))

    def _announce(self, conn: Connection, nodes: list[Node]) -> None:
        if not nodes:
            return
        self._queue(conn, control_item(Nodes(tuple((n.node_id, n.incarnation) for n in nodes))))
        acks = [
            (n.node_id, remote, n.link.received_from(remote, inc))
            for n in nodes
            for remote, inc in conn.nodes.items()
        ]
        if acks:
            self._queue(conn, control_item(Acks(tuple(acks))))

    def connection_closed(self, conn: Connection, reason: str) -> None:
        self.dialer.lost(conn, reason)
        self._forget_conn(conn)
        log.info("event=disconnected host=%s peer=%s reason=%r", self.host_id, _host(conn), reason)

    def _forget_conn(self, conn: Connection) -> None:
        if conn.peer is not None and self.conns.get(conn.peer.key) is conn:
            del self.conns[conn.peer.key]
        listen = conn.peer.listen if conn.peer is not None else None
        # A process that gossips (a router) tells of application processes it can
        # reach: one that left is told of again when it connects again.  Routers stay
        # (they are dialed back from here), as does anything in the development mode.
        for node in conn.nodes:
            if self.routes.get(node) is conn:
                for local in self.nodes.values():
                    local.link.release_reordered(node)
        gossips = (
            conn.peer is not None
            and not acts_as_router(conn.peer.identity.role)
            and any(n.advertise for n in self.nodes.values())
        )
        for node in conn.nodes:
            if self.routes.get(node) is conn:
                del self.routes[node]
                if listen is not None and self._announced_at.get(node) == listen:
                    del self._announced_at[node]  # gossip may tell us where it went
                    if gossips and self.directory.get(node) == listen:
                        del self.directory[node]
                        self._gossiped.pop(node, None)
                    else:
                        self._fall_back_to_gossip(node, listen)
        conn.ready = set()
        self.dialer.lost(conn, "forgotten")

    def _fall_back_to_gossip(self, node: NodeId, announced: str | None) -> None:
        """``node``'s own announcement (``announced``) is void: take the address the
        routers gossiped meanwhile, if they named another one (a newer process under the
        name, most likely; dialing it proves which)."""
        addr = self._gossiped.pop(node, None)
        if addr is None or addr == announced or node in self._announced_at:
            return
        self.directory.pop(node, None)  # re-inserted last: the newest goes last
        self.directory[node] = addr

    def refuse(self, conn: Connection, reason: str) -> None:
        """Tell the peer why (best effort), log, and close the connection."""
        log.warning("event=refused host=%s peer=%s reason=%r", self.host_id, _host(conn), reason)
        with contextlib.suppress(Exception):
            error = self.encoder.pack(control_item(PeerError(reason)))
            conn.send(array_header(1), [error], 1 + len(error))
        conn.close(reason)

    def disconnect(self, peer: NodeId, reason: str) -> None:
        """Close the connection that reaches ``peer`` (its process sent what no core takes)."""
        conn = self.routes.get(peer)
        if conn is not None:
            conn.close(reason)

    # ------------------------------------------------------------------ flow control
    def congested(self, peer: NodeId) -> bool:
        """True while the connection that reaches ``peer`` holds more unsent bytes than its
        high-water mark (the peer's process does not read as fast as we write)."""
        conn = self.routes.get(peer)
        return conn is not None and conn in self._congested

    def buffered(self, peer: NodeId) -> int:
        """Bytes written to the connection that reaches ``peer`` and not yet sent."""
        conn = self.routes.get(peer)
        t = conn.transport if conn is not None else None
        if t is None:
            return 0
        try:
            return int(t.get_write_buffer_size())
        except Exception:  # a transport being torn down
            return 0

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

    def pause_reading(self, paused: bool, peers: list[NodeId] | None = None) -> None:
        """Stop (or resume) reading from the connections that reach ``peers`` (every
        connection if None): backpressure from a node's owner."""
        if peers is None:
            conns = list(self.conns.values())
        else:
            conns = list({id(c): c for p in peers if (c := self.routes.get(p))}.values())
        for conn in conns:
            if conn.state == "open":
                conn.set_reading(paused)

    # ------------------------------------------------------------------ dialing
    def _directory_messages(self) -> list[Directory]:
        """The directory as gossip: messages of at most ``MAX_GOSSIP`` entries each (a
        receiver ignores a larger one, and would then learn nothing at all)."""
        entries = sorted(self.directory.items())
        return [
            Directory(tuple(entries[i : i + MAX_GOSSIP]))
            for i in range(0, len(entries), MAX_GOSSIP)
        ]

    def _gossip(self) -> None:
        messages = None
        for conn in self.conns.values():
            for local, remote in conn.ready:
                node = self.nodes.get(local)
                if node is not None and node.advertise:
                    if messages is None:
                        messages = self._directory_messages()
                    for m in messages:
                        node.link.send(remote, m)
                    self.schedule(node)

    def want(self, peer: NodeId) -> None:
        self.dialer.want(peer)

    async def connect(self, address: str, timeout: float = 5.0) -> Connection:
        """A connection to the process at ``address`` whose node list has arrived."""
        return await self.dialer.connect(address, timeout)

    async def connect_node(self, address: str, timeout: float = 5.0) -> NodeId:
        """Reach the process at ``address``; return the (first) node that runs there."""
        conn = await self.dialer.connect(address, timeout)
        if not conn.nodes:
            raise ConnectionError(f"no node runs at {address}")
        return sorted(conn.nodes)[0]


def _source_of(conn: Connection) -> str:
    """The address a connection comes from, without its port."""
    t = conn.transport
    try:
        peer = t.get_extra_info("peername") if t is not None else None
    except Exception:
        peer = None
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return "?"


def _host(conn: Connection) -> str:
    return conn.peer.host if conn.peer is not None else "?"


def _plausible_address(addr: object) -> bool:
    """HOST:PORT of a sane length: what a directory entry may say."""
    if type(addr) is not str or not 3 <= len(addr) <= 270 or not addr.isprintable():
        return False
    host, _, port = addr.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536
