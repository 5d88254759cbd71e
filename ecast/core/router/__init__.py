"""The E-Cast router (Algorithm 11 with 3.5): learning, forwarding, stability."""

from ecast.core.router.params import RouterParams
from ecast.core.router.router import Router
from ecast.core.router.state import RouterState

__all__ = ["Router", "RouterParams", "RouterState"]
