"""The live stream on Spark: bronze as a Delta streaming source -> per-container state -> phases and
recommendations, exactly once.

The query::

    readStream(bronze)                               new samples, whole Delta commits per micro-batch
      .groupBy(pod_id).transformWithStateInPandas()  ai4dl.stream.online.advance per container; its window
                                                     and trace live in Spark's state store (checkpointed)
      .writeStream.foreachBatch(...)                 phases: insert-only MERGE on (pod_id, ts)
                                                     recommendations: MERGE, replaced only by a newer step
                                                     late samples: quarantine, insert-only MERGE

Exactly once: the checkpoint records each micro-batch's offsets before it runs and the state store versions
with it; a batch interrupted (SIGKILL, lost driver) is run again on restart from the same offsets and the same
state version, so it produces the same rows, and every write is a MERGE keyed so that rows already written are
not written again. Nothing is kept on the driver between batches.

The model is resolved at every batch boundary: when another model is current (a new version was trained,
``label.model`` changed) the batch is refused before it writes anything, the query is restarted from its
checkpoint with the new model and the switch is logged; that batch and the following ones carry the new
``model_id``. Phases already written keep the model that labelled them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ai4dl.lake.columns import BEHAVIOUR, METRICS, POD_ID, SERVICE, TS
from ai4dl.lake.schema import STREAM_OUTPUT, STREAM_STATE
from ai4dl.lake.tables import Lake, local_frame, spec
from ai4dl.stream.online import Live, advance, state_from_tuple, state_to_tuple

SOURCE_COLUMNS = (POD_ID, SERVICE, TS, *METRICS, BEHAVIOUR, "source_file", "ingested_at")
OUTPUT_NAMES = STREAM_OUTPUT.fieldNames()


class ModelChanged(Exception):
    """Raised inside a micro-batch, before it writes, when another model has become current."""


@dataclass
class StreamReport:
    """What one ``ai4dl stream`` run did (summed over its queries: one per model)."""

    batches: int = 0
    phases: int = 0
    recommendations: int = 0
    late: int = 0
    files: int = 0  # files ingested from stream.input
    ingested: int = 0  # rows they added to bronze
    quarantined: int = 0  # rows of theirs quarantined by ingest's rules
    models: list[str] = field(default_factory=list)
    seconds: float = 0.0
    batch_seconds: list[float] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)  # seconds from a sample landing in bronze to its rows committed
    # seconds per part of the micro-batches, summed: "compute" (the stateful step, forced by the counts),
    # then one entry per table written; where a batch's time goes, for bench/stream.py
    parts: dict[str, float] = field(default_factory=dict)

    def timed(self, part: str, since: float) -> float:
        now = time.time()
        self.parts[part] = self.parts.get(part, 0.0) + now - since
        return now

    def summary(self) -> str:
        files = (f"{self.files} new files: {self.ingested} rows into bronze, {self.quarantined} quarantined; "
                 if self.files else "")
        return (f"{files}{self.batches} micro-batches, {self.phases} steps labelled, {self.recommendations} "
                f"recommendations updated, {self.late} late samples quarantined; models {', '.join(self.models) or '-'}")


def bronze_stream(lake: Lake, max_files_per_trigger: int) -> DataFrame:
    """New bronze rows as a stream. ``skipChangeCommits``: ingest only ever inserts (insert-only MERGE), and an
    OPTIMIZE rewrites files without changing data; neither must replay rows already streamed."""
    return (
        lake.spark.readStream.format("delta")
        .option("skipChangeCommits", "true")
        .option("maxFilesPerTrigger", str(int(max_files_per_trigger)))
        .load(lake.path("bronze"))
        .select(*SOURCE_COLUMNS)
    )


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def files_stream(lake: Lake, folder: str, max_files_per_trigger: int) -> DataFrame:
    """The paths of new files in ``folder`` (recursively; hidden ``.``/``_`` files skipped, as Spark's file
    source does), one micro-batch's worth at a time. ``binaryFile`` with only ``path`` selected lists files and
    never reads them: the rows are read by :func:`ai4dl.traces.ingest.ingest`, each file by its own header."""
    return (
        lake.spark.readStream.format("binaryFile")
        .schema("path string, modificationTime timestamp, length long, content binary")  # the format's own
        .option("recursiveFileLookup", "true")
        .option("maxFilesPerTrigger", str(int(max_files_per_trigger)))
        .load(folder)
        .select("path")
    )


class FilesIntoBronze:
    """The ``foreachBatch`` sink of the folder source: the batch's new files through ``ingest`` (same
    validation, same quarantine, insert-only MERGEs), so a batch replayed after a crash inserts nothing twice."""

    def __init__(self, lake: Lake, settings: Any, report: "StreamReport") -> None:
        self.lake, self.settings, self.report = lake, settings, report

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from ai4dl.errors import InputError
        from ai4dl.traces.ingest import ingest

        paths = sorted(r["path"] for r in batch.collect())
        if not paths:
            return
        t0 = time.time()
        lake = self.lake.with_session(batch.sparkSession)
        try:
            results = [ingest(lake, self.settings, path=paths)]
        except InputError:
            # A file that `ingest` refuses whole (no header, required columns missing, unreadable) must not stop
            # the stream nor hold back the good files beside it: each file alone, the refused ones quarantined.
            results = []
            for path in paths:
                try:
                    results.append(ingest(lake, self.settings, path=path))
                except InputError as exc:
                    self.report.quarantined += refuse_file(lake, path, str(exc))
        self.report.files += len(paths)
        self.report.ingested += sum(r.inserted for r in results)
        self.report.quarantined += sum(r.quarantined for r in results)
        self.report.timed("ingest", t0)


REFUSED_FILE_REASON = "file_refused"


def refuse_file(lake: Lake, path: str, message: str) -> int:
    """One quarantine row for a whole file ``ingest`` refused: its path, the refusal as ``raw``; a replay after a
    crash finds the row already there (insert-only MERGE on file, hash, reason)."""
    from ai4dl.traces.ingest import to_quarantine

    schema = T.StructType([T.StructField(c, T.StringType()) for c in ("source_file", "raw", "reasons")])
    row = local_frame(lake.spark, [(path, message, REFUSED_FILE_REASON)], schema)
    return lake.merge_new("quarantine", to_quarantine(row)).inserted


def live_rows(source: DataFrame, live: Live, state_ttl_hours: float | None = None) -> DataFrame:
    """The stateful step: :func:`ai4dl.stream.online.advance` per container and micro-batch, its state a value
    state (``STREAM_STATE``) of ``transformWithStateInPandas``, its rows in ``STREAM_OUTPUT``.

    ``transformWithStateInPandas`` rather than ``applyInPandasWithState``: with pyarrow 26 the latter's
    serializer reads the chunk offsets of a group through a struct with null rows, gets floats, and fails
    (``RecordBatch.slice``) as soon as a group has several rows. It needs the RocksDB state store.

    ``state_ttl_hours``: the state's time to live since its last update (processing time): a finished
    container's state is removed by Spark in the next micro-batch, so the store holds the running fleet only."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    ttl_ms = None if state_ttl_hours is None else max(int(float(state_ttl_hours) * 3_600_000), 1)

    class ContainerProcessor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("container", STREAM_STATE, ttl_ms)

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any = None) -> Iterator[pd.DataFrame]:
            batch = pd.concat(list(rows), ignore_index=True)
            previous = state_from_tuple(self.state.get()) if self.state.exists() else None
            out, new = advance(str(key[0]), batch, previous, live)
            self.state.update(state_to_tuple(new))
            if len(out):
                yield _output_frame(out)

        def close(self) -> None:
            pass

    source.sparkSession.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    # TTL needs the ProcessingTime time mode, whose operator asks for a batch after every batch, data or not:
    # an availableNow query would never end. Batches run on new data only; expired state is dropped then.
    source.sparkSession.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    return source.groupBy(POD_ID).transformWithStateInPandas(
        statefulProcessor=ContainerProcessor(), outputStructType=STREAM_OUTPUT, outputMode="Append",
        timeMode="None" if ttl_ms is None else "ProcessingTime",
    )


def _output_frame(out: pd.DataFrame) -> pd.DataFrame:
    """``advance``'s rows in ``STREAM_OUTPUT``'s columns and types: the row kinds leave each other's columns
    empty, which pandas fills with NaN whatever the column's type (a timestamp, a list); Arrow wants nulls."""
    frame = out.reindex(columns=OUTPUT_NAMES)
    for f in STREAM_OUTPUT.fields:
        col = frame[f.name]
        if isinstance(f.dataType, T.TimestampType):
            frame[f.name] = pd.to_datetime(col)
        elif isinstance(f.dataType, (T.IntegerType, T.LongType)):
            frame[f.name] = pd.array(pd.to_numeric(col), dtype="Int64")
        elif isinstance(f.dataType, T.DoubleType):
            frame[f.name] = pd.to_numeric(col).astype("float64")
        elif isinstance(f.dataType, T.ArrayType):
            frame[f.name] = [v if isinstance(v, (list, tuple)) else None for v in col]
        else:
            frame[f.name] = [v if isinstance(v, str) else None for v in col]
    return frame


class BatchWriter:
    """The ``foreachBatch`` sink: checks the model, then writes one micro-batch with idempotent MERGEs."""

    def __init__(self, lake: Lake, model_path: Any, current_model: Callable[[], Any], report: StreamReport,
                 measure_delays: bool = False) -> None:
        self.lake, self.model_path, self.current_model = lake, model_path, current_model
        self.report, self.measure_delays = report, measure_delays
        self.pending: Any = None
        self.tables_ready = False

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        current = self.current_model()
        if current != self.model_path:
            self.pending = current
            raise ModelChanged(f"model {current} replaces {self.model_path} from micro-batch {batch_id}")
        t0 = time.time()
        lake = self.lake.with_session(batch.sparkSession)  # the query's session (a clone of the caller's)
        if not self.tables_ready:  # once per query, not once per micro-batch
            for name in ("phases", "recommendations", "quarantine"):
                lake.ensure(name)
            self.tables_ready = True
        rows = batch.persist()
        report = self.report
        try:
            stats = rows.groupBy("kind").agg(F.count("*").alias("n"), F.unix_micros(F.min(TS)).alias("first")).collect()
            counts = {r["kind"]: r["n"] for r in stats}
            t = report.timed("compute", t0)
            if counts.get("phase"):
                # a stored row with a key of this batch has a ts of this batch: older files are not read
                first = next(r["first"] for r in stats if r["kind"] == "phase")
                lake.merge_new("phases", rows.where("kind = 'phase'"), target_filter=f"t.`{TS}` >= {_ts_literal(first)}",
                               create=False, record_version=False)
                t = report.timed("phases", t)
            if counts.get("late"):
                from ai4dl.traces.ingest import to_quarantine

                late = rows.where("kind = 'late'").select("source_file", "raw", F.col("reason").alias("reasons"))
                lake.merge_new("quarantine", to_quarantine(late), create=False, record_version=False)
                t = report.timed("quarantine", t)
            if counts.get("rec"):
                recs = rows.where("kind = 'rec'").withColumn("updated_at", F.current_timestamp())
                # newer = a later sample (ts), not a higher step: a container whose state expired starts again at 0
                lake.upsert_newer("recommendations", recs.select(*spec("recommendations").schema.fieldNames()), TS,
                                  create=False)
                t = report.timed("recommendations", t)
            if self.measure_delays and counts.get("phase"):
                landed = rows.where("kind = 'phase'").select(F.col("ingested_at").cast("double")).collect()
                now = time.time()
                self.report.delays += [now - r[0] for r in landed if r[0] is not None]
        finally:
            rows.unpersist()
        self.report.batches += 1
        self.report.phases += counts.get("phase", 0)
        self.report.recommendations += counts.get("rec", 0)
        self.report.late += counts.get("late", 0)
        self.report.batch_seconds.append(time.time() - t0)


def _ts_literal(epoch_micros: int) -> str:
    """A SQL timestamp literal with its zone, so it means the same instant whatever the session's time zone."""
    from datetime import datetime, timedelta, timezone

    instant = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=int(epoch_micros))  # exact
    return f"TIMESTAMP '{instant.isoformat()}'"


def run_stream(
    lake: Lake,
    prepare: Callable[[Any], Live],
    current_model: Callable[[], Any],
    checkpoint: str,
    trigger: str = "availableNow",
    interval_seconds: float = 10.0,
    max_seconds: float | None = None,
    max_files_per_trigger: int = 1_000_000,
    on_model: Callable[[Any, Live], None] | None = None,
    measure_delays: bool = False,
    state_ttl_hours: float | None = None,
    input_folder: str | None = None,
    ingest_settings: Any = None,
) -> StreamReport:
    """Run the stream until bronze is drained (``availableNow``) or, ``continuous``, a micro-batch every
    ``interval_seconds`` until ``max_seconds`` (None: until stopped). ``prepare(models)`` gives the
    :class:`Live` inputs of the models ``current_model()`` names (the phase and the policy model to use now,
    asked at every batch boundary); ``on_model(models, live)`` is told each pair the stream starts with.

    ``input_folder``: a second query ingests the folder's new files into bronze (``ingest_settings``: the
    ingest section), its checkpoint beside ``checkpoint`` (``<checkpoint>-files``). ``availableNow`` ingests
    every new file first, then labels; ``continuous`` runs both queries side by side, and a failure of either
    stops both."""
    from pyspark.errors import StreamingQueryException

    report = StreamReport()
    t0 = time.time()
    feeder = None
    if input_folder:
        feeder = _start_feeder(lake, input_folder, ingest_settings, report, checkpoint.rstrip("/") + "-files",
                               trigger, interval_seconds, max_files_per_trigger)
        if trigger == "availableNow":
            feeder.awaitTermination()
            feeder = None
    path = current_model()
    try:
        while True:
            live = prepare(path)
            report.models.append(live.model_id)
            if on_model is not None:
                on_model(path, live)
            writer = BatchWriter(lake, path, current_model, report, measure_delays)
            out = live_rows(bronze_stream(lake, max_files_per_trigger), live, state_ttl_hours)
            stream = out.writeStream.foreachBatch(writer).option("checkpointLocation", checkpoint).outputMode("append")
            query = _triggered(stream, trigger, interval_seconds).start()
            try:
                if trigger == "availableNow":
                    query.awaitTermination()
                else:
                    deadline = None if max_seconds is None else t0 + float(max_seconds)
                    if not _await(query, feeder, deadline):
                        _stop_between_batches(query)
            except StreamingQueryException:
                if writer.pending is None:
                    raise
                path = writer.pending
                continue
            except KeyboardInterrupt:
                _stop_between_batches(query)
            break
    finally:
        if feeder is not None:
            _stop_between_batches(feeder)
    report.seconds = time.time() - t0
    return report


def _start_feeder(lake: Lake, folder: str, settings: Any, report: StreamReport, checkpoint: str, trigger: str,
                  interval_seconds: float, max_files_per_trigger: int) -> Any:
    stream = (
        files_stream(lake, folder, max_files_per_trigger).writeStream
        .foreachBatch(FilesIntoBronze(lake, settings, report)).option("checkpointLocation", checkpoint)
    )
    return _triggered(stream, trigger, interval_seconds).start()


def _triggered(stream: Any, trigger: str, interval_seconds: float) -> Any:
    """``stream.trigger``: ``availableNow``, or (``continuous``) a micro-batch every ``interval_seconds``."""
    if trigger == "availableNow":
        return stream.trigger(availableNow=True)
    return stream.trigger(processingTime=f"{float(interval_seconds)} seconds")


def _await(query: Any, feeder: Any, deadline: float | None) -> bool:
    """Wait for ``query`` to end (True) or ``deadline`` (False); a failed ``feeder`` stops ``query`` and its
    error is raised: a stream that has stopped reading its folder must not look alive."""
    while True:
        wait = 1.0 if deadline is None else min(1.0, deadline - time.time())
        if wait < 0.01:  # awaitTermination wants at least a millisecond
            return False
        if query.awaitTermination(wait):
            return True
        if feeder is not None and not feeder.isActive:
            error = feeder.exception()
            _stop_between_batches(query)
            if error is not None:
                raise error
            return True


def _stop_between_batches(query: Any, patience: float = 60.0) -> None:
    """Stop a continuous query when no micro-batch is running (one that is would be replayed on restart:
    correct, but wasted work)."""
    deadline = time.time() + patience
    while time.time() < deadline and query.isActive and query.status.get("isTriggerActive"):
        time.sleep(0.05)
    query.stop()


__all__ = [
    "BatchWriter", "FilesIntoBronze", "ModelChanged", "StreamReport", "bronze_stream", "files_stream", "live_rows",
    "refuse_file", "run_stream",
]
