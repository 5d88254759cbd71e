"""Views from a client: define them, read them at a level, and maintain them.

Read levels (``docs/views.md``), strongest first:

- ``sequential``: the view exactly as of the read's own position ``t`` in the total
  order (a sequential read of the view's progress gives ``t``); it waits until the
  maintainer has reached ``t``, then answers from each row's version at ``t``.  Seed
  000's *complete* consistency, at a position.
- ``read-your-writes``: every write this client made before the read is reflected
  (seed 001's session guarantee); after a write it costs what a sequential read costs,
  and answers with the newest state once the view reached the write.  Reads never go
  back in time (monotonic).
- ``snapshot``: a consistent view at the newest position its maintainer reached, read
  at snapshot isolation; ``any``: the same at basic isolation (fastest, possibly
  stale).  Each reports the position it is exact at.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rubberband.changelog import Page
from rubberband.errors import BadOperation, Compacted, Indeterminate, RubberbandError
from rubberband.keys import encode_key, normalize, point
from rubberband.versions import as_of
from rubberband.views.define import (
    CATALOG,
    ViewDef,
    catalog_key,
    from_dict,
    meta_key,
    prefix_bounds,
    row_key,
    rows_bounds,
    view_def,
)
from rubberband.views.maintain import Maintainer

log = logging.getLogger("rubberband.views")

LEVELS = ("sequential", "read-your-writes", "snapshot", "any")
_ISOLATION = {"snapshot": "snapshot", "any": "basic"}


async def create_view(rb: Any, name: str, from_: Sequence[Any], kind: str, **spec: Any) -> ViewDef:
    """Define a view (checked first: :class:`BadOperation` says what is wrong).  A
    maintainer (``rubberband views maintain``) backfills it from a snapshot of its base
    at one position and then follows the base's changes while writes go on."""
    view = view_def(name, kind, from_, **spec)
    got = await rb.read(("get", (catalog_key(name),)), "sequential")
    if got:
        raise BadOperation(f"a view named {name!r} exists (drop it first)")
    await rb.put(catalog_key(name), view.to_dict())
    return view


async def drop_view(rb: Any, name: str) -> None:
    """Forget a view's definition and delete its rows (a maintainer stops on its own)."""
    await rb.delete(catalog_key(name))
    await rb.delete_range(*rows_bounds(name))


async def list_views(rb: Any) -> list[ViewDef]:
    rows = await rb.read(("scan", (CATALOG,), (CATALOG + "\x00",)), "sequential")
    return [from_dict(value) for _key, value in rows]


class View:
    """One view, read through a client (``rb.view(name)``)."""

    def __init__(self, rb: Any, name: str) -> None:
        self.rb = rb
        self.name = name
        self._writes_seen = -1
        self._ryw = -1  # the position read-your-writes reads must reach

    async def get(
        self, keys: Iterable[Any], level: str = "sequential", *, with_position: bool = False
    ) -> Any:
        """``{row key: value}`` of the rows among ``keys`` that are there."""
        keys = list(keys)
        op = ("get", (meta_key(self.name), *(row_key(self.name, k) for k in keys)))
        rows, position = await self._read(op, None, level)
        out = dict(rows)
        return (out, position) if with_position else out

    async def scan(
        self,
        lo: Any = None,
        hi: Any = None,
        level: str = "sequential",
        *,
        with_position: bool = False,
    ) -> Any:
        """``[(row key, value), ...]`` of the rows in ``[lo, hi)`` (None: unbounded), in
        key order."""
        start, end = rows_bounds(self.name)
        rlo = encode_key(row_key(self.name, lo)) if lo is not None else encode_key(start)
        rhi = encode_key(row_key(self.name, hi)) if hi is not None else encode_key(end)
        within = normalize([point(meta_key(self.name)), (rlo, rhi)])
        rows, position = await self._read(("scan", start, end), within, level)
        return (rows, position) if with_position else rows

    async def lookup(
        self, value: Any, level: str = "sequential", *, with_position: bool = False
    ) -> Any:
        """An index view's rows for secondary key ``value``: ``[(base key, row), ...]``."""
        lo, hi = prefix_bounds(self.name, value)
        start, end = rows_bounds(self.name)
        within = normalize([point(meta_key(self.name)), (encode_key(lo), encode_key(hi))])
        rows, position = await self._read(("scan", start, end), within, level)
        out = [(k[1], v) for k, v in rows]
        return (out, position) if with_position else out

    # ------------------------------------------------------------------ the levels
    async def _read(self, op: Any, within: Any, level: str) -> tuple[list[tuple[Any, Any]], int]:
        if level not in LEVELS:
            raise BadOperation(f"a view read's level is one of {', '.join(LEVELS)}, not {level!r}")
        deadline = time.monotonic() + self.rb.answer_timeout
        for _ in range(3):
            try:
                return await self._attempt(op, within, level, deadline)
            except Compacted:
                if level != "sequential":
                    raise
                # The maintainer restarted past the read's position: read again, later.
        raise Indeterminate(f"view {self.name!r} kept restarting past the reads' positions")

    async def _attempt(
        self, op: Any, within: Any, level: str, deadline: float
    ) -> tuple[list[tuple[Any, Any]], int]:
        target = -1
        if level == "sequential":
            target = await self._probe()
        elif level == "read-your-writes":
            writes = self.rb.writes_sent
            if writes != self._writes_seen:
                self._ryw = max(self._ryw, await self._probe())
                self._writes_seen = writes
            target = self._ryw
        isolation = _ISOLATION.get(level, "snapshot")
        pause = 0.002
        while True:
            got = await self.rb.read(op, isolation, within=within)
            chains = dict(got) if type(got) is dict else {k: v for k, v in got}
            meta = chains.pop(meta_key(self.name), None)
            if meta is not None and len(meta) > 1:
                reached, floor = meta[-1]
                if reached >= target:
                    at = target if level == "sequential" else reached
                    if at < floor:
                        raise Compacted(floor)
                    if level == "read-your-writes":
                        self._ryw = max(self._ryw, reached)
                    return self._as_of(chains, at), at
            if time.monotonic() + pause > deadline:
                raise Indeterminate(
                    f"view {self.name!r} has not reached position {target} in time"
                    if meta is not None
                    else f"view {self.name!r} has no maintainer's progress yet (is it defined, "
                    "and is `rubberband views maintain` running?)"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)

    async def _probe(self) -> int:
        _, position = await self.rb.read(
            ("get", (meta_key(self.name),)), "sequential", with_position=True
        )
        return int(position)

    def _as_of(self, chains: dict[Any, Any], at: int) -> list[tuple[Any, Any]]:
        out = []
        for key in sorted(chains, key=encode_key):
            try:
                present, value = as_of(chains[key], at)
            except LookupError as e:
                raise Compacted(e.args[0]) from None
            if present:
                out.append((key[2], value))
        return out


# ------------------------------------------------------------------ maintaining
async def maintain(
    rb: Any, view: ViewDef, poll: float = 0.05, stop: asyncio.Event | None = None
) -> None:
    """Keep ``view`` up to date until ``stop`` is set (or the task is cancelled): start
    from a snapshot of its sources, then follow their feeds.  A feed that was compacted
    under it (the maintainer stalled past the change logs' retention) starts it over."""
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            await _maintain_once(rb, view, poll, stop)
        except Compacted as e:
            log.warning(
                "view %s: its base's changes were compacted (%s): starting over", view.name, e
            )
        except RubberbandError as e:
            log.warning("view %s: %s; trying again in %.1f s", view.name, e, 1.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


async def _maintain_once(rb: Any, view: ViewDef, poll: float, stop: asyncio.Event) -> None:
    m = Maintainer(view)
    old = await rb.read(("scan", *rows_bounds(view.name)), "sequential")
    snapshots = [
        await rb.read(("scan", lo, hi), "sequential", with_position=True) for lo, hi in view.sources
    ]
    await _write_all(rb, m.start(old, snapshots, time.monotonic()))
    while not stop.is_set():
        pages: list[Page] = await asyncio.gather(
            *(rb.changes(m.since[side], lo, hi) for side, (lo, hi) in enumerate(view.sources))
        )
        idle = True
        for side, page in enumerate(pages):
            idle = idle and not page.events
            await _write_all(rb, m.page(side, page.position, page.events, time.monotonic()))
        if idle:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), poll)


async def _write_all(rb: Any, writes: list[Any]) -> None:
    """The rows first, then the last write (it carries the progress) once they are
    stable: a reader that sees the progress sees every row version under it."""
    if len(writes) > 1:
        for outcome in await rb.write_batch(writes[:-1]):
            if outcome is not None:
                raise outcome
    if writes:
        await rb.write(writes[-1])
