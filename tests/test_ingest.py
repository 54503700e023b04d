"""Ingest: the DLaaS sample, idempotent re-ingest, every quarantine reason, in-input duplicates."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from ai4dl import lake
from ai4dl.ingest import IngestError, ingest
from ai4dl.schema import BRONZE, QUARANTINE
from tests.conftest import DLAAS_SAMPLE, require_shared

HEADER = [
    "timestamp", "service", "pod.id", "cpu.num.cores", "cpu.usage", "cpu.usage.cores", "cpu.usage.pct",
    "cpu.usage.pct.container.requested", "mem.current", "mem.limit", "mem.usage.pct", "mem.working.set",
]
GOOD = ["1565962220", "svc", "p1", "4", "756911788", "0.041", "1.03", "1", "2478080", "5242880000", "0.05", "2478080"]


def write_csv(path: Path, rows: list[list[str]], header: list[str] = HEADER) -> str:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def row(**changes: str) -> list[str]:
    r = dict(zip(HEADER, GOOD))
    r.update({k.replace("_", "."): v for k, v in changes.items()})
    return [r[h] for h in HEADER]


def test_dlaas_sample_ingests_every_row(spark, lake):
    sample = str(require_shared(DLAAS_SAMPLE))
    result = ingest(spark, lake, sample)
    assert (result.read, result.valid, result.inserted, result.quarantined) == (204, 204, 204, 0)
    bronze = lake_read(spark, lake, "bronze")
    assert bronze.schema == BRONZE
    assert bronze.count() == 204
    assert bronze.select("pod_id").distinct().count() == 4
    first = bronze.where("pod_id = 'exec1'").orderBy("ts").first()
    assert first["ts"].isoformat() == "2019-08-16T13:30:20"
    assert first["mem_limit"] == 5242880000.0


def test_reingest_is_idempotent(spark, lake):
    sample = str(require_shared(DLAAS_SAMPLE))
    ingest(spark, lake, sample)
    again = ingest(spark, lake, sample)
    assert again.inserted == 0 and again.valid == 204
    assert lake_read(spark, lake, "bronze").count() == 204
    assert lake_read(spark, lake, "quarantine").count() == 0


BAD_ROWS = {
    "missing_id": row(pod_id=""),
    "missing_timestamp": row(timestamp="", pod_id="p2"),
    "unparseable_timestamp": row(timestamp="yesterday", pod_id="p3"),
    "unparseable_number:cpu_usage": row(cpu_usage="12abc", pod_id="p4"),
    "missing_value:mem_current": row(mem_current="", pod_id="p5"),
    "non_finite:cpu_usage_cores": row(cpu_usage_cores="NaN", pod_id="p6"),
    "non_finite:mem_working_set": row(mem_working_set="inf", pod_id="p7"),
    "negative:cpu_usage": row(cpu_usage="-5", pod_id="p8"),
    "usage_above_limit:mem_current": row(mem_current="524288000000", pod_id="p9"),
    "usage_above_limit:cpu_usage_cores": row(cpu_usage_cores="400", pod_id="p10"),
}


def test_each_quarantine_reason(spark, lake, tmp_path):
    good = [row(), row(timestamp="1565962230")]
    path = write_csv(tmp_path / "in.csv", [good[0], *BAD_ROWS.values(), good[1]])
    result = ingest(spark, lake, path)
    assert (result.read, result.valid, result.quarantined) == (2 + len(BAD_ROWS), 2, len(BAD_ROWS))
    q = lake_read(spark, lake, "quarantine")
    assert q.schema == QUARANTINE
    got = q.collect()
    assert len(got) == len(BAD_ROWS)
    for reason in BAD_ROWS:
        match = [r for r in got if reason in r["reason"].split(";")]
        assert len(match) == 1, (reason, [r["reason"] for r in got])
        assert match[0]["source_file"].endswith("in.csv") and match[0]["occurrences"] == 1
        assert '"pod.id":' in match[0]["raw"]  # the raw row, with its source names, nulls included
    assert lake_read(spark, lake, "bronze").count() == 2
    # rerun: neither table grows
    again = ingest(spark, lake, path)
    assert again.inserted == 0
    assert lake_read(spark, lake, "quarantine").count() == len(BAD_ROWS)
    assert lake_read(spark, lake, "bronze").count() == 2


def test_duplicates_keep_one_row_deterministically(spark, lake, tmp_path):
    a = row(cpu_usage="100")
    b = row(cpu_usage="200")
    r1 = ingest(spark, lake, write_csv(tmp_path / "one.csv", [a, b, a]))
    kept1 = lake_read(spark, lake, "bronze").first()["cpu_usage"]
    assert (r1.valid, r1.duplicates, r1.quarantined) == (1, 2, 2)
    other = dict(lake)
    other["lake"] = {**lake["lake"], "root": str(tmp_path / "lake2")}
    ingest(spark, other, write_csv(tmp_path / "two.csv", [b, a, a]))
    assert lake_read(spark, other, "bronze").first()["cpu_usage"] == kept1
    reasons = [r["reason"] for r in lake_read(spark, lake, "quarantine").collect()]
    assert set(reasons) == {"duplicate_key"}


def test_timestamps_in_seconds_millis_and_iso(spark, lake, tmp_path):
    rows = [row(timestamp="1565962220", pod_id="s"), row(timestamp="1565962220000", pod_id="ms"),
            row(timestamp="2019-08-16T13:30:20Z", pod_id="iso")]
    ingest(spark, lake, write_csv(tmp_path / "ts.csv", rows))
    ts = {r["pod_id"]: r["ts"] for r in lake_read(spark, lake, "bronze").collect()}
    assert ts["s"] == ts["ms"] == ts["iso"]


def test_renamed_columns_through_config(spark, lake, tmp_path):
    header = ["time"] + HEADER[1:]
    cfg = {**lake, "ingest": {**lake["ingest"], "columns": {"time": "ts"}}}
    result = ingest(spark, cfg, write_csv(tmp_path / "r.csv", [row()], header=header))
    assert result.inserted == 1


def test_missing_column_is_a_clear_error(spark, lake, tmp_path):
    header = [h for h in HEADER if h != "mem.limit"]
    path = write_csv(tmp_path / "m.csv", [[v for h, v in zip(HEADER, GOOD) if h != "mem.limit"]], header=header)
    with pytest.raises(IngestError, match=r"m\.csv: missing column\(s\) 'mem.limit'"):
        ingest(spark, lake, path)


def test_parquet_input(spark, lake, tmp_path):
    src = spark.read.option("header", True).option("inferSchema", True).csv(str(require_shared(DLAAS_SAMPLE)))
    src.write.parquet(str(tmp_path / "pq"))
    assert ingest(spark, lake, str(tmp_path / "pq"), fmt="parquet").inserted == 204


def lake_read(spark, cfg, name):
    return lake.read(spark, cfg, name)
