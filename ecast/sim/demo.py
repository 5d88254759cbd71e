"""The main job of this stage of the project: a simulated E-Cast router group at work.

Five routers agree on one command sequence with ufabcast while a nemesis crashes the
leader, partitions the network, adds routers and drops frames.  Progress is printed as it
happens (paced so a person can follow it), then every checker gives its verdict.
"""

from __future__ import annotations

import argparse
import sys
import time

from ecast.sim.__main__ import ufab_config
from ecast.sim.ufab import SITUATIONS, UfabRun


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ecast.sim.demo", description=__doc__)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--routers", type=int, default=5)
    ap.add_argument("--commands", type=int, default=4000)
    ap.add_argument("--fault-time", type=float, default=12.0)
    ap.add_argument("--pace", type=float, default=0.25, help="real seconds per virtual second")
    args = ap.parse_args(argv)
    cfg = ufab_config(
        seed=args.seed, routers=args.routers, commands=args.commands, fault_time=args.fault_time
    )
    cfg.fault_rate = 1.5

    def show(line: str) -> None:
        print(line, flush=True)
        if line.startswith("t=") and " view " in line and args.pace > 0:
            time.sleep(args.pace)

    cfg.progress = show
    print(
        f"ufabcast: {args.routers} routers, {args.commands} commands, faults for "
        f"{args.fault_time:.0f}s of virtual time, seed {args.seed}",
        flush=True,
    )
    run = UfabRun(cfg)
    result = run.run()
    print()
    print(
        f"{result.commands} commands proposed, {result.executed} executed in one total order; "
        f"{result.routers_started} routers took part; {len(result.faults) - 1} faults; "
        f"{result.virtual_s:.1f}s virtual in {result.wall_s:.2f}s of computation"
    )
    reached = [s for s in SITUATIONS if result.situations[s]]
    print(f"fault situations reached: {', '.join(reached) or 'none'}")
    if result.violations:
        print("CHECKERS FOUND VIOLATIONS:")
        for v in result.violations:
            print(f"  {v}")
        return 1
    print(
        "every checker passed: validity, no duplicates, FIFO per proposer, one total order, "
        "uniform agreement, termination, bounded memory"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
