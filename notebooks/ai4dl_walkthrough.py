# Databricks notebook source
# MAGIC %md
# MAGIC # ai4dl walkthrough: from container traces to autoscaling savings
# MAGIC
# MAGIC This notebook runs the whole AI4DL method on the published DLaaS sample (4 training containers, 204 samples):
# MAGIC ingest -> window -> label with the original pretrained model -> train a fresh model and compare ->
# MAGIC behaviour (phases, transitions, prototypes) -> policy replay -> BI views -> HTML report.
# MAGIC
# MAGIC It is a Databricks source notebook (import it as a notebook, with the `ai4dl` wheel attached to the cluster),
# MAGIC and also a plain Python script: `python notebooks/ai4dl_walkthrough.py` runs it top to bottom on local Spark.

# COMMAND ----------

# MAGIC %md
# MAGIC ## Parameters
# MAGIC
# MAGIC On Databricks each parameter is a widget at the top of the notebook (a job task of the bundle sets them as
# MAGIC `base_parameters`); elsewhere an environment variable (`AI4DL_LAKE_ROOT`, ...), which is how the test suite
# MAGIC points the notebook at temporary folders. On Databricks, set e.g. `lake_root` to
# MAGIC `/Volumes/main/ai4dl/lake` and `catalog`/`schema` to name the tables in Unity Catalog
# MAGIC (`main.ai4dl.gold_phase_stats`); empty `schema`: tables by path only.

# COMMAND ----------

import os
from pathlib import Path

try:
    REPO = Path(__file__).resolve().parents[1]
except NameError:  # a Databricks notebook has no __file__; its working directory is the notebook's folder
    REPO = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()

try:
    _widgets = dbutils.widgets  # noqa: F821 - a Databricks notebook builtin
except NameError:
    _widgets = None


def param(name: str, default: object) -> str:
    """A widget on Databricks (created with its default, read back as the user or the job set it), else the
    environment variable ``AI4DL_<NAME>``, else the default."""
    if _widgets is not None:
        _widgets.text(name, str(default))
        return _widgets.get(name)
    return os.environ.get(f"AI4DL_{name.upper()}", str(default))


LAKE_ROOT = param("lake_root", REPO / "data" / "notebook" / "lake")
MODELS = param("models", REPO / "data" / "notebook" / "models")
REPORT_DIR = param("report_dir", REPO / "data" / "notebook" / "report")
CATALOG = param("catalog", "")  # Unity Catalog's catalog (Databricks); empty: the session's current one
SCHEMA = param("schema", "")  # empty: tables by path only; a name: every table also named there, views persisted
SAMPLE = param("sample", REPO.parent / "shared" / "data" / "reference" / "dlaas_sample.csv")
REFERENCE = param("reference_model", REPO.parent / "shared" / "data" / "reference" / "reference_model.json")
EPOCHS = int(param("epochs", 10))  # a few epochs: the sample is tiny
INTERVAL_STEPS = int(param("interval_steps", 5))  # the sample's traces are short
SYNTHETIC_CONTAINERS = int(param("synthetic_containers", 12))
SYNTHETIC_STEPS = int(param("synthetic_steps", 120))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Configuration and session
# MAGIC
# MAGIC The notebook uses the same config loader and the same stage functions (`ai4dl.stages`) as the jobs and the
# MAGIC CLI, so what it does is exactly what `ai4dl <verb> --set ...` would do, run log included. `get_spark`
# MAGIC returns the already running session when there is one (Databricks' `spark`, a test fixture) and only builds
# MAGIC a local Delta session otherwise.

# COMMAND ----------

from ai4dl import stages
from ai4dl.config import load_config
from ai4dl.lake.session import get_spark
from ai4dl.lake.tables import Lake

cfg = load_config(
    None,
    [
        f"lake.root={LAKE_ROOT}",
        f"lake.models={MODELS}",
        f"report.dir={REPORT_DIR}",
        f"spark.ivy_cache={REPO / '.cache' / 'ivy'}",
        "spark.shuffle_partitions=4",
        f"train.epochs={EPOCHS}",
        f"policies.interval_steps={INTERVAL_STEPS}",
        *([f"lake.schema={SCHEMA}"] if SCHEMA else []),
        *([f"lake.catalog={CATALOG}"] if CATALOG and SCHEMA else []),
    ],
)
spark = get_spark(cfg)
lake = Lake.for_config(spark, cfg)
print(f"Spark {spark.version}; lake {cfg.lake.root}; models {cfg.lake.models}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Input
# MAGIC
# MAGIC The DLaaS sample is the data the original model was trained for. Without it (e.g. on a fresh cluster) the
# MAGIC notebook generates a small synthetic fleet with known behaviours, so every later step still has data.

# COMMAND ----------

USE_SAMPLE = Path(SAMPLE).is_file()
if USE_SAMPLE:
    INPUT = SAMPLE
    print(f"input: the DLaaS sample {INPUT}")
else:
    small = cfg.replace(generate={"containers": SYNTHETIC_CONTAINERS, "steps": SYNTHETIC_STEPS})
    INPUT = stages.generate(small, spark).details["path"]
    print(f"input: {SAMPLE} not found; generated {SYNTHETIC_CONTAINERS} containers x {SYNTHETIC_STEPS} steps -> {INPUT}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Ingest (bronze)
# MAGIC
# MAGIC Every row is validated before it reaches bronze; a bad row is quarantined with its reason instead of being
# MAGIC silently dropped or nulled. The MERGE is insert-only, so running this cell again inserts nothing.

# COMMAND ----------

ingested = stages.ingest(cfg, spark, input=INPUT, fmt="csv")
print(ingested)

# COMMAND ----------

# MAGIC %md
# MAGIC ## The reference model, and windows scaled with its scaler (silver)
# MAGIC
# MAGIC The pretrained AI4DL model only means something on data scaled the way it was trained, so silver is built
# MAGIC with the model's own scaler rather than one fitted on this data. Importing it as a model version makes it
# MAGIC a first-class, checksummed artefact like any trained model.

# COMMAND ----------

# The reference scaler fits DLaaS magnitudes only: a synthetic fleet scaled with it lies tens of standard
# deviations out and a fresh CRBM trained on that diverges, so the fallback fleet gets its own scaler.
HAVE_REFERENCE = Path(REFERENCE).is_file()
reference_model = reference_dir = None
if HAVE_REFERENCE and USE_SAMPLE:
    imported = stages.import_reference_model(cfg, spark, path=REFERENCE)
    reference_model, reference_dir = imported.details["model"], imported.details["path"]
else:
    why = "no DLaaS sample" if HAVE_REFERENCE else f"{REFERENCE} not found"
    print(f"reference model not used ({why}): silver gets a scaler fitted on the training containers")

print(stages.window(cfg, spark, scaler_from_model=reference_dir))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Label with the reference model (silver phases)
# MAGIC
# MAGIC Each step with a full history gets the phase of its nearest k-means centre in the CRBM's hidden space. The
# MAGIC first `n_history` steps of a container have no history and keep a null phase, rather than a made-up one.

# COMMAND ----------

if reference_model is not None:
    print(stages.label(cfg, spark, model=reference_dir))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Train a fresh model on the same silver, and compare
# MAGIC
# MAGIC Retraining is how the method adapts to a new fleet. Phase ids of two models are arbitrary, so the
# MAGIC comparison is a contingency table and the adjusted Rand index (1 = the same partition of the steps), not a
# MAGIC count of equal ids. The fresh model shares silver's scaler, so both label the very same windows.

# COMMAND ----------

from ai4dl.method.clustering import adjusted_rand_index, contingency
from ai4dl.method.labelling import label_windows

trained = stages.train(cfg, spark)
fresh_model, fresh_dir = trained.details["model"], trained.details["path"]

fresh_phases = label_windows(lake.read("silver"), fresh_model).select("pod_id", "ts", "phase")
if reference_model is not None:
    ref_phases = lake.read("phases").select("pod_id", "ts", "phase")
    both = ref_phases.withColumnRenamed("phase", "reference").join(fresh_phases.withColumnRenamed("phase", "fresh"), ["pod_id", "ts"])
    table, fresh_ids, ref_ids = contingency(both, predicted="fresh", truth="reference")
    MODEL_ARI = adjusted_rand_index(table)
    print(f"fresh model {fresh_model.model_id} vs reference {reference_model.model_id}: ARI {MODEL_ARI:.3f} on {int(table.sum())} steps")
    print("rows: fresh phases", fresh_ids, "| columns: reference phases", ref_ids)
    print(table)
else:  # no reference: the fresh model is the one the rest of the notebook uses
    MODEL_ARI = None
    print(stages.label(cfg, spark, model=fresh_dir))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Behaviour (gold)
# MAGIC
# MAGIC Phases become run-length sequences, a transition graph and a tree of prototypical executions: this is what
# MAGIC lets a scheduler anticipate the next phase instead of reacting to the last sample.

# COMMAND ----------

behaviour_result = stages.behaviour(cfg, spark).details

# COMMAND ----------

# MAGIC %md
# MAGIC ## Phase statistics for BI
# MAGIC
# MAGIC The behaviour step puts views over the gold tables, so an analyst queries them in SQL (or a dashboard)
# MAGIC without knowing where the Delta files are: temporary views of this session by default, views persisted
# MAGIC in the catalog when `schema` is set (then Databricks SQL, or `ai4dl sql` locally, serves them to BI tools).
# MAGIC `ai4dl_phase_summary` is in the units people read: cores, GiB, percent of the service's steps, minutes.

# COMMAND ----------

from ai4dl.behaviour.phase_stats import VIEWS

view = dict(zip(VIEWS, behaviour_result["views"]))  # view -> its name in SQL (qualified when persisted)
phase_stats_pdf = spark.sql(
    f"""
    SELECT phase, phase_name, steps, share_of_steps_pct, cpu_mean_cores, cpu_p95_cores, mem_mean_gib, mem_p95_gib,
           mean_dwell_minutes
    FROM {view['ai4dl_phase_summary']}
    WHERE service = '__all__'
    ORDER BY phase
    """
).toPandas()
print(phase_stats_pdf.to_string(index=False))
transitions_pdf = spark.sql(
    f"SELECT src, dst, count, ROUND(probability, 3) AS probability FROM {view['ai4dl_phase_transitions']} ORDER BY src, dst"
).toPandas()
print(transitions_pdf.to_string(index=False))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Policy model (gold)
# MAGIC
# MAGIC A policy model is fitted on the training containers (phase statistics, transitions, each policy's knob
# MAGIC calibrated for the service level) and scored on the held-out containers, so the savings of the phase
# MAGIC policies are measured against oracles, reactive rules and VPA on traces the model did not see. The table
# MAGIC marks the policy `ai4dl stream` deploys per resource. The sample's traces are short, hence a
# MAGIC re-allocation every few steps.

# COMMAND ----------

policies_result = stages.policies(cfg, spark)
policy_summary = policies_result.details["calibration"]
print(f"policy model {policies_result.details['model'].model_id} at {policies_result.details['path']}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Report
# MAGIC
# MAGIC One HTML page with the plots, to share a run with people who do not open notebooks.

# COMMAND ----------

report_path = stages.report(cfg, spark).details["path"]


def _show_images(paths):
    """Inline images on Databricks or in IPython/Jupyter; plain ``python`` just lists the files."""
    try:
        display_html = displayHTML  # noqa: F821 - a Databricks notebook builtin
    except NameError:
        display_html = None
    try:
        from IPython import get_ipython
        from IPython.display import Image, display

        in_ipython = get_ipython() is not None
    except ImportError:
        in_ipython = False
    for p in paths:
        if display_html is not None:
            import base64

            data = base64.b64encode(Path(p).read_bytes()).decode()
            display_html(f'<img src="data:image/png;base64,{data}" style="max-width:100%"/>')
        elif in_ipython:
            display(Image(filename=str(p)))
        else:
            print(f"  image: {p}")


_show_images(sorted(Path(REPORT_DIR).glob("*.png")))

# COMMAND ----------

WALKTHROUGH_DONE = True
print("walkthrough done")
