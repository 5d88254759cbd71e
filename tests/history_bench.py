"""How fast ecast.history checks a large history: a benchmark printout, not a test.

    python -m tests.history_bench [--messages 200000] [--learned]

Builds the history of a correct key-ring run (16 receivers, replication 3, 4 clients:
each data message is one submission, three deliveries and one acknowledgement, so
200,000 messages make a million events), writes it as JSON lines, then times reading the
file and running every check with the config, as ``python -m rubberband.checkers`` does.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from ecast.core.config import KeyRingConfig
from ecast.history import check_history, read_history, write_history
from tests import history_gen as g


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.history_bench")
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--receivers", type=int, default=16)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--learned", action="store_true", help="include the routers' logs")
    args = ap.parse_args()
    config = KeyRingConfig.initial(replication=3)
    ms = [g.join(f"d{i}", role="receiver") for i in range(1, args.receivers + 1)]
    ms += [g.join(f"c{i}", role="client") for i in range(1, args.clients + 1)]
    per = args.messages // args.clients
    ms += [
        g.data(f"c{c}", s, {"key": s * 7 + c})
        for s in range(1, per + 1)
        for c in range(1, args.clients + 1)
    ]
    started = time.perf_counter()
    history = g.run(ms, config, learned=args.learned)
    built = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.jsonl"
        started = time.perf_counter()
        write_history(history, path)
        wrote = time.perf_counter() - started
        size = os.path.getsize(path)
        del history
        started = time.perf_counter()
        back = read_history(path)
        read = time.perf_counter() - started
        verdict = check_history(back, config)
        total = time.perf_counter() - started
    events = len(back)
    print(f"events            {events:,} ({size / 1e6:.0f} MB of JSON lines)")
    print(f"built / written   {built:.1f} s / {wrote:.1f} s")
    print(f"read              {read:.1f} s")
    print(f"checked           {verdict.stats['check_s']:.1f} s ({len(verdict.ran)} checks)")
    print(f"file to verdict   {total:.1f} s  ({events / total:,.0f} events/s)")
    print(f"verdict           {'ok' if verdict.ok else verdict.messages()}")


if __name__ == "__main__":
    main()
