"""A client process for the lease tests: joins, consumes deliveries, and reports on stdout
(JSON lines) when it joined and when it learned it was suspected (then exits 3)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import ecast


async def main(args: argparse.Namespace) -> int:
    auth = {"credentials": args.credentials} if args.credentials else {"secret": args.secret}
    client = await ecast.connect(args.routers.split(","), name=args.name, lease=args.lease, **auth)
    print(json.dumps({"event": "joined", "name": args.name}), flush=True)
    try:
        async for _ in client.deliveries():
            pass
    except ecast.SuspectedError as e:
        event = {"event": "suspected", "error": str(e), "at": client.suspected_at}
        print(json.dumps(event), flush=True)
        return 3
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--routers", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--secret")
    ap.add_argument("--credentials")
    ap.add_argument("--lease", type=float)
    sys.exit(asyncio.run(main(ap.parse_args())))
