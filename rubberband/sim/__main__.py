"""``python -m rubberband.sim --seed 7 --json``: one seeded Rubberband run, checked."""

from __future__ import annotations

import argparse
import json
import sys

from rubberband.driver import INTAKE_BATCH
from rubberband.holds import HOLD_AT
from rubberband.sim import MUTATIONS, RB_FAULTS, SCENARIOS, RbRunConfig, run_rubberband
from rubberband.sim.run import unsupported


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rubberband.sim", description=__doc__)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--storage", type=int, default=6)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--clients", type=int, help="default: one per 200 operations, at least 4")
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--faults", default=",".join(RB_FAULTS))
    ap.add_argument("--fault-time", type=float, default=8.0)
    ap.add_argument("--mutation", choices=MUTATIONS)
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), help="a fixed schedule, no faults")
    ap.add_argument("--supers", type=int, default=1)
    ap.add_argument("--answer-timeout", type=float, default=1.0, help="seconds a read may take")
    ap.add_argument(
        "--engine",
        default="storage_adapters.memory:MemoryEngine",
        help="module:Class of an engine answering the key-value operations "
        "(storage_adapters.scan.kv:ScanKVEngine: the scan engine)",
    )
    ap.add_argument(
        "--auto-repair",
        action="store_true",
        help="the super repairs broken holders on its own (the nemesis does not)",
    )
    ap.add_argument(
        "--no-standby",
        action="store_true",
        help="with --auto-repair: start no standby after a crash (the super contracts), "
        "only once the super can plan no repair",
    )
    ap.add_argument(
        "--bundle",
        action="store_true",
        help="reads and appends travel in bundles of two (read_batch's, write_batch's)",
    )
    ap.add_argument(
        "--codec",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every frame through the real wire codec (--no-codec: faster)",
    )
    ap.add_argument("--feed", action="store_true", help="a client follows the change feed too")
    ap.add_argument("--views", action="store_true",
                    help="views kept by maintainers, read at every level")  # fmt: skip
    ap.add_argument("--churn", action="store_true",
                    help="with --views: rows leave the views, maintainers drop them")  # fmt: skip
    ap.add_argument("--chunk-bytes", type=int, default=400,
                    help="a migration's chunks: smaller ones make copies last longer")  # fmt: skip
    ap.add_argument("--change-log", type=int, default=None,
                    help="changes each storage process keeps (small: the views' maintainers "
                    "fall behind, and the intakes are held for them)")  # fmt: skip
    ap.add_argument("--view-hold-at", type=float, default=HOLD_AT,
                    help="share of the change log at which storage processes hold the "
                    "writers back for a view's maintainer (0: never)")  # fmt: skip
    ap.add_argument("--intake-batch", type=int, default=INTAKE_BATCH,
                    help="deliveries a storage process takes in at a time")  # fmt: skip
    ap.add_argument("--mixed-appends", action="store_true",
                    help="some bulky writes append to two keys, mostly refused in one")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = [f for f in faults if f not in RB_FAULTS]
    if unknown:
        print(f"unknown faults {unknown}; known: {', '.join(RB_FAULTS)}", file=sys.stderr)
        return 2
    cfg = RbRunConfig(
        seed=args.seed,
        routers=args.routers,
        storage=args.storage,
        replication=args.replication,
        clients=args.clients,
        ops=args.ops,
        faults=() if args.scenario else faults,
        fault_time=args.fault_time,
        mutation=args.mutation,
        scenario=args.scenario,
        supers=args.supers,
        answer_timeout=args.answer_timeout,
        engine=args.engine,
        auto_repair=args.auto_repair,
        keep_standby=not args.no_standby,
        bundle=args.bundle,
        codec=args.codec,
        feed=args.feed,
        views=args.views,
        churn=args.churn,
        mixed_appends=args.mixed_appends,
        chunk_bytes=args.chunk_bytes,
        change_log=args.change_log,
        intake_batch=args.intake_batch,
        view_hold_at=args.view_hold_at,
    )
    if args.mutation:
        import os

        from ecast.core import mutations

        os.environ.setdefault(mutations.ENV, "1")  # this command exists to plant bugs
    why = unsupported(cfg)
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    res = run_rubberband(cfg)
    out = res.to_json()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 1 if res.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
