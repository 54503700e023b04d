"""Ingest: the DLaaS sample, idempotent re-ingest, every quarantine reason, in-input duplicates."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ai4dl.errors import InputError
from ai4dl.traces.ingest import ingest
from ai4dl.lake.schema import BRONZE, QUARANTINE
from ai4dl.lake.tables import Lake

def test_dlaas_sample_ingests_every_row(cfg, dlaas_sample, spark, lake):
    sample = str(dlaas_sample)
    result = ingest(lake, cfg.ingest, sample)
    assert (result.read, result.valid, result.inserted, result.quarantined) == (204, 204, 204, 0)
    bronze = lake.read("bronze")
    assert bronze.schema == BRONZE
    assert bronze.count() == 204
    assert bronze.select("pod_id").distinct().count() == 4
    first = bronze.where("pod_id = 'exec1'").orderBy("ts").first()
    assert first["ts"].isoformat() == "2019-08-16T13:30:20"
    assert first["mem_limit"] == 5242880000.0


def test_reingest_is_idempotent(cfg, dlaas_sample, spark, lake):
    sample = str(dlaas_sample)
    ingest(lake, cfg.ingest, sample)
    again = ingest(lake, cfg.ingest, sample)
    assert again.inserted == 0 and again.valid == 204
    assert lake.read("bronze").count() == 204
    assert lake.read("quarantine").count() == 0


BAD_ROWS = {  # reason -> the change to the good row that causes it
    "missing_id": dict(pod_id=""),
    "missing_timestamp": dict(timestamp="", pod_id="p2"),
    "unparseable_timestamp": dict(timestamp="yesterday", pod_id="p3"),
    "unparseable_number:cpu_usage": dict(cpu_usage="12abc", pod_id="p4"),
    "missing_value:mem_current": dict(mem_current="", pod_id="p5"),
    "non_finite:cpu_usage_cores": dict(cpu_usage_cores="NaN", pod_id="p6"),
    "non_finite:mem_working_set": dict(mem_working_set="inf", pod_id="p7"),
    "negative:cpu_usage": dict(cpu_usage="-5", pod_id="p8"),
    "usage_above_limit:mem_current": dict(mem_current="524288000000", pod_id="p9"),
    "usage_above_limit:cpu_usage_cores": dict(cpu_usage_cores="400", pod_id="p10"),
}


def test_each_quarantine_reason(cfg, export, spark, lake, tmp_path):
    good = [export.row(), export.row(timestamp="1565962230")]
    path = export.write(tmp_path / "in.csv", [good[0], *(export.row(**changes) for changes in BAD_ROWS.values()), good[1]])
    result = ingest(lake, cfg.ingest, path)
    assert (result.read, result.valid, result.quarantined) == (2 + len(BAD_ROWS), 2, len(BAD_ROWS))
    q = lake.read("quarantine")
    assert q.schema == QUARANTINE
    got = q.collect()
    assert len(got) == len(BAD_ROWS)
    for reason in BAD_ROWS:
        match = [r for r in got if reason in r["reason"].split(";")]
        assert len(match) == 1, (reason, [r["reason"] for r in got])
        assert match[0]["source_file"].endswith("in.csv") and match[0]["occurrences"] == 1
        assert '"pod.id":' in match[0]["raw"]  # the raw row, with its source names, nulls included
    assert lake.read("bronze").count() == 2
    # rerun: neither table grows
    again = ingest(lake, cfg.ingest, path)
    assert again.inserted == 0
    assert lake.read("quarantine").count() == len(BAD_ROWS)
    assert lake.read("bronze").count() == 2


def test_duplicates_keep_one_row_deterministically(cfg, export, spark, lake, tmp_path):
    a = export.row(cpu_usage="100")
    b = export.row(cpu_usage="200")
    r1 = ingest(lake, cfg.ingest, export.write(tmp_path / "one.csv", [a, b, a]))
    kept1 = lake.read("bronze").first()["cpu_usage"]
    assert (r1.valid, r1.duplicates, r1.quarantined) == (1, 2, 2)
    other = Lake(spark, str(tmp_path / "lake2"))
    ingest(other, cfg.ingest, export.write(tmp_path / "two.csv", [b, a, a]))
    assert other.read("bronze").first()["cpu_usage"] == kept1
    reasons = [r["reason"] for r in lake.read("quarantine").collect()]
    assert set(reasons) == {"duplicate_key"}


def test_timestamps_in_seconds_millis_and_iso(cfg, export, spark, lake, tmp_path):
    rows = [export.row(timestamp="1565962220", pod_id="s"), export.row(timestamp="1565962220000", pod_id="ms"),
            export.row(timestamp="2019-08-16T13:30:20Z", pod_id="iso")]
    ingest(lake, cfg.ingest, export.write(tmp_path / "ts.csv", rows))
    ts = {r["pod_id"]: r["ts"] for r in lake.read("bronze").collect()}
    assert ts["s"] == ts["ms"] == ts["iso"]


def test_renamed_columns_through_config(cfg, export, spark, lake, tmp_path):
    header = ["time"] + export.HEADER[1:]
    renamed = cfg.replace(ingest={"columns": {"time": "ts"}})
    result = ingest(lake, renamed.ingest, export.write(tmp_path / "r.csv", [export.row()], header=header))
    assert result.inserted == 1


def test_missing_column_is_a_clear_error(cfg, export, spark, lake, tmp_path):
    header = [h for h in export.HEADER if h != "mem.limit"]
    path = export.write(tmp_path / "m.csv", [[v for h, v in zip(export.HEADER, export.GOOD) if h != "mem.limit"]], header=header)
    with pytest.raises(InputError, match=r"m\.csv: missing column\(s\) 'mem.limit'"):
        ingest(lake, cfg.ingest, path)


def test_parquet_input(cfg, dlaas_sample, spark, lake, tmp_path):
    src = spark.read.option("header", True).option("inferSchema", True).csv(str(dlaas_sample))
    src.write.parquet(str(tmp_path / "pq"))
    assert ingest(lake, cfg.ingest, str(tmp_path / "pq"), fmt="parquet").inserted == 204


# --- every file by its own header (a folder of exports that do not agree on column order) ------------------


def _bronze_rows(lake):
    """Bronze's rows without the load time and file name, sorted: equal lists, equal tables."""
    df = lake.read("bronze").drop("ingested_at", "source_file")
    return sorted(tuple(r) for r in df.collect())


def _split_sample(dlaas_sample, folder, orders):
    """The sample's containers written as one file per column order (a list of column lists)."""
    import pandas as pd

    folder.mkdir()
    raw = pd.read_csv(dlaas_sample, dtype=str, keep_default_na=False)
    pods = sorted(raw["pod.id"].unique())
    for i, columns in enumerate(orders):
        part = raw[raw["pod.id"].isin(pods[i::len(orders)])]
        part[list(columns)].to_csv(folder / f"part-{i}.csv", index=False)
    return raw


def test_a_folder_with_swapped_columns_lands_like_the_plain_sample(cfg, dlaas_sample, spark, tmp_path):
    plain = Lake(spark, str(tmp_path / "plain"))
    ingest(plain, cfg.ingest, str(dlaas_sample))
    header = list(__import__("pandas").read_csv(dlaas_sample, nrows=0).columns)
    swapped = list(header)
    a, b = swapped.index("cpu.usage.pct"), swapped.index("mem.usage.pct")
    swapped[a], swapped[b] = swapped[b], swapped[a]
    _split_sample(dlaas_sample, tmp_path / "folder", [header, swapped, list(reversed(header))])
    folder = Lake(spark, str(tmp_path / "lake-folder"))
    result = ingest(folder, cfg.ingest, str(tmp_path / "folder"))
    assert (result.valid, result.quarantined) == (204, 0)
    assert _bronze_rows(folder) == _bronze_rows(plain)


def test_pandas_index_columns_are_understood(cfg, dlaas_sample, spark, tmp_path):
    import pandas as pd

    plain = Lake(spark, str(tmp_path / "plain"))
    ingest(plain, cfg.ingest, str(dlaas_sample))
    raw = pd.read_csv(dlaas_sample, dtype=str, keep_default_na=False)
    labelled = tmp_path / "labelled.csv"  # header ",timestamp,...": an index column with an empty label
    raw.to_csv(labelled)
    short = tmp_path / "short.csv"  # header "timestamp,...": the index has no header field at all
    text = labelled.read_text().splitlines()
    short.write_text("\n".join([text[0].lstrip(","), *text[1:]]) + "\n")
    for path in (labelled, short):
        lake = Lake(spark, str(tmp_path / f"lake-{path.stem}"))
        result = ingest(lake, cfg.ingest, str(path))
        assert (result.valid, result.quarantined) == (204, 0), path
        assert _bronze_rows(lake) == _bronze_rows(plain), path


def test_a_row_of_the_wrong_width_is_quarantined_whole(cfg, export, lake, tmp_path):
    path = tmp_path / "wide.csv"
    line = ",".join(export.row(pod_id="p9")) + ",extra,fields"
    path.write_text(",".join(export.HEADER) + "\n" + ",".join(export.GOOD) + "\n" + line + "\n")
    result = ingest(lake, cfg.ingest, str(path))
    assert (result.valid, result.quarantined) == (1, 1)
    (bad,) = lake.read("quarantine").collect()
    assert bad["reason"].split(";")[0] == "malformed_row"
    assert json.loads(bad["raw"]) == {"line": line}  # the whole line, nothing cut


def test_a_header_that_fits_no_row_is_one_line_naming_the_file(cfg, export, lake, tmp_path):
    path = tmp_path / "odd.csv"
    path.write_text(",".join(export.HEADER) + "\n" + ",".join(export.GOOD[:-3]) + "\n")
    with pytest.raises(InputError, match=r"odd\.csv: the header has 12 fields but the first row has 9"):
        ingest(lake, cfg.ingest, str(path))


def test_a_file_missing_a_column_in_a_folder_is_named(cfg, export, lake, tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    export.write(folder / "a.csv", [export.row()])
    header = [h for h in export.HEADER if h != "mem.limit"]
    export.write(folder / "b.csv", [[v for h, v in zip(export.HEADER, export.GOOD) if h != "mem.limit"]], header=header)
    with pytest.raises(InputError, match=r"b\.csv: missing column\(s\) 'mem.limit'"):
        ingest(lake, cfg.ingest, str(folder))
    assert not lake.exists("bronze")  # refused before anything was written


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=10**6))
def test_any_column_order_per_file_lands_like_one_file(cfg, dlaas_sample, spark, tmp_path_factory, seed):
    import random

    header = list(__import__("pandas").read_csv(dlaas_sample, nrows=0).columns)
    rng = random.Random(seed)
    orders = [rng.sample(header, len(header)) for _ in range(rng.randint(2, 4))]
    base = tmp_path_factory.mktemp("shuffled")
    _split_sample(dlaas_sample, base / "folder", orders)
    one, many = Lake(spark, str(base / "one")), Lake(spark, str(base / "many"))
    ingest(one, cfg.ingest, str(dlaas_sample))
    ingest(many, cfg.ingest, str(base / "folder"))
    assert _bronze_rows(many) == _bronze_rows(one)


# --- every common CSV shape, made from the DLaaS sample, lands exactly like the plain sample ----------------


@pytest.fixture(scope="module")
def plain_bronze(spark, test_config, dlaas_sample, tmp_path_factory):
    """Bronze's rows of the plain sample: what every reshaped copy of it must give."""
    lake = Lake(spark, str(tmp_path_factory.mktemp("plain-shapes")))
    ingest(lake, test_config.ingest, str(dlaas_sample))
    return _bronze_rows(lake)


def _sample_rows(dlaas_sample):
    import csv as _csv

    with open(dlaas_sample, newline="") as fh:
        rows = list(_csv.reader(fh))
    return rows[0], rows[1:]


def _write(path, header, rows, **fmt):
    import csv as _csv

    with path.open("w", newline="", encoding=fmt.pop("encoding", "utf-8")) as fh:
        w = _csv.writer(fh, **fmt)
        if header is not None:
            w.writerow(header)
        w.writerows(rows)
    return path


def _with_ts(header, rows, convert):
    i = header.index("timestamp")
    return [[convert(v) if j == i else v for j, v in enumerate(r)] for r in rows]


def _iso(offset_hours):
    from datetime import datetime, timedelta, timezone

    tz = timezone(timedelta(hours=offset_hours))
    return lambda v: datetime.fromtimestamp(int(v), tz).isoformat()


def _shape_pandas_index(tmp, header, rows):  # pandas to_csv(index=True): ",timestamp,..." then "0,..."
    return _write(tmp / "s.csv", ["", *header], [[str(i), *r] for i, r in enumerate(rows)])


def _shape_vr_index(tmp, header, rows):  # the original sample-vr.csv: header one field short, index from 1
    return _write(tmp / "s.csv", header, [[str(i + 1), *r] for i, r in enumerate(rows)])


def _shape_crlf(tmp, header, rows):
    return _write(tmp / "s.csv", header, rows, lineterminator="\r\n")


def _shape_bom(tmp, header, rows):
    return _write(tmp / "s.csv", header, rows, encoding="utf-8-sig")


def _shape_all_quoted(tmp, header, rows):
    import csv as _csv

    return _write(tmp / "s.csv", header, rows, quoting=_csv.QUOTE_ALL)


def _shape_unquoted(tmp, header, rows):
    return _write(tmp / "s.csv", header, rows, quoting=__import__("csv").QUOTE_MINIMAL)


def _shape_semicolon(tmp, header, rows):
    return _write(tmp / "s.csv", header, rows, delimiter=";")


def _shape_tab(tmp, header, rows):
    return _write(tmp / "s.tsv", header, rows, delimiter="\t")


def _shape_pipe(tmp, header, rows):
    return _write(tmp / "s.csv", header, rows, delimiter="|")


def _shape_gzip(tmp, header, rows):
    import gzip

    plain = _write(tmp / "plain.txt", header, rows)
    (tmp / "s.csv.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return tmp / "s.csv.gz"


def _shape_epoch_millis(tmp, header, rows):
    return _write(tmp / "s.csv", header, _with_ts(header, rows, lambda v: str(int(v) * 1000)))


def _shape_epoch_float(tmp, header, rows):
    return _write(tmp / "s.csv", header, _with_ts(header, rows, lambda v: f"{int(v)}.0"))


def _shape_iso_utc(tmp, header, rows):
    return _write(tmp / "s.csv", header, _with_ts(header, rows, lambda v: _iso(0)(v).replace("+00:00", "Z")))


def _shape_iso_offsets(tmp, header, rows):  # the same instants written in two other time zones
    half = len(rows) // 2
    return _write(tmp / "s.csv", header, _with_ts(header, rows[:half], _iso(2)) + _with_ts(header, rows[half:], _iso(-5)))


def _shape_iso_space(tmp, header, rows):  # "2019-08-16 13:30:20" (no T, no zone: UTC)
    return _write(tmp / "s.csv", header, _with_ts(header, rows, lambda v: _iso(0)(v)[:19].replace("T", " ")))


def _shape_everything(tmp, header, rows):  # BOM, CRLF, ';', a pandas index, ISO offsets, gzip at once
    import gzip

    plain = _write(tmp / "p.txt", ["", *header], [[str(i), *r] for i, r in enumerate(_with_ts(header, rows, _iso(1)))],
                   delimiter=";", lineterminator="\r\n", encoding="utf-8-sig")
    (tmp / "s.csv.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return tmp / "s.csv.gz"


SHAPES = {name[len("_shape_"):]: fn for name, fn in dict(globals()).items() if name.startswith("_shape_")}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_csv_shape_lands_like_the_plain_sample(shape, cfg, dlaas_sample, spark, plain_bronze, tmp_path):
    header, rows = _sample_rows(dlaas_sample)
    folder = tmp_path / "in"
    folder.mkdir()
    path = SHAPES[shape](folder, header, rows)
    lake = Lake(spark, str(tmp_path / "lake"))
    result = ingest(lake, cfg.ingest, str(path))
    assert (result.read, result.valid, result.quarantined) == (204, 204, 0), shape
    assert _bronze_rows(lake) == plain_bronze, shape
