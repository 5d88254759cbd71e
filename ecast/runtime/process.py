"""Process-wide settings and identities for processes that run E-Cast nodes."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ecast.runtime.handshake import Auth

log = logging.getLogger("ecast.runtime")

DEVELOPMENT_WARNING = (
    "DEVELOPMENT MODE: authenticated by one shared cluster secret; every process that "
    "knows it may take any name and any role (router included). Use --credentials "
    "(ecast credentials issue) in production; see docs/security.md"
)


def tune_process(*, keeps_data: bool = False) -> None:
    """Settings for a process whose main work is running E-Cast nodes (daemons, workers).

    uvloop when it is installed.  And a garbage collector that runs rarely: the protocol
    allocates many short-lived tuples and small objects that do not form cycles, and with
    the default thresholds (a young collection every 700 allocations) the collector ran
    hundreds of times a second, its older collections walking every unstable message and
    Paxos log entry.  At 5,000 messages/s that took p99 latency from 15 ms to 30 ms
    (docs/benchmarks.md).  What exists at start-up (modules, classes) is frozen out of
    every collection; in a process that ``keeps_data`` (a storage process, a view
    maintainer), so is whatever survives a collection (:func:`_freeze_survivors`): no
    older collection ever walks the data it keeps, and what a storage process's steps
    on the loop make is frozen unwalked (:func:`step_kept`).  Applications that embed
    the SDK decide for themselves.
    """
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1_000)
    if keeps_data and _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)
    keep_heap()


def _freeze_survivors(phase: str, info: dict[str, int]) -> None:
    """After each collection, freeze what survived it: the next collection walks only
    what was made since, and no older generation ever fills.  A storage process or a
    view maintainer keeps millions of objects (an engine's items, a view's rows);
    every 50 young collections the collector walked all that the last 50 had kept
    (a maintainer paused 859 ms once at the views benchmark's peak, its young
    collections 30 ms each), and none of those collections found garbage.  Objects
    frozen are still freed when their last reference goes; only a cycle that outlives
    one collection is never collected, and these processes make none (a census of
    every storage process of the demo found no cyclic garbage, docs/decisions.md).
    Routers keep no such data, and a link's failure can leave cycles (an exception
    in a future) that live a while: theirs are collected as before."""
    if phase == "stop":
        gc.freeze()


T = TypeVar("T")


def step_kept(step: Callable[..., T], *args: Any) -> T:
    """Run ``step`` (a sans-IO core's step, on the event loop) so that what it makes
    is never walked by the collector, in a process tuned to keep data; elsewhere just
    run it.

    Freezing survivors still walked every object once, in the first young collection
    after it was made, and late in a long run that was most of the collector's work: a
    young collection took 1 ms early in a run and 20 ms of CPU forty seconds in, the
    same 50,000 young objects scattered over a grown heap (a storage process 15 % of
    its CPU, a view maintainer 20 %, docs/benchmarks.md).  The objects a storage
    process keeps (an engine's items, the change log's entries) are made in its steps.
    So a young collection runs just before the step, which frees the loop's cyclic
    garbage and freezes what survives, as any collection does; and the objects the step
    made are frozen after it, unwalked.  The step must make no cyclic garbage, which
    would never be freed (a storage core makes none, whatever it is sent:
    tests/unit/test_storage_random_messages.py).  Only a step on the loop: while a
    worker thread runs one, the loop makes objects too, and those must meet a
    collection first.  And only where the loop makes little that the step then drops:
    a view maintainer's step follows a feed page decoded on the loop, thousands of
    changes that the collection before the step walked where most had died unwalked,
    and its collector took a fifth to a half more CPU; maintainers do without it."""
    if _freeze_survivors not in gc.callbacks:
        return step(*args)
    gc.collect(0)
    try:
        return step(*args)
    finally:
        gc.freeze()


TRIM_THRESHOLD = 8 << 20
"""Free memory at the top of the heap that glibc keeps instead of returning it."""
MMAP_THRESHOLD = 1 << 20
"""Allocations from this size on get pages of their own (mapped, and unmapped when freed)."""


def keep_heap() -> None:
    """Stop glibc from returning the top of the heap after every burst of packets.

    A process that joins a packet of tens of kilobytes per flush (the length prefix and
    the tag around the body) frees it right after the write; with glibc's default trim
    threshold (128 KiB, moved only by its dynamic mmap threshold) the heap shrank and grew
    again several times a second, and every regrowth faulted its pages in one by one
    inside ``memcpy``: a leader at 25,000 msgs/s took about 1,200 minor page faults a
    second, against under a hundred for the same work with half the copying.  A few
    megabytes kept at the top end that churn; allocations of a megabyte and more still
    get their own mappings, so a rare huge packet does not pin its size in the heap.
    Other C libraries (no ``mallopt``) are left alone."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (fixed: no dynamic threshold)
    mallopt(-1, TRIM_THRESHOLD)  # M_TRIM_THRESHOLD


def new_incarnation() -> int:
    """Larger for every new process of a node id (a restarted process is a new process)."""
    return time.time_ns() // 1000


def read_secret(path: str | None = None, env: str = "ECAST_SECRET") -> bytes:
    """The cluster secret from a file or an environment variable.  Taken from the
    environment, it is removed from it, so the processes this one starts do not inherit
    it."""
    if path:
        with open(path, "rb") as f:
            secret = f.read().strip()
    else:
        secret = os.environ.pop(env, "").encode()
    if not secret:
        raise SystemExit(f"no cluster secret: pass --secret-file or set {env}")
    return secret


def load_auth(
    credentials: str | Path | None = None,
    secret: bytes | str | None = None,
    revoked: str | Path | None = None,
) -> Auth:
    """How this process proves itself: a credential file, else the development secret
    (given, or ``$ECAST_CREDENTIALS``, else ``$ECAST_SECRET``).  Raises ``CredentialError``
    or ``ValueError`` with what is wrong; the secret mode logs a warning."""
    from ecast.runtime.handshake import CredentialAuth, SecretAuth
    from ecast.security.credentials import Credential, read_revoked
    from ecast.security.secret import secret_problem

    if credentials is None and secret is None:
        credentials = os.environ.get("ECAST_CREDENTIALS") or None
    if credentials is not None:
        if secret is not None:
            raise ValueError("give a credential or a secret, not both")
        bad = frozenset() if revoked is None else read_revoked(revoked)
        return CredentialAuth(Credential.load(credentials, bad))
    if secret is None:
        # Read, not taken out: a library must not change its host's environment (a
        # second client of the same program would find nothing).  Entry points that
        # start no children of their own take it out (``read_secret``).
        secret = os.environ.get("ECAST_SECRET", "")
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError(
            "no credential and no cluster secret: pass credentials= (a file from "
            "`ecast credentials issue`), or secret= for the development mode, or set "
            "ECAST_CREDENTIALS or ECAST_SECRET"
        )
    problem = secret_problem(key)
    if problem:
        raise ValueError(problem)
    log.warning("event=development_mode warning=%r", DEVELOPMENT_WARNING)
    return SecretAuth(key)
