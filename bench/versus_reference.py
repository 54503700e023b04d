"""This project's Spark/Arrow labelling and mini-batch CRBM training vs the original AI4DL tool's per-window loops.

    .venv/bin/python bench/versus_reference.py                      # 200 containers x 1100 steps (~220k windows)
    .venv/bin/python bench/versus_reference.py --containers 50 --steps 500 --train-windows 10000   # quick

1. Labelling the same silver windows with the same model:
   (a) ``ai4dl.labelling.label`` (mapInPandas, one GEMM per Arrow batch) written to Spark's ``noop`` sink, for
       each ``spark.sql.execution.arrow.maxRecordsPerBatch`` in ``--batch-sizes``; plus the same scan written
       to ``noop`` without the UDF (what Spark alone costs);
   (b) the original tool's loop, restated here from the maths: for each window, column vectors
       ``h = sigmoid(W @ x + B @ cond + h_bias)`` with the original's feature-major history layout, then the
       argmin of the squared distance to the k-means centres; over windows collected to the driver (this
       emulates the single-machine tool; collecting is only done for the baseline).
   Labels are compared per ``(pod_id, ts)``.
   Time inside the Python UDF is measured by wrapping the mapInPandas function (bench-only monkeypatch of
   ``DataFrame.mapInPandas``) with accumulators: ``fn`` = wall time inside the generator's ``next`` calls,
   ``input`` = the part of it spent pulling the next pandas batch (waiting for the JVM + Arrow -> pandas),
   ``compute`` = fn - input (array stacking, encode, assign, building the output frame), and
   ``encode+assign`` (wrapping the two functions the UDF calls). Shares are task-seconds / (stage wall
   seconds x parallel task slots). Arrow serialisation of the output happens outside the generator and
   counts as "Spark" here.
2. CRBM training on the same ``--train-windows`` sampled windows, same initial weights:
   per-sample SGD in numpy (one window at a time, column vectors, mean-field CD-1, as the original ``fit``)
   vs ``ai4dl.crbm.train_crbm`` (torch, mini-batch CD-k). Reconstruction error is evaluated identically for
   both, on the whole training set with numpy: mean over rows of ``sum((v - v_neg)^2)``, ``v_neg`` the
   mean-field CD-1 reconstruction from the current weights. Target = the error the per-sample SGD reaches
   after one epoch (or ``--target``). The torch side's epochs-to-target is found with the library's own
   ``CRBM.cd_step`` loop (evaluation excluded from the clock), then ``train_crbm`` is timed for that many
   epochs and its weights evaluated.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ai4dl.config import load_config  # noqa: E402


# ---------------------------------------------------------------- the original tool's loops, from the maths

def to_feature_major(m: np.ndarray, n_vis: int, n_his: int) -> np.ndarray:
    """Columns ``t*n_vis + f`` (this project) -> ``f*n_his + t`` (the original tool)."""
    return m.reshape(m.shape[0], n_his, n_vis).transpose(0, 2, 1).reshape(m.shape[0], -1)


def original_loop_labels(W, B_fm, h_bias, centers, x, hist_tm, n_his):
    """Per window, as the original ``CRBM.predict`` + nearest centre: column vectors, one window at a time."""
    n, n_vis = x.shape
    hb = h_bias.reshape(-1, 1)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        window = hist_tm[i].reshape(n_his, n_vis)            # history rows, oldest first
        history = window.flatten("F").reshape(-1, 1)         # feature-major, as the original
        vis = x[i].reshape(-1, 1)
        h = 1.0 / (1.0 + np.exp(-(W @ vis + B_fm @ history + hb)))
        out[i] = int(np.argmin(((centers - h.T) ** 2).sum(axis=1)))
    return out


def kmeans(h: np.ndarray, k: int, seed: int, iters: int = 30) -> np.ndarray:
    """Plain Lloyd iterations from k distinct random rows: centres for the benchmark's quick model."""
    rng = np.random.default_rng(seed)
    c = h[rng.choice(len(h), size=k, replace=False)].copy()
    for _ in range(iters):
        idx = np.argmin(((h[:, None, :] - c[None, :, :]) ** 2).sum(-1), axis=1)
        for j in range(k):
            if (idx == j).any():
                c[j] = h[idx == j].mean(axis=0)
    return c


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def rec_error(w: dict, x: np.ndarray, c: np.ndarray) -> float:
    """Mean over rows of sum((v - v_neg)^2), v_neg the mean-field CD-1 reconstruction (both methods alike)."""
    h = sigmoid(x @ w["W"].T + c @ w["B"].T + w["h_bias"])
    v_neg = h @ w["W"] + c @ w["A"].T + w["v_bias"]
    return float(((x - v_neg) ** 2).sum(axis=1).mean())


def sgd_epoch(w: dict, x: np.ndarray, c: np.ndarray, lr: float, order: np.ndarray) -> None:
    """One epoch of the original ``fit``: per-sample mean-field CD-1 gradient, update, next sample (in place)."""
    W, B, A, vb, hb = w["W"], w["B"], w["A"], w["v_bias"].reshape(-1, 1), w["h_bias"].reshape(-1, 1)
    for i in order:
        v = x[i].reshape(-1, 1)
        cond = c[i].reshape(-1, 1)
        h_pos = sigmoid(W @ v + B @ cond + hb)
        v_neg = W.T @ h_pos + A @ cond + vb
        h_neg = sigmoid(W @ v_neg + B @ cond + hb)
        dv = v - v_neg
        dh = h_pos - h_neg
        W += lr * (h_pos @ v.T - h_neg @ v_neg.T)
        B += lr * (dh @ cond.T)
        A += lr * (dv @ cond.T)
        vb += lr * dv
        hb += lr * dh


# ---------------------------------------------------------------- UDF instrumentation (bench only)

@contextmanager
def instrumented_udf(spark, df_class):
    """Wrap every mapInPandas/mapInArrow function and the labelling's encode/assign with timing accumulators."""
    import ai4dl.method.labelling as labelling

    sc = spark.sparkContext
    acc = {k: sc.accumulator(0.0) for k in ("fn", "input", "encode_assign", "batches", "rows")}
    originals = {m: df_class.__dict__.get(m) for m in ("mapInPandas", "mapInArrow")}
    bases = {m: getattr(df_class, m) for m in ("mapInPandas", "mapInArrow")}
    orig_encode, orig_assign = labelling.encode, labelling.assign

    def timed_encode(*a, **k):
        t = time.perf_counter()
        try:
            return orig_encode(*a, **k)
        finally:
            acc["encode_assign"].add(time.perf_counter() - t)

    def timed_assign(*a, **k):
        t = time.perf_counter()
        try:
            return orig_assign(*a, **k)
        finally:
            acc["encode_assign"].add(time.perf_counter() - t)

    def make(method):
        def map_in(self, func, schema, *args, **kwargs):
            def wrapped(batches):
                t_in = [0.0, 0, 0]

                def feed():
                    it = iter(batches)
                    while True:
                        t = time.perf_counter()
                        try:
                            b = next(it)
                        except StopIteration:
                            t_in[0] += time.perf_counter() - t
                            return
                        t_in[0] += time.perf_counter() - t
                        t_in[1] += 1
                        t_in[2] += len(b)
                        yield b

                gen = iter(func(feed()))
                total = 0.0
                while True:
                    t = time.perf_counter()
                    try:
                        out = next(gen)
                    except StopIteration:
                        total += time.perf_counter() - t
                        break
                    total += time.perf_counter() - t
                    yield out
                acc["fn"].add(total)
                acc["input"].add(t_in[0])
                acc["batches"].add(float(t_in[1]))
                acc["rows"].add(float(t_in[2]))

            return bases[method](self, wrapped, schema, *args, **kwargs)
        return map_in

    labelling.encode, labelling.assign = timed_encode, timed_assign
    for method in bases:
        setattr(df_class, method, make(method))
    try:
        yield acc
    finally:
        labelling.encode, labelling.assign = orig_encode, orig_assign
        for method, orig in originals.items():
            if orig is None:
                delattr(df_class, method)
            else:
                setattr(df_class, method, orig)


def noop(df) -> float:
    t = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--containers", type=int, default=200)
    p.add_argument("--steps", type=int, default=1100)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--workdir", default="/tmp/ai4dl-versus")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--shuffle-partitions", type=int, default=8)
    p.add_argument("--model-epochs", type=int, default=5, help="CRBM epochs of the quick model used for labelling")
    p.add_argument("--reference-model", help="label with this original AI4DL model JSON (silver scaled with its scaler) "
                   "instead of a quick model trained here")
    p.add_argument("--engines", default="arrow,pandas", help="labelling engines to time (ai4dl.labelling.ENGINES)")
    p.add_argument("--batch-sizes", default="2000,10000,20000,50000", help="arrow maxRecordsPerBatch values")
    p.add_argument("--train-windows", type=int, default=50_000)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--torch-learning-rate", type=float, help="learning rate of the mini-batch side (default: --learning-rate; "
                   "a mini-batch step averages the gradient, so batch_size x lr is the per-sample equivalent)")
    p.add_argument("--target", type=float, help="reconstruction error target (default: per-sample SGD after 1 epoch)")
    p.add_argument("--max-epochs", type=int, default=40, help="torch epochs to try before giving up on the target")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)

    work = Path(args.workdir).absolute()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cfg = load_config(None, [
        f"spark.master={args.master}", f"spark.driver_memory={args.driver_memory}",
        f"spark.shuffle_partitions={args.shuffle_partitions}", f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}",
        "spark.app_name=ai4dl-versus", f"lake.root={work / 'lake'}", f"lake.models={work / 'models'}",
        f"report.dir={work / 'report'}", f"generate.containers={args.containers}", f"generate.steps={args.steps}",
        f"generate.seed={args.seed}",
    ])

    from pyspark.sql import functions as F

    from ai4dl import stages
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake
    from ai4dl.method.crbm import CRBM, encode, train_crbm
    from ai4dl.method.labelling import label, label_arrays
    from ai4dl.method.model import PhaseModel
    from ai4dl.method.windowing import silver_scaler

    spark = get_spark(cfg)
    lake = Lake.for_config(spark, cfg)
    slots = spark.sparkContext.defaultParallelism
    res: dict = {"containers": args.containers, "steps": args.steps, "parallelism": slots}

    # ---- data and model
    t0 = time.perf_counter()
    fleet = str(work / "fleet")
    stages.generate(cfg, spark, out=fleet, fmt="parquet")
    stages.ingest(cfg, spark, input=fleet, fmt="parquet")
    ref = Path(args.reference_model) if args.reference_model else None
    model = model_dir = None
    if ref is not None:
        imported = stages.import_reference_model(cfg, spark, path=str(ref))
        model, model_dir = imported.details["model"], imported.details["path"]
    if model is not None and tuple(model.features) != tuple(cfg.window.features):
        raise SystemExit(f"{ref}: features {model.features} differ from window.features; cannot use it")
    stages.window(cfg, spark, scaler_from_model=model_dir)
    silver = lake.read("silver")
    n_full = silver.where("has_full_history").count()
    n_all = silver.count()
    # The baseline's input: every full-history window collected to the driver (emulates the single-machine tool).
    t = time.perf_counter()
    pdf = silver.where("has_full_history").select("pod_id", "ts", "features", "history").toPandas()
    collect_s = time.perf_counter() - t
    x = np.stack(pdf["features"].to_numpy()).astype(np.float64)
    cond = np.stack(pdf["history"].to_numpy()).astype(np.float64)
    rng = np.random.default_rng(1234)
    pick = rng.choice(len(x), size=min(args.train_windows, len(x)), replace=False)
    xs, cs = np.ascontiguousarray(x[pick]), np.ascontiguousarray(cond[pick])
    if model is None:
        # A quick model: train_crbm on the sampled windows, then a seeded numpy k-means on their codes.
        scaler, _ = silver_scaler(lake.properties("silver"))
        t_cfg = cfg.train
        crbm = train_crbm(xs, cs, n_hidden=t_cfg.n_hidden, cd_k=t_cfg.cd_k, epochs=args.model_epochs,
                          batch_size=t_cfg.batch_size, learning_rate=t_cfg.learning_rate,
                          seed=t_cfg.seed, device="cpu", log=None, progress=False).weights
        model = PhaseModel(scaler, crbm, kmeans(encode(crbm, xs, cs), t_cfg.k, seed=t_cfg.seed))
    print(f"[versus] setup {time.perf_counter() - t0:.0f}s: {n_all} silver windows, {n_full} with full history; "
          f"model {model.model_id} ({'imported ' + str(ref) if ref else 'trained here'}; k={model.k}, "
          f"{model.crbm.n_hidden} hidden, history {model.n_history})", flush=True)
    res.update(silver_rows=n_all, full_history_rows=n_full, model="reference" if ref else "trained")

    # ---- (a) Spark: Spark alone, then the UDF at each Arrow batch size
    cols = ["pod_id", "service", "ts", "step", "cpu_usage_cores", "cpu_num_cores", "mem_current", "mem_limit", "behaviour",
            "features", "history", "has_full_history"]
    noop(silver.select(*cols))  # warm-up: file listing, JIT, Python workers
    spark_only = noop(silver.select(*cols))
    print(f"[versus] Spark alone (scan silver -> noop, no UDF): {spark_only:.2f}s, {n_all / spark_only:,.0f} rows/s", flush=True)
    res["spark_only_seconds"] = round(spark_only, 3)
    df_class = type(silver)
    udf_runs = []
    for engine, bs in [(e, int(b)) for e in args.engines.split(",") for b in args.batch_sizes.split(",")]:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(bs))
        with instrumented_udf(spark, df_class) as acc:
            wall = noop(label(silver, model, engine=engine))
        fn, inp, ea = acc["fn"].value, acc["input"].value, acc["encode_assign"].value
        compute = fn - inp
        cap = wall * slots
        run = {
            "engine": engine, "max_records_per_batch": bs, "seconds": round(wall, 3), "rows_per_s": round(n_all / wall, 1),
            "batches": int(acc["batches"].value), "udf_task_seconds": round(fn, 3), "udf_input_wait_seconds": round(inp, 3),
            "udf_compute_seconds": round(compute, 3), "encode_assign_seconds": round(ea, 3),
            "share_udf_compute": round(compute / cap, 3), "share_encode_assign": round(ea / cap, 3),
            "share_input_wait": round(inp / cap, 3),
        }
        udf_runs.append(run)
        print(f"[versus] UDF {engine:>6} batch {bs:>6}: {wall:6.2f}s {run['rows_per_s']:>10,.0f} rows/s  {run['batches']} batches; "
              f"python compute {compute:.2f} task-s ({run['share_udf_compute']:.0%} of {slots} slots x wall), "
              f"encode+assign {ea:.2f} task-s ({run['share_encode_assign']:.0%}), "
              f"waiting for input {inp:.2f} task-s", flush=True)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(cfg.spark.arrow_max_records_per_batch))
    res["udf"] = udf_runs

    # ---- (b) the original per-window loop, on windows collected to the driver (baseline only)
    w = model.crbm
    n_vis, n_his = w.n_visible, w.n_history
    B_fm = to_feature_major(np.asarray(w.B), n_vis, n_his)
    t = time.perf_counter()
    loop_phase = original_loop_labels(np.asarray(w.W), B_fm, np.asarray(w.h_bias), np.asarray(model.centers), x, cond, n_his)
    loop_s = time.perf_counter() - t
    t = time.perf_counter()
    vec_phase, _, _ = label_arrays(model, x, cond)
    vec_s = time.perf_counter() - t
    print(f"[versus] original loop: {len(x)} windows in {loop_s:.2f}s = {len(x) / loop_s:,.0f} rows/s "
          f"(collecting them to the driver took {collect_s:.1f}s, not counted); driver-side vectorised "
          f"label_arrays: {vec_s:.3f}s = {len(x) / vec_s:,.0f} rows/s", flush=True)
    udf_pdf = label(silver, model).where(F.col("phase").isNotNull()).select("pod_id", "ts", "phase").toPandas()
    merged = pdf[["pod_id", "ts"]].assign(loop=loop_phase).merge(udf_pdf, on=["pod_id", "ts"], how="outer", indicator=True)
    both = merged[merged["_merge"] == "both"]
    mismatches = int((both["loop"].astype("int64") != both["phase"].astype("int64")).sum())
    unmatched = int((merged["_merge"] != "both").sum())
    vec_mismatch = int((vec_phase != loop_phase).sum())
    best = max(udf_runs, key=lambda r: r["rows_per_s"])
    default = next((r for r in udf_runs if r["max_records_per_batch"] == cfg.spark.arrow_max_records_per_batch
                    and r["engine"] == cfg.label.engine), best)
    loop_rps = len(x) / loop_s
    print(f"[versus] agreement: {len(both) - mismatches}/{len(both)} windows agree ({mismatches} mismatches, {unmatched} unmatched keys); "
          f"label_arrays vs loop mismatches {vec_mismatch}", flush=True)
    print(f"[versus] speed: UDF ({default['engine']}, batch {default['max_records_per_batch']}) {default['rows_per_s']:,.0f} rows/s (all silver rows, "
          f"end to end incl. the Delta scan) vs loop {loop_rps:,.0f} rows/s (full-history windows, compute only): "
          f"x{default['rows_per_s'] / loop_rps:.1f}; best {best['engine']} batch {best['max_records_per_batch']}: x{best['rows_per_s'] / loop_rps:.1f}", flush=True)
    res.update(loop_windows=len(x), loop_seconds=round(loop_s, 3), loop_rows_per_s=round(loop_rps, 1),
               collect_seconds=round(collect_s, 2), vectorised_seconds=round(vec_s, 4),
               agree=int(len(both) - mismatches), mismatches=mismatches, unmatched=unmatched,
               ratio_default=round(default["rows_per_s"] / loop_rps, 2), ratio_best=round(best["rows_per_s"] / loop_rps, 2))

    # ---- 2. training: per-sample numpy SGD vs torch mini-batch CD-k, same windows, same initial weights
    import torch

    n_hidden, lr, seed = cfg.train.n_hidden, args.learning_rate, 1234
    init = CRBM(n_vis, n_hidden, n_his, seed=seed).weights().as_dict()
    err0 = rec_error(init, xs, cs)
    w_sgd = {k: np.array(v, dtype=np.float64, copy=True) for k, v in init.items()}
    sgd_err, sgd_times = [], []
    elapsed = 0.0
    for epoch in range(2):
        order = np.random.default_rng(seed + epoch).permutation(len(xs))
        t = time.perf_counter()
        sgd_epoch(w_sgd, xs, cs, lr, order)
        elapsed += time.perf_counter() - t
        sgd_err.append(rec_error(w_sgd, xs, cs))
        sgd_times.append(round(elapsed, 2))
        print(f"[versus] per-sample SGD epoch {epoch + 1}: {elapsed:.1f}s cumulative, rec_error {sgd_err[-1]:.5f} (initial {err0:.5f})", flush=True)
    target = args.target if args.target is not None else sgd_err[0]

    model_t = CRBM(n_vis, n_hidden, n_his, seed=seed)
    xt, ct = torch.as_tensor(xs, dtype=torch.float32), torch.as_tensor(cs, dtype=torch.float32)
    shuffle = np.random.default_rng(seed)
    bs = cfg.train.batch_size
    lr_t = args.torch_learning_rate if args.torch_learning_rate is not None else lr
    torch_err, torch_times, elapsed, reached = [], [], 0.0, None
    for epoch in range(1, args.max_epochs + 1):
        t = time.perf_counter()
        order = torch.from_numpy(shuffle.permutation(len(xs)))
        for start in range(0, len(xs), bs):
            idx = order[start:start + bs]
            model_t.cd_step(xt[idx], ct[idx], lr_t, k=cfg.train.cd_k)
        elapsed += time.perf_counter() - t
        torch_err.append(rec_error(model_t.weights().as_dict(), xs, cs))
        torch_times.append(round(elapsed, 2))
        if torch_err[-1] <= target:
            reached = epoch
            break
    if reached:
        t = time.perf_counter()
        result = train_crbm(xs, cs, n_hidden=n_hidden, cd_k=cfg.train.cd_k, epochs=reached, batch_size=bs,
                            learning_rate=lr_t, patience=reached + 1, seed=seed, device="cpu", log=None, progress=False)
        tc_s = time.perf_counter() - t
        tc_err = rec_error(result.weights.as_dict(), xs, cs)
        print(f"[versus] torch mini-batch (batch {bs}) reaches {target:.5f} after {reached} epochs: "
              f"{torch_times[-1]:.2f}s in the cd_step loop; train_crbm({reached} epochs) {tc_s:.2f}s, rec_error {tc_err:.5f}; "
              f"per-sample SGD took {sgd_times[0]:.1f}s -> x{sgd_times[0] / tc_s:.1f}", flush=True)
    else:
        tc_s = tc_err = None
        print(f"[versus] torch mini-batch did not reach {target:.5f} in {args.max_epochs} epochs "
              f"(best {min(torch_err):.5f}, {elapsed:.1f}s)", flush=True)
    res["training"] = {
        "windows": len(xs), "learning_rate": lr, "torch_learning_rate": lr_t, "batch_size": bs, "initial_error": round(err0, 6),
        "target": round(target, 6), "sgd_epoch_errors": [round(e, 6) for e in sgd_err], "sgd_seconds": sgd_times,
        "torch_epoch_errors": [round(e, 6) for e in torch_err], "torch_seconds": torch_times,
        "torch_epochs_to_target": reached, "train_crbm_seconds": round(tc_s, 3) if tc_s else None,
        "train_crbm_error": round(tc_err, 6) if tc_err is not None else None,
        "speedup": round(sgd_times[0] / tc_s, 2) if tc_s else None,
    }
    print("BENCH_JSON " + json.dumps(res, default=str), flush=True)
    spark.stop()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
