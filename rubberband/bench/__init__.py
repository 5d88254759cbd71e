"""``rubberband bench EXPERIMENT``: the dissertation's experiments (4.6, 5.6) on a real
local cluster, each with its baseline in the same run.

It sits above Rubberband and the storage adapters (it runs the null, memory and scan
engines), so neither of them imports it.  Routers are separate OS processes; storage
processes and clients run as many logical processes in a few OS processes
(:mod:`rubberband.bench.pack`, :mod:`rubberband.bench.load`), since this machine has
two cores; every result records that placement.  ``docs/benchmarks.md`` has the
figures and how they compare with the dissertation's.
"""
