"""``rubberband client``: ad-hoc reads and writes from a shell.

```sh
rubberband client --state-dir D put 1 '"one"' 2 '{"n": 2}'     # values are JSON (or text)
rubberband client --state-dir D get 1 2 --isolation snapshot
rubberband client --state-dir D append log '"x"'; rubberband client --state-dir D scan 0 100
rubberband client --state-dir D delete 1 2

rubberband client --state-dir D create-table tickets --key rloc 'rloc:varchar(6)' 'dep:varchar(3)'
rubberband client --state-dir D insert tickets --key rloc '[{"rloc": "AB12CD", "dep": "ZRH"}]'
rubberband client --state-dir D select tickets --where 'dep = ZRH' --columns rloc,dep
rubberband client --state-dir D select tickets --agg 'count:*' --isolation basic
rubberband client --state-dir D update tickets --set dep=GVA --where 'rloc = AB12CD'
rubberband client --state-dir D delete-rows tickets --where 'dep = GVA'
rubberband client --state-dir D shell      # one connection, commands line by line
```

Key-value commands work on the memory and Memcached engines, on ``scan-memory`` and on
``scan-kv`` (whose keys are integers); table commands need the scan engine, ``scan``,
``scan-kv`` or ``scan-memory`` (the
cluster's engine, from ``cluster.json``, or ``--engine`` with ``--routers``).  A
table's key column is asked of nobody (the scan engine keeps no catalog a client could
read): ``--key`` names it where routing needs it (``insert``, ``upsert``, and a
``--where`` on the key).
Output is a table for people, or JSON with ``--json``.  Exit status: 0 done, 1 refused or
unavailable (the message says why), 2 a usage error.

``shell`` keeps one connection and reads the same commands line by line (without
``rubberband client`` and the connection flags), as ``etcdctl`` and ``redis-cli`` users
expect: history across sessions (``~/.rubberband_history``), tab completion of commands,
flags and isolation levels, ``help``, and ``quit`` or Ctrl-D to leave.  A refused
command prints why and the shell goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

from rubberband.keys import text_key as key
from rubberband.tools.cluster import aligned

OPS = {
    "scan": "storage_adapters.scan:ScanOps",
    "scan-kv": "storage_adapters.scan.kv:ScanKVOps",
    "scan-memory": "storage_adapters.scan.kv:ScanKVOps",
    "scan-log": "storage_adapters.scan.kv:ScanKVOps",
}
"""The client operations of engines other than the key-value default, named by path."""
KV_COMMANDS = ("get", "put", "append", "delete", "scan")
TABLE_COMMANDS = ("create-table", "insert", "upsert", "select", "update", "delete-rows")
OPERATORS = ("=", "!=", "<", "<=", ">", ">=", "in", "prefix")


class Usage(Exception):
    """A command line that cannot run; exit status 2."""


def value(text: str) -> Any:
    """A value on the command line: JSON if it parses, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def where(clauses: list[str]) -> list[tuple[str, str, Any]]:
    out = []
    for c in clauses:
        parts = c.split(None, 2)
        if len(parts) != 3 or parts[1] not in OPERATORS:
            raise Usage(f"--where {c!r}: write 'COLUMN OP VALUE' with OP one of {OPERATORS}")
        out.append((parts[0], parts[1], value(parts[2])))
    return out


def jsonable(v: Any) -> Any:
    """A value as JSON can show it: bytes as their UTF-8 text, or ``base64:...`` when
    they are not text; tuples as lists; anything else unknown as its ``str``."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(v).decode("ascii")
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(jsonable(k)): jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _table_text(columns: list[str], rows: list[list[Any]]) -> str:
    """Rows already made :func:`jsonable` as a table for people."""
    cells = [[str(c) for c in columns]] + [
        ["" if v is None else v if isinstance(v, str) else json.dumps(v) for v in r] for r in rows
    ]
    cells.insert(1, ["-" * max(len(r[i]) for r in cells) for i in range(len(columns))])
    lines = aligned(cells)
    return "\n".join(lines) + f"\n({len(rows)} row{'s' if len(rows) != 1 else ''})"


def _connection(
    args: argparse.Namespace, role: str = "client"
) -> tuple[list[str], dict[str, Any], str]:
    routers = [r for r in (args.routers or "").split(",") if r]
    auth: dict[str, Any] = {}
    engine = args.engine
    if args.state_dir:
        f = Path(args.state_dir) / "cluster.json"
        if not f.exists():
            raise Usage(f"no cluster in {args.state_dir} (rubberband cluster up)")
        st = json.loads(f.read_text())
        routers = routers or st["routers"]
        if f"{role}_credentials" in st:
            auth = {"credentials": st[f"{role}_credentials"]}
        elif not args.credentials:  # a cluster started before maintainers had a role
            raise Usage(f"{args.state_dir} holds no {role} credential: give --credentials")
        engine = engine or st.get("engine")
    if args.credentials:
        auth = {"credentials": args.credentials}
    if not routers:
        raise Usage("give --state-dir, or --routers with --credentials (or ECAST_SECRET)")
    return routers, auth, engine or "memory"


async def connect(args: argparse.Namespace, role: str = "client") -> tuple[Any, str]:
    """A client for the cluster ``args`` name, and the cluster's engine.  ``role``
    ``maintainer``: one that may write views' definitions and rows (``rubberband views
    create``, ``maintain`` and ``drop``), under the state directory's maintainer
    credential."""
    import rubberband

    routers, auth, engine = _connection(args, role)
    where = {k: getattr(args, k) for k in ("listen", "source") if getattr(args, k, None)}
    rb = await rubberband.connect(
        routers,
        f"{role}:cli-{os.getpid()}-{os.urandom(3).hex()}",
        ops=OPS.get(engine),
        **auth,
        **where,
    )
    return rb, engine


def _check_engine(command: str, engine: str) -> None:
    if command in TABLE_COMMANDS and engine not in ("scan", "scan-kv", "scan-memory", "scan-log"):
        raise Usage(f"{command} needs the scan engine; this cluster runs {engine!r}")


async def execute(rb: Any, args: argparse.Namespace, engine: str) -> Any:
    """One command on an open client: what it printed, as a dict."""
    _check_engine(args.command, engine)
    if args.command in TABLE_COMMANDS:
        return await _table(rb, args)
    return await _kv(rb, args, engine)


async def run(args: argparse.Namespace) -> Any:
    _check_engine(args.command, _connection(args)[2])  # before connecting
    rb, engine = await connect(args)
    try:
        return await execute(rb, args, engine)
    finally:
        await rb.close()


async def _kv(rb: Any, args: argparse.Namespace, engine: str) -> Any:
    if engine == "scan":
        raise Usage(
            "key-value commands on a scan-engine cluster need its key-value engine "
            "(storage_adapters.scan.kv); use the table commands"
        )
    a = args.args
    iso = args.isolation
    if args.command == "get":
        if not a:
            raise Usage("get KEY [KEY ...]")
        found = await rb.get_many([key(k) for k in a], isolation=iso)
        return {"columns": ["key", "value"], "rows": [[k, v] for k, v in found.items()]}
    if args.command in ("put", "append"):
        if not a or len(a) % 2:
            raise Usage(f"{args.command} KEY VALUE [KEY VALUE ...]")
        pairs = tuple((key(a[i]), value(a[i + 1])) for i in range(0, len(a), 2))
        await rb.write((args.command, pairs))  # one atomic write; repeated keys kept
        return {"written": len(pairs)}
    if args.command == "delete":
        if not a:
            raise Usage("delete KEY [KEY ...]")
        await rb.write(("delete", tuple(key(k) for k in a)))
        return {"deleted": len(a)}
    lo = key(a[0]) if len(a) > 0 else None
    hi = key(a[1]) if len(a) > 1 else None
    items = await rb.scan(lo, hi, isolation=iso)
    return {"columns": ["key", "value"], "rows": [list(kv) for kv in items]}


async def _table(rb: Any, args: argparse.Namespace) -> Any:
    a = args.args
    if not a:
        raise Usage(f"{args.command} TABLE ...")
    name, rest = a[0], a[1:]
    if args.command == "create-table":
        if not args.key or not rest:
            raise Usage("create-table TABLE --key COLUMN NAME:TYPE [NAME:TYPE ...]")
        schema = []
        for col in rest:
            n, sep, t = col.partition(":")
            if not sep or not n or not t:
                raise Usage(f"{col!r}: columns are NAME:TYPE, such as id:int64 or dep:varchar(3)")
            schema.append((n, t))
        await rb.create_table(name, schema=schema, key=args.key)
        return {"created": name}
    table = rb.table(name, key=args.key) if args.key else rb.table(name)
    if args.command in ("insert", "upsert"):
        if len(rest) != 1:
            raise Usage(f"{args.command} TABLE --key COLUMN 'JSON list of rows' (or - for stdin)")
        text = sys.stdin.read() if rest[0] == "-" else rest[0]
        rows = value(text)
        if isinstance(rows, dict):
            rows = [rows]
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise Usage("rows are a JSON object or a JSON list of objects")
        await (table.insert(rows) if args.command == "insert" else table.upsert(rows))
        return {"written": len(rows)}
    w = where(args.where)
    if args.command == "select":
        agg = None
        if args.agg:
            agg = [tuple(x.split(":", 1)) if ":" in x else (x, "*") for x in args.agg]
        columns = args.columns.split(",") if args.columns else None
        result = await table.select(w, columns=columns, agg=agg, isolation=args.isolation)
        if agg is not None:
            return {"columns": list(result), "rows": [list(result.values())]}
        cols = columns or (list(result[0]) if result else [])
        return {"columns": cols, "rows": [[r.get(c) for c in cols] for r in result]}
    if args.command == "update":
        if not args.set:
            raise Usage("update TABLE --set COLUMN=VALUE [...] [--where ...]")
        assignments = {}
        for s in args.set:
            col, sep, v = s.partition("=")
            if not sep:
                raise Usage(f"--set {s!r}: write COLUMN=VALUE")
            assignments[col] = value(v)
        await table.update(w, set=assignments)
        return {"updated": True}
    await table.delete(w)
    return {"deleted": True}


def parser(prog: str = "rubberband client") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="ad-hoc reads and writes",
        epilog=__doc__.split("```sh")[1].split("```")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--state-dir", help="a rubberband cluster up directory")
    ap.add_argument("--routers", help="HOST:PORT[,HOST:PORT...]")
    ap.add_argument("--credentials", help="a client credential file (client:*)")
    engines = ["memory", "log", "memcached", "scan", "scan-kv", "scan-memory", "scan-log", "null"]
    ap.add_argument("--engine", choices=engines)
    ap.add_argument("--isolation", default="sequential", choices=ISOLATION)
    ap.add_argument("--key", help="a table's key column")
    ap.add_argument("--where", action="append", default=[], help="'COLUMN OP VALUE'")
    ap.add_argument("--columns", help="a projection: a,b,c")
    ap.add_argument("--agg", action="append", help="FUNCTION:COLUMN, e.g. count:* or sum:price")
    ap.add_argument("--set", action="append", help="COLUMN=VALUE")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("command", choices=[*KV_COMMANDS, *TABLE_COMMANDS, "shell"])
    ap.add_argument("args", nargs="*")
    return ap


ISOLATION = ("sequential", "snapshot", "basic")


def failures() -> tuple[type[BaseException], ...]:
    """What a command may fail with besides ``Usage``: reported, not a traceback.
    (Imported when a command runs: ``rubberband client --help`` stays quick.)"""
    import ecast
    import rubberband

    return (rubberband.RubberbandError, ecast.Error, ValueError, TimeoutError, OSError)


def show(out: Any, as_json: bool) -> None:
    out = jsonable(out)
    if as_json:
        print(json.dumps(out), flush=True)
    elif "rows" in out:
        print(_table_text(out["columns"], out["rows"]), flush=True)
    else:
        print(", ".join(f"{k}: {v}" for k, v in out.items()), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_intermixed_args(argv)  # options may come after the command's args
    if args.command == "shell":
        from rubberband.tools.client_shell import shell

        return shell(args)
    try:
        out = asyncio.run(run(args))
    except Usage as e:
        print(f"rubberband client: {e}", file=sys.stderr)
        return 2
    except failures() as e:
        print(f"rubberband client: {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    show(out, args.json)
    return 0
