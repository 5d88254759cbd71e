"""The daemons' HTTP server on a real socket: routes, bodies, keep-alive, and bad input
(malformed requests, huge headers and bodies, unknown paths and methods, a handler that
fails, clients that stall) answered with a clear status, the server still serving."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ecast.tools import http
from ecast.tools.http import HttpServer, Request, Response, json_response, text_response


async def _echo(req: Request) -> Response:
    return json_response(
        {"method": req.method, "path": req.path, "query": req.query,
         "auth": req.header("Authorization"), "body": req.json() if req.body else None}
    )  # fmt: skip


async def _boom(_req: Request) -> Response:
    raise RuntimeError("a bug in a handler")


def serve(test: Callable[[HttpServer], Awaitable[None]]) -> None:
    async def go() -> None:
        server = HttpServer()
        server.add_get("/echo", _echo)
        server.add_post("/echo", _echo)
        server.add_get("/boom", _boom)
        server.add_get("/page", lambda _r: _page())
        await server.start("127.0.0.1", 0)
        try:
            await test(server)
        finally:
            await server.cleanup()

    asyncio.run(go())


async def _page() -> Response:
    return text_response("<p>hi</p>", "text/html", {"X-Frame-Options": "DENY"})


async def exchange(server: HttpServer, raw: bytes, read_all: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read() if read_all else reader.read(65536), 5)
    writer.close()
    return data


def parse(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode()


def test_routes_answer_with_their_status_type_and_body() -> None:
    async def t(server: HttpServer) -> None:
        status, headers, body = parse(
            await exchange(server, get("/echo?a=1", "Authorization: Bearer t\r\n"))
        )
        assert status == 200 and headers["content-type"].startswith("application/json")
        assert json.loads(body) == {"method": "GET", "path": "/echo", "query": "a=1",
                                    "auth": "Bearer t", "body": None}  # fmt: skip
        status, headers, body = parse(await exchange(server, get("/page")))
        assert (status, body) == (200, b"<p>hi</p>") and headers["x-frame-options"] == "DENY"
        payload = json.dumps({"op": "expand"}).encode()
        raw = (f"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload  # fmt: skip
        status, _, body = parse(await exchange(server, raw))
        assert status == 200 and json.loads(body)["body"] == {"op": "expand"}

    serve(t)


def test_a_kept_alive_connection_serves_requests_one_after_another() -> None:
    async def t(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for i in range(3):
            writer.write(f"GET /echo?i={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert json.loads(await reader.readexactly(length))["query"] == f"i={i}"
        writer.close()

    serve(t)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (get("/nowhere"), 404),
        (get("/boom"), 500),
        (b"DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /echo HTTP/1.1\r\nNo-Host-Header-And-Bad Line\r\n\r\n", 400),
        (b"GET /echo HTTP/1.1\r\nHost: x\r\nContent-Length: nine\r\n\r\n", 400),
        (b"GET /echo HTTP/1.1\r\nHost: x\r\nX: " + b"a" * (http.MAX_HEAD + 10) + b"\r\n\r\n", 431),
        (
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (http.MAX_BODY + 1),
            413,
        ),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n\xff\xfe{}}", 500),
    ],
)
def test_bad_input_gets_a_clear_status_and_the_server_goes_on(raw: bytes, status: int) -> None:
    async def t(server: HttpServer) -> None:
        got, headers, body = parse(await exchange(server, raw))
        assert got == status, body
        assert headers["content-type"].startswith("application/json") and b"error" in body
        again, _, _ = parse(await exchange(server, get("/echo")))
        assert again == 200

    serve(t)


def test_a_chunked_body_past_the_limit_is_refused_while_it_arrives() -> None:
    async def t(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b"a" * 65536)
        sent = 0
        try:
            while sent <= 2 * http.MAX_BODY:  # the server answers past MAX_BODY, not at the end
                writer.write(chunk)
                await writer.drain()
                sent += 65536
        except ConnectionError:
            pass
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert parse(data)[0] == 413

    serve(t)


def test_a_stalled_client_is_disconnected(monkeypatch: Any) -> None:
    monkeypatch.setattr(http, "REQUEST_TIMEOUT", 0.3)
    monkeypatch.setattr(http, "IDLE_TIMEOUT", 0.3)

    async def t(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /echo HTTP/1.1\r\nHo")  # and nothing more
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        idle_reader, _ = await asyncio.open_connection("127.0.0.1", server.port)
        assert await asyncio.wait_for(idle_reader.read(), 5) == b""
        status, _, _ = parse(await exchange(server, get("/echo")))
        assert status == 200

    serve(t)
