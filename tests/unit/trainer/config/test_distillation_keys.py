"""distillation.* (verl 0.9's on-policy distillation): each key rlrig implements reaches the typed config, each it
does not is refused at start-up in one line naming it, and the teacher must read the student's token ids."""

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

BASE = ["actor_rollout_ref.model.path=/m"]
ON = [*BASE, "distillation.enabled=True", "distillation.teacher_models.teacher_model.model_path=/t"]
LOSS = "distillation.distillation_loss."
POOL = ["distillation.nnodes=1", "distillation.n_gpus_per_node=4"]
TEACHER = "distillation.teacher_models.teacher_model."
_inference = lambda c: c.distillation.teacher_models.teacher_model.inference  # noqa: E731


@pytest.mark.parametrize(
    "override, read, value",
    [
        (f"{LOSS}loss_mode=k2", lambda c: c.distillation.distillation_loss.loss_mode, "k2"),
        (f"{LOSS}loss_mode=low_var_kl", lambda c: c.distillation.distillation_loss.loss_mode, "low_var_kl"),
        (f"{LOSS}use_task_rewards=False", lambda c: c.distillation.distillation_loss.use_task_rewards, False),
        (f"{LOSS}distillation_loss_coef=0.5", lambda c: c.distillation.distillation_loss.distillation_loss_coef, 0.5),
        (f"{LOSS}loss_max_clamp=10.0", lambda c: c.distillation.distillation_loss.loss_max_clamp, 10.0),
        (f"{LOSS}use_policy_gradient=True", lambda c: c.distillation.distillation_loss.use_policy_gradient, True),
        (f"{LOSS}clip_ratio_high=0.28", lambda c: c.distillation.distillation_loss.clip_ratio_high, 0.28),
        ("distillation.teacher_key=task", lambda c: c.distillation.teacher_key, "task"),
        (f"{TEACHER}key=gsm8k", lambda c: c.distillation.teacher_models.teacher_model.key, "gsm8k"),
        ("distillation.nnodes=1", lambda c: "distillation" in c.own_pools(), True),
        (f"{TEACHER}inference.name=vllm", lambda c: _inference(c).name, "vllm"),
        (f"{TEACHER}inference.gpu_memory_utilization=0.3", lambda c: _inference(c).gpu_memory_utilization, 0.3),
        (f"{TEACHER}inference.max_model_len=3073", lambda c: _inference(c).max_model_len, 3073),
        # the hf teacher: a whole copy in each worker, whatever the tensor-parallel size
        (f"{TEACHER}inference.tensor_model_parallel_size=2", lambda c: _inference(c).tensor_model_parallel_size, 2),
    ],
)  # fmt: skip
def test_a_distillation_key_reaches_the_config(override, read, value):
    assert read(parse_overrides([*ON, override])) == value


def test_the_top_k_mode_reads_its_keys():
    from rlrig.trainer.algos.distillation import DistillationLoss

    topk = [f"{LOSS}loss_mode=forward_kl_topk", f"{LOSS}topk=64", f"{LOSS}log_prob_min_clamp=-10.0"]
    d = DistillationLoss.of(parse_overrides([*ON, *topk]))
    assert (d.uses_topk, d.topk, d.min_clamp) == (True, 64, -10.0)
    assert parse_overrides(ON).distillation.distillation_loss.topk == 32  # verl's default


NAMED_T2 = ["+distillation.teacher_models.t2.model_path=/u", "+distillation.teacher_models.t2.key=a"]
MOPD = [  # verl 0.9.0's multi-teacher example (run_qwen3_8b_mopd_fsdp.sh), on rlrig's one device a teacher engine
    *BASE,
    "distillation.enabled=True",
    "distillation.teacher_key=data_source",
    "+distillation.teacher_models.gsm8k.key=openai/gsm8k",
    "+distillation.teacher_models.gsm8k.model_path=/t1",
    "+distillation.teacher_models.gsm8k.inference.name=vllm",
    "+distillation.teacher_models.gsm8k.inference.gpu_memory_utilization=0.4",
    "+distillation.teacher_models.geo3k.key=hiyouga/geometry3k",
    "+distillation.teacher_models.geo3k.model_path=/t2",
]


def test_several_teachers_are_named_beside_teacher_model_each_with_its_key():
    from rlrig.trainer.config.schema import from_dict
    from rlrig.trainer.config.teachers import route_refusal, teachers

    cfg = parse_overrides(MOPD)
    found = teachers(from_dict(cfg.to_dict()))  # as the workers see it
    assert [(t.name, t.key) for t in found] == [("gsm8k", "openai/gsm8k"), ("geo3k", "hiyouga/geometry3k")]
    views = [t.cfg.distillation.teacher_models.teacher_model for t in found]
    assert [(v.model_path, v.inference.name, v.inference.gpu_memory_utilization) for v in views] == [
        ("/t1", "vllm", 0.4),
        ("/t2", None, 0.5),  # unset: teacher_model's defaults
    ]
    assert cfg.distillation.teacher_models.teacher_model.model_path is None
    assert route_refusal(cfg, ["openai/gsm8k", "hiyouga/geometry3k"]) is None
    why = route_refusal(cfg, ["openai/gsm8k", "lighteval/MATH", None])
    assert why == (
        "distillation.teacher_key=data_source: samples with data_source 'lighteval/MATH', None match no teacher (the "
        "teachers' keys: 'openai/gsm8k', 'hiyouga/geometry3k'); give each a teacher with that key "
        "(distillation.teacher_models.<name>.key)"
    )
    assert route_refusal(parse_overrides(ON), ["anything"]) is None  # one teacher scores every sample, as verl's


def test_each_sample_gets_its_teachers_index_by_its_row():
    from rlrig.trainer.workers.teacher import teacher_choice

    cfg = parse_overrides(MOPD)
    rows = [{"data_source": "hiyouga/geometry3k"}, {"data_source": "openai/gsm8k"}]
    assert teacher_choice(cfg, rows, 2).tolist() == [1, 1, 0, 0]
    assert teacher_choice(parse_overrides(ON), rows, 2) is None
    with pytest.raises(ConfigError, match="samples with data_source 'x' match no teacher"):
        teacher_choice(cfg, [{"data_source": "x"}], 1)


def test_colocated_by_default_and_verls_own_spelling_of_k1_as_a_policy_gradient():
    cfg = parse_overrides([*ON, f"{LOSS}loss_mode=k1", f"{LOSS}use_policy_gradient=True"])
    assert cfg.own_pools() == {} and cfg.distillation.enabled


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["distillation.enabled=True"], "distillation.teacher_models.teacher_model.model_path"),
        ([f"{LOSS}loss_mode=k4"], "choose one of kl, k1, abs, mse, k2, low_var_kl, k3, forward_kl_topk"),
        ([f"{LOSS}loss_mode=forward_kl_topk", f"{LOSS}topk=0"], "topk=0: loss_mode=forward_kl_topk reads"),
        (
            [f"{LOSS}loss_mode=forward_kl_topk", "actor_rollout_ref.model.use_fused_kernels=True"],
            "the loss reads the student's logits at every response position, which a fused head never makes",
        ),
        (
            [f"{LOSS}loss_mode=forward_kl_topk", f"+{TEACHER}inference.engine_kwargs.vllm.max_logprobs=8"],
            "max_logprobs=8 is below distillation.distillation_loss.topk=32",
        ),
        ([f"{LOSS}loss_mode=k1"], "use_policy_gradient=True"),
        ([f"{LOSS}policy_loss_mode=gspo"], "only vanilla"),
        ([f"{LOSS}loss_max_clamp=0"], "must be positive"),
        (["distillation.nnodes=1", "distillation.n_gpus_per_node=0"], "needs both at least 1"),
        (
            [
                "+distillation.teacher_models.teacher_model2.model_path=/u",
                "+distillation.teacher_models.teacher_model2.key=a",
            ],
            "distillation.teacher_models.teacher_model.model_path with teachers named beside it (teacher_model2): "
            "verl drops teacher_model then",
        ),
        (
            ["distillation.enabled=True", "+distillation.teacher_models.t2.model_path=/u"],
            "distillation.teacher_models.t2.key is not set",
        ),
        (
            [
                "distillation.enabled=True",
                *(f"+distillation.teacher_models.{n}.{k}" for n in ("a", "b") for k in ("model_path=/u", "key=x")),
            ],
            "distillation.teacher_models.b.key=x: teacher a has that key too",
        ),
        (
            ["distillation.enabled=True", "+distillation.teacher_models.t2.num_replicas=2"],
            "one replica per tensor_model_parallel_size devices",
        ),
        (
            ["distillation.enabled=True", "+distillation.teacher_models.t2.inference.name=sglang", *NAMED_T2],
            "distillation.teacher_models.t2.inference.name",
        ),
        (
            [f"{TEACHER}inference.name=sglang"],
            "set distillation.teacher_models.teacher_model.inference.name=vllm or hf",
        ),
        (["actor_rollout_ref.rollout.name=sglang"], "inference.name (the rollout's, sglang): rlrig computes"),
        (
            [f"{TEACHER}inference.name=vllm", f"{TEACHER}inference.tensor_model_parallel_size=2"],
            "colocated (distillation.nnodes=0), one teacher engine spans that many training workers of one node, so "
            "it must divide trainer.n_gpus_per_node=1",
        ),
        (
            [*POOL, f"{TEACHER}inference.name=vllm", f"{TEACHER}inference.tensor_model_parallel_size=3"],
            "holds that many devices of one node of the teacher's pool (rlrig's engines do not span nodes), so it "
            "must divide distillation.n_gpus_per_node=4",
        ),
        ([f"{TEACHER}inference.name=vllm", f"{TEACHER}inference.tensor_model_parallel_size=0"], "1 or more"),
        ([f"+{TEACHER}inference.engine_kwargs.sglang.x=1"], "engine_kwargs.sglang: put vLLM's arguments"),
        ([f"{TEACHER}inference.data_parallel_size=2"], "one replica per tensor_model_parallel_size devices"),
        (
            ["distillation.teacher_models.teacher_model.num_replicas=2"],
            "one replica per tensor_model_parallel_size devices",
        ),
    ],
)
def test_what_rlrig_does_not_build_is_refused_in_one_line(overrides, says):
    base = BASE if overrides[0] == "distillation.enabled=True" else ON
    with pytest.raises(ConfigError) as e:
        parse_overrides([*base, *overrides])
    text = str(e.value)
    assert says in text and "\n" not in text, text
    assert text.startswith("distillation."), text


@pytest.mark.parametrize("device, gpus", [("cuda", 2), ("cpu", 0)])
def test_a_vllm_teacher_with_tensor_parallelism_holds_its_devices_in_its_pool(monkeypatch, device, gpus):
    """verl 0.9.0's example: a pool of 4 devices, 2 engines of tensor_model_parallel_size=2, one worker each."""
    from rlrig.trainer.driver import launch, placement

    tp = [f"{TEACHER}inference.name=vllm", f"{TEACHER}inference.tensor_model_parallel_size=2"]
    cfg = parse_overrides([*ON, *POOL, *tp, "trainer.n_gpus_per_node=1"])
    cfg.trainer.device = device  # as the driver resolves it
    monkeypatch.setattr(placement, "cluster_nodes", lambda: [])
    teacher = launch.plan_pools(cfg)[1]
    assert (teacher.role, teacher.nnodes, teacher.per_node) == ("distillation", 1, 2)
    assert teacher.bundle.get("GPU", 0) == gpus and teacher.group_need().get("GPU", 0) == 2 * gpus
    hf = parse_overrides(
        [*ON, *POOL, f"{TEACHER}inference.name=hf", f"{TEACHER}inference.tensor_model_parallel_size=2"]
    )
    assert launch.plan_pools(hf)[1].per_node == 4  # the hf teacher: a whole copy per device, whatever the size


def test_colocated_a_vllm_teacher_engine_spans_training_workers():
    tp = [f"{TEACHER}inference.name=vllm", f"{TEACHER}inference.tensor_model_parallel_size=2"]
    cfg = parse_overrides([*ON, *tp, "trainer.n_gpus_per_node=2"])
    assert cfg.own_pools() == {} and _inference(cfg).tensor_model_parallel_size == 2


@pytest.mark.parametrize(
    "tp, expected", [(1, {}), (2, {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"})]
)
def test_the_teacher_engines_tensor_parallelism_reaches_vllm(tp, expected):
    from rlrig.trainer.workers.vllm_teacher import engine_kwargs

    inf = _inference(parse_overrides([*ON, f"{TEACHER}inference.tensor_model_parallel_size={tp}"]))
    kw = engine_kwargs(inf, "/t", "cpu", "auto", 64, False)
    assert {k: kw[k] for k in ("tensor_parallel_size", "distributed_executor_backend") if k in kw} == expected


def test_verls_defaults_are_taken_with_distillation_off():
    cfg = parse_overrides([*BASE, "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=2"])
    assert not cfg.distillation.enabled


@pytest.fixture
def tokenizers(tmp_path):
    from rlrig.trainer.embedded.tiny_model import char_vocab, tokenizer_from_vocab

    same, other = tmp_path / "same", tmp_path / "other"
    tokenizer_from_vocab(char_vocab()).save_pretrained(same)
    tokenizer_from_vocab({**char_vocab(), "x": len(char_vocab())}).save_pretrained(other)
    return str(same), str(other)


def test_a_teacher_with_another_tokenizer_is_refused(tokenizers):
    from rlrig.trainer.workers.teacher import tokenizer_refusal

    same, other = tokenizers
    cfg = parse_overrides(
        [*BASE, "distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={same}"]
    )
    assert tokenizer_refusal(cfg, same) is None
    why = tokenizer_refusal(cfg, other)
    assert why.startswith("distillation.teacher_models.teacher_model.model_path=") and "share one tokenizer" in why
    assert tokenizer_refusal(parse_overrides(BASE), other) is None  # distillation off: nothing to check


def test_a_teacher_whose_tokenizer_does_not_load_is_refused_in_one_line(tmp_path, tokenizers):
    from rlrig.trainer.workers.teacher import tokenizer_refusal

    missing = tmp_path / "nowhere"
    cfg = parse_overrides([*BASE, "distillation.enabled=True", f"{TEACHER}model_path={missing}"])
    why = tokenizer_refusal(cfg, tokenizers[0])
    assert why.startswith(f"{TEACHER}model_path={missing}: its tokenizer does not load") and "\n" not in why, why


def test_a_top_k_above_the_teachers_vocabulary_is_refused(tokenizers):
    from rlrig.trainer.workers.teacher import tokenizer_refusal

    same = tokenizers[0]
    on = [*BASE, "distillation.enabled=True", f"{TEACHER}model_path={same}", f"{LOSS}loss_mode=forward_kl_topk"]
    assert tokenizer_refusal(parse_overrides([*on, f"{LOSS}topk=8"]), same) is None
    why = tokenizer_refusal(parse_overrides(on), same)  # verl's default k, 32
    assert why.startswith(f"{LOSS}topk=32: the teacher ({same}) has ") and why.endswith("or less"), why


def test_print_config_shows_named_teachers_where_their_keys_put_them():
    shown = parse_overrides(MOPD).described()["distillation"]["teacher_models"]
    assert list(shown) == ["teacher_model", "gsm8k", "geo3k"]
    assert shown["gsm8k"]["key"] == "openai/gsm8k" and shown["geo3k"]["model_path"] == "/t2"
