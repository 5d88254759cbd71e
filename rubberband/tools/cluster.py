"""``rubberband cluster`` and ``rubberband admin``: a local cluster for people and tests.

```sh
rubberband cluster up --routers 3 --supers 1 --storage 4 --replication 3 --state-dir DIR
rubberband cluster status --state-dir DIR --json
rubberband cluster add --storage 2 --state-dir DIR        # more storage processes, in standby
rubberband cluster add --routers 1 --supers 1 --state-dir DIR
rubberband cluster remove r2 --state-dir DIR               # a router parts; or super:s2
rubberband admin --state-dir DIR expand storage:5 KEY     # or: contract NAME, replace OLD NEW,
rubberband admin --state-dir DIR status                   #     rebalance NAME KEY
rubberband admin --state-dir DIR status
rubberband cluster down --state-dir DIR
```

``up`` starts the routers (E-Cast daemons with Rubberband's config), then the supers,
then the storage processes in standby, and expands the keyspace until every storage
process is placed (ids spread evenly over integer keys ``0 .. --key-space``, or over the
32-bit hash ring under ``--partitioning hash``).  Every
process has the state directory on its command line; the directory records them
(``processes.json``), the certificate authority and credentials, the admin token and
the supers' admin addresses (``cluster.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

import ecast
from ecast import local
from ecast.core import mutations
from rubberband.errors import BadKey
from rubberband.keys import text_key
from rubberband.tools.restart import (
    KEYSPACE_FILE,
    check_holders,
    recorded_keyspace,
    restart_numbers,
    restored,
    stopped_storage,
)
from rubberband.tools.settings import DURABLE


def storage_mutations() -> dict[str, mutations.Mutation]:
    """The planted bugs the storage processes consult (``cluster up --mutation`` sends
    these to them, the rest to the routers).  Importing the storage core declares them;
    only then, not for every command: it is most of a short command's start-up."""
    import rubberband.storage  # noqa: F401

    return mutations.known("storage")


CONFIG = "rubberband.config:RubberbandConfig"


def _state(path: str) -> dict[str, Any]:
    f = Path(path) / "cluster.json"
    if not f.exists():
        raise SystemExit(f"rubberband: no cluster in {path} (run rubberband cluster up)")
    return dict(json.loads(f.read_text()))


def admin_request(
    state_dir: str, path: str, body: dict[str, Any] | None = None, timeout: float = 120.0
) -> tuple[int, dict[str, Any]]:
    """Call a super's admin API (the first that answers); ``(status, json)``."""
    st = _state(state_dir)
    return request(list(st["supers"].values()), st["admin_token"], path, body, timeout)


def request(
    supers: list[str],
    token: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = 120.0,
) -> tuple[int, dict[str, Any]]:
    """Call the admin API of the first of ``supers`` (HOST:PORT) that answers."""
    last: tuple[int, dict[str, Any]] = (503, {"error": "no super answered"})
    for address in supers:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://{address}{path}",
            data=data,
            method="POST" if body is not None else "GET",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {"error": f"{address}: HTTP {e.code}"}
        except OSError as e:
            last = (503, {"error": f"{address}: {e}"})
    return last


def up(args: argparse.Namespace) -> int:
    d = Path(args.state_dir)
    ecast.private_dir(d)  # cluster.json holds the admin token and the client credential
    record = recorded_keyspace(d)
    if record is not None and args.engine not in DURABLE:
        print(f"rubberband cluster up: {d} holds the ring of a cluster on a durable engine; "
              f"restart it with its --engine ({', '.join(DURABLE)}) or use another --state-dir",
              file=sys.stderr)  # fmt: skip
        return 2
    planted_in_storage = storage_mutations() if args.mutation else {}
    cluster = local.LocalCluster(
        d,
        args=[
            "--config",
            CONFIG,
            "--config-arg",
            f"replication={args.replication}",
            "--config-arg",
            f"partitioning={args.partitioning}",
            *(f"--mutation={m}" for m in args.mutation if m not in planted_in_storage),
            *args.router_arg,
        ],
    )
    storage_args = [f"--mutation={m}" for m in args.mutation if m in planted_in_storage]
    storage_args += [f"--engine-arg={pair}" for pair in args.engine_arg] + args.storage_arg
    state = cluster.state
    t0 = time.monotonic()
    routers = cluster.start_group(args.routers)
    addresses = ",".join(r.address for r in routers)
    token = os.urandom(24).hex()
    token_file = d / "admin_token"
    ecast.write_private(token_file, token + "\n")
    common = ["--routers", addresses, "--state-dir", str(d)]
    numbers: Sequence[int] = range(1, args.storage + 1)
    standby: list[int] = []
    if record is not None:  # a restart: the recorded holders, with their data
        numbers, standby = _holders_back(d, args, record)
    supers: dict[str, str] = {}
    for i in range(1, args.supers + 1):
        name, address = start_super(state, i, common, args.auto_repair, args.timeout)
        supers[name] = address
    storage = _start_storage(
        state, [*common, *storage_args, *(["--keep-data"] if record else [])], args.engine,
        numbers, args.timeout,
    )  # fmt: skip
    if standby:
        storage |= _start_storage(
            state, [*common, *storage_args], args.engine, standby, args.timeout
        )
    ecast.write_private(
        d / "cluster.json",
        json.dumps(
            {
                "routers": addresses.split(","),
                "router_args": cluster.args,
                "storage_args": storage_args,
                "client_credentials": str(state.issue("application", ["client:*"], "clients")),
                "maintainer_credentials": str(
                    state.issue("application", ["maintainer:*"], "maintainers")
                ),
                "admin_token": token,
                "supers": supers,
                "storage": storage,
                "replication": args.replication,
                "partitioning": args.partitioning,
                "engine": args.engine,
                "auto_repair": args.auto_repair,
            },
            indent=1,
        ),
    )
    if record is not None:
        started = [n.replace(":", "") for n in storage]
        status = lambda: admin_request(str(d), "/status")  # noqa: E731
        return restored(record, t0, args.timeout, status, lambda: stopped_storage(d, started))
    return _expand_all(d, args, addresses, t0)


def _holders_back(d: Path, args: argparse.Namespace, record: Any) -> tuple[list[int], list[int]]:
    """A restart's storage processes: the recorded holders whose disks are there, and
    standby processes to take the lost ones' place; the supers' record says which are
    lost.  ``--new-names``: the holders under new numbers, their directories with them."""
    numbers = restart_numbers(record)
    lost = check_holders(d, record, numbers, args.engine, args.engine_arg)
    record = (*record[:5], tuple(f"storage:{n}" for n in lost))
    for i in range(1, args.supers + 1):
        (d / KEYSPACE_FILE.format(i)).write_bytes(msgpack.packb(record))
    numbers = [n for n in numbers if n not in lost]
    spare = max([*numbers, *lost, *_numbers_used(d)]) + 1
    standby = list(range(spare, spare + len(lost)))
    if args.new_names:  # as the deploys restart every process, under a new name
        new = list(range(spare + len(lost), spare + len(lost) + len(numbers)))
        for n, m in zip(numbers, new, strict=True):
            (d / "data" / f"storage{n}").rename(d / "data" / f"storage{m}")
        numbers = new
    return numbers, standby


def _numbers_used(d: Path) -> list[int]:
    """The numbers N of every ``storageN`` this directory has seen (names once used are
    not used again for a new process: its data directory may still be there)."""
    return [int(p.name[7:]) for p in (d / "data").glob("storage*") if p.name[7:].isdigit()]


def _expand_all(d: Path, args: argparse.Namespace, addresses: str, t0: float) -> int:
    """Put a new cluster's storage processes on its empty ring, ids spread evenly."""
    ids = spread(args.storage, args.partitioning, args.key_space)
    for i, at in enumerate(ids, 1):
        code, body = admin_request(
            str(d), "/reconfigure", {"op": "expand", "args": [f"storage:{i}", at]}
        )
        if code != 200:
            print(
                f"rubberband cluster up: expand storage:{i} failed: {body.get('error')}",
                file=sys.stderr,
            )
            return 1
    print(
        f"cluster up in {time.monotonic() - t0:.1f} s: {args.routers} routers, {args.supers} "
        f"super(s), {args.storage} storage processes ({args.engine}), replication "
        f"{args.replication}; routers {addresses}"
    )
    return 0


def spread(n: int, partitioning: str, key_space: int) -> list[int]:
    """The ids of ``n`` storage processes placed evenly on an empty ring.  Ids are places:
    integer keys ``0 .. key_space`` under range partitioning, 32-bit hashes under hash
    partitioning."""
    space = 2**32 if partitioning == "hash" else key_space
    step = max(1, space // max(1, n))
    return [i * step for i in range(n)]


def start_super(
    state: local.StateDir, number: int, common: list[str], auto_repair: bool, timeout: float
) -> tuple[str, str]:
    """Super ``super:sNUMBER``, healthy; its name and admin address."""
    name = f"super:s{number}"
    port = local.free_port()
    host = state.place(f"s{number}").host
    argv = state.python(
        "rubberband.tools.cli",
        "super",
        "--name",
        name,
        "--admin",
        f"{host}:{port}",
        "--listen",
        f"{host}:0",
        "--admin-token-file",
        str(state.path / "admin_token"),
        "--keyspace-file",
        str(state.path / KEYSPACE_FILE.format(number)),
        *([] if auto_repair else ["--no-auto-repair"]),
        *common,
        *state.auth_args("application", name),
    )
    state.start(f"s{number}", argv, ports={"admin": port}, health_port=port)
    state.wait_healthy(f"s{number}", timeout=timeout)
    return name, f"{host}:{port}"


def _start_storage(
    state: local.StateDir, common: list[str], engine: str, numbers: Sequence[int], timeout: float
) -> dict[str, int]:
    """Storage processes ``storage:N`` for N in ``numbers``, in standby, healthy."""
    storage: dict[str, int] = {}
    for i in numbers:
        port = local.free_port()
        host = state.place(f"storage{i}").host
        argv = state.python(
            "rubberband.tools.cli",
            "storage",
            "--name",
            f"storage:{i}",
            "--engine",
            engine,
            "--metrics",
            f"{host}:{port}",
            "--listen",
            f"{host}:0",
            *common,
            *state.auth_args("application", f"storage:{i}"),
            *(["--engine-arg", f"path={state.path / 'data' / f'storage{i}'}"]
              if engine in DURABLE else []),
        )  # fmt: skip
        state.start(f"storage{i}", argv, ports={"metrics": port}, health_port=port)
        storage[f"storage:{i}"] = port
    for i in numbers:
        state.wait_healthy(f"storage{i}", timeout=timeout)
    return storage


def add(args: argparse.Namespace) -> int:
    """More processes: storage processes in standby (the admin places them), routers that
    join the group, supers that join the supers' group.  ``cluster.json`` lists the new
    routers and supers, so that later processes and clients reach them too."""
    d = Path(args.state_dir)
    st = _state(args.state_dir)
    before = local.StateDir.recorded(d)  # starting processes rewrites the record
    state = local.StateDir(d)
    started: list[str] = []
    if args.routers:
        cluster = local.LocalCluster(d, args=st.get("router_args", ()))
        routers = {k: p for k, p in before.items() if "router" in p.get("argv", ())}
        taken = [_number(k, "r") for k in routers]
        live = [p for p in routers.values() if local.running(p["pid"])]
        join = router_address(live[0]) if live else None
        if join is None:
            print("rubberband cluster add: no router is reachable to join", file=sys.stderr)
            return 1
        first = max(taken, default=0) + 1
        for rid in (f"r{i}" for i in range(first, first + args.routers)):
            cluster.start(rid, join)
            cluster.wait_healthy(rid, timeout=args.timeout)  # may restart it on fresh ports
            st["routers"].append(cluster.routers[rid].address)
            started.append(rid)
    common = ["--routers", ",".join(st["routers"]), "--state-dir", str(d)]
    if args.supers:
        taken = [_number(k, "s") for k, p in before.items() if "super" in p.get("argv", ())]
        first = max(taken, default=0) + 1
        auto = st.get("auto_repair", True)
        for n in range(first, first + args.supers):
            name, address = start_super(state, n, common, auto, args.timeout)
            st["supers"][name] = address
            started.append(name)
    if args.storage:
        first = max((int(n.split(":")[1]) for n in st["storage"]), default=0) + 1
        numbers = range(first, first + args.storage)
        storage_common = [*common, *st.get("storage_args", ())]
        added = _start_storage(state, storage_common, st["engine"], numbers, args.timeout)
        st["storage"].update(added)
        started += added
    ecast.write_private(d / "cluster.json", json.dumps(st, indent=1))
    now = local.StateDir.recorded(d)
    (d / "processes.json").write_text(json.dumps({**before, **now}, indent=1))
    print(" ".join(started))
    return 0


def _number(key: str, prefix: str) -> int:
    """The number in a recorded process's key (``r4``, ``s2``, ``j3``: 0 if none)."""
    digits = key.removeprefix(prefix)
    return int(digits) if digits.isdigit() else 0


def router_address(p: dict[str, Any]) -> str:
    """A recorded router's listening address, as ``cluster.json`` lists it."""
    return f"{p.get('host', '127.0.0.1')}:{p['ports']['listen']}"


def _stop(
    procs: list[dict[str, Any]], sig: Callable[[dict[str, Any]], int], grace: float
) -> list[dict[str, Any]]:
    """Send each running process of ``procs`` its signal, wait up to ``grace`` seconds for
    them all; those still running."""
    for p in procs:
        if local.running(p["pid"]):
            os.kill(p["pid"], sig(p))
    deadline = time.monotonic() + grace
    for p in procs:
        while local.running(p["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    return [p for p in procs if local.running(p["pid"])]


def remove(args: argparse.Namespace) -> int:
    """Stop one process for good: a router parts from the group (SIGTERM), a super
    leaves the supers, a storage process in standby stops.  A storage process on the
    ring holds data: contract or replace it first (``rubberband admin``)."""
    import signal

    d = Path(args.state_dir)
    st = _state(args.state_dir)
    recorded = local.StateDir.recorded(d)
    processes = {k: _process(k, p) for k, p in recorded.items()}
    found = [k for k, i in processes.items() if args.name in (k, i["name"])]
    if not found:
        print(f"rubberband cluster remove: no process {args.name!r} here", file=sys.stderr)
        return 2
    p, info = recorded[found[0]], processes[found[0]]
    name = info["name"]
    if info["role"] == "storage":
        _, body = admin_request(args.state_dir, "/status", timeout=5.0)
        if name in [r.get("name") for r in body.get("ring", [])]:
            print(
                f"rubberband cluster remove: {name} holds data on the ring: contract or "
                f"replace it first (rubberband admin --state-dir {args.state_dir} contract "
                f"{name})",
                file=sys.stderr,
            )
            return 2
    routers_alive = sum(i["role"] == "router" and i["alive"] for i in processes.values())
    if info["role"] == "router" and routers_alive <= 1:
        print("rubberband cluster remove: the last router stays (cluster down)", file=sys.stderr)
        return 2
    if _stop([p], lambda _p: signal.SIGTERM, args.timeout):
        print(f"rubberband cluster remove: {name} did not stop in time", file=sys.stderr)
        return 1
    if info["role"] == "router":
        st["routers"] = [a for a in st["routers"] if a != router_address(p)]
    st["supers"].pop(name, None)
    st["storage"].pop(name, None)
    ecast.write_private(d / "cluster.json", json.dumps(st, indent=1))
    print(f"{name} removed")
    return 0


def status(args: argparse.Namespace) -> int:
    st = _state(args.state_dir)
    code, body = admin_request(args.state_dir, "/status", timeout=5.0)
    recorded = local.StateDir.recorded(args.state_dir)
    out = {
        "routers": st["routers"],
        "client_credentials": st["client_credentials"],
        "maintainer_credentials": st.get("maintainer_credentials"),
        "super": next(iter(st["supers"].values()), None),
        "processes": [_process(key, p) for key, p in sorted(recorded.items())],
        "ring": body.get("ring", []),
        "version": body.get("version"),
        "standby": body.get("standby", []),
        "pending": body.get("pending", {}),
        "busy": body.get("busy", []),
        "incomplete": body.get("incomplete", []),
        "leader": body.get("leader"),
        "load": body.get("load", {}),
    }
    if args.json:
        print(json.dumps(out))
        return 0 if code == 200 else 1
    if code == 200:
        print(f"version {out['version']}, routers {', '.join(out['routers'])}")
        for r in out["ring"]:
            print(f"  {r['name']:<16} id={r['id']}{'  SUSPECTED' if r['suspected'] else ''}")
        print(f"  standby: {', '.join(out['standby']) or '-'}")
        for what in ("busy", "incomplete"):
            if out[what]:
                print(f"  {what}: {', '.join(out[what])}")
    else:
        print(f"no super answers ({body.get('error', code)}): the ring is unknown")
    rows = [["process", "role", "pid", "state"]]
    for p in out["processes"]:
        rows.append([p["name"], p["role"], str(p["pid"]), "alive" if p["alive"] else "DEAD"])
    print("\n".join(aligned(rows)))
    return 0 if code == 200 else 1


def _process(key: str, p: dict[str, Any]) -> dict[str, Any]:
    """A recorded OS process as status shows it: its process name (the one in the ring
    and in logs, from its ``--name``, a router's ``--id``), its role and whether it
    runs.  ``key`` is the state directory's own name for it (its log file's)."""
    argv = list(p.get("argv", ()))
    role = next((r for r in ("router", "super", "storage") if r in argv), "other")
    flag = next((f for f in ("--name", "--id") if f in argv[:-1]), None)
    name = argv[argv.index(flag) + 1] if flag else key
    return {
        "name": name,
        "role": role,
        "key": key,
        "pid": p["pid"],
        "alive": local.running(p["pid"]),
    }


def down(args: argparse.Namespace) -> int:
    """Stop the application processes first, so they part while the routers still run
    (a storage process or super that outlives the routers waits out its part's timeout),
    then the routers one at a time, each part agreed by those left (stopped together,
    the last ones were stranded in a group whose majority had gone), 2 s for them all;
    the last, alone with every message stable, stops at once.  SIGKILL whatever is left.
    Storage processes get SIGINT, not SIGTERM: the whole cluster goes, so moving their
    ranges to each other first (SIGTERM's drain) would be work for nothing."""
    import signal

    recorded = local.StateDir.recorded(args.state_dir)

    def is_router(p: dict[str, Any]) -> bool:
        return "router" in p.get("argv", ())

    def sig(p: dict[str, Any]) -> int:
        return signal.SIGINT if "storage" in p.get("argv", ()) else signal.SIGTERM

    routers = [p for p in recorded.values() if is_router(p)]
    others = [p for p in recorded.values() if p not in routers]
    for parts, grace in (([others], 10.0), ([[p] for p in routers], 2.0)):
        end = time.monotonic() + grace
        for p in [p for part in parts for p in _stop(part, sig, end - time.monotonic())]:
            os.kill(p["pid"], signal.SIGKILL)
    print(f"stopped {len(recorded)} processes")
    return 0


def cluster_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rubberband cluster", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("--routers", type=int, default=3)
    u.add_argument("--supers", type=int, default=1)
    u.add_argument("--storage", type=int, default=4)
    u.add_argument(
        "--auto-repair",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="supers replace or contract failed and incomplete holders on their own",
    )
    u.add_argument("--replication", type=int, default=3)
    u.add_argument("--partitioning", default="range", choices=["range", "hash"])
    u.add_argument("--engine", default="memory")
    u.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine option for every storage process, e.g. --engine-arg fsync=interval "
        "(repeatable; the durable engines' path is set per process)",
    )
    u.add_argument("--key-space", type=int, default=1_000_000)
    u.add_argument(
        "--new-names",
        action="store_true",
        help="restarting from the disks: the holders under new names, as the deploys "
        "restart them (--unique-name); the supers map the ring onto them by their data",
    )
    u.add_argument("--timeout", type=float, default=60.0)
    u.add_argument("--state-dir", required=True)
    for role, example in (("router", "--no-clumping"), ("storage", "--change-log=20000")):
        u.add_argument(
            f"--{role}-arg",
            action="append",
            default=[],
            help=f"an extra flag for every {role} process, e.g. --{role}-arg={example} "
            "(repeatable)",
        )
    u.add_argument(
        "--mutation",
        action="append",
        default=[],
        help="plant a bug in the routers' config or the storage processes (tests only; needs "
        "ECAST_TEST_MUTATIONS=1)",
    )
    s = sub.add_parser("status")
    s.add_argument("--state-dir", required=True)
    s.add_argument("--json", action="store_true")
    a = sub.add_parser("add", help="start more storage processes (in standby), routers, supers")
    a.add_argument("--storage", type=int, default=None, help="storage processes (default 1 "
                   "when nothing else is asked)")  # fmt: skip
    a.add_argument("--routers", type=int, default=0, help="routers that join the group")
    a.add_argument("--supers", type=int, default=0, help="supers that join the supers")
    a.add_argument("--timeout", type=float, default=60.0)
    a.add_argument("--state-dir", required=True)
    r = sub.add_parser("remove", help="stop a router, a super or a standby storage process")
    r.add_argument("name", help="as status shows it: r2, super:s2, storage:5")
    r.add_argument("--timeout", type=float, default=30.0)
    r.add_argument("--state-dir", required=True)
    d = sub.add_parser("down")
    d.add_argument("--state-dir", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "add" and args.storage is None:
        args.storage = 0 if args.routers or args.supers else 1
    return {"up": up, "add": add, "remove": remove, "status": status, "down": down}[args.cmd](args)


def admin_main(argv: list[str] | None = None) -> int:
    if argv and argv[0] == "view":  # ``rubberband admin view ...`` is ``rubberband views ...``
        from rubberband.tools.views import main

        return main(argv[1:])
    ap = argparse.ArgumentParser(
        prog="rubberband admin",
        description="Reconfigure a Rubberband cluster through a super's admin API. Exit "
        "status: 0 done, 2 refused (nothing changed; the reason is printed), 1 failed "
        "(no super answered, a timeout).",
    )
    ap.add_argument("--state-dir", help="a rubberband cluster up directory")
    ap.add_argument("--super", action="append", default=[], help="HOST:PORT of a super's "
                    "admin API (repeat for several; the first that answers is used)")  # fmt: skip
    ap.add_argument("--token-file", help="the admin token (default: the state directory's, "
                    "or $RUBBERBAND_ADMIN_TOKEN)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="the API's JSON answer, for scripts")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    ap.add_argument("--force", action="store_true", help="go on even if data would be lost")
    ap.add_argument("--no-wait", action="store_true", help="return once submitted")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--key-space", type=int, default=1_000_000, help="place: range "
                    "partitioning's ids are spread over integer keys 0 .. this")  # fmt: skip
    ap.add_argument(
        "op", choices=["status", "expand", "contract", "replace", "rebalance", "wait", "place"],
        help="status; expand NAME KEY; contract NAME [NAME ...] (together); replace OLD "
        "NEW; rebalance NAME KEY; "
        "view ... (first: rubberband views' commands); "
        "wait [VERSION] (no VERSION: until no reconfiguration is pending); place N (a new "
        "cluster's first N standby storage processes, ids spread evenly; nothing once the "
        "ring holds any)",
    )  # fmt: skip
    ap.add_argument("args", nargs="*")
    args = ap.parse_intermixed_args(argv)
    supers, token = list(args.super), os.environ.get("RUBBERBAND_ADMIN_TOKEN", "")
    if args.state_dir:
        st = _state(args.state_dir)
        supers = supers or list(st["supers"].values())
        token = token or st["admin_token"]
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as e:
            ap.error(f"--token-file: {e.strerror}")
    if not supers:
        ap.error("give --state-dir or --super HOST:PORT")
    if not token:
        ap.error("no admin token: --token-file, --state-dir or $RUBBERBAND_ADMIN_TOKEN")
    arity = {
        "status": 0, "expand": 2, "contract": 1, "replace": 2, "rebalance": 2, "wait": 1,
        "place": 1,
    }  # fmt: skip
    if args.op == "wait" and not args.args:
        return _wait(supers, token, args)
    if len(args.args) != arity[args.op] and not (args.op == "contract" and args.args):
        ap.error(f"{args.op} takes {arity[args.op]} argument(s): {ap._actions[-2].help}")
    if args.op == "status":
        code, body = request(supers, token, "/status", timeout=args.timeout)
        return _show(code, body, args.json, _status_text)
    if args.op == "wait":
        return _wait(supers, token, args)
    if args.op == "place":
        return _place(supers, token, args)
    op_args: list[Any] = list(args.args)
    if args.op in ("expand", "rebalance"):
        try:
            op_args[1] = text_key(op_args[1])
        except BadKey as e:
            print(f"refused: {e}", file=sys.stderr)
            return 2
    asked = {"op": args.op, "args": op_args, "dry_run": args.dry_run, "force": args.force,
             "wait": not args.no_wait, "timeout": args.timeout}  # fmt: skip
    code, body = request(supers, token, "/reconfigure", asked, timeout=args.timeout + 10)
    return _show(code, body, args.json, _plan_text)


def _show(code: int, body: dict[str, Any], as_json: bool, text: Any) -> int:
    if as_json:
        print(json.dumps(body, indent=1))
    elif code == 200:
        print(text(body))
    else:
        print(f"refused: {body.get('error', body)}" if code in (400, 401, 409)
              else f"failed: {body.get('error', body)}", file=sys.stderr)  # fmt: skip
    return 0 if code == 200 else (2 if code in (400, 401, 409) else 1)


def _status_text(st: dict[str, Any]) -> str:
    if not st.get("joined"):
        return "the super has not joined yet"
    lines = [
        f"version {st['version']}, replication {st['replication']}, {st['partitioning']} "
        f"partitioning, leading router {st.get('leader') or '-'}, supers (oldest first) "
        f"{', '.join(st['supers'])}, coordinator {st.get('coordinator') or '-'}, "
        f"clients {st['clients']}"
    ]
    load = st.get("load", {})
    rows = [["#", "process", "id", "partition", "state", "ops/s", "items", "queued", "rtt ms"]]
    for i, r in enumerate(st["ring"]):
        name = r["name"]
        state = ("suspected" if r["suspected"] else "busy" if name in st["busy"]
                 else "incomplete" if name in st["incomplete"] else "active")  # fmt: skip
        f = load.get(name, {})
        figures = [str(f.get(k, "")) for k in ("ops_per_s", "items", "queued", "rtt_ms")]
        rows.append([str(i), name, r["id"], r.get("partition", ""), state, *figures])
    lines += aligned(rows)
    lines.append(f"standby: {', '.join(st['standby']) or 'none'}")
    pending = st.get("pending", {})
    lines.append("pending: " + (", ".join(f"version {v} waits for {', '.join(w)}"
                                           for v, w in pending.items()) or "none"))  # fmt: skip
    return "\n".join(lines)


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows of cells as lines of left-aligned columns two spaces apart (tables for
    people: ``rubberband admin status``, ``rubberband client``)."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]  # fmt: skip


def _plan_text(r: dict[str, Any]) -> str:
    shown = [a if isinstance(a, str) else json.dumps(a) for a in r["args"]]  # keys as typed
    what = f"{r['op']} {' '.join(shown)}"
    if not r.get("submitted"):
        head = f"dry run: {what} from version {r['version_from']} (nothing changed)"
    else:
        head = f"{what}: version {r['version_from']} -> {r['version']}"
    return "\n".join([head, *(f"  {line}" for line in r.get("instructions", []))])


def _wait(supers: list[str], token: str, args: argparse.Namespace) -> int:
    """Until keyspace version ``VERSION`` is reached and no storage process still
    prepares it, or without a version until no version is pending at all; exit 1 with
    what it waits for on a timeout."""
    version: int | None = None
    if args.args:
        try:
            version = int(args.args[0])
        except ValueError:
            print(f"refused: VERSION is an integer, not {args.args[0]!r}", file=sys.stderr)
            return 2
    deadline = time.monotonic() + args.timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        code, body = request(supers, token, "/status", timeout=5.0)
        if code in (401, 400):
            return _show(code, body, args.json, str)
        if code == 200 and body.get("joined", True):
            pending = body.get("pending", {})
            if version is None and not pending:
                print(json.dumps(body) if args.json else f"version {body.get('version')}: "
                      "nothing pending")  # fmt: skip
                return 0
            if (
                version is not None
                and body.get("version", -1) >= version
                and not pending.get(str(version))
            ):
                print(json.dumps(body) if args.json else f"version {version} is ready")
                return 0
        time.sleep(0.2)
    pending = body.get("pending", {})
    if version is None:
        what = "; ".join(f"version {v} waits for {', '.join(w)}" for v, w in pending.items())
        print(f"failed: still pending after {args.timeout:g} s: {what or 'no status'}",
              file=sys.stderr)  # fmt: skip
        return 1
    who = ", ".join(pending.get(str(version)) or []) or "nothing"
    print(f"failed: version {version} not ready in {args.timeout:g} s (current version "
          f"{body.get('version')}; waiting for {who})", file=sys.stderr)  # fmt: skip
    return 1


def _place(supers: list[str], token: str, args: argparse.Namespace) -> int:
    """A new cluster's bootstrap: wait until the supers know ``N`` storage processes in
    standby, then expand each onto the empty ring, ids spread evenly.  Idempotent, so a
    deploy may run it on every start: once the ring holds any process it places nothing
    (later processes are placed by ``replace``, ``expand`` or the supers' repair)."""
    try:
        n = int(args.args[0])
    except ValueError:
        n = 0
    if n < 1:
        print(f"refused: N is a positive integer, not {args.args[0]!r}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.timeout
    body: dict[str, Any] = {}
    while True:
        code, body = request(supers, token, "/status", timeout=5.0)
        if code in (401, 400):
            return _show(code, body, args.json, str)
        if code == 200 and body.get("joined"):
            if body.get("ring"):
                print(f"the ring holds {len(body['ring'])} storage process(es): nothing placed")
                return 0
            if len(body.get("standby", ())) >= n:
                break
        if time.monotonic() >= deadline:
            print(f"failed: {len(body.get('standby', ()))} storage process(es) in standby "
                  f"after {args.timeout:g} s, {n} asked", file=sys.stderr)  # fmt: skip
            return 1
        time.sleep(0.5)
    names = sorted(body["standby"], key=_natural)[:n]
    ids = spread(n, body.get("partitioning", "range"), args.key_space)
    for name, at in zip(names, ids, strict=True):
        code, answer = request(
            supers, token, "/reconfigure",
            {"op": "expand", "args": [name, at], "wait": True, "timeout": args.timeout},
            timeout=args.timeout + 10,
        )  # fmt: skip
        if code != 200:
            return _show(code, answer, args.json, _plan_text)
        print(f"placed {name} at {at}")
    return 0


def _natural(name: str) -> tuple[Any, ...]:
    """``storage:2`` before ``storage:10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
