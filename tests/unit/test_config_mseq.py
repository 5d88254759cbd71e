"""Config automata and the MSeq: suspects stay out, timestamps stay absolute, GC is exact."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ecast.core.config import BroadcastConfig, KeyRingConfig, load_config, restore_config
from ecast.core.message import Message
from ecast.core.mseq import MSeq
from ecast.history import Ack

PROCS = ["p1", "p2", "p3", "p4", "p5"]


def msg(sender: str, n: int, header: object = None) -> Message:
    return Message(sender, ((sender, 0, ""), n), header, f"{sender}-{n}")


history = st.lists(
    st.tuples(
        st.sampled_from(PROCS),
        st.sampled_from(["join", "join-receiver", "part", "suspect", "data"]),
        st.sampled_from(PROCS),
        st.integers(0, 50),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(history, st.sampled_from(["broadcast", "ring"]))
def test_a_suspected_or_parted_process_never_appears_in_a_later_destination_set(
    events: list[tuple[str, str, str, int]], kind: str
) -> None:
    config = (
        BroadcastConfig.initial() if kind == "broadcast" else KeyRingConfig.initial(replication=2)
    )
    gone: set[str] = set()
    for i, (sender, what, other, key) in enumerate(events):
        header: object
        if what == "join":
            header = {"kind": "join"}
        elif what == "join-receiver":
            header = {"kind": "join", "role": "receiver"}
        elif what == "part":
            header = {"kind": "part"}
        elif what == "suspect":
            header = {"kind": "suspect", "who": [other]}
        else:
            header = {"key": key}
        m = msg(sender, i, header)
        dests = config.destset(m)
        assert not (dests & gone), f"{sorted(dests & gone)} left but still routed to"
        if sender in gone:
            assert config.apply(m) is config, "a process that left changed the config"
        if what == "part" and sender in config.members():
            gone.add(sender)
        # Everyone a suspect names, members or not: the routers expel them all, so one
        # named before its join must not become a destination by joining after it.
        gone |= config.suspects(m)
        config = config.apply(m)
        assert not (config.members() & gone)


def test_configs_load_by_import_path_and_round_trip_through_plain_state() -> None:
    b = load_config("ecast.core.config:BroadcastConfig")
    assert isinstance(b, BroadcastConfig) and b.members() == frozenset()
    r = load_config("ecast.core.config:KeyRingConfig", replication=3)
    r = r.apply(msg("d1", 1, {"kind": "join", "role": "receiver"}))
    r = r.apply(msg("c1", 2, {"kind": "join", "role": "client"}))
    same = restore_config("ecast.core.config:KeyRingConfig", r.to_state())
    assert same == r and same.members() == frozenset({"d1", "c1"})
    for bad in ("ecast.core.config", ":Broadcast", ""):
        try:
            load_config(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} should be rejected")


def test_key_ring_sends_each_key_to_f_distinct_successors() -> None:
    config = KeyRingConfig.initial(replication=3)
    for i in range(8):
        config = config.apply(msg(f"d{i}", 1, {"kind": "join", "role": "receiver"}))
    config = config.apply(msg("c", 1, {"kind": "join", "role": "client"}))
    seen = set()
    for k in range(200):
        dests = config.destset(msg("c", 10 + k, {"key": k}))
        assert len(dests) == 3 and dests <= set(config.receivers())
        seen |= dests
        assert dests == config.destset(msg("c", 999, {"key": k}))  # a function of the key
    assert seen == set(config.receivers())  # the ring spreads keys over every receiver
    assert config.destset(msg("stranger", 1, {"key": 1})) == frozenset()  # not a member


def test_mseq_keeps_absolute_timestamps_and_collects_the_stable_prefix() -> None:
    m = MSeq(BroadcastConfig.initial())
    joins = [m.append(msg(p, 1, {"kind": "join"})) for p in ("a", "b")]
    assert joins == [0, 1]
    data = [m.append(msg("a", 2 + i)) for i in range(3)]
    assert data == [2, 3, 4]
    assert len(m.configs) == 3  # initial, after a's join, after b's join: data adds none
    assert m.config_for(0).members() == frozenset()
    assert m.config_for(1).members() == {"a"}
    assert m.config_for(5).members() == {"a", "b"}
    for t in (3, 0, 2):  # stable out of order: only the contiguous prefix goes
        m.mark_stable(t)
    assert m.collect() == 1 and m.floor == 1
    m.mark_stable(1)
    assert m.collect() == 3 and m.floor == 4
    assert sorted(m.entries) == [4] and len(m.configs) == 1
    t = m.append(msg("b", 2))
    assert t == 5  # never re-based after collection
    again = MSeq.restore(m.snapshot())
    assert (again.next_t, again.floor, sorted(again.entries), again.latest) == (
        m.next_t,
        m.floor,
        sorted(m.entries),
        m.latest,
    )


# ------------------------------------------------------------------ hostile headers
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.sampled_from(["join", "part", "suspect", "kind", "who", "role", "receiver", "p1"]),
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.tuples(inner, inner)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(leaves.filter(lambda x: x.__hash__ is not None), inner, max_size=4)
    ),
    max_leaves=12,
)
headers = st.one_of(
    values,
    st.fixed_dictionaries(
        {"kind": st.sampled_from(["join", "part", "suspect", "x"]) | values},
        optional={"who": values, "role": values, "key": values},
    ),
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([*PROCS, "@routers"]), headers), max_size=25),
    st.sampled_from(["broadcast", "ring"]),
)
def test_shipped_configs_never_raise_on_any_header_and_round_trip(
    events: list[tuple[str, object]], kind: str
) -> None:
    config = (
        BroadcastConfig.initial() if kind == "broadcast" else KeyRingConfig.initial(replication=2)
    )
    for i, (sender, header) in enumerate(events):
        m = msg(sender, i, header)
        dests = config.destset(m)
        who = config.suspects(m)
        assert isinstance(dests, frozenset) and isinstance(who, frozenset)
        assert all(type(p) is str for p in dests | who)
        config = config.apply(m)
        back = type(config).from_state(config.to_state())
        assert back == config and hash(back) == hash(config)


class _Fragile(BroadcastConfig):
    """A config with a bug: it raises on the payload "boom" (for the router's guard)."""

    __slots__ = ()

    @classmethod
    def initial(cls, **_: object) -> _Fragile:
        return cls()

    def _joined(self, p: str, header: dict[str, object]) -> _Fragile:
        return _Fragile(self._members | {p}, self._retired)

    def _left(self, gone: frozenset[str]) -> _Fragile:
        return _Fragile(self._members - gone, self._retired | gone)

    def destset(self, m: Message) -> frozenset[str]:
        if m.payload == "boom":
            raise RuntimeError("a bug in the config")
        return super().destset(m)

    def __eq__(self, other: object) -> bool:
        return type(other) is _Fragile and other._members == self._members

    def __hash__(self) -> int:
        return hash(self._members)


def test_a_config_that_raises_has_one_outcome_on_every_router() -> None:
    from tests.ecast_scenarios import net

    n = net(config=_Fragile.initial())
    for p in ("a", "b"):
        n.add_app(p)
    n.settle(0.3)
    n.submit("a", "boom")
    n.submit("a", "fine")
    n.settle(0.5)
    # "boom" went nowhere (its destination set is empty everywhere) but was acknowledged
    # as ignored; "fine" after it was delivered; no router diverged.
    assert n.delivered("b")[-1:] == ["fine"]
    acks = n.history.of_kind("a", Ack)
    assert [e.delivered for e in acks][-2:] == [False, True]
    leader = n.router("r1")
    assert leader.stats["config_errors"] >= 1
    assert "a bug in the config" in leader.guard.last_error
    assert not n.violations()
