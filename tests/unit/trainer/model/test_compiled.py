"""The log-prob math through torch.compile (model/compiled.py): the same values and gradients as the eager math,
chosen once per worker, on CUDA only; the decoder blocks compiled under FSDP on CUDA; the CPU run's notice."""

import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.model import chunked_logprobs as C
from rlrig.trainer.model import compiled
from tests.helpers.gpu_config import GPU_MICRO


def run(math, base, targets, temperature, entropy_grad):
    logits = base.clone().requires_grad_(True)
    logp, ent = C.token_logprobs_and_entropy(logits, targets, True, entropy_grad, temperature, math=math)
    g = torch.Generator().manual_seed(1)
    loss = (logp * torch.randn(logp.shape, generator=g)).sum()
    if entropy_grad:
        loss = loss + (ent * torch.randn(ent.shape, generator=g)).sum()
    loss.backward()
    return logp.detach(), ent.detach(), logits.grad


def inputs(dtype, tokens=(3, 9), vocab=50):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(*tokens, vocab, generator=g) * 3).to(dtype), torch.randint(0, vocab, tokens, generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_the_traced_math_gives_the_eager_values_and_gradients(monkeypatch, dtype, temperature, entropy_grad):
    """aot_eager: torch.compile's tracing of both functions (graph capture, autograd-free functionalisation of the
    in-place math) without code generation; chunks of 7 tokens, so the chunk's length changes (dynamic shapes)."""
    monkeypatch.setattr(C, "CHUNK_ELEMENTS", 7 * 50)
    torch._dynamo.reset()
    base, targets = inputs(dtype)
    got = run(compiled.compiled_math("aot_eager"), base, targets, temperature, entropy_grad)
    want = run(C.EAGER, base, targets, temperature, entropy_grad)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_the_generated_code_gives_the_eager_values_and_gradients(monkeypatch):
    """inductor, the backend a CUDA run compiles with (here its C++ code on the CPU): fused kernels, the same
    numbers up to fp32 rounding."""
    monkeypatch.setattr(C, "CHUNK_ELEMENTS", 7 * 50)
    torch._dynamo.reset()
    base, targets = inputs(torch.float32)
    got = run(compiled.compiled_math("inductor"), base, targets, 0.7, True)
    want = run(C.EAGER, base, targets, 0.7, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_math_is_compiled_on_cuda_only_and_chosen_once():
    assert compiled.math_for(True, "cpu") is C.EAGER
    assert compiled.math_for(False, "cuda") is C.EAGER
    on_gpu = compiled.math_for(True, "cuda")
    assert on_gpu is not C.EAGER and on_gpu is compiled.math_for(True, "cuda")  # one compiled pair per process
    cfg = parse_overrides([])
    try:
        compiled.choose_math(cfg, "actor", "cuda")
        assert C.chosen() is on_gpu
        compiled.choose_math(
            parse_overrides(["actor_rollout_ref.ref.fsdp_config.use_torch_compile=False"]), "ref", "cuda"
        )
        assert C.chosen() is C.EAGER
    finally:
        C.use(C.EAGER)


def test_a_pass_without_math_runs_the_process_choice(monkeypatch):
    calls = []

    def forward(*args):
        calls.append("forward")
        return C.logits_forward(*args)

    monkeypatch.setattr(C, "_chosen", C.ChunkMath(forward=forward))
    base, targets = inputs(torch.float32)
    C.token_logprobs_and_entropy(base, targets)
    assert calls == ["forward"]


def test_blocks_are_compiled_under_fsdp_on_cuda_only():
    cfg = parse_overrides([])
    assert compiled.blocks_compiled(cfg, "actor", "cuda") and compiled.blocks_compiled(cfg, "ref", "cuda")
    assert not compiled.blocks_compiled(cfg, "actor", "cpu")
    assert not compiled.blocks_compiled(parse_overrides(["actor_rollout_ref.actor.strategy=ddp"]), "actor", "cuda")
    off = parse_overrides(["actor_rollout_ref.actor.use_torch_compile=False"])
    assert not compiled.blocks_compiled(off, "actor", "cuda") and not compiled.blocks_compiled(off, "ref", "cuda")
    ref_off = parse_overrides(["actor_rollout_ref.ref.use_torch_compile=False"])
    assert compiled.blocks_compiled(ref_off, "actor", "cuda") and not compiled.blocks_compiled(ref_off, "ref", "cuda")
    grouped = parse_overrides(["actor_rollout_ref.actor.use_prefix_grouper=True"])
    assert not compiled.blocks_compiled(grouped, "actor", "cuda")


@pytest.mark.parametrize(
    "override, named",
    [
        ("actor_rollout_ref.actor.router_replay.mode=R2", "router_replay.mode"),
        ("actor_rollout_ref.rollout.moe_load_balance_metrics_interval=1", "moe_load_balance_metrics_interval"),
        ("+actor_rollout_ref.model.override_config.output_router_logits=True", "auxiliary loss (output_router_logits)"),
    ],
)
def test_an_moe_whose_routers_are_hooked_keeps_eager_blocks_and_says_so(override, named):
    # torch.compile guards on no module's hooks: a block compiled without the routers' would drop them later
    cfg = parse_overrides(["trainer.device=cuda", *GPU_MICRO, override])
    assert not compiled.blocks_compiled(cfg, "actor", "cuda")
    assert named in compiled.start_notice(cfg)


def test_an_moe_whose_config_asks_for_its_auxiliary_loss_keeps_eager_blocks(capsys):
    from rlrig.trainer.model.build import routers_tapped_by_config
    from tests.helpers.tiny_moe import build

    model, _ = build("qwen3_moe")
    assert not routers_tapped_by_config(model)
    model.config.output_router_logits = True
    assert routers_tapped_by_config(model)
    assert "uncompiled with the MoE's auxiliary loss" in capsys.readouterr().out


def test_compile_blocks_compiles_each_block_in_place_keeping_the_state_dict():
    from rlrig.trainer.embedded.tiny_model import build_model, build_tokenizer
    from rlrig.trainer.model import parallel

    model = build_model(build_tokenizer())
    names = list(model.state_dict())
    parallel.compile_blocks(model)
    layers = list(model.model.layers)
    assert layers and all(layer._compiled_call_impl is not None for layer in layers)
    assert model._compiled_call_impl is None and model.model.norm._compiled_call_impl is None
    assert list(model.state_dict()) == names


@pytest.mark.parametrize(
    "overrides, words",
    [
        ([], "actor_rollout_ref.actor.fsdp_config.use_torch_compile, actor_rollout_ref.actor.use_torch_compile=True"),
        (
            ["actor_rollout_ref.actor.strategy=ddp"],
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile=True: this run is on CPU, where compiling needs a "
            "C++ toolchain and takes longer than the run, so the log-prob math runs uncompiled",
        ),
        (
            ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.use_torch_compile=False"],
            "actor_rollout_ref.ref.fsdp_config.use_torch_compile=True",
        ),
    ],
)
def test_a_cpu_run_says_in_one_line_that_it_runs_uncompiled(overrides, words):
    notice = compiled.start_notice(parse_overrides(["trainer.device=cpu", *overrides]))
    assert words in notice and "on CPU" in notice and "\n" not in notice


def test_no_notice_where_nothing_asks_for_compiling_or_everything_compiles():
    off = [
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
    ]
    assert compiled.start_notice(parse_overrides(["trainer.device=cpu", *off])) is None
    assert compiled.start_notice(parse_overrides(["trainer.device=cuda", *GPU_MICRO])) is None
    grouped = parse_overrides(["trainer.device=cuda", *GPU_MICRO, "actor_rollout_ref.actor.use_prefix_grouper=True"])
    assert "use_prefix_grouper" in compiled.start_notice(grouped)
    # Liger's kernels inside compiled blocks failed dynamo's tracing on an H200: such blocks stay eager, and it says so
    liger = parse_overrides(["trainer.device=cuda", *GPU_MICRO, "actor_rollout_ref.model.use_liger=True"])
    assert not compiled.blocks_compiled(liger, "actor", "cuda") and "use_liger" in compiled.start_notice(liger)


def test_an_in_worker_reference_with_other_math_is_refused():
    with pytest.raises(ConfigError) as e:
        parse_overrides(
            ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False"]
        )
    assert "actor_rollout_ref.actor.fsdp_config.use_torch_compile=True" in str(e.value) and "\n" not in str(e.value)
    parse_overrides(["actor_rollout_ref.ref.fsdp_config.use_torch_compile=False"])  # no reference: nothing differs


def test_the_keys_are_stored_and_printed():
    cfg = parse_overrides(
        [
            "actor_rollout_ref.actor.use_torch_compile=False",
            "actor_rollout_ref.ref.use_torch_compile=True",
            "critic.model.fsdp_config.use_torch_compile=False",
        ]
    )
    shown = cfg.described()
    assert shown["actor_rollout_ref"]["actor"]["use_torch_compile"] is False
    assert shown["actor_rollout_ref"]["ref"]["use_torch_compile"] is True
    assert shown["critic"]["model"]["fsdp_config"]["use_torch_compile"] is False
    assert not any("use_torch_compile" in k for k in shown["_no_effect_in_rlrig"])


def test_compiled_blocks_train_under_gradient_checkpointing():
    """Compiled blocks trace transformers' checkpoint call, where torch.compile refuses the sequence-parallel
    recompute contexts (set_checkpointing leaves them out there): a training forward and backward run, with the
    eager blocks' gradients. aot_eager: the tracing a CUDA run's inductor does, without code generation."""
    from rlrig.trainer.embedded.tiny_model import build_model, build_tokenizer
    from rlrig.trainer.model.build import set_checkpointing
    from rlrig.trainer.model.parallel import blocks

    torch._dynamo.reset()
    ids = torch.randint(3, 10, (2, 12), generator=torch.Generator().manual_seed(0))
    grads = []
    for compile_them in (False, True):
        model = build_model(build_tokenizer())
        if compile_them:
            for block in blocks(model):
                block.compile(backend="aot_eager")
        set_checkpointing(model, True)
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.process
def test_compiled_blocks_and_math_under_fsdp_give_the_eager_steps(monkeypatch):
    """The CUDA path's compiling on the CPU (the device check stood in for; aot_eager, the tracing without code
    generation): the actor's and reference's blocks compiled before FSDP2 shards them, the log-prob math compiled,
    with gradient checkpointing and packed rows; two steps give the eager run's metrics."""
    import functools

    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.model import parallel
    from rlrig.trainer.workers.step.request import StepRequest

    module_compile = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: module_compile(self, backend="aot_eager"))
    monkeypatch.setattr(compiled, "_compiled", functools.cache(lambda: compiled.compiled_math("aot_eager")))
    for name in ("blocks_compiled", "math_for"):
        real = getattr(compiled, name)
        monkeypatch.setattr(compiled, name, lambda *a, real=real: real(*a[:-1], "cuda"))
    compiled_blocks = []
    compile_blocks = parallel.compile_blocks
    monkeypatch.setattr(parallel, "compile_blocks", lambda m: compiled_blocks.append(m) or compile_blocks(m))
    torch._dynamo.reset()
    base = [
        "trainer.device=cpu",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=2",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.use_kl_loss=True",
    ]
    eager_keys = [
        f"actor_rollout_ref.{r}.{k}=False"
        for r in ("actor", "ref")
        for k in ("use_torch_compile", "fsdp_config.use_torch_compile")
    ]
    runs = []
    try:
        for extra in (eager_keys, []):
            with single_worker([*base, *extra]) as (w, batches):
                runs.append([w.step(StepRequest(next(batches), global_step=s + 1, kl_coef=0.0)) for s in range(2)])
            assert (C.chosen() is C.EAGER) == bool(extra)
    finally:
        C.use(C.EAGER)
    assert len(compiled_blocks) == 2  # the compiled run's actor and reference
    keys = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "response_length/mean")
    for a, b in zip(*runs):
        assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-5, abs=1e-6)
