"""SGLang over k workers (rollout.tensor_model_parallel_size > 1). SGLang needs CUDA, so the engine is a stand-in
that records what it is given; the workers are real processes in a real Gloo group, and the grouping, the GPU
lists, who starts and who asks the engine, and how the weights' handles travel are rlrig's own code."""

import json
import subprocess
import sys
import textwrap

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.rollout import tp_groups as T
from rlrig.trainer.rollout.engines.sglang_engine import tp_engine_kwargs

A, B = "node-a", "node-b"


@pytest.mark.parametrize(
    "members, me, expected",
    [
        # one node: the members' GPUs, sorted, each once; only the group's first starts the engine
        ([(A, "2"), (A, "0"), (A, "3"), (A, "1")], 0, T.NodeLayout(1, 0, "0,1,2,3", True)),
        ([(A, "2"), (A, "0"), (A, "3"), (A, "1")], 3, T.NodeLayout(1, 0, "0,1,2,3", False)),
        # the seed's layout, 2 nodes x 2 GPUs: per node "0,1", never the joined "0,1,0,1"
        ([(A, "0"), (A, "1"), (B, "0"), (B, "1")], 2, T.NodeLayout(2, 1, "0,1", True)),
        ([(A, "0"), (A, "1"), (B, "1"), (B, "0")], 3, T.NodeLayout(2, 1, "0,1", False)),
        ([(A, "6"), (A, "7"), (B, "0"), (B, "1")], 0, T.NodeLayout(2, 0, "6,7", True)),
        ([(A, "9"), (A, "10")], 1, T.NodeLayout(1, 0, "9,10", False)),  # numeric order
    ],
)
def test_node_layout(members, me, expected):
    assert T.node_layout(members, me) == expected


@pytest.mark.parametrize(
    "members, words",
    [
        (
            [(A, "0"), (A, "1"), (A, "2"), (B, "0")],
            "the same number of GPUs on each of its nodes, not node-a: 3, node-b: 1",
        ),
        ([(A, "0"), (A, "0")], "see the same GPU (0,0)"),
    ],
)
def test_node_layout_refusals(members, words):
    with pytest.raises(ValueError) as e:
        T.node_layout(members, 0)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_groups_and_handles():
    assert T.groups(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert T.transpose([[("a", b"a0"), ("b", b"b0")], [("a", b"a1"), ("b", b"b1")]]) == [
        ("a", [b"a0", b"a1"]),
        ("b", [b"b0", b"b1"]),
    ]
    with pytest.raises(RuntimeError, match="different tensors"):
        T.transpose([[("a", b"a0")], [("b", b"b1")]])


@pytest.mark.parametrize(
    "nnodes, rank, expected",
    [
        (1, 0, {"tp_size": 4, "nnodes": 1, "node_rank": 0, "base_gpu_id": 0, "port": 30000}),
        (
            2,
            6,
            {
                "tp_size": 4,
                "nnodes": 2,
                "node_rank": 1,
                "base_gpu_id": 0,
                "port": 30048,
                "dist_init_addr": "10.0.0.1:5000",
            },
        ),
    ],
)
def test_engine_arguments_of_a_spanning_engine(nnodes, rank, expected):
    assert tp_engine_kwargs(T.NodeLayout(nnodes, nnodes - 1, "0,1", True), 4, "10.0.0.1:5000", rank) == expected


def test_sglang_tensor_parallelism_is_accepted_where_it_divides_the_workers():
    cfg = parse_overrides(
        [
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=2",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        ]
    )
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=3"):
        parse_overrides(
            [
                "actor_rollout_ref.rollout.name=sglang",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=3",
                "trainer.n_gpus_per_node=4",
            ]
        )


FAKE = {
    # SGLang 0.5.23's shapes: weights only inside a begin/end session, every answer a (success, message)
    "sglang/__init__.py": """
        import json, os, pickle
        from types import SimpleNamespace
        OUT = os.environ["FAKE_OUT"]
        __version__ = "0.5.23"
        class Engine:
            def __init__(self, **kw):
                self.kw = kw
                self.log = {"kw": kw, "devices": os.environ["CUDA_VISIBLE_DEVICES"],
                            "asked": [], "weights": {}, "calls": []}
                self._save()
            def _save(self):
                with open(f"{OUT}/engine-{os.environ['FAKE_RANK']}.json", "w") as f:
                    json.dump(self.log, f)
            def generate(self, input_ids, return_logprob, sampling_params):
                self.log["asked"].append(input_ids)
                self._save()
                # the last prompt token, then EOS (id 2 in the tiny tokenizer)
                return [{"output_ids": [p[-1], 2],
                         "meta_info": {"output_token_logprobs": [(-0.5, p[-1], None), (-0.1, 2, None)]}}
                        for p in input_ids]
            session = False
            def begin_weight_update(self, selector="all"):
                self.log["calls"].append("begin")
                self.session = True
                return True, "Success"
            def end_weight_update(self):
                self.log["calls"].append("end")
                self.session = False
                self._save()
                return True, "Success"
            def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
                if not self.session:
                    return False, "update_weights_from_tensor must run between begin_weight_update() and ..."
                if self.log["weights"]:  # the second sync: refused, as SGLang answers a tensor it cannot load
                    return False, "Parameter w not found"
                for name, local in named_tensors:
                    self.log["weights"][name] = [pickle.loads(v).tolist() for v in local.values]
                self._save()
                return True, "Success"
            def release_memory_occupation(self, tags=None):
                self.log["calls"].append("release " + ",".join(tags))
            def resume_memory_occupation(self, tags=None):
                self.log["calls"].append("resume " + ",".join(tags))
            def flush_cache(self):
                self.log["calls"].append("flush")
                self._save()
                return SimpleNamespace(success=True, message="")
        """,
    "sglang/srt/__init__.py": "",
    "sglang/srt/utils/__init__.py": """
        import pickle
        class MultiprocessingSerializer:
            serialize = staticmethod(pickle.dumps)
        """,
    "sglang/srt/utils/patch_torch.py": "def monkey_patch_torch_reductions():\n    pass\n",
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/model_executor/model_runner_components/__init__.py": "",
    "sglang/srt/model_executor/model_runner_components/weight_updater.py": """
        from dataclasses import dataclass
        @dataclass
        class LocalSerializedTensor:
            values: list
        """,
}

WORKER = """
import json, os, sys
import torch, torch.distributed as dist
rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ.update(FAKE_RANK=str(rank), FAKE_OUT=out, CUDA_VISIBLE_DEVICES=["1", "0", "0", "1"][rank])
from rlrig.trainer.config.schema import RolloutConfig
from rlrig.trainer.rollout import tp_groups
from rlrig.trainer.rollout.engines import sglang_engine
from rlrig.trainer.rollout.engines.base import EngineContext
from rlrig.trainer.embedded.tiny_model import build_tokenizer
# after the imports: torch.distributed.fsdp imported after the group exists keeps it alive past destroy
dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
node = "node-a" if rank < 2 else "node-b"
tp_groups.where = lambda: (node, "10.0.0.%d" % (1 if rank < 2 else 2))
tok = build_tokenizer()
cfg = RolloutConfig(name="sglang", tensor_model_parallel_size=4)
eng = sglang_engine.SGLangRollout(EngineContext(None, tok, cfg, 8, 4, "/m", "cuda", 7))
prompts = [[10 + rank, 20 + rank], [30 + rank]]
ro = eng.generate(prompts, 2, sync_follows=True)
eng.sync_weights([("w", torch.full((2,), rank + 1.0)), ("v", torch.tensor([float(rank)]))])
try:
    eng.sync_weights([("w", torch.full((2,), rank + 1.0)), ("v", torch.tensor([float(rank)]))])
    refused = None
except RuntimeError as e:
    refused = str(e)
resp = [[int(t) for t, m in zip(r, mk) if m]
        for r, mk in zip(ro.input_ids[:, ro.prompt_len:].tolist(), ro.response_mask.tolist())]
print(json.dumps({"responses": resp, "describe": eng.describe(), "refused": refused}), flush=True)
dist.destroy_process_group()  # Gloo's threads joined before exit (else C++ may abort the process as it ends)
"""


def test_four_workers_on_two_nodes_drive_one_engine(tmp_path):
    for path, text in FAKE.items():
        f = tmp_path / "fake" / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(text))
    (tmp_path / "worker.py").write_text(WORKER)
    env = {"PYTHONPATH": str(tmp_path / "fake"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(tmp_path / "worker.py"),
                str(r),
                "4",
                str(tmp_path / "init"),
                str(tmp_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    results = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    # one SGLang engine per node, started by the node's first worker with that node's GPUs
    assert sorted(f.name for f in tmp_path.glob("engine-*.json")) == ["engine-0.json", "engine-2.json"]
    e0, e2 = (json.loads((tmp_path / f"engine-{r}.json").read_text()) for r in (0, 2))
    assert e0["devices"] == e2["devices"] == "0,1"
    assert (e0["kw"]["tp_size"], e0["kw"]["nnodes"], e0["kw"]["node_rank"], e2["kw"]["node_rank"]) == (4, 2, 0, 1)
    assert e0["kw"]["dist_init_addr"] == e2["kw"]["dist_init_addr"] and e0["kw"]["dist_init_addr"].startswith(
        "10.0.0.1:"
    )
    # the lead asked once for every worker's prompts, each twice (n=2); node b's engine was never asked
    assert len(e0["asked"]) == 1 and not e2["asked"]
    assert e0["asked"][0] == [p for r in range(4) for p in ([10 + r, 20 + r], [10 + r, 20 + r], [30 + r], [30 + r])]
    for r, res in enumerate(results):
        assert res["responses"] == [[20 + r, 2], [20 + r, 2], [30 + r, 2], [30 + r, 2]], (r, res)  # its own share
        assert res["describe"] == "sglang, tensor parallel over 4 workers"
    # TP rank i opens worker i's handle of each tensor
    assert e0["weights"] == {"w": [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]], "v": [[0.0], [1.0], [2.0], [3.0]]}
    # the weights were released with the KV cache (a sync followed) and came back for the sync
    assert e0["calls"][:5] == ["release kv_cache,weights", "resume weights", "begin", "end", "flush"]
    # the second sync, refused by the engine: its session closed, no flush, and every worker raised the lead's words
    assert e0["calls"][5:] == ["begin", "end"] and e2["calls"] == []
    assert {res["refused"] for res in results} == {
        "the weight sync into the engine (sglang, tensor parallel over 4 workers) failed: update_weights_from_tensor "
        "of bucket 0 (2 tensors, w .. v): SGLang said 'Parameter w not found'"
    }


def test_sglangs_routed_experts_are_decoded_from_its_base64_into_tokens_layers_and_k():
    """With the tokenizer skipped SGLang's tokenizer manager sends each output's routed experts as base64 of a flat
    int32 array (0.5.16 to 0.5.23), which verl decodes with SGLang's extract_routed_experts_from_meta_info."""
    import base64

    import numpy as np

    from rlrig.trainer.rollout.engines.sglang_engine import unpack

    experts = np.arange(5 * 3 * 2, dtype=np.int32).reshape(5, 3, 2) % 8  # 5 tokens, 3 layers, top-2
    meta = {"output_token_logprobs": [(-0.5, 7, None), (-1.0, 9, None)]}
    outs = [
        {"output_ids": [7, 9], "meta_info": {**meta, "routed_experts": base64.b64encode(experts.tobytes()).decode()}}
    ]
    tokens, logps, routed = unpack(outs, (3, 2))
    assert tokens == [[7, 9]] and logps == [[-0.5, -1.0]]
    np.testing.assert_array_equal(routed[0], experts)
    assert unpack(outs)[2] == [None]  # not asked for: not read
