"""ecast: the command line.

  ecast router ...       run a router daemon
  ecast submit ...       submit messages to a running group
  ecast tail ...         print deliveries as JSON lines
  ecast members ...      list the group's application members
  ecast suspect ...      ask the group to declare processes faulty
  ecast credentials ...  the cluster's CA and its processes' credentials
  ecast bench ...        the benchmark, on a local cluster
  ecast cost ...         CPU time per message of each role, in one process
  ecast sim ...          run one seeded simulation
  ecast demo ...         the main job: a real local cluster runs a replicated bank
  ecast sim-demo ...     the simulated demo: the protocol under faults in virtual time

ecast COMMAND --help describes each one; ecast --version prints the version.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "--version":
        from ecast import __version__

        print(f"ecast {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("submit", "tail", "members", "suspect"):
        from ecast.tools.client_cli import main as client_main

        return client_main(command, rest)
    if command == "router":
        from ecast.tools.daemon import main as run
    elif command == "credentials":
        from ecast.tools.credentials_cli import main as run
    elif command == "bench":
        from ecast.tools.bench import main as run
    elif command == "cost":
        from ecast.tools.cost import main as run
    elif command == "sim":
        from ecast.sim.__main__ import main as run
    elif command == "demo":
        from ecast.tools.demo import main as run
    elif command == "sim-demo":
        from ecast.sim.demo import main as run
    else:
        print(f"ecast: unknown command {command!r}\n{__doc__}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
