"""The development mode's one cluster secret: how strong it must be, and how to make one.

A secret proves only "one of us": every holder may take any name and any role
(``docs/security.md``).  It is also open to offline guessing by anyone a process dials
(the dialer proves first, so a fake acceptor learns an HMAC of the secret over values it
knows), which is why a weak secret is refused rather than merely discouraged.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import string

MIN_BITS = 128
"""Estimated bits of a secret, at least: out of reach of offline guessing."""
_CLASSES = (string.ascii_lowercase, string.ascii_uppercase, string.digits)


def strong_secret() -> str:
    """256 random bits, URL-safe text (what ``ecast credentials secret`` prints)."""
    return secrets.token_urlsafe(32)


def estimated_bits(secret: bytes) -> float:
    """A rough upper bound on the secret's strength: its length times the bits of the
    smallest alphabet that spells it (lower case, upper case, digits, other printable, or
    any byte), an alphabet counted no larger than twice the distinct characters used (so
    ``aaaa...`` is weak however long).  A dictionary phrase can still score high; the
    documentation says to use ``ecast credentials secret``."""
    try:
        text = secret.decode("ascii")
    except UnicodeDecodeError:
        return 8.0 * len(secret)
    if not text.isprintable():
        return 8.0 * len(secret)
    alphabet = sum(len(c) for c in _CLASSES if any(ch in c for ch in text))
    if any(not any(ch in c for c in _CLASSES) for ch in text):
        alphabet += 33
    alphabet = min(alphabet, 2 * len(set(text)))
    return len(text) * math.log2(max(alphabet, 2))


def secret_problem(secret: bytes) -> str | None:
    """What is wrong with ``secret``, or None."""
    if not secret:
        return "the cluster secret is empty"
    if len(secret) < 22 or estimated_bits(secret) < MIN_BITS:
        return (
            f"the cluster secret is too weak ({len(secret)} characters, about "
            f"{estimated_bits(secret):.0f} bits; {MIN_BITS} needed): make one with "
            "`ecast credentials secret`"
        )
    return None


def shared_with_others(st: os.stat_result) -> bool:
    """Whether a file's mode lets others than its owner read or change it.  One case
    passes besides mode 600: a file owned by root that only a group of this process
    may read (mode 640 or 440), which is how Kubernetes mounts a secret for a pod whose
    ``fsGroup`` is the process's group (PostgreSQL accepts its key files so too)."""
    mode = st.st_mode
    if not mode & 0o077:
        return False
    return bool(
        mode & 0o037  # group write or execute, or anything for others
        or st.st_uid != 0
        or st.st_gid not in (os.getgid(), *os.getgroups())
    )


def private_file_problem(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with a file that holds a secret (a cluster secret, an admin token, a
    private key): it must exist and be readable by its owner alone (``chmod 600``)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if shared_with_others(st):
        mode = st.st_mode & 0o777
        return f"{path} can be read by other users (mode {mode:o}); run chmod 600 {path}"
    return None


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Write a file readable by its owner alone from the start (never, even for a moment,
    by anyone else), replacing any earlier one in one step."""
    final = os.fspath(path)
    tmp = final + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, final)


def private_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory (and its parents) and keep it to its owner (mode 700)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
