"""Tunables of ufabcast, with the dissertation's defaults (3.5.4 to 3.5.7)."""

from __future__ import annotations

from dataclasses import dataclass

from ecast.core.mutations import declare

_U = "ufabcast"
KEEP_VOID_INSTANCES = declare(
    "keep_void_instances", _U, "execute old-view instances chosen after a stop sign"
)
RENUMBER_REPROPOSALS = declare(
    "renumber_reproposals", _U, "give a re-proposed command a fresh sequence number"
)
NO_FIFO_DEDUP = declare("no_fifo_dedup", _U, "release a command again when it was chosen twice")
EXECUTE_PARTED = declare(
    "execute_parted", _U, "execute commands of a router chosen after its own part"
)
SKIP_PHASE1 = declare("skip_phase1", _U, "a new leader proposes without phase 1 (holes unfilled)")


@dataclass(frozen=True, slots=True)
class UfabParams:
    heartbeat_interval: float = 0.25
    """Heartbeats carry the highest executed instance (GC) and prove liveness (3.5.5)."""
    failure_timeout: float = 1.0
    """A member silent this long is proposed ``part``.  The dissertation used 3 s; a data
    centre warrants 1 s (docs/decisions.md)."""
    clump_delay: float = 0.010
    """Message clumping (3.5.7): wait at most this long for more commands..."""
    clump_trigger: int = 3
    """...or until this many are waiting.  A trigger, not a cap: everything waiting goes."""
    pipeline_depth: int = 2
    """Adaptive clumping: while fewer instances than this are uncommitted, propose at once
    (a lone message crosses without waiting for a timer); beyond it, the clumping rule
    above applies and batches grow with the load (the adaptive scheme 3.5.7 leaves as
    future work).  0 turns it off and keeps the dissertation's fixed rule."""
    commit_delay: float = 0.005
    """A ``Commit`` rides with the next ``Accept``; alone it waits at most this long.
    Nobody waits on a follower's learning: only the leader forwards, and in a group of
    three a follower decides when it accepts (its vote and the leader's are a majority).
    A standalone ``Commit`` per instance costs the leader a write per follower and each
    follower a wake-up.  A view change sends it at once; 0 always sends it at once."""
    vote_delay: float = 0.005
    """A leader needs ``majority - 1`` followers' votes: the first ones in view order vote
    at once, the others hold their ``Accepted`` this long (it still counts if the prompt
    voters are slow or gone).  In a group of three the leader's second vote per instance
    was a packet it read and a step it ran for nothing.  0 makes every follower vote at
    once."""
    max_batch: int = 4096
    """Cap on commands per Paxos instance, so one instance never becomes a huge frame."""
    max_active: int = 32768
    """Instances above the collected watermark a leader may have open (3.5.6)."""
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    """Binary exponential backoff after a conflicting proposal (3.5.6)."""
    catchup_batch: int = 512
    """Executed instances per catch-up reply."""
    resend_timeout: float = 1.0
    """Re-send pending commands to the leader if none of them executed for this long."""
    join_retry: float = 1.0
    """A joiner without a snapshot asks again (the next seed) this often."""
    seed: int = 0
    """Seeds the jitter of backoff delays, so runs replay exactly."""

    def __post_init__(self) -> None:
        if self.failure_timeout <= self.heartbeat_interval:
            raise ValueError("failure_timeout must exceed heartbeat_interval")
        if self.clump_trigger < 1 or self.max_batch < 1 or self.max_active < 1:
            raise ValueError("clump_trigger, max_batch and max_active must be positive")
