"""Roles: what a peer's credential lets it do, as the sans-IO cores see it.

The runtime proves each connection's credential (``ecast.security``) and tells the cores
a peer's role through a ``role_of(peer)`` callable; the simulator wires one too.  Cores
never see keys or certificates, only these three words.
"""

from __future__ import annotations

from collections.abc import Callable

from ecast.core.effects import NodeId

ROUTER = "router"
"""May take part in ufabcast and send routers' messages to application processes."""
APPLICATION = "application"
"""An application process: submits, confirms, talks directly to other applications."""
ANY = "any"
"""A peer of the development mode (one shared secret): proven to know the secret, so it
may act in every role.  ``docs/security.md`` says what that does not protect."""

RoleOf = Callable[[NodeId], str | None]
"""A peer's role, or None if the runtime does not know the peer (any more)."""

SpeaksFor = Callable[[NodeId, str], bool | None]
"""Whether the credential ``peer`` was announced under covers ``name`` (an exact name or
a pattern of it matches), or None if the runtime does not know the peer (any more).

Sessions are named by their namespace, and a namespace is a name: a process may submit
in a session, or close sessions, only under a namespace its credential covers, so that
authority over a session is exactly authority over the name (``docs/security.md``)."""


def acts_as_router(role: str | None) -> bool:
    return role in (ROUTER, ANY)


def everyone_is_a_router(_peer: NodeId) -> str:
    """The role function of a core whose host checks nothing (unit tests, tools)."""
    return ANY


def speaks_for_anyone(_peer: NodeId, _name: str) -> bool:
    """The ``SpeaksFor`` of a core whose host checks nothing (unit tests, tools)."""
    return True


def may_use_session(speaks_for: SpeaksFor, src: NodeId, namespace: str) -> bool | None:
    """Whether application process ``src`` may submit in sessions of ``namespace``: its
    own control namespace (``"@" + src``), or a namespace its credential covers.  Every
    other ``@`` namespace belongs to the routers.  None: the peer is unknown now (its
    connection went while its frames were on their way)."""
    if namespace[:1] == "@":
        return namespace == "@" + src
    return speaks_for(src, namespace)


def may_close_sessions(speaks_for: SpeaksFor, src: NodeId, namespace: str) -> bool | None:
    """Whether application process ``src`` may close sessions of ``namespace``: one its
    credential covers.  Reserved ``@`` namespaces (control sessions, the routers' own)
    are never closed by an application, its own control namespace included: its part
    travels there."""
    if namespace[:1] == "@":
        return False
    return speaks_for(src, namespace)
