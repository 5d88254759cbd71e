"""E-Cast: dynamic, uniform, causal total order multicast (dissertation chapter 3).

``ecast.connect(routers, name=...)`` is the client SDK's entry point (``ecast.sdk``).
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The SDK pulls in asyncio and the runtime; the protocol cores do not need them.
    if name in ("connect", "Client", "Ack"):
        from ecast import sdk

        return getattr(sdk, name)
    raise AttributeError(name)
