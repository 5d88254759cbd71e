"""``rubberband bench maintainer``: a view maintainer's CPU per base change, alone.

The views benchmark (``rubberband bench views``) measures what a view costs a whole
cluster on one machine, where every process shares the cores and a run's figures move
with the machine's phase by more than most changes to the maintainer save.  This one
runs a maintainer's core alone in this process, as its daemon runs it: pages of base
changes (the views benchmark's values, random keys) through :meth:`Maintainer.page`,
and the writes it returns made into messages by a client's
:meth:`~rubberband.messages.Messages.writes_of` and encoded.  It prints the
microseconds per base change of the fastest and the median of ``--rounds`` rounds,
and the row versions a change made.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

import msgpack

from ecast import tune_process
from rubberband.bench.views import _value, _views
from rubberband.changelog import Event
from rubberband.messages import Messages
from rubberband.sdk import load_ops
from rubberband.views.define import view_def
from rubberband.views.maintain import Maintainer

KINDS = ("index", "aggregate", "selection", "projection")
"""The views of ``rubberband bench views`` over one source."""


def measure(kind: str, keys: int, page: int, rounds: int, seed: int = 7) -> dict[str, Any]:
    """The CPU per base change of the fastest and the median of ``rounds`` rounds of
    10 pages of ``page`` changes to ``keys`` base keys each, after a start from a
    snapshot of them, and the row versions a change made."""
    rng = random.Random(seed)
    name, source, _kind, spec = next(v for v in _views(len(KINDS), keys) if v[2] == kind)
    view = view_def(name, kind, source, **spec)
    m = Maintainer(view)
    messages = Messages(load_ops(None))
    packer = msgpack.Packer(use_bin_type=True)
    m.start([], [[([(k, _value(rng)) for k in range(keys)], 1)]], 0.0)
    position, rows_before = 2, m.versions
    pages = []
    for _ in range(rounds * 10):
        events = []
        for _ in range(page):
            position += 1
            events.append(Event(position, ((rng.randrange(keys), "put", _value(rng)),)))
        position += 1
        pages.append((position, events))
    times = []
    for r in range(rounds):
        started = time.process_time()
        for at, events in pages[r * 10 : (r + 1) * 10]:
            writes = m.page(0, at, events, 0.0)
            m.published(m.position, m.floor)  # (its writes applied: dead rows may go)
            for _i, payload, header in messages.writes_of(writes, 1, 1 << 20, lambda op: True):
                packer.pack((header, payload))
        times.append((time.process_time() - started) / (10 * page))
    ordered = sorted(times)
    return {
        "kind": kind, "keys": keys, "page": page, "rounds": rounds,
        "us_per_change_min": round(1e6 * ordered[0], 2),
        "us_per_change_median": round(1e6 * ordered[len(ordered) // 2], 2),
        "row_versions_per_change": round((m.versions - rows_before) / (rounds * 10 * page), 2),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rubberband bench maintainer", description=__doc__)
    ap.add_argument("--kind", choices=KINDS, default="index")
    ap.add_argument("--keys", type=int, default=50_000, help="base keys the changes pick from")
    ap.add_argument("--page", type=int, default=400, help="base changes a feed page holds")
    ap.add_argument("--rounds", type=int, default=20, help="rounds of 10 pages each")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if min(a.keys, a.page, a.rounds) < 1:
        ap.error("--keys, --page and --rounds are at least 1")
    tune_process(keeps_data=True)  # the collector as a maintainer daemon has it
    r = measure(a.kind, a.keys, a.page, a.rounds)
    print(f"{r['kind']} view, {r['keys']:,} base keys, pages of {r['page']}: "
          f"{r['us_per_change_min']} µs of CPU a base change (median "
          f"{r['us_per_change_median']}), {r['row_versions_per_change']} row versions a "
          "change", flush=True)  # fmt: skip
    if a.json:
        print(json.dumps({"experiment": "maintainer", **r}))
    return 0
