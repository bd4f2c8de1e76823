"""`rlrig doctor`: what this node found out, as text or one JSON object, also when a stage failed."""

from __future__ import annotations

import json

from . import raystart, resources
from .bootstrap import Inspection


def as_dict(found: Inspection) -> dict:
    """The same keys whatever failed; what could not be found out is null."""
    s, pf = found.spec, found.preflight
    return {
        "launcher": found.launcher,
        "node_rank": s.node_rank if s else None,
        "nnodes": s.nnodes if s else None,
        "head_host": s.head_host if s else None,  # as the launcher gave it, resolved or not
        "head_address": (s.head_address or None) if s else None,
        "port": s.port if s else None,
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
    }


def as_text(found: Inspection) -> str:
    d = as_dict(found)

    def show(v) -> str:
        return "?" if v is None else str(v)

    lines = [
        f"launcher   {show(d['launcher'])}",
        f"node rank  {show(d['node_rank'])} of {show(d['nnodes'])}",
        f"head       {show(d['head_host'])} -> {show(d['head_address'])}:{show(d['port'])}",
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
    lines += [f"[{c['status']:4}] {c['name']}: {c['message']}" for c in d["checks"]]
    if d["before_ray_start"]:
        lines.append("before Ray starts (Ray workers on this node inherit these; set them before `rlrig up/run`):")
        lines += [f"  {k}={v}" for k, v in d["before_ray_start"].items()]
    return "\n".join(lines)


def render(found: Inspection, as_json: bool) -> str:
    return json.dumps(as_dict(found)) if as_json else as_text(found)


def exit_code(found: Inspection) -> int:
    return 1 if found.preflight.failed else 0
