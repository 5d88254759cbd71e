"""Many storage processes in one OS process: ``python -m rubberband.bench.pack``.

Each logical process is a full storage process (its own E-Cast client, endpoint and
identity, its own :class:`StorageCore`, engine and engine thread), exactly what
``rubberband storage`` runs; the OS process, event loop and E-Cast runtime (connections,
listening port) are shared, as ``ecast bench`` hosts its receivers.  Benchmarks need 16
to 64 storage processes on two cores, where an interpreter each would measure the
scheduler.  One
``/health`` answers for all of them (ok once every one has joined and none stopped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

import ecast
from ecast import daemon_kit as kit
from rubberband.host import StorageHost
from rubberband.storage import StorageCore
from rubberband.tools.daemons import make_engine, storage_health_between_steps

log = logging.getLogger("rubberband")


async def run(args: argparse.Namespace) -> int:
    auth: dict[str, Any] = (
        {"credentials": args.credentials} if args.credentials else {"secret": args.secret}
    )
    names = args.names.split(",")
    hosts: list[StorageHost] = []
    clients: list[ecast.Client] = []
    # One runtime for all: one connection to each router and one listening port, so a
    # packet carrying a message to three of them holds it once and is decoded once.
    rt = ecast.Runtime(ecast.load_auth(**auth), host_id=f"pack-{os.getpid()}")
    await rt.serve(f"{args.host}:0")

    async def one(name: str) -> None:
        engine = make_engine(args.engine, args.engine_arg)
        durable = getattr(engine, "durable", False) is True  # confirm once on disk
        client = await ecast.connect(
            args.routers.split(","), name=name, runtime=rt, listen=f"{args.host}:0",
            timeout=60.0,
            params=ecast.EndpointParams(confirm_when_durable=True) if durable else None,
        )  # fmt: skip
        clients.append(client)
        hosts.append(StorageHost(client, StorageCore(name, engine)))

    await asyncio.gather(*(one(n) for n in names))
    log.info("event=joined names=%d engine=%s", len(names), args.engine)

    async def health() -> dict[str, Any]:
        each = {h.core.me: await storage_health_between_steps(h.core, h) for h in hosts}
        bad = {n: h["status"] for n, h in each.items() if h["status"] != "ok"}
        return {"status": "ok" if not bad else "degraded", "not_ok": bad, "processes": each}

    runner = await kit.serve_http(args.metrics, lambda: "", health, lambda h: h["status"] == "ok")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runs = [asyncio.ensure_future(h.run()) for h in hosts]
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait([waiter, *runs], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    for h, r in zip(hosts, runs, strict=True):
        if r.done():
            log.error("event=stopped name=%s reason=%s", h.core.me, r.result())
            code = 1
    for h in hosts:
        with contextlib.suppress(Exception):
            await h.close()
    await asyncio.gather(*(c.close(timeout=5.0) for c in clients), return_exceptions=True)
    await runner.cleanup()
    with contextlib.suppress(Exception):
        await rt.close()
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser("python -m rubberband.bench.pack", description=__doc__)
    ap.add_argument("--routers", required=True)
    ap.add_argument("--names", required=True, help="storage:... names, comma-separated")
    ap.add_argument("--engine", default="null")
    ap.add_argument("--engine-arg", action="append", default=[])
    ap.add_argument("--credentials", help="one credential that covers every name")
    ap.add_argument("--secret")
    ap.add_argument("--metrics", required=True, help="HOST:PORT of /health")
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    ecast.tune_process(keeps_data=True)  # storage processes
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
