"""The client core against real storage cores (the in-memory model), in virtual time:
whom it believes, failover, read batches, timeouts.  The SDK and the simulator drive
this same core (``tests/unit/test_rubberband_sdk.py`` checks the SDK's driving)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from ecast.core import mutations
from rubberband.client import Changes, ReadDone, WriteDone
from rubberband.errors import Indeterminate, Rejected, Unavailable
from rubberband.messages import EXACT_RANGES
from rubberband.proto import MAX_RANGES, Answer, Answers, H, Whole
from storage_adapters.scan import ScanOps
from tests.rubberband_client_rig import Rig
from tests.rubberband_model import Model


def _holder(m: Model, key: int) -> str:
    """A storage process that holds ``key``."""
    place = m.placement.ekey(key)
    ks = m.config.keyspace
    return next(p for _, p in ks.ring() if any(lo <= place < hi for lo, hi in ks.partition(p)))


def _responders(rig: Rig, token: int) -> frozenset[str]:
    """Where the routers sent the submission of request ``token`` (by the model's
    config now)."""
    from ecast import Message

    s = next(s for s in rig.submitted if s.header.get(H.REQUEST) == token)
    return rig.m.config.destset(Message(rig.name, (("x", 0, rig.name), 0), s.header, s.payload))


# ---------------------------------------------------------------------- whom it believes
class _ChangingRig(Rig):
    """The keyspace changes (an expand) right after the first storage process was asked,
    so the others find the client's keyspace stale."""

    changed = False

    def send(self, dst: str, direct: Any) -> None:
        super().send(dst, direct)
        if not self.changed and dst.startswith("storage:"):
            self.changed = True
            self.m.join_storage("storage:4")
            self.m.reconfigure(("expand", "storage:4", 350))
            self.m.settle()


def test_a_basic_read_across_a_keyspace_change_returns_every_key() -> None:
    """Parts answered under two keyspace versions are not one read: the client learns
    the newer keyspace from a super and reads again, whole (it once returned a read
    missing the keys whose answers had not arrived)."""
    m = Model(f=3).ring_of(4)
    keys = [10, 110, 210, 310, 360]
    for k in keys:
        m.write(("put", ((k, f"v{k}"),)))
    m.settle()
    rig = _ChangingRig(m)
    rid = rig.read(("get", tuple(keys)), "basic")
    done = rig.until_done(rid)
    assert done.error is None and done.result == {k: f"v{k}" for k in keys}
    assert rig.core.version == m.config.version and rig.core.counts["retries"] >= 1


def _forged_then_real() -> tuple[list[Any], int]:
    """A read whose holder the client does not know yet (an expand it missed): a forged
    answer from a storage process that holds none of it, then the real one from the new
    holder."""
    m = Model(f=3).ring_of(4)
    liar = next(
        p
        for p in m.config.keyspace.processes
        if p != _holder(m, 360)
        and not any(lo <= m.placement.ekey(360) < hi for lo, hi in m.config.keyspace.partition(p))
    )
    rig = Rig(m)
    rig.silent = True
    m.join_storage("storage:4")
    m.reconfigure(("expand", "storage:4", 350))  # the client does not know yet
    m.settle()
    got: list[Any] = []
    _, fx = rig.core.read_batch(
        [("get", (360,))], "snapshot", lambda op, g: got.append(g), rig.now, bundle=1
    )
    rig.run(fx)
    (sub,) = rig.submitted
    rid = sub.header[H.REQUEST]
    rig.run(rig.core.on_direct("client:x", Answer(rid, None, {360: "client"}, None, 1, True), 0))
    rig.run(rig.core.on_direct(liar, Answer(rid, None, {360: "forged"}, None, 1, True), 0))
    rig.run(rig.core.on_direct("storage:4", Answer(rid, None, {360: "real"}, None, 1, True), 0))
    early = list(got)
    rig.pump()  # the super's answer: storage:4 holds 360 now
    return [rig.core.result(g) for g in early] + [rig.core.result(g) for g in got[len(early) :]], (
        rig.core.refused_answers
    )


def test_answers_are_taken_only_from_holders_a_newer_keyspace_learned_first() -> None:
    """An answer from a process that is no storage process is no answer; one from a
    storage process that the client's keyspace does not name as a holder waits until the
    client has asked a super for the newest keyspace, and counts if that names it."""
    got, refused = _forged_then_real()
    assert got == [{360: "real"}] and refused == 2


def test_the_planted_bug_that_trusts_any_answer_is_caught() -> None:
    """``trust_any_answer`` (no simulated process lies, so the simulator cannot catch
    it): the forged answer completes the read."""
    with mutations.planted({"trust_any_answer"}):
        got, _ = _forged_then_real()
    assert got[0] == {360: "forged"}


def test_an_answer_from_a_process_not_asked_is_no_answer_to_a_basic_read() -> None:
    m = Model(f=3).ring_of(4)
    m.write(("put", ((5, "five"),)))
    m.settle()
    rig = Rig(m)
    rig.silent = True
    rid = rig.read(("get", (5,)), "basic")
    (asked,) = rig.core.asked.values()
    other = next(p for p in m.config.keyspace.processes if p not in asked)
    tid = next(iter(rig.core.asked))
    rig.run(rig.core.on_direct(other, Answer(tid, None, {5: "forged"}, None, 0, True), 0))
    assert rig.done(rid) is None and rig.core.refused_answers == 1


# ---------------------------------------------------------------------- failover
class _KillingRig(Rig):
    """The processes the client's first read reaches crash as it reaches them (before
    they answer); nobody has suspected them yet."""

    killed: frozenset[str] = frozenset()

    def submit(self, submissions: list[Any]) -> None:
        if not self.killed:
            from ecast import Message

            s = submissions[0]
            msg = Message(self.name, (("x", 0, self.name), 0), s.header, s.payload)
            self.killed = self.m.config.destset(msg)
            self.m.dead |= self.killed
        super().submit(submissions)

    def send(self, dst: str, direct: Any) -> None:
        if not self.killed and dst.startswith("storage:"):
            self.killed = frozenset((dst,))
            self.m.dead |= self.killed
        super().send(dst, direct)


@pytest.mark.parametrize("level", ["sequential", "snapshot", "basic"])
def test_a_read_whose_responder_died_goes_to_another_replica(level: str) -> None:
    """The responder of a read fails before answering: the read is tried again (a new
    request id), and once the failure is known to the order, another replica answers."""
    m = Model(f=3).ring_of(4)
    m.write(("put", ((5, "five"),)))
    m.settle()
    rig = _KillingRig(m, retry_after=0.5)
    rid = rig.read(("get", (5,)), level)
    rig.pump()
    assert len(rig.killed) == 1 and rig.done(rid) is None  # no answer from the dead
    rig.tick(0.2)  # a try may go to another replica already (reads take turns)
    for victim in rig.killed:
        m.suspect(victim)
    m.settle()
    done = rig.until_done(rid)
    assert done.error is None and done.result == {5: "five"}
    assert rig.core.counts["retries"] >= 1
    assert rig.now < rig.core.answer_timeout


def test_a_read_that_no_holder_is_left_for_fails_unavailable() -> None:
    m = Model(f=1).ring_of(2)
    rig = Rig(m, answer_timeout=1.0)
    victim = _holder(m, 5)
    m.suspect(victim)  # its ranges have no holder left
    m.settle()
    rid = rig.read(("get", (5,)), "sequential")
    done = rig.until_done(rid)
    assert isinstance(done.error, Unavailable), done


def test_a_read_nobody_answers_fails_indeterminate_after_its_timeout() -> None:
    m = Model(f=3).ring_of(4)
    rig = Rig(m, answer_timeout=1.0, retry_after=0.3)
    rig.silent = True
    rid = rig.read(("scan", 0, 400), "snapshot")
    done = rig.until_done(rid)
    assert isinstance(done.error, Indeterminate) and 1.0 <= rig.now < 1.2
    assert rig.core.counts["retries"] >= 2  # tried again every retry_after meanwhile


def test_a_sequential_read_answered_but_never_acknowledged_ends_at_its_deadline() -> None:
    """Its holders answered, but the routers died before the read was stable (a power
    cut, a client cut off from the routers): it waited for the acknowledgement for
    ever, past every timeout, and its caller with it."""
    m = Model(f=3).ring_of(4)
    m.write(("put", ((5, "five"),)))
    m.settle()
    rig = Rig(m, answer_timeout=1.0, retry_after=0.3)
    rig.lose_acks = True
    rid = rig.read(("get", (5,)), "sequential")
    done = rig.until_done(rid, limit=5.0)
    assert isinstance(done.error, Indeterminate) and 1.0 <= rig.now < 1.2, (done, rig.now)
    assert "not known to be ordered" in str(done.error)


def test_parts_answered_to_two_tries_are_not_one_read() -> None:
    """A snapshot read's earlier try stays awaited beside its new one, but parts from
    two tries are never one answer (two positions): the read completes with the first
    try answered whole."""
    m = Model(f=3).ring_of(4)
    rig = Rig(m, retry_after=0.3)
    rig.silent = True
    rid = rig.read(("get", (5, 300)), "snapshot")
    first = rig.submitted[-1].header[H.REQUEST]
    rig.tick(0.35)  # retried
    second = rig.submitted[-1].header[H.REQUEST]
    assert second != first
    five, three_hundred = rig.core.gather(("get", (5, 300)), None).ranges
    core = rig.core

    def answer(rid: int, key: int, part: Any, value: str, position: int) -> None:
        a = Answer(rid, (part,), {key: value}, None, position, True)
        rig.run(core.on_direct(_holder(m, key), a, rig.now))

    answer(first, 5, five, "old", 7)
    answer(second, 300, three_hundred, "new", 9)
    assert rig.done(rid) is None  # one part of each try: no answer yet
    answer(second, 5, five, "new", 9)
    assert rig.done(rid).result == {5: "new", 300: "new"}
    answer(first, 300, three_hundred, "old", 7)  # too late: the read has ended
    assert [u.request for u in rig.upcalls if isinstance(u, ReadDone)] == [rid]


@pytest.mark.parametrize("level", ["sequential", "snapshot", "basic"])
def test_a_read_whose_every_try_is_answered_after_retry_after_completes(level: str) -> None:
    """A loaded cluster answers a large read in more than ``retry_after``: each try is
    tried again before its answers come.  The read completes with the first try
    answered whole, long before its timeout, instead of dropping each try's answers for
    the next try's until it times out."""
    m = Model(f=3).ring_of(4)
    data = {k: f"v{k}" for k in range(0, 400, 7)}
    m.write(("put", tuple(data.items())))
    m.settle()
    rig = Rig(m, answer_timeout=5.0, retry_after=0.3)
    rig.answer_delay = 0.45
    rid = rig.read(("scan", 0, 400), level)
    done = rig.until_done(rid)
    assert done.error is None and done.result == sorted(data.items()), done
    assert rig.core.counts["retries"] >= 1
    assert rig.now < 1.0
    assert not rig.core._single and not rig.core.asked  # nothing of its tries is left


def test_a_write_is_stable_then_done_and_an_undelivered_one_is_unavailable() -> None:
    m = Model(f=1).ring_of(2)
    rig = Rig(m)
    rid = rig.write(("put", ((5, "five"),)))
    assert rig.until_done(rid) == WriteDone(rid, None)
    m.suspect(_holder(m, 5))
    m.settle()
    rid = rig.write(("put", ((5, "again"),)))
    assert isinstance(rig.until_done(rid).error, Unavailable)


@pytest.mark.parametrize("answered", [False, True])
def test_acknowledgements_taken_in_one_call_end_writes_as_one_at_a_time(answered: bool) -> None:
    """``on_acks`` (a batch of E-Cast's acknowledgements in one call) ends each write of
    a batch as ``on_acked`` does, one by one: stable, or unavailable where the holders
    of its key were suspected, or (appends, ``answered``) once answered."""
    told: list[list[Any]] = []
    for batched in (False, True):
        m = Model(f=1).ring_of(4)
        m.suspect(_holder(m, 5))
        m.settle()
        rig = Rig(m)
        rig.batched = batched
        name = "append" if answered else "put"
        ops = [(name, ((k, "v"),)) for k in range(0, 400, 10)]
        messages, fx = rig.core.write_batch(ops, rig.now, bundle=1)
        rig.run(fx)
        rig.pump()
        dones = [rig.done(rid) for _, rid in messages]
        assert None not in dones
        told.append([type(d.error).__name__ if d.error else None for d in dones])
    assert told[0] == told[1]
    assert None in told[1] and "Unavailable" in told[1]


def test_a_write_never_acknowledged_is_indeterminate_after_its_deadline() -> None:
    m = Model(f=3).ring_of(4)
    rig = Rig(m)
    rig.core.write_timeout = 1.0
    rig.core.answer_timeout = 0.5
    rig.lose_acks = True
    rid = rig.write(("put", ((5, "five"),)))
    done = rig.until_done(rid)
    assert isinstance(done.error, Indeterminate) and 1.5 <= rig.now < 1.6


def test_a_stable_append_nobody_answers_is_indeterminate_after_the_answer_timeout() -> None:
    """Once an append is stable its holders answer as a read's would: the caller waits
    ``answer_timeout`` for them, not the acknowledgement timeout too."""
    m = Model(f=3).ring_of(4)
    rig = Rig(m)
    rig.core.write_timeout = 30.0
    rig.core.answer_timeout = 0.5
    rig.mute_answers = True  # acknowledged, never answered
    rid = rig.write(("append", ((5, "x"),)))
    done = rig.until_done(rid)
    assert isinstance(done.error, Indeterminate), done
    assert "no holder answered in 0.5 s" in str(done.error)
    assert 0.5 <= rig.now < 0.7, rig.now  # stable at once here; the 30 s never waited


class _DeafRig(Rig):
    """Answers from the processes in ``deaf`` never arrive."""

    deaf: frozenset[str] = frozenset()

    def _collect(self) -> None:
        self.m.to_clients[:] = [x for x in self.m.to_clients if x[0] not in self.deaf]
        super()._collect()


def _holders(m: Model, key: int) -> frozenset[str]:
    place = m.placement.ekey(key)
    ks = m.config.keyspace
    return frozenset(p for _, p in ks.ring() if any(lo <= place < hi for lo, hi in ks.partition(p)))


def test_a_write_of_two_segments_succeeds_only_once_both_are_answered() -> None:
    """A write that reaches two segments is applied, and answered, segment by segment:
    with only one segment's holders heard from, its other part might have been refused,
    so the write is not reported done (before, the first answer decided it)."""
    m = Model(f=3).ring_of(5)
    rig = _DeafRig(m, answer_timeout=0.5)
    rig.deaf = _holders(m, 250)
    assert _holders(m, -1) - rig.deaf  # the other segment's holders still answer
    rid = rig.write(("append", ((-1, "y"), (250, "w"))))
    done = rig.until_done(rid)
    assert isinstance(done.error, Indeterminate), done
    rig.deaf = frozenset()
    rid = rig.write(("append", ((-1, "y"), (250, "w"))))
    assert rig.until_done(rid).error is None


def test_a_write_refused_in_one_of_its_segments_is_rejected() -> None:
    m = Model(f=3).ring_of(5)
    m.write(("put", ((250, "a string"),)))
    m.settle()
    rig = Rig(m)
    rid = rig.write(("append", ((-1, "y"), (250, "w"))))
    done = rig.until_done(rid)
    assert isinstance(done.error, Rejected) and "append to 250" in str(done.error), done


@pytest.mark.parametrize("batched", [False, True])
def test_a_clients_write_of_a_views_definition_is_rejected_not_reported_done(
    batched: bool,
) -> None:
    """Every holder refuses a plain write naming a view's definition from anyone but a
    maintainer; the client waits for a holder's answer to such a write and reports the
    refusal (before, a put of one was reported done, and never applied).  A
    maintainer's is applied and reported done; a base key's put is not waited on."""
    m = Model(f=3).ring_of(5)
    rig = Rig(m)
    defined = ("~views", "v")
    for op in (
        ("put", ((defined, {"name": "v"}),)),
        ("put", ((7, "base"), (("~views", "w"), {"name": "w"}))),
        ("delete", (defined,)),
    ):
        if batched:
            [(_indices, rid)], fx = rig.core.write_batch([op], rig.now)
            rig.run(fx)
        else:
            rid = rig.write(op)
        done = rig.until_done(rid)
        assert isinstance(done.error, Rejected), (op, done)
        assert "only maintainers" in str(done.error), done
    held = {k for c in m.storage.values() for k, _ in c.engine.items()}  # type: ignore[attr-defined]
    assert not held & {defined, ("~views", "w"), 7}, held  # refused whole, base key too
    assert rig.core.answered(("put", ((7, "base"),))) is False
    rig.name = "maintainer:m"
    done = rig.until_done(rig.write(("put", ((defined, {"name": "v"}),))))
    assert done.error is None, done
    assert all(dict(c.engine.items()).get(defined) == {"name": "v"}
               for c in m.storage.values() if defined in dict(c.engine.items()))  # fmt: skip
    assert sum(defined in dict(c.engine.items()) for c in m.storage.values()) == 3


def test_an_appends_answer_is_taken_from_a_holder_of_its_key_only() -> None:
    """A write whose holder must answer (an append) takes the answer of a process that
    holds its key, whatever the header names it by, and no other's: a storage process
    that holds none of it is no answer, and the caller waits out the answer timeout."""
    m = Model(f=1).ring_of(4)
    rig = Rig(m)
    rig.core.answer_timeout = 0.5
    rid = rig.write(("append", ((5, "x"),)))
    assert rig.until_done(rid) == WriteDone(rid, None) and rig.now < 0.1
    rig.mute_answers = True
    rid = rig.write(("append", ((5, "y"),)))
    liar = next(p for p in m.config.keyspace.processes if p != _holder(m, 5))
    rig.run(rig.core.on_direct(liar, Answer(rid, None, None, None, m.t, True), rig.now))
    done = rig.until_done(rid)
    assert isinstance(done.error, Indeterminate) and rig.core.refused_answers == 1, done


# ---------------------------------------------------------------------- read batches
def _batch_of_reads(
    silent: bool, shed: bool = False, grouped: bool = False, level: str = "snapshot",
    batched: bool = True,
) -> tuple[dict[int, Any], Rig, list[int]]:  # fmt: skip
    """200 bundled reads (``level``); what each was told, and the sizes of the groups
    told (``grouped``)."""
    m = Model(f=3).ring_of(4)
    for k in range(0, 400, 2):
        m.write(("put", ((k, f"v{k}"),)))
    m.settle()
    rig = Rig(m, answer_timeout=0.3)
    rig.silent = silent
    rig.batched = batched
    got: dict[int, Any] = {}
    groups: list[int] = []

    def done(op: Any, gather: Any) -> None:
        key = op[1][0]
        assert key not in got, f"read {key} completed twice"
        got[key] = (
            "timeout"
            if gather is None
            else "refused"
            if gather.refused
            else rig.core.result(gather)
        )

    def done_group(told: list[tuple[Any, Any]]) -> None:
        assert told, "an empty group"
        groups.append(len(told))
        for op, gather in told:
            done(op, gather)

    ops = [("get", (k,)) for k in range(200)]
    callback = done_group if grouped else done
    _, fx = rig.core.read_batch(ops, level, callback, rig.now, bundle=16, grouped=grouped)
    rig.run(fx)
    if shed:
        for s in rig.submitted:
            rig.run(rig.core.on_shed(s.token, rig.now))
    rig.pump()
    while len(got) < 200:
        assert rig.now < 2.0
        rig.tick(0.05)
    return got, rig, groups


def _left(rig: Rig) -> tuple[Any, ...]:
    core = rig.core
    return dict(core._bundles), dict(core.batch_reads), dict(core.asked)


def _counts(rig: Rig) -> list[int]:
    return [len(msgpack.unpackb(s.payload)) if H.COUNT in s.header else 1 for s in rig.submitted]


@pytest.mark.parametrize("grouped", [False, True])
def test_read_batch_bundles_reads_and_completes_each_alone(grouped: bool) -> None:
    got, rig, groups = _batch_of_reads(silent=False, grouped=grouped)
    assert got == {k: ({k: f"v{k}"} if k % 2 == 0 else {}) for k in range(200)}
    # 200 reads over two segments, 16 to a message (one holder may answer both).
    counts = _counts(rig)
    assert all(s.header.get(H.COUNT, 1) == n for s, n in zip(rig.submitted, counts, strict=True))
    assert sum(counts) == 200 and max(counts) == 16 and len(rig.submitted) <= 14
    assert _left(rig) == ({}, {}, {})  # nothing kept once every read completed
    if grouped:  # told by answer: never more groups than answers, most of them whole
        assert sum(groups) == 200 and max(groups) == 16
        assert len(groups) <= 3 * len(rig.submitted), groups


@pytest.mark.parametrize("grouped", [False, True])
def test_a_shed_bundle_refuses_each_of_its_reads_at_once(grouped: bool) -> None:
    got, rig, groups = _batch_of_reads(silent=True, shed=True, grouped=grouped)
    assert got == {k: "refused" for k in range(200)} and rig.now == 0.0
    assert _left(rig) == ({}, {}, {})
    if grouped:  # a bundle's reads in one call
        assert sorted(groups) == sorted(_counts(rig))


@pytest.mark.parametrize("grouped", [False, True])
def test_reads_of_a_bundle_nobody_answers_time_out_each(grouped: bool) -> None:
    got, rig, groups = _batch_of_reads(silent=True, grouped=grouped)
    assert got == {k: "timeout" for k in range(200)} and 0.3 <= rig.now < 0.4
    assert _left(rig) == ({}, {}, {})
    if grouped:
        assert sorted(groups) == sorted(_counts(rig))


def test_reads_with_large_operations_go_fewer_to_a_bundle() -> None:
    m = Model(f=3).ring_of(3)
    keys = [f"{i:03}" + "k" * 5000 for i in range(40)]  # one segment, 5 KB each
    for k in keys[::2]:
        m.write(("put", ((k, len(k)),)))
    m.settle()
    rig = Rig(m)
    got: dict[str, Any] = {}

    def done(op: Any, gather: Any) -> None:
        got[op[1][0]] = rig.core.result(gather)

    sent, fx = rig.core.read_batch([("get", (k,)) for k in keys], "snapshot", done, rig.now)
    rig.run(fx)
    rig.pump()
    assert got == {k: ({k: len(k)} if i % 2 == 0 else {}) for i, k in enumerate(keys)}
    assert sent == len(rig.submitted)
    assert all(len(s.payload) <= 64 * 1024 for s in rig.submitted if H.COUNT in s.header)
    # About 15 KB a read (the key in the op and twice in its range): split into
    # bundles of four, not sent one by one.
    assert sum(H.COUNT in s.header for s in rig.submitted) == sent <= len(keys) // 3


class _HostileRig(Rig):
    """Before the real answers to a bundle, malformed ones from a storage process."""

    def submit(self, submissions: list[Any]) -> None:
        for s in submissions:
            rid, n = s.header[H.REQUEST], s.header.get(H.COUNT, 1)
            self.inbox.append(("storage:0", Answers(rid, 1, True, ((0, "not ranges", {}, None),))))
            self.inbox.append(
                ("storage:0", Answers(rid, 1, True, ("not a row", (99, None, 1, None))))
            )
            self.inbox.append(("storage:0", Whole(rid, 1, (None,) * (n + 1))))
            self.inbox.append(("storage:0", Whole(rid, 1, "not results")))  # type: ignore[arg-type]
        super().submit(submissions)


def test_malformed_answers_and_a_raising_callback_do_not_stop_other_reads() -> None:
    """An answer the client cannot use (from any storage process) and a ``done`` that
    raises are logged; every other read still completes, each once."""
    m = Model(f=3).ring_of(3)
    m.write(("put", ((5, "five"),)))
    m.settle()
    rig = _HostileRig(m)
    got: list[Any] = []

    def done(op: Any, gather: Any) -> None:
        got.append(rig.core.result(gather) if gather is not None else None)
        if len(got) == 1:
            raise RuntimeError("the caller's own bug")

    _, fx = rig.core.read_batch([("get", (5 + k,)) for k in range(20)], "snapshot", done, 0.0)
    rig.run(fx)
    rig.pump()
    assert len(got) == 20 and None not in got and {5: "five"} in got


@pytest.mark.parametrize("level", ["snapshot", "sequential", "basic"])
def test_answers_taken_a_frame_at_a_time_tell_what_one_at_a_time_tells(level: str) -> None:
    """``on_directs`` (the SDK hands the core each frame's answers from one process in
    one call) completes every read of a batch as ``on_direct`` does, one by one."""
    one, rig_one, _ = _batch_of_reads(False, level=level, batched=False)
    many, rig_many, _ = _batch_of_reads(False, level=level, batched=True)
    assert one == many
    assert len(many) == 200 and "timeout" not in many.values()
    assert _left(rig_many) == _left(rig_one) == ({}, {}, {})


def test_an_answer_whose_handling_raises_does_not_stop_the_rest_of_its_frame() -> None:
    """One of a frame's answers makes the core raise: ``on_error`` gets it, the answers
    after it in the same call are still taken, and the effects of the call (made before
    and after) are carried out; without ``on_error`` the error propagates."""
    m = Model(f=3).ring_of(3)
    m.write(("put", ((5, "five"),)))
    m.settle()
    rig = Rig(m)
    got: list[Any] = []
    _, fx = rig.core.read_batch([("get", (5 + k,)) for k in range(20)], "snapshot",
                                lambda op, g: got.append(op), 0.0)  # fmt: skip
    rig.run(fx)
    frames: dict[str, list[Any]] = {}
    for src, msg in rig.inbox:
        frames.setdefault(src, []).append(msg)
    rig.inbox.clear()
    core = rig.core
    real = core._answer
    bad = object()

    def answer(src: str, msg: Any, recheck: bool = True) -> None:
        if msg is bad:
            raise RuntimeError("an answer the checks did not catch")
        real(src, msg, recheck)

    core._answer = answer  # type: ignore[method-assign]
    errors: list[Any] = []
    for src, msgs in frames.items():
        half = len(msgs) // 2
        with_bad = [*msgs[:half], bad, *msgs[half:]]
        rig.run(core.on_directs(src, with_bad, 0.0, lambda m, e: errors.append((m, str(e)))))
    assert errors == [(bad, "an answer the checks did not catch")] * len(frames)
    assert sorted(op[1][0] for op in got) == list(range(5, 25))
    with pytest.raises(RuntimeError):
        core.on_directs(next(iter(frames)), [bad], 0.0)


def test_a_bundled_read_answered_in_pieces_completes_once_and_whole() -> None:
    """Answers to a bundle's reads come from one responder (whole) or, with a stale
    keyspace, from several (each a piece): a read completes when its pieces cover it, is
    told once however many replicas answer it, and pieces from different frontiers
    refuse it.  The answers here are crafted, so each case is certain to occur."""
    m = Model(f=3).ring_of(4)
    rig = Rig(m)
    rig.silent = True
    got: dict[int, Any] = {}
    told: dict[int, int] = {}
    ops: list[Any] = [("scan", 10, 30), ("get", (12,)), ("get", (14,)), ("scan", 40, 50)]

    def done(op: Any, gather: Any) -> None:
        i = ops.index(op)
        told[i] = told.get(i, 0) + 1
        got[i] = "refused" if gather.refused else rig.core.result(gather)

    _, fx = rig.core.read_batch(ops, "snapshot", done, 0.0, bundle=8)
    rig.run(fx)
    (sub,) = rig.submitted
    reads = msgpack.unpackb(sub.payload, use_list=False)
    assert [op[0] for op, _ in reads] == ["scan", "get", "get", "scan"]
    r1, r2 = reads[1][1], reads[2][1]
    rid = sub.header[H.REQUEST]
    k = (2, 20)
    src = _holder(m, 10)  # of keys 10 to 50 (segment 0, f = 3)
    first = ((0, (((2, 10), k),), [(10, "a")], None), (1, r1, {12: "x"}, None))
    rig.run(rig.core.on_direct(src, Answers(rid, 7, True, first), 0.0))
    assert got == {1: {12: "x"}}  # the scan has half of what it reads
    second = (
        (0, ((k, (2, 30)),), [(20, "b")], None),
        (1, r1, {12: "replica"}, None),  # read 1 is complete: not told again
        (2, r2, {}, None),
        (3, (((2, 40), (2, 45)),), [], None),
    )
    rig.run(rig.core.on_direct(src, Answers(rid, 7, True, second), 0.0))
    assert got == {0: [(10, "a"), (20, "b")], 1: {12: "x"}, 2: {}}
    # The rest of read 3 from another frontier: not one consistent cut.
    third = ((3, (((2, 45), (2, 50)),), [], None),)
    rig.run(rig.core.on_direct(src, Answers(rid, 8, True, third), 0.0))
    assert got[3] == "refused"
    assert told == {0: 1, 1: 1, 2: 1, 3: 1}
    assert _left(rig) == ({}, {}, {})


def test_a_batch_that_cannot_be_encoded_raises_and_leaves_nothing_behind() -> None:
    m = Model(f=3).ring_of(4)
    rig = Rig(m)
    told: list[Any] = []
    core = rig.core
    real_packer = core._packer

    class SecondFails:
        """The second bundle's payload cannot be encoded."""

        calls = 0

        def pack(self, obj: Any) -> bytes:
            self.calls += 1
            if self.calls == 2:
                raise TypeError("cannot encode")
            return real_packer.pack(obj)

    core._packer = SecondFails()  # type: ignore[assignment]
    ops = [("get", (k,)) for k in range(0, 400, 5)]
    with pytest.raises(TypeError):
        core.read_batch(ops, "snapshot", lambda op, g: told.append(op), 0.0, bundle=8)
    assert core._packer.calls == 2  # type: ignore[attr-defined]
    assert rig.submitted == [] and _left(rig) == ({}, {}, {})
    rig.tick(10.0)  # past every deadline: nothing is told
    assert told == []


@pytest.mark.parametrize("level", ["sequential", "snapshot"])
def test_a_batch_whose_messages_e_cast_refuses_tells_each_read_why(level: str) -> None:
    from ecast import ClosedError

    m = Model(f=3).ring_of(4)
    rig = Rig(m, answer_timeout=0.2)
    rig.silent = True
    told: list[Any] = []
    ops = [("get", (k,)) for k in range(0, 400, 5)]
    _, fx = rig.core.read_batch(ops, level, lambda op, g: told.append((op, g)), 0.0, bundle=8)
    rig.run(fx)
    for s in rig.submitted:
        rig.run(rig.core.on_rejected(s.token, ClosedError("the client was closed"), 0.0))
    assert sorted(op for op, _ in told) == sorted(ops)
    assert all("ClosedError" in g.error for _, g in told)
    assert _left(rig) == ({}, {}, {})
    rig.tick(1.0)
    assert len(told) == len(ops)  # told once: not timed out as well


@pytest.mark.parametrize("grouped", [False, True])
def test_a_bundle_refused_whole_is_told_as_one_group(grouped: bool) -> None:
    """A storage process's refusal of a whole bundle (one answer naming the bundle)
    finishes every read of it: one call for a grouped caller, one per read otherwise."""
    m = Model(f=3).ring_of(4)
    rig = Rig(m)
    rig.silent = True
    calls: list[list[Any]] = []
    ops = [("get", (k,)) for k in range(16)]
    done = calls.append if grouped else (lambda op, g: calls.append([(op, g)]))
    _, fx = rig.core.read_batch(ops, "snapshot", done, 0.0, bundle=16, grouped=grouped)
    rig.run(fx)
    bundles = [s.header[H.REQUEST] for s in rig.submitted if H.COUNT in s.header]
    for rid in bundles:
        rig.run(rig.core.on_direct(_holder(m, 0), Answer(rid, None, None, None, 1, False), 0.0))
    told = [pair for call in calls for pair in call]
    assert bundles and _left(rig) == ({}, {}, {})
    assert sorted(op[1][0] for op, _ in told) == list(range(16))
    assert len(told) == 16 and all(g is not None and g.refused for _, g in told)
    assert len(calls) == (len(bundles) if grouped else 16)


def test_read_done_names_the_request_a_caller_awaits() -> None:
    m = Model(f=3).ring_of(2)
    m.write(("put", ((1, "a"),)))
    m.settle()
    rig = Rig(m)
    rid = rig.read(("get", (1,)), "sequential")
    assert rig.until_done(rid) == ReadDone(rid, {1: "a"}, None, m.t)  # at its own position


def test_a_read_reports_where_in_the_order_it_was_answered() -> None:
    """Sequential: its own position; snapshot: the last position before the frontier it
    was cut at; basic: none.  A change feed from a read's position has exactly the
    writes after what it saw."""
    m = Model(f=3).ring_of(4)
    m.write(("put", ((1, "a"),)))
    m.settle()
    rig = Rig(m)
    seq = rig.until_done(rig.read(("get", (1,)), "sequential"))
    assert seq.result == {1: "a"} and seq.position == m.t
    m.write(("put", ((1, "b"),)))
    m.settle()
    snap = rig.until_done(rig.read(("get", (1,)), "snapshot"))
    assert snap.result == {1: "b"} and snap.position == m.t  # the put of "b" is the last
    basic = rig.until_done(rig.read(("get", (1,)), "basic"))
    assert basic.result == {1: "b"} and basic.position is None
    feed = rig.until_done(rig.read(Changes(seq.position), "sequential")).result
    assert [e.changes for e in feed.events] == [((1, "put", "b"),)]
    m.write(("put", ((1, "c"),)))
    m.settle()
    feed = rig.until_done(rig.read(Changes(snap.position), "sequential")).result
    assert [e.changes for e in feed.events] == [((1, "put", "c"),)]  # after what it saw


def test_a_batch_of_basic_reads_nobody_answers_times_out_once_at_its_deadline() -> None:
    """A batch's basic reads share one deadline and one timer: each read is told once,
    timed out (``None``), when it passes, and nothing of the batch is left behind; reads
    answered before it are not told again."""
    m = Model(f=3).ring_of(4)
    m.write(("put", ((3, "c"),)))
    m.settle()
    rig = Rig(m)
    told: list[tuple[Any, Any]] = []
    ops = [("get", (k,)) for k in (3, 150, 250, 350)]
    rig.silent = True
    _, fx = rig.core.read_batch(ops, "basic", lambda op, g: told.append((op, g)), 0.0, timeout=2.0)
    rig.run(fx)
    assert len(rig.core._timers) == 1
    rid = min(rig.core.batch_reads)
    holder = next(iter(rig.core.asked[rid]))
    rig.run(
        rig.core.on_direct(holder, Answer(rid, None, {3: "c"}, None, m.config.version, True), 0.5)
    )
    assert [op for op, _ in told] == [ops[0]]
    rig.run(rig.core.on_tick(1.9))
    assert len(told) == 1
    rig.run(rig.core.on_tick(2.0))
    assert sorted(op[1][0] for op, _ in told) == [3, 150, 250, 350]
    assert [g for _, g in told[1:]] == [None, None, None]
    assert _left(rig) == ({}, {}, {}) and not rig.core._timers and not rig.core._basic_groups


NOTHING_MATCHES = [
    [("id", "=", 1), ("id", "=", 2)],
    [("id", "<", 18934), ("id", ">", 58621)],
    [("id", "in", [])],
    [("id", "is null")],  # a key is never null
]


@pytest.mark.parametrize("where", NOTHING_MATCHES)
@pytest.mark.parametrize("level", ["sequential", "snapshot", "basic"])
def test_a_query_that_can_match_nothing_is_answered_at_once_as_sql_would(
    where: Any, level: str
) -> None:
    """Key predicates that contradict each other name no range: the answer is known
    without asking anyone (no rows, a count of 0, zero rows changed), alone or in a
    batch, and nothing is sent for it (a message routed nowhere was a ``BadOperation``
    for reads and an ``Unavailable`` for writes, which a caller would retry for ever)."""
    m = Model(f=3).ring_of(4)
    rig = Rig(m)
    ops = ScanOps({"t": "id"})
    rig.core.ops = ops
    select = ops.select("t", where, ["id", "v"])
    count = ops.select("t", where, agg=[("count", "*")])
    rid, fx = rig.core.read(select, level, 0.0)
    rid2, fx2 = rig.core.read(count, level, 0.0)
    assert fx.deliver == [ReadDone(rid, {"columns": ["id", "v"], "data": [[], []]}, None)]
    assert fx2.deliver == [ReadDone(rid2, {"columns": ["count(*)"], "values": [0]}, None)]
    assert not fx.send and not fx2.send
    for write in (ops.update("t", where, {"v": "x"}), ops.delete("t", where)):
        wid, wfx = rig.core.write(write, 0.0)
        assert wfx.deliver == [WriteDone(wid, None)] and not wfx.send
    batch, bfx = rig.core.write_batch([ops.delete("t", where), ops.delete("t", where)], 0.0)
    assert [d for d in bfx.deliver] == [WriteDone(r, None) for _, r in batch]
    told: list[Any] = []
    sent, rfx = rig.core.read_batch([select, count], level, told.append, 0.0, grouped=True)
    assert sent == 0 and not rfx.deliver and not rfx.send
    assert [rig.core.result(g) for _, g in told[0]] == [
        {"columns": ["id", "v"], "data": [[], []]},
        {"columns": ["count(*)"], "values": [0]},
    ]
    assert _left(rig) == ({}, {}, {}) and not rig.core.writes


def test_a_write_of_many_keys_names_one_hull_per_ring_piece_and_reaches_the_same_holders() -> None:
    """Past ``EXACT_RANGES`` keys a header names one range per piece of the ring (the
    routers' cost grows with the ranges a header names: a write of 200 keys went about
    twice as fast so): the destinations are those of the exact ranges, and each holder
    stores only its own keys."""
    m = Model(f=3).ring_of(6)
    rig = Rig(m)
    keys = [k * 37 for k in range(EXACT_RANGES * 3)]
    op = ("put", tuple((k, k) for k in keys))
    exact = rig.core.ops.part_fun(op, m.placement).ranges
    rid, fx = rig.core.write(op, 0.0)
    rig.run(fx)
    (sub,) = rig.submitted
    named = sub.header[H.WRITES]
    assert len(exact) > EXACT_RANGES and len(named) <= len(m.storage)
    keyspace = next(iter(m.storage.values())).keyspace
    assert keyspace.write_set(named) == keyspace.write_set(exact)
    assert rig.until_done(rid) == WriteDone(rid, None)
    for name, core in m.storage.items():
        mine = core.keyspace.partition(name)
        want = {k for k in keys if any(lo <= m.placement.ekey(k) < hi for lo, hi in mine)}
        assert set(dict(core.engine.items())) == want, name


def test_a_write_and_a_read_of_more_keys_than_a_header_may_name_go_through() -> None:
    """A header names at most ``MAX_RANGES`` ranges (the routers refuse more): a
    ``put_many`` of 5,000 keys names one range per piece of the ring instead, reaches the
    same holders in one message (atomic, as documented), and each holder stores only its
    own keys; a ``get`` of all of them reads every one back."""
    m = Model(f=3).ring_of(4)
    rig = Rig(m)
    keys = [k * 7 for k in range(5000)]
    rid, fx = rig.core.write(("put", tuple((k, f"v{k}") for k in keys)), 0.0)
    rig.run(fx)
    (sub,) = rig.submitted
    assert 0 < len(sub.header[H.WRITES]) <= MAX_RANGES
    assert rig.until_done(rid) == WriteDone(rid, None)
    for name, core in m.storage.items():
        held = dict(core.engine.items())
        mine = core.keyspace.partition(name)
        assert held and all(any(lo <= m.placement.ekey(k) < hi for lo, hi in mine) for k in held)
    rid = rig.read(("get", tuple(keys)), "sequential")
    done = rig.until_done(rid)
    assert done.error is None and done.result == {k: f"v{k}" for k in keys}
