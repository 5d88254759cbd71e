"""The asyncio client SDK: an application process that submits and delivers.

    async with ecast.connect(["127.0.0.1:7001"], name="app-1") as client:
        ack = await client.submit(b"hello", header={"key": 42})   # stable: delivered everywhere
        async for d in client.deliveries():                          # in t order, exactly once
            ...

Everything a caller gets wrong fails at the call, with a message that says what to change
(``ecast.errors``); nothing raises later inside the event loop because of a caller's
input.  Every wait has a timeout.  The SDK confirms a delivery as it enters a bounded
delivery queue; when the queue is full it stops reading from its routers until the
application catches up, so a slow consumer slows the senders (through E-Cast's flow
control) instead of growing memory.  Leader changes are followed without the caller
noticing: the endpoint resends its window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import Any

import msgpack

from ecast import errors as ecast_errors
from ecast.core.config import JOIN, KIND, MEMBERSHIP_KINDS, PART, SUSPECT, WHO
from ecast.core.effects import Effects, NodeId
from ecast.core.endpoint import (
    Acked,
    Delivery,
    Endpoint,
    EndpointClosed,
    EndpointParams,
    LeaderChanged,
    Rejected,
    Shed,
    Terminated,
)
from ecast.core.message import MsgId, Session
from ecast.core.proto import CloseForbidden, SessionsClosed
from ecast.errors import (
    AuthenticationError,
    Backpressure,
    ClosedError,
    ForbiddenError,
    InvalidMessage,
    InvalidName,
    MessageTooLarge,
    NameRetiredError,
    NotARouterError,
    PartFailedError,
    SessionClosedError,
    SuspectedError,
    Unavailable,
)
from ecast.runtime import Node, Runtime, new_incarnation
from ecast.runtime.process import load_auth
from ecast.wire.codec import MAX_FRAME, Packed, pack_plain, plain_default

__all__ = ["Ack", "Client", "connect"]

log = logging.getLogger("ecast.sdk")

MAX_NAME = 255
DEFAULT_MAX_MESSAGE = MAX_FRAME - 64 * 1024
"""Until the routers' ``Welcome`` says otherwise (it comes with the first answer)."""


Ack = Acked
"""A stable acknowledgement (``id``, ``t``, ``delivered``; see :class:`Acked`): the
endpoint's own named tuple, handed over as it is.  The SDK used to copy each one into a
frozen dataclass, whose constructor cost a bulk loader several per cent of its CPU."""


def check_name(name: Any) -> str:
    if type(name) is not str or not name or len(name) > MAX_NAME:
        raise InvalidName(f"a process name is a non-empty str of at most {MAX_NAME} characters")
    if name.startswith("@"):
        raise InvalidName(f"{name!r}: names starting with @ are reserved for the routers")
    if not name.isprintable():
        raise InvalidName(f"{name!r}: a process name must be printable")
    return name


_packers = threading.local()


def _pack_fn() -> Callable[[Any], bytes]:
    """This thread's packer (``packb`` makes a new one per call and costs three times as
    much; a Packer is not safe to share between threads)."""
    try:
        return _packers.pack  # type: ignore[no-any-return]
    except AttributeError:
        pack = _packers.pack = msgpack.Packer(default=plain_default, use_bin_type=True).pack
        return pack  # type: ignore[no-any-return]


def _cannot_encode(what: str, e: Exception) -> InvalidMessage:
    return InvalidMessage(
        f"{what} cannot be encoded ({e}): use None, bool, int, float, str, bytes, "
        "and lists, tuples and dicts of them"
    )


def _packed(value: Any, what: str) -> bytes:
    """A value packed as the wire packs it; raises at the call for what cannot be
    encoded."""
    try:
        return pack_plain(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise _cannot_encode(what, e) from None


def message_size(payload: Any, header: Any, limit: int, reserved: bool = True) -> int:
    """The packed size of a message (payload and header as the wire packs them); raises
    at the call for anything the routers refuse.

    The header is packed, not estimated: msgpack packs a small dict in C in less time
    than a Python loop takes to bound its size (this runs per message), and packing is
    also the check that it can be encoded at all.  A bytes payload is only measured."""
    pack = _pack_fn()
    if type(payload) is bytes:
        n = len(payload)
        size = n + (2 if n < 256 else 3 if n < 65536 else 5)  # bin 8, 16 or 32
    else:
        try:
            size = len(pack(payload))
        except (TypeError, ValueError, OverflowError) as e:
            raise _cannot_encode("payload", e) from None
    if header is not None:
        if type(header) is not dict:
            raise InvalidMessage(f"a header is a dict (or None), not {type(header).__name__}")
        kind = header.get(KIND)
        if reserved and type(kind) is str and kind in MEMBERSHIP_KINDS:
            raise InvalidMessage(
                f"header {KIND!r} values join, part and suspect are reserved for membership "
                "messages: the client sends them itself (connect, close, suspect)"
            )
        try:
            size += len(pack(header))
        except (TypeError, ValueError, OverflowError) as e:
            raise _cannot_encode("header", e) from None
    if size > limit:
        raise MessageTooLarge(
            f"a message of {size} bytes exceeds the routers' limit of {limit} bytes "
            "(split it, or start the routers with a larger --max-frame)"
        )
    return size


_KEEP_BUFFER = 1024 * 1024
"""A thread's packer whose output outgrew this is replaced: msgpack keeps a buffer at its
high-water mark, and a batch packed in one call may be large."""


def check_batch(items: list[tuple[Any, Any]], limit: int) -> None:
    """:func:`message_size` of every ``(payload, header)`` of a batch: raises what it
    raises for the first message it refuses.

    The headers, and the payloads that are not bytes, are packed in one call: packing each
    header in a call of its own was a tenth of a busy client's time (``ecast bench``
    at 25,000 msgs/s, py-spy), most of it the call, not the packing.  When the whole
    batch fits in ``limit``, each of its messages does.  Anything else (a header that is
    not a dict, a reserved kind, a value that cannot be encoded, a batch over ``limit``
    in all) is checked again one message at a time, so the error is the one the message
    sent alone would raise."""
    total = 0
    packable: list[Any] = []
    append = packable.append
    for payload, header in items:
        if type(payload) is bytes:
            total += len(payload) + 5  # at most a bin 32's prefix
        else:
            append(payload)
        if header is not None:
            if type(header) is not dict:
                break
            kind = header.get(KIND)
            if type(kind) is str and kind in MEMBERSHIP_KINDS:
                break
            append(header)
    else:
        try:
            data = _pack_fn()(packable)
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            if len(data) > _KEEP_BUFFER:
                _packers.pack = msgpack.Packer(default=plain_default, use_bin_type=True).pack
            if total + len(data) <= limit:
                return
    for payload, header in items:
        message_size(payload, header, limit)


class Client:
    """One application process connected to a router group (see :func:`connect`)."""

    def __init__(
        self,
        name: str,
        runtime: Runtime,
        params: EndpointParams,
        session: Session | None,
        queue_size: int,
        *,
        max_queued: int = 10_000,
        direct_queue_size: int = 10_000,
        ack_timeout: float | None = 30.0,
        unavailable_after: float = 10.0,
    ) -> None:
        self.name = name
        self.runtime = runtime
        self._params = params
        self._session = session
        self._queue: deque[Delivery | None] = deque()
        """Deliveries not yet taken, then ``None`` once the client ended.  A deque and an
        event rather than an ``asyncio.Queue``: a storage process takes thousands of
        deliveries a second, and a queue's ``put``/``get`` per delivery cost more than
        its work.  Unbounded as a container: ``queue_size`` is where reading pauses.
        Frames already read when the mark is crossed still go in; refusing them would
        lose confirmed deliveries."""
        self._queued = asyncio.Event()
        self.received = 0
        """Deliveries handed to this process so far (taken or not): a process that must
        answer a direct message only after the deliveries it had already received (and
        confirmed) compares it with how many it took."""
        self._queue_size = queue_size
        self._paused = False
        self._paused_peers: list[NodeId] = []
        self.max_queued = max_queued
        self.ack_timeout = ack_timeout
        self.unavailable_after = unavailable_after
        self._acks: dict[MsgId, asyncio.Future[Any]] = {}
        self._closes: dict[tuple[str, int], asyncio.Future[SessionsClosed]] = {}
        self._space = asyncio.Event()
        self._joined = asyncio.Event()
        self._welcomed = asyncio.Event()
        self._closed = asyncio.Event()
        self.terminated: str | None = None
        self.suspected_at: int | None = None
        """Declared faulty: the position of the suspect message in the sequence, when a
        router still knew it.  The shipped configs route none of its messages after it."""
        self.error: Exception | None = None
        """Why the client stopped, once it did for any reason but ``close``."""
        self.leader: NodeId | None = None
        self.view = -1
        self.node: Node | None = None
        self.endpoint: Endpoint | None = None
        self._members: set[NodeId] = set()
        self._direct: asyncio.Queue[tuple[NodeId, Any]] = asyncio.Queue()
        self._direct_size = direct_queue_size
        self._direct_paused: dict[NodeId, None] = {}
        self._owns_runtime = False
        self._watch: asyncio.Task[None] | None = None
        self._unreachable_since: float | None = None
        self.state = "connecting"
        """``connecting``, ``connected``, ``reconnecting`` (no router reachable right
        now), ``unavailable`` (none for ``unavailable_after`` seconds: pending calls
        failed), or ``closed``."""
        self.ack_listener: Callable[[list[Ack]], None] | None = None
        """Receives, in batches, the acks of messages sent with ``submit_batch``."""
        self.reject_listener: Callable[[MsgId, Exception], None] | None = None
        """Receives the id and the error of each message sent with ``submit_batch`` that
        the routers refused (its session closed, or forbidden)."""
        self.shed_listener: Callable[[tuple[MsgId, ...]], None] | None = None
        """Receives the ids of unsafe messages the routers did not forward to every
        destination (the router no longer leads, or a destination lagged too far
        behind): what waits for their answers can stop waiting."""
        self.direct_batch_listener: Callable[[NodeId, list[Any]], None] | None = None
        """Receives ``(sender, payloads)``: the direct messages of one frame from one
        peer, in their order, in one call, ahead of :attr:`direct_listener`: a client
        that takes thousands of answers a second handles each frame's in one step.  The
        same rules as :attr:`direct_listener` hold; an exception it raises is logged and
        the rest of those messages dropped, so it should take each message apart."""
        self.direct_listener: Callable[[NodeId, Any], None] | None = None
        """Receives ``(sender, payload)`` of each direct message as it arrives, instead
        of :meth:`receive_direct`: no queue and no task switch per message, for a
        process that handles each at once (a client taking many answers a second).  It
        runs inside the runtime's receive path, so it must not block; an exception it
        raises is logged and the message dropped.  Set it before direct messages arrive:
        reading from a peer that the full queue paused resumes only as
        :meth:`receive_direct` drains the queue."""

    # ------------------------------------------------------------------ setup
    async def _start(
        self, routers: list[str], join: bool, join_header: dict[str, Any], timeout: float
    ) -> None:
        ids: list[NodeId] = []
        errors: list[str] = []
        for address in routers:
            try:
                ids.append(await self.runtime.connect_node(address, timeout))
            except (TimeoutError, OSError, ConnectionError, ValueError) as e:
                errors.append(f"{address}: {e}")
        if not ids:
            raise _unreachable(errors)
        self.endpoint = Endpoint(
            self.name,
            ids,
            self._params,
            self._session,
            incarnation=new_incarnation(),
            role_of=self.runtime.role_of,
        )
        self.node = self.runtime.add_node(
            self.name,
            self.endpoint,
            on_deliver=self._on_upcalls,
            on_directs=self._on_directs,
            keep_connected=self._routers_to_keep,
        )
        self.node.start()
        self.state = "connected"
        self._watch = asyncio.get_running_loop().create_task(self._watch_routers())
        try:
            await asyncio.wait_for(self._welcomed.wait(), timeout)
            if join:
                sid = self._feed(lambda core, now: core.join(now, **join_header))
                fut = self._future_for(sid)
                joined = asyncio.ensure_future(self._joined.wait())
                try:
                    # Joined once the join is delivered to us; a join nobody was to get
                    # (the config refused the name) is acknowledged at once instead.
                    done, _ = await asyncio.wait(
                        (joined, fut), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    joined.cancel()
                if not done:
                    raise TimeoutError
                refused = fut.done() and not fut.exception() and not fut.result().delivered
                if not self._joined.is_set() and refused:
                    raise NameRetiredError(
                        f"{self.name!r} was the name of a process that left; names are "
                        "unique for ever, pick a new one"
                    )
        except TimeoutError:
            raise TimeoutError(
                f"connected to {len(ids)} router(s) but {'the join' if join else 'no answer'} "
                f"did not come back within {timeout:g} s (is a majority of the routers up?)"
            ) from None
        if self.terminated is not None:
            raise self._stopped_error()

    def _routers_to_keep(self) -> list[NodeId]:
        """Stay connected to every router of the succession order, so a new leader reaches
        this process at once."""
        ep = self.endpoint
        return list(ep.succession) if ep is not None else []

    async def _watch_routers(self) -> None:
        """Connection state, and failing pending calls once no router was reachable for
        ``unavailable_after`` seconds."""
        loop = asyncio.get_running_loop()
        while self.terminated is None:
            await asyncio.sleep(0.25)
            ep = self.endpoint
            if ep is None:
                continue
            routes = self.runtime.routes
            down = frozenset(r for r in ep.succession if r not in routes)
            node = self.node
            if down != ep.unreachable and ep.terminated is None and node is not None:
                # Our router's connection is gone: the endpoint moves on now, not after
                # its progress timeout.
                node.feed(lambda core, now, down=down: core.routers_unreachable(down, now))
            reachable = len(down) < len(ep.succession)
            now = loop.time()
            if reachable:
                self._unreachable_since = None
                self.state = "connected"
                continue
            if self._unreachable_since is None:
                self._unreachable_since = now
            if now - self._unreachable_since < self.unavailable_after:
                self.state = "reconnecting"
            elif self.state != "unavailable":
                self.state = "unavailable"
                self._fail_pending(
                    Unavailable(
                        f"no router reachable for {self.unavailable_after:g} s "
                        f"(routers: {', '.join(ep.succession)}); still trying"
                    )
                )

    # ------------------------------------------------------------------ upcalls
    def _on_upcalls(self, node: Node, upcalls: list[Any]) -> None:
        batch: list[Ack] = []
        delivered = 0
        queue = self._queue
        for up in upcalls:
            t = type(up)
            if t is Delivery:
                # Most upcalls, one per message delivered: queued here, with one wakeup
                # and one flow-control check for the whole batch (below).
                h = up.message.header
                if type(h) is dict and h.get(KIND) is not None and not up.unsafe:
                    self._track_membership(h[KIND], up.message)
                queue.append(up)
                delivered += 1
            elif t is Acked:
                fut = self._acks.pop(up.id, None)
                if fut is not None:
                    if not fut.done():
                        fut.set_result(up)
                elif self.endpoint is not None and up.id[0] == self.endpoint.session:
                    batch.append(up)
                self._space.set()
            elif t is Rejected:
                fut = self._acks.pop(up.id, None)
                if fut is not None:
                    if not fut.done():
                        fut.set_exception(_rejection(up))
                elif self.reject_listener is not None:
                    self.reject_listener(up.id, _rejection(up))
                self._space.set()
            elif t is SessionsClosed:
                for key in [k for k in self._closes if k[0] == up.namespace and k[1] <= up.epoch]:
                    fut = self._closes.pop(key)
                    if not fut.done():
                        fut.set_result(up)
            elif t is CloseForbidden:
                fut = self._closes.pop((up.namespace, up.epoch), None)
                if fut is not None and not fut.done():
                    fut.set_exception(
                        ForbiddenError(
                            f"closing sessions of {up.namespace!r}: this process's credential "
                            "does not cover that namespace (or it is reserved); nothing closed"
                        )
                    )
            elif t is LeaderChanged:
                self.view = up.view
                self.leader = up.succession[0] if up.succession else None
            elif t is Shed:
                if self.shed_listener is not None:
                    self.shed_listener(up.ids)
            elif t is Terminated:
                self._on_terminated(up.reason, up.at)
        if delivered:
            self.received += delivered
            self._queued.set()
            # (not once it ended: the queue's end marker is no delivery to read)
            if not self._paused and self.terminated is None and len(queue) >= self._queue_size:
                self._pause_routers(True)
        if batch and self.ack_listener is not None:
            self.ack_listener(batch)
        ep = self.endpoint
        if ep is not None:
            if ep.joined_at is not None:
                self._joined.set()
            if ep.max_message is not None:
                self._welcomed.set()

    def _track_membership(self, kind: str, m: Any) -> None:
        if kind == JOIN:
            if m.sender == self.name and type(m.payload) is dict:
                members = m.payload.get("members")
                if type(members) in (list, tuple):
                    self._members = {p for p in members if type(p) is str}
            self._members.add(m.sender)
        elif kind == PART:
            self._members.discard(m.sender)
        elif kind == SUSPECT:
            who = m.header.get(WHO) if type(m.header) is dict else None
            if type(who) in (list, tuple):
                self._members.difference_update(p for p in who if type(p) is str)

    def _on_terminated(self, reason: str, at: int | None = None) -> None:
        self.terminated = reason
        self.suspected_at = at
        self._closed.set()
        self._end_deliveries()
        if reason == "suspected":
            where = f" at t={at}" if at is not None else ""
            self.error = SuspectedError(
                f"{self.name} was declared faulty{where} (silent past its lease, or suspected"
                " by a peer); it stops for good, a new process takes a new name"
            )
        if reason not in ("closed", "detached"):
            self.state = "closed"
            self._fail_pending(self._stopped_error())

    def _stopped_error(self) -> ClosedError:
        if self.error is not None and isinstance(self.error, ClosedError):
            return self.error
        return ClosedError(f"client {self.name} is {self.terminated or 'closed'}")

    def _fail_pending(self, error: Exception) -> None:
        for futs in (self._acks, self._closes):
            for fut in futs.values():
                if not fut.done():
                    fut.set_exception(error)
            futs.clear()
        self._space.set()

    def _pause_routers(self, paused: bool) -> None:
        """A full delivery queue stops reading from the routers only: a peer's direct
        stream (a migration) must not stall behind the application's deliveries."""
        if paused:
            ep = self.endpoint
            self._paused_peers = list(ep.succession) if ep is not None else []
        self._paused = paused
        self.runtime.pause_reading(paused, self._paused_peers)

    # ------------------------------------------------------------------ submitting
    def _open_node(self) -> Node:
        if self.terminated is not None or self.node is None:
            raise self._stopped_error() if self.terminated else ClosedError("not connected")
        return self.node

    def _feed(self, call: Callable[[Endpoint, float], tuple[Any, Effects]]) -> Any:
        """Run one submitting step on the endpoint and return what it numbered."""
        node = self._open_node()
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

    def _future_for(self, sid: MsgId) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.runtime.loop.create_future()
        fut.add_done_callback(_retrieved)
        self._acks[sid] = fut
        return fut

    @property
    def max_message(self) -> int:
        """The largest message (packed payload and header) the routers accept."""
        ep = self.endpoint
        return ep.max_message if ep is not None and ep.max_message else DEFAULT_MAX_MESSAGE

    def submit_nowait(
        self, payload: Any, header: dict[str, Any] | None = None
    ) -> asyncio.Future[Ack]:
        """Queue a message without waiting for window space; return its ack future.

        Raises :class:`Backpressure` when ``max_queued`` messages already wait for the
        window: a caller that never waits must still be told to slow down."""
        message_size(payload, header, self.max_message)
        ep = self.endpoint
        if ep is not None and len(ep.queued) >= self.max_queued:
            raise Backpressure(
                f"{len(ep.queued)} messages already wait for window space; await "
                "enqueue() or submit() to wait for room"
            )
        return self._future_for(self._feed(lambda core, now: core.submit(payload, header, now)))

    async def enqueue(
        self,
        payload: Any,
        header: dict[str, Any] | None = None,
        *,
        timeout: float | None = -1.0,
    ) -> asyncio.Future[Ack]:
        """Submit once the send window has room (E-Cast's flow control pushing back);
        return the ack future: the pipelined form of :meth:`submit`.  ``timeout`` bounds
        the wait for room (default: the client's ``ack_timeout``)."""
        message_size(payload, header, self.max_message)
        if timeout is not None and timeout < 0:
            timeout = self.ack_timeout
        try:
            return await asyncio.wait_for(self._enqueue(payload, header), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"no room in the send window within {timeout:g} s (state: {self.state}): "
                "earlier messages are not becoming stable"
            ) from None

    async def _enqueue(self, payload: Any, header: dict[str, Any] | None) -> asyncio.Future[Ack]:
        ep = self.endpoint
        while ep is not None and len(ep.queued) >= self.max_queued and self._alive():
            self._space.clear()
            await self._space.wait()
        fut = self.submit_nowait(payload, header)
        while ep is not None and ep.queued and self._alive():
            self._space.clear()
            await self._space.wait()
        return fut

    async def room(self, timeout: float | None = -1.0) -> None:
        """Wait until the send window has room for another message (E-Cast's flow control
        pushing back), at most ``timeout`` (default: the client's ``ack_timeout``)."""
        if timeout is not None and timeout < 0:
            timeout = self.ack_timeout
        ep = self.endpoint
        if ep is None or not ep.queued or not self._alive():
            # Room now (most calls, one per write of a busy client): no task and no
            # timer of ``wait_for`` around a wait that would end at once.
            return

        async def wait() -> None:
            while ep is not None and ep.queued and self._alive():
                self._space.clear()
                await self._space.wait()

        try:
            await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"no room in the send window within {timeout:g} s (state: {self.state}): "
                "earlier messages are not becoming stable"
            ) from None

    def submit_unsafe_nowait(self, items: list[tuple[Any, Any]]) -> list[MsgId]:
        """:meth:`submit_unsafe_batch` without waiting for a backed-up connection (the
        caller paces itself)."""
        check_batch(items, self.max_message)
        self._open_node()
        ids: list[MsgId] = self._feed(lambda core, now: core.submit_unsafe_numbered(items, now))
        return ids

    async def submit(
        self, payload: Any, header: dict[str, Any] | None = None, *, timeout: float | None = -1.0
    ) -> Ack:
        """Submit and wait until the message is stable: every destination delivered it.
        ``timeout`` defaults to the client's ``ack_timeout`` (None: wait for ever)."""
        fut = await self.enqueue(payload, header, timeout=timeout)
        return await self._wait(fut, timeout, "the acknowledgement")

    def submit_batch(self, items: list[tuple[Any, Any]]) -> list[MsgId]:
        """Queue many ``(payload, header)`` messages at once, without a future each.

        Their acknowledgements go to ``ack_listener`` in batches: the cheapest way to
        keep thousands of messages in flight (benchmarks, bulk loaders)."""
        check_batch(items, self.max_message)
        ep = self.endpoint
        if ep is not None and len(ep.queued) >= self.max_queued:
            raise Backpressure(
                f"{len(ep.queued)} messages already wait for window space (max_queued)"
            )
        ids: list[MsgId] = self._feed(lambda core, now: core.submit_many(items, now))
        return ids

    async def submit_unsafe(
        self,
        payload: Any,
        header: dict[str, Any] | None = None,
        *,
        timeout: float | None = -1.0,
    ) -> MsgId | None:
        """Forward without agreement: no ack, accepted by receivers only if it fits.

        Unsafe messages bypass the congestion window; this waits instead while the
        connection to the routers is backed up, at most ``timeout`` (default: the
        client's ``ack_timeout``; then :class:`TimeoutError`, nothing sent).  Returns the
        message's id (None if this client has ended): ``shed_listener`` names it if a
        router did not forward it to every destination."""
        ids = await self.submit_unsafe_batch([(payload, header)], timeout=timeout)
        return ids[0] if ids else None

    async def submit_unsafe_batch(
        self, items: list[tuple[Any, Any]], *, timeout: float | None = -1.0
    ) -> list[MsgId]:
        """Many unsafe ``(payload, header)`` messages at once (see ``submit_unsafe``);
        their ids, in order."""
        check_batch(items, self.max_message)
        self._open_node()
        if timeout is not None and timeout < 0:
            timeout = self.ack_timeout
        try:
            await asyncio.wait_for(self.runtime.writable(), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"a connection stayed backed up for {timeout:g} s (state: {self.state}); "
                "nothing was sent"
            ) from None
        ids: list[MsgId] = self._feed(lambda core, now: core.submit_unsafe_numbered(items, now))
        return ids

    def durable(self, upto: int) -> None:
        """Everything delivered up to ``upto`` is on disk here: confirm it.  Only for a
        client connected with ``EndpointParams(confirm_when_durable=True)``, whose
        deliveries are confirmed no sooner: a message becomes stable, and its sender
        acknowledged, once every destination has said so."""
        with contextlib.suppress(ClosedError):
            self._feed(lambda core, now: (None, core.durable(upto, now)))

    async def suspect(self, processes: list[NodeId], *, timeout: float | None = -1.0) -> Ack:
        """Ask the group to declare ``processes`` faulty; return once that is ordered and
        stable.  Control messages never wait behind this process's data window."""
        if not processes or not all(type(p) is str for p in processes):
            raise InvalidMessage("suspect() takes a non-empty list of process names")
        fut = self._future_for(self._feed(lambda core, now: core.suspect(list(processes), now)))
        return await self._wait(fut, timeout, "the suspect's acknowledgement")

    async def close_sessions(
        self, namespace: str, epoch: int, *, timeout: float | None = -1.0
    ) -> SessionsClosed:
        """Close every session of ``namespace`` with an epoch up to ``epoch``, in the total
        order; later messages of those sessions are refused (:class:`SessionClosedError`).
        Re-sent to each new leader until the routers answer.  Only a process whose
        credential covers ``namespace`` may close it (:class:`ForbiddenError`)."""
        if type(namespace) is not str or not namespace or type(epoch) is not int or epoch < 0:
            raise InvalidMessage("close_sessions(namespace: str, epoch: int >= 0)")
        problem = _session_problem(self.runtime, (namespace, epoch, ""))
        if problem:
            raise ForbiddenError(problem)
        key = (namespace, epoch)
        fut = self._closes.get(key)
        if fut is None:
            fut = self._closes[key] = self.runtime.loop.create_future()
            fut.add_done_callback(_retrieved)
            self._open_node().feed(lambda core, now: core.close_sessions(namespace, epoch, now))
        return await self._wait(fut, timeout, "the sessions' close")  # type: ignore[no-any-return]

    async def _wait(self, fut: asyncio.Future[Any], timeout: float | None, what: str) -> Any:
        if timeout is not None and timeout < 0:
            timeout = self.ack_timeout
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{what} did not come within {timeout:g} s (state: {self.state}); the "
                "message is still in flight and may yet be delivered"
            ) from None

    def _alive(self) -> bool:
        return self.terminated is None

    # ------------------------------------------------------------------ delivering
    async def deliveries(self, *, include_membership: bool = True) -> AsyncIterator[Delivery]:
        """Deliveries in ``t`` order, exactly once.  Membership messages (join, part,
        suspect) come too, with ``d.kind`` set, unless ``include_membership`` is False;
        unsafe ones say whether they were accepted (``d.accepted``)."""
        queue = self._queue
        while True:
            # One at a time off the deque (not a batch held here): a caller that breaks
            # out of the loop leaves every later delivery for its next loop.
            await self._wait_queued()
            d = queue[0]
            if d is None:
                if self.error is not None:
                    raise self.error
                return
            queue.popleft()
            self._taken()
            if not include_membership and d.message.kind is not None:
                continue
            yield d

    async def delivery_batch(self, max_items: int = 512) -> list[Delivery]:
        """The deliveries waiting now, in ``t`` order, at most ``max_items`` (waits for at
        least one).  ``[]`` once the client has ended (closed, suspected, detached), and
        for ever after; raises the error that ended it, if one did.  The form for
        processes that apply deliveries in batches: one call, not one per delivery."""
        queue = self._queue
        await self._wait_queued()
        out: list[Delivery] = []
        while queue and len(out) < max_items:
            d = queue[0]
            if d is None:  # the end stays, for every later call
                break
            out.append(queue.popleft())
        self._taken()
        if not out and self.error is not None:
            raise self.error
        return out

    async def _wait_queued(self) -> None:
        while not self._queue:
            self._queued.clear()
            await self._queued.wait()

    def _taken(self) -> None:
        """Deliveries left the queue: read from the routers again once half of it is free."""
        if self._paused and len(self._queue) <= self._queue_size // 2:
            self._pause_routers(False)

    def _end_deliveries(self) -> None:
        self._queue.append(None)
        self._queued.set()

    def peers(self) -> list[NodeId]:
        """Every process the routers told us listens somewhere (their address
        directory): how a light client finds, say, the processes of a role."""
        return sorted(self.runtime.directory)

    def members(self) -> frozenset[NodeId]:
        """The members this process knows: those of its own join, then every join, part
        and suspect delivered to it (a config that delivers membership messages to every
        member, as ``BroadcastConfig`` does, keeps this exact)."""
        return frozenset(self._members)

    # ------------------------------------------------------------------ direct channel
    def _on_directs(self, src: NodeId, payloads: list[Any]) -> None:
        batch = self.direct_batch_listener
        if batch is not None:
            try:
                batch(src, payloads)
            except Exception:
                log.exception("event=direct_listener_failed from=%s", src)
            return
        listener = self.direct_listener
        if listener is not None:
            for payload in payloads:
                try:
                    listener(src, payload)
                except Exception:
                    log.exception("event=direct_listener_failed from=%s", src)
            return
        for payload in payloads:
            self._direct.put_nowait((src, payload))
        if self._direct.qsize() >= self._direct_size and src not in self._direct_paused:
            self._direct_paused[src] = None
            self.runtime.pause_reading(True, [src])

    def send_direct_nowait(self, peer: NodeId, payload: Any) -> None:
        """Send to another application process directly (authenticated, FIFO, not ordered
        with E-Cast messages), without waiting for the peer to keep up."""
        limit = self.runtime.max_frame - 64 * 1024
        if type(payload) is bytes:
            message_size(payload, None, limit)
        else:
            # The size check packs the payload; the wire takes those bytes as they are.
            data = _packed(payload, "payload")
            if len(data) > limit:
                raise MessageTooLarge(
                    f"a direct message of {len(data)} bytes exceeds the limit of {limit} bytes"
                )
            payload = Packed(data)
        self._open_node().send_direct(peer, payload)

    async def send_direct(
        self,
        peer: NodeId,
        payload: Any,
        *,
        high_water: int = 1024,
        timeout: float | None = -1.0,
    ) -> None:
        """Send directly and wait while the peer lags: more than ``high_water`` messages
        not yet acknowledged by its link, or its connection's buffer over its mark."""
        self.send_direct_nowait(peer, payload)
        await self.send_direct_drained(peer, high_water, timeout=timeout)

    async def send_direct_drained(
        self, peer: NodeId, high_water: int = 1024, *, timeout: float | None = -1.0
    ) -> None:
        """Wait while ``peer`` lags by more than ``high_water`` direct messages (or its
        connection is congested): the backpressure of many ``send_direct_nowait``.  At
        most ``timeout`` (default: the client's ``ack_timeout``), then
        :class:`TimeoutError`: a peer that does not read cannot hold its sender for
        ever."""
        node = self._open_node()
        if timeout is not None and timeout < 0:
            timeout = self.ack_timeout
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        await asyncio.sleep(0)  # let the runtime write it: the peer's lag shows only then
        while node.lag(peer) > high_water and self._alive():
            if deadline is not None and asyncio.get_running_loop().time() >= deadline:
                raise TimeoutError(
                    f"{peer} lagged by more than {high_water} direct messages for {timeout:g} s"
                )
            await asyncio.sleep(0.005)

    async def receive_direct(self, *, timeout: float | None = None) -> tuple[NodeId, Any]:
        """The next ``(sender, payload)`` another application process sent directly."""
        item = await asyncio.wait_for(self._direct.get(), timeout)
        if self._direct_paused and self._direct.qsize() <= self._direct_size // 2:
            peers = list(self._direct_paused)
            self._direct_paused.clear()
            self.runtime.pause_reading(False, peers)
        return item

    async def serve(self, listen: str = "127.0.0.1:0") -> str:
        """Accept direct connections on ``listen`` (port 0 picks a free one); return the
        address to give peers.  ``connect(listen=...)`` does this before the handshake,
        so the routers gossip the address; serving later works for peers you tell."""
        self._open_node()
        return await self.runtime.serve(listen)

    async def connect_peer(self, address: str, timeout: float = 5.0) -> NodeId:
        """Open an authenticated connection to the application process serving at
        ``address``; return its node id, for ``send_direct``."""
        self._open_node()
        try:
            return await self.runtime.connect_node(address, timeout)
        except (OSError, ConnectionError) as e:
            raise _unreachable([f"{address}: {e}"]) from None

    # ------------------------------------------------------------------ leaving
    async def close(self, timeout: float = 10.0) -> None:
        """Part gracefully: wait (up to ``timeout``) for the data window to drain, submit
        the part, wait until it is delivered, and stop.  Raises
        :class:`PartFailedError` when the part did not get through in time; every pending
        acknowledgement is resolved (with :class:`ClosedError`) either way."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        node, ep = self.node, self.endpoint
        failure: Exception | None = None
        if node is not None and ep is not None and self.terminated is None:
            drained_by = loop.time() + timeout / 2  # the other half is the part's
            while ep.window and loop.time() < drained_by and self._alive():
                self._space.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._space.wait(), drained_by - loop.time())
            if self.terminated is None:
                node.feed(lambda core, now: core.close(now)[1])
                try:
                    await asyncio.wait_for(self._closed.wait(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    failure = PartFailedError(
                        f"{self.name}'s part was not delivered within {timeout:g} s "
                        f"(state: {self.state}); the group counts it as a member until its "
                        "lease runs out"
                    )
            # Linger a moment so the part's stable confirmation goes out (docs/decisions.md).
            while ep.lingering and loop.time() < deadline:
                await asyncio.sleep(0.02)
            if self.terminated == "suspected" and failure is None:
                failure = self.error
        await self._shutdown()
        if failure is not None:
            raise failure

    async def detach(self, timeout: float = 10.0) -> None:
        """Leave without a part, as a process that never joined does: wait (up to
        ``timeout``) until everything submitted is acknowledged, tell the router, stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        ep, node = self.endpoint, self.node
        if ep is not None and node is not None and self.terminated is None:
            while ep.waiting() and loop.time() < deadline and self._alive():
                self._space.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._space.wait(), deadline - loop.time())
            if self.terminated is None:
                node.feed(lambda core, now: core.detach(now))
                self.runtime.flush()
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self.terminated is None:
            self.terminated = "closed"
            self._end_deliveries()
        self.state = "closed"
        self._fail_pending(ClosedError(f"client {self.name} closed"))
        if self._watch is not None:
            self._watch.cancel()
        if self.node is not None:
            await self.node.stop()
        if self._owns_runtime:
            await self.runtime.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.state == "closed":
            return
        leave = self.close if self.endpoint and self.endpoint.joined_at is not None else None
        if exc is None:
            await (leave() if leave is not None else self.detach())
            return
        # Leaving after an error: best effort and brief, and the caller's error stands.
        with contextlib.suppress(ecast_errors.Error, TimeoutError, OSError):
            await (leave(2.0) if leave is not None else self.detach(2.0))
        await self._shutdown()


def _session_problem(rt: Runtime, session: Any) -> str | None:
    if (
        type(session) is not tuple
        or len(session) != 3
        or type(session[0]) is not str
        or not session[0]
        or type(session[1]) is not int
        or type(session[2]) is not str
    ):
        return "session is (namespace: str, epoch: int, stream: str)"
    namespace = session[0]
    if namespace[:1] == "@":
        return f"namespace {namespace!r:.80}: names starting with @ belong to the routers"
    if not rt.identity.covers(namespace):
        return (
            f"session namespace {namespace!r:.80} is not covered by this process's "
            f"{rt.identity.describe()}: a session's namespace is a name, and only a "
            "credential that covers it may submit in it"
        )
    return None


def _rejection(up: Rejected) -> Exception:
    if up.reason == "forbidden":
        return ForbiddenError(
            f"{up.id}: this process's credential does not cover the session's namespace; not routed"
        )
    return SessionClosedError(f"{up.id}: its session was closed; not routed")


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """An acknowledgement nobody awaits may fail (the client closed): that is no error."""
    if not fut.cancelled():
        fut.exception()


def _unreachable(errors: list[str]) -> Unavailable:
    text = "; ".join(errors)
    if "wrong secret" in text:
        return AuthenticationError(
            f"a router refused this process's secret (pass secret= or set ECAST_SECRET to "
            f"the cluster's): {text}"
        )
    if "authentication" in text or "credential" in text or "development secret" in text:
        return AuthenticationError(f"a router refused this process's credential: {text}")
    if "HTTP answered" in text:
        return NotARouterError(f"not an E-Cast router (HTTP answered): {text}")
    return Unavailable(f"no router reachable: {text}")


class _Connecting:
    """What :func:`connect` returns: await it, or use it as ``async with``."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Client | None = None

    def __await__(self) -> Generator[Any, None, Client]:
        return self._make().__await__()  # type: ignore[no-any-return]

    async def __aenter__(self) -> Client:
        self._client = await self._make()
        return self._client

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._client is not None:
            await self._client.__aexit__(exc_type, exc, tb)


def connect(
    routers: list[str],
    name: str,
    *,
    secret: bytes | str | None = None,
    credentials: str | Path | None = None,
    runtime: Runtime | None = None,
    params: EndpointParams | None = None,
    session: Session | None = None,
    join: bool = True,
    join_header: dict[str, Any] | None = None,
    listen: str | None = None,
    lease: float | None = None,
    queue_size: int = 10_000,
    max_queued: int = 10_000,
    direct_queue_size: int = 10_000,
    timeout: float = 10.0,
    ack_timeout: float | None = 30.0,
    unavailable_after: float = 10.0,
    tls: ssl.SSLContext | None = None,
    tls_server: ssl.SSLContext | None = None,
    source: str | None = None,
) -> _Connecting:
    """Connect to a router group (any of ``routers``, given as HOST:PORT) and join it.

    - ``credentials``: this process's credential file (``ecast credentials issue --role
      application --name PATTERN``), or ``$ECAST_CREDENTIALS``; it must cover ``name``.
    - ``secret``: the development mode's cluster secret (or ``$ECAST_SECRET``): any
      holder may take any name and role, so it is for development only
      (``docs/security.md``).
    - ``tls``: a client TLS context for the routers (with the client certificate, since
      routers with TLS require one); ``tls_server``: a server context for the direct
      connections this process accepts (``listen``).
    - ``join=False``: a light client that only submits (under a config that accepts
      non-members) and leaves with ``detach()``.
    - ``session``: the data session ``(namespace, epoch, stream)``; a process that takes
      over another's session resubmits with the same sequence numbers and the routers
      keep one copy of each (exactly-once ingestion).  Its namespace is a name that the
      credential must cover (:class:`ForbiddenError` otherwise), so only processes that
      could take the name itself can take over its sessions.
    - ``listen``: serve direct connections on this address before connecting, so the
      routers gossip it and peers can reach this process (``join_header`` may carry it).
    - ``source``: the local address this process's connections leave from (a host with
      several addresses); None: the kernel's choice.
    - ``lease``: seconds this process may stay silent before it is suspected (the routers
      cap it; None: their default).
    - ``timeout``: for connecting and joining; ``ack_timeout``: default for each wait on
      an acknowledgement; ``unavailable_after``: how long no router may be reachable
      before pending calls fail with :class:`Unavailable`.
    """
    check_name(name)
    if not routers or not all(type(r) is str and ":" in r for r in routers):
        raise ValueError("routers is a non-empty list of HOST:PORT strings")

    async def make() -> Client:
        rt = runtime
        owns = rt is None
        if rt is None:
            try:
                auth = load_auth(credentials, secret)
            except (ValueError, OSError) as e:
                raise AuthenticationError(str(e)) from None
            rt = Runtime(
                auth,
                host_id=f"{name}-{os.getpid()}",
                client_ssl=tls,
                server_ssl=tls_server,
                source_address=source,
            )
            if not rt.identity.covers(name):
                raise AuthenticationError(
                    f"this process's credential covers {', '.join(rt.identity.names)}, "
                    f"not the name {name!r}"
                )
        if listen is not None:
            await rt.serve(listen)
        p = params or EndpointParams()
        if lease is not None:
            if lease <= 0:
                raise ValueError("lease is a positive number of seconds")
            from dataclasses import replace

            p = replace(p, lease=float(lease))
        if session is not None:
            problem = _session_problem(rt, session)
            if problem:
                raise ForbiddenError(problem)
        client = Client(
            name,
            rt,
            p,
            session,
            queue_size,
            max_queued=max_queued,
            direct_queue_size=direct_queue_size,
            ack_timeout=ack_timeout,
            unavailable_after=unavailable_after,
        )
        client._owns_runtime = owns
        try:
            await client._start(routers, join, join_header or {}, timeout)
        except BaseException:
            await client._shutdown()
            raise
        return client

    return _Connecting(make)
