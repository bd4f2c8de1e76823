"""On a machine with an NVIDIA GPU: the trainer's CUDA path (NCCL process group, DDP and FSDP2 on the
device, padding-free forwards, transformers rollout) and the GPU preflight against the real NVML.

CI has no GPU, so there these skip. Which of them ran on a GPU: docs/what-was-run.md.

    python -m pytest -q tests/gpu
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from rlrig.trainer.workers.step.request import StepRequest

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


# verl's GPU runs set every pass's micro batch (rlrig refuses a GPU run without them, as verl does); a test's own
# overrides come after these
GPU_MICRO = [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
    "critic.ppo_micro_batch_size_per_gpu=8",
    # uncompiled, so that each case takes seconds, not a compile's minute; the compile case turns it back on
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
]


def run_worker(
    overrides: list[str],
    steps: int | None = None,
    device: str = "cuda",
    model_path: str | None = None,
    tf32: bool = True,
) -> list[dict]:
    """A one-rank job without Ray: the Worker the Ray actors run, on cuda:0 with NCCL (or on the CPU
    with Gloo, to try this helper where there is no GPU). The GPU's peak-memory counter starts from what
    this run holds (perf/max_memory_allocated_gb is, as in verl, the process's peak since the last reset).
    tf32=False: what stays fp32 is computed in fp32 (the worker allows TF32 for it)."""
    if device == "cuda":
        gc.collect()  # a previous run's modules sit in reference cycles (DDP, FSDP)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    with single_worker(
        [
            *EMBEDDED,
            f"trainer.device={device}",
            *(GPU_MICRO if device == "cuda" else []),
            "actor_rollout_ref.rollout.name=hf",
            *overrides,
        ],
        model_path,
    ) as (w, batches):
        assert w.device.type == device and next(w.models.actor.module.parameters()).device.type == device
        assert torch.distributed.get_backend() == ("nccl" if device == "cuda" else "gloo")
        if not tf32:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        steps = steps or w.cfg.trainer.total_training_steps
        rows, t0 = [], time.perf_counter()
        for s in range(steps):
            rows.append(w.step(StepRequest(next(batches), global_step=s + 1, kl_coef=w.cfg.algorithm.kl_ctrl.kl_coef)))
            if (s + 1) % 25 == 0:  # where a run stopped by a time limit got to (pytest -s)
                print(f"step {s + 1}/{steps}: {time.perf_counter() - t0:.1f} s", flush=True)
        return rows


def test_fsdp_packed_and_grouped_forwards_match_ddp_on_cuda():
    """In fp32 (mixed precision off) the four ways of computing a step agree closely; in bf16 FSDP's
    policy and DDP's autocast round differently by design."""
    keys = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "response_length/mean")
    fp32 = [
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.ref.fsdp_config.model_dtype=fp32",
    ]
    runs = {
        name: run_worker([*fp32, *extra], steps=2, tf32=False)
        for name, extra in {
            "ddp": ["actor_rollout_ref.actor.strategy=ddp"],
            "fsdp": ["actor_rollout_ref.actor.strategy=fsdp"],
            "packed": ["actor_rollout_ref.actor.strategy=ddp", "actor_rollout_ref.model.use_remove_padding=True"],
            "grouped": [
                "actor_rollout_ref.actor.strategy=fsdp",
                "actor_rollout_ref.actor.use_prefix_grouper=True",
                "actor_rollout_ref.model.enable_gradient_checkpointing=True",
            ],
        }.items()
    }
    for other in ("fsdp", "packed", "grouped"):
        for a, b in zip(runs["ddp"], runs[other]):
            # GPU kernels differ by reduction order (sdpa picks kernels by mask), hence looser than on CPU
            assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-3, abs=1e-4), other


def test_embedded_default_learns_on_cuda():
    """The embedded default's own criterion (mean score of the last 10% of its steps >= the first 10%
    + 0.15), its 200 steps on one GPU."""
    rows = run_worker(["actor_rollout_ref.model.use_remove_padding=True"])
    scores = [r["critic/score/mean"] for r in rows]
    tenth = len(scores) // 10
    first, last = sum(scores[:tenth]) / tenth, sum(scores[-tenth:]) / tenth
    print(f"embedded on cuda: score {first:.3f} -> {last:.3f}")
    assert last >= first + 0.15, scores


def doctor(env_updates: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLRIG_", "SLURM_", "CUDA_VISIBLE"))}
    env.update(env_updates)
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "doctor", "--json"], capture_output=True, text=True, env=env
    )
    return {"rc": r.returncode, **json.loads(r.stdout)}


def test_preflight_reads_real_gpus_through_nvml():
    from rlrig.entrypoint.preflight.inventory import probe_nvidia

    gpus, probe, driver = probe_nvidia()
    # NVML sees the node's GPUs whatever CUDA_VISIBLE_DEVICES hides from torch
    assert probe == "NVML" and len(gpus) >= torch.cuda.device_count() >= 1 and driver
    fine_driver = [c for c in doctor({})["checks"] if c["name"] == "NVIDIA driver"]
    assert fine_driver and fine_driver[0]["status"] == "pass", fine_driver
    fine = doctor({})
    assert fine["rc"] == 0 and fine["num_gpus"] == len(gpus), fine
    by_uuid = doctor({"CUDA_VISIBLE_DEVICES": gpus[0].uuid})
    assert by_uuid["rc"] == 0 and by_uuid["num_gpus"] == 1, by_uuid
    for bad in ("0,0", str(len(gpus)), "GPU-00000000-0000-0000-0000-000000000000", "first"):
        r = doctor({"CUDA_VISIBLE_DEVICES": bad})
        failed = [c for c in r["checks"] if c["status"] == "fail"]
        assert r["rc"] != 0 and failed and failed[0]["name"] == "CUDA_VISIBLE_DEVICES", (bad, r)


def test_fabric_gpu_health_reads_real_nvml_and_counts_memory_another_process_holds():
    """The fabric check's readings on a real GPU: every query answers (or says it is unsupported), a healthy lent GPU
    passes, and memory this process holds shows as held by another process to a reader in a fresh process."""
    from rlrig.entrypoint.preflight import gpu_health

    gpus, library = gpu_health.read_gpus()
    assert library == "NVML" and len(gpus) >= torch.cuda.device_count() >= 1 and not gpus[0].get("error")
    g = gpus[0]
    assert g["memory_total"] and g["memory_used"] is not None and g["pcie_max_gen"] and g["slowdowns"] is not None, g
    fails, _ = gpu_health.problems(g)
    assert fails == [], fails
    held = torch.empty(int(g["memory_total"] * 0.8), dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json; from rlrig.entrypoint.preflight import gpu_health as h; "
            "g = h.read_gpus()[0][0]; print(json.dumps(h.problems(g)))",
        ],
        capture_output=True,
        text=True,
    )
    del held
    fails, _ = json.loads(r.stdout)
    assert any("held by other processes (a leftover job?)" in f for f in fails), (fails, r.stderr)


def _linear_dtypes(w, phase_fn, module=None) -> set:
    seen = set()
    # the first layer's down projection (the actor's unless `module` is given), also under peft's wrapping (LoRA)
    module = w.models.actor.module if module is None else module
    lin = next(mod for name, mod in module.named_modules() if name.endswith("layers.0.mlp.down_proj"))
    h = lin.register_forward_hook(lambda mod, inp, out: seen.add(out.dtype))
    try:
        phase_fn()
    finally:
        h.remove()
    return seen


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_bf16_mixed_precision_on_cuda(strategy):
    """verl's default on GPU: fp32 master weights and Adam state, bf16 matrix products; the reference holds fp32
    weights and computes in bf16, as verl's generated config (ref.fsdp_config.model_dtype fp32)."""
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    with single_worker(
        [
            *EMBEDDED,
            "trainer.device=cuda",
            *GPU_MICRO,
            "actor_rollout_ref.rollout.name=hf",
            f"actor_rollout_ref.actor.strategy={strategy}",
        ]
    ) as (w, batches):
        m = w.models
        assert all(p.dtype == torch.float32 for p in m.actor.module.parameters())
        assert all(p.dtype == torch.float32 for p in m.ref.parameters())
        assert m.ref_precision.param_dtype == torch.bfloat16
        if strategy == "fsdp":  # the full copy the hf engine generates with: in the compute dtype
            assert all(p.dtype == torch.bfloat16 for p in m.gen_module.parameters())
        out = {}
        ref_dtypes: set = set()
        step = lambda: out.update(w.step(StepRequest(next(batches), global_step=1, kl_coef=0.001)))  # noqa: E731
        dtypes = _linear_dtypes(w, lambda: ref_dtypes.update(_linear_dtypes(w, step, m.ref)))
        assert dtypes == {torch.bfloat16} and ref_dtypes == {torch.bfloat16}, (dtypes, ref_dtypes)
        assert all(v.dtype == torch.float32 for st in m.actor.opt.state.values() for k, v in st.items() if k != "step")
        assert out["actor/grad_norm"] > 0 and out["perf/max_memory_allocated_gb"] > 0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_lora_in_bf16_on_cuda_trains_adapters_only_with_less_optimizer_memory(strategy):
    """LoRA under verl's GPU defaults: fp32 adapters (bf16 products), the frozen base untouched, Adam state
    for the adapters alone, and the reference (adapters disabled) on the device with no second copy."""
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    with single_worker(
        [
            *EMBEDDED,
            "trainer.device=cuda",
            *GPU_MICRO,
            "actor_rollout_ref.rollout.name=hf",
            f"actor_rollout_ref.actor.strategy={strategy}",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.lora_alpha=16",
            "actor_rollout_ref.actor.optim.lr=1e-3",
        ]
    ) as (w, batches):
        m = w.models
        assert m.ref is None and m.ref_in_actor
        frozen = {n: p.detach().clone() for n, p in m.actor.module.named_parameters() if not p.requires_grad}
        dtypes = _linear_dtypes(
            w, lambda: [w.step(StepRequest(next(batches), global_step=s + 1, kl_coef=0.001)) for s in range(2)]
        )
        assert dtypes == {torch.bfloat16}, dtypes
        for n, p in m.actor.module.named_parameters():
            if not p.requires_grad:
                assert torch.equal(p.detach(), frozen[n]), n
        adam = sum(v.numel() for st in m.actor.opt.state.values() for k, v in st.items() if k != "step")
        trainable = sum(p.numel() for p in m.actor.module.parameters() if p.requires_grad)
        assert adam == 2 * trainable and 0 < trainable < sum(p.numel() for p in m.actor.module.parameters()) // 5


def _layer_calls(w, steps, batches) -> int:
    calls = [0]
    # the layer's first projection, which every recompute runs: hooks on the layer itself rerun under transformers 5.19
    # (vLLM 0.32's pin: it checkpoints the layer's __call__) but not under 5.2x (its forward), and the recompute stops
    # once the last saved tensor is rebuilt, inside the MLP, before the MLP's hook would fire
    h = w.models.actor.module.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda *a: calls.__setitem__(0, calls[0] + 1)
    )
    try:
        for s in range(steps):
            w.step(StepRequest(next(batches), global_step=s + 1, kl_coef=0.001))
    finally:
        h.remove()
    return calls[0]


def test_gradient_checkpointing_recomputes_in_the_update_on_cuda():
    """enable_gradient_checkpointing acts (training mode in the update): each update micro batch runs
    the layer's forward twice; generation and log-prob passes (eval mode) do not."""
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    calls = {}
    for flag in (False, True):
        with single_worker(
            [
                *EMBEDDED,
                "trainer.device=cuda",
                *GPU_MICRO,
                "actor_rollout_ref.rollout.name=hf",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
                f"actor_rollout_ref.model.enable_gradient_checkpointing={flag}",
                # eager blocks: a compiled block's recompute is the compiler's, which runs no Python hook
                "actor_rollout_ref.actor.use_torch_compile=False",
            ]
        ) as (w, batches):
            calls[flag] = _layer_calls(w, 1, batches)
    # 32 prompts x 8 samples, mini batch 16 x 8 = 128 rows, micro 32: 8 update micro batches recomputed
    assert calls[True] - calls[False] == 8, calls


@pytest.mark.parametrize(
    "checkpointing,shape,rows,cols",
    [
        # without checkpointing every block's activations are saved: a few wide blocks
        (False, (4096, 1024, 2816, 8, 16, 4, 2048), 16, 1024),
        # with it only the blocks' inputs are, which outweigh one block's recompute and the gradients in a deep,
        # narrow model (48 blocks of width 512, as a 7B's 32 of 4096 at a longer sequence)
        (True, (1024, 512, 1024, 48, 8, 2, 2048), 32, 2048),
    ],
)
def test_activation_offload_moves_what_the_update_saves_to_host_memory_on_cuda(checkpointing, shape, rows, cols):
    """model.enable_activation_offload under FSDP2 in bf16 (verl's multi-turn interaction example sets it with gradient
    checkpointing): a training forward and backward peaks lower on the GPU, with the same loss and gradient norm; then
    the worker's steps run as without it."""
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.embedded.synthetic import Shape, ensure_model
    from rlrig.trainer.model import parallel

    shape = Shape(*shape)
    path = ensure_model(shape)
    ids = torch.randint(0, shape.vocab_size, (rows, cols), generator=torch.Generator().manual_seed(0)).cuda()
    res = {}
    for offload in (False, True):
        gc.collect()
        torch.cuda.empty_cache()
        with single_worker(
            [
                *EMBEDDED,
                "trainer.device=cuda",
                *GPU_MICRO,
                "actor_rollout_ref.rollout.name=hf",
                "actor_rollout_ref.actor.strategy=fsdp",
                "actor_rollout_ref.model.path=" + path,
                f"actor_rollout_ref.model.enable_gradient_checkpointing={checkpointing}",
                f"actor_rollout_ref.model.enable_activation_offload={offload}",
            ],
            path,
        ) as (w, batches):
            t = w.models.actor
            assert (t.activation_offload is not None) == offload
            t.train.train()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            logits = t.train(input_ids=ids, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
            del logits
            loss.backward()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
            grad_norm = parallel.grad_norm(t.module, 1e9)
            t.opt.zero_grad(set_to_none=True)
            moved = t.activation_offload.moved_bytes if offload else 0
            steps = [w.step(StepRequest(next(batches), global_step=s + 1, kl_coef=0.001)) for s in range(2)]
        res[offload] = (peak, loss.item(), grad_norm, moved, steps)
    (plain, loss, gn, _, steps), (off, off_loss, off_gn, moved, off_steps) = res[False], res[True]
    print(
        f"activation offload, checkpointing={checkpointing}: peak above the model {plain:.2f} GB -> {off:.2f} GB, "
        f"{moved / 2**30:.2f} GB moved to host memory"
    )
    assert off_loss == pytest.approx(loss, rel=1e-3) and off_gn == pytest.approx(gn, rel=1e-2)
    inputs = shape.num_hidden_layers * ids.numel() * shape.hidden_size * 2  # every block's bf16 input
    assert moved >= inputs
    # without checkpointing every block's activations (several times its input) leave; with it, the blocks' inputs,
    # all held on the GPU at the start of the backward without offload
    assert off < (0.5 * plain if not checkpointing else plain - 0.3 * inputs / 2**30), (plain, off)
    keys = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss")
    assert [off_steps[0][k] for k in keys] == pytest.approx([steps[0][k] for k in keys], rel=1e-2, abs=1e-4)
    assert all(s["actor/grad_norm"] > 0 for s in off_steps)


def test_offload_keeps_optimizer_state_and_reference_in_host_memory_on_cuda():
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    keys = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm")
    res = {}
    for flag in (False, True):
        with single_worker(
            [
                *EMBEDDED,
                "trainer.device=cuda",
                *GPU_MICRO,
                "actor_rollout_ref.rollout.name=hf",
                f"actor_rollout_ref.actor.fsdp_config.optimizer_offload={flag}",
                f"actor_rollout_ref.ref.fsdp_config.param_offload={flag}",
            ]
        ) as (w, batches):
            res[flag] = [w.step(StepRequest(next(batches), global_step=s + 1, kl_coef=0.001)) for s in range(2)]
            m = w.models
            devices = {v.device.type for st in m.actor.opt.state.values() for k, v in st.items() if k != "step"}
            assert devices == ({"cpu"} if flag else {"cuda"}), devices
            assert {p.device.type for p in m.ref.parameters()} == ({"cpu"} if flag else {"cuda"})
    for a, b in zip(res[False], res[True]):  # where the state rests does not change the arithmetic
        assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-5, abs=1e-7)


def test_param_offload_keeps_fsdp_shards_in_host_memory_between_steps_on_cuda():
    """actor and critic param_offload under FSDP: on the GPU only for the phases that use them, same numbers."""
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    keys = ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss")
    res = {}
    for flag in (False, True):
        with single_worker(
            [
                *EMBEDDED,
                "trainer.device=cuda",
                *GPU_MICRO,
                "actor_rollout_ref.rollout.name=hf",
                "algorithm.adv_estimator=gae",
                "actor_rollout_ref.actor.strategy=fsdp",
                f"actor_rollout_ref.actor.fsdp_config.param_offload={flag}",
                f"critic.model.fsdp_config.param_offload={flag}",
            ]
        ) as (w, batches):
            res[flag] = [w.step(StepRequest(next(batches), global_step=s + 1, kl_coef=0.001)) for s in range(2)]
            for t in (w.models.actor, w.models.critic):
                assert {p.device.type for p in t.module.parameters()} == ({"cpu"} if flag else {"cuda"})
    for a, b in zip(res[False], res[True]):
        assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-5, abs=1e-7)


def test_micro_batched_passes_lower_peak_memory_with_a_large_vocabulary_on_cuda():
    """A 152k vocabulary: the logits are the largest tensors of a step; micro batches bound them."""
    from rlrig.trainer.embedded.synthetic import Shape, ensure_model

    path = ensure_model(Shape(151936, 128, 256, 2, 2, 2, 512))
    common = [
        "actor_rollout_ref.model.path=" + path,
        "data.max_response_length=64",
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.rollout.n=8",
    ]
    whole_batch = [  # each pass's 128 sequences at once
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=128",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=128",
    ]
    whole = run_worker([*common, *whole_batch], steps=1, model_path=path)[0]["perf/max_memory_allocated_gb"]
    micro = run_worker(
        [
            *common,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        ],
        steps=1,
        model_path=path,
    )[0]["perf/max_memory_allocated_gb"]
    print(
        f"peak GPU memory, 152k vocabulary, 128 sequences: whole batch {whole:.2f} GB, "
        f"micro batches of 8 {micro:.2f} GB"
    )
    assert micro < 0.6 * whole, (whole, micro)


def test_reward_model_scores_in_bf16_on_cuda_colocated_and_offloaded():
    """The embedded reward model in each training worker: held in bf16 on the GPU, or in host memory between
    scorings (param_offload), its graded scores the reward either way."""
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    rm = ["reward_model.enable=True", "reward_model.micro_batch_size_per_gpu=8"]
    for offload in (False, True):
        with single_worker(
            [
                *EMBEDDED,
                "trainer.device=cuda",
                *GPU_MICRO,
                "actor_rollout_ref.rollout.name=hf",
                *rm,
                f"reward_model.model.fsdp_config.param_offload={offload}",
            ]
        ) as (w, batches):
            m = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0))
            scorer_params = list(w.rm_scorer.model.parameters())
            assert {p.dtype for p in scorer_params} == {torch.bfloat16}
            assert {p.device.type for p in scorer_params} == {"cpu" if offload else "cuda"}
            assert m["critic/score/min"] < m["critic/score/max"] and not {
                m["critic/score/min"],
                m["critic/score/max"],
            } <= {0.0, 1.0}


def test_chunked_log_probs_and_entropy_peak_below_a_third_of_the_plain_formulas_on_cuda():
    """8192 response tokens of bf16 logits at a 152k vocabulary, forward and backward: the chunked pass keeps no
    fp32 copy of the logits; the plain formulas keep several."""
    from rlrig.trainer.model.chunked_logprobs import plain_logprobs_and_entropy, token_logprobs_and_entropy

    def peak(fn) -> int:
        logits = torch.randn(8192, 151936, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        targets = torch.randint(0, 151936, (8192,), device="cuda")
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        logp, ent = fn(logits, targets)
        (logp.sum() + 0.01 * ent.sum()).backward()
        torch.cuda.synchronize()
        out = torch.cuda.max_memory_allocated() - base
        del logits, targets, logp, ent
        gc.collect()
        torch.cuda.empty_cache()
        return out

    chunked = peak(lambda z, y: token_logprobs_and_entropy(z, y, True))
    full = peak(plain_logprobs_and_entropy)
    print(
        f"log-prob + entropy, 8192 x 152k, with backward: chunked {chunked / 2**30:.2f} GB, plain {full / 2**30:.2f} GB"
    )
    assert chunked < 0.35 * full, (chunked, full)


def test_vllm_on_cuda_drops_its_weights_only_before_a_sync_and_samples_the_synced_policy():
    """vLLM's sleep level 2 after a step's rollout (the sync overwrites the weights), level 1 after validation (the
    next rollout reuses them); the engine sits on the worker's own GPU and samples what the actor scores."""
    pytest.importorskip("vllm", reason="vLLM is not installed here: pip install 'rlrig[vllm]'")
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    overrides = [
        *EMBEDDED,
        "trainer.device=cuda",
        *GPU_MICRO,
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=False",  # verl's default: compiled, CUDA graphs
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
    ]
    with single_worker(overrides) as (w, batches):
        levels, sleep = [], w.engine.llm.sleep
        w.engine.llm.sleep = lambda level=1, **kw: levels.append(level) or sleep(level=level, **kw)
        first = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0))
        w.evaluate(next(batches))
        second = w.step(StepRequest(next(batches), global_step=2, kl_coef=0.0))
        assert levels == [2, 1, 2]
        assert torch.cuda.current_device() == 0
        # a bfloat16 engine against the actor's own scores: garbage weights would differ by ~0.5 on average
        assert first["training/rollout_probs_diff_mean"] < 0.02 and second["training/rollout_probs_diff_mean"] < 0.02


def test_tf32_is_the_trainers_after_an_engine_is_built_on_cuda():
    """An engine that sets the matmul precision in the training process (vLLM's GPU worker sets "highest") leaves
    TF32 on where the trainer allowed it: an fp32 product still runs on TF32, as far from the fp64 one as TF32 is."""
    from rlrig.trainer.config.schema import RolloutConfig
    from rlrig.trainer.model import precision
    from rlrig.trainer.rollout import engines

    class LikeVLLM(engines.RolloutEngine):
        name = "like-vllm"

        def __init__(self, ctx):
            torch.set_float32_matmul_precision("highest")

    a = torch.randn(2048, 2048, device="cuda")
    exact = (a.double() @ a.double()).float()

    def error() -> float:
        return ((a @ a) - exact).abs().max().item()

    try:
        torch.set_float32_matmul_precision("highest")
        ieee = error()
        precision.allow_tf32()
        engines.make_engine(LikeVLLM, engines.EngineContext(None, None, RolloutConfig(), 8, 4, "/m", "cuda", 0))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        tf32 = error()
        print(f"fp32 product's largest error against fp64: {ieee:.2e} in IEEE fp32, {tf32:.2e} after the engine")
        assert tf32 > 10 * ieee, (tf32, ieee)
    finally:
        torch.set_float32_matmul_precision("highest")


@pytest.mark.parametrize("side", ["send", "receive"])
def test_a_weight_syncs_seconds_include_its_transfer_on_cuda(side):
    """NCCL's Work.wait() does not block the host: a sync returns only once its transfers are done. One GPU holds
    a one-rank NCCL group, whose broadcast waits (on NCCL's stream) for the work queued before it: here a sleep
    kernel of about 0.5 s, so a sync that returned on queueing would take milliseconds."""
    import time

    from rlrig.entrypoint.cluster.ports import kernel_free_port
    from rlrig.trainer.rollout.weight_sync import SyncGroup, layout

    group = SyncGroup(("127.0.0.1", kernel_free_port()), 0, 1, torch.device("cuda", 0), 120)
    tensors = [("a", torch.ones(8, device="cuda")), ("big", torch.zeros(2**20, device="cuda"))]
    group.agree_layout(layout(tensors))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**7)
    end.record()
    end.synchronize()
    half_a_second = int(10**7 / start.elapsed_time(end) * 500)  # the sleep kernel's cycles per ms, times 500
    t0 = time.perf_counter()
    start.record()
    torch.cuda._sleep(half_a_second)
    end.record()
    if side == "send":
        group.send(iter(tensors))
    else:
        assert [name for name, _ in group.receive()] == ["a", "big"]
    took = time.perf_counter() - t0
    # the kernel's own time, not the 0.5 s aimed at: the clock that ran the first sleep need not run the second
    slept = start.elapsed_time(end) / 1000
    print(f"{side}: {took:.3f} s with a {slept:.3f} s kernel queued before it")
    assert torch.cuda.current_stream().query() and slept > 0.05 and took > 0.9 * slept, (took, slept)


def test_sglang_takes_the_synced_weights_and_its_answers_are_checked_on_cuda():
    """SGLang (where installed) in the training worker: every weight call's answer checked (a refused one raises),
    the session opened where this SGLang has one, and the engine samples what the actor scores after the syncs."""
    pytest.importorskip("sglang", reason="SGLang is not installed here: pip install 'rlrig[sglang]'")
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    overrides = [
        *EMBEDDED,
        "trainer.device=cuda",
        *GPU_MICRO,
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
    ]
    with single_worker(overrides) as (w, batches):
        answers, update = [], w.engine.engine.update_weights_from_tensor
        w.engine.engine.update_weights_from_tensor = lambda **kw: answers.append(update(**kw)) or answers[-1]
        out = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0))
        assert answers and all(ok for ok, _ in answers), answers
        assert out["training/rollout_probs_diff_mean"] < 0.02, out["training/rollout_probs_diff_mean"]
        w.engine.engine.update_weights_from_tensor = lambda **kw: (False, "refused here")
        with pytest.raises(RuntimeError, match="failed: update_weights_from_tensor of bucket 0 .*'refused here'"):
            w.engine.sync_weights(iter([("model.norm.weight", torch.ones(8, device="cuda"))]))


EAGER = [
    f"actor_rollout_ref.{role}.{key}=False"
    for role in ("actor", "ref")
    for key in ("use_torch_compile", "fsdp_config.use_torch_compile")
]


@pytest.mark.parametrize("head", ["plain", "fused"])
def test_compiled_log_prob_math_and_blocks_match_eager_under_fsdp_on_cuda(monkeypatch, head):
    """use_torch_compile (verl's default) under FSDP2: the per-chunk log-prob math compiled (on the plain head's
    logits, or on each chunk the fused head computes) and each decoder block compiled before it is sharded, with
    gradient checkpointing's recompute and packed rows of changing length; two steps give the eager run's metrics
    (fp32, so only the kernels' reduction order differs)."""
    from rlrig.trainer.model import chunked_logprobs, parallel

    compiled_blocks = []
    compile_blocks = parallel.compile_blocks
    monkeypatch.setattr(parallel, "compile_blocks", lambda m: compiled_blocks.append(m) or compile_blocks(m))
    keys = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "response_length/mean")
    common = [
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.model.use_fused_kernels={head == 'fused'}",
    ]
    eager = run_worker([*common, *EAGER], steps=2, tf32=False)
    assert compiled_blocks == [] and chunked_logprobs.chosen() is chunked_logprobs.EAGER
    try:
        compiled = run_worker([*common, *(k.replace("=False", "=True") for k in EAGER)], steps=2, tf32=False)
        assert len(compiled_blocks) == 2  # the actor's and the reference's
        assert chunked_logprobs.chosen() is not chunked_logprobs.EAGER
    finally:
        chunked_logprobs.use(chunked_logprobs.EAGER)
    for a, b in zip(eager, compiled):
        assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-3, abs=1e-4)


LIGER_STEPS = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM
from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
from rlrig.trainer.model import kernels
from rlrig.trainer.model.forward import ForwardOptions, token_logprobs

path, out = ensure_tiny_model(), {}
g = torch.Generator().manual_seed(0)
ids = torch.randint(3, 20, (16, 40), generator=g).cuda()
mask = torch.ones_like(ids)
for liger in (False, True):  # plain first: Liger also swaps transformers' qwen2 classes for the rest of the process
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()  # fp32 weights, bf16 compute
    if liger:
        kernels.apply_liger(model, "actor_rollout_ref.model.use_liger", "cuda")
        assert model.model.layers[0].mlp.forward.__func__ is LigerSwiGLUMLP.forward
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, ents = [], []
    for _ in range(4):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp, ent = token_logprobs(model, ids, mask, 8, ForwardOptions(with_entropy=True))
        loss = -logp.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        ents.append(ent.mean().item())
    out[str(liger)] = {"loss": losses, "entropy": ents}
print(json.dumps(out))
"""


def test_liger_steps_agree_with_plain_in_bf16_on_cuda():
    """model.use_liger (the liger extra): Liger's kernels in the tiny model, with verl's call, train four steps
    (fp32 weights, bf16 compute, as the trainer on a GPU) to the plain model's losses and entropies within bf16's
    rounding. In a process of its own, since Liger also
    replaces transformers' qwen2 classes for every model built after it."""
    pytest.importorskip("liger_kernel", reason="the liger extra is not installed here: pip install 'rlrig[liger]'")
    r = subprocess.run([sys.executable, "-c", LIGER_STEPS], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    plain, liger = got["False"], got["True"]
    print(f"liger: {liger}; plain: {plain}")
    for k in ("loss", "entropy"):
        assert liger[k] == pytest.approx(plain[k], rel=2e-2, abs=2e-2), k
    assert plain["loss"][-1] < plain["loss"][0]  # the steps trained
