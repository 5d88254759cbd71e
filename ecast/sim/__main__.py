"""Run one seeded simulation and print the checkers' verdict.

    python -m ecast.sim --layer ufabcast --routers 3 --commands 1000 \\
        --faults crash,join,partition --seed 7 --json

Exits 1 when any checker reports a violation, so a failing seed from the test suite
replays with the printed command line; the output is identical under any
``PYTHONHASHSEED`` (the ``digest`` field covers every upcall and fault of the run).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ecast.sim.ufab import FAULT_KINDS, UfabRunConfig, run_ufabcast
from ecast.ufabcast import MUTATIONS, UfabParams


def ufab_config(
    seed: int,
    routers: int = 3,
    commands: int = 300,
    faults: tuple[str, ...] = FAULT_KINDS,
    max_active: int = 32768,
    clumping: bool = True,
    fault_time: float = 8.0,
    mutations: frozenset[str] = frozenset(),
) -> UfabRunConfig:
    """The one place that turns run parameters into a config (CLI and tests share it)."""
    params = UfabParams(
        max_active=max_active,
        clump_trigger=3 if clumping else 1,
        clump_delay=0.010 if clumping else 0.0,
        mutations=mutations,
    )
    return UfabRunConfig(
        seed=seed,
        routers=routers,
        commands=commands,
        faults=faults,
        fault_time=fault_time,
        ufab=params,
    )


def replay_command(**kw: Any) -> str:
    """The command line that reruns a schedule given as ``ufab_config`` keywords."""
    parts = ["python -m ecast.sim --layer ufabcast"]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else f"--no-{key.replace('_', '-')}")
        elif isinstance(value, (tuple, frozenset, set)):
            if value:
                parts.append(f"{flag} {','.join(sorted(value))}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ecast.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--layer", choices=["ufabcast"], default="ufabcast")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--commands", type=int, default=300)
    ap.add_argument("--faults", type=_csv, default=FAULT_KINDS, help=",".join(FAULT_KINDS))
    ap.add_argument("--max-active", type=int, default=32768)
    ap.add_argument("--clumping", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--fault-time", type=float, default=8.0)
    ap.add_argument("--mutations", type=_csv, default=(), help=",".join(sorted(MUTATIONS)))
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--progress", action="store_true", help="print faults as they happen")
    args = ap.parse_args(argv)
    unknown = set(args.faults) - set(FAULT_KINDS)
    if unknown:
        ap.error(f"unknown faults {sorted(unknown)}; choose from {','.join(FAULT_KINDS)}")
    cfg = ufab_config(
        seed=args.seed,
        routers=args.routers,
        commands=args.commands,
        faults=tuple(args.faults),
        max_active=args.max_active,
        clumping=args.clumping,
        fault_time=args.fault_time,
        mutations=frozenset(args.mutations),
    )
    if args.progress:
        cfg.progress = lambda line: print(line, flush=True)
    result = run_ufabcast(cfg)
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True))
    else:
        print(
            f"seed {result.seed}: {result.commands} commands, {result.executed} executed, "
            f"{result.routers_started} routers started, {len(result.faults)} faults, "
            f"{result.virtual_s:.1f}s virtual in {result.wall_s:.2f}s"
        )
        reached = [k for k, v in result.situations.items() if v]
        print(f"situations reached: {', '.join(reached) or 'none'}")
        if result.violations:
            print("VIOLATIONS:")
            for v in result.violations:
                print(f"  {v}")
        else:
            print("every checker passed")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
