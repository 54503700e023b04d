"""Delta layout: reading one service or one day does not scan the fleet; OPTIMIZE compacts and Z-orders."""

from __future__ import annotations

import csv
import json

import pytest

from pyspark.sql import functions as F

from ai4dl.lake.tables import Lake
from ai4dl.traces.ingest import ingest


def test_partition_pruning_and_optimize(cfg, export, spark, lake, tmp_path):
    # three services over two days, ingested in two runs (so partitions hold several files)
    for part in range(2):
        path = tmp_path / f"in{part}.csv"
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(export.HEADER)
            for svc in ("a", "b", "c"):
                for day in range(2):
                    for i in range(5):
                        ts = str(1565962220 + day * 86400 + part * 1000 + i * 10)
                        w.writerow(export.row(service=svc, pod_id=f"{svc}-pod", timestamp=ts))
        ingest(lake, cfg.ingest, str(path))
    bronze = lake.read("bronze")
    all_files = set(bronze.inputFiles())
    one_service = bronze.where(F.col("service") == "a")
    assert 0 < len(one_service.inputFiles()) < len(all_files) / 2
    one_day = bronze.where(F.col("event_date") == "2019-08-16")
    assert 0 < len(one_day.inputFiles()) < len(all_files)
    plan = one_service._jdf.queryExecution().executedPlan().toString()
    assert "PartitionFilters: [" in plan and "service#" in plan.split("PartitionFilters: [")[1].split("]")[0]

    # statistics on the columns readers filter on (pod_id, ts) and nothing else; a time filter skips the files
    # of the other run within a partition
    log = spark.read.json(f"{lake.path('bronze')}/_delta_log/*.json").where("add IS NOT NULL").select("add.stats")
    stats = [json.loads(r["stats"]) for r in log.collect()]
    assert {tuple(sorted(st["minValues"])) for st in stats} == {("pod_id", "ts")}
    first_run = bronze.where((F.col("service") == "a") & (F.col("event_date") == "2019-08-16")
                             & (F.col("ts") < F.lit("2019-08-16 13:40:00").cast("timestamp")))
    assert len(first_run.inputFiles()) == 1 and first_run.count() == 5

    metrics = lake.optimize("bronze")
    assert metrics["files_removed"] > metrics["files_added"] > 0
    after = lake.read("bronze")
    assert len(after.inputFiles()) == 6 and after.count() == 60  # one file per (service, day), no row lost


def test_uri_lake_roots_are_not_made_local():
    from ai4dl.lake.session import build_spark_conf

    for root in ("dbfs:/ai4dl/lake", "s3a://bucket/lake", "hdfs://nn:8020/lake/"):
        assert Lake(None, root).path("bronze") == root.rstrip("/") + "/bronze/traces"
    from ai4dl.config import load_config

    conf = build_spark_conf(load_config(None, ["lake.root=abfss://c@acct.dfs.core.windows.net/lake"]))
    assert conf["spark.sql.warehouse.dir"] == "abfss://c@acct.dfs.core.windows.net/lake/_warehouse"


def test_the_users_driver_java_options_come_after_the_logging_profile():
    from ai4dl.config import load_config
    from ai4dl.lake.session import LOG4J2_PROPERTIES, build_spark_conf

    conf = build_spark_conf(load_config(None, ['spark.conf={"spark.driver.extraJavaOptions": "-Xss8m"}']))
    assert conf["spark.driver.extraJavaOptions"] == f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()} -Xss8m"


def test_the_driver_maps_the_class_archive_when_it_was_started_with_one(spark):
    """A JVM given an archive it cannot use starts without sharing at all; one that uses it says "sharing"."""
    jvm = spark.sparkContext._jvm
    args = " ".join(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert ("-XX:SharedArchiveFile=" in args) != ("-XX:ArchiveClassesAtExit=" in args)
    if "-XX:SharedArchiveFile=" in args:
        assert "sharing" in jvm.java.lang.System.getProperty("java.vm.info")


def test_a_class_archive_is_named_by_classpath_and_offered_only_when_complete(tmp_path):
    from ai4dl.lake.session import ClassArchive

    first = ClassArchive.for_classpath(tmp_path, ["/x/delta-a.jar"])
    other = ClassArchive.for_classpath(tmp_path, ["/x/delta-b.jar"])
    assert first.path != other.path and first.path == ClassArchive.for_classpath(tmp_path, ["/x/delta-a.jar"]).path
    assert not first.ready
    assert f"-XX:ArchiveClassesAtExit={first.partial}" in first.java_options()  # dumped beside, moved when whole
    first.partial.write_bytes(b"half an archive")  # a dump cut short never takes the final name
    assert not ClassArchive.for_classpath(tmp_path, ["/x/delta-a.jar"]).ready
    first.path.write_bytes(b"archive")
    again = ClassArchive.for_classpath(tmp_path, ["/x/delta-a.jar"])
    assert again.ready and again.java_options().startswith(f"-XX:SharedArchiveFile={first.path} ")


@pytest.mark.slow
def test_the_first_start_writes_the_archive_and_the_next_one_maps_it(project_root, tmp_path):
    import shutil
    import subprocess
    import sys

    from ai4dl.lake.session import delta_jars

    jars = delta_jars(project_root / ".cache" / "ivy")  # resolved JARs reused; only the archive is new
    cache = tmp_path / "ivy"
    cache.mkdir()
    for manifest in (project_root / ".cache" / "ivy").glob("ai4dl-*.classpath"):
        shutil.copy(manifest, cache)
    assert jars
    over = [f"spark.ivy_cache={cache}", "spark.master=local[1]", "spark.driver_memory=1g"]
    prepare = f"from ai4dl.config import load_config; from ai4dl.lake.session import prepare_local_start; prepare_local_start(load_config(None, {over!r}))"
    subprocess.run([sys.executable, "-c", prepare], check=True, cwd=tmp_path, timeout=600)
    archives = list((cache / "ai4dl-jvm").glob("*.jsa"))
    assert len(archives) == 1 and not list((cache / "ai4dl-jvm").glob("*.part"))
    probe = (
        "from ai4dl.config import load_config; from ai4dl.lake.session import get_spark; "
        f"s = get_spark(load_config(None, {over + [f'lake.root={tmp_path}/lake']!r})); "
        "print(s.sparkContext._jvm.java.lang.System.getProperty('java.vm.info'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "sharing" in out.stdout
