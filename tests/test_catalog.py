"""Named tables: the lake registered in a persistent catalog (``lake.schema``), the BI views persisted there, and
``ai4dl sql`` serving them read-only to a real JDBC client (beeline, from the pyspark install)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ai4dl.behaviour.phase_stats import VIEWS
from ai4dl.config import load_config
from ai4dl.errors import ConfigError
from ai4dl.lake.tables import TABLES, Lake
from tests.standalone import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_catalog_settings_are_checked_and_name_the_tables():
    cfg = load_config(None, ["lake.catalog=main", "lake.schema=ai4dl"])
    assert cfg.lake.namespace == "`main`.`ai4dl`"
    assert load_config(None, ["lake.schema=bi"]).lake.namespace == "`bi`"
    assert load_config(None).lake.namespace is None
    with pytest.raises(ConfigError, match="lake.schema"):
        load_config(None, ["lake.schema=drop table x"])
    with pytest.raises(ConfigError, match="without lake.schema"):
        load_config(None, ["lake.catalog=main"])
    names = {spec.table_name for spec in TABLES.values()}
    assert len(names) == len(TABLES) and {"bronze_traces", "silver_windows", "gold_phase_stats", "meta_run_log"} <= names
    lake = Lake(None, "/lake", "`main`.`ai4dl`")
    assert lake.table("phase_stats") == "`main`.`ai4dl`.`gold_phase_stats`"
    assert Lake(None, "/lake").table("phase_stats") == "delta.`/lake/gold/phase_stats`"


def test_a_session_catalog_that_forgets_is_refused(spark, cfg, export, tmp_path):
    """The test session's catalog is in-memory: names registered there would vanish with it, silently."""
    from ai4dl import stages

    named = cfg.replace(lake={"schema": "ai4dl"})
    path = export.write(tmp_path / "t.csv", [export.row()])
    with pytest.raises(ConfigError, match="in-memory"):
        stages.ingest(named, spark, input=path)


def _ai4dl(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ai4dl.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def _beeline(url: str, statements: list[str], script: Path, *, force: bool = False) -> subprocess.CompletedProcess:
    """A real JDBC client, the one the pyspark install ships, running ``statements`` as a script (``--force``:
    on past a failed one)."""
    import pyspark

    beeline = Path(pyspark.__file__).parent / "bin" / "beeline"
    script.write_text(";\n".join(statements) + ";\n")
    cmd = [str(beeline), "-u", url, "-n", "analyst", "--silent=true", "--outputformat=tsv2", "--showHeader=true",
           f"--force={'true' if force else 'false'}", "-f", str(script)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def _rows(output: str) -> list[list[str]]:
    """tsv2 rows of beeline's output (its prompt echo lines dropped)."""
    return [line.split("\t") for line in output.splitlines() if line and not line.startswith(("0: jdbc", "WARNING"))]


@pytest.fixture(scope="module")
def catalog_lake(tmp_path_factory):
    """A small pipeline run with ``lake.schema=ai4dl``, as a user runs it: one CLI process."""
    base = tmp_path_factory.mktemp("catalog")
    sets = [f"lake.root={base / 'lake'}", f"lake.models={base / 'models'}", f"report.dir={base / 'report'}",
            "lake.schema=ai4dl", "spark.master=local[2]", "spark.shuffle_partitions=2", "spark.driver_memory=2g",
            f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}", "generate.containers=10", "generate.steps=80",
            "train.epochs=1", "train.k=3", "train.sample_size=400", "train.device=cpu", "policies.interval_steps=5",
            "window.train_fraction=0.7"]
    args = [x for s in sets for x in ("--set", s)]
    out = _ai4dl("run", "generate", "ingest", "window", "train", "label", "behaviour", "policies", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    return base, args


@pytest.mark.slow
def test_jobs_name_their_tables_and_persist_the_views_in_the_lakes_own_metastore(catalog_lake, spark):
    base, args = catalog_lake
    assert (base / "lake" / "_metastore" / "metastore_db").is_dir()
    assert not (ROOT / "metastore_db").exists()  # the metastore is the lake's, not the working directory's
    # Another process (a new JVM) finds the names: they outlived the session that made them.
    code = (
        "import json, sys\n"
        "from ai4dl.config import load_config\n"
        "from ai4dl.lake.session import get_spark\n"
        "cfg = load_config(None, sys.argv[1:])\n"
        "s = get_spark(cfg)\n"
        "tables = {r.tableName: r.isTemporary for r in s.sql('SHOW TABLES IN ai4dl').collect()}\n"
        "loc = s.sql('DESCRIBE DETAIL ai4dl.gold_phase_stats').first()['location']\n"
        "n = s.sql('SELECT count(*) FROM ai4dl.ai4dl_phase_summary').first()[0]\n"
        "print('RESULT' + json.dumps({'tables': tables, 'location': loc, 'summary_rows': n}))\n"
    )
    sets = [a for a in args if a != "--set"]
    out = subprocess.run([sys.executable, "-c", code, *sets], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))[len("RESULT"):])
    written = {"bronze", "quarantine", "silver", "phases", "sequences", "transitions", "phase_stats", "run_log",
               "policy_replay", "policy_calibration"}
    assert {TABLES[n].table_name for n in written} <= set(found["tables"])
    assert set(VIEWS) <= set(found["tables"]) and not any(found["tables"].values())  # persisted, not temporary
    assert found["location"].rstrip("/").endswith(str(base / "lake" / "gold" / "phase_stats"))  # external, at the path
    lake = Lake(spark, str(base / "lake"))  # and the paths keep working
    assert found["summary_rows"] == lake.count("phase_stats") > 0


@pytest.mark.slow
def test_sql_endpoint_serves_bi_queries_to_a_jdbc_client_and_refuses_writes(catalog_lake, spark):
    from delta.tables import DeltaTable

    base, args = catalog_lake
    lake = Lake(spark, str(base / "lake"))
    versions = {n: lake.version(n) for n in ("bronze", "phase_stats", "sequences")}
    port = free_port()
    log = base / "sql.log"  # a file, not a pipe: a server blocked on a full pipe stops answering
    with log.open("w") as sink:
        server = subprocess.Popen([sys.executable, "-m", "ai4dl.cli", "sql", "--port", str(port), *args], cwd=ROOT,
                                  stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        url = None
        deadline = time.time() + 240
        while time.time() < deadline and url is None and server.poll() is None:
            serving = [ln for ln in log.read_text().splitlines() if ln.startswith("sql: serving")]
            url = serving[0].split(" at ", 1)[1].split(" ")[0] if serving else None
            time.sleep(0.5)
        assert url == f"jdbc:hive2://127.0.0.1:{port}/ai4dl", log.read_text()[-3000:]

        # The README's BI queries, through the wire.
        out = _beeline(url, script=base / "bi.sql", statements=[
            "SHOW TABLES",
            "SELECT service, phase, phase_name, steps, share_of_steps_pct, cpu_mean_cores, mem_mean_gib "
            "FROM ai4dl_phase_summary WHERE service = '__all__' ORDER BY phase",
            "SELECT src, dst, count, ROUND(probability, 3) AS probability FROM ai4dl_phase_transitions ORDER BY src, dst",
            "SELECT count(*) AS n FROM bronze_traces",
            "SELECT policy, resource, deployed, savings_vs_static FROM gold_policy_calibration "
            "ORDER BY resource, savings_vs_static DESC",
        ])
        assert out.returncode == 0, out.stderr[-3000:]
        rows = _rows(out.stdout)
        listed = {r[1] for r in rows if len(r) == 3 and r[0] == "ai4dl"}
        assert set(VIEWS) <= listed and {"bronze_traces", "gold_phase_stats"} <= listed
        summary = [r for r in rows if len(r) == 7 and r[0] == "__all__"]
        expected = {r.phase: r.phase_name for r in lake.read("phase_stats").where("service = '__all__'").collect()}
        assert {int(r[1]): r[2] for r in summary} == expected
        assert abs(sum(float(r[4]) for r in summary) - 100.0) < 0.5  # percent, as people read it
        assert [r for r in rows if r == [str(lake.count("bronze"))]]
        calibration = [r for r in rows if len(r) == 4 and r[1] in ("cpu", "mem")]
        assert len(calibration) == lake.count("policy_calibration") > 0
        assert {r[1] for r in calibration if r[2] == "true"} == {"cpu", "mem"}  # what the stream deploys, per resource

        # Writes of every kind are refused, and nothing changes.
        attempts = [
            "INSERT INTO bronze_traces SELECT * FROM bronze_traces LIMIT 1",
            "DELETE FROM gold_phase_stats",
            "DROP TABLE gold_phase_sequences",
            "CREATE TABLE evil (a INT) USING DELTA",
            "CREATE OR REPLACE VIEW ai4dl_phase_summary AS SELECT 1 AS x",
            f"INSERT INTO delta.`{base / 'lake' / 'gold' / 'phase_stats'}` SELECT * FROM gold_phase_stats",
            "SELECT reflect('java.lang.System', 'getProperty', 'user.home')",
        ]
        refused = _beeline(url, attempts, base / "writes.sql", force=True)
        text = refused.stdout + refused.stderr
        assert text.count("HiveSQLException") == len(attempts), text[-3000:]  # each statement failed, and
        assert text.count("HiveSQLException: Error running query: java.lang.SecurityException: ai4dl sql is "
                          "read-only") == len(attempts), text[-3000:]  # each by the guard
        still = _beeline(url, ["SELECT count(*) FROM ai4dl_phase_summary"], base / "after.sql")
        assert still.returncode == 0 and [str(lake.count("phase_stats"))] in _rows(still.stdout)
    finally:
        server.send_signal(signal.SIGTERM)  # `kill <pid>` of the ai4dl process, as a service manager stops it
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    tail = log.read_text()
    assert server.returncode == 0 and "sql: stopped" in tail, tail[-2000:]
    assert {n: lake.version(n) for n in versions} == versions
    assert DeltaTable.forPath(spark, lake.path("sequences")).toDF().count() > 0
    # The metastore is free again: a job on the lake starts (no "open in another process").
    again = _ai4dl("behaviour", *args)
    assert again.returncode == 0, again.stderr[-3000:]
