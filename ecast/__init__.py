"""E-Cast: dynamic, uniform, causal total order multicast (dissertation chapter 3).

The public API, for applications and for the layers built on E-Cast (Rubberband, the
storage adapters, the fault-injection suite), which import nothing else of ``ecast``:

- the client SDK: :func:`connect`, :class:`Client`, :class:`Ack`, :class:`Delivery`, and
  every exception it raises (``ecast.errors``);
- the ``Config`` toolkit: :class:`Config`, :class:`Membership`, the shipped
  :class:`BroadcastConfig` and :class:`KeyRingConfig`, and the header conventions;
- sans-IO building blocks for cores of one's own: :class:`Message`, :class:`Effects`,
  :class:`Core`, :class:`Endpoint` and its upcalls;
- tools: the deterministic :mod:`simulator <ecast.sim>`, the local process launcher, the
  daemon helpers (:mod:`ecast.tools.daemon_kit`: settings from flags or TOML, metrics,
  health, ``key=value`` logs), the benchmark harness (:mod:`bench <ecast.tools.bench>`: a
  real local cluster with recording clients and receivers, and a hook for a nemesis), and
  the multicast :mod:`history <ecast.history>` library (recorded runs and the checks of
  E-Cast's guarantees on them).

Names resolve lazily: importing ``ecast`` does not import asyncio or the runtime.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_EXPORTS: dict[str, str] = {
    # client SDK
    "connect": "ecast.sdk",
    "Client": "ecast.sdk",
    "Ack": "ecast.sdk",
    "Delivery": "ecast.core.endpoint",
    "Error": "ecast.errors",
    "InvalidName": "ecast.errors",
    "InvalidMessage": "ecast.errors",
    "MessageTooLarge": "ecast.errors",
    "Backpressure": "ecast.errors",
    "ClosedError": "ecast.errors",
    "SuspectedError": "ecast.errors",
    "NameRetiredError": "ecast.errors",
    "Unavailable": "ecast.errors",
    "AuthenticationError": "ecast.errors",
    "NotARouterError": "ecast.errors",
    "SessionClosedError": "ecast.errors",
    "ForbiddenError": "ecast.errors",
    "PartFailedError": "ecast.errors",
    # Config toolkit
    "Config": "ecast.core.config",
    "Membership": "ecast.core.config",
    "BroadcastConfig": "ecast.core.config",
    "KeyRingConfig": "ecast.core.config",
    "KIND": "ecast.core.config",
    "JOIN": "ecast.core.config",
    "PART": "ecast.core.config",
    "SUSPECT": "ecast.core.config",
    "WHO": "ecast.core.config",
    "ROUTERS": "ecast.core.config",
    "EMPTY": "ecast.core.config",
    "kind_of": "ecast.core.config",
    # sans-IO building blocks
    "Message": "ecast.core.message",
    "MsgId": "ecast.core.message",
    "Session": "ecast.core.message",
    "NodeId": "ecast.core.effects",
    "Effects": "ecast.core.effects",
    "Core": "ecast.core.effects",
    "UnexpectedMessage": "ecast.core.effects",
    "Endpoint": "ecast.core.endpoint",
    "EndpointParams": "ecast.core.endpoint",
    "Acked": "ecast.core.endpoint",
    "Terminated": "ecast.core.endpoint",
    "LeaderChanged": "ecast.core.endpoint",
    "Rejected": "ecast.core.endpoint",
    "Shed": "ecast.core.endpoint",
    "SessionsClosed": "ecast.core.proto",
    "CloseForbidden": "ecast.core.proto",
    "Direct": "ecast.core.proto",
    "Router": "ecast.core.router",
    "RouterParams": "ecast.core.router",
    "UfabParams": "ecast.core.ufabcast",
    # runtime and tools
    "Runtime": "ecast.runtime",
    "Node": "ecast.runtime",
    "tune_process": "ecast.runtime",
    "step_kept": "ecast.runtime",
    "load_auth": "ecast.runtime",
    "read_secret": "ecast.runtime",
    "private_file_problem": "ecast.security.secret",
    "register_message": "ecast.wire.codec",
    "write_private": "ecast.security.secret",
    "private_dir": "ecast.security.secret",
    "sim": "ecast.sim",
    "RouterGroupRun": "ecast.sim.group",
    "EcastGroupRun": "ecast.sim.group",
    "GroupRunConfig": "ecast.sim.group",
    "ROUTER": "ecast.core.roles",
    "APPLICATION": "ecast.core.roles",
    "local": "ecast.tools.local",
    "daemon_kit": "ecast.tools.daemon_kit",
    "history": "ecast.history",
    "bench": "ecast.tools.bench",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ecast' has no attribute {name!r}")
    if name in ("sim", "local", "daemon_kit", "history", "bench"):
        value = importlib.import_module(module)
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
