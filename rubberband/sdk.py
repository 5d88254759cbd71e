"""``rubberband.connect``: the asyncio client of a Rubberband cluster.

```python
rb = await rubberband.connect(routers, name="client:app-1", secret=...)
await rb.put(key, value); await rb.put_many({k1: v1, k2: v2})      # atomic multi-key
await rb.append(key, value); await rb.append_many({k1: v1})          # list-append, atomic
await rb.add(key, 5); await rb.add_many({a: -5, b: 5})              # counters, atomic
await rb.delete(key); await rb.delete_range(lo, hi)
await rb.get(key, isolation="sequential")     # or "snapshot", "basic"
await rb.get_many([k1, k2]); await rb.scan(lo, hi, isolation=...)
await rb.write_batch([("put", ((k, v),)) for k, v in items])   # bulk: one outcome each
await rb.close()
```

With another engine's operations (``connect(..., ops="storage_adapters.scan:ScanOps")``)
the client also offers that engine's calls, e.g. the scan engine's tables::

    await rb.create_table("tickets", schema={"id": "int", "dep": "str"}, key="id")
    t = rb.table("tickets")
    await t.insert(rows); await t.select(where=[("dep", "=", "ZRH")], isolation="basic")

A client is light: it does not join (E-Cast's session and sequence numbers still make
every write land once) and it listens, so storage processes can stream answers back to
it.  It learns the keyspace (version, ring, partitioning) from a super at connect time,
and again from any storage process that finds its copy stale.  Writes return when stable
(every unsuspected holder delivered them); many calls may be in flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import ecast
from rubberband.client import (
    ISOLATION_LEVELS,
    ClientCore,
    Gather,
    Indeterminate,
    Rejected,
    Unavailable,
    op_name,
)
from rubberband.config import STORAGE
from rubberband.host import CONFIG, DESCRIBE
from rubberband.keys import overlaps
from rubberband.storage import BASIC, RESULT, RESULTS, STALE, WHOLE

log = logging.getLogger("rubberband.sdk")

BUNDLE_LIMIT = 32
"""Reads for one responder that :meth:`RubberbandClient.read_batch` sends as one
message by default (:data:`rubberband.config.BUNDLE`)."""
MAX_ASIDE = 4096
"""Answers set aside at most while the client learns the newest keyspace."""
BUNDLE_BYTES = 64 * 1024
"""A bundle's payload at most (reads with large operations go fewer to a message), far
below any router's message limit."""


class RubberbandClient:
    """Key-value calls over a generic ``write(op)`` / ``read(op, isolation)``."""

    def __init__(self, client: ecast.Client, core: ClientCore, *, answer_timeout: float) -> None:
        self.ecast = client
        self.core = core
        self.answer_timeout = answer_timeout
        self._rid = itertools.count(1)
        self._reads: dict[Any, tuple[Gather, Any]] = {}
        """Reads in flight: the gather and what to tell when an answer arrives (an
        event, or a :class:`_Completion` of :meth:`read_batch`)."""
        self._described: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        """Keyspace requests in flight: the super asked, and what waits for its answer."""
        self._asked: dict[Any, frozenset[str]] = {}
        """Basic reads in flight: the storage processes asked (only they answer)."""
        self._set_aside: list[tuple[str, Any]] = []
        self._after_refresh: list[Callable[[], None]] = []
        self._refreshing: asyncio.Future[None] | None = None
        self.refused_answers = 0
        """Answers not taken: from no storage process, from one that holds nothing of
        what it answers for, or to a request that went elsewhere."""
        self._writes: dict[Any, tuple[asyncio.Future[Any], Any]] = {}
        """Writes waiting for a holder's answer: the future and the write's ranges (only
        a holder of some of them answers)."""
        self._bundles: dict[Any, _Bundle] = {}
        """Read bundles in flight by their request id: the reads they carry."""
        self._unsafe: dict[Any, Any] = {}
        """Snapshot reads in flight by their E-Cast message id: a router's notice that
        it shed one (``ecast.Client.shed_listener``) refuses the read at once."""
        client.shed_listener = self._on_shed
        client.direct_listener = self._on_answer
        self._reader = asyncio.ensure_future(self._read_direct())
        """Answers that arrive through :meth:`ecast.Client.receive_direct` instead (an
        E-Cast client without the listener, as in tests)."""

    # ------------------------------------------------------------------ plumbing
    async def _read_direct(self) -> None:
        while True:
            src, p = await self.ecast.receive_direct()
            self._on_answer(src, p)

    def _on_answer(self, src: str, p: Any) -> None:
        try:
            self._on_direct(src, p)
        except Exception:
            # A malformed answer (from any storage process) or a ``done`` callback that
            # raised must not stop the answers that follow.
            log.exception("event=bad_answer from=%s", src)

    def _on_direct(self, src: str, p: Any, recheck: bool = True) -> None:
        """An answer, taken only from whom it may come from: a keyspace description from
        the super asked for it; read and write answers from storage processes that hold
        what they answer for (:class:`rubberband.client.Holders`), basic reads' from the
        processes asked.  An answer from a storage process that no keyspace we know says
        holds it is set aside until we learned the newest keyspace from a super, then
        checked again (``recheck`` False: the second time)."""
        if type(p) is not tuple or not p:
            return
        tag = p[0]
        if tag == CONFIG:
            asked = self._described.get(p[1]) if len(p) == 5 else None
            if asked is not None and asked[0] == src:
                del self._described[p[1]]
                if not asked[1].done():
                    asked[1].set_result(p)
            else:
                self.refused_answers += 1
            return
        if src[:8] != STORAGE:
            self.refused_answers += 1
            return
        held = self.core.holders.holds
        if tag == WHOLE and len(p) == 4:
            bundle, results = self._bundles.get(p[1]), p[3]
            n = len(results) if type(results) is tuple else -1
            if bundle is not None and n == len(bundle.gathers):
                if not _holds_bundle(held, src, bundle.gathers):
                    self._aside(src, p, recheck)
                    return
                rows = zip(range(n), itertools.repeat(None), results, itertools.repeat(None))
                self._on_results(p[1], bundle, p[2], True, rows)
        elif tag == RESULTS and len(p) == 5:
            bundle = self._bundles.get(p[1])
            if bundle is not None and type(p[4]) is tuple:
                if not _holds_rows(held, src, bundle.gathers, p[4]):
                    self._aside(src, p, recheck)
                    return
                self._on_results(p[1], bundle, p[2], p[3], p[4])
        elif tag == RESULT and len(p) == 7:
            self._on_result(src, p, recheck)
        elif tag == STALE and len(p) == 4:
            entry = self._reads.get(p[1])
            if entry is not None and src in self._asked.get(p[1], ()):
                # Our keyspace is older than the responder's: learn the new one from a
                # super (never from the responder), then the read goes on.
                self._refresh_soon(entry[1].set)

    def _on_result(self, src: str, p: Any, recheck: bool) -> None:
        """One answer to a write, a read sent alone, or a whole bundle (its refusal)."""
        held = self.core.holders.holds
        rid = p[1]
        written = self._writes.get(rid)
        if written is not None:
            fut, ranges = written
            if not any(overlaps(part, ranges) for part in self.core.holders.parts(src)):
                self._aside(src, p, recheck)
            elif not fut.done():
                fut.set_result(p[4])
            return
        entry = self._reads.get(rid)
        if entry is not None:
            gather = entry[0]
            asked = self._asked.get(rid)
            if asked is not None:  # a basic read: only the processes asked answer it
                if src not in asked:
                    self.refused_answers += 1
                    return
            elif not held(src, gather.ranges if p[2] is None else p[2]):
                self._aside(src, p, recheck)
                return
            gather.add(p[2], p[3], p[4], p[5], p[6])
            entry[1].set()
            return
        bundle = self._bundles.get(rid)  # a refusal or error of a whole bundle
        if bundle is not None:
            if not _holds_bundle(held, src, bundle.gathers):
                self._aside(src, p, recheck)
                return
            complete = []
            for i, g in enumerate(bundle.gathers):
                if g is not None:
                    g.add(p[2], p[3], p[4], p[5], p[6])
                    if g.complete:
                        complete.append(i)
            bundle.finish_all(complete)
            self._settle(rid, bundle)

    def _aside(self, src: str, p: Any, recheck: bool) -> None:
        """An answer from a storage process that no keyspace we know says holds what it
        answers for: either our keyspace is behind (the routers' config made it a
        responder under a newer one), or it is no answer.  Learn the newest keyspace
        from a super, then take it if that says it holds it."""
        if not recheck or len(self._set_aside) >= MAX_ASIDE:
            self.refused_answers += 1
            return
        self._set_aside.append((src, p))
        self._refresh_soon(None)

    def _refresh_soon(self, then: Callable[[], None] | None) -> None:
        """Learn the keyspace from a super, once for every caller meanwhile; then check
        the answers set aside again, and call ``then``."""
        if then is not None:
            self._after_refresh.append(then)
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh_and_recheck())

    async def _refresh_and_recheck(self) -> None:
        with contextlib.suppress(Unavailable):
            await self.refresh(min(5.0, self.answer_timeout))
        aside, self._set_aside = self._set_aside, []
        after, self._after_refresh = self._after_refresh, []
        for src, p in aside:
            self._on_answer_again(src, p)
        for fn in after:
            fn()

    def _on_answer_again(self, src: str, p: Any) -> None:
        try:
            self._on_direct(src, p, recheck=False)
        except Exception:
            log.exception("event=bad_answer from=%s", src)

    def _on_results(
        self, brid: Any, bundle: _Bundle, position: Any, ok: Any, answers: Iterable[Any]
    ) -> None:
        """One responder's answers to the reads of a bundle: ``(index, covered, result,
        error)`` each, ``covered`` None for the whole read (a :data:`WHOLE` answer's
        results are made into such rows as they are read).  Most answers cover their read
        whole from the first responder; they complete it here without the general
        gathering (this loop runs once per read, and was a third of a client's time at
        saturation)."""
        gathers = bundle.gathers
        ops, done = bundle.ops, bundle.done
        told: list[tuple[Any, Gather | None]] | None = [] if bundle.grouped else None
        n = len(gathers)
        for answer in answers:
            if type(answer) is not tuple or len(answer) != 4:
                continue
            i = answer[0]
            if type(i) is not int or not 0 <= i < n:
                continue
            g = gathers[i]
            if g is None:  # completed already (by another replica's answer)
                continue
            if (
                ok is True
                and answer[3] is None
                and not g.covered
                and (answer[1] is None or answer[1] == g.ranges)
            ):
                g.pieces.append((g.ranges, answer[2]))
                g.covered = g.ranges
                g.position = position
                # ``bundle.finish(i)`` and ``_tell`` written out: this runs once per read.
                gathers[i] = None
                bundle.left -= 1
                if told is not None:
                    told.append((ops[i], g))
                    continue
                try:
                    done(ops[i], g)
                except Exception:  # the caller's: the other reads of the answer go on
                    log.exception("event=done_failed read=%.60r", ops[i])
                continue
            try:
                g.add(answer[1], answer[2], answer[3], position, ok)
            except (TypeError, ValueError, IndexError):  # not a range set
                log.warning("event=bad_answer read=%s covered=%.60r", i, answer[1])
                continue
            if g.complete:
                if told is not None:
                    told.append(bundle.take(i))
                else:
                    bundle.finish(i)
        if told:
            _tell_group(done, told)
        self._settle(brid, bundle)

    def _on_shed(self, ids: tuple[Any, ...]) -> None:
        """Some snapshot reads reached not every responder (a router no longer leading, or
        a responder too far behind, 3.5.7): they will not complete, so they are refused
        now, to be retried, rather than left to time out."""
        unsafe, reads = self._unsafe, self._reads
        for mid in ids:
            rid = unsafe.pop(mid, None)
            bundle = self._bundles.get(rid)
            if bundle is None:
                entry = reads.get(rid)
                if entry is not None:
                    entry[0].refused = True
                    entry[1].set()
                continue
            bundle.finish_open(refused=True)
            self._settle(rid, bundle)

    def _settle(self, brid: Any, bundle: _Bundle) -> None:
        """Forget a bundle once none of its reads is waiting."""
        if not bundle.left:
            self._bundles.pop(brid, None)
            if bundle.mid is not None:
                self._unsafe.pop(bundle.mid, None)

    async def refresh(self, timeout: float = 10.0) -> None:
        """Learn the keyspace from a super (any one the routers told us of)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            supers = [p for p in self.ecast.peers() if p.startswith("super:")]
            for s in supers:
                rid = next(self._rid)
                fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                self._described[rid] = (s, fut)
                with contextlib.suppress(Exception):
                    self.ecast.send_direct_nowait(s, (DESCRIBE, rid))
                try:
                    _, _, version, state, partitioning = await asyncio.wait_for(fut, 1.0)
                except TimeoutError:
                    self._described.pop(rid, None)
                    continue
                self.core.learn(version, state, partitioning)
                return
            await asyncio.sleep(0.1)
        raise Unavailable("no super answered: is the cluster up?")

    # ------------------------------------------------------------------ generic
    async def write(self, op: Any, timeout: float | None = None) -> None:
        """Submit a write and wait until it is stable.  An operation whose validity
        depends on the data (``self.core.ops.answered(op)``, such as an append) also
        waits for a holder's answer, so a rejection raises :class:`Rejected` here."""
        payload, header = self.core.write(op)
        answered = getattr(self.core.ops, "answered", None)
        fut: asyncio.Future[Any] | None = None
        if answered is not None and answered(op):
            rid = ("w", next(self._rid))
            header["q"] = rid
            header["a"] = 1
            fut = asyncio.get_running_loop().create_future()
            self._writes[rid] = (fut, header["w"])
        try:
            ack = await self.ecast.submit(payload, header, timeout=timeout if timeout else -1.0)
            if not ack.delivered:
                raise Unavailable(f"no holder is left for some key of {op_name(op)}")
            if fut is not None:
                try:
                    error = await asyncio.wait_for(fut, self.answer_timeout)
                except TimeoutError:
                    raise Indeterminate(
                        f"{op_name(op)} is stable but no holder answered in "
                        f"{self.answer_timeout:g} s"
                    ) from None
                if error is not None:
                    raise Rejected(error)
        finally:
            if fut is not None:
                self._writes.pop(header["q"], None)

    async def write_batch(
        self, ops: list[Any], timeout: float | None = None, bundle: int = BUNDLE_LIMIT
    ) -> list[Exception | None]:
        """Many writes at once: one outcome per op, in order, None for a write that is
        stable, else the exception :meth:`write` would have raised for it.  Raises at
        once, sending nothing, for a bad op.

        Writes of one segment travel up to ``bundle`` to a message (1 sends each alone;
        see :meth:`ClientCore.writes`): the writes of a batch are independent, so writes
        to different segments may take effect in either order, while writes that touch a
        common key keep their order in the batch, and the whole batch is ordered after
        every write of an earlier call from this client.  ``timeout`` (default: the
        E-Cast client's ``ack_timeout``) bounds the wait for window room per message and
        the wait for all the acknowledgements together."""
        ops = list(ops)
        messages = self.core.writes(ops, bundle, BUNDLE_BYTES)
        answered = getattr(self.core.ops, "answered", None)
        outcomes: list[Exception | None] = [None] * len(ops)
        sent: list[tuple[tuple[int, ...], asyncio.Future[Any], Any]] = []
        wait = timeout if timeout else -1.0
        try:
            for indices, payload, header in messages:
                rid: Any = None
                if len(indices) == 1 and answered is not None and answered(ops[indices[0]]):
                    rid = header["q"] = ("w", next(self._rid))
                    header["a"] = 1
                    fut = asyncio.get_running_loop().create_future()
                    self._writes[rid] = (fut, header["w"])
                try:
                    ack = await self.ecast.enqueue(payload, header, timeout=wait)
                except Exception as e:  # no room in time, or the client ended: not sent
                    for i in indices:
                        outcomes[i] = e
                    if rid is not None:
                        self._writes.pop(rid, None)
                    continue
                sent.append((indices, ack, rid))
            loop = asyncio.get_running_loop()
            limit = self.ecast.ack_timeout if wait < 0 else wait
            deadline = None if limit is None else loop.time() + limit  # None: for ever
            for indices, ack, rid in sent:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                error = await self._written(ops[indices[0]], ack, rid, left)
                for i in indices:
                    outcomes[i] = error
        finally:
            for _, _, rid in sent:
                if rid is not None:
                    self._writes.pop(rid, None)
        return outcomes

    async def _written(
        self, op: Any, ack: asyncio.Future[Any], rid: Any, timeout: float | None
    ) -> Exception | None:
        """The outcome of one message of :meth:`write_batch`, its acknowledgement waited
        for at most ``timeout`` seconds more (None: as long as it takes)."""
        try:
            done = await asyncio.wait_for(asyncio.shield(ack), timeout)
        except TimeoutError:
            return TimeoutError(
                "the acknowledgement did not come within the batch's timeout; the write is "
                "still in flight and may yet take effect"
            )
        except Exception as e:
            return e
        if not done.delivered:
            return Unavailable(f"no holder is left for some key of {op_name(op)}")
        if rid is None:
            return None
        try:
            error = await asyncio.wait_for(self._writes[rid][0], self.answer_timeout)
        except TimeoutError:
            return Indeterminate(
                f"{op_name(op)} is stable but no holder answered in {self.answer_timeout:g} s"
            )
        return None if error is None else Rejected(error)

    async def read(
        self,
        op: Any,
        isolation: str = "sequential",
        attempts: int = 5,
        within: Any = None,
    ) -> Any:
        """Read at ``isolation``; ``within`` (a range set in placement space, such as one
        of :meth:`segments`) restricts the read to part of what ``op`` reads.

        A snapshot read is tried up to ``attempts`` times (a responder refuses one that
        does not fit its delivery stream; the leading router sheds one for a responder
        far behind and says so), then made a sequential read: also a consistent cut,
        and ordered besides."""
        if isolation not in ISOLATION_LEVELS:
            raise ValueError(
                f"isolation is one of {', '.join(ISOLATION_LEVELS)}, not {isolation!r}"
            )
        if isolation == "basic":
            return await self._basic(op, within)
        for _ in range(attempts):
            payload, header, gather = self.core.read(op, within)
            rid = ("q", next(self._rid))
            header["q"] = rid
            event = asyncio.Event()
            self._reads[rid] = (gather, event)
            try:
                if isolation == "sequential":
                    ack = await self.ecast.submit(payload, header)
                    if not ack.delivered:
                        raise Unavailable(f"some range of {op_name(op)} has no holder left")
                    await self._complete(gather, event, Indeterminate)
                    return self.core.result(gather)
                mid = await self.ecast.submit_unsafe(payload, header)
                self._unsafe[mid] = rid
                try:
                    with contextlib.suppress(Indeterminate):
                        await self._complete(gather, event, Indeterminate)
                finally:
                    self._unsafe.pop(mid, None)
                if gather.complete and not gather.refused:
                    return self.core.result(gather)
            finally:
                self._reads.pop(rid, None)
            await asyncio.sleep(0.01)
        # Every try was refused or shed: the responders are busy with writes (or
        # reconfiguring).  A sequential read is a consistent cut too, and ordered: the
        # stronger answer, at the cost of a place in the total order.
        return await self.read(op, "sequential", within=within)

    async def read_batch(
        self,
        ops: list[Any],
        isolation: str,
        done: Callable[..., None],
        timeout: float | None = None,
        bundle: int = BUNDLE_LIMIT,
        grouped: bool = False,
    ) -> int:
        """Many reads at once, without waiting for them: the pipelined form of
        :meth:`read` for loaders and benchmarks, one submission for the whole batch and no
        task or future per read.  ``done(op, gather)`` runs once per read when its answers
        are all in: ``gather.refused`` (a snapshot read found no consistent cut, or a
        basic read's holder no longer holds the range: read it again), ``gather.error``,
        else ``self.core.result(gather)`` is the answer; ``done(op, None)`` when it is not
        complete after ``timeout`` (default: ``answer_timeout``).  No retries here: the
        caller owns them, and counts them.  Returns the number of messages sent.

        Sequential and snapshot reads for one responder travel up to ``bundle`` to a
        message (:data:`rubberband.config.BUNDLE`; 1 sends each alone): each still
        completes, is refused or times out on its own, and a bundle is refused or shed
        as a whole.

        ``grouped``: ``done(told)`` instead, once per group of reads that finished
        together (an answer's reads, as a rule a whole bundle's), ``told`` a list of
        ``(op, gather)`` pairs with the same meanings.  For callers that count or time
        their reads: a call and a clock reading per answer rather than per read (a
        benchmark's load process spent a tenth of its time in its per-read callback)."""
        if isolation not in ISOLATION_LEVELS:
            raise ValueError(
                f"isolation is one of {', '.join(ISOLATION_LEVELS)}, not {isolation!r}"
            )
        core = self.core
        reads = self._reads
        gathers = core.gathers(ops)  # raises for a bad op, before sending
        rids: list[Any] = []
        """Request ids of the reads that travel alone (each in ``self._reads``)."""
        items: list[tuple[Any, Any]] = []
        sent: list[Any] = []
        """The request id of each item: a read's, or a bundle's."""

        each: Callable[[Any, Gather | None], None] = (
            (lambda op, gather: done([(op, gather)])) if grouped else done
        )
        """What a read that travels alone is told with."""

        def alone(i: int) -> Any:
            rid = ("q", next(self._rid))
            reads[rid] = (gathers[i], _Completion(self, rid, ops[i], gathers[i], each))
            rids.append(rid)
            return rid

        def forget() -> None:
            """The batch raised: none of its reads is told anything (answers to basic
            reads already sent find nothing to complete)."""
            for rid in rids:
                reads.pop(rid, None)
                self._asked.pop(rid, None)
            for rid in sent:
                self._bundles.pop(rid, None)

        basic = 0
        try:
            if isolation == "basic":
                version = core.version
                for i, gather in enumerate(gathers):
                    rid = alone(i)
                    targets = core.basic_targets(gather, frozenset())
                    self._asked[rid] = frozenset(targets)
                    for target, ranges in targets.items():
                        self.ecast.send_direct_nowait(target, (BASIC, rid, ops[i], ranges, version))
                        basic += 1
            else:
                for group, payload, header in core.reads(ops, gathers, bundle, BUNDLE_BYTES):
                    if len(group) == 1:
                        header["q"] = alone(group[0])
                    else:
                        header["q"] = ("b", next(self._rid))
                        self._bundles[header["q"]] = _Bundle(
                            [ops[i] for i in group], [gathers[i] for i in group], done, grouped
                        )
                    items.append((payload, header))
                    sent.append(header["q"])
        except BaseException:
            forget()
            raise

        def expire() -> None:
            for rid in rids:
                self._asked.pop(rid, None)
                entry = reads.pop(rid, None)
                if entry is not None:
                    self._unsafe.pop(entry[1].mid, None)
                    _tell(each, entry[1].op, None)
            for rid in sent:
                held = self._bundles.pop(rid, None)
                if held is not None:
                    if held.mid is not None:
                        self._unsafe.pop(held.mid, None)
                    held.finish_open(timed_out=True)

        timer = asyncio.get_running_loop().call_later(
            self.answer_timeout if timeout is None else timeout, expire
        )
        try:
            if isolation == "sequential":
                self.ecast.submit_batch(items)
            elif isolation == "snapshot":
                mids = await self.ecast.submit_unsafe_batch(items)
        except BaseException:  # not sent (no room, the client ended): raised, not told
            timer.cancel()
            forget()
            raise
        if isolation == "snapshot":
            unsafe, bundles = self._unsafe, self._bundles
            for mid, rid in zip(mids, sent, strict=False):
                held = bundles.get(rid) if rid[0] == "b" else reads.get(rid)
                if held is None:  # answered while the submission waited
                    continue
                if rid[0] == "b":
                    held.mid = mid  # type: ignore[union-attr]
                else:
                    held[1].mid = mid  # type: ignore[index]
                unsafe[mid] = rid
        return len(items) + basic

    async def _complete(self, gather: Gather, event: asyncio.Event, error: type) -> None:
        deadline = time.monotonic() + self.answer_timeout
        while not gather.complete:
            left = deadline - time.monotonic()
            if left <= 0:
                raise error(
                    f"{op_name(gather.op)}: no answer for {len(gather.missing())} range(s) in "
                    f"{self.answer_timeout:g} s (a responder failed after the read was ordered)"
                )
            event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), left)

    async def _basic(self, op: Any, within: Any = None) -> Any:
        _, _, gather = self.core.read(op, within)
        tried: frozenset[str] = frozenset()
        for _ in range(8):
            rid = ("b", next(self._rid))
            event = asyncio.Event()
            self._reads[rid] = (gather, event)
            try:
                version = self.core.version
                try:
                    targets = self.core.basic_targets(gather, tried)
                except Unavailable:
                    await self.refresh()  # our keyspace may be older than the cluster's
                    targets = self.core.basic_targets(gather, tried)
                self._asked[rid] = frozenset(targets)
                for target, ranges in targets.items():
                    self.ecast.send_direct_nowait(target, (BASIC, rid, op, ranges, version))
                tried |= frozenset(targets)
                with contextlib.suppress(Indeterminate):
                    await self._complete(gather, event, Indeterminate)
                if gather.complete and not gather.refused:
                    return self.core.result(gather)
                if gather.refused or self.core.version != version:
                    # Parts answered under two keyspace versions are not one read (a
                    # range may have moved between them, answered twice or by nobody):
                    # start again, whole, under the newest keyspace we know.
                    _, _, gather = self.core.read(op, within)
                    tried = frozenset()
            finally:
                self._reads.pop(rid, None)
                self._asked.pop(rid, None)
        raise Unavailable(f"a basic read of {op_name(op)} found no holder that answered")

    async def read_replica(self, process: str, op: Any, within: Any) -> Any:
        """``op`` within ``within`` (placement ranges) answered by ``process`` alone, from
        its current state (a basic read): audits compare the holders of a range with it
        once writes have stopped.  Raises :class:`Unavailable` if ``process`` does not
        hold all of ``within`` under this client's keyspace version."""
        _, _, gather = self.core.read(op, within)
        rid = ("b", next(self._rid))
        event = asyncio.Event()
        self._reads[rid] = (gather, event)
        self._asked[rid] = frozenset((process,))
        try:
            self.ecast.send_direct_nowait(
                process, (BASIC, rid, op, gather.ranges, self.core.version)
            )
            await self._complete(gather, event, Indeterminate)
            if gather.refused or not gather.complete:
                raise Unavailable(f"{process} does not hold all of the ranges asked for")
            return self.core.result(gather)
        finally:
            self._reads.pop(rid, None)
            self._asked.pop(rid, None)

    def segments(self) -> list[Any]:
        """The keyspace's primary segments as this client knows it (placement-space range
        sets that tile the keys once, in ring order): the unit of a parallel export."""
        ks = self.core.keyspace
        return [] if ks is None else list(ks.segments())

    @property
    def placement(self) -> Any:
        """How keys map to places (the cluster's partitioning, learned at connect)."""
        return self.core.placement

    # ------------------------------------------------------------------ key-value
    async def put(self, key: Any, value: Any) -> None:
        await self.write(("put", ((key, value),)))

    async def put_many(self, items: dict[Any, Any]) -> None:
        await self.write(("put", tuple(items.items())))

    async def append(self, key: Any, value: Any) -> None:
        await self.write(("append", ((key, value),)))

    async def append_many(self, items: dict[Any, Any]) -> None:
        await self.write(("append", tuple(items.items())))

    async def add(self, key: Any, delta: int) -> None:
        """Add ``delta`` to the integer at ``key`` (absent counts as 0)."""
        await self.write(("add", ((key, delta),)))

    async def add_many(self, deltas: dict[Any, int]) -> None:
        """Add to several counters in one atomic write (a transfer: deltas summing to 0)."""
        await self.write(("add", tuple(deltas.items())))

    async def delete(self, key: Any) -> None:
        await self.write(("delete", (key,)))

    async def delete_range(self, lo: Any, hi: Any) -> None:
        await self.write(("delete_range", lo, hi))

    async def get(self, key: Any, isolation: str = "sequential") -> Any:
        return (await self.read(("get", (key,)), isolation)).get(key)

    async def get_many(self, keys: list[Any], isolation: str = "sequential") -> dict[Any, Any]:
        return await self.read(("get", tuple(keys)), isolation)  # type: ignore[no-any-return]

    async def scan(
        self, lo: Any = None, hi: Any = None, isolation: str = "sequential"
    ) -> list[Any]:
        return await self.read(("scan", lo, hi), isolation)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ the engine's own
    def __getattr__(self, name: str) -> Any:
        """The engine's own calls, such as the scan engine's ``rb.table(...)`` and
        ``rb.create_table(...)``: whatever its operations' ``bind(client)`` returns
        offers them, built on :meth:`write` and :meth:`read` (Rubberband itself knows
        no engine)."""
        api = self.__dict__.get("_api")
        if api is None:
            core = self.__dict__.get("core")
            bind = getattr(core.ops, "bind", None) if core is not None else None
            if name.startswith("_") or bind is None:
                raise AttributeError(
                    f"{type(self).__name__!r} has no attribute {name!r} (and the engine's "
                    "operations offer no calls of their own)"
                )
            api = self.__dict__["_api"] = bind(self)
        return getattr(api, name)

    # ------------------------------------------------------------------ lifetime
    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        await self.ecast.detach()

    async def __aenter__(self) -> RubberbandClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


DEFAULT_OPS = "storage_adapters.memory:KVOps"
"""The operations of the key-value engine, named by path: Rubberband imports no engine."""


def _tell(done: Callable[[Any, Gather | None], None], op: Any, gather: Gather | None) -> None:
    """Hand a finished read to the caller of :meth:`RubberbandClient.read_batch`."""
    try:
        done(op, gather)
    except Exception:  # the caller's: the other reads of the answer go on
        log.exception("event=done_failed read=%.60r", op)


def _tell_group(
    done: Callable[[list[tuple[Any, Gather | None]]], None], told: list[tuple[Any, Gather | None]]
) -> None:
    """Hand reads finished together to a ``grouped`` caller of ``read_batch``."""
    try:
        done(told)
    except Exception:  # the caller's: the bundle's bookkeeping goes on
        log.exception("event=done_failed reads=%d first=%.60r", len(told), told[0][0])


class _Bundle:
    """A read bundle in flight: its reads and their gathers, in the order of its payload
    (a finished read's gather becomes None), and its E-Cast message id once submitted
    unsafe (a shed notice names it).  Its reads need no request id of their own: an
    answer names the bundle and an index."""

    __slots__ = ("done", "gathers", "grouped", "left", "mid", "ops")

    def __init__(
        self, ops: list[Any], gathers: list[Gather], done: Callable[..., None], grouped: bool
    ) -> None:
        self.ops = ops
        self.gathers: list[Gather | None] = gathers  # type: ignore[assignment]
        self.done = done
        self.grouped = grouped
        """``done`` takes a list of ``(op, gather)`` (``read_batch(grouped=True)``)."""
        self.left = len(gathers)
        self.mid: Any = None

    def take(self, i: int, timed_out: bool = False) -> tuple[Any, Gather | None]:
        """Read ``i`` is complete (answered, refused or failed) or ``timed_out``: it
        leaves the bundle; what to tell the caller about it."""
        g = self.gathers[i]
        self.gathers[i] = None
        self.left -= 1
        return self.ops[i], None if timed_out else g

    def finish_open(self, timed_out: bool = False, refused: bool = False) -> None:
        """Every read still open is done: timed out, or ``refused`` (shed)."""
        open_ = [i for i, g in enumerate(self.gathers) if g is not None]
        if refused:
            for i in open_:
                self.gathers[i].refused = True  # type: ignore[union-attr]
        self.finish_all(open_, timed_out)

    def finish_all(self, indices: list[int] | tuple[int, ...], timed_out: bool = False) -> None:
        """:meth:`take` each read of ``indices`` and tell the caller, once each; a
        grouped caller hears of them in one call."""
        if self.grouped:
            if indices:
                _tell_group(self.done, [self.take(i, timed_out) for i in indices])
            return
        for i in indices:
            op, g = self.take(i, timed_out)
            _tell(self.done, op, g)

    def finish(self, i: int, timed_out: bool = False) -> None:
        """:meth:`finish_all` of read ``i`` alone."""
        self.finish_all((i,), timed_out)


class _Completion:
    """Stands in for a read's event in :meth:`RubberbandClient.read_batch`: each answer
    calls ``set``, and the first that completes the read hands it to ``done``."""

    __slots__ = ("client", "done", "gather", "mid", "op", "rid")

    def __init__(
        self,
        client: RubberbandClient,
        rid: Any,
        op: Any,
        gather: Gather,
        done: Callable[[Any, Gather | None], None],
    ) -> None:
        self.client, self.rid, self.op, self.gather, self.done = client, rid, op, gather, done
        self.mid: Any = None
        """The E-Cast id of a snapshot read's message (a shed notice names it)."""

    def set(self) -> None:
        if self.gather.complete and self.client._reads.pop(self.rid, None) is not None:
            self.client._asked.pop(self.rid, None)
            if self.mid is not None:
                self.client._unsafe.pop(self.mid, None)
            _tell(self.done, self.op, self.gather)


def _holds_bundle(held: Callable[[str, Any], bool], src: str, gathers: list[Any]) -> bool:
    """Whether ``src`` holds every open read of a bundle: its hull first (one check for
    the usual bundle, whose reads lie in one holder's segments), read by read if not."""
    lo = hi = None
    for g in gathers:
        if g is not None:
            ranges = g.ranges
            if lo is None or ranges[0][0] < lo:
                lo = ranges[0][0]
            if hi is None or ranges[-1][1] > hi:
                hi = ranges[-1][1]
    if lo is None or held(src, ((lo, hi),)):
        return True
    return all(g is None or held(src, g.ranges) for g in gathers)


def _holds_rows(
    held: Callable[[str, Any], bool], src: str, gathers: list[Any], rows: tuple[Any, ...]
) -> bool:
    """Whether ``src`` holds what each row of a bundle's answer says it covers."""
    n = len(gathers)
    for row in rows:
        if type(row) is tuple and len(row) == 4 and type(row[0]) is int and 0 <= row[0] < n:
            g = gathers[row[0]]
            if g is not None and not held(src, g.ranges if row[1] is None else row[1]):
                return False
    return True


def load_ops(ops: Any) -> Any:
    """An engine's client-side operations: an object, or ``module:Class`` to build one."""
    if ops is None:
        ops = DEFAULT_OPS
    if isinstance(ops, str):
        module, _, cls = ops.partition(":")
        return getattr(importlib.import_module(module), cls)()
    return ops


async def connect(
    routers: list[str] | str,
    name: str,
    *,
    ops: Any = None,
    listen: str = "127.0.0.1:0",
    answer_timeout: float = 10.0,
    connect_timeout: float = 15.0,
    **ecast_options: Any,
) -> RubberbandClient:
    """Connect a light client named ``client:...``.  ``ops`` are the engine's client-side
    operations (default: the key-value engine's); ``ecast_options`` go to
    :func:`ecast.connect` (``secret``, ``credentials``, timeouts)."""
    if not name.startswith("client:"):
        raise ecast.InvalidName(f"a Rubberband client is named client:..., not {name!r}")
    client = await ecast.connect(routers, name=name, join=False, listen=listen, **ecast_options)
    rb = RubberbandClient(client, ClientCore(load_ops(ops)), answer_timeout=answer_timeout)
    try:
        await rb.refresh(connect_timeout)
    except BaseException:
        await rb.close()
        raise
    return rb
