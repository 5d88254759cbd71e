"""``rubberband cluster up`` on the directory of a cluster that lost every process: the
supers' record of the ring, the holders' engines brought level, and the wait for the
ring to be put back (docs/operations.md, "Restarting a whole cluster")."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ecast import local
from rubberband.tools.daemons import read_keyspace_record

KEYSPACE_FILE = "keyspace-s{}.msgpack"
"""Where super ``super:sN`` of a local cluster records the ring (``--keyspace-file``)."""


def member(entry: dict[str, Any]) -> bool:
    """Is a recorded process a member of the cluster (a router, super or storage
    process)?  Others recorded beside them, a view's maintainer, are its clients: one
    that outlived a power cut goes on against the restarted cluster."""
    return bool({"router", "super", "storage"} & set(entry.get("argv", ())))


def recorded_keyspace(d: Path) -> Any:
    """The newest ring the supers of ``d`` recorded, if a cluster on a durable engine
    lived there and every process of it is gone; None for a new cluster, whose supers
    then start without the records an earlier cluster in memory left (they would wait
    to restore a ring whose data is gone, and refuse every placement meanwhile)."""
    files = sorted(d.glob(KEYSPACE_FILE.format("*")))
    records = [r for r in (read_keyspace_record(str(f)) for f in files) if r is not None]
    if not records or not (d / "data").is_dir():
        for f in files:
            f.unlink()
        return None
    live = [
        n for n, e in local.StateDir.recorded(d).items() if member(e) and local.running(e["pid"])
    ]
    if live:
        raise SystemExit(f"rubberband cluster up: {d} has a live cluster ({', '.join(live)})")
    return max(records, key=lambda r: r[2])


def restart_numbers(record: Any) -> list[int]:
    """The numbers N of the recorded holders ``storage:N`` (local clusters' names)."""
    names = [p for _, p in record[3]]
    if not all(p.startswith("storage:") and p[8:].isdigit() for p in names):
        raise SystemExit(f"rubberband cluster up: cannot restart holders named {names}")
    return sorted(int(p[8:]) for p in names)


def check_holders(
    d: Path, record: Any, numbers: list[int], engine: str = "log", options: Sequence[str] = ()
) -> list[int]:
    """Check the holders' data before they start: every record of every log read,
    checksums and all (the storage processes then bring themselves level through the
    coordinating super, :class:`rubberband.restart.Leveller`).  Returns the holders
    whose disk is gone (their ranges are on the others; a super repairs them onto a
    standby); refuses when every copy of some range is gone, or a log is damaged."""
    from rubberband.engine import Placement
    from rubberband.keys import EVERYTHING, covers, union
    from rubberband.placement import Keyspace
    from rubberband.tools.daemons import UsageError, make_engine

    f, partitioning, _version, ring, *_ = record
    keyspace = Keyspace(f, ring)
    lost = [n for n in numbers if not any((d / "data" / f"storage{n}").glob("log-*.seg"))]
    held = [keyspace.partition(f"storage:{n}") for n in numbers if n not in lost]
    kept = held[0] if held else ()
    for part in held[1:]:
        kept = union(kept, part)
    if not covers(kept, EVERYTHING):
        raise SystemExit(
            f"rubberband cluster up: the data of storage {lost} is gone, and with it every "
            "copy of some range: the cluster cannot restart from its disks"
        )
    positions = {}
    for n in numbers:
        if n in lost:
            continue
        try:
            e = make_engine(engine, [*options, f"path={d / 'data' / f'storage{n}'}"])
        except UsageError as err:
            raise SystemExit(f"rubberband cluster up: storage:{n}: {err}") from None
        try:
            e.placement = Placement(partitioning)
            positions[f"storage:{n}"] = e.position
            e.tail(e.position)  # reads every record
        except OSError as err:  # a damaged log
            raise SystemExit(f"rubberband cluster up: {err}") from None
        finally:
            e.close()
    print(f"holders' logs checked (positions {positions}); they are brought level once "
          "they join")  # fmt: skip
    if lost:
        print(f"the disks of storage {lost} are gone: their ranges restart on the other "
              "holders, and a standby takes their place once a super repairs them")  # fmt: skip
    return lost


def stopped_storage(d: Path, started: list[str]) -> list[str]:
    """Storage processes this start ``started`` (their keys in ``processes.json``)
    that exited since, each with the reason its log gives (the others recorded there
    belong to the cluster before: a standby it had is not started again)."""
    out = []
    for key, p in json.loads((d / "processes.json").read_text()).items():
        if key in started and not local.running(p["pid"]):
            lines = Path(p["log"]).read_text(errors="replace").splitlines()
            said = [x for x in lines if "event=stopped" in x or "Error" in x]
            out.append(f"{key}: {(said or lines or ['(no log)'])[-1]}")
    return out


HOLDERS_SETTLE = 1.0
"""Seconds ``cluster up`` waits after the ring is restored before it checks that every
storage process took it (they deliver the restore about when the supers do)."""


def restored(
    record: Any,
    t0: float,
    timeout: float,
    status: Callable[[], tuple[int, dict[str, Any]]],
    stopped: Callable[[], list[str]] = list,
) -> int:
    """Wait until the supers put the recorded ring back (``status``: a super's), and
    a moment more for the holders to take it (``stopped``: the storage processes that
    exited, with why: a holder that meets a restore at or below its newest position,
    for one, which the super's own check should keep from happening)."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        code, body = status()
        if code == 200 and body.get("version", 0) >= 1 and body.get("ring"):
            time.sleep(HOLDERS_SETTLE)
            gone = stopped()
            if gone:
                print("rubberband cluster up: the ring was restored but storage processes "
                      f"stopped: {'; '.join(gone)}", file=sys.stderr)  # fmt: skip
                return 1
            print(
                f"cluster restarted in {time.monotonic() - t0:.1f} s from its disks: ring of "
                f"{len(record[3])} restored (it was at version {record[2]}); items each "
                f"holder lacked and was given: {body.get('levelled')}"
            )
            return 0
        time.sleep(0.2)
    print(f"rubberband cluster up: the ring was not restored: {body}", file=sys.stderr)
    return 1
