"""Makes the custom-resource schemas the manifest tests read: each CRD's openAPIV3Schema with every pod template
(PodTemplateSpec, which the tests validate separately as a v1 PodTemplate against Kubernetes' own schema) cut out,
so a schema is kilobytes instead of the CRD's 1.3 MB. Sources (read from the repositories, not downloaded in tests):
  ray-project/kuberay feeaf72fa   ray-operator/config/crd/bases/ray.io_rayjobs.yaml            (ray.io/v1 RayJob)
  kubernetes-sigs/lws 060ab4d     config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml (v1 LeaderWorkerSet)
  kubeflow/trainer 289f17906      manifests/base/crds/kubeflow.org_pytorchjobs.yaml (release-1.9, kubeflow.org/v1 PyTorchJob)
  kubernetes-sigs/jobset f22e565ac config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml (v0.12.0, v1alpha2 JobSet)
  python prune_crds.py CRD.yaml... : writes <kind>.schema.json next to this file."""

import json
import sys
from pathlib import Path

import yaml

PRUNED = {"type": "object", "description": "a PodTemplateSpec: validated as a v1 PodTemplate by the tests"}


def is_pod_template(node: dict) -> bool:
    props = node.get("properties", {})
    return "spec" in props and "metadata" in props and "containers" in props["spec"].get("properties", {})


def prune(node):
    if isinstance(node, dict):
        if node.get("type") == "object" and is_pod_template(node):
            return dict(PRUNED)
        return {k: prune(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [prune(v) for v in node]
    return node


def main(paths: list[str]) -> None:
    for path in paths:
        crd = yaml.safe_load(Path(path).read_text())
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        schema = prune(version["schema"]["openAPIV3Schema"])
        schema["x-source"] = f"{crd['spec']['group']}/{version['name']} {crd['spec']['names']['kind']}"
        out = Path(__file__).parent / f"{crd['spec']['names']['kind']}.schema.json"
        out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
        print(out, out.stat().st_size)


if __name__ == "__main__":
    main(sys.argv[1:])
