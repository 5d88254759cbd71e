"""``rubberband views`` (also ``rubberband admin view``): define, list, drop, read and
maintain materialized views (``docs/views.md``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
import zlib
from typing import Any

from rubberband.tools.client import Usage, connect, failures, jsonable, key, value, where

COMMANDS = ("create", "drop", "list", "status", "read", "maintain")
RECONNECT_AFTER = 15.0
"""Seconds a maintainer goes without an answer from the cluster and without a router
of its group reachable (or at once, with its client stopped: suspected after a pause)
before it connects anew, reading the state directory's routers again: the cluster
may have been restarted whole (a power cut, new routers), which a client of the old
group never reaches.  Its views then go on from their progress, or start over from a
snapshot where the feed was compacted (across a restart it is).  Longer than a
leader's failover, which it rides out."""
KINDS = ("selection", "projection", "index", "aggregate", "join")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rubberband views",
        description="Materialized views: create NAME --from LO HI --kind KIND ...; drop NAME; "
        "list; status [NAME ...]; read NAME [--level L] [--key K ...|--lookup V|--lo/--hi]; "
        "maintain [NAME ...] (the maintainer daemon: every view, or those named). Exit "
        "status: 0 done, 2 a bad command line or definition, 1 failed.",
    )
    ap.add_argument("command", choices=COMMANDS)
    ap.add_argument("names", nargs="*", help="view names")
    ap.add_argument("--state-dir", help="a rubberband cluster up directory")
    ap.add_argument("--routers", help="HOST:PORT,... (with --credentials)")
    ap.add_argument("--credentials", help="a credential file: client:* names, and for "
                    "create, maintain and drop maintainer:* names")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="JSON output, for scripts")
    ap.add_argument("--from", dest="base", nargs=2, metavar=("LO", "HI"),
                    help="create: the base key range [LO, HI) ('-' is unbounded)")  # fmt: skip
    ap.add_argument("--over", metavar="VIEW",
                    help="create: define it over another view (not --from)")  # fmt: skip
    ap.add_argument("--kind", choices=KINDS)
    ap.add_argument("--where", action="append", default=[], help="'FIELD OP VALUE' (repeat)")
    ap.add_argument("--columns", help="FIELD,FIELD,... the rows show")
    ap.add_argument("--on", help="index: the secondary key's field; join: the left field")
    ap.add_argument("--group-by", help="aggregate: the field rows are grouped by")
    ap.add_argument("--agg", action="append", default=[], metavar="NAME=FN:FIELD",
                    help="aggregate: count, sum, min, max or avg of FIELD (count:* counts "
                    "rows)")  # fmt: skip
    ap.add_argument("--table", metavar="NAME:KEY",
                    help="create: --from is of this table's rows (its key column KEY)")  # fmt: skip
    ap.add_argument("--right", nargs=2, metavar=("LO", "HI"), help="join: the right base range")
    ap.add_argument("--right-table", metavar="NAME:KEY",
                    help="join: --right is of this table's rows")  # fmt: skip
    ap.add_argument("--right-on", help="join: the right field")
    ap.add_argument("--split-at", action="append", default=[], metavar="KEY",
                    help="create: a split point of the view's key, as JSON (an index's "
                    "rows are [value, base key]: '[\"K\"]' splits before K; repeat, "
                    "increasing): each part is kept apart, spread over --shard "
                    "maintainers")  # fmt: skip
    ap.add_argument("--retention", type=float, default=60.0,
                    help="seconds of versions kept for reads at past positions")  # fmt: skip
    ap.add_argument("--level", default="sequential",
                    choices=["sequential", "read-your-writes", "snapshot", "any"])  # fmt: skip
    ap.add_argument("--key", action="append", default=[], help="read: a row key (repeat)")
    ap.add_argument("--lookup", help="read an index view: the rows of this secondary key")
    ap.add_argument("--lo", help="read: rows from this key")
    ap.add_argument("--hi", help="read: rows below this key")
    ap.add_argument("--poll", type=float, default=0.05,
                    help="maintain: the longest pause between empty pages, seconds")  # fmt: skip
    ap.add_argument("--shard", metavar="I/N",
                    help="maintain: keep only the groups of views (and parts of split views) "
                    "of shard I of N (0 <= I < N): N maintainers split them")  # fmt: skip
    ap.add_argument("--metrics", metavar="HOST:PORT",
                    help="maintain: serve /metrics and /health here")  # fmt: skip
    ap.add_argument("--engine", help="the cluster's engine, for its client operations "
                    "(views over scan-engine tables need scan-memory's or scan-log's; "
                    "default: what --state-dir says, else memory)")  # fmt: skip
    ap.add_argument("--listen", help="HOST:PORT this client serves on (default 127.0.0.1:0)")
    ap.add_argument("--source", help="the address it connects from (a host of several)")
    return ap


def _role(args: argparse.Namespace) -> str:
    """Who a command connects as: defining a view writes its definition, keeping one
    its rows, and dropping one deletes both, which only maintainers may
    (``docs/views.md``, "Who writes a view")."""
    return "maintainer" if args.command in ("create", "maintain", "drop") else "client"


async def _connect(args: argparse.Namespace) -> tuple[Any, str]:
    """:func:`connect` as :func:`_role` says, and a maintainer's refused credential
    explained (a deployment from before the role gave its maintainer ``client:*``)."""
    import ecast

    role = _role(args)
    try:
        return await connect(args, role)
    except ecast.AuthenticationError as e:
        if role != "maintainer":
            raise
        raise ecast.AuthenticationError(
            f"{e}; `views {args.command}` writes views' definitions or rows, which only "
            'maintainer:* names may (docs/views.md, "Who writes a view")'
        ) from None


def _bound(text: str | None) -> Any:
    return None if text in (None, "-") else key(text)


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    if len(args.names) != 1 or not (args.base or args.over) or not args.kind:
        raise Usage("create NAME (--from LO HI | --over VIEW) --kind KIND [...]")
    if args.base and args.over:
        raise Usage("create: --from LO HI or --over VIEW, not both")
    aggs: dict[str, list[Any]] = {}
    for a in args.agg:
        name, _, rest = a.partition("=")
        fn, _, field = rest.partition(":")
        if not name or not fn or not field:
            raise Usage(f"--agg {a!r}: write NAME=FN:FIELD (count:* counts rows)")
        aggs[name] = [fn, None if field == "*" else field]
    spec: dict[str, Any] = {
        "where": where(args.where),
        "columns": args.columns.split(",") if args.columns else None,
        "on": args.on,
        "group_by": args.group_by,
        "aggregates": aggs or None,
        "retention": args.retention,
    }
    if args.split_at:
        spec["parts"] = [value(k) for k in args.split_at]  # JSON: '["K"]' is ("K",)
    if args.right:
        spec["right"] = (_bound(args.right[0]), _bound(args.right[1]))
        spec["right_on"] = args.right_on
    for option, name in ((args.table, "table"), (args.right_table, "right_table")):
        if option is not None:
            table, _, column = option.partition(":")
            if not table or not column:
                raise Usage(f"--{name.replace('_', '-')} {option!r}: write NAME:KEY")
            spec[name] = (table, column)
    return spec


async def run(args: argparse.Namespace) -> Any:
    from rubberband.views import view_def

    spec: dict[str, Any] = {}
    if args.command == "create":  # checked whole before connecting
        spec = _spec(args)
        source: Any = args.over
        if args.over is None:
            source = (_bound(args.base[0]), _bound(args.base[1]))
            view_def(args.names[0], args.kind, source, **spec)
        else:  # its base ranges are the other view's: checked once it is read
            view_def(args.names[0], args.kind, (None, None), over=args.over,
                     base=[(None, None)], **spec)  # fmt: skip
    if args.command == "maintain":
        _shard(args.shard)  # checked before connecting
    if args.command == "read" and len(args.names) != 1:
        raise Usage("read NAME [--level L] [--key K ...|--lookup V|--lo LO --hi HI]")
    if args.command == "drop" and not args.names:
        raise Usage("drop NAME [NAME ...]")
    rb, _engine = await _connect(args)
    try:
        if args.command == "create":
            view = await rb.create_view(args.names[0], source, args.kind, **spec)
            return {"created": view.name, "definition": view.to_dict()}
        if args.command == "drop":
            for name in args.names:
                await rb.drop_view(name)
            return {"dropped": args.names}
        if args.command == "list":
            from rubberband.views.client import list_views

            malformed: list[tuple[Any, str]] = []
            out: dict[str, Any] = {"views": [v.to_dict() for v in await list_views(rb, malformed)]}
            if malformed:  # catalog entries some client wrote that are no definition
                out["malformed"] = [{"key": k, "error": e} for k, e in malformed]
            return out
        if args.command == "status":
            return {"views": [await view_status(rb, v) for v in await rb.views()
                              if not args.names or v.name in args.names]}  # fmt: skip
        if args.command == "read":
            return await _read(rb, args)
        return await _maintain(rb, args)
    finally:
        await rb.close()


def _lost(rb: Any, quiet: float) -> bool:
    """Has the client lost the cluster: stopped, unavailable (no router of its group
    reachable for the client's ``unavailable_after``, 10 s: a whole cluster restarted
    is not coming back at the addresses it knows), or no router reachable and no
    answer for ``RECONNECT_AFTER`` (``quiet``: seconds since the catalog was last
    read)?  Failing reads with a router reachable (a segment under repair) are the
    cluster's answers, not its absence: the views go on."""
    if rb.ecast.terminated is not None or rb.ecast.state == "unavailable":
        return True
    return quiet > RECONNECT_AFTER and rb.ecast.state != "connected"


async def _halt(running: dict[str, Any], grace: float = 5.0) -> None:
    """Every group's loop stopped (a step still waiting after ``grace`` seconds for an
    answer: cut; a lost cluster's never comes)."""
    for _group, halt, _task in running.values():
        halt.set()
    tasks = [t for _g, _h, t in running.values()]
    if tasks:
        _done, late = await asyncio.wait(tasks, timeout=grace)
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    running.clear()


async def _reconnect(
    rb: Any, args: argparse.Namespace, running: dict[str, Any], figures: dict[str, Any],
    stop: asyncio.Event,
) -> Any:  # fmt: skip
    """A new client, once one connects (``RECONNECT_AFTER``); the groups of the old one
    stopped, their figures dropped (the loop starts every view again)."""
    why = rb.ecast.terminated or (
        "no router reachable" if rb.ecast.state == "unavailable"
        else f"no answer for {RECONNECT_AFTER:.0f} s and a router down"
    )  # fmt: skip
    log = logging.getLogger("rubberband.views")
    log.warning("cluster lost (%s): connecting anew", why)
    await _halt(running, grace=1.0)  # (their cluster is lost: nothing to finish)
    figures.clear()
    with contextlib.suppress(Exception):
        await rb.close(timeout=1.0)
    while not stop.is_set():
        began = time.monotonic()
        try:
            new = (await _connect(args))[0]
        except failures() as e:
            log.warning("connecting anew failed after %.1f s (%s): trying again",
                        time.monotonic() - began, str(e)[:200] or type(e).__name__)  # fmt: skip
        else:
            log.info("connected anew in %.1f s", time.monotonic() - began)
            return new
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return rb


async def view_status(rb: Any, view: Any) -> dict[str, Any]:
    """A view's progress and staleness: positions behind a sequential read now (of its
    part furthest behind, for a view split in parts)."""
    from rubberband.views.define import progress_keys, units
    from rubberband.views.reads import combined_progress

    parts = [u.part or 0 for u in units(view)]
    keys = [progress_keys(view.name, part)[0] for part in parts]
    got, now = await rb.read(("get", tuple(keys)), "sequential", with_position=True)
    said = combined_progress(parts, [got.get(k) for k in keys])
    if said is None or said[3] != view.parts:  # none yet, or an older definition's
        return {"name": view.name, "kind": view.kind, "maintained": False}
    return {"name": view.name, "kind": view.kind, "maintained": True, "position": said[0],
            "floor": said[1], "behind": now - said[0]}  # fmt: skip


async def _read(rb: Any, args: argparse.Namespace) -> Any:
    view = rb.view(args.names[0])
    if args.key:
        rows, at = await view.get([key(k) for k in args.key], args.level, with_position=True)
        rows = list(rows.items())
    elif args.lookup is not None:
        rows, at = await view.lookup(value(args.lookup), args.level, with_position=True)
    else:
        rows, at = await view.scan(_bound(args.lo), _bound(args.hi), args.level, with_position=True)
    return {"position": at, "rows": [[k, v] for k, v in rows]}


async def _maintain(rb: Any, args: argparse.Namespace) -> Any:
    """Maintain the named views (all, when none is named), starting those defined later
    and stopping those dropped, until SIGTERM or SIGINT."""
    from rubberband.views.client import list_views, maintain_group
    from rubberband.views.define import unit_name, units
    from rubberband.views.steps import Figures, Group, group_of

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("rubberband.views").setLevel(logging.INFO)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Views over the same sources form a group: one loop reads the feeds once for all.
    running: dict[str, tuple[Group, asyncio.Event, asyncio.Task[None]]] = {}
    figures: dict[str, Figures] = {}
    server = await _serve_metrics(args.metrics, figures) if args.metrics else None
    started = time.monotonic()
    maintained: set[str] = set()
    told: dict[str, Any] = {}  # the figures whose stop was logged (a view defined anew: new ones)
    shard = _shard(args.shard)
    answered = time.monotonic()
    warned: set[str] = set()  # malformed catalog entries logged
    while not stop.is_set():
        if _lost(rb, time.monotonic() - answered):
            rb = await _reconnect(rb, args, running, figures, stop)
            answered = time.monotonic()
            continue
        with contextlib.suppress(*failures()):
            malformed: list[tuple[Any, str]] = []
            defined = await list_views(rb, malformed)
            named = [v for v in defined if not args.names or v.name in args.names]
            answered = time.monotonic()
            _warn_malformed(malformed, warned)
            views = {unit_name(u): u for v in named for u in units(v) if in_shard(u, shard)}
            for key, (group, halt, task) in list(running.items()):
                for name in [n for n in group.views if views.get(n) != group.views[n]]:
                    group.remove(name)  # dropped (or defined anew: it starts again)
                    figures.pop(name, None)
                if not group.views or task.done():
                    _warn_failed(group, task)  # (it starts again below: said, not silent)
                    halt.set()
                    del running[key]
                    for name in group.views:
                        figures.pop(name, None)
            for name, v in views.items():
                if name in figures:
                    continue
                key = group_of(v)
                if key not in running:
                    group, halt = Group(), asyncio.Event()
                    task = asyncio.create_task(maintain_group(rb, group, args.poll, halt))
                    running[key] = (group, halt, task)
                group = running[key][0]
                group.add(v)
                figures[name] = group.figures[name]
                maintained.add(name)
                logging.getLogger("rubberband.views").info("maintaining view %s", name)
        _report(rb, figures, time.monotonic())
        for name, f in sorted(figures.items()):
            if f.stopped and told.get(name) is not f:
                told[name] = f  # once: it stays stopped until defined anew or restarted
                logging.getLogger("rubberband.views").error("%s", f.stopped)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    await _halt(running)
    with contextlib.suppress(Exception):
        await rb.close()
    if server is not None:
        await server.cleanup()
    return {"maintained": sorted(maintained), "seconds": round(time.monotonic() - started, 1)}


def _warn_malformed(malformed: list[tuple[Any, str]], warned: set[str]) -> None:
    """Log each catalog entry that is no definition once (it is left out; every other
    view goes on)."""
    for k, why in malformed:
        if repr(k) not in warned:
            warned.add(repr(k))
            logging.getLogger("rubberband.views").error(
                "catalog entry %r is no view definition: %s", k, why
            )


def _warn_failed(group: Any, task: asyncio.Task[None]) -> None:
    """Log why a group's loop ended with an error (its views start again from a
    snapshot; before, they did so without a word)."""
    if task.done() and not task.cancelled() and task.exception() is not None:
        e = task.exception()
        logging.getLogger("rubberband.views").error(
            "the loop of views %s failed (%s: %s): starting them again",
            ", ".join(sorted(group.views)), type(e).__name__, str(e)[:300],
        )  # fmt: skip


def _shard(text: str | None) -> tuple[int, int]:
    """``--shard I/N`` as ``(I, N)`` (``(0, 1)``: every view)."""
    if text is None:
        return 0, 1
    i, _, n = text.partition("/")
    try:
        shard = int(i), int(n)
    except ValueError:
        raise Usage(f"--shard {text!r}: write I/N, such as 0/2") from None
    if not 0 <= shard[0] < shard[1]:
        raise Usage(f"--shard {text!r}: I is 0 to N-1")
    return shard


def in_shard(view: Any, shard: tuple[int, int]) -> bool:
    """Is ``view`` (a view, or a part of one: :func:`~rubberband.views.define.units`)
    kept by shard ``(I, N)``?  By its group (views over the same sources read one
    feed together), hashed the same in every process; the parts of a split view go to
    the shards after its group's, one each in turn, so that ``N`` maintainers keep
    ``N`` parts apart."""
    from rubberband.views.steps import group_of

    return (zlib.crc32(group_of(view).encode()) + (view.part or 0)) % shard[1] == shard[0]


def _report(rb: Any, figures: dict[str, Any], now: float) -> None:
    """Each view's progress to a super, for its console (:class:`ViewProgress`)."""
    from rubberband.proto import ViewProgress
    from rubberband.super import REPORTED_VIEWS

    views = tuple(
        (name, f.position, max(0, f.seen - f.position), round(now - f.fresh_as_of, 3), f.rows)
        for name, f in sorted(figures.items())
        if f.position >= 0 and f.fresh_as_of
    )
    if views:
        rb.tell_super(ViewProgress(views[:REPORTED_VIEWS]))


async def _serve_metrics(where: str, figures: dict[str, Any]) -> Any:
    """``/metrics`` (each view's progress and freshness) and ``/health`` on ``where``."""
    from ecast import daemon_kit

    return await daemon_kit.serve_http(
        where,
        lambda: metrics_text(figures, time.monotonic()),
        lambda: {
            "status": "ok",
            "views": sorted(figures),
            "stopped": {v: f.stopped for v, f in sorted(figures.items()) if f.stopped},
        },
        lambda _h: True,
    )


METRICS = (
    ("position", "gauge", "the position up to which every base write is in the view"),
    ("floor", "gauge", "the oldest position the view can still be read at"),
    ("rows", "gauge", "rows the view holds"),
    ("events", "counter", "base writes applied since the maintainer started or connected anew"),
    ("versions", "counter", "row versions written"),
    ("reclaimed", "counter", "rows that left the view, sent to be dropped"),
    ("dead_rows", "gauge", "rows that left the view, not yet dropped at its replicas"),
    ("starts", "counter", "starts from a snapshot (the first, and each start over)"),
    ("failures", "counter", "steps that failed (a start over follows)"),
    ("compacted", "counter", "failures that were the feed compacted under the maintainer"),
    ("halted", "gauge", "1: the view stopped at its position (why: /health)"),
    ("page_seconds", "gauge", "seconds between the maintainer's last two feed pages (its round)"),
    ("page_changes", "gauge", "base changes in the maintainer's last feed page"),
    ("pages", "counter", "feed pages the maintainer read: one a round of its loop"),
)


def metrics_text(figures: dict[str, Any], now: float) -> str:
    """Prometheus text of the views' figures, with ``rubberband_view_staleness_seconds``:
    how long ago the base was last known to be reflected (the pages the last progress
    covers were asked for then)."""
    from ecast import daemon_kit

    m = daemon_kit.Metrics()
    for what, kind, about in METRICS:  # a family's series together, as the format wants
        name = f"rubberband_view_{what}" + ("_total" if kind == "counter" else "")
        for view, f in sorted(figures.items()):
            m.add(name, getattr(f, what), about, kind, view=view)
    about = "seconds since the view was known to reflect every base write"
    for view, f in sorted(figures.items()):
        stale = round(now - f.fresh_as_of, 4) if f.fresh_as_of else float("nan")
        m.add("rubberband_view_staleness_seconds", stale, about, view=view)
    return str(m.text())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_intermixed_args(argv)
    if args.command == "maintain":  # a daemon: its work is messages, as a router's
        import ecast

        ecast.tune_process(keeps_data=True)  # a view's rows, held for its pages
    try:
        out = asyncio.run(run(args))
    except Usage as e:
        print(f"rubberband views: {e}", file=sys.stderr)
        return 2
    except failures() as e:
        code = 2 if type(e).__name__ in ("BadOperation", "BadKey") else 1
        print(f"rubberband views: {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return code
    print(json.dumps(jsonable(out)) if args.json else _text(out), flush=True)
    return 0


def _text(out: dict[str, Any]) -> str:
    if "rows" in out:
        lines = [f"{json.dumps(jsonable(k))}\t{json.dumps(jsonable(v))}" for k, v in out["rows"]]
        return "\n".join([*lines, f"({len(out['rows'])} rows at position {out['position']})"])
    if "views" in out:
        return (
            "\n".join(
                " ".join(f"{k}={json.dumps(jsonable(v))}" for k, v in view.items())
                for view in out["views"]
            )
            or "(no views)"
        )
    return " ".join(f"{k}={json.dumps(jsonable(v))}" for k, v in out.items())
