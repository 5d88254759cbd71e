"""Dialing: opening connections to other processes, one attempt per address at a time.

A node with frames for a peer it has no channel to asks for the peer's process
(``want``); the dialer looks the address up in the runtime's directory (gossiped by the
routers) and dials with exponential backoff.  ``connect`` opens a connection and waits
until the peer announced its nodes, so the caller can address them at once.  When both
sides dial each other at once, the runtime keeps one connection (``Runtime.
connection_open``) and the dialer hands back whichever survived.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING

from ecast.core.effects import NodeId
from ecast.runtime.transport import Connection, cap_resend_wait, split_address

if TYPE_CHECKING:
    from ecast.runtime.mux import Runtime

log = logging.getLogger("ecast.runtime")

BACKOFF_MIN = 0.05
BACKOFF_MAX = 1.0
DIAL_TIMEOUT = 5.0


class Dialer:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.dialed: dict[str, Connection] = {}
        """Open connections by the address we dialed."""
        self._pending: dict[str, asyncio.Task[Connection]] = {}
        self._backoff: dict[str, float] = {}
        self._announced: dict[Connection, asyncio.Future[None]] = {}
        self.closed = False

    def want(self, peer: NodeId) -> None:
        """Some node has frames for ``peer``: dial its process if we know where it listens."""
        rt = self.runtime
        if self.closed:
            return
        address = rt.directory.get(peer)
        if address is None or address == rt.listen or address in self._pending:
            return
        conn = self.dialed.get(address)
        if conn is not None and conn.state == "open":
            return  # connected; the peer has not announced ``peer`` (yet)
        self._track(address, rt.loop.create_task(self._dial(address)))

    async def _dial(self, address: str) -> Connection:
        delay = self._backoff.get(address, 0.0)
        if delay:
            await asyncio.sleep(delay)
        self._backoff[address] = min(max(delay * 2, BACKOFF_MIN), BACKOFF_MAX)
        try:
            conn = await self._open(address, DIAL_TIMEOUT)
        except (TimeoutError, OSError, ConnectionError) as e:
            log.debug(
                "event=dial_failed host=%s address=%s reason=%r",
                self.runtime.host_id,
                address,
                e,
            )
            raise
        self._backoff.pop(address, None)
        return conn

    async def connect(self, address: str, timeout: float = DIAL_TIMEOUT) -> Connection:
        """A connection to the process at ``address`` whose node list has arrived."""
        conn = self.dialed.get(address)
        if conn is not None and conn.state == "open" and conn.announced:
            return conn
        task = self._pending.get(address)
        if task is None:
            task = self._track(address, self.runtime.loop.create_task(self._open(address, timeout)))
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
        rt = self.runtime
        loop = rt.loop
        host, port = split_address(address)
        failed: asyncio.Future[None] = loop.create_future()

        def on_fail(_conn: Connection, reason: str) -> None:
            if not failed.done():
                failed.set_exception(ConnectionError(reason))

        server_hostname = host if rt.client_ssl is not None else None

        async def opened() -> tuple[asyncio.BaseTransport, Connection]:
            sock = await self._connected(host, port)
            try:
                return await loop.create_connection(
                    lambda: Connection(rt, dialer=True, on_fail=on_fail),
                    sock=sock,
                    ssl=rt.client_ssl,
                    server_hostname=server_hostname,
                )
            except BaseException:
                sock.close()  # (a transport made of it closed it already: closing again is fine)
                raise

        _t, conn = await asyncio.wait_for(opened(), timeout)
        announced = self._announced.setdefault(conn, loop.create_future())
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
            other = rt.conns.get(conn.peer.key) if conn.peer is not None else None
            if other is not None and other.state == "open":
                if not other.announced:
                    await asyncio.sleep(0.05)
                self.dialed[address] = other
                return other
            raise exc or ConnectionError(conn.closed_reason or "connection closed")
        self.dialed[address] = conn
        return conn

    async def _connected(self, host: str, port: int) -> socket.socket:
        """A TCP socket connected to ``host:port``, its resend wait capped before the
        SYN goes out: Linux resends a SYN a second apart a few times, then doubles the
        wait, and a dial begun 5.5 s before a partition healed connected 1.6 s after
        the heal, against 0.5 s capped (``tests/integration/test_resend_after_partition.py``)."""
        rt = self.runtime
        loop = rt.loop
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        error: OSError = OSError(f"{host}:{port}: no address")
        for family, kind, proto, _name, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                cap_resend_wait(sock)
                if rt.source_address is not None:
                    sock.bind((rt.source_address, 0))
                await loop.sock_connect(sock, address)
            except OSError as e:
                sock.close()
                error = e
                continue
            except BaseException:
                sock.close()
                raise
            return sock
        raise error

    # ------------------------------------------------------------------ from the runtime
    def announced(self, conn: Connection) -> None:
        """The peer's node list arrived on ``conn``."""
        fut = self._announced.pop(conn, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def lost(self, conn: Connection, reason: str) -> None:
        fut = self._announced.pop(conn, None)
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionError(reason))
        for address, c in list(self.dialed.items()):
            if c is conn:
                del self.dialed[address]

    def close(self) -> None:
        self.closed = True
        for task in self._pending.values():
            task.cancel()
