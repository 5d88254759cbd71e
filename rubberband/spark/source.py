"""The ``rubberband`` PySpark data source: streaming and batch writes exactly once, and
batch reads one Spark partition per storage segment (``docs/spark.md``).

Spark runs the writer's ``write`` in a Python worker per task and ``commit`` in another
Python process on the driver; everything they share travels pickled (the options, the
job's namespace) or in the commit messages.  The Rubberband client runs on an event loop
of its own thread (:class:`_Loop`), so that Spark blocking the task's thread while its
upstream computes never silences the client past its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import threading
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import DateType, StringType, StructType

import ecast
import rubberband
from rubberband.spark.changes import ChangeStream, feed_options
from rubberband.spark.chunks import (
    BadRows,
    Chunker,
    Columns,
    Target,
    option_map,
    plain,
    remainder_messages,
)

T = TypeVar("T")
SCAN_OPS = "storage_adapters.scan:ScanOps"
NAMES = "client:spark-"
"""Every task's name starts with it, and so does every default session namespace: the
credential a job runs under (``client:spark-*``, or the cluster's ``client:*``) covers
both, and only such a credential may submit in, or close, the job's sessions."""
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"
DRIVER_STREAM = "driver"


# ---------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    """The data source's options, checked on the driver before any task runs."""

    routers: tuple[str, ...]
    target: Target
    secret_file: str | None = None
    """The development secret's file, read by each task where it runs (the secret itself
    never travels in the pickled options)."""
    credentials: str | None = None
    rows_per_message: int = 1000
    buckets: int = 8
    isolation: str = "sequential"
    consistent: bool = False
    namespace: str | None = None
    listen: str = "127.0.0.1:0"
    timeout: float = 60.0
    trace: str | None = None
    """A directory where every task attempt and commit appends one JSON line of what it
    did (an audit of exactly once: attempts, rows, messages, closed sessions)."""

    @classmethod
    def parse(cls, options: Any) -> Options:
        o = option_map(options)
        routers = tuple(r.strip() for r in o.get("routers", "").split(",") if r.strip())
        credentials = o.get("credentials")
        state_dir = o.get("state_dir")
        if state_dir:
            st = json.loads((Path(state_dir) / "cluster.json").read_text())
            routers = routers or tuple(st["routers"])
            credentials = credentials or st.get("client_credentials")
        if not routers:
            raise BadRows("option 'routers' (HOST:PORT,...) or 'state_dir' is required")
        secret_file = o.get("secret_file") or None
        if secret_file:
            problem = ecast.private_file_problem(secret_file)
            if problem:
                raise BadRows(f"option 'secret_file': {problem}")
        elif not credentials:
            credentials = os.environ.get("ECAST_CREDENTIALS") or None
            if credentials is None and not os.environ.get("ECAST_SECRET"):
                raise BadRows(
                    "no way to authenticate: give 'credentials', 'secret_file', "
                    "'state_dir', or set ECAST_SECRET (in every executor's environment)"
                )
        namespace = o.get("namespace") or None
        if namespace is not None and (namespace.startswith("@") or not namespace.isprintable()):
            raise BadRows(f"option 'namespace' {namespace!r:.80}: a printable name, not @...")
        table = o.get("table")
        key = o.get("key") or ("key" if table is None else "")
        if not key:
            raise BadRows("option 'key' names the table's key column")
        target = Target(
            key=key,
            operation=o.get("operation", "upsert"),  # type: ignore[arg-type]
            table=table,
            value=o.get("value") or (None if table else "value"),
        )
        isolation = o.get("isolation", "sequential")
        if isolation not in ("sequential", "snapshot", "basic"):
            raise BadRows(f"isolation is sequential, snapshot or basic, not {isolation!r}")
        return cls(
            routers=routers,
            target=target,
            secret_file=secret_file,
            credentials=credentials,
            rows_per_message=_int(o, "rows_per_message", 1000),
            buckets=_int(o, "buckets", 8),
            isolation=isolation,
            consistent=o.get("consistent", "false").lower() in ("1", "true", "yes"),
            namespace=namespace,
            listen=o.get("listen", "127.0.0.1:0"),
            timeout=float(o.get("timeout", "60")),
            trace=o.get("trace") or None,
        )


def _int(o: dict[str, str], name: str, default: int) -> int:
    try:
        return int(o.get(name, default))
    except ValueError:
        raise BadRows(f"option {name!r} is an integer, not {o[name]!r}") from None


# ---------------------------------------------------------------------- the client's loop
class _Loop:
    """An event loop on a thread of its own, for one task's (or commit's) client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


async def _connect(opts: Options, session: ecast.Session | None = None) -> Any:
    """A light client under a name never used before (names are unique for ever, and
    Spark's task attempt ids restart in every session)."""
    auth: dict[str, Any] = {}
    if opts.credentials:
        auth["credentials"] = opts.credentials
    elif opts.secret_file:
        problem = ecast.private_file_problem(opts.secret_file)
        if problem:
            raise BadRows(f"option 'secret_file': {problem}")
        auth["secret"] = Path(opts.secret_file).read_bytes().strip()
    return await rubberband.connect(
        list(opts.routers),
        f"{NAMES}{uuid.uuid4().hex[:20]}",
        ops=SCAN_OPS if opts.target.table is not None else None,
        listen=opts.listen,
        session=session,
        connect_timeout=opts.timeout,
        ack_timeout=opts.timeout,
        **auth,
    )


def _trace(opts: Options, record: dict[str, Any]) -> None:
    if opts.trace is None:
        return
    d = Path(opts.trace)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


@contextlib.contextmanager
def _client(opts: Options, session: ecast.Session | None = None) -> Iterator[tuple[_Loop, Any]]:
    """A client on an event loop of its own thread; detached and the loop stopped at the
    end, whatever happened."""
    loop = _Loop()
    rb = None
    try:
        rb = loop.run(_connect(opts, session), opts.timeout * 2)
        yield loop, rb
    finally:
        if rb is not None:
            with contextlib.suppress(Exception):
                loop.run(rb.close(), 10)
        loop.close()


# ---------------------------------------------------------------------- writing
@dataclass
class RubberbandCommit(WriterCommitMessage):  # type: ignore[misc]
    """A task's commit message: the rows it left to the driver, and what it did."""

    namespace: str
    partition: int
    columns: list[str] = field(default_factory=list)
    remainder: list[Columns] = field(default_factory=list)
    rows: int = 0
    messages: int = 0
    closed: bool = False


def _batch_columns(batch: pa.RecordBatch) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        values = column.to_pylist()
        t = column.type
        if pa.types.is_temporal(t) or pa.types.is_decimal(t):
            values = [plain(v) for v in values]
        out[name] = values
    return out


async def _submit_all(rb: Any, items: list[tuple[Any, dict[str, Any]]]) -> list[Any]:
    """Enqueue in order (waiting for window room, E-Cast's flow control); the ack futures."""
    return [await rb.ecast.enqueue(p, h) for p, h in items]


async def _acked(futures: list[Any], timeout: float) -> bool:
    """Wait for every ack, each within ``timeout`` of the one before; True if the session
    was closed (the batch was committed before: nothing of it was or will be written by
    this attempt).  A timeout fails the task, whose retry resends in the same session."""
    closed = False
    for n, f in enumerate(futures, 1):
        try:
            ack = await asyncio.wait_for(asyncio.shield(f), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"message {n} of {len(futures)} was not stable within {timeout:g} s"
            ) from None
        except ecast.SessionClosedError:
            closed = True
            continue
        if not ack.delivered:
            raise rubberband.Unavailable("a message's keys have no holder left")
    return closed


def write_partition(
    opts: Options, namespace: str, epoch: int, batches: Iterator[pa.RecordBatch]
) -> RubberbandCommit:
    """One task's writes: full chunks in session ``(namespace, epoch, p<partition>)``,
    returned only when every one is stable; the rest goes to the driver."""
    tc = TaskContext.get()
    partition = tc.partitionId() if tc is not None else 0
    with _client(opts, (namespace, epoch, f"p{partition}")) as (loop, rb):
        chunker = Chunker(opts.target, rb.placement, opts.rows_per_message, opts.buckets)
        futures: list[Any] = []
        try:
            for batch in batches:
                items = chunker.feed(_batch_columns(batch))
                if items:
                    futures.extend(loop.run(_submit_all(rb, items)))
        except BaseException as e:
            _trace(
                opts,
                {
                    "what": "task-failed",
                    "namespace": namespace,
                    "epoch": epoch,
                    "partition": partition,
                    "rows": chunker.rows_in,
                    "messages": chunker.messages_out,
                    "error": repr(e)[:200],
                },
            )
            raise
        closed = loop.run(_acked(futures, opts.timeout))
        commit = RubberbandCommit(
            namespace,
            partition,
            list(chunker.columns),
            [] if closed else chunker.remainder(),
            chunker.rows_in,
            chunker.messages_out,
            closed,
        )
        _trace(
            opts,
            {
                "what": "task",
                "namespace": namespace,
                "epoch": epoch,
                "partition": partition,
                "attempt": tc.attemptNumber() if tc is not None else 0,
                "rows": commit.rows,
                "messages": commit.messages,
                "left": sum(len(b[opts.target.key]) for b in commit.remainder),
                "closed": closed,
            },
        )
        return commit


def commit_batch(opts: Options, namespace: str | None, epoch: int, messages: Sequence[Any]) -> int:
    """On the driver: write the tasks' leftover rows in session ``(namespace, epoch,
    "driver")``, then close every session of ``namespace`` up to ``epoch``.  Returns the
    number of driver messages sent (0 on a replay of a committed batch)."""
    done = sorted((m for m in messages if m is not None), key=lambda m: m.partition)
    namespace = namespace or (done[0].namespace if done else None)
    if namespace is None:
        return 0
    with _client(opts, (namespace, epoch, DRIVER_STREAM)) as (loop, rb):
        items = remainder_messages(
            opts.target,
            rb.placement,
            opts.rows_per_message,
            ((m.columns, m.remainder) for m in done if not m.closed),
        )
        futures = loop.run(_submit_all(rb, items))
        closed = loop.run(_acked(futures, opts.timeout)) or any(m.closed for m in done)
        loop.run(rb.ecast.close_sessions(namespace, epoch, timeout=opts.timeout))
        sent = 0 if closed else len(items)
        _trace(
            opts,
            {
                "what": "commit",
                "namespace": namespace,
                "epoch": epoch,
                "messages": sent,
                "closed": closed,
                "tasks": len(done),
            },
        )
        return sent


class StreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    """Micro-batches exactly once: session ``("client:spark-q-" + query id, batch id,
    p<n>)``."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RubberbandCommit:
        tc = TaskContext.get()
        query = tc.getLocalProperty(QUERY_ID) if tc is not None else None
        batch = tc.getLocalProperty(BATCH_ID) if tc is not None else None
        if batch is None or (query is None and self.opts.namespace is None):
            raise BadRows("no streaming batch id or query id in the task's context")
        namespace = self.opts.namespace or f"{NAMES}q-{query}"
        return write_partition(self.opts, namespace, int(batch), iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        commit_batch(self.opts, self.opts.namespace, batchId, messages)

    def abort(self, messages: list[Any], batchId: int) -> None:
        """Acknowledged writes cannot be undone; the sessions stay open so that the
        batch's replay completes it exactly once."""


class BatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    """A batch write exactly once: session ``("client:spark-job-" + a fresh id, 0,
    p<n>)``."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.namespace = opts.namespace or f"{NAMES}job-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RubberbandCommit:
        return write_partition(self.opts, self.namespace, 0, iterator)

    def commit(self, messages: list[Any]) -> None:
        commit_batch(self.opts, self.namespace, 0, messages)

    def abort(self, messages: list[Any]) -> None:
        """See :meth:`StreamWriter.abort`."""


# ---------------------------------------------------------------------- reading
class Segment(InputPartition):  # type: ignore[misc]
    """One Spark partition: a primary segment of the keyspace (None: everything)."""

    def __init__(self, ranges: Any) -> None:
        super().__init__(ranges)
        self.ranges = ranges


class Reader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[Segment]:
        if self.opts.consistent:
            return [Segment(None)]
        with _client(self.opts) as (_, rb):
            segs = list(rb.segments())
        return [Segment(s) for s in segs] or [Segment(None)]

    def read(self, partition: Segment) -> Iterator[pa.RecordBatch]:
        with _client(self.opts) as (loop, rb):
            columns = loop.run(self._read(rb, partition.ranges), self.opts.timeout * 4)
        yield _record_batch(self.schema, columns)

    async def _read(self, rb: Any, ranges: Any) -> dict[str, list[Any]]:
        opts = self.opts
        names = [f.name for f in self.schema.fields]
        t = opts.target
        if t.table is not None:
            op = rb.core.ops.select(t.table, columns=names, isolation=opts.isolation)
            op["key"] = t.key
            result = await rb.read(op, opts.isolation, within=ranges)
            return dict(zip(result["columns"], result["data"], strict=True))
        items = await rb.read(("scan", None, None), opts.isolation, within=ranges)
        value = str(t.value)
        return {t.key: [k for k, _ in items], value: [v for _, v in items]}


def _record_batch(schema: StructType, columns: dict[str, list[Any]]) -> pa.RecordBatch:
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema)
    arrays = []
    for f, af in zip(schema.fields, arrow, strict=True):
        values = columns.get(f.name)
        if values is None:
            raise BadRows(f"the table has no column {f.name!r}")
        if isinstance(f.dataType, DateType):
            values = [dt.date.fromisoformat(v) if type(v) is str else v for v in values]
        elif isinstance(f.dataType, StringType):
            values = [v if v is None or type(v) is str else str(v) for v in values]
        arrays.append(pa.array(values, type=af.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow)


# ---------------------------------------------------------------------- the source
class RubberbandDataSource(DataSource):  # type: ignore[misc]
    """``format("rubberband")``: see ``docs/spark.md`` for the options."""

    @classmethod
    def name(cls) -> str:
        return "rubberband"

    def schema(self) -> str:
        if self.options.get("table"):
            raise BadRows(
                "reading a table needs its schema: spark.read.format('rubberband')"
                ".schema('id long, name string, ...')"
            )
        return "key string, value string"

    def reader(self, schema: StructType) -> Reader:
        return Reader(Options.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        return BatchWriter(Options.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        return StreamWriter(Options.parse(self.options))

    def streamReader(self, schema: StructType) -> ChangeStream:
        """A key range's change feed (:mod:`rubberband.spark.changes`)."""
        opts = Options.parse(self.options)
        if opts.target.table is not None:
            raise BadRows(
                "a stream reads a key-value range's change feed; the scan engine's tables "
                "keep no change feed yet (read a table with spark.read)"
            )
        return ChangeStream(opts, schema, feed_options(option_map(self.options)))


def register(spark: Any) -> None:
    """Make ``format("rubberband")`` known to ``spark`` (a SparkSession)."""
    spark.dataSource.register(RubberbandDataSource)
