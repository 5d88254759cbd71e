"""Every exception the SDK raises, and when (``docs/sdk.md`` lists them for users)."""

from __future__ import annotations


class Error(Exception):
    """Base of every E-Cast error."""


class InvalidName(Error, ValueError):
    """A process name that cannot be used (empty, too long, or starting with ``@``)."""


class InvalidMessage(Error, TypeError):
    """A payload or header the routers would refuse: not encodable, a reserved header key,
    or a header that is not a dict."""


class MessageTooLarge(Error, ValueError):
    """A message larger than the routers accept (``ecast router --max-frame``)."""


class Backpressure(Error):
    """``submit_nowait`` found too many messages already queued (``max_queued``)."""


class ClosedError(Error):
    """The client was closed (or detached): nothing more can be submitted."""


class SuspectedError(ClosedError):
    """The group declared this process faulty (its lease ran out, or a peer suspected it);
    it stops for good and never resumes.  A new process takes a new name."""


class NameRetiredError(Error):
    """The name belonged to a process that left; names are unique for ever."""


class Unavailable(Error, ConnectionError):
    """No router could be reached (for ``unavailable_after`` seconds, or at connect)."""


class AuthenticationError(Unavailable):
    """A router refused this process's secret (or this process refused the router's)."""


class NotARouterError(Unavailable):
    """The address answered, but not as an E-Cast router (an HTTP server, say)."""


class SessionClosedError(Error):
    """The message's session was closed (``close_sessions``): it was not and will not be
    routed."""


class ForbiddenError(Error, PermissionError):
    """This process's credential does not cover the namespace of the session it submits
    in (or closes), or the namespace is reserved (``@...``): nothing was routed or closed.
    Unlike :class:`SessionClosedError` this says nothing about the session: whoever owns
    it goes on.  Not worth retrying with the same credential."""


class PartFailedError(ClosedError):
    """``close()`` could not get this process's part delivered in time: the group may
    still count it as a member until its lease runs out."""
