"""A replicated chat room on E-Cast: every member sees every line in the same order.

Run a router group first (three terminals, or see ``ecast demo``)::

    export ECAST_SECRET=change-me
    ecast router --id r1 --listen 127.0.0.1:7001 --metrics 127.0.0.1:9001
    ecast router --id r2 --listen 127.0.0.1:7002 --join 127.0.0.1:7001
    ecast router --id r3 --listen 127.0.0.1:7003 --join 127.0.0.1:7001

then one chat member per terminal::

    python examples/chat.py --name alice --routers 127.0.0.1:7001,127.0.0.1:7002
    python examples/chat.py --name bob --routers 127.0.0.1:7002

Type a line and press enter; it is shown once it is delivered, at the same position of
the conversation at every member (``t`` is its place in E-Cast's total order).  Kill the
leading router with ``kill -9``: the chat pauses for about a second and carries on.

``--script`` sends the given lines, waits until each is stable, prints the transcript and
parts: the test suite runs the example that way.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import ecast


async def chat(args: argparse.Namespace) -> int:
    client = await ecast.connect(args.routers.split(","), name=args.name)
    print(f"* joined as {args.name}; the leading router is {client.leader}", flush=True)
    arrived = asyncio.Event()

    async def show() -> None:
        async for d in client.deliveries():
            m = d.message
            if m.kind in ("join", "part"):
                print(f"[t={d.t}] * {m.sender} {m.kind}s the room", flush=True)
                if m.kind == "join" and m.sender == args.wait_for:
                    arrived.set()
            elif m.kind is None:
                print(f"[t={d.t}] <{m.sender}> {m.payload.decode()}", flush=True)

    shower = asyncio.create_task(show())
    if args.wait_for:
        await arrived.wait()
    if args.script is not None:
        for line in args.script:
            ack = await (await client.submit(line.encode()))
            print(f"* stable at t={ack.t}: {line}", flush=True)
        await asyncio.sleep(args.linger)
    else:
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            await client.submit(line.rstrip("\n").encode())
    await client.close()
    shower.cancel()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="A replicated chat room on E-Cast.")
    ap.add_argument("--name", required=True, help="your member id, unique in the room")
    ap.add_argument("--routers", default="127.0.0.1:7001", help="comma-separated HOST:PORTs")
    ap.add_argument("--script", nargs="*", help="send these lines instead of reading stdin")
    ap.add_argument("--wait-for", help="say nothing before this member has joined")
    ap.add_argument("--linger", type=float, default=1.0, help="with --script: wait this long")
    return asyncio.run(chat(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
