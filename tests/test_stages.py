"""The stage layer, the typed configuration, the error contract of the CLI, and the Spark-free cores."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ai4dl import stages
from ai4dl.cli import VERBS, main
from ai4dl.config import Config, TrainConfig, from_dict, load_config
from ai4dl.method.split import ContainerSplit
from ai4dl.errors import Ai4dlError, ConfigError, MissingTableError
from ai4dl.lake.tables import TABLES, Lake

VERBS_OF_THE_PRODUCT = {
    "generate", "ingest", "window", "train", "refine", "import-reference-model", "label", "behaviour", "policies",
    "optimize", "report", "demo", "stream",
}


def test_every_verb_is_one_stage_and_one_cli_entry(project_root):
    assert set(stages.STAGES) == VERBS_OF_THE_PRODUCT
    assert set(VERBS) == VERBS_OF_THE_PRODUCT
    for job in (project_root / "jobs").glob("*.py"):
        verb = job.stem.replace("_", "-")
        assert verb in VERBS_OF_THE_PRODUCT | {"run"}, job  # run: several stages in one application
        assert f'main(["{verb}", *sys.argv[1:]])' in job.read_text(), job


# --- typed configuration ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.k=abc", "train.k: 'abc' is not allowed: an integer >= 1"),
        ("train.k=0", "train.k: 0 is not allowed: an integer >= 1"),
        ("train.k=2.5", "train.k: 2.5 is not allowed: an integer >= 1"),
        ("train.learning_rate=0", "train.learning_rate: 0 is not allowed: a number > 0"),
        ("train.device=gpu", "train.device: 'gpu' is not allowed: one of 'auto', 'cpu', 'cuda'"),
        ("window.train_fraction=1.5", "window.train_fraction: 1.5 is not allowed: a number in (0, 1]"),
        ("window.n_history=true", "window.n_history: True is not allowed: an integer >= 1"),
        ("window.features=cpu_usage", "window.features: 'cpu_usage' is not allowed: a list"),
        ("label.engine=numba", "label.engine: 'numba' is not allowed: one of 'arrow', 'pandas'"),
        ("policies.phase_statistic=mean", "policies.phase_statistic: 'mean' is not allowed: one of 'fraction', 'absolute'"),
        ("train.kk=3", "unknown config key 'train.kk'"),
        ("trian.k=3", "unknown config section 'trian'"),
        ("k=3", "the key must be section.key"),
    ],
)
def test_bad_values_name_the_key_the_value_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_cross_field_rules_are_checked_at_load():
    with pytest.raises(ConfigError, match="phase_quantile: 0.9 is not allowed with phase_statistic 'absolute'"):
        load_config(None, ["policies.phase_statistic=absolute", "policies.phase_quantile=0.9"])
    with pytest.raises(ConfigError, match=r"train.k_range: \[5, 3\]"):
        load_config(None, ["train.k_range=[5, 3]"])


def test_config_round_trips_and_every_yaml_under_conf_loads(project_root):
    cfg = load_config(None, ["train.k=7", "spark.conf={spark.x: 1}"])
    assert from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(train={"k": 3}).train.k == 3 and cfg.train.k == 7  # frozen: replace makes a copy
    assert cfg.digest != Config().digest and Config().digest == load_config().digest
    with pytest.raises(Exception):
        cfg.train.k = 3  # type: ignore[misc]
    for path in (project_root / "conf").glob("*.yaml"):
        assert isinstance(load_config(path), Config), path


def test_one_split_object_everywhere():
    cfg = load_config(None, ["window.train_fraction=0.6", "window.split_seed=9"])
    assert ContainerSplit.of(cfg.window).train_fraction == 0.6 and ContainerSplit.of(cfg.window).seed == 9
    assert TrainConfig() == load_config().train


def test_a_bad_config_exits_2_before_spark_is_even_imported(project_root):
    code = textwrap.dedent(
        """
        import sys
        from ai4dl.cli import main
        rc = main(["train", "--set", "train.k=abc"])
        print("RESULT", rc, "pyspark" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=project_root, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "RESULT 2 False", out.stdout + out.stderr
    assert out.stderr.strip() == "ai4dl train: train.k: 'abc' is not allowed: an integer >= 1"


# --- the CLI's error contract -------------------------------------------------------------------------------


def test_expected_failures_are_one_line_and_exit_2(spark, cfg, capsys):
    code = main(["policies", "--set", f"lake.root={cfg.lake.root}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("ai4dl policies: table 'phases' does not exist yet at ")


def test_help_is_plain_text():
    out = subprocess.run([sys.executable, "-m", "ai4dl.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: ai4dl [-h] COMMAND ...")
    assert "``" not in out.stdout and "\x1b[" not in out.stdout  # no reST markup, no terminal colours
    assert "ai4dl demo --input" in out.stdout and out.stderr == ""


def test_every_stage_ends_with_one_summary_line(spark, cfg, dlaas_sample, capsys):
    import re

    code = main(["ingest", str(dlaas_sample), "--set", f"lake.root={cfg.lake.root}"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0
    bronze = re.escape(Lake(spark, cfg.lake.root).path("bronze"))
    assert re.fullmatch(rf"ingest: 204 rows in, 204 out, 0 quarantined, \d+\.\ds -> {bronze} \(\+ quarantine\) \[run \S+\]", last), last
    result = stages.window(cfg, spark)
    assert capsys.readouterr().out.strip().splitlines()[-1] == result.summary()
    assert result.summary().startswith("window: 204 rows in, 204 out, ")


def test_window_and_label_report_what_they_wrote_without_reading_it_back(spark, cfg, dlaas_sample, reference_model, capsys):
    """The counts are taken by the write itself (Tally); they must be the tables' own."""
    import re

    from pyspark.sql import functions as F

    imported = stages.import_reference_model(cfg, spark, path=str(reference_model))
    stages.ingest(cfg, spark, input=str(dlaas_sample))
    lake = Lake.for_config(spark, cfg)
    capsys.readouterr()
    windowed = stages.window(cfg, spark, scaler_from_model=imported.details["path"])
    printed = capsys.readouterr().out
    silver = lake.read("silver")
    full = silver.where("has_full_history").count()
    assert windowed.rows_in == lake.count("bronze") == 204 and windowed.written["silver"] == silver.count() == 204
    assert f"silver: 204 windows ({full} with full history, {204 - full} without)" in printed
    labelled = stages.label(cfg, spark, model=imported.details["path"])
    printed = capsys.readouterr().out
    counts = lake.read("phases").groupBy("phase").count().orderBy("phase").collect()
    assert labelled.rows_in == 204 and labelled.written["phases"] == sum(r["count"] for r in counts) == 204
    line = next(ln for ln in printed.splitlines() if ln.startswith("phases: 204 steps labelled ("))
    # "none: n, 0 (its name, which may hold commas and brackets): n, ...": each phase with its own count, in order
    shown = re.findall(r"(?:\(|, )(none|\d+)(?: \(.*?\))?: (\d+)", line)
    assert shown == [("none" if r["phase"] is None else str(r["phase"]), str(r["count"])) for r in counts]

    from ai4dl.lake.tables import Tally

    never = Tally(spark.range(3), rows=F.count(F.lit(1)))
    assert never.values() is None  # no action ran: no figures, and no waiting for them
    once = Tally(spark.range(5), rows=F.count(F.lit(1)), odd=F.count_if(F.col("id") % 2 == 1))
    once.frame.write.format("delta").save(str(Path(cfg.lake.root) / "tally"))
    assert once.values() == {"rows": 5, "odd": 2}


def test_demo_input_honours_its_format(spark, cfg, dlaas_sample, tmp_path):
    from ai4dl.traces.ingest import guess_format

    src = spark.read.option("header", True).csv(str(dlaas_sample))
    src.write.format("delta").save(str(tmp_path / "as-delta"))
    src.write.parquet(str(tmp_path / "as-parquet"))
    assert guess_format(spark, str(tmp_path / "as-delta")) == "delta"
    assert guess_format(spark, str(tmp_path / "as-parquet")) == "parquet"
    assert guess_format(spark, str(dlaas_sample)) == "csv"
    from ai4dl.cli import _parser

    args = _parser().parse_args(["demo", "--input", "x", "--format", "parquet"])
    assert VERBS["demo"](args) == {"input": "x", "fmt": "parquet"}


def test_anything_else_keeps_its_traceback(spark, cfg, monkeypatch):
    def broken(cfg, spark=None, **options):
        raise KeyError("a bug, not a user error")

    monkeypatch.setitem(stages.STAGES, "behaviour", broken)
    with pytest.raises(KeyError, match="a bug"):  # uncaught: Python prints the traceback and exits 1
        main(["behaviour", "--set", f"lake.root={cfg.lake.root}"])
    assert not issubclass(KeyError, Ai4dlError)


# --- the lake handle ----------------------------------------------------------------------------------------


def test_lake_handle_paths_names_and_missing_tables(spark, tmp_path):
    lake = Lake(spark, str(tmp_path / "lake"))
    assert lake.path("silver") == str(tmp_path / "lake" / "silver" / "windows")
    assert Lake(None, "s3a://b/lake/").path("run_log") == "s3a://b/lake/_meta/run_log"
    assert set(TABLES) >= {"bronze", "quarantine", "silver", "phases", "sequences", "transitions", "phase_stats", "policy_replay"}
    with pytest.raises(ConfigError, match="unknown table 'gold'"):
        lake.path("gold")
    with pytest.raises(MissingTableError, match="run the stage that writes it first"):
        lake.read("phases")
    assert not lake.exists("phases") and lake.version("phases") is None


# --- every verb leaves a run-log row ------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_then_refine_and_optimize_each_leave_run_log_rows(spark, cfg):
    small = cfg.replace(
        generate={"containers": 10, "steps": 60, "services": 2},
        window={"train_fraction": 0.7},
        train={"epochs": 2, "k": 3, "sample_size": 400, "patience": 1, "device": "cpu"},
        policies={"interval_steps": 5},
    )
    result = stages.demo(small, spark)
    assert Path(result.details["report"]).is_file()
    assert [s.stage for s in result.details["stages"]] == [
        "generate", "ingest", "window", "train", "label", "behaviour", "policies", "report",
    ]
    # the trained model names its phases, and the gold statistics, graph and report show those names
    model = [s for s in result.details["stages"] if s.stage == "train"][0].details["model"]
    names = model.info["phase_names"]
    assert sorted(names) == ["0", "1", "2"] and len(set(names.values())) == 3
    assert all("CPU" in n and "memory" in n for n in names.values())
    lake = Lake.for_config(spark, small)
    stats = {r.phase: r.phase_name for r in lake.read("phase_stats").where("service = '__all__'").collect()}
    assert stats == {int(p): n for p, n in names.items() if int(p) in stats} and stats
    graph = json.loads((Path(small.report.dir) / "transition_graph.json").read_text())
    assert {n.get("name") for n in graph["nodes"]} <= set(names.values()) | {None}
    assert any(n.get("name") for n in graph["nodes"])
    refined = stages.refine(small, spark, phase=0, k=2)
    assert refined.details["model"].refinements[0][1] == (0, 3)
    stages.optimize(small, spark, tables=("bronze", "phases"))
    lake = Lake.for_config(spark, small)
    log = lake.read("run_log").where("status = 'finished'").collect()
    jobs = {r["job"] for r in log}
    assert jobs == {"generate", "ingest", "window", "train", "label", "behaviour", "policies", "report", "demo", "refine", "optimize"}
    assert {r["config_hash"] for r in log} == {small.digest}
    assert {r["table"] for r in log if r["job"] == "optimize"} == {"bronze", "phases"}
    assert lake.count("phases") == 10 * 60


# --- pure cores ---------------------------------------------------------------------------------------------


def test_pure_cores_import_and_run_without_pyspark(project_root, reference_model):
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["pyspark"] = None  # any import of pyspark now fails
        import numpy as np
        from ai4dl.behaviour.runs import rle, smooth_runs
        from ai4dl.behaviour.graph import prototype_tree
        from ai4dl.config import load_config
        from ai4dl.method.crbm import encode
        from ai4dl.method.labelling import label_arrays
        from ai4dl.method.reference import import_reference
        from ai4dl.config import PoliciesConfig
        from ai4dl.policies.replay import allocate
        from ai4dl.policies.vpa import VpaRecommender

        assert smooth_runs(rle([0, 0, 1, 0, 0]), 2) == [(0, 0, 5)]
        model = import_reference({str(reference_model)!r})
        x = np.zeros((3, model.crbm.n_visible)); cond = np.zeros((3, model.crbm.B.shape[1]))
        phase, _, h = label_arrays(model, x, cond)
        assert h.shape == (3, model.crbm.n_hidden) and np.allclose(encode(model.crbm, x, cond), h)
        alloc = allocate("prev.step.max", np.arange(8.0), 10.0, PoliciesConfig(interval_steps=4))
        assert alloc.tolist() == [10.0] * 4 + [3.0] * 4
        assert load_config(None, ["train.k=4"]).train.k == 4
        print("PURE OK", "pyspark" in sys.modules and sys.modules["pyspark"] is not None)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=project_root, timeout=120)
    assert out.stdout.strip().endswith("PURE OK False"), out.stdout + out.stderr


# --- folders, run log and history (issue: nothing written to the wrong place, a run log that misses nothing) --


@pytest.mark.parametrize("override, key", [
    ("lake.root=", "lake.root: an empty value is not allowed"),
    ("lake.root=''", "lake.root: '' is not allowed: a folder of its own"),
    ("lake.root=.", "lake.root: '.' is not allowed"),
    ("lake.models=/", "lake.models: '/' is not allowed"),
    ("report.dir='  '", "report.dir: '  ' is not allowed"),
])
def test_folders_that_are_no_folder_of_their_own_are_refused(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, [override])


def test_an_unwritable_lake_root_is_refused_before_any_write(cfg, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code = main(["ingest", "x.csv", "--set", f"lake.root={blocker / 'lake'}"])
    assert code == 2
    assert "lake.root:" in capsys.readouterr().err and not (blocker.parent / "lake").exists()
    with pytest.raises(ConfigError, match="report.dir: .* is a file, not a folder"):
        stages.report(cfg.replace(report={"dir": str(blocker)}))


def test_dotted_and_snake_feature_names_are_one_and_the_same():
    dotted = load_config(None, ["window.features=[cpu.usage.cores, mem.current]"])
    snake = load_config(None, ["window.features=[cpu_usage_cores, mem_current]"])
    assert dotted.window.features == snake.window.features == ("cpu_usage_cores", "mem_current")
    with pytest.raises(ConfigError, match="window.features: 'mem.currant' is not allowed"):
        load_config(None, ["window.features=[cpu.usage.cores, mem.currant]"])


def test_run_log_has_started_failed_and_flags_what_a_dead_run_committed(spark, cfg, capsys):
    from pyspark.sql import functions as F

    from ai4dl.lake import tables

    lake = Lake.for_config(spark, cfg)
    with pytest.raises(MissingTableError):
        stages.window(cfg, spark)  # no bronze yet: a failed run, logged as such
    # A run that commits and is then killed: its "started" row and its tagged commit, nothing else.
    started = tables.utc_now()
    tables.log_started(lake, "deadbeef0001", "label", cfg.digest, started)
    with tables.commits_tagged(spark, "deadbeef0001"):
        lake.overwrite("transitions", spark.range(1).select(
            F.lit(0).alias("src"), F.lit(1).alias("dst"), F.lit(1).cast("long").alias("count"),
            F.lit(1.0).alias("probability")))
    history = tables.run_history(lake)
    status = dict(zip(history["job"], history["status"]))
    assert status == {"window": "failed", "label": "unfinished"}
    failed = history[history["job"] == "window"].iloc[0]
    assert failed["message"].startswith("MissingTableError: table 'bronze' does not exist yet")
    orphans = tables.orphan_commits(lake)
    assert {(name, run) for name, _, run in orphans} == {("transitions", "deadbeef0001")}
    assert max(v for _, v, _ in orphans) == lake.version("transitions")
    assert main(["log", "--set", f"lake.root={cfg.lake.root}"]) == 0
    out = capsys.readouterr().out
    assert "! deadbeef0001 label" in out
    assert f"transitions version {lake.version('transitions')} was committed by run deadbeef0001" in out
    assert "1 unfinished" in out


def test_run_chains_stages_in_the_session_it_finds(spark, cfg):
    """``ai4dl run a b c`` = the stages one by one, in one session (each still logs its own run)."""
    from ai4dl.cli import main

    args = [f"lake.root={cfg.lake.root}", f"lake.models={cfg.lake.models}", f"report.dir={cfg.report.dir}",
            "generate.containers=4", "generate.steps=30", "generate.services=2"]
    assert main(["run", "generate", "ingest", "window", *[a for kv in args for a in ("--set", kv)]]) == 0
    lake = Lake.for_config(spark, cfg)
    assert lake.count("bronze") == 4 * 30 and lake.count("silver") == 4 * 30
    jobs = [r["job"] for r in lake.read("run_log").where("status = 'finished'").orderBy("finished_at").collect()]
    assert [j for i, j in enumerate(jobs) if j not in jobs[:i]] == ["generate", "ingest", "window"]
    with pytest.raises(SystemExit):
        main(["run", "refine"])  # needs --phase: refused by the parser, run alone


# --- a quiet start: Delta's JARs resolved once, then passed as files ----------------------------------------


def test_delta_jars_come_from_the_recorded_classpath_without_ivy(spark, test_config, monkeypatch, capsys):
    from ai4dl.lake import session

    jars = session.delta_jars(test_config.spark.ivy_cache)  # resolved (once) when the test session started
    assert any(Path(j).name.startswith("delta-spark_") for j in jars) and all(Path(j).is_file() for j in jars)
    assert set(jars) <= set(spark.sparkContext.getConf().get("spark.jars").split(","))

    def no_ivy(*args, **kwargs):
        raise AssertionError("Ivy ran although the classpath is recorded")

    monkeypatch.setattr(session.subprocess, "run", no_ivy)
    assert session.delta_jars(test_config.spark.ivy_cache) == jars
    assert capsys.readouterr().out == ""  # a later start prints nothing


def test_an_unreachable_maven_central_is_one_line(tmp_path, monkeypatch, capsys):
    from ai4dl.errors import SparkSetupError
    from ai4dl.lake import session

    noisy = "\n".join([":: problems summary ::", *["WARN host not found: repo1.maven.org"] * 50,
                       "module not found: io.delta#delta-spark_4.1_2.13;4.3.1"])
    monkeypatch.setattr(session.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a[0], 1, stdout=noisy, stderr=""))
    with pytest.raises(SparkSetupError) as info:
        session.delta_jars(tmp_path / "ivy")
    assert "\n" not in str(info.value) and "module not found: io.delta" in str(info.value)
    assert "repo1.maven.org" in str(info.value)
    assert len(capsys.readouterr().out.strip().splitlines()) == 1  # the one 'fetching' line, no resolver noise
    assert "central" in (tmp_path / "ivy" / session.IVY_SETTINGS_NAME).read_text()


def _import_graph(project_root, runtime_only: bool = False):
    """The library's module import graph from every import statement (lazy ones too); ``runtime_only``: without
    those under ``if TYPE_CHECKING:`` (annotations only)."""
    import ast

    import networkx as nx

    modules = {".".join(p.relative_to(project_root).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (project_root / "ai4dl").rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped = set()
        if runtime_only:
            for node in ast.walk(tree):
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    skipped.update(id(n) for child in node.body for n in ast.walk(child))
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ai4dl"):
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("ai4dl")]
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def test_no_import_cycle_runs_through_config(project_root):
    """The configuration is the layer every module reads its parameters from: it imports no library module that
    could import it back (any import statement counts, lazy ones too)."""
    import networkx as nx

    graph = _import_graph(project_root)
    assert set(graph.successors("ai4dl.config")) <= {"ai4dl.errors", "ai4dl.durations", "ai4dl.lake.columns"}
    assert not [c for c in nx.simple_cycles(graph) if "ai4dl.config" in c]


def test_the_labeller_uses_the_phase_model_not_the_other_way_round(project_root):
    """``method.labelling`` applies a ``method.model``; the model (numbers, save, load) imports nothing of the
    labeller, not even lazily or for annotations: no module of the method imports one that imports it back."""
    import networkx as nx

    graph = _import_graph(project_root)
    assert graph.has_edge("ai4dl.method.labelling", "ai4dl.method.model")
    assert not graph.has_edge("ai4dl.method.model", "ai4dl.method.labelling")
    method = graph.subgraph([n for n in graph if n.startswith("ai4dl.method.")])
    assert not list(nx.simple_cycles(method))
