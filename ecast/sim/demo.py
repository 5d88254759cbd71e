"""The main job at this stage of the project: a simulated E-Cast system at work.

Three routers agree on one message sequence (ufabcast) and route it through the key-ring
config to sixteen receivers with replication factor three, while submitters send and a
monitor watches.  A nemesis crashes and isolates the leader, partitions the network, adds
routers, crashes and falsely suspects application processes and drops frames.  Progress
is printed as it happens (paced so a person can follow it); then every checker of E-Cast's
guarantees gives its verdict.
"""

from __future__ import annotations

import argparse
import sys
import time

from ecast.sim.__main__ import ecast_config
from ecast.sim.ecast_run import ECAST_SITUATIONS, EcastRun


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ecast.sim.demo", description=__doc__)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--receivers", type=int, default=16)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--fault-time", type=float, default=12.0)
    ap.add_argument("--pace", type=float, default=0.25, help="real seconds per virtual second")
    args = ap.parse_args(argv)
    cfg = ecast_config(
        seed=args.seed,
        routers=args.routers,
        receivers=args.receivers,
        replication=args.replication,
        messages=args.messages,
        fault_time=args.fault_time,
    )
    cfg.fault_rate = 1.0

    def show(line: str) -> None:
        print(line, flush=True)
        if " view " in line and args.pace > 0:
            time.sleep(args.pace)

    cfg.progress = show
    print(
        f"E-Cast: {args.routers} routers, {args.receivers} receivers (replication "
        f"{args.replication}), 3 submitters, {args.messages} messages, faults for "
        f"{args.fault_time:.0f}s of virtual time, seed {args.seed}",
        flush=True,
    )
    result = EcastRun(cfg).run()
    print()
    print(
        f"{result.messages} messages submitted, {result.stable} stable acknowledgements, "
        f"{result.delivered} deliveries in one total order, {result.unsafe_accepted} of "
        f"{result.unsafe_delivered} unsafe copies accepted; {result.routers_started} routers "
        f"took part; {len(result.faults) - 1} faults; {result.virtual_s:.1f}s virtual in "
        f"{result.wall_s:.1f}s of computation"
    )
    reached = [s for s in ECAST_SITUATIONS if result.situations[s]]
    print(f"fault situations reached: {', '.join(reached) or 'none'}")
    if result.violations:
        print("CHECKERS FOUND VIOLATIONS:")
        for v in result.violations:
            print(f"  {v}")
        return 1
    print(
        "every checker passed: validity, no duplicates, minimality, one total order, gap-free "
        "sessions, causal order, uniform agreement, acknowledgement safety, consistent unsafe "
        "cuts, termination, quiescence, bounded memory"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
