"""The lake stays readable outside Spark: delta-rs (``deltalake``, the engine under DuckDB's and Polars' Delta
readers) reads every gold table, and the silver phases BI tools chart, and gets exactly the rows Spark wrote.

Every table as :class:`~ai4dl.lake.tables.Lake` creates it (its declared schema, NOT NULL columns, partitioning
and table properties, in this session's Delta configuration) must have a protocol the installed deltalake reads:
a table feature turned on later (deletion vectors, column mapping, ...) fails here before a dashboard does. The
phases and recommendations are then written as the stages and the stream write them (overwrite, insert-only
MERGE, upsert, a checkpoint) with the values that are easy to get wrong (NaN, nulls in and instead of arrays,
microseconds, time zones). The slow test runs a small fleet through the stages and the stream and compares every
gold table delta-rs reads with what Spark reads.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import Window
from pyspark.sql import functions as F

from ai4dl import stages
from ai4dl.lake import schema as S
from ai4dl.lake.tables import TABLES, Lake
from ai4dl.traces.synthetic import generate_fleet, write_fleet

pytest.importorskip("deltalake")
from deltalake import DeltaTable  # noqa: E402
from deltalake import table as delta_rs  # noqa: E402
from tests.configs import config_under

GOLD = tuple(name for name, s in TABLES.items() if s.path.startswith("gold/"))
# What a batch run writes (every gold table but the stream's recommendations) and what the stream writes.
BATCH = tuple(n for n in GOLD if n != "recommendations") + ("phases",)
STREAMED = ("recommendations", "phases")
# Reader features a BI tool cannot be assumed to have even when this deltalake's own reader has them.
REFUSED = {"deletionVectors", "columnMapping"}


# --- comparing what the two readers return -------------------------------------------------------------------


def _assert_readable(table: DeltaTable, name: str) -> None:
    """The table's protocol asks nothing of a reader that this deltalake (and its pyarrow reader) lacks."""
    protocol = table.protocol()
    features = set(protocol.reader_features or ())
    assert protocol.min_reader_version <= delta_rs.MAX_SUPPORTED_READER_VERSION, (name, protocol)
    assert features <= delta_rs.SUPPORTED_READER_FEATURES and not features & REFUSED, (name, protocol)
    # Column mapping under the legacy protocol (reader version 2) names no reader feature, and deltalake's pyarrow
    # reader then reads the physical column names as missing: every value null, no error. Refused by its property.
    mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    assert mapping == "none" and protocol.min_reader_version != 2, (name, mapping, protocol)


def _normalised(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in one order and one representation: arrays as tuples of floats, timestamps naive UTC."""
    out = frame.copy()
    for c in out.columns:
        col = out[c]
        if isinstance(col.dtype, pd.DatetimeTZDtype):
            col = col.dt.tz_convert("UTC").dt.tz_localize(None)
        if pd.api.types.is_datetime64_any_dtype(col.dtype):
            out[c] = col.astype("datetime64[us]").astype(object).map(lambda v: None if v is pd.NaT else v)
        elif col.map(lambda v: isinstance(v, (list, tuple, np.ndarray))).any():
            out[c] = col.map(lambda v: None if v is None else tuple(None if x is None else float(x) for x in v))
        else:
            out[c] = col.astype(object).map(lambda v: None if v is pd.NA or v is pd.NaT else v)
    order = out.map(repr)  # every column sorts, arrays and nulls too: ties never pair unequal rows
    return out.loc[order.sort_values(list(order.columns), kind="stable").index].reset_index(drop=True)


def _same(a, b) -> bool:
    """Equal values; floats to 1e-12 (relative), NaN equal to NaN, null only to null."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def _assert_same_rows(spark_rows: pd.DataFrame, rs_rows: pd.DataFrame, name: str) -> None:
    want, got = _normalised(spark_rows), _normalised(rs_rows)
    assert list(got.columns) == list(want.columns) and len(got) == len(want), name
    for c in want.columns:
        bad = [i for i, (a, b) in enumerate(zip(want[c], got[c])) if not _same(a, b)]
        assert not bad, f"{name}.{c}, row {bad[0]}: Spark {want[c][bad[0]]!r}, delta-rs {got[c][bad[0]]!r}"


def _assert_reads_like_spark(lake: Lake, name: str, *, rows: bool = True) -> DeltaTable:
    """delta-rs opens the table at Spark's version, with the declared columns, and reads the rows Spark reads."""
    table = DeltaTable(lake.path(name))
    _assert_readable(table, name)
    assert table.version() == lake.version(name), name
    got = table.to_pyarrow_table()
    from pyspark.sql.pandas.types import to_arrow_schema

    declared = to_arrow_schema(TABLES[name].schema)  # Spark's own Arrow types (timestamps in UTC), NOT NULLs kept
    assert [(f.name, str(f.type), f.nullable) for f in got.schema] == \
        [(f.name, str(f.type), f.nullable) for f in declared], name
    spark_rows = lake.read(name).toPandas()
    assert not rows or len(spark_rows) > 0, f"{name}: the pipeline wrote no rows, nothing is compared"
    _assert_same_rows(spark_rows, got.to_pandas(), name)
    return table


# --- every table as the lake creates it, and the phases and recommendations as the stages write them ----------


@pytest.fixture(scope="module")
def created(spark, test_config, tmp_path_factory):
    """Every table of the lake, created empty by ``Lake.ensure`` (schema, partitioning, properties)."""
    lake = Lake(spark, str(tmp_path_factory.mktemp("created") / "lake"))
    for name in TABLES:
        lake.ensure(name)
    return lake


@pytest.mark.parametrize("name", list(TABLES))
def test_every_table_as_created_has_a_protocol_delta_rs_reads(created, name):
    table = _assert_reads_like_spark(created, name, rows=False)
    assert table.to_pyarrow_table().num_rows == 0
    # the properties the spec sets (data-skipping statistics) are the ones delta-rs sees: nothing else was needed
    delta_properties = {k: v for k, v in table.metadata().configuration.items() if k.startswith("delta.")}
    assert delta_properties == TABLES[name].table_properties


T0 = datetime(2024, 2, 29, 23, 59, 58, 123456)  # microseconds, a leap day, a day boundary within the trace


def _phase_rows(pod: str, service: str, steps: range, *, model: str = "m1") -> list[tuple]:
    rows = []
    for i in steps:
        full = i >= 3  # the first steps have no history: no phase, no activations, no distance
        activations = [0.25 * i, None, float("nan"), -1e-300, 1e300][: 1 + i % 5] if full else None
        rows.append((pod, service, T0 + timedelta(seconds=30 * i), i, (i // 4) % 3 if full else None,
                     (float("nan") if i == 5 else 0.1 * i) if full else None, activations,
                     None if i == 4 else 0.5 + i / 7, 4.0, 1e9 + i, 8e9, "training" if i % 2 else None, model))
    return rows


def _recommendation(pod: str, step: int, updated: datetime) -> tuple:
    ts = T0 + timedelta(seconds=30 * step)
    return (pod, "svc-a" if pod != "pod-c" else None, ts, step, step % 3 if step > 2 else None, None, ts, step,
            None, float("nan") if step == 7 else 0.5, "phase.rule", "vpa", step + 1, (step + 1) // 5, 1.5, None,
            4.0, 8e9, "m1", "pm1", step // 4, updated)


def _checkpoint(spark, path: str) -> None:
    """A Delta checkpoint of the table's current version, as Spark writes one every 10 commits."""
    jvm = spark.sparkContext._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    log.checkpoint(log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty()), jvm.scala.Option.empty())


def test_phases_and_recommendations_as_the_stages_and_the_stream_write_them(spark, tmp_path):
    from ai4dl.lake.tables import local_frame

    lake = Lake(spark, str(tmp_path / "lake"))
    # label: one overwrite of the whole table, with its properties
    lake.overwrite("phases", local_frame(spark, _phase_rows("pod-a", "svc-a", range(12))
                                         + _phase_rows("pod-b", "svc-b", range(8)), S.PHASES),
                   properties={"ai4dl.model_id": "m1"})
    # the stream: insert-only MERGEs of the new steps (a replayed step is not inserted twice)
    lake.merge_new("phases", local_frame(spark, _phase_rows("pod-a", "svc-a", range(10, 16)), S.PHASES))
    lake.merge_new("phases", local_frame(spark, _phase_rows("pod-c", "svc-a", range(6)), S.PHASES))
    # and the recommendations: one row per container, replaced by a newer one
    t = datetime(2024, 3, 1, 0, 10)
    first = [_recommendation(p, s, t) for p, s in (("pod-a", 9), ("pod-b", 7))]
    lake.upsert_newer("recommendations", local_frame(spark, first, S.RECOMMENDATIONS), "ts")
    later = [_recommendation(p, s, t + timedelta(minutes=1)) for p, s in (("pod-a", 15), ("pod-b", 6), ("pod-c", 5))]
    lake.upsert_newer("recommendations", local_frame(spark, later, S.RECOMMENDATIONS), "ts")

    phases = _assert_reads_like_spark(lake, "phases")
    assert len(phases.to_pyarrow_table()) == 16 + 8 + 6
    recs = _assert_reads_like_spark(lake, "recommendations").to_pandas().set_index("pod_id")
    assert recs["step"].to_dict() == {"pod-a": 15, "pod-b": 7, "pod-c": 5}  # pod-b's older row did not win
    assert phases.metadata().configuration["ai4dl.model_id"] == "m1"
    import pyarrow.parquet as pq  # timestamps as Parquet's standard type, not Spark's legacy INT96 (DuckDB, Polars)

    data_file = next((tmp_path / "lake" / "silver" / "phases").rglob("part-*.parquet"))
    ts = pq.ParquetFile(data_file).schema.column(pq.ParquetFile(data_file).schema_arrow.get_field_index("ts"))
    assert ts.physical_type == "INT64" and "micro" in ts.logical_type.to_json().lower(), ts.logical_type.to_json()

    # filters prune with the log's statistics, kept for some columns only (dataSkippingStatsColumns): right rows
    for column, op, value in (("pod_id", "=", "pod-c"), ("phase", "=", 1), ("cpu_usage_cores", ">", 1.5),
                              ("service", "=", "svc-b")):
        got = phases.to_pyarrow_table(filters=[(column, op, value)]).to_pandas()
        want = lake.read("phases").where(f"{column} {op} {value!r}").toPandas()
        _assert_same_rows(want, got, f"phases where {column} {op} {value!r}")

    # a checkpoint (parquet, written by Spark) instead of the JSON commits: the same table
    _checkpoint(spark, lake.path("phases"))
    assert any(p.name.endswith(".checkpoint.parquet") for p in (tmp_path / "lake" / "silver" / "phases" / "_delta_log").iterdir())
    _assert_reads_like_spark(lake, "phases")
    lake.merge_new("phases", local_frame(spark, _phase_rows("pod-c", "svc-a", range(6, 9)), S.PHASES))
    assert len(_assert_reads_like_spark(lake, "phases").to_pyarrow_table()) == 16 + 8 + 9


# --- a fleet through the stages and the stream -----------------------------------------------------------------


@pytest.fixture(scope="module")
def lakes(spark, test_config, tmp_path_factory):
    """A batch lake with every gold table the stages write, and a stream lake with live phases and recommendations."""
    base = tmp_path_factory.mktemp("delta-rs")
    cfg = config_under(
        test_config, base,
        train={"epochs": 2, "k": 3, "sample_size": 600, "patience": 1, "device": "cpu"},
        policies={"interval_steps": 5},
    )
    # The stream sees each container's first 40 steps, then the rest: recommendations inserted, then updated.
    fleet = generate_fleet(spark, 8, 60, seed=11, services=2, partitions=2)
    fleet = fleet.withColumn("_first", F.col("timestamp") < F.min("timestamp").over(Window.partitionBy("`pod.id`")) + 30 * 40)
    parts = [str(base / "raw" / "first"), str(base / "raw" / "second")]
    write_fleet(fleet.where("_first").drop("_first"), parts[0], "parquet")
    write_fleet(fleet.where("NOT _first").drop("_first"), parts[1], "parquet")

    stages.ingest(cfg, spark, input=str(base / "raw" / "*"), fmt="parquet")
    stages.window(cfg, spark)
    model_dir = stages.train(cfg, spark).details["path"]
    stages.label(cfg, spark)
    stages.behaviour(cfg, spark)
    policy_dir = stages.policies(cfg, spark).details["path"]

    live = cfg.replace(lake={"root": str(base / "live"), "models": cfg.lake.models},
                       label={"model": model_dir}, policies={"model": policy_dir})
    for part in parts:
        stages.ingest(live, spark, input=part, fmt="parquet")
        stages.stream(live, spark)
    return SimpleNamespace(batch=Lake.for_config(spark, cfg), live=Lake.for_config(spark, live))


def test_the_fleet_test_covers_every_gold_table():
    assert set(BATCH) | set(STREAMED) >= set(GOLD) | {"phases"}


@pytest.mark.slow
def test_delta_rs_reads_every_gold_table_the_pipeline_wrote(lakes):
    assert lakes.batch.count("bronze") == lakes.live.count("bronze") == 8 * 60
    for name in BATCH:
        _assert_reads_like_spark(lakes.batch, name)
    for name in STREAMED:
        _assert_reads_like_spark(lakes.live, name)
    assert lakes.live.count("recommendations") == 8 and lakes.live.count("phases") == 8 * 60
