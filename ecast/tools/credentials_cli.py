"""``ecast credentials``: the cluster's certificate authority and its processes' credentials.

    ecast credentials init --ca ca.json
    ecast credentials issue --ca ca.json --role router --name r1 --name 'r1.*' --out r1.cred
    ecast credentials issue --ca ca.json --role application --name 'client:spark-*' \\
        --expires 30d --out spark.cred
    ecast credentials show r1.cred
    ecast credentials revoke --list revoked.txt SERIAL
    ecast credentials secret          # a strong secret for the development mode

Keep the CA file (``ca.json``) away from the machines that run the cluster: whoever holds
it can issue any credential.  A credential file holds the process's private key and is
written with mode 600.  ``docs/security.md`` says how to rotate and revoke.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ecast.security.credentials import (
    ROLES,
    Certificate,
    CertificateAuthority,
    Credential,
    CredentialError,
    read_revoked,
)
from ecast.security.secret import strong_secret

_UNITS = {"d": 86400, "h": 3600, "m": 60}


def parse_expiry(text: str, now: float) -> int:
    """``never``, or a duration such as ``90d``, ``12h`` or ``30m``: Unix seconds or 0."""
    if text == "never":
        return 0
    unit = _UNITS.get(text[-1:])
    if unit is None or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise CredentialError(f"--expires {text!r}: say never, or a duration like 90d, 12h, 30m")
    return int(now) + int(text[:-1]) * unit


def _describe(cert: Certificate) -> dict[str, object]:
    return cert.describe()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="ecast credentials",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("init", help="create the cluster's certificate authority")
    p.add_argument("--ca", required=True, help="file to create (mode 600)")
    p.add_argument("--force", action="store_true", help="replace an existing CA file")
    p = sub.add_parser("issue", help="issue a credential")
    p.add_argument("--ca", required=True, help="the CA file")
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument(
        "--name",
        required=True,
        action="append",
        help="a name the process may use: exact, or a prefix ending in * (repeatable)",
    )
    p.add_argument("--expires", default="365d", help="never, or a duration: 90d, 12h, 30m")
    p.add_argument("--out", required=True, help="credential file to write (mode 600)")
    p = sub.add_parser("show", help="what a credential file says")
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("revoke", help="add serials to a revocation list (routers' --revoked)")
    p.add_argument("--list", required=True, help="the revocation list file")
    p.add_argument("serial", nargs="+")
    sub.add_parser("secret", help="print a strong secret for the development mode")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except (CredentialError, OSError) as e:
        print(f"ecast credentials: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "secret":
        print(strong_secret())
        return 0
    if args.command == "init":
        path = Path(args.ca)
        if path.exists() and not args.force:
            raise CredentialError(f"{path} exists (a CA is made once; --force replaces it)")
        ca = CertificateAuthority.create()
        ca.save(path)
        print(f"created CA {path} (public key {ca.public_key.hex()[:16]}...); keep it safe")
        return 0
    if args.command == "issue":
        ca = CertificateAuthority.load(args.ca)
        cred = ca.issue(args.role, args.name, expires=parse_expiry(args.expires, time.time()))
        cred.save(args.out)
        d = _describe(cred.certificate)
        print(
            f"issued {d['role']} credential {d['serial']} for {', '.join(cred.names)} "
            f"(expires {d['expires']}) to {args.out}"
        )
        return 0
    if args.command == "show":
        cred = Credential.load(args.file)
        d = {**_describe(cred.certificate), "ca": cred.authority.public_key.hex()}
        if args.json:
            print(json.dumps(d))
        else:
            for key, value in d.items():
                shown = ", ".join(value) if isinstance(value, list) else value
                print(f"{key:<8} {shown}")
        return 0
    if args.command == "revoke":
        path = Path(args.list)
        known = read_revoked(path) if path.exists() else frozenset()
        new = [s for s in args.serial if s not in known]
        with path.open("a") as f:
            for serial in new:
                f.write(f"{serial}  # revoked {time.strftime('%Y-%m-%d')}\n")
        print(f"{len(new)} serial(s) added to {path}; restart routers with --revoked {path}")
        return 0
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
