"""`rlrig doctor`: what this node found out, as text or one JSON object, also when a stage failed."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from .bootstrap import Inspection
from .cluster import ports, raystart
from .detect.nodespec import NodeSpec
from .fabric import report
from .preflight import resources


def fabric_check(env: Mapping[str, str]) -> dict | None:
    """Inside a command rlrig runs on several nodes (RLRIG_FABRIC_REPORT): the fabric check's verdict and seconds;
    None elsewhere."""
    try:
        with open(env.get("RLRIG_FABRIC_REPORT") or os.devnull) as f:
            return report.brief(json.load(f))
    except (OSError, ValueError):
        return None


def gcs_port(spec: NodeSpec) -> int | None:
    """The head's GCS port as `rlrig run`/`train` would take it (cluster/ports.py): the one given, the one derived
    from the job's identity on several nodes; None on a single node, which takes a free one when it starts."""
    if spec.port_given:
        return spec.port
    if spec.nnodes > 1:
        return ports.derived_head_ports(ports.identity_key(spec.launcher, spec.job_id, spec.head_host))["gcs"]
    return None


def as_dict(found: Inspection, env: Mapping[str, str] = os.environ) -> dict:
    """The same keys whatever failed; what could not be found out is null."""
    s, pf = found.spec, found.preflight
    return {
        "launcher": found.launcher,
        "node_rank": s.node_rank if s else None,
        "nnodes": s.nnodes if s else None,
        "head_host": s.head_host if s else None,  # as the launcher gave it, resolved or not
        "head_address": (s.head_address or None) if s else None,
        "port": gcs_port(s) if s else None,  # None: a free port, chosen when the run starts
        "node_ip": (s.node_ip or None) if s else None,
        "interface": (s.interface or None) if s else None,
        "num_gpus": pf.num_gpus if found.checked else None,
        "num_cpus": pf.num_cpus if found.checked else None,
        # what `ray start` gets: --num-cpus, --num-gpus, --resources (RLRIG_RESOURCES), --labels
        "resources": {"CPU": pf.num_cpus, "GPU": pf.num_gpus, **pf.custom_resources} if found.checked else None,
        "labels": raystart.node_labels(s, pf) if found.checked else None,
        "job_id": s.job_id if s else None,
        "existing_ray": (s.existing_ray or None) if s else None,
        "sources": dict(s.sources) if s else {},
        "env_updates": pf.env_updates,
        "checks": [c.to_dict() for c in pf.checks],
        # only count in `ray start`'s environment (Ray workers read them when they start): shown per node
        "before_ray_start": found.before_ray,
        "fabric_check": fabric_check(env),
    }


def as_text(found: Inspection) -> str:
    d = as_dict(found)

    def show(v) -> str:
        return "?" if v is None else str(v)

    lines = [
        f"launcher   {show(d['launcher'])}",
        f"node rank  {show(d['node_rank'])} of {show(d['nnodes'])}",
        f"head       {show(d['head_host'])} -> {show(d['head_address'])}"
        + (f":{d['port']}" if d["port"] is not None else " (its GCS on a free port, chosen at start)"),
        f"node ip    {show(d['node_ip'])} ({show(d['interface'])})",
        f"gpus       {show(d['num_gpus'])}",
        f"cpus       {show(d['num_cpus'])}",
        f"resources  {resources.summary(d['resources']) if d['resources'] else '?'}",
        f"labels     {' '.join(f'{k}={v}' for k, v in d['labels'].items()) if d['labels'] else '?'}",
    ]
    if d["job_id"]:
        lines.append(f"job        {d['job_id']}")
    if d["existing_ray"]:
        lines.append(f"ray        {d['existing_ray']} (already running: rlrig starts none)")
    if d["fabric_check"]:
        fc = d["fabric_check"]
        took = f" in {fc['seconds']:.1f}s" if fc["seconds"] is not None else ""
        phases = ", ".join(f"{k} {v:.1f}s" for k, v in (fc["phases_s"] or {}).items())
        lines.append(f"fabric     {fc['verdict']}{took}" + (f" ({phases})" if phases else ""))
    lines += [f"[{c['status']:4}] {c['name']}: {c['message']}" for c in d["checks"]]
    if d["before_ray_start"]:
        lines.append("before Ray starts (Ray workers on this node inherit these; set them before `rlrig up/run`):")
        lines += [f"  {k}={v}" for k, v in d["before_ray_start"].items()]
    return "\n".join(lines)


def render(found: Inspection, as_json: bool) -> str:
    return json.dumps(as_dict(found)) if as_json else as_text(found)


def exit_code(found: Inspection) -> int:
    return 1 if found.preflight.failed else 0
