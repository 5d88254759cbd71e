"""The asyncio client SDK: an application process that submits and delivers.

    client = await ecast.connect(["127.0.0.1:7001"], name="app-1", secret=b"...")
    ack = await client.submit(b"hello", header={"key": 42})   # in the send window now
    print((await ack).t)                                        # stable: every destination has it
    async for d in client.deliveries():                         # in t order, exactly once
        ...
    await client.close()                                        # submits part, waits for it

The SDK confirms a delivery as it enters a bounded delivery queue; when the queue is full
the SDK stops reading from its routers until the application catches up, so a slow
consumer slows the senders (through E-Cast's flow control) instead of growing memory.
Leader changes are followed without the caller noticing: the endpoint resends its window.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ecast.core.effects import Effects, NodeId
from ecast.core.endpoint import (
    Acked,
    Delivery,
    Endpoint,
    EndpointClosed,
    EndpointParams,
    LeaderChanged,
    Rejected,
    Terminated,
)
from ecast.core.message import MsgId, Session
from ecast.runtime import Node, Runtime

__all__ = ["Ack", "Client", "ClosedError", "connect"]


class ClosedError(RuntimeError):
    """The client was closed or declared faulty; nothing more can be submitted."""


@dataclass(frozen=True, slots=True)
class Ack:
    """A stable acknowledgement: every unsuspected destination delivered the message."""

    id: MsgId
    t: int | None
    """Timestamp in the m-seq (None for a duplicate of a message collected long ago)."""
    delivered: bool
    """False if nobody was a destination (an ignored message, 4.4.1)."""


class Client:
    def __init__(
        self,
        name: str,
        runtime: Runtime,
        params: EndpointParams,
        session: Session | None,
        queue_size: int,
    ) -> None:
        self.name = name
        self.runtime = runtime
        self._params = params
        self._session = session
        # Unbounded as a container: ``queue_size`` is where reading pauses.  Frames already
        # read when the mark is crossed (one packet, one turn's read budget) still go in;
        # refusing them would lose confirmed deliveries.
        self._queue: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self._queue_size = queue_size
        self._paused = False
        self._paused_peers: list[NodeId] = []
        self._acks: dict[MsgId, asyncio.Future[Ack]] = {}
        self._space = asyncio.Event()
        self._joined = asyncio.Event()
        self._closed = asyncio.Event()
        self.terminated: str | None = None
        self.leader: NodeId | None = None
        self.view = -1
        self.node: Node | None = None
        self.endpoint: Endpoint | None = None
        self._direct: asyncio.Queue[tuple[NodeId, Any]] = asyncio.Queue()
        self._owns_runtime = False
        self.ack_listener: Callable[[list[Ack]], None] | None = None
        """Receives, in batches, the acks of messages sent with ``submit_batch``."""

    # ------------------------------------------------------------------ setup
    async def _start(self, routers: list[str], join: bool, join_header: dict[str, Any]) -> None:
        ids: list[NodeId] = []
        errors = []
        for address in routers:
            try:
                ids.append(await self.runtime.connect_node(address))
            except (TimeoutError, OSError, ConnectionError) as e:
                errors.append(f"{address}: {e}")
        if not ids:
            raise ConnectionError("no router reachable: " + "; ".join(errors))
        self.endpoint = Endpoint(self.name, ids, self._params, self._session)
        node = self.runtime.add_node(
            self.name,
            self.endpoint,
            on_deliver=self._on_upcalls,
            on_direct=lambda src, payload: self._direct.put_nowait((src, payload)),
            keep_connected=self._routers_to_keep,
        )
        self.node = node
        node.start()
        if join:
            node.feed(lambda core, now: core.join(now, **join_header)[1])
            await self._joined.wait()

    def _routers_to_keep(self) -> list[NodeId]:
        """Stay connected to every router of the succession order (issue 4: topology)."""
        ep = self.endpoint
        return list(ep.succession) if ep is not None else []

    # ------------------------------------------------------------------ upcalls
    def _on_upcalls(self, node: Node, upcalls: list[Any]) -> None:
        batch: list[Ack] = []
        for up in upcalls:
            t = type(up)
            if t is Delivery:
                self._queue.put_nowait(up)
                if not self._paused and self._queue.qsize() >= self._queue_size:
                    self._pause_routers(True)
            elif t is Acked:
                fut = self._acks.pop(up.id, None)
                if fut is not None:
                    if not fut.done():
                        fut.set_result(Ack(up.id, up.t, up.delivered))
                else:
                    batch.append(Ack(up.id, up.t, up.delivered))
                self._space.set()
            elif t is Rejected:
                fut = self._acks.pop(up.id, None)
                if fut is not None and not fut.done():
                    fut.set_exception(ClosedError(f"{up.id}: session {up.reason}"))
            elif t is LeaderChanged:
                self.view = up.view
                self.leader = up.succession[0] if up.succession else None
                self.runtime.loop.call_soon(self._join_check)
            elif t is Terminated:
                self.terminated = up.reason
                self._closed.set()
                self._queue.put_nowait(None)
                for fut in self._acks.values():
                    if not fut.done() and up.reason != "closed":
                        fut.set_exception(ClosedError(f"client {up.reason}"))
        if batch and self.ack_listener is not None:
            self.ack_listener(batch)
        self._join_check()

    def _pause_routers(self, paused: bool) -> None:
        """A full delivery queue stops reading from the routers only: a peer's direct
        stream (a migration) must not stall behind the application's deliveries."""
        if paused:
            ep = self.endpoint
            self._paused_peers = list(ep.succession) if ep is not None else []
        self._paused = paused
        self.runtime.pause_reading(paused, self._paused_peers)

    def _join_check(self) -> None:
        ep = self.endpoint
        if ep is not None and ep.joined_at is not None:
            self._joined.set()

    # ------------------------------------------------------------------ submitting
    def _require_open(self) -> Node:
        if self.terminated is not None or self.node is None:
            raise ClosedError(f"client {self.name} is {self.terminated or 'not connected'}")
        return self.node

    def _submit(self, call: Callable[[Endpoint, float], tuple[Any, Effects]]) -> Any:
        """Run one submitting step on the endpoint and return what it numbered."""
        node = self._require_open()
        holder: list[Any] = []

        def go(core: Endpoint, now: float) -> Effects:
            result, fx = call(core, now)
            holder.append(result)
            return fx

        try:
            node.feed(go)
        except EndpointClosed as e:
            raise ClosedError(str(e)) from None
        return holder[0]

    def _future_for(self, sid: MsgId) -> asyncio.Future[Ack]:
        fut: asyncio.Future[Ack] = self.runtime.loop.create_future()
        self._acks[sid] = fut
        return fut

    def submit_nowait(self, payload: bytes, header: Any = None) -> asyncio.Future[Ack]:
        """Queue a message (it enters the window when there is room); return its ack."""
        return self._future_for(self._submit(lambda core, now: core.submit(payload, header, now)))

    def submit_batch(self, items: list[tuple[bytes, Any]]) -> list[MsgId]:
        """Queue many ``(payload, header)`` messages at once, without a future each.

        Their acknowledgements go to ``ack_listener`` in batches: the cheapest way to
        keep thousands of messages in flight (benchmarks, bulk loaders).
        """
        ids: list[MsgId] = self._submit(lambda core, now: core.submit_many(items, now))
        return ids

    async def submit(self, payload: bytes, header: Any = None) -> asyncio.Future[Ack]:
        """Submit; return once the message is in the send window, with its ack future."""
        fut = self.submit_nowait(payload, header)
        ep = self.endpoint
        assert ep is not None
        while ep.queued and self.terminated is None:
            self._space.clear()
            await self._space.wait()
        return fut

    async def submit_unsafe(self, payload: bytes, header: Any = None) -> None:
        """Forward without agreement: no ack, accepted by receivers only if it fits.

        Unsafe messages bypass the congestion window; this waits instead while the
        connection to the routers is backed up.
        """
        node = self._require_open()
        await self.runtime.writable()
        node.feed(lambda core, now: core.submit_unsafe(payload, header, now))

    async def submit_unsafe_batch(self, items: list[tuple[bytes, Any]]) -> None:
        """Many unsafe ``(payload, header)`` messages at once (see ``submit_unsafe``)."""
        node = self._require_open()
        await self.runtime.writable()
        node.feed(lambda core, now: core.submit_unsafe_many(items, now))

    async def suspect(self, processes: list[NodeId]) -> asyncio.Future[Ack]:
        return self._future_for(self._submit(lambda core, now: core.suspect(processes, now)))

    # ------------------------------------------------------------------ delivering
    async def deliveries(self) -> AsyncIterator[Delivery]:
        """Deliveries in ``t`` order; unsafe ones say whether they were accepted."""
        while True:
            d = await self._queue.get()
            if self._paused and self._queue.qsize() <= self._queue_size // 2:
                self._pause_routers(False)
            if d is None:
                return
            yield d

    def send_direct(self, peer: NodeId, payload: Any) -> None:
        """Send to another application process directly (authenticated, not ordered)."""
        self._require_open().send_direct(peer, payload)

    async def receive_direct(self) -> tuple[NodeId, Any]:
        """The next ``(sender, payload)`` another application process sent directly."""
        return await self._direct.get()

    async def serve(self, listen: str = "127.0.0.1:0") -> str:
        """Accept direct connections from other application processes on ``listen``
        (port 0 picks a free one); returns the address to give them."""
        node = self._require_open()
        return await node.runtime.serve(listen)

    async def connect_peer(self, address: str, timeout: float = 5.0) -> NodeId:
        """Open an authenticated connection to the application process serving at
        ``address`` (same handshake and framing as the routers'); returns its node id,
        for ``send_direct``."""
        return await self._require_open().connect(address, timeout)

    # ------------------------------------------------------------------ leaving
    async def close(self, timeout: float = 10.0) -> None:
        """Part gracefully: submit part and wait until it is delivered."""
        node = self.node
        if node is not None and self.terminated is None:
            node.feed(lambda core, now: core.close(now)[1])
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closed.wait(), timeout)
            # Linger a moment so the part's stable confirmation goes out (docs/decisions.md).
            ep = self.endpoint
            for _ in range(50):
                if ep is None or not ep.lingering:
                    break
                await asyncio.sleep(0.02)
        if node is not None:
            await node.stop()
        if self._owns_runtime:
            await self.runtime.close()


async def connect(
    routers: list[str],
    name: str,
    *,
    secret: bytes | None = None,
    runtime: Runtime | None = None,
    params: EndpointParams | None = None,
    session: Session | None = None,
    join: bool = True,
    join_header: dict[str, Any] | None = None,
    queue_size: int = 10_000,
    tls: ssl.SSLContext | None = None,
) -> Client:
    """Connect to a router group (any of ``routers``, given as HOST:PORT) and join it.

    The secret comes from ``secret`` or the ``ECAST_SECRET`` environment variable.
    Several clients may share one ``runtime`` (colocated processes talk in memory).
    ``tls`` is the client context for routers started with ``--tls-cert`` (a client's
    own ``serve`` for direct connections stays plain TCP).
    """
    owns = runtime is None
    if runtime is None:
        key = secret if secret is not None else os.environ.get("ECAST_SECRET", "").encode()
        runtime = Runtime(key, host_id=f"{name}-{os.getpid()}", client_ssl=tls)
    client = Client(name, runtime, params or EndpointParams(), session, queue_size)
    client._owns_runtime = owns
    await client._start(routers, join, join_header or {})
    return client
