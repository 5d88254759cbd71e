"""The router daemon: one E-Cast router as a service.

    ecast router --id r1 --listen 127.0.0.1:7001 --metrics 127.0.0.1:9101
    ecast router --id r2 --listen 127.0.0.1:7002 --join 127.0.0.1:7001

The first router bootstraps a group of one; later ones join a running group through any
member.  SIGTERM parts the router gracefully (its part is agreed on, then it leaves;
the group's last member, every message stable, just stops);
SIGKILL is survived by the rest of the group.  A router the group removed (it was paused
or cut off past the failure timeout) exits, or with ``--rejoin`` joins again under a
fresh id (``r2.1``, ``r2.2``, ...), since ids are unique for ever.  ``/metrics``
(Prometheus text) and ``/health`` (JSON; 503 when degraded) are served over HTTP on a
separate port.  Logs are one ``key=value`` line per event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import logging
import os
import signal
import ssl
import sys
import time
from typing import Any

from ecast.core import mutations as planted_bugs
from ecast.core.config import config_class, config_path
from ecast.core.roles import ROUTER
from ecast.core.router import Router, RouterParams
from ecast.core.ufabcast import UfabParams
from ecast.runtime import Node, Runtime, read_secret, tune_process
from ecast.runtime.handshake import Auth
from ecast.runtime.process import DEVELOPMENT_WARNING, load_auth
from ecast.tools.daemon_kit import (
    LOG_LEVELS,
    Metrics,
    Setting,
    UsageError,
    address,
    build_parser,
    check_port_free,
    effective,
    load_settings,
    positive,
    run_main,
    secret_file_problem,
    serve_http,
    setup_logging,
)

log = logging.getLogger("ecast.daemon")


def origin_problem(value: str) -> str | None:
    # Below 2**53: positions stay exact as JavaScript numbers (the web console) and far
    # below the 2**62 that stands for "after every position".
    if value == "clock" or (value.isascii() and value.isdigit() and int(value) < 2**53):
        return None
    return f"{value!r} is neither 'clock' nor an integer from 0 to below 2**53"


SETTINGS: tuple[Setting, ...] = (
    Setting("id", str, None, "router id, unique for ever (a restart takes a new one); required"),
    Setting("listen", str, None, "HOST:PORT for routers and clients; required", check=address),
    Setting(
        "join", str, None, "HOST:PORT of any running router (omit to bootstrap)", check=address
    ),
    Setting(
        "config",
        str,
        "ecast:BroadcastConfig",
        "the Config class, package.module:Class; only the bootstrapping router's counts "
        "(joiners install the group's)",
    ),
    Setting("config-arg", str, [], "KEY=VALUE for the config's initial(); repeatable", repeat=True),
    Setting(
        "origin",
        str,
        "clock",
        "the position of the first message of a group this router bootstraps: 'clock' "
        "(microseconds since 1970: above every position an earlier group gave, so a "
        "position never names two messages across restarts of the whole group) or an "
        "integer",
        check=origin_problem,
    ),
    Setting("metrics", str, None, "HOST:PORT for /metrics and /health", check=address),
    Setting(
        "credentials",
        str,
        None,
        "this router's credential file (ecast credentials issue --role router); else "
        "$ECAST_CREDENTIALS",
    ),
    Setting("revoked", str, None, "file of revoked credential serials, one per line"),
    Setting(
        "secret-file",
        str,
        None,
        "DEVELOPMENT MODE: file with one cluster secret shared by every process (else "
        "$ECAST_SECRET); any holder may act as a router",
    ),
    Setting("tls-cert", str, None, "certificate (PEM) to speak TLS with"),
    Setting("tls-key", str, None, "its private key (PEM)"),
    Setting(
        "tls-ca",
        str,
        None,
        "CA bundle (PEM) to verify peers with; every peer must then present a certificate",
    ),
    Setting(
        "tls-check-hostname",
        bool,
        True,
        "check that a router's TLS certificate names the host it was dialed at",
    ),
    Setting(
        "max-connections",
        int,
        4096,
        "connections kept at most, open or opening",
        "connections",
        check=positive,
    ),
    Setting(
        "max-handshakes",
        int,
        128,
        "connections at most that have not proven themselves yet",
        "connections",
        check=positive,
    ),
    Setting(
        "max-handshakes-per-source",
        int,
        16,
        "connections at most from one address that have not proven themselves yet",
        "connections",
        check=positive,
    ),
    Setting(
        "max-names-per-credential",
        int,
        4096,
        "nodes announced at most under one credential, over all its connections",
        "nodes",
        check=positive,
    ),
    Setting("heartbeat", float, 0.25, "router heartbeat period", "s", check=positive),
    Setting(
        "failure-timeout",
        float,
        1.0,
        "a router silent this long is removed from the group",
        "s",
        check=positive,
    ),
    Setting(
        "client-lease",
        float,
        5.0,
        "an application process silent this long is suspected (leases)",
        "s",
        check=positive,
    ),
    Setting(
        "max-client-lease",
        float,
        60.0,
        "the longest lease a process may ask for at connect time",
        "s",
        check=positive,
    ),
    Setting("clumping", bool, True, "clump commands into Paxos instances (3.5.7)"),
    Setting("delayed-acks", bool, True, "piggyback stable notices on route proposals (3.5.7)"),
    Setting("max-batch", int, 4096, "commands per Paxos instance", "commands", check=positive),
    Setting(
        "pipeline-depth",
        int,
        2,
        "uncommitted instances before clumping waits (0: fixed clumping)",
        "instances",
    ),
    Setting(
        "congestion-threshold",
        int,
        1024,
        "unstable messages before senders above their fair share are told to slow down",
        "messages",
        check=positive,
    ),
    Setting(
        "unsafe-lag-limit",
        int,
        4096,
        "unsafe copies to a destination this many messages behind are shed, and their"
        " senders told (0: shed whenever anything to it is outstanding)",
        "messages",
        check=lambda v: None if v >= 0 else "must be 0 or more",
    ),
    Setting(
        "ack-cache",
        int,
        1024,
        "acks kept per session for late duplicates; at least the clients' max window",
        "acks",
        check=positive,
    ),
    Setting(
        "max-frame",
        int,
        16 * 1024 * 1024,
        "largest packet a peer may send",
        "bytes",
        check=lambda v: None if v >= 64 * 1024 else "must be at least 65536",
    ),
    Setting(
        "handshake-timeout",
        float,
        5.0,
        "time a new connection has to prove itself",
        "s",
        check=positive,
    ),
    Setting("join-timeout", float, 30.0, "give up joining after this long", "s", check=positive),
    Setting(
        "leave-timeout",
        float,
        5.0,
        "time a SIGTERM waits for the part to be agreed",
        "s",
        check=positive,
    ),
    Setting(
        "health-unstable-age",
        float,
        5.0,
        "/health says degraded when a message has been unstable this long",
        "s",
        check=positive,
    ),
    Setting(
        "rejoin", bool, False, "when the group removes this router, join again under a fresh id"
    ),
    Setting(
        "follower-sched",
        str,
        "batch",
        "CPU policy while following: batch (Linux SCHED_BATCH) keeps a follower woken by a "
        "message from preempting the leader on a shared machine",
        choices=("batch", "normal"),
    ),
    Setting("log-level", str, "info", "log level", choices=LOG_LEVELS),
    Setting(
        "mutation",
        str,
        [],
        "plant a known bug (tests only; refused unless ECAST_TEST_MUTATIONS=1)",
        repeat=True,
    ),
)


def tls_contexts(args: argparse.Namespace) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """Mutual TLS: the server asks every peer for a certificate the CA bundle signed (with
    ``--tls-ca``), and dialing routers check the peer's host name unless told not to."""
    if not args.tls_cert:
        if args.tls_key or args.tls_ca:
            raise UsageError("--tls-key and --tls-ca need --tls-cert")
        return None, None
    try:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=args.tls_ca)
        server.load_cert_chain(args.tls_cert, args.tls_key)
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=args.tls_ca)
        client.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as e:
        raise UsageError(f"--tls-cert/--tls-key/--tls-ca: {e}") from None
    if args.tls_ca:
        server.verify_mode = ssl.CERT_REQUIRED
    else:
        log.warning(
            "event=tls_without_ca warning=%r",
            "no --tls-ca: peers' TLS certificates are not asked for",
        )
    client.check_hostname = args.tls_check_hostname
    return server, client


def load_router_auth(args: argparse.Namespace) -> Auth:
    """The router's credential (or the development secret), or a one-line usage error."""
    from ecast.security.credentials import CredentialError

    if args.credentials and args.secret_file:
        raise UsageError("--credentials and --secret-file exclude each other (pick one mode)")
    if args.revoked and not (args.credentials or os.environ.get("ECAST_CREDENTIALS")):
        raise UsageError("--revoked needs --credentials")
    if args.secret_file:
        problem = secret_file_problem(args.secret_file)
        if problem:
            raise UsageError(f"--secret-file {problem}")
    try:
        secret = read_secret(args.secret_file) if args.secret_file else None
        if secret is None and not args.credentials and not os.environ.get("ECAST_CREDENTIALS"):
            secret = read_secret(None)
        auth = load_auth(args.credentials, secret, args.revoked)
    except SystemExit as e:
        raise UsageError(
            f"{e}; or give this router a credential with --credentials "
            "(ecast credentials issue --role router)"
        ) from None
    except (CredentialError, ValueError) as e:
        raise UsageError(f"--credentials: {e}" if args.credentials else str(e)) from None
    except OSError as e:
        raise UsageError(f"--secret-file {args.secret_file}: {e.strerror or e}") from None
    identity = auth.identity
    if identity.serial:
        if identity.role != ROUTER:
            raise UsageError(
                f"--credentials: a {identity.role} credential; a router needs a router one"
            )
        if not identity.covers(args.id):
            raise UsageError(
                f"--credentials covers {', '.join(identity.names)}, not --id {args.id}"
            )
        if args.rejoin and not identity.covers(f"{args.id}.1"):
            raise UsageError(
                f"--rejoin takes ids {args.id}.1, {args.id}.2, ...: the credential must "
                f"cover {args.id}.* too (ecast credentials issue --name {args.id} "
                f"--name '{args.id}.*')"
            )
    else:
        print(f"ecast router: WARNING: {DEVELOPMENT_WARNING}", file=sys.stderr, flush=True)
    return auth


def config_args(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs for ``Config.initial``; values are JSON when they parse as JSON."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--config-arg wants KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def load_initial_config(path: str, pairs: list[str]) -> Any:
    """The bootstrap config, or a one-line error that says what is wrong with it."""
    try:
        cls = config_class(path)
    except ImportError as e:
        raise UsageError(
            f"--config {path}: cannot import {e.name or path.partition(':')[0]} (the module "
            "must be installed, or its directory on PYTHONPATH)"
        ) from None
    except ValueError as e:
        raise UsageError(f"--config {path}: {e}") from None
    kwargs = config_args(pairs)
    params = inspect.signature(cls.initial).parameters  # type: ignore[attr-defined]
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        takes = [n for n, p in params.items() if p.kind is not p.VAR_POSITIONAL]
        for key in kwargs:
            if key not in takes:
                raise UsageError(
                    f"--config-arg {key}=...: {cls.__name__} takes no setting {key!r} "
                    f"(it takes: {', '.join(takes) or 'none'})"
                )
    try:
        return cls.initial(**kwargs)  # type: ignore[attr-defined]
    except (TypeError, ValueError) as e:
        raise UsageError(f"--config-arg: {cls.__name__} refused its settings: {e}") from None


class JoinRefused(Exception):
    """The group will not take this router (its id is retired, or its secret is wrong)."""


class RouterDaemon:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.time()
        self.loop_lag_max = 0.0
        """Longest the event loop stayed away from a 100 ms sleep, beyond it (seconds)."""
        self._policy = "normal"
        self.runtime: Runtime | None = None
        self.router: Router | None = None
        self.node: Node | None = None
        self.router_id = args.id
        self.rejoins = 0
        self._stop = asyncio.Event()
        self._terminating = False

    def _params(self) -> RouterParams:
        a = self.args
        origin = time.time_ns() // 1000 if a.origin == "clock" else int(a.origin)
        ufab = UfabParams(
            heartbeat_interval=a.heartbeat,
            failure_timeout=a.failure_timeout,
            clump_trigger=3 if a.clumping else 1,
            clump_delay=0.010 if a.clumping else 0.0,
            max_batch=a.max_batch,
            pipeline_depth=a.pipeline_depth,
        )
        return RouterParams(
            ufab=ufab,
            delayed_acks=a.delayed_acks,
            congestion_threshold=a.congestion_threshold,
            unsafe_lag_limit=a.unsafe_lag_limit,
            ack_cache=max(a.ack_cache, a.congestion_threshold),
            client_lease=a.client_lease,
            max_client_lease=max(a.max_client_lease, a.client_lease),
            max_message=a.max_frame - 64 * 1024,
            origin=origin,
        )

    async def run(self) -> int:
        a = self.args
        config = load_initial_config(a.config, a.config_arg)
        server_ssl, client_ssl = tls_contexts(a)
        auth = load_router_auth(a)
        rt = Runtime(
            auth,
            host_id=a.id,
            server_ssl=server_ssl,
            client_ssl=client_ssl,
            max_frame=a.max_frame,
            handshake_timeout=a.handshake_timeout,
            max_connections=a.max_connections,
            max_handshakes=a.max_handshakes,
            max_nodes_per_credential=a.max_names_per_credential,
            max_handshakes_per_source=a.max_handshakes_per_source,
        )
        self.runtime = rt
        if a.metrics:
            check_port_free(a.metrics, "--metrics")
        try:
            listen = await rt.serve(a.listen)
        except OSError as e:
            raise UsageError(f"--listen {a.listen}: {e.strerror or e}") from None
        metrics = await self._serve_metrics() if a.metrics else None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._terminate)
        log.info("event=starting router=%s %s", a.id, effective(a, SETTINGS))
        watcher = asyncio.create_task(self._watch())
        code = 0
        try:
            seeds = [a.join] if a.join else []
            while True:
                await self._start_router(config, seeds, listen)
                await self._stop.wait()
                r = self.router
                assert r is not None
                if self._terminating or not a.rejoin or not r.ufab.installed:
                    if not self._terminating and not r.ufab.installed:
                        raise JoinRefused(
                            f"the group refused router id {self.router_id}: it belonged to a "
                            "router that left, and ids are unique for ever (pick a new --id)"
                        )
                    code = 0 if self._terminating else 1
                    break
                # Removed by the group: come back under a fresh id (ids are never reused).
                seeds = self._seed_addresses()
                await self._drop_router()
                self.rejoins += 1
                self.router_id = f"{a.id}.{self.rejoins}"
                self._stop.clear()
                log.warning("event=rejoining router=%s seeds=%s", self.router_id, ",".join(seeds))
        except JoinRefused as e:
            log.error("event=join_refused router=%s reason=%r", self.router_id, str(e))
            print(f"ecast router: {e}", flush=True, file=sys.stderr)
            code = 2
        finally:
            watcher.cancel()
            if self._terminating and self.node is not None:
                await self._leave(self.node)
            if metrics is not None:
                await metrics.cleanup()
            await rt.close()
        log.info("event=stopped router=%s code=%d", self.router_id, code)
        return code

    async def _start_router(self, config: Any, seeds: list[str], listen: str) -> None:
        rt = self.runtime
        assert rt is not None
        rid = self.router_id
        checks = {"role_of": rt.role_of, "speaks_for": rt.speaks_for}
        if seeds:
            seed = await self._reach(rt, seeds)
            self.router = Router(rid, config, self._params(), seeds=[seed], **checks)
            log.info("event=joining router=%s seed=%s", rid, seed)
        else:
            self.router = Router(rid, config, self._params(), routers=[rid], **checks)
            log.info("event=bootstrap router=%s listen=%s", rid, listen)
        self.node = rt.add_node(rid, self.router, advertise=True)
        self.router.link_lag = self.node.unsafe_lag
        self.node.start()

    async def _drop_router(self) -> None:
        if self.node is not None:
            await self.node.stop()
        self.node = None

    def _seed_addresses(self) -> list[str]:
        """Where the rest of the group listens, from the gossiped directory."""
        rt, r = self.runtime, self.router
        assert rt is not None and r is not None
        view = r.ufab.view
        peers = [m for m in (view.members if view else ()) if m != self.router_id]
        found = [rt.directory[m] for m in peers if m in rt.directory]
        if self.args.join and self.args.join not in found:
            found.append(self.args.join)
        return found or list(dict.fromkeys(rt.directory.values()))

    async def _reach(self, rt: Runtime, seeds: list[str]) -> str:
        """A running router to join through; gives up after ``--join-timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.args.join_timeout
        attempt = 0
        last = ""
        while True:
            for address_ in seeds:
                try:
                    return await rt.connect_node(address_, min(5.0, self.args.join_timeout))
                except (TimeoutError, OSError, ConnectionError) as e:
                    last = f"{address_}: {e}"
                    if "wrong secret" in str(e):
                        raise JoinRefused(
                            f"{last}: this router's secret differs from the group's "
                            "(--secret-file or ECAST_SECRET)"
                        ) from None
                    if "authentication" in str(e) or "credential" in str(e):
                        raise JoinRefused(
                            f"{last}: the group refused this router's credential, or this "
                            "router refused the group's (--credentials)"
                        ) from None
                    log.warning(
                        "event=join_retry address=%s attempt=%d reason=%r",
                        address_,
                        attempt,
                        str(e),
                    )
            attempt += 1
            if loop.time() >= deadline:
                raise JoinRefused(
                    f"no router reachable to join within {self.args.join_timeout:g} s ({last})"
                )
            await asyncio.sleep(0.5)

    def _terminate(self) -> None:
        self._terminating = True
        self._stop.set()

    async def _watch(self) -> None:
        """Log view changes, and stop when the group parts this router."""
        seen = None
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.1)
            lag = loop.time() - before - 0.1
            self.loop_lag_max = max(self.loop_lag_max, lag)
            if lag > 0.25:
                # The event loop did not come back for this long: heartbeats were late too.
                log.warning("event=loop_lag router=%s seconds=%.3f", self.router_id, lag)
            r = self.router
            if r is None or self._stop.is_set():
                continue
            self._schedule_policy(r.leading())
            view = r.ufab.view
            if view is not None and view != seen:
                seen = view
                log.info(
                    "event=view router=%s view=%d members=%s leader=%s",
                    self.router_id,
                    view.number,
                    ",".join(view.members),
                    view.members[0],
                )
            if r.ufab.finished or (r.stopped and not r.ufab.retiring):
                log.warning("event=parted router=%s reason=%s", self.router_id, r.ufab.stop_reason)
                self._stop.set()

    def _schedule_policy(self, leading: bool) -> None:
        """The leader's work is on every message's path; a follower's is not.

        When routers share CPUs (with each other or with applications), a follower that a
        message wakes would otherwise preempt the leader in the middle of its turn, and
        every message waits for it.  SCHED_BATCH makes the kernel treat the follower as
        CPU-bound and not favour it on wake-up; its share of the CPU is unchanged.
        """
        policy = "batch" if not leading and self.args.follower_sched == "batch" else "normal"
        if policy == self._policy or not hasattr(os, "sched_setscheduler"):
            return
        self._policy = policy
        which = os.SCHED_BATCH if policy == "batch" else os.SCHED_OTHER
        try:
            os.sched_setscheduler(0, which, os.sched_param(0))
        except OSError as e:
            log.warning("event=sched_policy router=%s error=%r", self.router_id, str(e))
        else:
            log.info("event=sched_policy router=%s policy=%s", self.router_id, policy)

    async def _leave(self, node: Node) -> None:
        r = self.router
        if r is None or r.stopped:
            return
        log.info("event=leaving router=%s", self.router_id)
        node.feed(lambda core, now: core.leave(now))
        deadline = time.monotonic() + self.args.leave_timeout
        while time.monotonic() < deadline:
            if r.ufab.finished or self._last_and_idle(r):
                break
            await asyncio.sleep(0.05)

    def _last_and_idle(self, r: Router) -> bool:
        """The group's last member with every message stable: its part would change
        nothing (it is never executed), and nothing is owed to anyone, so it need not
        wait out ``--leave-timeout`` (a whole cluster stopped together waited 5 s for
        its last router)."""
        view = r.ufab.view
        return view is not None and view.members == (r.ufab.me,) and r.unstable() == 0

    # ------------------------------------------------------------------ observability
    def _config_info(self) -> dict[str, Any]:
        """The group's config as this router has it (a joiner installed the group's: its
        own --config flags do not count), with the settings it was bootstrapped with."""
        r = self.router
        assert r is not None
        cfg = r.state.mseq.configs[-1]
        info: dict[str, Any] = {"class": config_path(cfg)}
        settings = getattr(cfg, "settings", None)
        if callable(settings):
            with contextlib.suppress(Exception):
                info["settings"] = settings()
        return info

    def health(self) -> dict[str, Any]:
        r = self.router
        if r is None:
            return {"status": "starting", "router": self.router_id}
        u = r.ufab
        view = u.view
        now = asyncio.get_running_loop().time()
        out: dict[str, Any] = {
            "status": "ok",
            "router": self.router_id,
            "view": view.number if view else None,
            "members": list(view.members) if view else [],
            "leader": None,
            "leading": r.leading(),
            "paxos_leader": u.is_leader(),
            "unstable": r.unstable(),
            "oldest_unstable_s": round(r.oldest_unstable_age(now), 3),
            "executed": u.executed,
            "uptime_s": round(time.time() - self.started, 1),
        }
        if not u.installed:
            out["status"] = "joining"
            return out
        out["config"] = self._config_info()
        if u.stopped:
            out["status"] = "stopped"
            return out
        assert view is not None
        suspected = u.detector.suspected
        reachable = [m for m in view.members if m == self.router_id or m not in suspected]
        out["reachable"] = reachable
        leader = view.members[0]
        out["leader"] = leader if leader in reachable else None
        if len(reachable) < view.majority:
            out["status"] = "no-quorum"
            out["reason"] = (
                f"{len(reachable)} of {len(view.members)} routers reachable; {view.majority} needed"
            )
        elif out["oldest_unstable_s"] > self.args.health_unstable_age:
            out["status"] = "degraded"
            waiting = r.waiting_for()
            out["waiting_for"] = waiting[:20]
            out["reason"] = f"a message has been unstable for {out['oldest_unstable_s']:.1f} s" + (
                f", waiting for {', '.join(waiting[:5])}" if waiting else ""
            )
        return out

    def metrics(self) -> str:
        r = self.router
        rt = self.runtime
        m = Metrics()
        if r is not None:
            u = r.ufab
            stats = r.stats
            now = asyncio.get_running_loop().time()
            for key, name, help_ in (
                ("routed", "ecast_messages_routed_total", "Messages this router proposed"),
                ("learned", "ecast_messages_learned_total", "Messages appended to the m-seq"),
                ("delivered", "ecast_deliveries_total", "Message copies forwarded as leader"),
                ("stable", "ecast_stable_total", "Messages learned stable"),
                ("congestion_notices", "ecast_congestion_notices_total", "Congestion notices"),
                ("unsafe_sent", "ecast_unsafe_sent_total", "Unsafe copies forwarded"),
                (
                    "unsafe_dropped",
                    "ecast_unsafe_shed_total",
                    "Unsafe copies shed (a lagging destination, or not leading)",
                ),
                ("leases_expired", "ecast_leases_expired_total", "Leases that ran out"),
                (
                    "suspects_issued",
                    "ecast_suspects_issued_total",
                    "Suspects this router submitted",
                ),
                ("config_errors", "ecast_config_errors_total", "Exceptions the config raised"),
                (
                    "forbidden_sessions",
                    "ecast_forbidden_sessions_total",
                    "Submissions and closes refused: the sender's credential does not cover "
                    "the session's namespace",
                ),
            ):
                m.add(name, stats[key], help_, "counter")
            m.add("ecast_unstable_messages", r.unstable(), "Learned messages not yet stable")
            m.add(
                "ecast_oldest_unstable_seconds",
                round(r.oldest_unstable_age(now), 3),
                "Age of the oldest unstable message",
            )
            m.add(
                "ecast_application_processes",
                r.connected_apps(now),
                "Application processes heard from within their lease",
            )
            m.add("ecast_paxos_active_instances", u.in_flight(), "Proposed, not known chosen")
            m.add("ecast_paxos_executed_instance", u.executed, "Highest executed instance")
            m.add("ecast_view", u.view.number if u.view else -1, "Router view number")
            m.add(
                "ecast_loop_lag_max_seconds",
                round(self.loop_lag_max, 4),
                "Longest event-loop stall seen (heartbeats are late by as much)",
            )
            m.add("ecast_leader", 1 if r.leading() else 0, "1 if this router leads")
            m.add("ecast_rejoins_total", self.rejoins, "Times this daemon rejoined", "counter")
            if u.view:
                m.add(
                    "ecast_leader_info",
                    1,
                    "The leader of this router's view (the first of its succession order)",
                    leader=u.view.members[0],
                )
            m.add("ecast_view_members", len(u.view.members) if u.view else 0, "Routers in view")
            m.histogram(
                "ecast_commit_seconds",
                u.proposer.commit_seconds,
                "This router's route batches, from proposal to their place in the order",
            )
            m.histogram(
                "ecast_stable_seconds",
                r.stable_seconds,
                "Route batches, from learned to stable (every destination acknowledged)",
            )
            if r.guard.errors:
                log.warning(
                    "event=config_error router=%s last=%r", self.router_id, r.guard.last_error
                )
        if rt is not None:
            for key, value in rt.stats.items():
                m.add(f"ecast_transport_{key}_total", value, f"Transport counter {key}", "counter")
            for node in rt.nodes.values():
                for key, value in node.stats.items():
                    m.add(f"ecast_link_{key}_total", value, f"Link counter {key}", "counter")
                for key, value in node.link.stats.items():
                    m.add(f"ecast_link_{key}_total", value, f"Link counter {key}", "counter")
                m.add(
                    "ecast_link_reorder_bytes",
                    node.link.reorder_bytes,
                    "Bytes of frames held ahead of a gap, over every channel",
                )
                # Every peer the link holds buffers for, connected or not: a peer whose
                # connection dropped is the one whose queue grows.
                peers = sorted(set(node.link.peers()) | set(rt.routes))
                m.per_label(
                    "ecast_peer_unacked_frames",
                    {p: node.link.unacked(p) for p in peers},
                    "Frames sent to a peer and not acknowledged",
                    "peer",
                )
                m.per_label(
                    "ecast_peer_unacked_messages",
                    {p: node.link.unacked_messages(p) for p in peers},
                    "Messages sent to a peer and not acknowledged",
                    "peer",
                )
            sizes = {}
            for conn in rt.conns.values():
                t = conn.transport
                if conn.peer is not None:
                    sizes[conn.peer.host] = t.get_write_buffer_size() if t is not None else 0
            m.per_label(
                "ecast_peer_write_buffer_bytes", sizes, "Bytes queued for a process", "peer"
            )
        return m.text()

    async def _serve_metrics(self) -> Any:
        return await serve_http(
            self.args.metrics,
            self.metrics,
            self.health,
            lambda h: h["status"] in ("ok", "joining", "starting"),
        )


def plant_router_mutations(names: list[str]) -> None:
    """``--mutation``: bugs a router consults (ufabcast's, the router's, its config's)."""
    if not names:
        return
    if not planted_bugs.allowed():
        raise UsageError(f"--mutation plants bugs for tests; set {planted_bugs.ENV}=1 to allow it")
    mine = {n for layer in ("ufabcast", "router", "config") for n in planted_bugs.known(layer)}
    unknown = set(names) - mine
    if unknown:
        raise UsageError(
            f"--mutation {', '.join(sorted(unknown))}: unknown (known: {', '.join(sorted(mine))})"
        )
    planted_bugs.plant(names)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser("ecast router", __doc__.split("\n")[0], SETTINGS)

    def go() -> int:
        args = load_settings(ap, SETTINGS, argv)
        for name in ("id", "listen"):
            if not getattr(args, name):
                raise UsageError(f"--{name} is required (on the command line or in --file)")
        if args.id.startswith("@"):
            raise UsageError(f"--id {args.id}: ids starting with @ are reserved")
        load_initial_config(args.config, args.config_arg)  # fail before any I/O (and
        # import the config's module, which declares the bugs it may plant)
        plant_router_mutations(args.mutation)
        setup_logging(args.log_level)
        tune_process()
        return asyncio.run(RouterDaemon(args).run())

    return run_main(go, "ecast router")
