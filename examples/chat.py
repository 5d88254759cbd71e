"""A replicated chat room on E-Cast: every member sees every line in the same order.

Run a router group first (three terminals, or see ``ecast demo``)::

    export ECAST_SECRET=$(ecast credentials secret)   # development mode; docs/security.md
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
import contextlib
import os
import signal
import stat
import sys

import ecast


async def read_lines(queue: asyncio.Queue[str | None]) -> None:
    """Lines from stdin.  A terminal or a pipe is read without a blocking thread (Ctrl-C
    must not wait for enter); a file or ``/dev/null``, which the event loop cannot
    watch, by plain reads that never block for long."""
    loop = asyncio.get_running_loop()
    mode = os.fstat(sys.stdin.fileno()).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or sys.stdin.isatty():
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        readline = reader.readline
    else:

        async def readline() -> bytes:
            return await loop.run_in_executor(None, sys.stdin.buffer.readline)

    while line := await readline():
        await queue.put(line.decode(errors="replace").rstrip("\n"))
    await queue.put(None)  # end of input


async def chat(args: argparse.Namespace) -> int:
    async with ecast.connect(args.routers.split(","), name=args.name) as client:
        print(f"* joined as {args.name}; the leading router is {client.leader}", flush=True)
        print(f"* in the room: {', '.join(sorted(client.members()))}", flush=True)
        arrived = asyncio.Event()

        async def show() -> None:
            async for d in client.deliveries():
                m = d.message
                if d.kind in ("join", "part"):
                    print(f"[t={d.t}] * {m.sender} {d.kind}s the room", flush=True)
                    if d.kind == "join" and m.sender == args.wait_for:
                        arrived.set()
                elif d.kind is None:
                    print(f"[t={d.t}] <{m.sender}> {m.payload.decode()}", flush=True)

        shower = asyncio.create_task(show())
        if args.wait_for and args.wait_for not in client.members():
            await arrived.wait()
        if args.script is not None:
            for line in args.script:
                ack = await client.submit(line.encode())
                print(f"* stable at t={ack.t}: {line}", flush=True)
            await asyncio.sleep(args.linger)
        else:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)  # Ctrl-C parts cleanly
            lines: asyncio.Queue[str | None] = asyncio.Queue()
            reader = asyncio.create_task(read_lines(lines))
            while not stop.is_set():
                getter = asyncio.create_task(lines.get())
                stopper = asyncio.create_task(stop.wait())
                done, _ = await asyncio.wait((getter, stopper), return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if getter not in done:
                    getter.cancel()
                    break
                line = getter.result()
                if line is None:
                    break
                if line:
                    await client.submit(line.encode())
            reader.cancel()
            print("* leaving the room", flush=True)
        shower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await shower
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="A replicated chat room on E-Cast.")
    ap.add_argument("--name", required=True, help="your member id, unique in the room")
    ap.add_argument(
        "--routers",
        default=os.environ.get("ECAST_ROUTERS", "127.0.0.1:7001"),
        help="comma-separated HOST:PORTs (default: $ECAST_ROUTERS or 127.0.0.1:7001)",
    )
    ap.add_argument("--script", nargs="*", help="send these lines instead of reading stdin")
    ap.add_argument("--wait-for", help="say nothing before this member has joined")
    ap.add_argument("--linger", type=float, default=1.0, help="with --script: wait this long")
    try:
        return asyncio.run(chat(ap.parse_args()))
    except ecast.Error as e:
        print(f"chat: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
