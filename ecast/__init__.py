"""E-Cast: dynamic, uniform, causal total order multicast (dissertation chapter 3)."""

__version__ = "0.1.0"
