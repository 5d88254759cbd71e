"""A Ticket-like table and workload for benchmarks (dissertation Appendix A, 2.10.2).

The Amadeus Ticket schema has 47 attributes; this keeps 22 of them with realistic
value distributions: a few hot airlines, airports and offices (Zipf), departure dates
over a year, passenger names from a long-tailed vocabulary, mostly economy cabins and
confirmed bookings.  The booking code ``rloc`` is the key (unique per row here).

Queries pick their predicate attributes with Algorithm 9 of 2.10.2: the number of
attributes is binomial B(N, D/N), each pick is drawn from a Zipf(s) distribution over
the attributes in Amadeus' frequency order (flight number and departure date first,
the booking code sixteenth in the real workload) without replacement.  Constants come
from a random existing row, so every query has an answer; dates and yields are matched
by small ranges part of the time, names by prefix.  Like the Amadeus workload (which is
"highly selective, matching only a few of the multi-million records"), a query that
would still select more than ``MAX_SELECTIVITY`` of the table keeps drawing attributes
by the same Zipf law until it does not.

Updates follow 2.10.2 too: mostly updates by booking code, and inserts and deletes at a
fifth of that rate each.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np

TABLE = "tickets"
KEY = "rloc"
SCHEMA: list[tuple[str, str]] = [
    ("rloc", "varchar(6) not null"),
    ("provider", "varchar(3)"),
    ("productId", "int32"),
    ("alphaSuffix", "char(1)"),
    ("dateOut", "date"),
    ("dateIn", "date"),
    ("cityFrom", "varchar(3)"),
    ("cityTo", "varchar(3)"),
    ("paxTattoo", "int16"),
    ("segmentTattoo", "int16"),
    ("office", "varchar(9)"),
    ("creationDate", "date"),
    ("name", "varchar(57)"),
    ("firstName", "varchar(56)"),
    ("sex", "bool"),
    ("cabin", "char(1)"),
    ("classOfService", "char(1)"),
    ("bookingStatus", "varchar(2)"),
    ("bookingDate", "date"),
    ("posCountry", "varchar(2)"),
    ("yieldValue", "int32"),
    ("canceled", "bool"),
]
COLUMNS = [name for name, _ in SCHEMA]
PREDICATE_ORDER = [
    "productId",
    "dateOut",
    "provider",
    "cityFrom",
    "cityTo",
    "classOfService",
    "cabin",
    "bookingStatus",
    "posCountry",
    "office",
    "name",
    "firstName",
    "creationDate",
    "bookingDate",
    "paxTattoo",
    "rloc",
    "segmentTattoo",
    "sex",
    "dateIn",
    "alphaSuffix",
    "canceled",
    "yieldValue",
]
"""Attributes by how often Amadeus queries test them (most often first)."""
MAX_SELECTIVITY = 1e-3
DATES = {"dateOut", "dateIn", "creationDate", "bookingDate"}
BASE_DAY = dt.date(2024, 1, 1)
_LETTERS = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
_ALNUM = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))


def _zipf_choice(rng: np.random.Generator, vocab: np.ndarray, s: float, n: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** s
    return vocab[rng.choice(len(vocab), size=n, p=weights / weights.sum())]


def _codes(rng: np.random.Generator, alphabet: np.ndarray, width: int, n: int) -> np.ndarray:
    picks = alphabet[rng.integers(0, len(alphabet), size=(n, width))]
    return np.array(["".join(row) for row in picks.tolist()], dtype=object)


def _names(rng: np.random.Generator, n: int) -> np.ndarray:
    syllables = [
        "an",
        "ber",
        "ch",
        "do",
        "el",
        "fi",
        "gar",
        "ho",
        "is",
        "ju",
        "ka",
        "li",
        "mo",
        "na",
        "or",
        "pe",
        "qu",
        "ri",
        "sa",
        "to",
        "ul",
        "ve",
        "wi",
        "xa",
        "yo",
        "ze",
        "mann",
        "son",
        "ez",
        "ov",
    ]
    parts = rng.integers(0, len(syllables), size=(n, 4))
    lengths = rng.integers(2, 5, size=n)
    out = []
    for row, k in zip(parts.tolist(), lengths.tolist(), strict=True):
        out.append("".join(syllables[i] for i in row[:k]).upper())
    return np.unique(np.array(out, dtype=object))


def _iso(days: np.ndarray) -> list[str]:
    base = np.datetime64(BASE_DAY.isoformat(), "D")
    return (base + days.astype("timedelta64[D]")).astype(str).tolist()  # type: ignore[no-any-return]


@dataclass
class TicketData:
    """The generated rows, column-wise as plain Python lists (dates as ISO strings)."""

    columns: dict[str, list[Any]]
    rng: np.random.Generator

    @property
    def n(self) -> int:
        return len(self.columns[KEY])


def generate(n: int, seed: int = 1) -> TicketData:
    """``n`` Ticket rows with realistic (skewed) value distributions."""
    rng = np.random.default_rng(seed)
    rloc = _codes(rng, _ALNUM, 6, int(n * 1.05) + 16)
    rloc = np.unique(rloc)
    rng.shuffle(rloc)
    rloc = rloc[:n]
    providers = _codes(rng, _LETTERS, 2, 150)
    cities = np.unique(_codes(rng, _LETTERS, 3, 700))
    offices = np.unique(_codes(rng, _ALNUM, 9, 40000))
    countries = np.unique(_codes(rng, _LETTERS, 2, 200))
    surnames = _names(rng, max(2000, n // 4))
    first = _names(rng, max(500, n // 40))
    date_out = rng.integers(0, 365, size=n)
    creation = date_out - rng.integers(1, 300, size=n)
    cols: dict[str, Any] = {
        "rloc": rloc.tolist(),
        "provider": _zipf_choice(rng, providers, 1.2, n).tolist(),
        "productId": _zipf_choice(rng, np.arange(1, 8000), 0.9, n).tolist(),
        "alphaSuffix": [
            None if r < 0.95 else "ABCD"[int(r * 1000) % 4] for r in rng.random(n).tolist()
        ],
        "dateOut": _iso(date_out),
        "dateIn": _iso(date_out + rng.integers(0, 2, size=n)),
        "cityFrom": _zipf_choice(rng, cities, 1.1, n).tolist(),
        "cityTo": _zipf_choice(rng, cities, 1.1, n).tolist(),
        "paxTattoo": np.minimum(rng.geometric(0.5, size=n), 9).tolist(),
        "segmentTattoo": rng.integers(1, 7, size=n).tolist(),
        "office": _zipf_choice(rng, offices, 1.5, n).tolist(),
        "creationDate": _iso(creation),
        "name": _zipf_choice(rng, surnames, 0.8, n).tolist(),
        "firstName": _zipf_choice(rng, first, 1.0, n).tolist(),
        "sex": (rng.random(n) < 0.5).tolist(),
        "cabin": rng.choice(np.array(["Y", "C", "F"]), size=n, p=[0.8, 0.15, 0.05]).tolist(),
        "classOfService": _zipf_choice(rng, _LETTERS[:20], 1.0, n).tolist(),
        "bookingStatus": rng.choice(
            np.array(["HK", "TK", "UN", "HL", "KL"]), size=n, p=[0.85, 0.06, 0.04, 0.03, 0.02]
        ).tolist(),
        "bookingDate": _iso(creation + rng.integers(0, 4, size=n)),
        "posCountry": _zipf_choice(rng, countries, 1.3, n).tolist(),
        "yieldValue": np.minimum(rng.lognormal(8, 1.2, size=n), 2e9).astype(np.int64).tolist(),
        "canceled": (rng.random(n) < 0.03).tolist(),
    }
    return TicketData(cols, rng)


# ---------------------------------------------------------------- queries
Predicate = tuple[str, str, Any]


class Workload:
    """Queries and updates over generated data, identical for every engine it drives."""

    def __init__(self, data: TicketData, skew: float, mean_predicates: float, seed: int):
        self.data = data
        self.rng = np.random.default_rng(seed)
        self.skew = skew
        self.mean_predicates = mean_predicates
        self._sel = {name: self._frequencies(name) for name in PREDICATE_ORDER}
        self.live_keys = list(data.columns[KEY])
        self._next_key = 0

    def _frequencies(self, name: str) -> float:
        values = self.data.columns[name]
        if name == KEY:
            return 1.0 / len(values)
        _, counts = np.unique(np.array(values, dtype=object).astype(str), return_counts=True)
        p = counts / len(values)
        return float((p * p).sum())

    def _pick_attributes(self) -> list[str]:
        """Algorithm 9, continued past V while the conjunction is not selective."""
        n = len(PREDICATE_ORDER)
        z = 1.0 / np.arange(1, n + 1) ** self.skew
        z /= z.sum()
        v = max(1, int(self.rng.binomial(n, self.mean_predicates / n)))
        picked: list[int] = []
        while len(picked) < n:
            a = int(self.rng.choice(n, p=z))
            picked.append(a)
            z[a] = 0.0
            if z.sum() > 0:
                z /= z.sum()
            if len(picked) >= v:
                yield_ = [PREDICATE_ORDER[i] for i in picked]
                if self._estimate(yield_) <= MAX_SELECTIVITY:
                    return yield_
        return [PREDICATE_ORDER[i] for i in picked]

    def _estimate(self, names: list[str]) -> float:
        """Expected selectivity of equalities with a random row's values, independent
        attributes: the product of each attribute's sum of squared value frequencies."""
        sel = 1.0
        for name in names:
            sel *= self._sel[name]
        return sel

    def query(self) -> tuple[list[Predicate], list[str]]:
        """One select: its conjunction and its projection."""
        cols = self.data.columns
        row = int(self.rng.integers(0, self.data.n))
        preds: list[Predicate] = []
        for name in self._pick_attributes():
            value = cols[name][row]
            r = float(self.rng.random())
            if value is None:
                preds.append((name, "is null", None))
            elif name in DATES and r < 0.4:
                day = dt.date.fromisoformat(value)
                preds.append((name, ">=", (day - dt.timedelta(days=2)).isoformat()))
                preds.append((name, "<=", (day + dt.timedelta(days=2)).isoformat()))
            elif name == "yieldValue" and r < 0.7:
                preds.append((name, ">=", value - 200))
                preds.append((name, "<=", value + 200))
            elif name in ("name", "firstName") and r < 0.3:
                preds.append((name, "prefix", value[:3]))
            else:
                preds.append((name, "=", value))
        k = int(self.rng.integers(4, 9))
        proj = [KEY, *self.rng.choice(COLUMNS[1:], size=k, replace=False).tolist()]
        return preds, proj

    def update(self) -> tuple[str, Any]:
        """One write: ("update", (key, values)), ("insert", row) or ("delete", key)."""
        r = float(self.rng.random())
        keys = self.live_keys
        if r < 5 / 7 or len(keys) < 10:
            key = keys[int(self.rng.integers(0, len(keys)))]
            values = {
                "bookingStatus": ["HK", "TK", "UN", "HL"][int(self.rng.integers(0, 4))],
                "yieldValue": int(self.rng.integers(0, 100000)),
                "classOfService": "ABCDEFGHIJKLMNOPQRST"[int(self.rng.integers(0, 20))],
            }
            return "update", (key, values)
        if r < 6 / 7:
            template = int(self.rng.integers(0, self.data.n))
            row = {c: self.data.columns[c][template] for c in COLUMNS}
            self._next_key += 1
            row[KEY] = f"n{self._next_key:05d}"  # lower case: never a generated code
            keys.append(row[KEY])
            return "insert", row
        i = int(self.rng.integers(0, len(keys)))
        keys[i], keys[-1] = keys[-1], keys[i]
        return "delete", keys.pop()


def prefix_upper(p: str) -> str:
    """The smallest string above every string starting with ``p`` (for SQL ranges)."""
    return p[:-1] + chr(ord(p[-1]) + 1)
