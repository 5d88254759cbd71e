"""``rubberband storage`` and ``rubberband super``: the Rubberband daemons.

Both are E-Cast application processes that join the group under their role's name
prefix and listen for direct connections (results, migration streams, heartbeats).  A
storage daemon joins in standby and waits for a super to place it; a super keeps a
replica of the configuration, heartbeats every storage process and super and votes
against the silent ones, answers clients' keyspace queries, and serves the admin API
(HTTP, guarded by a bearer token) that turns requests into keyspace messages.

Logs are ``key=value`` lines; ``/health`` answers on the admin (super) or ``--metrics``
(storage) address.  A bad flag or an unreachable cluster exits with status 2 and one
line that says what is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import importlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

import ecast
from rubberband.host import StorageHost, SuperHost
from rubberband.storage import StorageCore
from rubberband.super import Refused, SuperCore

ENGINES = {
    "memory": "storage_adapters.memory:MemoryEngine",
    "null": "storage_adapters.null:NullEngine",
    "scan": "storage_adapters.scan.engine:ScanEngine",
}
log = logging.getLogger("rubberband")


class UsageError(Exception):
    pass


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--name", required=True, help="process name with its role prefix")
    ap.add_argument("--routers", required=True, help="HOST:PORT[,HOST:PORT...] of routers")
    ap.add_argument("--credentials", help="this process's credential file (production)")
    ap.add_argument("--secret-file", help="the development mode's cluster secret")
    ap.add_argument(
        "--listen", default="127.0.0.1:0", help="direct connections (default: any port)"
    )
    ap.add_argument("--state-dir", help="the local cluster's state directory (for tools)")
    ap.add_argument("--log-level", default="info")


def _auth(args: argparse.Namespace) -> dict[str, Any]:
    """``ecast.connect``'s proof: a credential, or the development mode's secret."""
    if args.credentials and args.secret_file:
        raise UsageError("give --credentials or --secret-file, not both")
    if args.credentials:
        if not Path(args.credentials).is_file():
            raise UsageError(f"--credentials: no such file: {args.credentials}")
        return {"credentials": args.credentials}
    if args.secret_file:
        try:
            return {"secret": Path(args.secret_file).read_text().strip()}
        except OSError as e:
            raise UsageError(f"--secret-file: {e.strerror}: {args.secret_file}") from None
    return {"secret": os.environ.get("ECAST_SECRET")}


def load_engine(spec: str) -> Any:
    path = ENGINES.get(spec, spec)
    module, _, cls = path.partition(":")
    if not module or not cls:
        raise UsageError(f"--engine is one of {', '.join(ENGINES)} or module:Class, not {spec!r}")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"--engine {spec}: {e}") from None


def _logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="ts=%(asctime)s level=%(levelname)s %(message)s",
        stream=sys.stderr,
    )


async def _health_server(address: str, routes: list[web.RouteDef]) -> web.AppRunner:
    app = web.Application(client_max_size=1 << 20)
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = address.rpartition(":")
    await web.TCPSite(runner, host or "127.0.0.1", int(port)).start()
    return runner


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)


# ------------------------------------------------------------------ storage
async def run_storage(args: argparse.Namespace) -> int:
    engine_cls = load_engine(args.engine)
    if not args.name.startswith("storage:"):
        raise UsageError(f"--name of a storage process starts with storage:, not {args.name!r}")
    client = await ecast.connect(
        args.routers.split(","),
        name=args.name,
        **_auth(args),
        listen=args.listen,
        timeout=args.join_timeout,
    )
    core = StorageCore(args.name, engine_cls())
    host = StorageHost(client, core)
    log.info("event=joined name=%s engine=%s", args.name, args.engine)

    async def health(_: web.Request) -> web.Response:
        status = core.status()
        status["owned"] = len(status["owned"])
        for k in ("receiving", "broken"):
            status[k] = len(status[k])
        status["status"] = "ok" if core.stopped is None else "stopped"
        status["engine"] = core.engine.stats()
        return web.json_response(status, status=200 if core.stopped is None else 503)

    runner = (
        await _health_server(args.metrics, [web.get("/health", health)]) if args.metrics else None
    )
    stop = asyncio.Event()
    _stop_on_signals(stop)
    run = asyncio.ensure_future(host.run())
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait([run, waiter], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if run.done():
        log.error("event=stopped reason=%s", str(run.result()).replace(" ", "_"))
        code = 1
    else:
        run.cancel()
        await host.close()
    waiter.cancel()
    with contextlib.suppress(Exception):
        await client.close(timeout=5.0)
    if runner is not None:
        await runner.cleanup()
    return code


# ------------------------------------------------------------------ super
async def run_super(args: argparse.Namespace) -> int:
    if not args.name.startswith("super:"):
        raise UsageError(f"--name of a super process starts with super:, not {args.name!r}")
    token = ""
    if args.admin_token_file:
        try:
            token = Path(args.admin_token_file).read_text().strip()
        except OSError as e:
            raise UsageError(f"--admin-token-file: {e.strerror}") from None
    if len(token) < 16:
        raise UsageError("the admin token must have at least 16 characters (--admin-token-file)")
    client = await ecast.connect(
        args.routers.split(","),
        name=args.name,
        **_auth(args),
        listen=args.listen,
        timeout=args.join_timeout,
    )
    core = SuperCore(args.name)
    host = SuperHost(client, core, heartbeat=args.heartbeat, suspect_after=args.suspect_after)
    run = asyncio.ensure_future(host.run())
    log.info("event=joined name=%s", args.name)

    def authorized(request: web.Request) -> bool:
        got = request.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {token}".encode())

    async def health(_: web.Request) -> web.Response:
        s = core.status()
        s["status"] = "ok" if s.get("joined") and host.stopped is None else "starting"
        return web.json_response(s, status=200 if s["status"] == "ok" else 503)

    async def status(request: web.Request) -> web.Response:
        if not authorized(request):
            return web.json_response({"error": "a valid admin token is required"}, status=401)
        return web.json_response(core.status())

    async def reconfigure(request: web.Request) -> web.Response:
        if not authorized(request):
            return web.json_response({"error": "a valid admin token is required"}, status=401)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("op"), str):
            return web.json_response(
                {"error": 'the body is {"op": ..., "args": [...]}'}, status=400
            )
        op_args = body.get("args", [])
        if not isinstance(op_args, list) or len(op_args) > 3:
            return web.json_response({"error": "args is a list of at most 3 values"}, status=400)
        try:
            result = await host.reconfigure(
                body["op"],
                *op_args,
                force=bool(body.get("force", False)),
                dry_run=bool(body.get("dry_run", False)),
                wait=bool(body.get("wait", True)),
                timeout=min(float(body.get("timeout", 60)), 600.0),
            )
        except Refused as e:
            return web.json_response({"error": str(e)}, status=409)
        except (TypeError, ValueError) as e:
            return web.json_response({"error": f"bad request: {e}"}, status=400)
        except TimeoutError as e:
            return web.json_response({"error": str(e)}, status=504)
        return web.json_response(result)

    runner = await _health_server(
        args.admin,
        [
            web.get("/health", health),
            web.get("/status", status),
            web.post("/reconfigure", reconfigure),
        ],
    )
    stop = asyncio.Event()
    _stop_on_signals(stop)
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait([run, waiter], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if run.done():
        log.error("event=stopped reason=%s", str(run.result()).replace(" ", "_"))
        code = 1
    else:
        run.cancel()
        await host.close()
    waiter.cancel()
    with contextlib.suppress(Exception):
        await client.close(timeout=5.0)
    await runner.cleanup()
    return code


def _parser(kind: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"rubberband {kind}", description=__doc__.split("\n\n")[0])
    _common(ap)
    ap.add_argument("--join-timeout", type=float, default=15.0)
    if kind == "storage":
        ap.add_argument("--engine", default="memory", help=f"{', '.join(ENGINES)} or module:Class")
        ap.add_argument("--metrics", help="HOST:PORT for /health")
    else:
        ap.add_argument("--admin", required=True, help="HOST:PORT of the admin API and /health")
        ap.add_argument("--admin-token-file", help="the admin API's bearer token")
        ap.add_argument("--heartbeat", type=float, default=0.5)
        ap.add_argument("--suspect-after", type=float, default=3.0)
    return ap


def main_for(kind: str, argv: list[str] | None = None) -> int:
    args = _parser(kind).parse_args(argv)
    _logging(args.log_level)
    try:
        runner = run_storage if kind == "storage" else run_super
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        return asyncio.run(runner(args))
    except UsageError as e:
        print(f"rubberband {kind}: {e}", file=sys.stderr)
        return 2
    except (ecast.Error, OSError) as e:
        print(f"rubberband {kind}: {e}", file=sys.stderr)
        return 2


def storage_main(argv: list[str] | None = None) -> int:
    return main_for("storage", argv)


def super_main(argv: list[str] | None = None) -> int:
    return main_for("super", argv)
