"""The Spark data source's options: checked on the driver, and no secret in what Spark
pickles to its tasks."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

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


def test_a_change_streams_options_and_columns_are_checked_with_a_clear_error() -> None:
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from rubberband.spark.changes import ChangeStream, Feed, check_schema, feed_options

    def schema(*columns: tuple[str, Any]) -> StructType:
        return StructType([StructField(n, t) for n, t in columns])

    s, n = StringType(), LongType()

    assert feed_options({}) == Feed(None, None, "now", None)
    assert feed_options({"lo": '"f:"', "hi": "10", "since": "42"}) == ("f:", 10, "42", None)
    assert feed_options({"max_changes_per_batch": "50"}).max_changes == 50
    for bad, said in [({"lo": "f:"}, "JSON"), ({"since": "-1"}, "since"),
                      ({"since": "yesterday"}, "since"), ({"max_changes_per_batch": "0"}, "count"),
                      ({"max_changes_per_batch": "x"}, "count")]:  # fmt: skip
        with pytest.raises(BadRows, match=said):
            feed_options(bad)
    check_schema(schema(("position", n), ("value", s)))
    bad = [(("key", s), ("extra", IntegerType())), (("position", s),), (("key", n),), ()]
    for columns in bad:
        with pytest.raises(BadRows, match="a change stream's columns"):
            check_schema(schema(*columns))
    # The driver's client never travels to the tasks.
    opts = Options.parse({"routers": "127.0.0.1:1", "credentials": "c"})
    reader = ChangeStream(opts, schema(("key", s)), Feed())
    reader._open, reader._client = object(), (object(), object())  # type: ignore[assignment]
    state = reader.__getstate__()
    assert state["_open"] is None and state["_client"] == (None, None)
