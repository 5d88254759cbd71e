"""How long the keyspace takes on a router's destset path, and the optimizer on a super.

Not a test (timings on a shared VM are not pass/fail); run it by hand:

    python -m tests.placement_timing

It prints the best of several ``timeit`` repeats per call, in microseconds (routing) and
milliseconds (optimizer).
"""

from __future__ import annotations

import timeit

from rubberband import keys as K
from rubberband.placement import Keyspace


def _ring(n: int, f: int) -> Keyspace:
    return Keyspace(f, [(K.encode_key(f"user{i * 1000 // n:04d}"), f"s{i}") for i in range(n)])


def _best_us(fn, number: int = 20000, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def routing() -> None:
    ks = _ring(16, 3)
    suspected = frozenset({"s3"})
    busy = frozenset({"s5", "s6"})
    view = ks.routing(suspected, busy)
    one = (K.point("user0421"),)
    four = K.normalize(
        [
            K.key_range("user0100", "user0180"),
            K.key_range("user0300", "user0450"),
            K.point("user0600"),
            K.key_range("user0800", "user0990"),
        ]
    )
    print(f"16 processes, f=3; the 4-range read touches {len(view.read_cover(four, 1))} holders")
    cases = [
        ("write_set, one key (Routing)", lambda: view.write_set(one)),
        ("write_set, one key (Keyspace, cached)", lambda: ks.write_set(one, suspected)),
        ("write_set, 4 ranges (Routing)", lambda: view.write_set(four)),
        ("read_cover, one key (Routing)", lambda: view.read_cover(one, 7)),
        ("read_cover, 4 ranges (Routing)", lambda: view.read_cover(four, 7)),
        ("read_cover, 4 ranges (Keyspace)", lambda: ks.read_cover(four, 7, busy, suspected)),
        ("read_cover, everything (Routing)", lambda: view.read_cover(K.EVERYTHING, 7)),
    ]
    for label, fn in cases:
        print(f"{label + ':':<42}{_best_us(fn):6.2f} us")
    build = _best_us(lambda: Keyspace(3, ks.ring()).routing(suspected, busy), number=500)
    print(f"{'new Keyspace + Routing (16 processes):':<42}{build:6.1f} us")


def optimizer() -> None:
    from rubberband.optimizer import optimize

    for f in (3, 5):
        ks = _ring(64, f)
        grown = ks.expand(K.encode_key("user0500x"), "new")
        shrunk = ks.contract("s20")
        for label, old, new in (("expand", ks, grown), ("contract", ks, shrunk)):
            ms = _best_us(lambda o=old, n=new: optimize(o, n), number=5, repeat=3) / 1000
            plan = optimize(old, new)
            print(
                f"{f'optimize {label}, 64 processes, f={f}:':<42}{ms:6.1f} ms "
                f"({plan.ranking.considered} of {plan.ranking.total} solutions ranked)"
            )


if __name__ == "__main__":
    routing()
    optimizer()
