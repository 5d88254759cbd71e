"""``rubberband client ... shell``: the client commands line by line on one connection.

The connection lives on an event loop in a background thread; the main thread reads
lines (with GNU readline when Python has it: history and tab completion), so Ctrl-C
interrupts the line being typed, never the client.  Each line is parsed by the same
parser as the command line and runs through the same code; only the connection flags
are the session's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from rubberband.tools.client import (
    ISOLATION,
    KV_COMMANDS,
    TABLE_COMMANDS,
    Usage,
    connect,
    execute,
    failures,
    parser,
    show,
)

HISTORY = Path.home() / ".rubberband_history"
CONNECTION = ("state_dir", "routers", "credentials", "engine")
"""Flags that name the cluster: the session's, whatever a line says."""
WORDS = (*KV_COMMANDS, *TABLE_COMMANDS, "help", "quit", "exit")
FLAGS = ("--isolation", "--key", "--where", "--columns", "--agg", "--set", "--json")
HELP = f"""commands: {" ".join(KV_COMMANDS)}
          {" ".join(TABLE_COMMANDS)}
flags:    {" ".join(FLAGS)}
          (as for rubberband client, without it and without the connection flags)
help, quit (or Ctrl-D)"""


def completions(line: str, text: str) -> list[str]:
    """What may complete ``text``, the word being typed at the end of ``line``: a
    command first, then flags, and an isolation level after ``--isolation``."""
    before = line[: len(line) - len(text)].split()
    if not before:
        return [w for w in WORDS if w.startswith(text)]
    if before[-1] == "--isolation":
        return [i for i in ISOLATION if i.startswith(text)]
    if text.startswith("-"):
        return [f for f in FLAGS if f.startswith(text)]
    return []


def _readline() -> Any:
    """GNU readline with history and completion, or ``None`` where Python lacks it."""
    try:
        import readline
    except ImportError:
        return None
    with contextlib.suppress(OSError):
        readline.read_history_file(HISTORY)
    readline.set_history_length(1000)

    def complete(text: str, state: int) -> str | None:
        found = completions(readline.get_line_buffer()[: readline.get_endidx()], text)
        return found[state] if state < len(found) else None

    readline.set_completer(complete)
    readline.set_completer_delims(" \t")
    readline.parse_and_bind("tab: complete")
    return readline


def shell(args: argparse.Namespace) -> int:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="rubberband-client", daemon=True)
    thread.start()

    def call(coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    failed = failures()
    try:
        rb, engine = call(connect(args))
    except Usage as e:
        print(f"rubberband client: {e}", file=sys.stderr)
        return 2
    except failed as e:
        print(f"rubberband client: shell: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    interactive = sys.stdin.isatty()
    rl = _readline() if interactive else None
    if interactive:
        print(f"connected to a {engine} cluster; help lists the commands, Ctrl-D leaves")
    try:
        _loop(args, lambda: input("rubberband> " if interactive else ""), call, rb, engine)
    finally:
        with contextlib.suppress(*failed):
            call(rb.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if rl is not None:
            with contextlib.suppress(OSError):
                rl.write_history_file(HISTORY)
    return 0


def _loop(
    session: argparse.Namespace,
    read: Callable[[], str],
    call: Callable[[Coroutine[Any, Any, Any]], Any],
    rb: Any,
    engine: str,
) -> None:
    failed = failures()
    lines = parser(prog="")
    while True:
        try:
            line = read()
        except EOFError:
            return
        except KeyboardInterrupt:
            print()
            continue
        try:
            words = shlex.split(line)
        except ValueError as e:
            print(f"error: {e}")
            continue
        if not words:
            continue
        if words[0] in ("quit", "exit"):
            return
        if words[0] == "help":
            print(HELP)
            continue
        try:
            args = lines.parse_intermixed_args(words)
        except SystemExit:  # argparse said what was wrong
            continue
        if args.command == "shell":
            print("error: this is the shell")
            continue
        for name in CONNECTION:
            setattr(args, name, getattr(session, name))
        try:
            show(call(execute(rb, args, engine)), args.json)
        except Usage as e:
            print(f"usage: {e}")
        except failed as e:
            print(f"{args.command}: {type(e).__name__}: {e}")
