"""Column types and table schemas of the scan engine (dissertation 2.2, Table 2.1).

A table is a set of records with a typed schema and one *key* attribute, the Rubberband
key that places every row on the ring.  The types follow SQL and Crescando's Table 2.1:

===============  =================  ==========================================
type             stored as          values in operations and results
===============  =================  ==========================================
``bool``         ``uint8`` 0/1      ``True`` / ``False``
``int8`` ..      ``int8`` ..        Python ``int`` in the type's range
``int64``        ``int64``          (``int``/``integer``/``bigint`` = ``int64``,
                                    ``smallint`` = ``int16``)
``float``        ``float64``        ``float`` or ``int`` (``double`` is an alias);
                                    NaN is refused (use NULL)
``date``         ``int32`` days     ISO ``"YYYY-MM-DD"`` (``datetime.date`` is
                 since 1970-01-01   accepted in operations)
``varchar(L)``   dictionary codes   ``str`` of at most L characters (``varchar``
                                    and ``text`` have no limit)
``char(N)``      dictionary codes   ``str`` of at most N characters
===============  =================  ==========================================

Every column is nullable unless its type ends in ``not null``; the key is never null.
``char(N)`` is a length-checked string: it is not padded, and trailing blanks count
(unlike SQL's ``PAD SPACE``).  Strings are stored as dictionary codes (2.9), so fixed
and variable strings cost the same; the distinction is the length check.

Values are validated and converted a column at a time (one pass of C-level checks per
column, not per cell), because bulk loads and migration chunks carry millions of cells.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rubberband.engine import BadOperation

Kind = Literal["bool", "int", "float", "date", "str"]

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
_ALIASES = {
    "int": "int64",
    "integer": "int64",
    "bigint": "int64",
    "smallint": "int16",
    "double": "float",
    "real": "float",
    "boolean": "bool",
    "text": "varchar",
    "string": "varchar",
    "str": "varchar",
}
_TYPE_RE = re.compile(r"^\s*([a-z0-9]+)\s*(?:\(\s*(\d+)\s*\))?\s*(not\s+null)?\s*$")
MIN_DAY = int(np.datetime64("0001-01-01", "D").astype(np.int64))
MAX_DAY = int(np.datetime64("9999-12-31", "D").astype(np.int64))


@dataclass(frozen=True, slots=True)
class ColumnType:
    """One column's type: its kind, storage dtype and limits."""

    name: str
    """Canonical spelling, e.g. ``int32``, ``varchar(6)``, ``date``."""
    kind: Kind
    dtype: np.dtype[Any]
    lo: int | None = None
    """Smallest value of an integer type."""
    hi: int | None = None
    max_len: int | None = None
    """Longest string of a string type (None: unlimited)."""

    @property
    def is_string(self) -> bool:
        return self.kind == "str"

    @property
    def discrete(self) -> bool:
        """Whether the stored values are integers (a comparison can be made inclusive)."""
        return self.kind != "float"


def parse_type(text: str) -> tuple[ColumnType, bool]:
    """The type named by ``text`` and whether it said ``not null``."""
    if type(text) is not str:
        raise BadOperation(f"a column type is a string such as 'int32', not {text!r:.40}")
    m = _TYPE_RE.match(text.lower())
    if m is None:
        raise BadOperation(f"unknown column type {text!r:.60}")
    base, size, not_null = m.group(1), m.group(2), m.group(3) is not None
    base = _ALIASES.get(base, base)
    if base in _INT_RANGES:
        if size is not None:
            raise BadOperation(f"{base} takes no length: {text!r}")
        lo, hi = _INT_RANGES[base]
        return ColumnType(base, "int", np.dtype(base), lo, hi), not_null
    if base in ("bool", "float", "date"):
        if size is not None:
            raise BadOperation(f"{base} takes no length: {text!r}")
        dtype = {"bool": np.uint8, "float": np.float64, "date": np.int32}[base]
        kind: Kind = base  # type: ignore[assignment]
        if base == "date":
            return ColumnType("date", "date", np.dtype(dtype), MIN_DAY, MAX_DAY), not_null
        return ColumnType(base, kind, np.dtype(dtype)), not_null
    if base in ("varchar", "char"):
        if size is None:
            length = 1 if base == "char" else None
        else:
            length = int(size)
            if length < 1:
                raise BadOperation(f"a string length is at least 1: {text!r}")
        name = base if length is None else f"{base}({length})"
        return ColumnType(name, "str", np.dtype(np.int32), max_len=length), not_null
    raise BadOperation(f"unknown column type {text!r:.60}")


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: ColumnType
    nullable: bool

    def spec(self) -> list[str]:
        """The plain form that travels in operations and chunks."""
        return [self.name, self.type.name if self.nullable else f"{self.type.name} not null"]


_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
KEY_KINDS = ("int", "float", "str")
"""Key attributes must be of a kind whose Rubberband key order matches the column's order."""


class Schema:
    """The columns of a table in order, and its key attribute."""

    __slots__ = ("by_name", "columns", "key", "key_column", "names")

    def __init__(self, columns: Sequence[Column], key: str) -> None:
        self.columns = tuple(columns)
        self.names = tuple(c.name for c in self.columns)
        self.by_name = {c.name: c for c in self.columns}
        self.key = key
        self.key_column = self.by_name[key]

    @classmethod
    def parse(cls, spec: Any, key: Any) -> Schema:
        """A schema from its plain form: ``[[name, type], ...]`` and the key's name."""
        if not isinstance(spec, (list, tuple)) or not spec:
            raise BadOperation("a schema is a non-empty list of [name, type] pairs")
        if len(spec) > 1024:
            raise BadOperation("a table has at most 1024 columns")
        columns: list[Column] = []
        seen: set[str] = set()
        for item in spec:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise BadOperation(f"a schema entry is a [name, type] pair, not {item!r:.60}")
            name, text = item
            if type(name) is not str or not _NAME_RE.match(name):
                raise BadOperation(f"bad column name {name!r:.60} (letters, digits, _)")
            if name in seen:
                raise BadOperation(f"column {name!r} appears twice")
            seen.add(name)
            ctype, not_null = parse_type(text)
            columns.append(Column(name, ctype, not not_null))
        if type(key) is not str or key not in seen:
            raise BadOperation(f"the key {key!r:.60} is not a column of the schema")
        for i, c in enumerate(columns):
            if c.name == key:
                if c.type.kind not in KEY_KINDS:
                    raise BadOperation(
                        f"the key {key!r} must be an integer, float or string column, "
                        f"not {c.type.name}"
                    )
                columns[i] = Column(c.name, c.type, False)
        return cls(columns, key)

    def spec(self) -> list[list[str]]:
        return [c.spec() for c in self.columns]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.key == other.key and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash((self.key, tuple(map(tuple, self.spec()))))

    def column(self, name: Any, what: str = "column") -> Column:
        c = self.by_name.get(name) if type(name) is str else None
        if c is None:
            raise BadOperation(f"unknown {what} {name!r:.60}")
        return c


# ---------------------------------------------------------------- scalar values
def scalar(col: Column, value: Any) -> Any:
    """One value of ``col`` as the engine compares it: int, float, bool, days or str.

    Used for predicate constants and assignments.  ``None`` passes (the caller decides
    what NULL means where it stands)."""
    if value is None:
        return None
    kind = col.type.kind
    t = type(value)
    if kind == "int":
        if t is int:
            return value
        if t is float and not math.isnan(value):
            return value  # comparisons with a float constant are exact; see ``normalize``
    elif kind == "float":
        if t is float:
            if math.isnan(value):
                raise BadOperation(f"NaN is not a value of {col.name!r} (use NULL)")
            return value
        if t is int:
            return value
    elif kind == "bool":
        if t is bool:
            return value
    elif kind == "date":
        return to_day(col, value)
    elif kind == "str" and t is str:
        check_utf8(col, value)
        return value
    raise BadOperation(f"{col.name!r} is {col.type.name}; {value!r:.60} is not a value of it")


def stored_scalar(col: Column, value: Any) -> Any:
    """A value that can be *stored* in ``col`` (assignments): exact type and range."""
    if value is None:
        if not col.nullable:
            raise BadOperation(f"column {col.name!r} is NOT NULL")
        return None
    v = scalar(col, value)
    kind = col.type.kind
    if kind == "int":
        if type(v) is not int:
            raise BadOperation(f"{col.name!r} is {col.type.name}; {value!r:.60} is not an integer")
        assert col.type.lo is not None and col.type.hi is not None
        if not col.type.lo <= v <= col.type.hi:
            raise BadOperation(f"{v} is out of range for {col.name!r} ({col.type.name})")
    elif kind == "float":
        v = float(v)
    elif kind == "str":
        check_length(col, v)
    return v


def to_day(col: Column, value: Any) -> int:
    if type(value) is str and len(value) == 10 and value[4] == "-" and value[7] == "-":
        try:
            return int(dt.date.fromisoformat(value).toordinal() - _EPOCH_ORDINAL)
        except ValueError:
            pass
    elif type(value) is dt.date:
        return value.toordinal() - _EPOCH_ORDINAL
    raise BadOperation(f"{col.name!r} is a date; {value!r:.60} is not 'YYYY-MM-DD'")


_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


def check_length(col: Column, value: str) -> None:
    if col.type.max_len is not None and len(value) > col.type.max_len:
        raise BadOperation(
            f"{value!r:.40} is longer than {col.type.max_len} characters ({col.name!r})"
        )


def check_utf8(col: Column, value: str) -> None:
    """Strings are Unicode text: encodable as UTF-8 (no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadOperation(f"{value!r:.40} is not valid Unicode text ({col.name!r})") from None


# ---------------------------------------------------------------- whole columns
def column_values(col: Column, values: Sequence[Any]) -> tuple[Any, np.ndarray | None]:
    """A column of Python values as stored: (values, nulls).

    ``values`` is a NumPy array of the storage dtype, or for strings a list of ``str``
    (the table's dictionary turns them into codes) with ``""`` in place of NULL.
    ``nulls`` is a bool array, or None when no value is NULL.
    """
    n = len(values)
    null_positions = [i for i, v in enumerate(values) if v is None] if None in values else []
    nulls: np.ndarray | None = None
    if null_positions:
        if not col.nullable:
            raise BadOperation(f"column {col.name!r} is NOT NULL")
        nulls = np.zeros(n, dtype=bool)
        nulls[null_positions] = True
        values = list(values)
        filler: Any = {"str": "", "date": "1970-01-01", "bool": False}.get(col.type.kind, 0)
        for i in null_positions:
            values[i] = filler
    kind = col.type.kind
    name = col.name
    if kind == "str":
        if not all(type(v) is str for v in values):
            bad = next(v for v in values if type(v) is not str)
            raise BadOperation(f"{name!r} is {col.type.name}; {bad!r:.60} is not a string")
        if col.type.max_len is not None and values and max(map(len, values)) > col.type.max_len:
            bad = next(v for v in values if len(v) > col.type.max_len)  # type: ignore[operator]
            raise BadOperation(
                f"{bad!r:.40} is longer than {col.type.max_len} characters ({name!r})"
            )
        joined = "".join(values)
        try:
            joined.encode("utf-8")
        except UnicodeEncodeError:
            raise BadOperation(f"a value of {name!r} is not valid Unicode text") from None
        return list(values), nulls
    if kind == "int":
        if not all(type(v) is int for v in values):
            bad = next(v for v in values if type(v) is not int)
            raise BadOperation(f"{name!r} is {col.type.name}; {bad!r:.60} is not an integer")
        try:
            arr = np.array(values, dtype=np.int64) if n else np.zeros(0, np.int64)
        except OverflowError:
            raise BadOperation(f"a value of {name!r} is out of range ({col.type.name})") from None
        assert col.type.lo is not None and col.type.hi is not None
        if n and (arr.min() < col.type.lo or arr.max() > col.type.hi):
            raise BadOperation(f"a value of {name!r} is out of range ({col.type.name})")
        return arr.astype(col.type.dtype), nulls
    if kind == "float":
        if not all(type(v) is float or type(v) is int for v in values):
            bad = next(v for v in values if type(v) is not float and type(v) is not int)
            raise BadOperation(f"{name!r} is float; {bad!r:.60} is not a number")
        try:
            arr = np.array(values, dtype=np.float64) if n else np.zeros(0, np.float64)
        except OverflowError:
            raise BadOperation(f"a value of {name!r} is too large for a float") from None
        if np.isnan(arr).any():
            raise BadOperation(f"NaN is not a value of {name!r} (use NULL)")
        return arr, nulls
    if kind == "bool":
        if not all(type(v) is bool for v in values):
            bad = next(v for v in values if type(v) is not bool)
            raise BadOperation(f"{name!r} is bool; {bad!r:.60} is not True or False")
        return np.array(values, dtype=np.uint8), nulls
    # dates
    return np.array([to_day(col, v) for v in values], dtype=np.int32), nulls


def decode_dates(days: np.ndarray) -> np.ndarray:
    """ISO strings of day numbers, as an object array; a table of the span when the span
    is small (the usual case: dates of one column cluster in a few decades), NumPy's
    formatter otherwise."""
    if len(days) == 0:
        return np.zeros(0, dtype=object)
    lo, hi = int(days.min()), int(days.max())
    if hi - lo < 4 * len(days) + 1024:
        table = np.arange(lo, hi + 1, dtype=np.int64).astype("datetime64[D]").astype(str)
        return table.astype(object)[days.astype(np.int64) - lo]  # type: ignore[no-any-return]
    return days.astype("datetime64[D]").astype(str).astype(object)  # type: ignore[no-any-return]


def day_to_iso(day: int) -> str:
    return dt.date.fromordinal(day + _EPOCH_ORDINAL).isoformat()
