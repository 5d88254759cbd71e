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


def acts_as_router(role: str | None) -> bool:
    return role in (ROUTER, ANY)


def everyone_is_a_router(_peer: NodeId) -> str:
    """The role function of a core whose host checks nothing (unit tests, tools)."""
    return ANY
