"""The m-seq a router learned, with the configs it induces (3.5.3, 3.5.5, Figure 3.4).

Timestamps are absolute: ``t`` is a message's index in the one m-seq every router agrees
on, and it is never re-based when the stable prefix is collected.  ``configs`` is the
chain of ``Config`` values: ``configs[i]`` routes every message with
``starts[i] <= t < starts[i + 1]`` (the config of the prefix before it).  A new config is
stored only where ``apply`` changes it.  Collecting the stable prefix drops its messages
and every config that no remaining message needs.

A config is application code.  If one raises, every router must still reach the same
state, or the group splits: :class:`ConfigGuard` turns an exception in ``apply`` into
"no change", in ``destset`` into "no destinations" and in ``suspects`` into "nobody",
identically everywhere, and counts it (the daemon logs and exports the count).

The router learns and stabilizes messages by the thousand per step; :meth:`MSeq.extend`
and :meth:`MSeq.mark_stable_many` take a whole batch in one loop, so no caller needs to
know how the chain is stored.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import Any

from ecast.core.config import EMPTY, KIND, Config, config_path, restore_config
from ecast.core.effects import NodeId
from ecast.core.message import Message


class ConfigGuard:
    """Calls into application configs with a defined outcome when they raise."""

    __slots__ = ("errors", "last_error")

    def __init__(self) -> None:
        self.errors = 0
        self.last_error = ""

    def failed(self, what: str, config: Config, msg: Message, e: Exception) -> None:
        self.errors += 1
        self.last_error = (
            f"{type(config).__name__}.{what} raised {type(e).__name__}: {e} "
            f"(message {msg.id} from {msg.sender})"
        )[:300]

    def destset(self, config: Config, msg: Message) -> frozenset[NodeId]:
        try:
            return config.destset(msg)
        except Exception as e:
            self.failed("destset", config, msg, e)
            return EMPTY

    def suspects(self, config: Config, msg: Message) -> frozenset[NodeId]:
        try:
            return config.suspects(msg)
        except Exception as e:
            self.failed("suspects", config, msg, e)
            return EMPTY

    def apply(self, config: Config, msg: Message) -> Config:
        """The next config (``MSeq.extend`` has this written out, with the same outcome)."""
        try:
            return config.apply(msg)
        except Exception as e:
            self.failed("apply", config, msg, e)
            return config


class MSeq:
    __slots__ = ("configs", "entries", "floor", "guard", "next_t", "stable", "starts")

    def __init__(self, config: Config, guard: ConfigGuard | None = None, origin: int = 0) -> None:
        self.next_t = origin
        """The position of the next message (a group's first is at its ``origin``)."""
        self.floor = origin
        """Every message with ``t < floor`` is stable and collected."""
        self.entries: dict[int, Message] = {}
        self.stable: set[int] = set()
        """Stable timestamps at or above ``floor`` (waiting for the ones below them)."""
        self.starts: list[int] = [origin]
        self.configs: list[Config] = [config]
        self.guard = guard or ConfigGuard()

    # ------------------------------------------------------------------ growth
    def append(self, msg: Message) -> int:
        """Append one message (tests and tools; routers learn in batches, ``extend``)."""
        t = self.next_t
        self.extend((msg,))
        return t

    def extend(
        self, msgs: Iterable[Message], suspects: list[tuple[int, frozenset[NodeId]]] | None = None
    ) -> int:
        """Append ``msgs`` in order, each routed by the config of the prefix before it;
        return the first one's ``t``.  Processes a message suspects go into ``suspects``
        as ``(t, who)``: the router stops waiting for them from there on."""
        first = t = self.next_t
        entries = self.entries
        configs = self.configs
        starts = self.starts
        config = configs[-1]
        inert = getattr(config, "data_inert", False) is True
        for msg in msgs:
            entries[t] = msg
            t += 1
            if inert:
                h = msg[2]
                if type(h) is not dict or h.get(KIND) is None:
                    continue  # a data message: no new config, no suspects (Config.data_inert)
            if suspects is not None:
                try:
                    who = config.suspects(msg)
                except Exception as e:
                    self.guard.failed("suspects", config, msg, e)
                    who = EMPTY
                if who:
                    suspects.append((t - 1, who))
            try:
                after = config.apply(msg)
            except Exception as e:
                self.guard.failed("apply", config, msg, e)
                continue
            if after is not config:
                starts.append(t)
                configs.append(after)
                config = after
                inert = getattr(config, "data_inert", False) is True
        self.next_t = t
        return first

    def config_for(self, t: int) -> Config:
        """The config of the prefix before ``t`` (``t == next_t``: the latest one).

        ``t`` must not lie below the floor's config: collected configs are gone, and
        the index would wrap around to the latest one."""
        return self.configs[bisect_right(self.starts, t) - 1]

    @property
    def latest(self) -> Config:
        return self.configs[-1]

    def destset(self, t: int, msg: Message) -> frozenset[NodeId]:
        """Where ``msg`` at ``t`` goes, guarded (see :class:`ConfigGuard`)."""
        return self.guard.destset(self.config_for(t), msg)

    # ------------------------------------------------------------------ stability and GC
    def mark_stable(self, t: int) -> bool:
        if t < self.floor or t >= self.next_t or t in self.stable:
            return False
        self.stable.add(t)
        return True

    def mark_stable_many(
        self, entries: Iterable[tuple[int, bool]]
    ) -> list[tuple[int, bool, Message]]:
        """Mark ``(t, delivered)`` entries stable; return the ones that were not yet, with
        their messages (duplicates and collected ones are skipped)."""
        floor = self.floor
        stable = self.stable
        get = self.entries.get
        add = stable.add
        out: list[tuple[int, bool, Message]] = []
        append = out.append
        for t, delivered in entries:
            if t < floor or t in stable:
                continue
            msg = get(t)
            if msg is None:
                continue
            add(t)
            append((t, delivered, msg))
        return out

    def is_stable(self, t: int) -> bool:
        return t < self.floor or t in self.stable

    def collect(self) -> int:
        """Drop the stable prefix and the configs only it needed; return how many went."""
        floor = self.floor
        stable = self.stable
        entries = self.entries
        start = floor
        discard = stable.discard
        drop = entries.pop
        while floor in stable:
            discard(floor)
            drop(floor, None)
            floor += 1
        self.floor = floor
        starts = self.starts
        while len(starts) > 1 and starts[1] <= floor:
            del starts[0]
            del self.configs[0]
        return floor - start

    def unstable(self) -> int:
        return self.next_t - self.floor - len(self.stable)

    def unstable_items(self) -> Iterable[tuple[int, Message]]:
        stable = self.stable
        return ((t, m) for t, m in self.entries.items() if t not in stable)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> dict[str, Any]:
        """A plain, self-contained copy (configs serialized), for a joining router."""
        return {
            "next_t": self.next_t,
            "floor": self.floor,
            "entries": [(t, m) for t, m in self.entries.items()],
            "stable": sorted(self.stable),
            "configs": [
                (s, config_path(c), c.to_state())
                for s, c in zip(self.starts, self.configs, strict=True)
            ],
        }

    @classmethod
    def restore(cls, state: dict[str, Any], config_class: type | None = None) -> MSeq:
        """Rebuild from ``snapshot``; ``config_class``, when given, is the only class the
        snapshot may name (a peer must not make this router import a module)."""
        chain = state["configs"]
        configs = [restore_config(p, c, config_class) for _s, p, c in chain]
        m = cls(configs[0])
        m.starts = [s for s, _p, _c in chain]
        m.configs = configs
        m.next_t = state["next_t"]
        m.floor = state["floor"]
        # Messages arrive as plain arrays when the snapshot crossed the wire.
        m.entries = {
            t: msg if type(msg) is Message else Message(*msg) for t, msg in state["entries"]
        }
        m.stable = set(state["stable"])
        return m
