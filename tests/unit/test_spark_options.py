"""The Spark data source's options: checked on the driver, and no secret in what Spark
pickles to its tasks."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from rubberband.spark.chunks import BadRows
from rubberband.spark.source import NAMES, Options


def test_a_secret_file_others_can_read_is_refused_and_the_secret_never_travels(
    tmp_path: Path,
) -> None:
    """Probe: the Spark ``secret_file`` had no permission check, and the secret travelled
    in the pickled options."""
    secret = "s3cr3t-" + "x" * 40
    f = tmp_path / "secret"
    f.write_text(secret + "\n")
    f.chmod(0o644)
    with pytest.raises(BadRows, match="can be read by other users"):
        Options.parse({"routers": "127.0.0.1:1", "secret_file": str(f)})
    f.chmod(0o600)
    opts = Options.parse({"routers": "127.0.0.1:1", "secret_file": str(f)})
    assert opts.secret_file == str(f)
    assert secret.encode() not in pickle.dumps(opts)


def test_sessions_default_to_names_the_jobs_credential_covers() -> None:
    assert NAMES == "client:spark-"
    with pytest.raises(BadRows, match="namespace"):
        Options.parse({"routers": "127.0.0.1:1", "credentials": "x", "namespace": "@routers"})
