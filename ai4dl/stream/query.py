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

from ai4dl.lake.columns import BEHAVIOUR, METRICS, POD_ID, SERVICE, TS
from ai4dl.lake.schema import STREAM_OUTPUT, STREAM_STATE
from ai4dl.lake.tables import Lake, spec
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
    models: list[str] = field(default_factory=list)
    seconds: float = 0.0
    batch_seconds: list[float] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)  # seconds from a sample landing in bronze to its rows committed

    def summary(self) -> str:
        return (f"{self.batches} micro-batches, {self.phases} steps labelled, {self.recommendations} recommendations "
                f"updated, {self.late} late samples quarantined; models {', '.join(self.models) or '-'}")


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


def live_rows(source: DataFrame, live: Live) -> DataFrame:
    """The stateful step: :func:`ai4dl.stream.online.advance` per container and micro-batch, its state a value
    state (``STREAM_STATE``) of ``transformWithStateInPandas``, its rows in ``STREAM_OUTPUT``.

    ``transformWithStateInPandas`` rather than ``applyInPandasWithState``: with pyarrow 26 the latter's
    serializer reads the chunk offsets of a group through a struct with null rows, gets floats, and fails
    (``RecordBatch.slice``) as soon as a group has several rows. It needs the RocksDB state store."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class ContainerProcessor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("container", STREAM_STATE)

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
    return source.groupBy(POD_ID).transformWithStateInPandas(
        statefulProcessor=ContainerProcessor(), outputStructType=STREAM_OUTPUT, outputMode="Append", timeMode="None"
    )


def _output_frame(out: pd.DataFrame) -> pd.DataFrame:
    """``advance``'s rows in ``STREAM_OUTPUT``'s columns and types: the row kinds leave each other's columns
    empty, which pandas fills with NaN whatever the column's type (a timestamp, a list); Arrow wants nulls."""
    from pyspark.sql import types as T

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

    def __init__(self, lake: Lake, model_path: str, current_model: Callable[[], str], report: StreamReport,
                 measure_delays: bool = False) -> None:
        self.lake, self.model_path, self.current_model = lake, model_path, current_model
        self.report, self.measure_delays = report, measure_delays
        self.pending: str | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        current = self.current_model()
        if current != self.model_path:
            self.pending = current
            raise ModelChanged(f"model {current} replaces {self.model_path} from micro-batch {batch_id}")
        t0 = time.time()
        lake = Lake(batch.sparkSession, self.lake.root)  # the query's session (a clone of the caller's)
        rows = batch.persist()
        try:
            counts = {r["kind"]: r["count"] for r in rows.groupBy("kind").count().collect()}
            if counts.get("phase"):
                lake.merge_new("phases", rows.where("kind = 'phase'"))
            if counts.get("late"):
                from ai4dl.traces.ingest import to_quarantine

                late = rows.where("kind = 'late'").select("source_file", "raw", F.col("reason").alias("reasons"))
                lake.merge_new("quarantine", to_quarantine(late))
            if counts.get("rec"):
                recs = rows.where("kind = 'rec'").withColumn("updated_at", F.current_timestamp())
                lake.upsert_newer("recommendations", recs.select(*spec("recommendations").schema.fieldNames()), "step")
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


def run_stream(
    lake: Lake,
    prepare: Callable[[str], Live],
    current_model: Callable[[], str],
    checkpoint: str,
    trigger: str = "availableNow",
    interval_seconds: float = 10.0,
    max_seconds: float | None = None,
    max_files_per_trigger: int = 1_000_000,
    on_model: Callable[[str, str], None] | None = None,
    measure_delays: bool = False,
) -> StreamReport:
    """Run the stream until bronze is drained (``availableNow``) or, ``continuous``, a micro-batch every
    ``interval_seconds`` until ``max_seconds`` (None: until stopped). ``prepare(model_path)`` gives the
    :class:`Live` inputs of a model; ``current_model()`` the model path to use now (asked at every batch
    boundary); ``on_model(path, model_id)`` is told each model the stream starts with."""
    from pyspark.errors import StreamingQueryException

    report = StreamReport()
    t0 = time.time()
    path = current_model()
    while True:
        live = prepare(path)
        report.models.append(live.model_id)
        if on_model is not None:
            on_model(path, live.model_id)
        writer = BatchWriter(lake, path, current_model, report, measure_delays)
        out = live_rows(bronze_stream(lake, max_files_per_trigger), live)
        stream = out.writeStream.foreachBatch(writer).option("checkpointLocation", checkpoint).outputMode("append")
        if trigger == "availableNow":
            stream = stream.trigger(availableNow=True)
        else:
            stream = stream.trigger(processingTime=f"{float(interval_seconds)} seconds")
        query = stream.start()
        try:
            if trigger == "availableNow" or max_seconds is None:
                query.awaitTermination()
            else:
                left = max(float(max_seconds) - (time.time() - t0), 0.0)
                if not query.awaitTermination(left):
                    _stop_between_batches(query)
        except StreamingQueryException:
            if writer.pending is None:
                raise
            path = writer.pending
            continue
        except KeyboardInterrupt:
            _stop_between_batches(query)
        break
    report.seconds = time.time() - t0
    return report


def _stop_between_batches(query: Any, patience: float = 60.0) -> None:
    """Stop a continuous query when no micro-batch is running (one that is would be replayed on restart:
    correct, but wasted work)."""
    deadline = time.time() + patience
    while time.time() < deadline and query.isActive and query.status.get("isTriggerActive"):
        time.sleep(0.05)
    query.stop()


__all__ = ["BatchWriter", "ModelChanged", "StreamReport", "bronze_stream", "live_rows", "run_stream"]
