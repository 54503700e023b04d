"""Bad input: every malformed export gets correct output or a one-line error naming file, column and reason.

Valid rows beside bad ones are never lost: every test counts what went to bronze and what to quarantine.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ai4dl.errors import InputError
from ai4dl.traces.ingest import ingest, validate
from ai4dl.lake.columns import METRICS, source_name


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text




# --- files that cannot be read at all ---------------------------------------------------------------------


def test_empty_file_is_a_one_line_error(cfg, spark, lake, tmp_path):
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    with pytest.raises(InputError) as info:
        ingest(lake, cfg.ingest, str(path))
    assert _one_line(info.value) == f"{path}: empty input (no header)"


def test_missing_path_is_a_one_line_error(cfg, spark, lake, tmp_path):
    with pytest.raises(InputError) as info:
        ingest(lake, cfg.ingest, str(tmp_path / "nowhere.csv"))
    assert _one_line(info.value).endswith("nowhere.csv: no such input")


def test_cli_turns_an_ingest_error_into_one_line(spark, cfg, tmp_path, capsys):
    from ai4dl.cli import main

    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    code = main(["ingest", str(path), "--set", f"lake.root={cfg.lake.root}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"ai4dl ingest: {path}: empty input (no header)"]


def test_header_only_ingests_zero_rows(cfg, export, spark, lake, tmp_path):
    result = ingest(lake, cfg.ingest, export.write(tmp_path / "header.csv", []))
    assert (result.read, result.valid, result.inserted, result.quarantined) == (0, 0, 0, 0)
    assert lake.read("bronze").count() == 0


def test_wrong_delimiter_names_file_columns_and_the_fix(cfg, export, spark, lake, tmp_path):
    path = tmp_path / "semi.csv"
    path.write_text(";".join(export.HEADER) + "\n" + ";".join(export.GOOD) + "\n")
    comma = cfg.replace(ingest={"delimiter": ","})  # configured, not detected (the default, auto, reads it)
    with pytest.raises(InputError) as info:
        ingest(lake, comma.ingest, str(path))
    msg = _one_line(info.value)
    assert msg.startswith(f"{path}: missing column(s) 'pod.id'")
    assert "--set ingest.delimiter=';'" in msg
    fixed = cfg.replace(ingest={"delimiter": ";"})
    assert ingest(lake, fixed.ingest, str(path)).inserted == 1
    assert cfg.ingest.delimiter == "auto" and ingest(lake, cfg.ingest, str(path)).valid == 1


def test_delimiter_key_is_typed(cfg):
    from ai4dl.errors import ConfigError

    assert cfg.replace(ingest={"delimiter": "\\t"}).ingest.delimiter == "\t"  # as typed in YAML or a shell
    assert cfg.replace(ingest={"delimiter": "tab"}).ingest.delimiter == "\t"
    with pytest.raises(ConfigError, match="ingest.delimiter: ';;' is not allowed: 'auto' or one character"):
        cfg.replace(ingest={"delimiter": ";;"})


def test_a_binary_or_utf16_file_is_one_line(cfg, export, spark, lake, tmp_path):
    path = tmp_path / "utf16.csv"
    path.write_text(",".join(export.HEADER) + "\n" + ",".join(export.GOOD) + "\n", encoding="utf-16")
    with pytest.raises(InputError) as info:
        ingest(lake, cfg.ingest, str(path))
    assert _one_line(info.value) == f"{path}: not a UTF-8 text CSV (binary, or UTF-16 text?); " \
        "save it as UTF-8 CSV, or pass --format parquet for a Parquet file"
    assert not lake.exists("bronze")


def test_missing_column_names_file_and_column(cfg, export, spark, lake, tmp_path):
    header = [h for h in export.HEADER if h != "pod.id"]
    path = export.write(tmp_path / "nopod.csv", [[v for h, v in zip(export.HEADER, export.GOOD) if h != "pod.id"]], header=header)
    with pytest.raises(InputError) as info:
        ingest(lake, cfg.ingest, path)
    assert _one_line(info.value).startswith(f"{path}: missing column(s) 'pod.id';")


def test_renamed_columns_map_through_config(cfg, export, spark, lake, tmp_path):
    renames = {"timestamp": "time", "pod.id": "container", "mem.current": "memory_bytes"}
    header = [renames.get(h, h) for h in export.HEADER]
    renamed = cfg.replace(ingest={"columns": {"time": "ts", "container": "pod_id", "memory_bytes": "mem_current"}})
    result = ingest(lake, renamed.ingest, export.write(tmp_path / "renamed.csv", [export.row(), export.row(timestamp="1565962230")], header=header))
    assert (result.read, result.inserted) == (2, 2)
    got = lake.read("bronze").orderBy("ts").first()
    assert got["pod_id"] == "p1" and got["mem_current"] == 2478080.0


# --- bad values beside good ones ---------------------------------------------------------------------------


def test_bad_values_are_quarantined_and_good_rows_kept(cfg, export, spark, lake, tmp_path):
    """Strings in numbers, NaN/inf/negative/huge values, timestamps in every format, extra column, blank service."""
    header = [*export.HEADER, "node"]  # an extra column: ignored for bronze, kept in the raw JSON
    cases = [  # (row, expected reason or None for valid)
        (export.row(pod_id="s"), None),
        (export.row(pod_id="ms", timestamp="1565962220000"), None),
        (export.row(pod_id="iso", timestamp="2019-08-16T13:30:20Z"), None),
        (export.row(pod_id="space", timestamp="2019-08-16 13:30:20"), None),
        (export.row(pod_id="huge", cpu_usage="1e300"), None),  # finite, not limit-checked: a valid (if odd) number
        (export.row(pod_id="noservice", service=""), None),  # blank service -> "unknown", not a null partition
        (export.row(pod_id="zero", cpu_usage="0", mem_current="0", mem_working_set="0"), None),
        (export.row(pod_id="b1", cpu_usage="twelve"), "unparseable_number:cpu_usage"),
        (export.row(pod_id="b2", mem_limit="NaN"), "non_finite:mem_limit"),
        (export.row(pod_id="b3", cpu_usage_pct="-inf"), "non_finite:cpu_usage_pct"),
        (export.row(pod_id="b4", mem_current="-1"), "negative:mem_current"),
        (export.row(pod_id="b5", cpu_usage="1e400"), "non_finite:cpu_usage"),  # overflows to infinity
        (export.row(pod_id="b6", mem_working_set="5e20"), "usage_above_limit:mem_working_set"),
        (export.row(pod_id="b7", timestamp="1e300"), "unparseable_timestamp"),  # would overflow a long
        (export.row(pod_id="b8", timestamp="inf"), "unparseable_timestamp"),
        (export.row(pod_id="b9", timestamp="NaN"), "unparseable_timestamp"),
        (export.row(pod_id="b10", timestamp="99999999999999999"), "unparseable_timestamp"),  # ms after year 9999
        (export.row(pod_id="b11", timestamp="2019-02-30T00:00:00"), "unparseable_timestamp"),
        (export.row(pod_id="b12", cpu_num_cores=""), "missing_value:cpu_num_cores"),
    ]
    rows = [[*r, f"node-{i}"] for i, (r, _) in enumerate(cases)]
    path = export.write(tmp_path / "mixed.csv", rows, header=header)
    result = ingest(lake, cfg.ingest, path)
    n_good = sum(1 for _, reason in cases if reason is None)
    assert (result.read, result.valid, result.inserted, result.quarantined) == (len(cases), n_good, n_good, len(cases) - n_good)

    bronze = {r["pod_id"]: r for r in lake.read("bronze").collect()}
    assert set(bronze) == {r[export.HEADER.index("pod.id")] for r, reason in cases if reason is None}
    assert bronze["s"]["ts"] == bronze["ms"]["ts"] == bronze["iso"]["ts"] == bronze["space"]["ts"]
    assert bronze["noservice"]["service"] == "unknown"
    assert bronze["huge"]["cpu_usage"] == 1e300

    quarantined = {json.loads(r["raw"])["pod.id"]: r for r in lake.read("quarantine").collect()}
    for r, reason in cases:
        if reason is None:
            continue
        pod = r[export.HEADER.index("pod.id")]
        assert quarantined[pod]["reason"].split(";") == [reason], (pod, quarantined[pod]["reason"])
        raw = json.loads(quarantined[pod]["raw"])
        assert raw["node"].startswith("node-")  # the extra column survives in the raw row
        assert quarantined[pod]["source_file"].endswith("mixed.csv")


def test_duplicates_and_out_of_order_rows(cfg, export, spark, lake, tmp_path):
    from ai4dl.method.scaler import Scaler
    from ai4dl.method.windowing import build_windows

    ts = [1565962220 + 30 * i for i in range(6)]
    rows = [export.row(timestamp=str(t), cpu_usage=str(100 + i)) for i, t in enumerate(ts)]
    shuffled = [rows[i] for i in (4, 1, 5, 0, 3, 2)] + [export.row(timestamp=str(ts[2]), cpu_usage="999")]  # a duplicate key
    result = ingest(lake, cfg.ingest, export.write(tmp_path / "ooo.csv", shuffled))
    assert (result.read, result.inserted, result.duplicates) == (7, 6, 1)
    bronze = lake.read("bronze")
    assert bronze.count() == bronze.select("pod_id", "ts").distinct().count() == 6
    scaler = Scaler(("cpu_usage",), (0.0,), (1.0,))
    silver = build_windows(bronze, scaler, n_history=2).orderBy("step").collect()
    assert [r["step"] for r in silver] == list(range(6))
    assert [r["ts"] for r in silver] == sorted(r["ts"] for r in silver)
    assert [r["has_full_history"] for r in silver] == [False, False, True, True, True, True]
    assert silver[2]["history"] == [silver[0]["features"][0], silver[1]["features"][0]]


# --- short containers, Unicode ids, tiny fleets -----------------------------------------------------------


@pytest.mark.slow
def test_unicode_ids_and_short_container_survive_ingest_window_label(cfg, export, reference_model, spark, lake, tmp_path):
    from ai4dl import stages

    imported = stages.import_reference_model(cfg, spark, path=str(reference_model))
    model, model_dir = imported.details["model"], imported.details["path"]
    n = model.n_history
    uni, short = "pod-é-日本", "short-ü"
    rows = [export.row(pod_id=uni, service="svc-ß", timestamp=str(1565962220 + 30 * i), cpu_usage=str(7e8 + 1e7 * i)) for i in range(n + 4)]
    rows += [export.row(pod_id=short, timestamp=str(1565962220 + 30 * i)) for i in range(n - 1)]  # fewer rows than the history
    result = ingest(lake, cfg.ingest, export.write(tmp_path / "unicode.csv", rows))
    assert result.inserted == len(rows)
    stages.window(cfg, spark, scaler_from_model=model_dir)
    stages.label(cfg, spark, model=model_dir)
    phases = lake.read("phases").collect()
    by_pod: dict[str, list] = {}
    for r in phases:
        by_pod.setdefault(r["pod_id"], []).append(r)
    assert set(by_pod) == {uni, short}
    assert {r["service"] for r in by_pod[uni]} == {"svc-ß"}
    assert len(by_pod[short]) == n - 1 and all(r["phase"] is None for r in by_pod[short])
    labelled = sorted(by_pod[uni], key=lambda r: r["step"])
    assert len(labelled) == n + 4
    assert all(r["phase"] is None for r in labelled[:n]) and all(r["phase"] is not None for r in labelled[n:])
    silver_short = lake.read("silver").where(F.col("pod_id") == short).collect()
    assert len(silver_short) == n - 1 and not any(r["has_full_history"] for r in silver_short)


def _small_train_config(cfg):
    return cfg.replace(  # every container trains: the tiny fleet is all there is
        window={"train_fraction": 1.0},
        train={"epochs": 2, "k": 3, "sample_size": 200, "patience": 1, "device": "cpu"},
    )


def test_single_row_fleet_windows_and_refuses_training_clearly(cfg, export, spark, lake, tmp_path):
    from ai4dl import stages

    cfg = _small_train_config(cfg)
    assert ingest(lake, cfg.ingest, export.write(tmp_path / "one.csv", [export.row()])).inserted == 1
    assert stages.window(cfg, spark).written == {"silver": 1}
    assert lake.read("silver").first()["has_full_history"] is False
    with pytest.raises(InputError, match="no training windows with full history") as info:
        stages.train(cfg, spark)
    _one_line(info.value)


def test_one_phase_fleet_is_a_clear_clustering_error(cfg, export, spark, lake, tmp_path):
    from ai4dl import stages

    cfg = _small_train_config(cfg)
    rows = [export.row(timestamp=str(1565962220 + 30 * i)) for i in range(12)]  # identical metrics: one point
    assert ingest(lake, cfg.ingest, export.write(tmp_path / "flat.csv", rows)).inserted == 12
    stages.window(cfg, spark)
    with pytest.raises(InputError, match=r"k=3 phases requested but the activations have only 1 distinct points") as info:
        stages.train(cfg, spark)
    assert type(info.value) is InputError  # the library's error, not a Spark exception
    _one_line(info.value)


# --- property: validate() never loses a row and never passes a bad one -------------------------------------

# The export's columns (as the DLaaS export names them), declared from the lake's own column list.
_HEADER = ["timestamp", "service", "pod.id", *(source_name(m) for m in METRICS)]
_SAFE_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
_NUMBER = st.one_of(
    st.floats(min_value=0, max_value=1e6, allow_nan=False).map(repr),
    st.integers(min_value=0, max_value=10**12).map(str),
    st.integers(min_value=-(10**6), max_value=-1).map(str),
    st.sampled_from(["NaN", "nan", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e308", "0", "-0", "", " ", "1,5", "0x10"]),
    st.none(),
    _SAFE_TEXT,
)
_SECONDS = st.integers(min_value=0, max_value=4_000_000_000)
_TIMESTAMP = st.one_of(
    _SECONDS.map(str),
    _SECONDS.map(lambda s: str(s * 1000)),
    st.datetimes(min_value=__import__("datetime").datetime(1970, 1, 1), max_value=__import__("datetime").datetime(2100, 1, 1)).map(
        lambda d: d.isoformat(timespec="seconds")
    ),
    st.sampled_from(["", "NaN", "inf", "-inf", "1e300", "-1e20", "99999999999999999", "yesterday", "2019-13-45T00:00:00"]),
    st.none(),
    _SAFE_TEXT,
)
_POD = st.one_of(st.sampled_from(["p1", "pod-é-日本", "", "  "]), st.none(), _SAFE_TEXT)
_SERVICE = st.one_of(st.sampled_from(["svc", "", "日本"]), st.none())
_ROW = st.fixed_dictionaries(
    {
        "timestamp": _TIMESTAMP,
        "service": _SERVICE,
        "pod.id": _POD,
        **{h: _NUMBER for h in _HEADER if h not in ("timestamp", "service", "pod.id")},
    }
)
_SOURCE = T.StructType([T.StructField(h, T.StringType(), True) for h in _HEADER])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(_ROW, min_size=1, max_size=50))
def test_validate_property(spark, rows):
    df = spark.createDataFrame([tuple(r[h] for h in _HEADER) for r in rows], _SOURCE)
    out = validate(df).collect()
    assert len(out) == len(rows)  # no row lost, none invented
    for r in out:
        if r["reasons"] is None:
            assert r["pod_id"] is not None and r["pod_id"].strip() != "", r
            assert r["ts"] is not None, r
            assert r["service"], r
            for m in METRICS:
                v = r[m]
                assert v is not None and math.isfinite(v) and v >= 0, (m, r)
        else:
            assert isinstance(r["reasons"], str) and r["reasons"].strip(), r
        assert r["raw"] and r["raw_hash"]


def test_typed_export_gets_the_reasons_its_text_would(spark):
    """A Parquet/Delta export's numbers skip the text checks (a number is blank only when null): the reasons of
    nulls, NaN, infinities, negatives and absurd usage are those of the same values written as text."""
    numbers = [h for h in _HEADER if h not in ("timestamp", "service", "pod.id")]
    metric_of = {source_name(m): m for m in METRICS}
    good = {h: 1.0 for h in numbers}
    cases = [
        (1_565_962_220, "svc", "ok", {}),
        (1_565_962_220_000, "svc", "ms", {}),
        (None, "svc", "no-ts", {}),
        (1e300, "svc", "far-ts", {}),
        (1_565_962_220, "", "blank-service", {}),
        (1_565_962_220, "svc", "", {}),
        (1_565_962_220, "svc", "nulls", {numbers[0]: None, numbers[3]: None}),
        (1_565_962_220, "svc", "nan", {numbers[1]: float("nan")}),
        (1_565_962_220, "svc", "inf", {numbers[2]: float("inf"), numbers[4]: float("-inf")}),
        (1_565_962_220, "svc", "negative", {numbers[5]: -1.0}),
        (1_565_962_220, "svc", "above-limit", {source_name("mem_current"): 1e20}),
    ]
    rows = [(None if ts is None else float(ts), svc, pod, *[{**good, **over}.get(h) for h in numbers]) for ts, svc, pod, over in cases]
    typed = T.StructType([
        T.StructField("timestamp", T.DoubleType()), T.StructField("service", T.StringType()),
        T.StructField("pod.id", T.StringType()), *[T.StructField(h, T.DoubleType()) for h in numbers],
    ])

    def as_text(v):
        if v is None or isinstance(v, str):
            return v
        return str(int(v)) if float(v).is_integer() and abs(v) < 1e18 else repr(v)

    text = [tuple(as_text(v) for v in r) for r in rows]
    text_schema = T.StructType([T.StructField(f.name, T.StringType()) for f in typed.fields])
    out_typed = validate(spark.createDataFrame(rows, typed)).collect()
    out_text = validate(spark.createDataFrame(text, text_schema)).collect()
    reasons_typed = {r["pod_id"]: r["reasons"] for r in out_typed}
    reasons_text = {r["pod_id"]: r["reasons"] for r in out_text}
    assert reasons_typed == reasons_text
    assert reasons_typed["ok"] is None and reasons_typed["ms"] is None and reasons_typed["blank-service"] is None
    assert reasons_typed["no-ts"] == "missing_timestamp"
    assert reasons_typed["nulls"] == f"missing_value:{metric_of[numbers[0]]};missing_value:{metric_of[numbers[3]]}"
    assert reasons_typed["negative"] == f"negative:{metric_of[numbers[5]]}"
    assert set(reasons_typed[""].split(";")) == {"missing_id"}
