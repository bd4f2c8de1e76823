"""kubernetes/: every built-in object validated by Kubernetes' own schema (kubernetes-validate, strict: unknown
fields refused), every custom resource by its CRD's schema (tests/unit/launch_files/k8s_schemas, pod templates cut
out) with unknown fields refused as `kubectl apply --validate=strict` does, each pod template as a v1 PodTemplate;
then the environment each pod's container gets (the manifest's plus what the controller injects, as read from the
controllers' sources) run through rlrig's launcher detection."""

import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from rlrig.entrypoint.detect.detection import detect

REPO = Path(__file__).resolve().parents[3]
SCHEMAS = Path(__file__).parent / "k8s_schemas"
K8S = kubernetes_validate.utils.latest_version()
MANIFESTS = sorted((REPO / "kubernetes").glob("*.yaml"))
BUILT_IN = {"Service", "Job", "Secret", "ConfigMap"}
GRACE = 120  # rlrig train's default --grace-period: the pod must outlive it after SIGTERM


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def strict(schema):
    """Unknown fields refused wherever the CRD lists its fields (the API server prunes them silently otherwise)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
        return schema
    return [strict(v) for v in schema] if isinstance(schema, list) else schema


def pod_templates(doc: dict) -> dict[str, dict]:
    """Each pod template of a document by its role, as the controllers name the pods."""
    spec = doc["spec"]
    if doc["kind"] == "Job":
        return {"job": spec["template"]}
    if doc["kind"] == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        return {"leader": lwt.get("leaderTemplate", lwt["workerTemplate"]), "worker": lwt["workerTemplate"]}
    if doc["kind"] == "PyTorchJob":
        return {role.lower(): r["template"] for role, r in spec["pytorchReplicaSpecs"].items()}
    if doc["kind"] == "JobSet":  # each replicated Job's pod template, by the replicated Job's name
        return {rjob["name"]: rjob["template"]["spec"]["template"] for rjob in spec["replicatedJobs"]}
    if doc["kind"] == "RayJob":
        cluster = spec["rayClusterSpec"]
        return {
            "head": cluster["headGroupSpec"]["template"],
            **{g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]},
        }
    return {}


ALL = [(p.name, i, d) for p in MANIFESTS for i, d in enumerate(documents(p))]


def test_every_launcher_kind_ships():
    kinds = {d["kind"] for _, _, d in ALL}
    assert {"LeaderWorkerSet", "Job", "JobSet", "PyTorchJob", "RayJob", "Service"} <= kinds, kinds


@pytest.mark.parametrize("name,index,doc", ALL, ids=[f"{n}:{d['kind']}" for n, _, d in ALL])
def test_schema(name, index, doc):
    if doc["kind"] in BUILT_IN:
        kubernetes_validate.validate(doc, K8S, strict=True)
    else:
        schema = json.loads((SCHEMAS / f"{doc['kind']}.schema.json").read_text())
        jsonschema.validate(doc, strict(schema))
        for template in pod_templates(doc).values():
            kubernetes_validate.validate(
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
                K8S,
                strict=True,
            )


def test_a_misspelt_field_is_caught():
    """The strictness above is real: an unknown field in a custom resource and in a pod template both fail."""
    doc = next(d for _, _, d in ALL if d["kind"] == "LeaderWorkerSet")
    bad = yaml.safe_load(yaml.safe_dump(doc))
    bad["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, strict(json.loads((SCHEMAS / "LeaderWorkerSet.schema.json").read_text())))
    template = yaml.safe_load(yaml.safe_dump(pod_templates(doc)["worker"]))
    template["spec"]["containers"][0]["envv"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
            K8S,
            strict=True,
        )


PODS = [(n, d["kind"], role, t) for n, _, d in ALL for role, t in pod_templates(d).items()]


@pytest.mark.parametrize("name,kind,role,template", PODS, ids=[f"{n}:{r}" for n, _, r, _ in PODS])
def test_every_pod_has_shm_a_grace_period_and_the_token(name, kind, role, template):
    spec = template["spec"]
    container = spec["containers"][0]
    shm = {m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"}
    assert [v for v in spec["volumes"] if v["name"] in shm and v["emptyDir"]["medium"] == "Memory"], "no /dev/shm"
    assert spec["terminationGracePeriodSeconds"] > GRACE
    if kind == "RayJob":  # KubeRay sets RAY_AUTH_TOKEN from authOptions.secretName itself
        return
    token = [e for e in container["env"] if e["name"] == "RLRIG_CLUSTER_TOKEN"]
    assert token and token[0]["valueFrom"]["secretKeyRef"] == {"name": "rlrig-cluster-token", "key": "auth_token"}
    assert {p["containerPort"] for p in container["ports"]} >= {6379, 8265}


def manifest(name: str, kind: str) -> dict:
    return next(d for n, _, d in ALL if n == name and d["kind"] == kind)


def container_env(template: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in template["spec"]["containers"][0].get("env", []) if "value" in e}


def injected(doc: dict, role: str, index: int) -> tuple[dict[str, str], str]:
    """What each controller adds to a pod (its variables, the pod's hostname), from their sources: the Job controller
    (JOB_COMPLETION_INDEX, hostname <job>-<index>), JobSet (no variables: its child Job <jobset>-<replicatedJob>-<job
    index>, from placement.GenJobName, is an Indexed Job whose pod `index` of Job 0 this is), LWS (pod_controller's
    env), Training Operator v1 (pytorch/envvar.go: Master rank 0, workers from 1), KubeRay (pod.go: RAY_CLUSTER_NAME,
    KUBERAY_GEN_RAY_START_CMD)."""
    name, spec = doc["metadata"]["name"], doc["spec"]
    if doc["kind"] == "Job":
        return {"JOB_COMPLETION_INDEX": str(index)}, f"{name}-{index}"
    if doc["kind"] == "JobSet":
        return {"JOB_COMPLETION_INDEX": str(index)}, f"{name}-{role}-0-{index}"
    if doc["kind"] == "LeaderWorkerSet":
        size = spec["leaderWorkerTemplate"]["size"]
        return (
            {
                "LWS_LEADER_ADDRESS": f"{name}-0.{name}.default",
                "LWS_GROUP_SIZE": str(size),
                "LWS_WORKER_INDEX": str(index),
            },
            f"{name}-0" + (f"-{index}" if index else ""),
        )
    if doc["kind"] == "PyTorchJob":
        replicas = sum(r["replicas"] for r in spec["pytorchReplicaSpecs"].values())
        rank = index + (1 if role == "worker" else 0)
        nproc = {"PET_NPROC_PER_NODE": spec["nprocPerNode"]} if "nprocPerNode" in spec else {}
        return (
            {
                "MASTER_ADDR": f"{name}-master-0",
                "MASTER_PORT": "23456",
                "WORLD_SIZE": str(replicas * int(spec.get("nprocPerNode", 1))),
                "RANK": str(rank),
                "PET_NODE_RANK": str(rank),
                "PET_NNODES": str(replicas),
                **nproc,
                "PYTHONUNBUFFERED": "1",
            },
            f"{name}-{role}-{index}",
        )
    return {
        "RAY_CLUSTER_NAME": f"{name}-raycluster",
        "KUBERAY_GEN_RAY_START_CMD": "ray start --head",
        "RAY_ADDRESS": "127.0.0.1:6379",
    }, f"{name}-head"


DETECTED = [
    # (file, kind, role, pod index, launcher, node rank, nodes, head host)
    ("indexed-job.yaml", "Job", "job", 0, "indexed-job", 0, 2, "rlrig-grpo-0.rlrig-grpo"),
    ("indexed-job.yaml", "Job", "job", 1, "indexed-job", 1, 2, "rlrig-grpo-0.rlrig-grpo"),
    # JobSet's pods are its child Job's: the Indexed Job launcher reads them
    ("jobset.yaml", "JobSet", "node", 0, "indexed-job", 0, 2, "rlrig-grpo-node-0-0.rlrig-grpo"),
    ("jobset.yaml", "JobSet", "node", 1, "indexed-job", 1, 2, "rlrig-grpo-node-0-0.rlrig-grpo"),
    ("leaderworkerset.yaml", "LeaderWorkerSet", "leader", 0, "lws", 0, 2, "rlrig-cluster-0.rlrig-cluster.default"),
    ("leaderworkerset.yaml", "LeaderWorkerSet", "worker", 1, "lws", 1, 2, "rlrig-cluster-0.rlrig-cluster.default"),
    ("pytorchjob.yaml", "PyTorchJob", "master", 0, "pytorchjob", 0, 2, "rlrig-grpo-master-0"),
    ("pytorchjob.yaml", "PyTorchJob", "worker", 0, "pytorchjob", 1, 2, "rlrig-grpo-master-0"),
    ("rayjob.yaml", "RayJob", "head", 0, "kuberay", 0, 1, "127.0.0.1"),  # the operator's Ray: rlrig starts none
]


@pytest.mark.parametrize(
    "name,kind,role,index,launcher,rank,nnodes,head", DETECTED, ids=[f"{r[0]}:{r[2]}{r[3]}" for r in DETECTED]
)
def test_the_environment_each_pod_gets_is_detected(name, kind, role, index, launcher, rank, nnodes, head):
    doc = manifest(name, kind)
    template = pod_templates(doc)[role]
    env, hostname = injected(doc, role, index)
    env = {**container_env(template), **env, "RLRIG_CLUSTER_TOKEN": "t" * 64}
    spec = detect(env, hostname=hostname)
    assert (spec.launcher, spec.node_rank, spec.nnodes, spec.head_host) == (launcher, rank, nnodes, head)
    assert bool(spec.existing_ray) == (launcher == "kuberay")
    args = template["spec"]["containers"][0].get("args", [])
    if args and args[0] == "train":
        assert f"trainer.nnodes={nnodes}" in args and spec.gpus_allotted in (None, 8)


def test_the_jobset_is_one_indexed_job_whose_pod_0_is_the_head():
    """rlrig's rank is the completion index, which each child Job counts from 0: one Job of RLRIG_NNODES pods, all
    running at once, and RLRIG_HEAD_ADDRESS the DNS name JobSet gives that Job's pod 0 (<pod hostname>.<subdomain>,
    the subdomain defaulting to the JobSet's name)."""
    doc = manifest("jobset.yaml", "JobSet")
    ((role, template),) = pod_templates(doc).items()
    (rjob,) = doc["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    env = container_env(template)
    assert rjob.get("replicas", 1) == 1 and job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == int(env["RLRIG_NNODES"])
    network = doc["spec"].get("network", {})
    assert network.get("enableDNSHostnames", True) and network.get("publishNotReadyAddresses", True)
    subdomain = network.get("subdomain") or doc["metadata"]["name"]
    assert env["RLRIG_HEAD_ADDRESS"] == f"{injected(doc, role, 0)[1]}.{subdomain}"
