"""The commands: router daemon, benchmark, cost, demo, local clusters, command line."""
