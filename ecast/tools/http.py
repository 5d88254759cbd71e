"""The daemons' small HTTP server: ``/metrics``, ``/health`` and a super's admin API.

Every daemon serves a handful of routes to Prometheus, health checks, operators' tools
and a browser.  A web framework costs each process about 0.3 s of CPU to import (its
client side builds TLS contexts at import), which every router, storage process and
super paid at start and on every restart; this server parses with ``h11`` (sans-IO,
strict) on asyncio streams and costs a few milliseconds.

Bad input gets a clear status and never more than its connection: a malformed request
400, headers past ``MAX_HEAD`` 431, a body past ``MAX_BODY`` 413, an unknown path 404,
a wrong method 405, a handler's exception 500 (logged); a client that sends nothing for
``IDLE_TIMEOUT`` seconds, or trickles a request for longer than ``REQUEST_TIMEOUT``, is
disconnected.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h11

log = logging.getLogger("ecast.http")

MAX_HEAD = 16 * 1024
"""Bytes of request line and headers."""
MAX_BODY = 1 << 20
"""Bytes of request body (an admin request is a few hundred)."""
IDLE_TIMEOUT = 30.0
"""Seconds a kept-alive connection may wait for its next request."""
REQUEST_TIMEOUT = 10.0
"""Seconds a request may take to arrive once it began."""
MAX_CONNECTIONS = 256
"""Connections open at once; more are closed at once (a scraper needs one)."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    """Lower-case names; a repeated header keeps its last value."""
    body: bytes = b""

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    def json(self) -> Any:
        """The body as JSON (``UnicodeDecodeError`` or ``json.JSONDecodeError`` if not)."""
        return json.loads(self.body.decode("utf-8"))


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        status, json.dumps(value).encode(), "application/json; charset=utf-8", headers or {}
    )


def text_response(
    text: str, content_type: str = "text/plain", headers: dict[str, str] | None = None
) -> Response:
    return Response(200, text.encode(), f"{content_type}; charset=utf-8", headers or {})


Handler = Callable[[Request], Awaitable[Response]]

REASONS = {400: "bad request", 404: "no such path", 405: "method not allowed",
           413: "request body too large", 431: "request headers too large",
           500: "internal error", 503: "busy"}  # fmt: skip


class HttpServer:
    """Routes by method and exact path.  ``add_get``/``add_post`` before ``start``;
    ``cleanup`` closes the listener and every open connection."""

    def __init__(self) -> None:
        self.routes: dict[str, dict[str, Handler]] = {}
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    def add_get(self, path: str, handler: Handler) -> None:
        self.routes.setdefault(path, {})["GET"] = handler

    def add_post(self, path: str, handler: Handler) -> None:
        self.routes.setdefault(path, {})["POST"] = handler

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def cleanup(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._conns) >= MAX_CONNECTIONS:
            writer.close()
            return
        self._conns.add(task)
        try:
            await self._connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, h11.ProtocolError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        while True:
            try:
                request = await self._request(conn, reader)
            except h11.RemoteProtocolError as e:  # 431 past MAX_HEAD, else 400
                await self._send(conn, writer, _error(e.error_status_hint, str(e)))
                return
            except _TooLarge as e:
                await self._send(conn, writer, _error(e.status))
                return
            if request is None:
                return
            response = await self._dispatch(request)
            await self._send(conn, writer, response)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # not kept alive (or the body was not read to its end)
            conn.start_next_cycle()

    async def _request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Request | None:
        """The next request on ``conn``, or ``None`` when the client closed it."""
        head: h11.Request | None = None
        body = bytearray()
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        """Once a request began: when all of it must have come."""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                wait = IDLE_TIMEOUT if deadline is None else max(0.0, deadline - loop.time())
                data = await asyncio.wait_for(reader.read(65536), wait)
                conn.receive_data(data)
                if data and deadline is None:
                    deadline = loop.time() + REQUEST_TIMEOUT
                continue
            if isinstance(event, h11.Request):
                # h11 bounds what it buffers of an incomplete head; a head that came
                # whole in one read is bounded here.
                head = event
                if len(event.target) + sum(len(k) + len(v) for k, v in event.headers) > MAX_HEAD:
                    raise _TooLarge(431)
                length = _content_length(event)
                if length is not None and length > MAX_BODY:
                    raise _TooLarge(413)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise _TooLarge(413)
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                target = head.target.decode("ascii", "replace")
                path, _, query = target.partition("?")
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
                return Request(head.method.decode("ascii", "replace"), path, query, headers,
                               bytes(body))  # fmt: skip
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None

    async def _dispatch(self, request: Request) -> Response:
        methods = self.routes.get(request.path)
        if methods is None:
            return _error(404)
        handler = methods.get(request.method)
        if handler is None:
            return _error(405, headers={"Allow": ", ".join(sorted(methods))})
        try:
            return await handler(request)
        except Exception:
            log.exception("event=http_handler_failed path=%s", request.path)
            return _error(500)

    async def _send(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, response: Response
    ) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers.items(),
        ]
        if response.status >= 400:
            headers.append(("Connection", "close"))
        try:
            data = conn.send(h11.Response(status_code=response.status, headers=headers))
            data += conn.send(h11.Data(data=response.body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            return
        writer.write(data)
        await writer.drain()


class _TooLarge(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _content_length(head: h11.Request) -> int | None:
    for k, v in head.headers:
        if k == b"content-length":
            return int(v)
    return None


def _error(status: int, why: str = "", headers: dict[str, str] | None = None) -> Response:
    text = REASONS.get(status, "error") + (f": {why}" if why else "")
    return json_response({"error": text}, status, headers)
