"""Commands for poking at a running group from a shell, thin wrappers over the SDK.

    ecast submit --routers 127.0.0.1:7001 hello world       # one message per argument
    echo hi | ecast submit --routers 127.0.0.1:7001 -        # one per line of stdin
    ecast tail --routers 127.0.0.1:7001                     # deliveries as JSON lines
    ecast members --routers 127.0.0.1:7001
    ecast suspect --routers 127.0.0.1:7001 app-7

Each joins the group under a fresh name (names are unique for ever: a name that parted
is retired), does its work and parts again.  With a credential the name is its
pattern's prefix and a fresh suffix (a credential issued with ``--name 'alice.*'`` runs
these commands as ``alice.7f3a...`` any number of times); ``--name`` picks one, once.
Output is JSON lines on stdout; errors are one line on stderr with a non-zero exit
status.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import sys
from typing import Any

import ecast
from ecast.runtime import read_secret


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--routers",
        default=os.environ.get("ECAST_ROUTERS", "127.0.0.1:7001"),
        help="comma-separated HOST:PORT of routers (default: $ECAST_ROUTERS or 127.0.0.1:7001)",
    )
    ap.add_argument(
        "--credentials", help="this process's credential file (else $ECAST_CREDENTIALS)"
    )
    ap.add_argument(
        "--secret-file",
        help="development mode: file with the cluster secret (else $ECAST_SECRET)",
    )
    ap.add_argument(
        "--name",
        help="this process's name, once: names are unique for ever (default: a fresh one, "
        "the credential's pattern prefix, or cli-HOST-PID, and a random suffix)",
    )
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each step")


def _name(args: argparse.Namespace, credentials: str | None) -> str:
    """``--name``, else a fresh name the credential covers: its first pattern's prefix
    and a random suffix.  A credential of exact names only cannot name a second run."""
    if args.name:
        return str(args.name)
    suffix = f"{os.getpid()}-{os.urandom(3).hex()}"
    if credentials is None:
        return f"cli-{socket.gethostname()}-{suffix}"
    from ecast.security.credentials import Credential, CredentialError

    try:
        names = Credential.load(credentials).names
    except (OSError, CredentialError, ValueError) as e:
        raise ecast.AuthenticationError(f"credential {credentials}: {e}") from None
    prefixes = [n[:-1] for n in names if n.endswith("*")]
    if not prefixes:
        raise ecast.AuthenticationError(
            f"credential {credentials} covers only the names {', '.join(names)}, and a name "
            "is used once; issue one with a pattern for these commands (ecast credentials "
            f"issue ... --name '{names[0]}.*') or pass --name"
        )
    return f"{prefixes[0]}{suffix}"


def _payload_json(payload: Any) -> Any:
    if isinstance(payload, bytes):
        try:
            return payload.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(payload).decode()}
    return payload


async def _connect(args: argparse.Namespace) -> ecast.Client:
    secret = None
    credentials = args.credentials or os.environ.get("ECAST_CREDENTIALS")
    if args.secret_file or not credentials:
        try:
            secret = read_secret(args.secret_file)
        except SystemExit as e:
            raise ecast.AuthenticationError(f"{e}, or pass --credentials") from None
    return await ecast.connect(
        args.routers.split(","),
        name=_name(args, credentials if secret is None else None),
        secret=secret,
        credentials=args.credentials if secret is None else None,
        timeout=args.timeout,
    )


async def submit(args: argparse.Namespace) -> int:
    header = json.loads(args.header) if args.header else None
    lines: list[str] = list(args.payload)
    if lines == ["-"]:
        lines = [line.rstrip("\n") for line in sys.stdin]
    async with await _connect(args) as client:
        for line in lines:
            ack = await client.submit(line.encode(), header, timeout=args.timeout)
            print(json.dumps({"id": ack.id, "t": ack.t, "delivered": ack.delivered}), flush=True)
    return 0


async def tail(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with await _connect(args) as client:
        count = 0

        async def show() -> None:
            nonlocal count
            async for d in client.deliveries(include_membership=args.membership):
                m = d.message
                print(
                    json.dumps(
                        {
                            "t": d.t,
                            "sender": m.sender,
                            "id": m.id,
                            "kind": d.kind,
                            "header": m.header,
                            "payload": _payload_json(m.payload),
                        },
                        default=repr,
                    ),
                    flush=True,
                )
                count += 1
                if args.count and count >= args.count:
                    stop.set()

        shower = asyncio.create_task(show())
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait((shower, waiter), return_when=asyncio.FIRST_COMPLETED)
        shower.cancel()
        waiter.cancel()
    return 0


async def members(args: argparse.Namespace) -> int:
    async with await _connect(args) as client:
        others = sorted(client.members() - {client.name})
        print(json.dumps({"members": others, "leader": client.leader}), flush=True)
    return 0


async def suspect(args: argparse.Namespace) -> int:
    async with await _connect(args) as client:
        ack = await client.suspect(list(args.process), timeout=args.timeout)
        print(json.dumps({"suspected": args.process, "t": ack.t}), flush=True)
    return 0


COMMANDS = {"submit": submit, "tail": tail, "members": members, "suspect": suspect}


def main(command: str, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"ecast {command}", description=__doc__.split("\n")[0])
    _common(ap)
    if command == "submit":
        ap.add_argument("payload", nargs="+", help="messages to submit ('-': lines of stdin)")
        ap.add_argument("--header", help="a JSON object to send as every message's header")
    elif command == "tail":
        ap.add_argument("--count", type=int, default=0, help="stop after this many deliveries")
        ap.add_argument(
            "--membership",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="show join, part and suspect messages too",
        )
    elif command == "suspect":
        ap.add_argument("process", nargs="+", help="names of the processes to suspect")
    args = ap.parse_args(argv)
    try:
        return asyncio.run(COMMANDS[command](args))
    except (ecast.Error, TimeoutError, json.JSONDecodeError) as e:
        print(f"ecast {command}: {e}", file=sys.stderr)
        return 1
