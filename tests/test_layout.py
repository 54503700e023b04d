"""Delta layout: reading one service or one day does not scan the fleet; OPTIMIZE compacts and Z-orders."""

from __future__ import annotations

import csv

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
