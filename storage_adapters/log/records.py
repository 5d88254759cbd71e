"""Framed, checksummed records: the unit of every file the durable engines write.

A record is ``[length u32][crc32 u32][msgpack body]``, big-endian.  A reader walks a
file record by record and stops at the first one that is short (the file ends inside
it) or whose checksum fails; what it does then is the caller's decision, because only
the caller knows whether that spot is the tail of the newest file (a write torn by a
crash: never acknowledged, cut away) or the middle of the log (acknowledged data
damaged on disk: never skipped silently).
"""

from __future__ import annotations

import datetime as dt
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import msgpack

HEADER = struct.Struct(">II")
MAX_RECORD = 1 << 30
"""A length field beyond this is damage, not a record (no record comes near it)."""


def _default(value: Any) -> Any:
    if isinstance(value, dt.date):
        return value.isoformat()
    raise TypeError(f"cannot log a {type(value).__name__}")


def pack(body: Any) -> bytes:
    """One record holding ``body``."""
    data = msgpack.packb(body, use_bin_type=True, default=_default)
    return HEADER.pack(len(data), zlib.crc32(data)) + data


def packer() -> Callable[[Any], bytes]:
    """:func:`pack` with a msgpack ``Packer`` of its own, kept: ``packb`` builds one
    per call, which cost a logged put about as much as packing its record.  For one
    thread at a time (a log's appends are its engine's, one batch at a time)."""
    pack_body = msgpack.Packer(use_bin_type=True, default=_default).pack
    header, crc32 = HEADER.pack, zlib.crc32

    def pack_record(body: Any) -> bytes:
        data = pack_body(body)
        return header(len(data), crc32(data)) + data

    return pack_record


def unpack(data: bytes | memoryview) -> Any:
    """The body of a record's bytes (header included), or :class:`Damaged`."""
    if len(data) < HEADER.size:
        raise Damaged("a record shorter than its header")
    length, crc = HEADER.unpack_from(data, 0)
    body = data[HEADER.size : HEADER.size + length]
    if len(body) != length or zlib.crc32(body) != crc:
        raise Damaged("a record whose checksum does not match its bytes")
    return msgpack.unpackb(body, raw=False, use_list=False, strict_map_key=False)


class Damaged(Exception):
    """Bytes that are not an intact record."""


class Record(NamedTuple):
    offset: int
    size: int
    body: Any


def scan(data: bytes, start: int = 0) -> tuple[list[Record], int]:
    """The intact records of ``data`` from ``start`` on, and the offset where they end
    (``len(data)`` when every byte is part of one)."""
    out = list(iter_records(data, start))
    return out, out[-1].offset + out[-1].size if out else start


def iter_records(data: bytes, start: int = 0) -> Iterator[Record]:
    pos, n = start, len(data)
    view = memoryview(data)
    while pos + HEADER.size <= n:
        length, crc = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + length
        if not 0 < length <= MAX_RECORD or end > n:  # no record is empty (zeroed pages)
            return
        if zlib.crc32(view[pos + HEADER.size : end]) != crc:
            return
        try:
            body = msgpack.unpackb(
                view[pos + HEADER.size : end], raw=False, use_list=False, strict_map_key=False
            )
        except ValueError:
            return
        yield Record(pos, end - pos, body)
        pos = end
