"""One container, one micro-batch: the pure step of the live stream (numpy/pandas, no Spark).

:func:`advance` takes the container's new samples and its state (a tuple of
:data:`ai4dl.lake.columns.STREAM_STATE_FIELDS`, as Spark's state store keeps it) and returns the rows the
batch produces and the new state. Spark calls it once per container and micro-batch
(:mod:`ai4dl.stream.query`); tests call it directly.

What it does, and why it gives the batch pipeline's answers:

* **Order and late samples.** A container's samples are taken in ``ts`` order, ``step`` = previous step + 1,
  as the window stage numbers them. A sample whose ``ts`` is not after the container's last labelled step
  (older, or a second sample at the same instant) cannot be labelled without rewriting the steps after it, so
  it is *late*: emitted as a ``late`` row (quarantined with its reason by the stream, counted in
  ``late_samples``), never silently dropped. Samples that arrive out of order *within* one micro-batch are
  simply sorted. This rule replaces an event-time watermark: a phase depends on the samples just before it,
  not on how old a sample is.
* **Windows.** The state keeps the *raw* metrics of the last ``n_history + LOOKBACK`` samples of the current
  segment; a micro-batch's samples are windowed after them by the window stage's own kernel
  (:func:`ai4dl.method.windowing.container_windows`: segments after a gap longer than ``max_gap_seconds``,
  derived features, scaling), once per micro-batch. They are scaled with the labelling model's own scaler: the
  numbers are those of a silver table scaled with that scaler, and a model change (possibly with another
  scaler) never meets history scaled by the previous one.
* **Phases.** Full windows are labelled with :func:`ai4dl.method.labelling.label_batch`, the kernel of the
  label stage, then decoded as the label stage decodes them (``Live.decoding``: the causal forward decoder by
  default, resumed from the accumulated costs the state keeps, so a micro-batch boundary or a restart changes
  nothing); a step without full history gets a null phase, as in batch. Viterbi needs the steps after a step:
  a stream configured with it takes each step's cheapest phase (decoding none), and says so at start.
* **Recommendation.** After the batch: the current phase (the last non-null one), since when it lasts (first
  step of its run; unlabelled steps do not break a run), the most likely next phase (the policy model's
  next-phase table of the container's service, else the fleet's: :func:`ai4dl.policies.nextphase.next_phase_table`)
  and what the deployed policies allocate for the next step (:class:`ai4dl.policies.live.LivePolicies`: the
  policy model's calibrated knobs, the replay's rules on running summaries), the allocation the replay of the whole trace holds at that step. The state is
  O(1) in the container's age: the window's raw samples, the current run, the policies' running summaries.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ai4dl.lake.columns import BEHAVIOUR, METRICS, POD_ID, SERVICE, STREAM_STATE_FIELDS, TS
from ai4dl.method.features import LOOKBACK
from ai4dl.method.labelling import chosen_distances, forward_decode, label_batch, step_costs
from ai4dl.method.model import PhaseModel
from ai4dl.method.windowing import container_windows
from ai4dl.policies.live import Deployment, LivePolicies

STATE_NAMES = tuple(name for name, _, _ in STREAM_STATE_FIELDS)
_NM = len(METRICS)
LATE_REASON = "late_sample"


@dataclass(frozen=True)
class Live:
    """Everything :func:`advance` needs besides the data: the model and the policy's inputs (plain values,
    shipped to the executors with the stateful function)."""

    model: PhaseModel
    model_id: str
    n_history: int
    deployment: Deployment  # the policy model's deployed policies, knobs and statistics
    max_gap_seconds: float | None = None
    next_phase: Mapping[int, tuple[int, float]] = field(default_factory=dict)  # the policy model's next-phase table
    service_next_phase: Mapping[str, Mapping[int, tuple[int, float]]] = field(default_factory=dict)  # per service seen
    phase_names: Mapping[int, str] = field(default_factory=dict)
    decoding: str = "none"  # a causal one of ai4dl.method.labelling.CAUSAL_DECODINGS, as resolved for the model
    switch_penalty: float = 0.0  # absolute (ai4dl.method.labelling.switch_cost)

    def name(self, phase: int | None) -> str | None:
        if phase is None:
            return None
        return self.phase_names.get(int(phase), f"phase {int(phase)}")


def new_state(service: Any = None) -> dict[str, Any]:
    return {
        "service": service, "last_step": -1, "last_ts": -math.inf, "segment": 0, "history": [], "history_len": 0,
        "run_phase": None, "run_since_step": None, "run_since_ts": None, "late_samples": 0, "policy_state": None,
        "decode_costs": None, "decode_model": None,
    }


def state_from_tuple(values: Any) -> dict[str, Any]:
    state = {**new_state(), **dict(zip(STATE_NAMES, values))}
    state["history"] = [float(v) if v is not None else math.nan for v in (state["history"] or [])]
    if state["decode_costs"] is not None:
        state["decode_costs"] = [float(v) for v in state["decode_costs"]]
    return state


def state_to_tuple(state: Mapping[str, Any]) -> tuple:
    return tuple(state[name] for name in STATE_NAMES)


def epoch_seconds(ts: pd.Series) -> np.ndarray:
    """Naive timestamps (the session's UTC) as float epoch seconds, like Spark's ``cast(ts as double)``."""
    t = pd.to_datetime(ts)
    return ((t - pd.Timestamp(0)) / pd.Timedelta(seconds=1)).to_numpy(dtype=float)


def _raw_json(row: Mapping[str, Any]) -> str:
    """The late sample as its bronze columns, JSON: what the quarantine keeps of it."""
    out = {}
    for c in (POD_ID, SERVICE, TS, *METRICS, BEHAVIOUR):
        v = row.get(c)
        if isinstance(v, pd.Timestamp):
            v = v.isoformat()
        elif isinstance(v, float) and math.isnan(v):
            v = None
        elif hasattr(v, "item"):
            v = v.item()
        out[c] = v
    return json.dumps(out, sort_keys=True, default=str)


def advance(pod_id: str, rows: pd.DataFrame, state: Mapping[str, Any] | None, live: Live) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The rows one micro-batch produces for one container (``kind`` phase / late / rec, the columns of
    :data:`ai4dl.lake.schema.STREAM_OUTPUT` that kind uses) and the container's new state.

    ``rows``: the container's new bronze samples (``pod_id, service, ts``, the metrics, ``behaviour``,
    ``source_file``, ``ingested_at``), in any order.
    """
    st = dict(state) if state is not None else new_state()
    rows = rows.sort_values(TS, kind="stable").reset_index(drop=True)
    secs = epoch_seconds(rows[TS])
    late = (secs <= st["last_ts"]) | pd.Series(secs).duplicated(keep="first").to_numpy()
    out: list[dict[str, Any]] = []
    for i in np.flatnonzero(late):
        r = rows.iloc[i].to_dict()
        out.append({"kind": "late", POD_ID: pod_id, SERVICE: r.get(SERVICE), TS: r.get(TS),
                    "source_file": r.get("source_file"), "ingested_at": r.get("ingested_at"),
                    "raw": _raw_json(r), "reason": LATE_REASON})
    st["late_samples"] = int(st["late_samples"]) + int(late.sum())
    fresh = rows[~late].reset_index(drop=True)
    fresh_secs = secs[~late]
    if len(fresh):
        policies = LivePolicies.loads(live.deployment, st["policy_state"])
        out += _label(pod_id, fresh, fresh_secs, st, live, policies)
        out.append(_recommend(pod_id, st, live, policies))
        st["policy_state"] = policies.dumps()
    return pd.DataFrame(out), st


def _label(pod_id: str, rows: pd.DataFrame, secs: np.ndarray, st: dict[str, Any], live: Live,
           policies: LivePolicies) -> list[dict[str, Any]]:
    model, n_hist = live.model, int(live.n_history)
    # derived features look LOOKBACK raw samples back from each step of a window: that many more are kept
    # (whatever the model, so a model change mid-stream finds them)
    keep = n_hist + LOOKBACK
    history = np.asarray(st["history"], dtype=float).reshape(-1, _NM)  # the current segment's last samples
    block = np.vstack([history, rows[list(METRICS)].to_numpy(dtype=float)])
    # the kept samples are one segment ending at last_ts: given that time, only the new samples' gaps count
    block_secs = np.r_[np.full(len(history), st["last_ts"]), secs]
    w = container_windows(pd.DataFrame(block, columns=list(METRICS)), block_secs, model.scaler, n_hist,
                          live.max_gap_seconds)
    new = slice(len(history), len(block))
    steps = (int(st["last_step"]) + 1 + np.arange(len(rows))).tolist()
    st["last_step"], st["last_ts"] = int(st["last_step"]) + len(rows), float(secs[-1])
    st["segment"] = int(st["segment"]) + int(w.segment[-1] - w.segment[0])
    kept = block[w.segment == w.segment[-1]][-keep:]
    st["history"], st["history_len"] = kept.ravel().tolist(), int(len(kept))
    idx = np.flatnonzero(w.full[new])  # the new samples with a full window, in time order
    phase = np.full(len(rows), np.nan)
    dist = np.full(len(rows), np.nan)
    acts: list[Any] = [None] * len(rows)
    if idx.size:
        x, cond = w.features[new][idx], w.history[new][idx]
        if live.decoding == "forward":  # the decoder gives each step its phase: encode only
            h = label_batch(model.crbm, None, {}, x, cond)[2]
            ph, d = _decode_forward(h, st, live)
        else:
            ph, d, h = label_batch(model.crbm, model.centers, model.refinements, x, cond, model.classifier)
        phase[idx], dist[idx] = ph, d
        for j, row in zip(idx, h):
            acts[j] = row.tolist()
    out = []
    for i, r in enumerate(rows.to_dict("records")):
        p = None if math.isnan(phase[i]) else int(phase[i])
        st["service"] = r.get(SERVICE) if r.get(SERVICE) is not None else st["service"]
        policies.observe(float(secs[i]), {"cpu": r["cpu_usage_cores"], "mem": r["mem_current"]},
                         {"cpu": r["cpu_num_cores"], "mem": r["mem_limit"]}, p)
        if p is not None and p != st["run_phase"]:
            st["run_phase"], st["run_since_step"], st["run_since_ts"] = p, steps[i], float(secs[i])
        out.append({
            "kind": "phase", POD_ID: pod_id, SERVICE: r.get(SERVICE), TS: r[TS], "step": steps[i], "phase": p,
            "distance": None if p is None else float(dist[i]), "activations": acts[i],
            "cpu_usage_cores": r["cpu_usage_cores"], "cpu_num_cores": r["cpu_num_cores"],
            "mem_current": r["mem_current"], "mem_limit": r["mem_limit"], BEHAVIOUR: r.get(BEHAVIOUR),
            "model_id": live.model_id, "source_file": r.get("source_file"), "ingested_at": r.get("ingested_at"),
        })
    return out


def _decode_forward(h: np.ndarray, st: dict[str, Any], live: Live) -> tuple[np.ndarray, np.ndarray]:
    """Phases and distances of the batch's labelled steps (in time order) by the forward decoder, resumed from
    the state's costs and current phase when they belong to this model (a new model starts afresh, as the
    label stage relabels every step with it); the state then holds the costs after the last step."""
    d2, costs = step_costs(np.asarray(live.model.centers, dtype=np.float64), live.model.classifier, h)
    same = st.get("decode_model") == live.model_id and st.get("decode_costs") is not None
    acc = np.asarray(st["decode_costs"], dtype=np.float64) if same else None
    path, acc, _ = forward_decode(costs, live.switch_penalty, acc, st["run_phase"] if same else None)
    st["decode_costs"], st["decode_model"] = [float(v) for v in acc], live.model_id
    return path, chosen_distances(d2, path)


def _recommend(pod_id: str, st: Mapping[str, Any], live: Live, policies: LivePolicies) -> dict[str, Any]:
    alloc = policies.next_allocation()
    phase = st["run_phase"]
    nxt = live.service_next_phase.get(str(st["service"]), live.next_phase).get(int(phase)) if phase is not None else None
    return {
        "kind": "rec", POD_ID: pod_id, SERVICE: st["service"], TS: _timestamp(st["last_ts"]), "step": int(st["last_step"]),
        "phase": phase, "phase_name": live.name(phase),
        "phase_since_ts": None if st["run_since_ts"] is None else _timestamp(st["run_since_ts"]),
        "phase_since_step": st["run_since_step"],
        "next_phase": None if nxt is None else nxt[0], "next_phase_probability": None if nxt is None else nxt[1],
        "cpu_policy": live.deployment.policies["cpu"], "mem_policy": live.deployment.policies["mem"],
        "for_step": int(alloc["step"]), "interval": int(alloc["interval"]),
        "cpu_cores": _finite(alloc["cpu"]), "mem_bytes": _finite(alloc["mem"]),
        "cpu_num_cores": _finite(alloc["cpu_limit"]), "mem_limit": _finite(alloc["mem_limit"]),
        "model_id": live.model_id, "policy_model_id": live.deployment.model_id, "late_samples": int(st["late_samples"]),
    }


def _timestamp(seconds: float) -> pd.Timestamp:
    return pd.Timestamp(0) + pd.to_timedelta(round(float(seconds) * 1e6), unit="us")


def _finite(v: float) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


__all__ = ["LATE_REASON", "Live", "advance", "epoch_seconds", "new_state", "state_from_tuple", "state_to_tuple"]
