"""Where the live recommendations go: Kubernetes objects built from ``gold/recommendations`` rows.

Two shapes (``ai4dl recommendations --format ...``):

``vpa``
    one ``VerticalPodAutoscaler`` (``autoscaling.k8s.io/v1``) per container, ``updateMode: "Off"`` (the
    recommendation is published, nothing is evicted), with the allocation as ``status.recommendation``'s
    ``target`` (and ``uncappedTarget``) of the container: what the VPA recommender itself would write there, so
    a dashboard or an admission controller that reads VPA status reads ai4dl's instead. The phase, the next
    phase and the model go into annotations.
``patch``
    a strategic-merge patch of the workload's pod template setting the container's resource requests (and
    the CPU/memory limits kept), for ``kubectl patch --type strategic``.

The objects are built from the Kubernetes Python client's models (``V1ObjectMeta``,
``V1CrossVersionObjectReference``, ``V1ResourceRequirements``, ``V1Container``, ``V1PodTemplateSpec``), which
check required fields, and every quantity is parsed back with ``kubernetes.utils.parse_quantity``: a malformed
object fails here, not at ``kubectl apply``. The VPA is a custom resource without a model in the client: its
metadata, target reference and quantities are validated through those models, its layout is VPA v1's. No
cluster is contacted.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping

VPA_API = "autoscaling.k8s.io/v1"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def k8s_name(value: str) -> str:
    """A DNS-1123 label (lowercase alphanumerics and '-', at most 63 characters) from a container or service id.

    >>> k8s_name("Exec_1.Train")
    'exec-1-train'
    """
    name = re.sub(r"[^a-z0-9-]+", "-", str(value).lower()).strip("-")[:63].strip("-")
    if not name or not _DNS_LABEL.match(name):
        raise ValueError(f"cannot make a Kubernetes name of {value!r}")
    return name


def cpu_quantity(cores: float) -> str:
    """Cores as millicores, rounded up (never below the allocation).

    >>> cpu_quantity(1.3111), cpu_quantity(0.0)
    ('1312m', '0')
    """
    milli = int(math.ceil(round(float(cores) * 1000.0, 6)))
    return "0" if milli == 0 else f"{milli}m"


def memory_quantity(value: float) -> str:
    """Bytes, rounded up to a whole byte.

    >>> memory_quantity(1168723595.2)
    '1168723596'
    """
    return str(int(math.ceil(float(value))))


def _resources(rec: Mapping[str, Any]) -> dict[str, str]:
    from kubernetes.utils import parse_quantity

    out = {}
    if _known(rec.get("cpu_cores")):
        out["cpu"] = cpu_quantity(rec["cpu_cores"])
    if _known(rec.get("mem_bytes")):
        out["memory"] = memory_quantity(rec["mem_bytes"])
    for q in out.values():
        parse_quantity(q)  # raises ValueError on a malformed quantity
    return out


def _known(v: Any) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _annotations(rec: Mapping[str, Any]) -> dict[str, str]:
    keys = ("phase", "phase_name", "phase_since_ts", "next_phase", "next_phase_probability", "policy", "model_id",
            "step", "ts")
    return {f"ai4dl.io/{k.replace('_', '-')}": str(rec[k]) for k in keys if rec.get(k) is not None and str(rec[k]) != "nan"}


def vpa_object(rec: Mapping[str, Any], target_kind: str = "Job", target_api_version: str = "batch/v1",
               namespace: str | None = None, container: str | None = None) -> dict[str, Any]:
    """A ``VerticalPodAutoscaler`` of one recommendation row (``pod_id`` names the workload, ``service`` the
    container unless ``container`` is given), as a plain dict ready for YAML."""
    from kubernetes import client

    api = client.ApiClient()
    name = k8s_name(rec["pod_id"])
    meta = client.V1ObjectMeta(name=name, namespace=namespace, labels={"app.kubernetes.io/managed-by": "ai4dl"},
                               annotations=_annotations(rec))
    target = client.V1CrossVersionObjectReference(api_version=target_api_version, kind=target_kind, name=name)
    resources = _resources(rec)
    container_name = k8s_name(container or rec.get("service") or "main")
    return {
        "apiVersion": VPA_API,
        "kind": "VerticalPodAutoscaler",
        "metadata": api.sanitize_for_serialization(meta),
        "spec": {
            "targetRef": api.sanitize_for_serialization(target),
            "updatePolicy": {"updateMode": "Off"},
            "resourcePolicy": {"containerPolicies": [{"containerName": container_name,
                                                      "controlledResources": sorted(resources)}]},
        },
        "status": {
            "recommendation": {"containerRecommendations": [
                {"containerName": container_name, "target": resources, "uncappedTarget": dict(resources)},
            ]},
            "conditions": [{"type": "RecommendationProvided", "status": "True",
                            "lastTransitionTime": _rfc3339(rec.get("updated_at"))}],
        },
    }


def resources_patch(rec: Mapping[str, Any], container: str | None = None) -> dict[str, Any]:
    """A strategic-merge patch of a workload's pod template: the container's requests set to the
    recommendation, its limits to the container's limits (``cpu_num_cores`` / ``mem_limit``) when known."""
    from kubernetes import client

    api = client.ApiClient()
    limits = _resources({"cpu_cores": rec.get("cpu_num_cores"), "mem_bytes": rec.get("mem_limit")})
    requirements = client.V1ResourceRequirements(requests=_resources(rec), limits=limits or None)
    c = client.V1Container(name=k8s_name(container or rec.get("service") or "main"), resources=requirements)
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(annotations=_annotations(rec)), spec=client.V1PodSpec(containers=[c]))
    return {"spec": {"template": api.sanitize_for_serialization(template)}}


def _rfc3339(ts: Any) -> str | None:
    if ts is None or str(ts) in ("NaT", "nan", "None"):
        return None
    import pandas as pd

    return pd.Timestamp(ts).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_back(obj: Any, klass: str) -> Any:
    """``obj`` (a plain dict) deserialized into the client's model ``klass`` (e.g. ``"V1PodTemplateSpec"``), as
    the client reads an API server's answer: the check that a written object is one the API accepts the shape
    of. Works with the client's two ``deserialize`` signatures (a response object before v35, text after)."""
    import inspect
    import json

    from kubernetes import client

    api = client.ApiClient()
    text = json.dumps(obj)
    if "content_type" in inspect.signature(api.deserialize).parameters:
        return api.deserialize(text, klass, "application/json")

    class _Response:  # older clients read a response's .data
        data = text

    return api.deserialize(_Response(), klass)


def render(records: Iterable[Mapping[str, Any]], fmt: str = "vpa", **options: Any) -> str:
    """The objects of ``records`` as one multi-document YAML text (``fmt``: ``vpa`` or ``patch``)."""
    import yaml

    build = {"vpa": vpa_object, "patch": resources_patch}[fmt]
    if fmt == "patch":
        options = {k: v for k, v in options.items() if k == "container"}
    docs = [build(r, **options) for r in records]
    for doc in docs:  # read back through the client's models before anything is written
        if fmt == "vpa":
            read_back(doc["metadata"], "V1ObjectMeta")
            read_back(doc["spec"]["targetRef"], "V1CrossVersionObjectReference")
        else:
            read_back(doc["spec"]["template"], "V1PodTemplateSpec")
    return yaml.safe_dump_all(docs, sort_keys=False)


__all__ = ["cpu_quantity", "k8s_name", "memory_quantity", "read_back", "render", "resources_patch", "vpa_object"]
