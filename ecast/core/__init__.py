"""The sans-IO protocol cores: inputs in, :class:`~ecast.core.effects.Effects` out.

Nothing here reads a clock, sleeps, awaits or touches a socket; the same objects run
under the asyncio runtime and under the deterministic simulator.
"""
