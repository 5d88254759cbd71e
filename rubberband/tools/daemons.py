"""``rubberband storage`` and ``rubberband super``: the Rubberband daemons.

Both are E-Cast application processes that join the group under their role's name
prefix and listen for direct connections (results, migration streams, heartbeats).  A
storage daemon joins in standby and waits for a super to place it; a super keeps a
replica of the configuration, heartbeats every storage process and super and votes
against the silent ones, repairs failed and incomplete holders on its own (the first
super does, ``--auto-repair``), answers clients' keyspace queries, and serves the admin
API (HTTP, guarded by a bearer token) that turns requests into keyspace messages.

Settings come from flags or a TOML file (``--file``; a flag always wins), declared once
with E-Cast's daemon helpers.  Logs are ``key=value`` lines; ``/metrics`` (Prometheus)
and ``/health`` answer on ``--metrics`` (storage) or the admin address (super).  A bad
setting or an unreachable cluster exits with status 2 and one line that says what is
wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import importlib
import inspect
import json
import logging
import os
import signal
import string
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgpack

import ecast
from ecast import daemon_kit as kit
from ecast.core import mutations
from rubberband.changelog import ChangeLog
from rubberband.engine import EVERYTHING
from rubberband.errors import Refused
from rubberband.holds import Holds
from rubberband.host import StorageHost, SuperHost
from rubberband.storage import StorageCore
from rubberband.super import SuperCore
from rubberband.tools.settings import ENGINES, STORAGE_SETTINGS, SUPER_SETTINGS

log = logging.getLogger("rubberband")
UsageError = kit.UsageError


def _auth(args: argparse.Namespace) -> dict[str, Any]:
    """``ecast.connect``'s proof: a credential, or the development mode's secret."""
    if args.credentials and args.secret_file:
        raise UsageError("give --credentials or --secret-file, not both")
    if args.credentials:
        if not Path(args.credentials).is_file():
            raise UsageError(f"--credentials: no such file: {args.credentials}")
        return {"credentials": args.credentials}
    if args.secret_file:
        problem = kit.secret_file_problem(args.secret_file)
        if problem:
            raise UsageError(f"--secret-file: {problem}")
        return {"secret": Path(args.secret_file).read_text().strip()}
    secret = os.environ.get("ECAST_SECRET")
    if not secret:
        raise UsageError("give --credentials, --secret-file, or ECAST_SECRET")
    return {"secret": secret}


def engine_options(pairs: list[str]) -> dict[str, Any]:
    """``NAME=VALUE`` flags as keyword arguments: integers and decimals as numbers."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not name.isidentifier():
            raise UsageError(f"--engine-arg {pair!r}: {name!r} is not an option name")
        v: Any = value
        with contextlib.suppress(ValueError):
            v = float(value) if "." in value else int(value)
        out[name] = v
    return out


def check_engine(spec: str, pairs: list[str]) -> None:
    """Before anything starts: the engine exists and takes these options."""
    cls = load_engine(spec)
    try:
        inspect.signature(cls).bind(**engine_options(pairs))
    except TypeError as e:
        raise UsageError(f"--engine {spec}: {e} (options: {inspect.signature(cls)})") from None


def make_engine(spec: str, pairs: list[str]) -> Any:
    """The engine, built with its options; a bad option is a usage error, not a crash."""
    cls = load_engine(spec)
    options = engine_options(pairs)
    try:
        return cls(**options)
    except TypeError as e:
        raise UsageError(f"--engine {spec}: {e}") from None
    except (ValueError, RuntimeError, OSError) as e:
        raise UsageError(f"--engine {spec} did not start: {e}") from None


def load_engine(spec: str) -> Any:
    path = ENGINES.get(spec, spec)
    module, _, cls = path.partition(":")
    if not module or not cls:
        raise UsageError(f"--engine is one of {', '.join(ENGINES)} or module:Class, not {spec!r}")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"--engine {spec}: {e}") from None


def _stop_on_signals(stop: asyncio.Event, received: list[int] | None = None) -> None:
    loop = asyncio.get_running_loop()

    def on(sig: int) -> None:
        if received is not None:
            received.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on, sig)


async def _connect(args: argparse.Namespace, confirms: bool = False) -> ecast.Client:
    """``confirms``: deliveries are confirmed when the process says so, not on arrival
    (a storage process: as it takes them in, :class:`~rubberband.host.StorageHost`)."""
    return await ecast.connect(
        args.routers.split(","),
        name=args.name,
        **_auth(args),
        listen=args.listen,
        timeout=args.join_timeout,
        params=ecast.EndpointParams(confirm_when_durable=True) if confirms else None,
    )


async def _until_stopped(
    host: Any,
    client: ecast.Client,
    runner: Any,
    drain: Callable[[], Awaitable[bool]] | None = None,
) -> int:
    """Run the host until it stops on its own (exit 1) or a signal asks (exit 0).
    ``drain`` runs first on SIGTERM (SIGINT stops at once: the whole cluster is going
    away, or a person pressed Ctrl-C); when it says no, the process stays up."""
    stop = asyncio.Event()
    received: list[int] = []
    _stop_on_signals(stop, received)
    run = asyncio.ensure_future(host.run())
    while True:
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.wait([run, waiter], return_when=asyncio.FIRST_COMPLETED)
        if run.done() or drain is None or received[-1:] != [signal.SIGTERM]:
            break
        if await drain():
            break
        stop.clear()
    code = 0
    if run.done():
        log.error("event=stopped reason=%s", str(run.result()).replace(" ", "_"))
        code = 1
    else:
        run.cancel()
        await host.close()
    waiter.cancel()
    with contextlib.suppress(Exception):
        await client.close(timeout=5.0)
    if runner is not None:
        await runner.cleanup()
    return code


def _client_metrics(m: Any, client: ecast.Client) -> None:
    m.add("rubberband_connected", 1 if client.state == "connected" else 0, "E-Cast connection up")


# ------------------------------------------------------------------ storage
def storage_metrics(
    core: StorageCore, client: ecast.Client | None = None, host: StorageHost | None = None
) -> str:
    st = core.status()
    m = kit.Metrics()
    if host is not None:
        m.histogram(
            "rubberband_step_seconds",
            host.step_seconds,
            "time to apply one batch of deliveries on the engine thread",
        )
    m.add("rubberband_keyspace_version", st["version"] or 0, "keyspace version applied here")
    m.add("rubberband_active", 1 if st["active"] else 0, "on the ring (0: standby)")
    m.add("rubberband_ranges", len(st["owned"]), "ranges held", state="owned")
    m.add("rubberband_ranges", len(st["receiving"]), "ranges held", state="receiving")
    m.add("rubberband_ranges", len(st["broken"]), "ranges held", state="broken")
    m.add("rubberband_incomplete", 1 if st["incomplete"] else 0, "a copy broke off: needs repair")
    m.add("rubberband_queued", st["queued"], "delivered items waiting for their ranges")
    m.add(
        "rubberband_reads_held_total",
        st["reads_held"],
        "sequential reads that waited for a copy into this process",
    )
    m.add("rubberband_transfers", st["transfers_in"], "migrations running", direction="in")
    m.add("rubberband_transfers", st["transfers_out"], "migrations running", direction="out")
    m.add("rubberband_stopped", 0 if st["stopped"] is None else 1, "stopped (fail-stop)")
    changes = st["changes"] or {}
    m.add("rubberband_change_log", changes.get("changes", 0), "changed keys kept for feeds")
    m.add("rubberband_change_log_bytes", changes.get("bytes", 0), "estimated bytes of changes kept")
    m.add(
        "rubberband_change_log_floor",
        changes.get("floor", -1),
        "feeds may continue only after this position (older changes dropped)",
    )
    m.add("rubberband_intake_held", int(core.holds.limit is not None), "views hold writers back")
    m.add("rubberband_intake_held_seconds_total", core.holds.held_seconds, "seconds views held it")
    for key, value in sorted(core.engine.stats().items()):
        if type(value) in (int, float):
            m.add("rubberband_engine", value, "the engine's own figures", stat=key)
    if client is not None:
        _client_metrics(m, client)
    return m.text()


BEHIND_AFTER = 10.0
"""Seconds delivered items may wait for their ranges before /health says degraded."""


def storage_health(core: StorageCore, host: StorageHost | None = None) -> dict[str, Any]:
    """``ok``; ``degraded`` (503) when a copy broke off (incomplete: it needs a repair)
    or items have waited for their ranges for ``BEHIND_AFTER`` s (behind: a migration
    into it is slow or stuck); ``stopped`` after a fail-stop."""
    status = core.status()
    status["owned"] = len(status["owned"])
    for k in ("receiving", "broken"):
        status[k] = len(status[k])
    reasons = []
    if status.get("incomplete"):
        reasons.append("incomplete: a copy broke off; the supers repair it")
    since = host.queued_since if host is not None else None
    if since is not None and time.monotonic() - since > BEHIND_AFTER:
        reasons.append(f"behind: items have waited {time.monotonic() - since:.0f} s for ranges")
    status["status"] = "stopped" if core.stopped is not None else "degraded" if reasons else "ok"
    if reasons:
        status["reasons"] = reasons
    status["engine"] = core.engine.stats()
    return status


T = TypeVar("T")

HEALTH_WAIT = 2.0
"""Seconds ``/health`` waits for the engine thread to finish its step before it says
``busy`` (503): a readiness probe gets an answer in time, and a step that long is news."""
METRICS_WAIT = 5.0
"""Seconds ``/metrics`` waits for the engine thread before it answers with
``rubberband_busy`` alone (a scraper's usual timeout is 10 s)."""


async def _between_steps(host: StorageHost, read: Callable[[], T], wait: float, busy: T) -> T:
    """``read()`` on the engine thread between two steps (the core and the engine are
    not shared: a read on the loop could walk their tables while a step changes them),
    or ``busy`` once one step has held the thread ``wait`` seconds."""
    try:
        return await asyncio.wait_for(host.inspect(read), wait)
    except TimeoutError:
        return busy


async def storage_health_between_steps(core: StorageCore, host: StorageHost) -> dict[str, Any]:
    """:func:`storage_health` between two steps, or ``busy`` after :data:`HEALTH_WAIT`."""
    busy = {"status": "busy", "reasons": [f"a step has run for over {HEALTH_WAIT:g} s"]}
    return await _between_steps(host, lambda: storage_health(core, host), HEALTH_WAIT, busy)


async def storage_metrics_between_steps(
    core: StorageCore, client: ecast.Client | None, host: StorageHost
) -> str:
    """:func:`storage_metrics` between two steps; after :data:`METRICS_WAIT`,
    ``rubberband_busy 1`` alone (figures of a process stuck in a step would be the ones
    from before it)."""
    m = kit.Metrics()
    m.add("rubberband_busy", 1, f"the engine thread is in one step over {METRICS_WAIT:g} s")
    return await _between_steps(
        host, lambda: storage_metrics(core, client, host), METRICS_WAIT, m.text()
    )


ADMIN_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "-_.~+/=")


def read_admin_token(path: str) -> str:
    """The admin token from its file: readable by its owner alone, 16 to 512 characters
    of a bearer token's alphabet (RFC 6750), nothing else in the file but one final
    newline.  A token with a space in it or around it is refused, not trimmed: two
    files that differ in a space must not both open the admin API."""
    problem = ecast.private_file_problem(path)
    if problem:
        raise UsageError(f"--admin-token-file: {problem}")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--admin-token-file: {e}") from None
    token = text[:-1] if text.endswith("\n") else text
    if not 16 <= len(token) <= 512 or not set(token) <= ADMIN_TOKEN_CHARS:
        raise UsageError(
            "--admin-token-file: the token is 16 to 512 characters of A-Z a-z 0-9 - _ . ~ + / =, "
            "with nothing else in the file but a final newline (make one with: "
            "python -c 'import secrets; print(secrets.token_hex(24))' > FILE; chmod 600 FILE)"
        )
    return token


def plant_mutations(names: list[str]) -> None:
    """Planted bugs for the fault-injection suite, refused outside tests: the storage
    core's (and its client-facing answers')."""
    if not names:
        return
    if not mutations.allowed():
        raise UsageError(f"--mutation plants bugs for tests; set {mutations.ENV}=1 to allow it")
    known = mutations.known("storage")
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise UsageError(f"--mutation {', '.join(unknown)}: unknown (known: {', '.join(known)})")
    mutations.plant(names)


def _start_empty(engine: Any) -> None:
    """A storage process joins as a new member that holds nothing: data a durable
    engine kept from an earlier process in its directory is no part of any range the
    ring will give it (a migration would add to it, not replace it), so it goes, and
    its positions start again.  Rejoining with that data is the whole-cluster restart
    (``--keep-data``, docs/decisions.md)."""
    held = engine.stats().get("items", 0)
    if held:
        why = "data of an earlier process in this directory; a new member starts empty"
        log.warning("event=engine_cleared items=%s reason=%s", held, why)
        engine.delete(EVERYTHING)
    getattr(engine, "new_epoch", lambda _: None)(-1)  # the group it joins, unnumbered


HOLDERS_FILE = "holders.json"
"""In a durable engine's directory: the names of the processes whose data it holds."""


def _holders_file(engine: Any) -> Path | None:
    path = getattr(engine, "path", None)
    return None if path is None else Path(path) / HOLDERS_FILE


def _write_holders(f: Path, names: tuple[str, ...]) -> None:
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(list(names)))
    os.replace(tmp, f)


def kept_names(args: argparse.Namespace, engine: Any) -> tuple[str, ...] | None:
    """With ``--keep-data`` on a durable engine: the names its data may have been
    written under (those its directory recorded, and this process's own: a local
    cluster restarts under the same names), for the coordinating super to map the
    recorded ring onto this process (a deploy restarts it under a new name).  Written
    down with ours at once, so a crash right after the restore still finds both."""
    f = _holders_file(engine)
    if not args.keep_data or f is None:
        return None
    try:
        names = [n for n in json.loads(f.read_text()) if isinstance(n, str)]
    except (OSError, ValueError, TypeError):
        names = []
    # The first is the one the data was last restored or placed under: kept however
    # often this process fails to start before it joins.
    kept = tuple(dict.fromkeys([*names[:1], *names[-20:], args.name]))
    _write_holders(f, kept)
    return kept


async def _record_holder(core: StorageCore, engine: Any, name: str) -> None:
    """Once the data is this process's alone (restored, or dropped), say so."""
    f = _holders_file(engine)
    if f is None:
        return
    while core.kept is not None and core.stopped is None:
        await asyncio.sleep(0.2)
    if core.kept is None:
        await asyncio.to_thread(_write_holders, f, (name,))


async def run_storage(args: argparse.Namespace) -> int:
    if args.metrics:
        kit.check_port_free(args.metrics, "--metrics")
    engine = make_engine(args.engine, args.engine_arg)
    kept = kept_names(args, engine)
    if kept is None:
        _start_empty(engine)
    try:
        client = await _connect(args, confirms=True)
    except BaseException:
        engine.close()
        raise
    changes = ChangeLog(
        max_changes=args.change_log, max_age=args.change_log_age, max_bytes=args.change_log_bytes
    )
    core = StorageCore(
        args.name, engine, changes=changes, kept=kept, holds=Holds(args.view_hold_at)
    )
    host = StorageHost(client, core)
    recording = asyncio.ensure_future(_record_holder(core, engine, args.name))
    log.info("event=joined name=%s engine=%s", args.name, args.engine)
    runner = None
    if args.metrics:
        runner = await kit.serve_http(
            args.metrics,
            lambda: storage_metrics_between_steps(core, client, host),
            lambda: storage_health_between_steps(core, host),
            lambda h: h["status"] == "ok",
        )
    try:
        return await _until_stopped(host, client, runner, drain=lambda: _drain(host, args))
    finally:
        recording.cancel()
        engine.close()  # a memcached engine stops its server


async def _drain(host: StorageHost, args: argparse.Namespace) -> bool:
    """SIGTERM on a storage process: a standby parts at once; an active one is first
    taken off the ring (contracted, or replaced by ``--replace-with``) so that no
    replica goes missing.  False (stay up, logged) when that is refused or fails."""
    log.info("event=draining replace_with=%s", args.replace_with)
    why = await host.leave(args.replace_with, args.drain_timeout)
    if why is None:
        return True
    log.error("event=leave_refused reason=%s", why.replace(" ", "_")[:300])
    return False


# ------------------------------------------------------------------ super
STUCK_AFTER = 120.0
"""Seconds a reconfiguration may stay pending before a super's /health says degraded."""


def super_metrics(host: SuperHost) -> str:
    m = kit.Metrics()
    m.histogram(
        "rubberband_reconfiguration_seconds",
        host.reconfiguration_seconds,
        "reconfigurations from planning until every receiver was ready",
    )
    c = host.core.config
    if c is not None:
        m.add("rubberband_keyspace_version", c.version, "keyspace version")
        m.add("rubberband_replication", c.f, "replication factor f")
        m.add("rubberband_processes", len(c.keyspace), "storage processes", state="ring")
        m.add("rubberband_processes", len(c.standby()), "storage processes", state="standby")
        m.add("rubberband_processes", len(c.busy()), "storage processes", state="busy")
        m.add("rubberband_processes", len(c.incomplete), "storage processes", state="incomplete")
        m.add("rubberband_processes", len(c.excluded()), "storage processes", state="failed")
        m.add("rubberband_pending_reconfigurations", len(c.pending), "not ready yet")
        m.add("rubberband_supers", len(c.supers()), "live supers")
        m.add("rubberband_clients", len(c.clients()), "joined clients")
    for key, value in sorted(host.counts.items()):
        m.add("rubberband_super_events_total", value, "what this super did", "counter", event=key)
    _client_metrics(m, host.client)
    return m.text()


def check_super_settings(args: argparse.Namespace) -> str:
    """The admin address is given and the token file fit for use: the token."""
    if not args.admin:
        raise UsageError("--admin HOST:PORT is required (the admin API, /metrics, /health)")
    if not args.admin_token_file:
        raise UsageError("--admin-token-file is required (the admin API's bearer token)")
    return read_admin_token(args.admin_token_file)


async def run_super(args: argparse.Namespace) -> int:
    token = check_super_settings(args)
    kit.check_port_free(args.admin, "--admin")
    restore = read_keyspace_record(args.keyspace_file)
    client = await _connect(args)
    core = SuperCore(
        args.name,
        heartbeat=args.heartbeat,
        suspect_after=args.suspect_after,
        auto_repair=args.auto_repair,
        repair_after=args.repair_after,
        restore=restore,
        restore_wait=args.restore_wait,
    )
    host = SuperHost(client, core)
    host.keyspace_file = args.keyspace_file
    if restore is not None:
        log.info("event=restore_from version=%s holders=%s", restore[2], len(restore[3]))
    log.info("event=joined name=%s", args.name)
    api = AdminApi(host, token)
    runner = await kit.serve_http(
        args.admin, lambda: super_metrics(host), api.health, lambda h: h["status"] == "ok",
        api.routes,
    )  # fmt: skip
    return await _until_stopped(host, client, runner)


def read_keyspace_record(path: str | None) -> Any:
    """The ring a super recorded (``--keyspace-file``), or None (no file yet, or one
    with an empty ring); a record that does not read is a usage error, never a guess."""
    if path is None or not Path(path).exists():
        return None
    try:
        f, partitioning, version, ring, partial, *lost = msgpack.unpackb(
            Path(path).read_bytes(), use_list=False
        )
        ring = tuple((tuple(e), str(p)) for e, p in ring)
        partial = tuple(str(p) for p in partial)
        gone = tuple(str(p) for p in lost[0]) if lost else ()
        return (int(f), str(partitioning), int(version), ring, partial, gone) if ring else None
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise UsageError(f"--keyspace-file {path}: not a keyspace record ({e})") from None


class AdminApi:
    """A super's admin API: ``/status`` and ``/reconfigure`` for the token's holder, the
    console page, and ``/health`` for anyone."""

    def __init__(self, host: SuperHost, token: str) -> None:
        self.host = host
        self.token = token

    def authorized(self, request: kit.Request) -> bool:
        got = request.header("Authorization")
        return hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode())

    def health(self) -> dict[str, Any]:
        """``ok``; ``starting`` until joined; ``degraded`` (503) while a reconfiguration
        has been pending for more than ``STUCK_AFTER`` s (a receiver is not finishing).
        Answered to anyone, so it says how the super is and nothing of the cluster's
        layout: the ring, processes and coordinator are ``/status``'s, with the token."""
        host = self.host
        full = host.core.status()
        s: dict[str, Any] = {
            "status": "ok" if full.get("joined") and host.stopped is None else "starting",
            "joined": bool(full.get("joined")),
            "version": full.get("version"),
        }
        now = time.monotonic()
        stuck = {v: round(now - t) for v, t in host.pending_since.items() if now - t > STUCK_AFTER}
        if stuck and s["status"] == "ok":
            s["status"] = "degraded"
            s["reasons"] = [f"version {v} pending for {age} s" for v, age in sorted(stuck.items())]
        return s

    async def status(self, request: kit.Request) -> kit.Response:
        if not self.authorized(request):
            return kit.json_response({"error": "a valid admin token is required"}, status=401)
        return kit.json_response(self.host.status())

    async def reconfigure(self, request: kit.Request) -> kit.Response:
        if not self.authorized(request):
            return kit.json_response({"error": "a valid admin token is required"}, status=401)
        try:
            body = request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return kit.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("op"), str):
            return kit.json_response(
                {"error": 'the body is {"op": ..., "args": [...]}'}, status=400
            )
        op_args = body.get("args", [])
        if not isinstance(op_args, list) or len(op_args) > 3:
            return kit.json_response({"error": "args is a list of at most 3 values"}, status=400)
        try:
            result = await self.host.reconfigure(
                body["op"],
                *op_args,
                force=bool(body.get("force", False)),
                dry_run=bool(body.get("dry_run", False)),
                wait=bool(body.get("wait", True)),
                timeout=min(float(body.get("timeout", 60)), 600.0),
            )
        except Refused as e:
            return kit.json_response({"error": str(e)}, status=409)
        except (TypeError, ValueError) as e:
            return kit.json_response({"error": f"bad request: {e}"}, status=400)
        except TimeoutError as e:
            return kit.json_response({"error": str(e)}, status=504)
        return kit.json_response(result)

    async def history(self, request: kit.Request) -> kit.Response:
        """The last hour of load samples and the recent events, both after ``?since=T``
        (wall time, seconds) when given: what the console draws at once on loading."""
        if not self.authorized(request):
            return kit.json_response({"error": "a valid admin token is required"}, status=401)
        since = 0.0
        for part in request.query.split("&"):
            name, _, value = part.partition("=")
            if name == "since":
                try:
                    since = float(value)
                except ValueError:
                    return kit.json_response({"error": "since is a number"}, status=400)
        host = self.host
        return kit.json_response(
            {
                "samples": [list(x) for x in host.samples if x[0] > since],
                "events": [e for e in host.events if e["t"] > since],
            }
        )

    async def console(self, request: kit.Request) -> kit.Response:
        from rubberband.tools.console import HEADERS, PAGE

        return kit.text_response(PAGE, "text/html", HEADERS)

    def routes(self, server: kit.HttpServer) -> None:
        server.add_get("/status", self.status)
        server.add_get("/history", self.history)
        server.add_post("/reconfigure", self.reconfigure)
        server.add_get("/console", self.console)


def main_for(kind: str, argv: list[str] | None = None) -> int:
    settings = STORAGE_SETTINGS if kind == "storage" else SUPER_SETTINGS
    prog = f"rubberband {kind}"

    def main() -> int:
        ap = kit.build_parser(prog, (__doc__ or "").split("\n\n")[0], settings)
        args = kit.load_settings(ap, settings, argv)
        for required in ("name", "routers"):
            if not getattr(args, required):
                raise UsageError(f"--{required} is required (a flag or a key of --file)")
        if args.unique_name:
            args.name = f"{args.name}-{os.urandom(4).hex()}"
        if kind == "storage":
            check_engine(args.engine, args.engine_arg)
            plant_mutations(args.mutation)
        else:
            check_super_settings(args)
        kit.setup_logging(args.log_level)
        log.info("event=start %s", kit.effective(args, settings))
        runner = run_storage if kind == "storage" else run_super
        # uvloop, and a collector that does not walk the data
        ecast.tune_process(keeps_data=kind == "storage")
        try:
            return asyncio.run(runner(args))
        except (ecast.Error, OSError) as e:
            raise UsageError(str(e)) from None

    return kit.run_main(main, prog)


def storage_main(argv: list[str] | None = None) -> int:
    return main_for("storage", argv)


def super_main(argv: list[str] | None = None) -> int:
    return main_for("super", argv)
