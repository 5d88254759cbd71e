"""The Rubberband daemons' settings (``rubberband storage``, ``rubberband super``),
declared once with E-Cast's daemon helpers: each is a flag and a key of the TOML file
(``--file``), checked before the daemon starts (:mod:`rubberband.tools.daemons`)."""

from __future__ import annotations

from typing import Any

from ecast import daemon_kit as kit
from rubberband.changelog import MAX_AGE, MAX_BYTES, MAX_CHANGES
from rubberband.holds import HOLD_AT

Setting = kit.Setting

ENGINES = {
    "memory": "storage_adapters.memory:MemoryEngine",
    "log": "storage_adapters.log:LogEngine",
    "null": "storage_adapters.null:NullEngine",
    "scan": "storage_adapters.scan.engine:ScanEngine",
    "scan-kv": "storage_adapters.scan.kv:ScanKVEngine",
    "scan-memory": "storage_adapters.scan.memory_kv:ScanMemoryEngine",
    "scan-log": "storage_adapters.scan.log_kv:ScanLogEngine",
    "memcached": "storage_adapters.memcached:MemcachedEngine",
}
DURABLE = ("log", "scan-log")
"""Engines that keep their data on disk (``path=``): a whole cluster restarts on them."""


def _name_check(prefix: str) -> Any:
    def check(value: str) -> str | None:
        if not value.startswith(prefix) or len(value) <= len(prefix):
            return f"the name of this process starts with {prefix}, like {prefix}1"
        return None

    return check


def _common(prefix: str) -> list[Setting]:
    return [
        Setting("name", str, None, "process name with its role prefix", check=_name_check(prefix)),
        Setting("routers", str, None, "HOST:PORT[,HOST:PORT...] of routers"),
        Setting("credentials", str, None, "this process's credential file (production)"),
        Setting("secret-file", str, None, "the development mode's cluster secret (chmod 600)"),
        Setting("listen", str, "127.0.0.1:0", "direct connections", check=kit.address),
        Setting("state-dir", str, None, "the local cluster's state directory (for tools)"),
        Setting(
            "unique-name",
            bool,
            False,
            "append a fresh random suffix to --name at every start (names are unique for "
            "ever: a restarted unit or pod joins as a new process; its credential must "
            "cover NAME-*)",
        ),
        Setting("join-timeout", float, 15.0, "give up joining after", "s", check=kit.positive),
        Setting(
            "log-level", str, "info", "log level", choices=("debug", "info", "warning", "error")
        ),
    ]


STORAGE_SETTINGS = [
    *_common("storage:"),
    Setting("engine", str, "memory", f"{', '.join(ENGINES)} or module:Class"),
    Setting(
        "engine-arg",
        str,
        [],
        "an engine option NAME=VALUE (memcached: memory_mb=1024, address=HOST:PORT or a path)",
        repeat=True,
        check=lambda v: None if "=" in v[1:] else f"{v!r} is not NAME=VALUE",
    ),
    Setting("metrics", str, None, "HOST:PORT for /metrics and /health", check=kit.address),
    Setting(
        "replace-with",
        str,
        None,
        "on SIGTERM, have this standby take over instead of contracting",
        check=_name_check("storage:"),
    ),
    Setting(
        "drain-timeout",
        float,
        300.0,
        "on SIGTERM, how long to wait to be taken off the ring",
        "s",
        check=kit.positive,
    ),
    Setting(
        "keep-data",
        bool,
        False,
        "keep what a durable engine holds from an earlier process in its directory "
        "until the first keyspace change: a restore of the whole cluster's ring keeps "
        "it (the replicas brought level first); joining a live cluster, or any other "
        "change, drops it, as does starting without this flag",
    ),
    Setting(
        "change-log",
        int,
        MAX_CHANGES,
        "changed keys kept for change feeds (0: no change log)",
        check=lambda v: None if v >= 0 else "at least 0",
    ),
    Setting(
        "change-log-bytes",
        int,
        MAX_BYTES,
        "about how many bytes of changes are kept for change feeds (estimated; a table "
        "row's change holds its images)",
        check=kit.positive,
    ),
    Setting(
        "change-log-age",
        float,
        MAX_AGE,
        "the longest a change is kept for change feeds",
        "s",
        check=kit.positive,
    ),
    Setting(
        "view-hold-at",
        float,
        HOLD_AT,
        "hold the writers back while the changes logged after where a view's maintainer "
        "reads next fill this share of the change log, until they fill half of it "
        "(0: never; the view is then compacted under and starts over)",
        check=lambda v: None if 0 <= v <= 1 else "from 0 to 1",
    ),
    Setting(
        "mutation",
        str,
        [],
        "plant a known bug (tests only; refused unless ECAST_TEST_MUTATIONS=1)",
        repeat=True,
    ),
]
SUPER_SETTINGS = [
    *_common("super:"),
    Setting(
        "admin", str, None, "HOST:PORT of the admin API, /metrics and /health", check=kit.address
    ),
    Setting("admin-token-file", str, None, "the admin API's bearer token (16+ characters)"),
    Setting("heartbeat", float, 0.5, "heartbeat interval", "s", check=kit.positive),
    Setting(
        "suspect-after", float, 3.0, "vote against a process silent for", "s", check=kit.positive
    ),
    Setting("auto-repair", bool, True, "replace or contract failed and incomplete holders"),
    Setting(
        "repair-after", float, 2.0, "repair a holder broken for at least", "s", check=kit.positive
    ),
    Setting(
        "keyspace-file",
        str,
        None,
        "record the ring here at every change; at start, a record there is restored into "
        "a new cluster whose ring is empty (the restart of a whole cluster from its disks)",
    ),
    Setting(
        "restore-wait",
        float,
        120.0,
        "restoring a recorded ring: a holder whose data no storage process claims this "
        "long after the first try is lost (its ranges restart on the others' copies, "
        "and a super repairs them)",
        "s",
        check=kit.positive,
    ),
]
