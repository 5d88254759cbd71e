"""Credentials, the handshake and admission by role, driven without sockets."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from ecast.core.config import BroadcastConfig, restore_config
from ecast.core.effects import UnexpectedMessage
from ecast.core.endpoint import Endpoint
from ecast.core.message import Message
from ecast.core.proto import Deliver, Leader, Suspected
from ecast.core.roles import ANY, APPLICATION, ROUTER
from ecast.core.router import Router
from ecast.core.ufabcast import Ufabcast
from ecast.core.ufabcast.messages import (
    Accept,
    AppCmd,
    CatchUpRequest,
    Commit,
    JoinRequest,
    Prepare,
    Snapshot,
    View,
)
from ecast.runtime.handshake import (
    DEVELOPMENT,
    MAX_HANDSHAKE_FRAME,
    PROTOCOL_VERSION,
    CredentialAuth,
    Handshake,
    HandshakeError,
    PeerInfo,
    SecretAuth,
)
from ecast.security.credentials import (
    CertificateAuthority,
    Credential,
    CredentialError,
    check_pattern,
    covers,
)
from ecast.security.secret import secret_problem, strong_secret
from ecast.tools.credentials_cli import main as credentials_main
from ecast.wire.codec import DecodeError

SECRET = b"unit-test-3b9d5e7f1a2c4e6a8b0d2f4a6c8e0a2c"


# ------------------------------------------------------------------ credentials
def test_name_patterns_are_exact_names_or_prefixes() -> None:
    assert covers(("client:spark-*",), "client:spark-7")
    assert covers(("client:spark-*",), "client:spark-")
    assert not covers(("client:spark-*",), "client:spar")
    assert covers(("alice", "bob"), "bob") and not covers(("alice",), "alice2")
    for bad in ("", "@routers", "a*b", "with space", "x" * 201, "tab\tname", 7):
        with pytest.raises(CredentialError):
            check_pattern(bad)


def test_a_certificate_verifies_only_against_its_ca_unaltered_unexpired_unrevoked() -> None:
    ca, other = CertificateAuthority.create(), CertificateAuthority.create()
    cred = ca.issue(APPLICATION, ["client:*"], expires=int(time.time()) + 60)
    cert = ca.authority().verify(cred.certificate.encoded)
    assert cert.role == APPLICATION and cert.names == ("client:*",) and cert.covers("client:x")
    with pytest.raises(CredentialError, match="not signed by this cluster's CA"):
        other.authority().verify(cred.certificate.encoded)
    body, sig = msgpack.unpackb(cred.certificate.encoded, use_list=False)
    forged = msgpack.packb([body.replace(b"client:*", b"*\x00\x00\x00\x00\x00\x00\x00"), sig])
    with pytest.raises(CredentialError):
        ca.authority().verify(forged)
    with pytest.raises(CredentialError, match="expired"):
        ca.authority().verify(cred.certificate.encoded, now=time.time() + 3600)
    with pytest.raises(CredentialError, match="revoked"):
        ca.authority(frozenset({cert.serial})).verify(cred.certificate.encoded)
    for junk in (b"", b"\xc1", msgpack.packb([1, 2]), b"x" * 5000, "text"):
        with pytest.raises(CredentialError):
            ca.authority().verify(junk)


def test_credential_files_are_private_and_refused_when_others_can_read_them(
    tmp_path: Path,
) -> None:
    ca = CertificateAuthority.create()
    path = tmp_path / "r1.cred"
    ca.issue(ROUTER, ["r1", "r1.*"]).save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cred = Credential.load(path)
    assert cred.role == ROUTER and cred.names == ("r1", "r1.*")
    path.chmod(0o644)
    with pytest.raises(CredentialError, match="can be read by others"):
        Credential.load(path)
    path.chmod(0o600)
    with pytest.raises(CredentialError, match="revoked"):
        Credential.load(path, frozenset({cred.certificate.serial}))


def test_the_credentials_command_issues_shows_and_revokes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = tmp_path / "ca.json"
    assert credentials_main(["init", "--ca", str(ca)]) == 0
    assert credentials_main(["init", "--ca", str(ca)]) == 2  # never replaced by accident
    out = tmp_path / "spark.cred"
    argv = ["issue", "--ca", str(ca), "--role", "application", "--name", "client:spark-*"]
    assert credentials_main([*argv, "--expires", "30d", "--out", str(out)]) == 0
    capsys.readouterr()
    assert credentials_main(["show", str(out), "--json"]) == 0
    shown = capsys.readouterr().out
    assert '"role": "application"' in shown and "client:spark-*" in shown
    serial = Credential.load(out).certificate.serial
    revoked = tmp_path / "revoked.txt"
    assert credentials_main(["revoke", "--list", str(revoked), serial]) == 0
    assert serial in revoked.read_text()
    assert credentials_main([*argv, "--expires", "soon", "--out", str(out)]) == 2
    assert credentials_main(["secret"]) == 0
    assert secret_problem(capsys.readouterr().out.strip().encode()) is None


def test_weak_secrets_are_refused_with_the_way_to_make_a_strong_one() -> None:
    for weak in (b"change-me", b"integration-secret", b"a" * 64, b"password123password"):
        problem = secret_problem(weak)
        assert problem and "ecast credentials secret" in problem
    assert secret_problem(strong_secret().encode()) is None
    assert secret_problem(os.urandom(16).hex().encode()) is None


# ------------------------------------------------------------------ the handshake
def pair(
    dialer_auth: Any,
    acceptor_auth: Any,
    *,
    refuse: str | None = None,
    listen: str | None = "127.0.0.1:7001",
) -> tuple[Handshake, Handshake, list[PeerInfo]]:
    checked: list[PeerInfo] = []

    def check(peer: PeerInfo) -> str | None:
        checked.append(peer)
        return refuse

    d = Handshake(True, dialer_auth, "client-1", 10, None, check)
    a = Handshake(False, acceptor_auth, "r1", 20, listen, check)
    return d, a, checked


def run(d: Handshake, a: Handshake) -> None:
    to_a = [d.start()]
    while to_a:
        to_d = [out for m in to_a for out in a.receive(m)]
        to_a = [out for m in to_d for out in d.receive(m)]


def test_both_sides_agree_on_identities_and_keys_with_credentials() -> None:
    ca = CertificateAuthority.create()
    client = CredentialAuth(ca.issue(APPLICATION, ["client-*"]))
    router = CredentialAuth(ca.issue(ROUTER, ["r1"]))
    d, a, _ = pair(client, router)
    run(d, a)
    assert d.done and a.done
    assert a.peer is not None and a.peer.identity.role == APPLICATION
    assert a.peer.host == "client-1" and a.peer.incarnation == 10
    assert d.peer is not None and d.peer.identity.role == ROUTER
    assert d.peer.listen == "127.0.0.1:7001"
    assert d.keys is not None and a.keys is not None
    assert d.keys.send == a.keys.receive and d.keys.receive == a.keys.send
    assert d.keys.send != d.keys.receive
    assert a.peer.key != "client-1"  # qualified by the credential


def test_the_development_secret_proves_only_one_of_us() -> None:
    d, a, _ = pair(SecretAuth(SECRET), SecretAuth(SECRET))
    run(d, a)
    assert a.peer is not None and a.peer.identity == DEVELOPMENT
    assert a.peer.identity.role == ANY and a.peer.identity.covers("anyone")


def test_the_acceptor_proves_nothing_and_records_nothing_before_the_dialer_proved() -> None:
    d, a, checked = pair(SecretAuth(b"x" + SECRET), SecretAuth(SECRET))
    [challenge] = a.receive(d.start())
    fields = msgpack.unpackb(challenge)
    assert fields[0] == "challenge" and len(fields) == 7  # no MAC, no signature in it
    assert checked == []  # nothing about the peer was recorded yet
    [proof] = d.receive(challenge)
    with pytest.raises(HandshakeError, match="wrong secret"):
        a.receive(proof)
    assert checked == [] and not a.done and a.keys is None


def test_modes_do_not_mix_and_other_cas_are_refused() -> None:
    ca, other = CertificateAuthority.create(), CertificateAuthority.create()
    router = CredentialAuth(ca.issue(ROUTER, ["r1"]))
    for dialer, match in (
        (SecretAuth(SECRET), "requires a credential"),
        (CredentialAuth(other.issue(ROUTER, ["r1"])), "not signed by this cluster's CA"),
    ):
        d, a, checked = pair(dialer, router)
        with pytest.raises(HandshakeError, match=match):
            run(d, a)
        assert checked == []
    d, a, _ = pair(router, SecretAuth(SECRET))
    with pytest.raises(HandshakeError, match="presented a credential"):
        run(d, a)


def test_the_proof_covers_version_listen_address_and_everything_introduced() -> None:
    """A hello altered on the way (here: its listen address) fails the dialer's proof."""
    ca = CertificateAuthority.create()
    d = Handshake(True, CredentialAuth(ca.issue(ROUTER, ["r2"])), "r2", 5, "10.0.0.2:7002",
                  lambda p: None)  # fmt: skip
    a = Handshake(False, CredentialAuth(ca.issue(ROUTER, ["r1"])), "r1", 6, None, lambda p: None)
    hello = msgpack.unpackb(d.start())
    hello[4] = "10.6.6.6:7002"
    [challenge] = a.receive(msgpack.packb(hello))
    [proof] = d.receive(challenge)
    with pytest.raises(HandshakeError, match="no valid signature"):
        a.receive(proof)


def test_the_owner_refuses_a_proven_peer_before_this_side_proves() -> None:
    d, a, checked = pair(SecretAuth(SECRET), SecretAuth(SECRET), refuse="stale incarnation")
    [challenge] = a.receive(d.start())
    [proof] = d.receive(challenge)
    with pytest.raises(HandshakeError, match="stale incarnation"):
        a.receive(proof)
    assert len(checked) == 1 and not a.done


def hello(**override: Any) -> bytes:
    fields = {
        "kind": "hello",
        "version": PROTOCOL_VERSION,
        "host": "x",
        "inc": 1,
        "listen": None,
        "nonce": b"n" * 32,
        "eph": b"e" * 32,
    }
    fields.update(override)
    return msgpack.packb(list(fields.values()), use_bin_type=True)


@pytest.mark.exclusive  # a wall-clock bound: a starved process would miss it
@pytest.mark.parametrize(
    "override",
    [
        {"nonce": 2**30},
        {"nonce": 2**62},
        {"eph": 10**9},
        {"nonce": b"short"},
        {"inc": 2**64 - 1},
        {"inc": -1},
        {"inc": "7"},
        {"version": "8"},
        {"version": PROTOCOL_VERSION + 1},
        {"host": ""},
        {"host": "x" * 300},
        {"host": "new\nline"},
        {"host": 5},
        {"listen": "nowhere"},
        {"listen": "h:99999"},
        {"listen": ["a"]},
    ],
)
def test_every_hello_field_has_an_exact_type_and_length(override: dict[str, Any]) -> None:
    a = Handshake(False, SecretAuth(SECRET), "r1", 1, None, lambda p: pytest.fail("recorded"))
    t0 = time.perf_counter()
    with pytest.raises(HandshakeError):
        a.receive(hello(**override))
    assert time.perf_counter() - t0 < 0.05  # never bytes(n) of a number it was sent


def test_oversized_and_out_of_turn_handshake_messages_are_refused() -> None:
    a = Handshake(False, SecretAuth(SECRET), "r1", 1, None, lambda p: None)
    with pytest.raises(DecodeError):
        a.receive(msgpack.packb(["hello", b"x" * MAX_HANDSHAKE_FRAME]))
    for msg in (["proof", None, b"x" * 32], ["challenge"], ["ready"], [1, 2], {"a": 1}):
        with pytest.raises((HandshakeError, DecodeError)):
            a.receive(msgpack.packb(msg))


# ------------------------------------------------------------------ admission in the cores
def roles(table: dict[str, str]) -> Any:
    return lambda peer: table.get(peer)


def test_a_router_takes_ufabcast_messages_only_from_router_credentials() -> None:
    r = Router("r1", BroadcastConfig.initial(), routers=["r1"],
               role_of=roles({"evil": APPLICATION, "r2": ROUTER}))  # fmt: skip
    r.on_tick(0.0)
    for msg in (JoinRequest(), Prepare(0, (5, "evil"), 0), Commit(0, (5, "evil"), 0, 9, 0)):
        with pytest.raises(UnexpectedMessage, match="router credential"):
            r.on_message("evil", msg, 0.1)
    assert r.ufab.view is not None and r.ufab.view.members == ("r1",)
    assert r.stats["refused_not_router"] == 3
    r.on_message("r2", JoinRequest(), 0.2)  # a router credential may ask to join
    assert r.ufab.view.members == ("r1", "r2")


def test_consensus_messages_of_the_current_view_count_only_from_its_members() -> None:
    u = Ufabcast("r2", members=["r1", "r2", "r3"])
    u.on_tick(0.0)
    value = (AppCmd("evil", 1, ("x",)),)
    u.on_message("r9", Accept(0, (9, "r9"), 0, value), 0.1)
    u.on_message("r9", Commit(0, (9, "r9"), 0, 0, -1), 0.1)
    u.on_message("r9", Prepare(0, (9, "r9"), 0), 0.1)
    acc = u.acc[0]
    assert 0 not in acc.accepted and acc.promised < (9, "r9") and u.executed == -1
    assert u.stats["ignored_non_member"] == 3
    fx = u.on_message("r9", CatchUpRequest(0), 0.2)
    assert fx.send == []  # the log (and a snapshot) only for members


def test_a_snapshot_counts_only_when_asked_for_and_from_the_right_router() -> None:
    joiner = Ufabcast("r4", seeds=["r1"])
    snap = Snapshot(5, View(1, ("evil", "r4"), 6), (), (), (), "state")
    joiner.on_message("evil", snap, 0.0)  # not asked yet
    assert not joiner.installed
    joiner.on_tick(0.0)  # sends its JoinRequest
    joiner.on_message("evil", Snapshot(5, View(1, ("evil",), 6), (), (), (), "s"), 0.1)
    assert not joiner.installed  # a view without the joiner in it
    u = Ufabcast("r2", members=["r1", "r2", "r3"])
    u.on_tick(0.0)
    u.on_message("r1", Snapshot(10**6, View(10**6, ("r1", "r2"), 0), (), (), (), "x"), 0.1)
    assert u.view is not None and u.view.number == 0 and u.next_exec == 0  # never asked


def test_an_endpoint_takes_router_messages_only_from_router_credentials() -> None:
    table = {"r1": ROUTER, "r5": ROUTER, "mallory": APPLICATION}
    ep = Endpoint("alice", ["r1"], role_of=roles(table))
    msg = Message("bob", (("bob", 0, ""), 1), None, b"hi")
    for bad in (Deliver(((0, msg),)), Leader(9, ("mallory",)), Suspected()):
        with pytest.raises(UnexpectedMessage, match="router credential"):
            ep.on_message("mallory", bad, 0.0)
    ep.on_message("r5", Leader(9, ("r5",)), 0.0)  # a router it does not know: not steered
    ep.on_message("r5", Suspected(), 0.0)
    assert ep.target == "r1" and ep.terminated is None and ep.ignored_unknown_router == 2
    ep.on_message("r1", Leader(9, ("r5", "r1")), 0.0)  # a known router names r5
    assert ep.target == "r5" and "r5" in ep.known_routers


def test_a_snapshot_may_name_only_the_config_class_this_router_runs() -> None:
    state = BroadcastConfig.initial().to_state()
    before = set(sys.modules)
    with pytest.raises(ValueError, match="this router runs"):
        restore_config("this:X", state, BroadcastConfig)
    with pytest.raises(ValueError, match="this router runs"):
        restore_config("ecast.core.config:KeyRingConfig", state, BroadcastConfig)
    assert set(sys.modules) == before  # nothing was imported
    assert isinstance(restore_config("ecast.core.config:BroadcastConfig", state,
                                     BroadcastConfig), BroadcastConfig)  # fmt: skip


# ------------------------------------------------------------------ the runtime's tables
class FakeConn:
    def __init__(self, role: str, names: tuple[str, ...], listen: str | None = None) -> None:
        from ecast.runtime.handshake import Identity

        self.peer = PeerInfo("h-" + names[0], 1, listen, Identity(role, names, "s" + names[0]))
        self.nodes: dict[str, int] = {}
        self.ready: set[tuple[str, str]] = set()
        self.announced = False
        self.state = "open"


def runtime() -> Any:
    import asyncio

    from ecast.runtime import Runtime

    rt = Runtime(CredentialAuth(CertificateAuthority.create().issue(ROUTER, ["r1"])))
    rt._loop = asyncio.new_event_loop()
    return rt


def test_a_connection_may_announce_only_the_names_its_credential_covers() -> None:
    from ecast.runtime.mux import ProtocolViolation

    rt = runtime()
    mallory = FakeConn(APPLICATION, ("mallory",))
    with pytest.raises(ProtocolViolation, match="not covered"):
        rt._on_nodes(mallory, (("alice", 2**62),))
    assert "alice" not in rt.routes
    r2 = FakeConn(ROUTER, ("r2", "*"))
    rt._on_nodes(r2, (("r2", 5),))
    anyone = FakeConn(APPLICATION, ("*",))  # an application credential that covers r2
    with pytest.raises(ProtocolViolation, match="router credential"):
        rt._on_nodes(anyone, (("r2", 6),))
    assert rt.routes["r2"] is r2 and rt.role_of("r2") == ROUTER
    rt._loop.close()


def test_directories_come_only_from_routers_and_never_override_announcements() -> None:
    rt = runtime()
    r2 = FakeConn(ROUTER, ("r2",), listen="127.0.0.1:7002")
    app = FakeConn(APPLICATION, ("app",))
    rt._on_nodes(r2, (("r2", 1),))
    rt._on_nodes(app, (("app", 1),))
    rt.directory_from("app", (("r3", "10.6.6.6:1"),))
    assert "r3" not in rt.directory and rt.stats["directories_ignored"] == 1
    rt.directory_from("r2", (("r2", "10.6.6.6:1"), ("r3", "127.0.0.1:7003"), ("r4", "junk")))
    assert rt.directory["r2"] == "127.0.0.1:7002"  # what r2's own process said
    assert rt.directory["r3"] == "127.0.0.1:7003" and "r4" not in rt.directory
    rt.directory_from("r2", tuple((f"n{i}", "127.0.0.1:1") for i in range(10_000)))
    assert "n1" not in rt.directory  # too large a message
    rt._loop.close()


def test_a_closed_connection_forgets_its_nodes_with_or_without_a_listen_address() -> None:
    """A process that does not listen (most clients) once made closing its connection
    raise KeyError, leaving the connection half forgotten."""
    rt = runtime()
    app = FakeConn(APPLICATION, ("app",))
    r2 = FakeConn(ROUTER, ("r2",), listen="127.0.0.1:7002")
    rt._on_nodes(app, (("app", 1),))
    rt._on_nodes(r2, (("r2", 1),))
    for conn in (app, r2):
        rt.conns[conn.peer.key] = conn
        rt._forget_conn(conn)
        assert conn.peer.key not in rt.conns and not conn.ready
    assert "app" not in rt.routes and "r2" not in rt.routes
    assert "r2" not in rt._announced_at  # gossip may tell where it went
    rt._loop.close()


class _Accepted:
    """An accepted connection as ``Runtime.admit`` sees it: its peer address."""

    def __init__(self, address: str) -> None:
        self.transport = self
        self.address = address
        self.source = ""
        self.closed: str | None = None

    def get_extra_info(self, name: str) -> Any:
        return (self.address, 40000) if name == "peername" else None

    def close(self, reason: str) -> None:
        self.closed = reason


def test_handshake_caps_per_source_and_in_all() -> None:
    """Probe: one source address holding 140 handshakes open, reopened as they timed
    out, locked out every legitimate client."""
    rt = runtime()
    rt.max_handshakes, rt.max_handshakes_per_source = 4, 3
    flood = [_Accepted("10.0.0.1") for _ in range(4)]
    assert all(rt.admit(c) is None for c in flood[:3])  # type: ignore[arg-type]
    assert "from 10.0.0.1" in (rt.admit(flood[3]) or "")  # type: ignore[arg-type]
    assert rt.pre_auth_timeout() == 1.0  # under pressure: at most a second to prove oneself
    b, c, d = _Accepted("10.0.0.2"), _Accepted("10.0.0.3"), _Accepted("10.0.0.3")
    assert rt.admit(b) is None  # type: ignore[arg-type]  # the last free slot
    assert rt.admit(c) is None  # type: ignore[arg-type]  # the heaviest source's oldest goes
    assert flood[0].closed is not None and "10.0.0.1" in flood[0].closed
    assert flood[1].closed is None and rt.stats["handshakes_evicted"] == 1
    assert "handshake" in (rt.admit(d) or "")  # type: ignore[arg-type]  # 2 against 2: no
    rt.handshake_over(flood[1])  # type: ignore[arg-type]
    assert rt.admit(d) is None  # type: ignore[arg-type]
    for conn in (flood[2], b, c, d):
        rt.handshake_over(conn)  # type: ignore[arg-type]
    assert rt.pre_auth_timeout() == rt.handshake_timeout and not rt._handshakes_from
    rt._loop.close()


def test_a_weak_development_secret_cannot_make_a_runtime() -> None:
    from ecast.runtime import Runtime

    with pytest.raises(ValueError, match="too weak"):
        Runtime(b"change-me")


def test_a_process_cannot_run_a_node_its_credential_does_not_cover() -> None:
    rt = runtime()
    with pytest.raises(ValueError, match="covers only r1"):
        rt.add_node("r2", Endpoint("r2", ["r1"]))
    rt._loop.close()


def test_a_name_moves_to_its_next_process_and_only_under_a_covering_credential() -> None:
    """A listening process stops and a new one starts under its name: the routers'
    gossip, set aside while the old one's own announcement stood, is where to look, the
    stopped incarnation may not come back, and the name still needs a covering
    credential."""
    from ecast.runtime.mux import ProtocolViolation
    from ecast.wire.packet import Gone

    rt = runtime()
    local = rt.add_node("r1", object())  # type: ignore[arg-type]
    r2 = FakeConn(ROUTER, ("r2",), listen="127.0.0.1:7002")
    rt._on_nodes(r2, (("r2", 1),))
    old = FakeConn(APPLICATION, ("client:*",), listen="127.0.0.1:8001")
    rt._on_nodes(old, (("client:b", 5),))
    local.link.on_connected("client:b", 5, 0, 0.0)
    rt.directory_from("r2", (("client:b", "127.0.0.1:8002"),))  # a new process, told early
    assert rt.directory["client:b"] == "127.0.0.1:8001"  # the announcement still stands
    rt._control(old, Gone(("client:b",)))
    assert rt.directory["client:b"] == "127.0.0.1:8002" and "client:b" not in rt.routes
    assert local.link.ended_incarnation("client:b") == 5
    stale = FakeConn(APPLICATION, ("client:*",), listen="127.0.0.1:8003")
    with pytest.raises(ProtocolViolation, match="stopped"):
        rt._on_nodes(stale, (("client:b", 5),))
    mallory = FakeConn(APPLICATION, ("mallory",), listen="127.0.0.1:8004")
    with pytest.raises(ProtocolViolation, match="not covered"):
        rt._on_nodes(mallory, (("client:b", 6),))
    new = FakeConn(APPLICATION, ("client:*",), listen="127.0.0.1:8002")
    rt._on_nodes(new, (("client:b", 6),))
    assert rt.routes["client:b"] is new and rt.directory["client:b"] == "127.0.0.1:8002"
    # Its connection drops without a word: gossip told of no other address, so the
    # announced one stays where to redial.
    rt._forget_conn(new)
    assert rt.directory["client:b"] == "127.0.0.1:8002" and "client:b" not in rt._announced_at
    rt._loop.close()
