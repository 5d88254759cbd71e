"""The client's keyspace learning: asking the supers for the newest keyspace, and the
answers set aside meanwhile (4.5).

A client routes basic reads and believes answers by the keyspace it knows.  When that
may be behind the cluster's (an answer from a process it does not know as a holder, a
``Stale`` refusal, a basic read with no holder left), it asks a super, another one every
half second, until one answers or the time allowed runs out; answers it could not place
wait meanwhile and are checked again against what it learns.  Never from a storage
process: a keyspace is believed only from the super asked.  A part of
:class:`rubberband.client.ClientCore`, kept apart for size; sans-IO like it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ecast import Direct, Effects, NodeId
from rubberband.proto import Describe, Described

ASK_EVERY = 0.5
"""Seconds between questions to the supers while no answer came."""
MAX_ASIDE = 4096
"""Answers set aside at most while the client learns the newest keyspace."""
MAX_ASKING = 64
"""Questions to supers awaited at most (the oldest is forgotten)."""


@dataclass(frozen=True, slots=True)
class Refreshed:
    """Upcall: the client learned the keyspace from a super (``ok``), or no super
    answered before the deadline."""

    ok: bool


class LearnsKeyspace:
    """Asking the supers, and the answers that wait for what they say."""

    # Set by ClientCore.__init__ (declared for the type checker).
    supers: list[NodeId]
    answer_timeout: float
    retry_after: float
    counts: dict[str, int]
    refused_answers: int
    _ids: Any
    _fx: Effects
    _now: float
    _single: dict[int, Any]
    learn: Callable[..., Any]
    _answer: Callable[..., None]
    _try: Callable[[Any, float], None]
    _begin: Callable[[], Effects]
    _end: Callable[[float], Effects]

    def _init_learning(self) -> None:
        self._aside: list[tuple[NodeId, Any]] = []
        self._describing: dict[int, NodeId] = {}
        self._refresh_until: float | None = None
        self._refresh_next = 0.0
        self._waiting_keyspace: list[int] = []
        """Reads whose next try waits for a keyspace from a super."""

    def refresh(self, now: float, timeout: float | None = None) -> Effects:
        """Ask a super for the keyspace (again every 0.5 s, another super each time,
        until one answers or ``timeout``): a :class:`Refreshed` upcall says how it went."""
        self._begin()
        self._start_refresh(now, timeout)
        return self._end(now)

    def _start_refresh(self, now: float, timeout: float | None = None) -> None:
        until = now + (self.answer_timeout if timeout is None else timeout)
        if self._refresh_until is None or until > self._refresh_until:
            self._refresh_until = until
        if self._refresh_next <= now:
            self._ask_a_super(now)

    def _ask_a_super(self, now: float) -> None:
        self._refresh_next = now + ASK_EVERY
        if not self.supers:
            return
        self.counts["refreshes"] += 1
        rid = next(self._ids)
        # Another super each time (one may be gone), in turn.
        s = self.supers[self.counts["refreshes"] % len(self.supers)]
        self._describing[rid] = s
        if len(self._describing) > MAX_ASKING:
            del self._describing[next(iter(self._describing))]
        self._fx.send.append((s, Direct(Describe(rid))))

    def _described(self, src: NodeId, msg: Described) -> None:
        if self._describing.pop(msg.request, None) != src:
            self.refused_answers += 1
            return
        self.learn(msg.version, msg.keyspace, msg.partitioning)
        self._describing.clear()
        self._refresh_until = None
        self._fx.deliver.append(Refreshed(True))
        aside, self._aside = self._aside, []
        for s, m in aside:
            self._answer(s, m, recheck=False)
        waiting, self._waiting_keyspace = self._waiting_keyspace, []
        for rid in waiting:
            r = self._single.get(rid)
            if r is not None:
                self._try(r, self._now)

    def _set_aside(self, src: NodeId, msg: Any, recheck: bool) -> None:
        """An answer from a storage process that no keyspace we know says holds what it
        answers for: either our keyspace is behind (the routers' config made it a
        responder under a newer one), or it is no answer.  Learn the newest keyspace
        from a super, then take it if that says it holds it."""
        if not recheck or len(self._aside) >= MAX_ASIDE:
            self.refused_answers += 1
            return
        self._aside.append((src, msg))
        self._start_refresh(self._now, self.retry_after * 5)

    def _refresh_tick(self, now: float) -> None:
        """Ask again, or give up: answers set aside are then no answers."""
        if self._refresh_until is None:
            return
        if now >= self._refresh_until:
            self._refresh_until = None
            aside, self._aside = self._aside, []
            self.refused_answers += len(aside)
            self._fx.deliver.append(Refreshed(False))
        elif now >= self._refresh_next:
            self._ask_a_super(now)

    def _refresh_wake(self) -> float | None:
        if self._refresh_until is None:
            return None
        return min(self._refresh_next, self._refresh_until)
