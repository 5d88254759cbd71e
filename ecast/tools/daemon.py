"""The router daemon: one E-Cast router as a service.

    ecast router --id r1 --listen 127.0.0.1:7001 --metrics 127.0.0.1:9101
    ecast router --id r2 --listen 127.0.0.1:7002 --join 127.0.0.1:7001

The first router bootstraps a group of one; later ones join a running group through any
member.  SIGTERM parts the router gracefully (its part is agreed on, then it leaves);
SIGKILL is survived by the rest of the group.  ``/metrics`` (Prometheus text) and
``/health`` (JSON) are served over HTTP on a separate port.  Logs are one ``key=value``
line per event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import ssl
import sys
import time
import tomllib
from typing import Any

from ecast.core.config import load_config
from ecast.core.router import Router, RouterParams
from ecast.core.ufabcast import UfabParams
from ecast.runtime import Runtime, read_secret, tune_process

log = logging.getLogger("ecast.tools.daemon")


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... event=...``: one line per event, easy to grep and parse."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} {record.getMessage()}"
        )
        if record.exc_info:
            line += " traceback=" + json.dumps(self.formatException(record.exc_info))
        return line


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def tls_contexts(args: argparse.Namespace) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    if not args.tls_cert:
        return None, None
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=args.tls_ca)
    server.load_cert_chain(args.tls_cert, args.tls_key)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=args.tls_ca)
    client.load_cert_chain(args.tls_cert, args.tls_key)
    client.check_hostname = False  # peers are authenticated by the cluster secret
    return server, client


def config_args(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs for ``Config.initial``; values are JSON when they parse as JSON."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--config-arg wants KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


class RouterDaemon:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.time()
        self.loop_lag_max = 0.0
        """Longest the event loop stayed away from a 100 ms sleep, beyond it (seconds)."""
        self._policy = "normal"
        self.runtime: Runtime | None = None
        self.router: Router | None = None
        self._stop = asyncio.Event()

    def _params(self) -> RouterParams:
        a = self.args
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
            ack_cache=max(a.ack_cache, a.congestion_threshold),
        )

    async def run(self) -> int:
        a = self.args
        server_ssl, client_ssl = tls_contexts(a)
        rt = Runtime(
            read_secret(a.secret_file),
            host_id=a.id,
            server_ssl=server_ssl,
            client_ssl=client_ssl,
            max_frame=a.max_frame,
            handshake_timeout=a.handshake_timeout,
        )
        self.runtime = rt
        config = load_config(a.config, **config_args(a.config_arg))
        listen = await rt.serve(a.listen)
        if a.join:
            seed = await self._reach(rt, a.join)
            self.router = Router(a.id, config, self._params(), seeds=[seed])
            log.info("event=joining router=%s seed=%s address=%s", a.id, seed, a.join)
        else:
            self.router = Router(a.id, config, self._params(), routers=[a.id])
            log.info("event=bootstrap router=%s listen=%s", a.id, listen)
        node = rt.add_node(a.id, self.router, advertise=True)
        self.router.link_lag = node.lag
        node.start()
        metrics = await self._serve_metrics() if a.metrics else None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        watcher = asyncio.create_task(self._watch())
        await self._stop.wait()
        watcher.cancel()
        await self._leave(node)
        if metrics is not None:
            await metrics.cleanup()
        await rt.close()
        log.info("event=stopped router=%s", a.id)
        return 0

    async def _reach(self, rt: Runtime, address: str) -> str:
        for attempt in range(60):
            try:
                return await rt.connect_node(address)
            except (TimeoutError, OSError, ConnectionError) as e:
                log.warning(
                    "event=join_retry address=%s attempt=%d reason=%r", address, attempt, str(e)
                )
                await asyncio.sleep(0.5)
        raise SystemExit(f"cannot reach {address} to join")

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
                log.warning("event=loop_lag router=%s seconds=%.3f", self.args.id, lag)
            r = self.router
            if r is None:
                continue
            self._schedule_policy(r.leading())
            view = r.ufab.view
            if view is not None and view != seen:
                seen = view
                log.info(
                    "event=view router=%s view=%d members=%s leader=%s",
                    self.args.id,
                    view.number,
                    ",".join(view.members),
                    view.members[0],
                )
            if r.ufab.finished or (r.stopped and not r.ufab.retiring):
                log.warning("event=parted router=%s reason=%s", self.args.id, r.ufab.stop_reason)
                self._stop.set()
                return

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
            log.warning("event=sched_policy router=%s error=%r", self.args.id, str(e))
        else:
            log.info("event=sched_policy router=%s policy=%s", self.args.id, policy)

    async def _leave(self, node: Any) -> None:
        r = self.router
        if r is None or r.stopped:
            return
        log.info("event=leaving router=%s", self.args.id)
        node.feed(lambda core, now: core.leave(now))
        deadline = time.monotonic() + self.args.leave_timeout
        while time.monotonic() < deadline:
            if r.ufab.finished:
                break
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ observability
    def health(self) -> dict[str, Any]:
        r = self.router
        if r is None:
            return {"status": "starting"}
        u = r.ufab
        view = u.view
        status = (
            "ok" if u.installed and not u.stopped else ("joining" if not u.installed else "stopped")
        )
        return {
            "status": status,
            "router": self.args.id,
            "view": view.number if view else None,
            "members": list(view.members) if view else [],
            "leader": view.members[0] if view else None,
            "leading": r.leading(),
            "paxos_leader": u.is_leader(),
            "unstable": r.unstable(),
            "executed": u.executed,
            "uptime_s": round(time.time() - self.started, 1),
        }

    def metrics(self) -> str:
        r = self.router
        rt = self.runtime
        lines: list[str] = []

        def metric(name: str, value: float, help_: str, kind: str = "gauge", **labels: Any) -> None:
            if not any(x.startswith(f"# HELP {name} ") for x in lines):
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
            lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")

        if r is not None:
            u = r.ufab
            metric(
                "ecast_messages_routed_total",
                r.stats["routed"],
                "Messages this router proposed",
                "counter",
            )
            metric(
                "ecast_messages_learned_total",
                r.stats["learned"],
                "Messages appended to the m-seq",
                "counter",
            )
            metric(
                "ecast_deliveries_total",
                r.stats["delivered"],
                "Message copies forwarded as leader",
                "counter",
            )
            metric("ecast_stable_total", r.stats["stable"], "Messages learned stable", "counter")
            metric("ecast_unstable_messages", r.unstable(), "Learned messages not yet stable")
            metric(
                "ecast_congestion_notices_total",
                r.stats["congestion_notices"],
                "Congestion notices sent",
                "counter",
            )
            metric(
                "ecast_unsafe_sent_total",
                r.stats["unsafe_sent"],
                "Unsafe copies forwarded",
                "counter",
            )
            metric(
                "ecast_paxos_active_instances",
                u.in_flight(),
                "Proposed instances not yet known chosen",
            )
            metric(
                "ecast_paxos_executed_instance", u.executed, "Highest executed ufabcast instance"
            )
            metric("ecast_view", u.view.number if u.view else -1, "Router view number")
            metric(
                "ecast_loop_lag_max_seconds",
                round(self.loop_lag_max, 4),
                "Longest event-loop stall seen (heartbeats are late by as much)",
            )
            metric("ecast_leader", 1 if r.leading() else 0, "1 if this router leads")
            if u.view:
                metric(
                    "ecast_leader_info",
                    1,
                    "The leader of this router's view (the first of its succession order)",
                    leader=u.view.members[0],
                )
            metric(
                "ecast_view_members", len(u.view.members) if u.view else 0, "Routers in the view"
            )
        if rt is not None:
            for key, value in rt.stats.items():
                metric(f"ecast_transport_{key}_total", value, f"Transport counter {key}", "counter")
            for node in rt.nodes.values():
                for key, value in node.stats.items():
                    metric(f"ecast_link_{key}_total", value, f"Link counter {key}", "counter")
                # Every peer the link holds buffers for, connected or not: a peer whose
                # connection dropped is the one whose queue grows.
                peers = sorted(set(node.link.peers()) | set(rt.routes))
                for peer in peers:  # each family's samples together, as Prometheus wants
                    metric(
                        "ecast_peer_unacked_frames",
                        node.link.unacked(peer),
                        "Frames sent to a peer and not acknowledged",
                        peer=peer,
                    )
                for peer in peers:
                    metric(
                        "ecast_peer_unacked_messages",
                        node.link.unacked_messages(peer),
                        "Messages sent to a peer and not acknowledged",
                        peer=peer,
                    )
            for host, conn in rt.conns.items():
                t = conn.transport
                size = t.get_write_buffer_size() if t is not None else 0
                metric(
                    "ecast_peer_write_buffer_bytes", size, "Bytes queued for a process", peer=host
                )
        return "\n".join(lines) + "\n"

    async def _serve_metrics(self) -> Any:
        from aiohttp import web

        async def metrics(_req: web.Request) -> web.Response:
            return web.Response(text=self.metrics(), content_type="text/plain")

        async def health(_req: web.Request) -> web.Response:
            h = self.health()
            return web.json_response(h, status=200 if h["status"] in ("ok", "joining") else 503)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, _, port = self.args.metrics.rpartition(":")
        await web.TCPSite(runner, host, int(port)).start()
        log.info("event=metrics_listening address=%s", self.args.metrics)
        return runner


def router_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--id",
        help="router id, unique for ever (a restart takes a new one); required here or in --file",
    )
    ap.add_argument(
        "--listen", help="HOST:PORT for routers and clients; required here or in --file"
    )
    ap.add_argument("--join", help="HOST:PORT of any running router (omit to bootstrap)")
    ap.add_argument(
        "--config", default="ecast.core.config:BroadcastConfig", help="package.module:Class"
    )
    ap.add_argument(
        "--config-arg", action="append", default=[], help="KEY=VALUE for Config.initial"
    )
    ap.add_argument("--metrics", help="HOST:PORT for /metrics and /health")
    ap.add_argument("--secret-file", help="file with the cluster secret (else $ECAST_SECRET)")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--tls-ca")
    ap.add_argument("--heartbeat", type=float, default=0.25)
    ap.add_argument("--failure-timeout", type=float, default=1.0)
    ap.add_argument("--clumping", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--delayed-acks", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--max-batch", type=int, default=4096, help="commands per Paxos instance")
    ap.add_argument(
        "--pipeline-depth",
        type=int,
        default=2,
        help="uncommitted instances before clumping waits (0: fixed clumping)",
    )
    ap.add_argument(
        "--congestion-threshold",
        type=int,
        default=1024,
        help="unstable messages before senders above their fair share are told to slow down",
    )
    ap.add_argument(
        "--ack-cache",
        type=int,
        default=1024,
        help="acks kept per session for late duplicates; at least the clients' max window",
    )
    ap.add_argument("--max-frame", type=int, default=16 * 1024 * 1024, help="bytes")
    ap.add_argument("--handshake-timeout", type=float, default=5.0, help="seconds")
    ap.add_argument("--leave-timeout", type=float, default=5.0)
    ap.add_argument(
        "--follower-sched",
        choices=("batch", "normal"),
        default="batch",
        help="CPU policy while following: batch (Linux SCHED_BATCH) keeps a follower woken "
        "by a message from preempting the leader on a shared machine",
    )
    ap.add_argument("--log-level", default="info")
    ap.add_argument("--file", help="TOML file with any of these settings (flags win)")


def apply_toml(args: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    """Settings from ``--file`` fill in what the command line left at its default (flags
    win); ``--id`` and ``--listen`` must come from one or the other."""
    if args.file:
        with open(args.file, "rb") as f:
            data = tomllib.load(f)
        defaults = vars(ap.parse_args([]))
        for key, value in data.items():
            name = key.replace("-", "_")
            if name not in defaults:
                raise SystemExit(f"{args.file}: unknown setting {key!r}")
            if getattr(args, name) == defaults[name]:
                setattr(args, name, value)
    for name in ("id", "listen"):
        if not getattr(args, name):
            ap.error(f"--{name} is required (on the command line or in --file)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ecast router", description=__doc__.split("\n")[0])
    router_arguments(ap)
    args = ap.parse_args(argv)
    apply_toml(args, ap)
    try:  # fail here, with a clear message, rather than with a traceback from the loop
        load_config(args.config, **config_args(args.config_arg))
    except (ImportError, AttributeError, ValueError, TypeError) as e:
        ap.error(
            f"--config {args.config}: {e} (the module must be importable: installed, or its "
            "directory on PYTHONPATH)"
        )
    setup_logging(args.log_level)
    tune_process()
    return asyncio.run(RouterDaemon(args).run())
