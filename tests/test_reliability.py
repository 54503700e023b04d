"""Reruns, interruption, concurrent writers, model/table mismatch.

- every CLI stage run twice on the DLaaS sample gives the same tables, and logs what it wrote;
- an ingest killed (SIGKILL) while writing leaves bronze at its previous version; a rerun completes it;
- two ingests into one bronze table at the same time both land, without duplicates;
- a model whose scaler is not the silver table's is refused;
- table properties stay with the data they belong to even when a job dies between its two commits.

The subprocess tests start their own Spark drivers (``local[1]``, small memory): each takes tens of seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from ai4dl import stages
from ai4dl.config import load_config
from ai4dl.errors import ModelError
from ai4dl.lake import tables as lk
from ai4dl.lake.tables import Lake
from ai4dl.method.model import PhaseModel, save
from ai4dl.traces.ingest import ingest

TIMESTAMPS = {"ingested_at", "quarantined_at", "finished_at"}
STAGE_TABLES = (
    "bronze", "quarantine", "silver", "phases", "sequences", "transitions", "phase_stats", "policy_replay", "policy_frontier",
    "policy_calibration", "policy_ladder",
)


def snapshot(lake, name):
    """A table's rows (without load timestamps) as a sorted list: equal snapshots, equal contents."""
    df = lake.read(name)
    cols = [c for c in df.columns if c not in TIMESTAMPS]
    return sorted((tuple(r) for r in df.select(*cols).collect()), key=repr)


# --- reruns through the CLI, and the run log ----------------------------------------------------------------


@pytest.fixture(scope="module")
def twice(spark, tmp_path_factory, dlaas_sample, reference_model):
    """Every stage run twice through ``ai4dl.cli.main`` on the DLaaS sample with the imported reference model."""
    from ai4dl.cli import main

    sample = str(dlaas_sample)
    ref = str(reference_model)
    base = tmp_path_factory.mktemp("twice")
    overrides = [
        f"lake.root={base / 'lake'}",
        f"lake.models={base / 'models'}",
        f"report.dir={base / 'report'}",
        "train.epochs=2",
        "train.patience=1",
        "train.device=cpu",
    ]
    sets = [a for o in overrides for a in ("--set", o)]
    cfg = load_config(None, overrides)
    lake = Lake.for_config(spark, cfg)
    assert main(["import-reference-model", ref, *sets]) == 0
    model_dir = str(base / "models" / "reference" / "v0001")
    stages = [
        ["ingest", sample],
        ["window", "--scaler-from-model", model_dir],
        ["label", "--model", model_dir],
        ["behaviour"],
        ["policies"],
    ]
    rounds = []
    for _ in range(2):
        for stage in stages:
            assert main([*stage, *sets]) == 0, stage
        rounds.append({name: snapshot(lake, name) for name in STAGE_TABLES})
    rounds.append({"silver_props": lake.properties("silver")})
    return {"cfg": cfg, "lake": lake, "sets": sets, "rounds": rounds, "model_dir": model_dir}


@pytest.mark.slow
def test_every_stage_is_idempotent(twice):
    first, second, _ = twice["rounds"]
    assert len(first["bronze"]) == 204 and len(first["phases"]) == 204 and len(first["policy_replay"]) > 0
    for name in STAGE_TABLES:
        assert first[name] == second[name], name


@pytest.mark.slow
def test_run_log_records_every_stage_with_versions_and_config_hash(spark, twice):
    from ai4dl.cli import main

    cfg, lake, sets = twice["cfg"], twice["lake"], twice["sets"]
    assert main(["train", *sets]) == 0  # a model version, logged by its directory
    assert main(["report", *sets]) == 0
    everything = lake.read("run_log").collect()
    log = [r for r in everything if r["status"] == "finished"]
    started = {r["run_id"] for r in everything if r["status"] == "started"}
    assert started == {r["run_id"] for r in log}  # every finished run logged its start first, none died
    by_job: dict[str, list] = {}
    for r in log:
        by_job.setdefault(r["job"], []).append(r)
    expected = {
        "ingest": {"bronze", "quarantine"},
        "window": {"silver"},
        "label": {"phases"},
        "behaviour": {"sequences", "transitions", "phase_stats"},
        "policies": {"policy_replay", "policy_frontier", "policy_calibration", "policy_ladder"},
    }
    digest = cfg.digest
    policy_models = [r for r in by_job["policies"] if "policies/v" in r["table"]]  # the fitted model, by directory
    assert len(policy_models) == 2
    from ai4dl.policies.model import load as load_policies

    # each round fitted the same numbers; the second on the phases the second label committed (its data version)
    fitted = [load_policies(r["table"]).as_dict() for r in sorted(policy_models, key=lambda r: r["finished_at"])]
    assert fitted[0]["data_version"]["version"] < fitted[1]["data_version"]["version"]
    assert {k: v for k, v in fitted[0].items() if k != "data_version"} == {k: v for k, v in fitted[1].items() if k != "data_version"}
    by_job["policies"] = [r for r in by_job["policies"] if r not in policy_models]
    for job, tables in expected.items():
        rows = by_job[job]
        assert {r["table"] for r in rows} == tables, job
        assert len({r["run_id"] for r in rows}) == 2, job  # two runs of the stage
        assert all(r["config_hash"] == digest for r in rows), job
        for r in rows:
            if job == "ingest" and r["delta_version"] is None:
                continue  # a MERGE with nothing to insert need not commit
            assert r["delta_version"] is not None and r["rows"] is not None, r
    ingest_rows = sorted(by_job["ingest"], key=lambda r: r["finished_at"])
    bronze = [r for r in ingest_rows if r["table"] == "bronze"]
    assert [r["rows"] for r in bronze] == [204, 0]  # the rerun inserted nothing
    first_bronze_version = bronze[0]["delta_version"]
    assert spark.read.format("delta").option("versionAsOf", first_bronze_version).load(lake.path("bronze")).count() == 204
    silver = sorted(by_job["window"], key=lambda r: r["finished_at"])
    assert [r["rows"] for r in silver] == [204, 204]
    assert silver[1]["delta_version"] > silver[0]["delta_version"]
    (train,) = by_job["train"]
    assert "models" in train["table"] and train["delta_version"] is None and train["rows"] > 0
    # the stages that write no Delta table log too: the imported model and the report page, by path
    (imported,) = by_job["import-reference-model"]
    assert imported["table"] == twice["model_dir"] and imported["delta_version"] is None
    (page,) = by_job["report"]
    assert page["table"].endswith("index.html")


@pytest.mark.slow
def test_a_model_with_another_scaler_is_refused(spark, twice, tmp_path):
    from ai4dl.method.model import load
    from ai4dl.method.scaler import Scaler

    cfg, lake = twice["cfg"], twice["lake"]
    model = load(twice["model_dir"])
    s = model.scaler
    other = PhaseModel(Scaler(s.features, tuple(m + 1.0 for m in s.mean), s.scale), model.crbm, model.centers)
    before = lake.version("phases")
    with pytest.raises(ModelError, match="another scaler"):
        stages.label(cfg, spark, model=str(save(other, tmp_path / "other")))
    assert lake.version("phases") == before  # nothing written


@pytest.mark.slow
def test_silver_properties_match_the_reference_scaler(spark, twice):
    from ai4dl.method.model import load
    from ai4dl.method.windowing import PROP_SCALER, silver_scaler

    props = twice["rounds"][2]["silver_props"]
    assert PROP_SCALER in props
    scaler, n_history = silver_scaler(twice["lake"].properties("silver"))
    assert scaler.digest == load(twice["model_dir"]).scaler.digest and n_history == 3


# --- table properties and the data they belong to -----------------------------------------------------------


def test_overwrite_keeps_properties_with_their_data(spark, tmp_path, monkeypatch):
    from delta.tables import DeltaTable
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("x", T.LongType(), False)])
    path = str(tmp_path / "t")
    df = spark.range(3).select(F.col("id").alias("x"))

    def operations():
        return [r["operation"] for r in DeltaTable.forPath(spark, path).history().orderBy("version").collect()]

    assert lk.overwrite(df, path, schema, properties={"p": "1"}) == lk.Written(version=1, rows=3)
    # unchanged: no ALTER, one commit per run; the version and rows are that commit's own
    assert lk.overwrite(df.limit(2), path, schema, properties={"p": "1"}) == lk.Written(version=2, rows=2)
    assert operations() == ["CREATE TABLE", "WRITE", "WRITE"]
    assert lk.overwrite(df, path, schema, properties={"q": "new"}) == lk.Written(version=4, rows=3)  # after its ALTER
    assert lk.table_properties(spark, path)["p"] == "1" and lk.properties(spark, path)["p"] == "1"
    assert spark.read.format("delta").load(path).schema == schema  # NOT NULL kept

    # The job dies after the data commit, before the ALTER: the new data still comes with its own properties.
    def killed(*_args, **_kwargs):
        raise KeyboardInterrupt("killed between the two commits")

    monkeypatch.setattr(lk, "set_properties", killed)
    with pytest.raises(KeyboardInterrupt):
        lk.overwrite(spark.range(5).select(F.col("id").alias("x")), path, schema, properties={"p": "it's \\ 2"})
    assert lk.table_properties(spark, path)["p"] == "1"  # stale metadata...
    assert lk.properties(spark, path)["p"] == "it's \\ 2"  # ...but the data's own properties win
    monkeypatch.undo()

    lk.overwrite(spark.range(5).select(F.col("id").alias("x")), path, schema, properties={"p": "it's \\ 2"})
    assert lk.table_properties(spark, path)["p"] == "it's \\ 2" == lk.properties(spark, path)["p"]
    lk.set_properties(spark, path, {"p": "manual"})  # a later ALTER is authoritative again
    assert lk.properties(spark, path)["p"] == "manual"


# --- subprocess ingests: interruption and concurrent writers ------------------------------------------------


def _subprocess_cmd(source: str, lake_root: Path, project_root: Path) -> list[str]:
    return [
        sys.executable, "-m", "ai4dl.cli", "ingest", source,
        "--master", "local[1]",
        "--set", f"lake.root={lake_root}",
        "--set", "spark.driver_memory=768m",
        "--set", "spark.shuffle_partitions=2",
        "--set", f"spark.ivy_cache={project_root / '.cache' / 'ivy'}",
    ]


def _spawn(source: str, lake_root: Path, log: Path) -> subprocess.Popen:
    project_root = Path(__file__).resolve().parents[1]
    out = log.open("wb")
    env = {**os.environ, "PYTHONPATH": str(project_root)}
    return subprocess.Popen(
        _subprocess_cmd(source, lake_root, project_root), cwd=project_root, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def _wait(proc: subprocess.Popen, log: Path, timeout: float = 420) -> None:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"ingest subprocess timed out; log tail:\n{log.read_text()[-3000:]}")
    assert code == 0, log.read_text()[-3000:]


def _data_files(table: Path) -> set[Path]:
    return {p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}


def _write_pods(pdf, path: Path) -> str:
    pdf.to_csv(path, index=False)
    return str(path)


def _key_counts(lake) -> tuple[int, int]:
    bronze = lake.read("bronze")
    return bronze.count(), bronze.select("pod_id", "ts").distinct().count()


@pytest.mark.slow
def test_killed_ingest_leaves_the_previous_version_and_a_rerun_completes(cfg, dlaas_sample, spark, lake, tmp_path):
    from ai4dl.traces.synthetic import generate_fleet, write_fleet

    sample = str(dlaas_sample)
    assert ingest(lake, cfg.ingest, sample).inserted == 204
    bronze_path = Path(lake.path("bronze"))
    version_before = lk.version(spark, str(bronze_path))
    big = str(tmp_path / "big")
    write_fleet(generate_fleet(spark, 300, 300, seed=11, partitions=2), big, "csv")
    new_rows = 300 * 300

    files_before = _data_files(bronze_path)
    log = tmp_path / "killed.log"
    proc = _spawn(big, Path(lake.root), log)
    killed_while_writing = False
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            if _data_files(bronze_path) - files_before:  # the MERGE is writing data files: kill it now
                os.killpg(proc.pid, signal.SIGKILL)
                killed_while_writing = True
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    print(f"killed while writing: {killed_while_writing}")
    count, distinct = _key_counts(lake)
    assert count == distinct
    if killed_while_writing:
        # Orphan data files of the dead job are on disk but in no version (VACUUM removes them).
        assert count == 204, "a killed ingest must leave bronze at its previous version"
        assert lk.version(spark, str(bronze_path)) == version_before
    else:  # the job committed before the poll saw a file: then it is the complete new version
        assert count in (204, 204 + new_rows), log.read_text()[-2000:]

    result = ingest(lake, cfg.ingest, big)
    assert result.valid == new_rows
    assert _key_counts(lake) == (204 + new_rows, 204 + new_rows)
    assert lake.read("quarantine").count() == 0


@pytest.fixture(scope="module")
def two_exports(spark, tmp_path_factory):
    """Two exports of different pods sharing services and the day (the same bronze partitions)."""
    from ai4dl.traces.synthetic import generate_fleet

    base = tmp_path_factory.mktemp("exports")
    pdf = generate_fleet(spark, 16, 40, seed=5, services=2, partitions=2).toPandas()
    ids = sorted(pdf["pod.id"].unique())
    # container i is in service i % 2: split by pairs so both exports hold both services
    a = pdf[pdf["pod.id"].isin([p for i, p in enumerate(ids) if i % 4 < 2])]
    b = pdf[pdf["pod.id"].isin([p for i, p in enumerate(ids) if i % 4 >= 2])]
    assert set(a["service"]) == set(b["service"])
    return _write_pods(a, base / "a.csv"), len(a), _write_pods(b, base / "b.csv"), len(b)


@pytest.mark.slow
def test_concurrent_ingests_of_different_files_both_land(spark, lake, tmp_path, two_exports):
    a, n_a, b, n_b = two_exports
    root = Path(lake.root)  # a new lake: both writers also race to create the tables
    procs = [(_spawn(src, root, tmp_path / f"{i}.log"), tmp_path / f"{i}.log") for i, src in enumerate((a, b))]
    for proc, log in procs:
        _wait(proc, log)
    assert _key_counts(lake) == (n_a + n_b, n_a + n_b)
    assert lake.read("quarantine").count() == 0


@pytest.mark.slow
def test_concurrent_ingests_of_the_same_file_insert_it_once(cfg, dlaas_sample, spark, lake, tmp_path, two_exports):
    a, n_a, _, _ = two_exports
    assert ingest(lake, cfg.ingest, str(dlaas_sample)).inserted == 204  # an existing table
    root = Path(lake.root)
    procs = [(_spawn(a, root, tmp_path / f"{i}.log"), tmp_path / f"{i}.log") for i in range(2)]
    for proc, log in procs:
        _wait(proc, log)
    assert _key_counts(lake) == (204 + n_a, 204 + n_a)
    inserted = []
    for _, log in procs:
        line = next(ln for ln in log.read_text().splitlines() if ln.startswith("ingest: read"))
        inserted.append(int(line.split("(")[1].split(" new")[0]))
    assert sorted(inserted) == [0, n_a]  # each run's own MERGE metrics: one inserted all, the other none


def test_a_table_whose_creation_was_killed_is_created_on_the_rerun(spark, lake):
    """A creator killed before its first commit leaves an empty ``_delta_log``; the next run must not be stuck."""
    (Path(lake.path("run_log")) / "_delta_log").mkdir(parents=True)
    (Path(lake.path("bronze")) / "_delta_log" / "_commits").mkdir(parents=True)
    lake.log_run("ingest", {"bronze": 0}, "digest")
    assert lake.read("run_log").count() == 1
    assert lake.properties("run_log")["delta.checkpointInterval"] == lk.RUN_LOG_PROPERTIES["delta.checkpointInterval"]
    lk.ensure_table(spark, lake.path("bronze"), lk.spec("bronze").schema)
    assert lake.exists("bronze")


def test_the_run_log_is_checked_once_per_application_and_recreated_when_deleted(spark, lake, monkeypatch):
    """The run log's schema is checked once per application and path, not by every stage's lake handle; a run log
    removed after that (a notebook clearing its lake between runs) is created again, with its properties, by the
    next row. (The real check runs; the wrapper only counts it.)"""
    import shutil

    checks, real = [], lk.ensure_table
    monkeypatch.setattr(lk, "ensure_table", lambda spark_, path, *a, **k: checks.append(path) or real(spark_, path, *a, **k))
    lake.log_run("ingest", {"bronze": 0}, "digest")
    Lake(spark, lake.root).log_run("window", {"silver": 0}, "digest")  # another handle, as the next stage's
    assert checks == [lake.path("run_log")]
    shutil.rmtree(lake.path("run_log"))
    Lake(spark, lake.root).log_run("label", {"phases": 0}, "digest")
    assert checks == [lake.path("run_log")] * 2
    assert [r["job"] for r in lake.read("run_log").collect()] == ["label"]
    assert lake.properties("run_log")["delta.checkpointInterval"] == lk.RUN_LOG_PROPERTIES["delta.checkpointInterval"]
    assert not spark.read.format("delta").load(lake.path("run_log")).schema["run_id"].nullable


def test_a_gold_table_of_an_older_layout_is_upgraded_by_the_next_overwrite(spark, lake):
    from pyspark.sql import types as T

    from ai4dl.lake.schema import POLICY_REPLAY

    old = T.StructType([f for f in POLICY_REPLAY.fields if f.name not in ("oom_kills", "throttled_steps", "throttled_core_seconds")])
    lk.ensure_table(spark, lake.path("policy_replay"), old)
    row = {f.name: (0 if isinstance(f.dataType, T.LongType) else 0.0 if isinstance(f.dataType, T.DoubleType) else "x")
           for f in POLICY_REPLAY.fields}
    lake.overwrite("policy_replay", spark.createDataFrame([tuple(row.values())], POLICY_REPLAY))
    got = lake.read("policy_replay")
    assert got.schema == POLICY_REPLAY and got.count() == 1  # declared columns, NOT NULL kept
