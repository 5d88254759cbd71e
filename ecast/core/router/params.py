"""Tunables of an E-Cast router, with the dissertation's defaults (3.5.6, 3.5.7)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ecast.core.mutations import declare
from ecast.core.ufabcast import UfabParams

_R = "router"
SKIP_LEARN_DEDUP = declare(
    "skip_learn_dedup", _R, "append duplicates and gaps instead of dropping them"
)
ROUTE_LATEST_CONFIG = declare(
    "route_latest_config", _R, "route with the latest config, not the message's prefix"
)
IGNORE_SUSPECTS = declare(
    "ignore_suspects", _R, "keep waiting for confirmations from suspected destinations"
)
JOIN_WITHOUT_SESSIONS = declare(
    "join_without_sessions", _R, "a joining router gets no session table"
)
NO_LEASE_EXPIRY = declare(
    "no_lease_expiry", _R, "the leader never suspects a process whose lease ran out"
)


@dataclass(frozen=True, slots=True)
class RouterParams:
    ufab: UfabParams = field(default_factory=UfabParams)
    delayed_acks: bool = True
    """Buffer stable notices and piggyback them on route proposals (3.5.7)."""
    ack_delay: float = 0.010
    early_acks: bool = True
    """Acknowledge a message as soon as it is stable, before the stable notice is agreed
    (see ``Forwarding.stable_candidate``)."""
    adaptive_acks: bool = True
    """Propose stable notices at once when ufabcast has nothing in flight to carry them and
    an acknowledgement waits for them (see ``Router._propose``)."""
    congestion_threshold: int = 1024
    congestion_interval: float = 0.25
    """Also the period at which suspects are re-applied to outstanding confirmations."""
    ack_cache: int = 1024
    """Stable acknowledgements remembered per session, for duplicates of stable messages
    (an endpoint's window never exceeds this, so older ones were surely received)."""
    unsafe_lag_limit: int = 4096
    """Unsafe copies are dropped for a destination this far behind: this many
    confirmations outstanding, or this many messages sent to it and not yet acknowledged
    by its link (``Router.link_lag``).  Unsafe messages bypass flow control; without this
    a flood of them grows the buffers of a slow destination without bound."""
    client_lease: float = 5.0
    """Seconds an application process may stay silent before the leader submits a
    suspect for it (ZooKeeper's session timeout, Kafka's ``session.timeout.ms``).  A new
    leader gives every process a full lease first.  Whether such a suspect counts is the
    config's decision (``Membership.accepts_lease_suspects``)."""
    max_client_lease: float = 60.0
    """The longest lease a process may ask for (``Hello.lease``)."""
    max_message: int = 16 * 1024 * 1024 - 64 * 1024
    """The largest message, in packed bytes of payload and header, that processes may
    submit (announced in ``Welcome``; the SDK refuses larger ones at the call).  The
    daemon derives it from its frame limit, leaving room for a frame's other fields."""
    expelled_memory: int = 65536
    """How many suspected process names every router remembers, to tell a process that
    comes back that it was suspected (it never resumes silently)."""
    origin: int = 0
    """The position of the first message of a group this router founds (a joiner takes
    its group's).  A group founded again after every router went (a restart of a whole
    cluster whose processes keep state: durable engines, feed offsets in a client's
    checkpoint) starts above every position the last one gave, so that no position ever
    names two messages; the daemon takes the clock in microseconds (``--origin``)."""
    all_leaders: bool = False
    """Every router forwards and proposes stability (a test mode: safety must hold)."""

    def __post_init__(self) -> None:
        if not 0 < self.client_lease <= self.max_client_lease:
            raise ValueError("need 0 < client_lease <= max_client_lease")
