"""The model-based reward and where workers go: placement checked against what the nodes offer, the reward
managers' arithmetic, what the reward model reads, how its score combines with a function, the config rules."""

import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.driver import placement as P
from rlrig.trainer.embedded.tiny_model import build_tokenizer, ensure_tiny_model
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.reward.managers import Overlong
from rlrig.trainer.reward.scoring import RewardSource, model_inputs, score
from rlrig.trainer.rollout.engines import Rollout

pytestmark = pytest.mark.process

# a unit of the custom resource per worker the node may host (RLRIG_RESOURCES='{"h100": 2}' on a two-GPU node)
H100 = P.Node("rank 0 (10.0.0.1)", {"CPU": 4, "GPU": 2, "h100": 2}, "0")
V100 = P.Node("rank 1 (10.0.0.2)", {"CPU": 4, "GPU": 1, "v100": 1}, "1")
CPU_ONLY = P.Node("rank 2 (10.0.0.3)", {"CPU": 2}, "2")
THREE_CPUS = P.Node("10.0.0.4", {"CPU": 3})


def pool(role, nnodes, per_node, *res, gpu=True, ranks=()):
    return P.Pool(role, nnodes, per_node, P.bundle(gpu, *res), ranks)


@pytest.mark.parametrize(
    "pools, nodes, refusal",
    [
        # the OpenRLHF FAQ's layout: actor on the h100 node, reward model on the v100 node
        ([pool("trainer", 1, 2, "h100"), pool("reward_model", 1, 1, "v100")], [H100, V100], None),
        (
            [pool("trainer", 1, 1), pool("reward_model", 1, 1, "a100")],
            [H100, V100],
            "needs 1 'a100' on each of 1 node(s)",
        ),
        # two actor GPUs on one node: the v100 node has one
        ([pool("trainer", 1, 2, "v100")], [H100, V100], "needs 2 'v100'"),
        ([pool("trainer", 2, 2)], [H100, V100], "need 4 'GPU' in all and the cluster has 3"),
        # each fits alone, not together: the h100 node's two GPUs cannot hold both pools
        (
            [pool("trainer", 1, 2), pool("reward_model", 1, 1, "h100")],
            [H100, CPU_ONLY],
            "need 3 'GPU' in all and the cluster has 2",
        ),
        ([pool("trainer", 1, 1, "h100"), pool("reward_model", 1, 3, "h100")], [H100, V100], "needs 3 'h100'"),
        (
            [pool("trainer", 1, 2, "h100"), pool("reward_model", 1, 1, "h100", gpu=False)],
            [H100, V100],
            "need 3 'h100' in all",
        ),
        ([pool("trainer", 1, 2), pool("reward_model", 1, 1)], [H100, V100], None),
        ([pool("trainer", 1, 2, "h100"), pool("reward_model", 1, 1)], [H100, V100], None),
        ([pool("trainer", 1, 2, gpu=False), pool("reward_model", 1, 2, gpu=False)], [CPU_ONLY, CPU_ONLY], None),
        (
            [pool("trainer", 1, 2, gpu=False), pool("reward_model", 1, 3, gpu=False)],
            [CPU_ONLY, CPU_ONLY],
            "needs 3 'CPU'",
        ),
        # 6 CPUs wanted and offered, but a group of two is packed on one node: each node holds one
        (
            [pool("trainer", 2, 2, gpu=False), pool("reward_model", 1, 2, gpu=False)],
            [THREE_CPUS, THREE_CPUS],
            "do not fit on the nodes together",
        ),
        # pinned by rank: group i on node rank ranks[i]
        ([pool("trainer", 2, 1, ranks=("0", "1"))], [H100, V100], None),
        ([pool("trainer", 2, 1, ranks=("0", "1")), pool("reward_model", 1, 1, "h100")], [H100, V100], None),
        # rank 1 gone from a standing cluster: the training pool is pinned to ranks 0 and 2
        ([pool("trainer", 2, 1, gpu=False, ranks=("0", "2"))], [H100, CPU_ONLY], None),
        ([pool("trainer", 2, 1, gpu=False, ranks=("0", "1"))], [H100, CPU_ONLY], "do not fit on the nodes together"),
        # rank 1's worker takes the v100 node's one GPU
        (
            [pool("trainer", 2, 1, ranks=("0", "1")), pool("reward_model", 1, 1, "v100")],
            [H100, V100],
            "do not fit on the nodes together",
        ),
    ],
)
def test_placement_is_checked_before_anything_is_created(pools, nodes, refusal):
    if refusal is None:
        P.check(pools, nodes)
        return
    with pytest.raises(ConfigError) as e:
        P.check(pools, nodes)
    msg = str(e.value)
    assert refusal in msg and "\n" not in msg, msg
    assert all(n.name in msg for n in nodes)  # every node's offer is named


def test_one_unit_however_many_roles_ask_for_a_resource():
    assert P.bundle(True, "h100", "h100", None) == {"GPU": 1, "CPU": 1, "h100": 1}
    assert P.bundle(False, "a", "b") == {"CPU": 1, "a": 1, "b": 1}


@pytest.mark.parametrize(
    "length, expected",
    [
        (8, 0.0),  # within max_resp_len - len
        (12, 0.0),  # exactly at the buffer's start
        (14, -0.5),  # -(14 - 12) / 4 * 1.0
        (16, -1.0),
    ],
)
def test_dapo_overlong_penalty_by_hand(length, expected):
    assert Overlong(length=4, penalty_factor=1.0, max_resp_len=16).penalty(length) == pytest.approx(expected)


def _rollout(tok, prompts, responses, width=8):
    """Left-padded prompts and right-padded responses, as the engines return them."""
    plen = max(len(p) for p in prompts)
    ids, att, resp_mask = [], [], []
    for p, r in zip(prompts, responses):
        pad = tok.pad_token_id
        ids.append([pad] * (plen - len(p)) + p + r + [pad] * (width - len(r)))
        att.append([0] * (plen - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (width - len(r)))
        resp_mask.append([1] * len(r) + [0] * (width - len(r)))
    return Rollout(torch.tensor(ids), torch.tensor(att), torch.tensor(resp_mask).bool(), plen, None)


def test_what_the_reward_model_reads_and_how_scores_combine():
    tok = build_tokenizer()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    rows = [
        {
            "data_source": "rlrig/arithmetic",
            "prompt": [{"role": "user", "content": "3+4="}],
            "reward_model": {"ground_truth": "7"},
            "extra_info": {},
        },
        {
            "data_source": "rlrig/arithmetic",
            "prompt": [{"role": "user", "content": "10+1="}],
            "reward_model": {"ground_truth": "11"},
            "extra_info": {},
        },
    ]
    ro = _rollout(tok, [enc("3+4="), enc("10+1=")], [enc("#### 7") + [tok.eos_token_id], enc("#### 2")])
    seen = []

    def model(kind, inputs):
        seen.append((kind, inputs))
        return [0.25, -1.5]

    # the conversation, with the response (its EOS text dropped) as the assistant's turn
    src = RewardSource(None, model, tok, "prompt", None)
    kind, chats = model_inputs(rows, ro, 1, src)
    assert kind == "chats" and chats[0] == rows[0]["prompt"] + [{"role": "assistant", "content": "#### 7"}]
    assert chats[1][-1]["content"] == "#### 2"
    # input_tokenizer=null: the policy's own prompt and response tokens, padding left out
    kind, ids = model_inputs(rows, ro, 1, RewardSource(None, model, None, "prompt", None))
    assert kind == "ids" and ids[1] == enc("10+1=#### 2")
    # no function: the model's score is the reward
    scores, texts, fields = score(tok, src, rows, ro, 1)
    assert scores.tolist() == [0.25, -1.5] and texts == ["#### 7", "#### 2"] and fields == [{}, {}]
    # a custom function gets it as rm_score and decides; a dict result gives its "score", and its fields go to
    # validation
    fn = lambda ds, text, gt, extra, rm_score: {
        "score": rm_score + (1.0 if text.endswith(gt) else 0.0),
        "pred": text[-1],
    }
    scores, _, fields = score(tok, RewardSource(fn, model, tok, "prompt", None), rows, ro, 1)
    assert scores.tolist() == [1.25, -1.5] and fields == [{"score": 1.25, "pred": "7"}, {"score": -1.5, "pred": "2"}]
    # dapo's penalty on top of a function's score: responses of 7 (EOS included) and 6 tokens, max 8, buffer 4
    plain = lambda ds, text, gt, extra: float(text.endswith(gt))
    out = score(tok, RewardSource(plain, None, None, "prompt", Overlong(4, 1.0, 8)), rows, ro, 1)[0].tolist()
    assert out == pytest.approx([1.0 - 0.75, 0.0 - 0.5])


BASE = ["reward_model.enable=True"]


@pytest.mark.parametrize(
    "overrides, refusal",
    [
        (
            ["reward_model.use_reward_loop=True", "reward_model.rollout.name=sglang"],
            "reward_model.rollout.name=sglang: rlrig's reward loop serves the reward model with vLLM",
        ),
        (
            [
                "reward_model.use_reward_loop=True",
                "reward_model.rollout.tensor_model_parallel_size=2",
                "trainer.n_gpus_per_node=2",
                "reward_model.enable_resource_pool=True",
                "reward_model.nnodes=1",
                "reward_model.n_gpus_per_node=2",
            ],
            "reward_model.rollout.tensor_model_parallel_size=2: rlrig's reward engines span workers only colocated",
        ),
        (
            [
                "reward_model.use_reward_loop=True",
                "reward_model.rollout.tensor_model_parallel_size=3",
                "trainer.n_gpus_per_node=4",
            ],
            (
                "reward_model.rollout.tensor_model_parallel_size=3: one reward engine spans that many training workers "
                "of one node"
            ),
        ),
        (
            ["reward_model.use_reward_loop=True", "+reward_model.rollout.engine_kwargs.sglang.x=1"],
            "reward_model.rollout.engine_kwargs.sglang: the reward loop's engine is vLLM",
        ),
        (
            ["reward_model.use_reward_loop=True", "reward_model.rollout.prompt_length=0"],
            "reward_model.rollout.prompt_length=0 must be",
        ),
        (
            ["reward_model.use_reward_loop=True", "reward_model.rollout.gpu_memory_utilization=1.5"],
            "reward_model.rollout.gpu_memory_utilization=1.5 must be in (0, 1]",
        ),
        (
            ["reward_model.rollout.skip_tokenizer_init=True"],
            "reward_model.rollout.skip_tokenizer_init: a verl key rlrig does not implement: the reward engine renders "
            "text with its tokenizer",
        ),
        (
            ["reward_model.enable_resource_pool=True", "reward_model.nnodes=1"],
            "reward_model.enable_resource_pool=True needs reward_model.nnodes",
        ),
        (
            ["+reward_model.reward_kwargs.max_resp_len=8"],
            "reward_model.reward_kwargs.max_resp_len: verl's naive reward manager takes no",
        ),
        (
            [
                "reward_model.reward_manager=dapo",
                "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
                "+reward_model.reward_kwargs.max_resp_len=8",
            ],
            "reward_model.reward_kwargs.overlong_buffer_cfg.enable=True with reward_model.enable=True",
        ),
        (["reward_model.placement.resource=GPU"], "reward_model.placement.resource='GPU': name a custom resource"),
        (["reward_model.micro_batch_size_per_gpu=0"], "reward_model.micro_batch_size_per_gpu=0 must be at least 1"),
        (["trainer.placement_timeout_s=0"], "trainer.placement_timeout_s=0 must be positive"),
    ],
)
def test_reward_model_keys_are_refused_in_one_line(overrides, refusal):
    with pytest.raises(ConfigError) as e:
        parse_overrides([*BASE, *overrides])
    assert str(e.value).startswith(refusal) and "\n" not in str(e.value), str(e.value)


def test_dapo_without_a_reward_model_and_the_reward_loop_keys():
    cfg = parse_overrides(
        [
            "reward_model.reward_manager=dapo",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
            "+reward_model.reward_kwargs.max_resp_len=8",
            "reward_model.rollout.name=vllm",
            "reward_model.num_workers=8",
            "reward_model.use_reward_loop=True",
            "reward_model.rollout.prompt_length=100",
        ]
    )
    assert cfg.reward_model.reward_kwargs["overlong_buffer_cfg"]["len"] == 4
    assert cfg.reward_model.rollout.prompt_length == 100
    assert "reward_model.num_workers" in cfg.described()["_no_effect_in_rlrig"]  # accepted, nothing to store


@pytest.mark.parametrize(
    "overrides, device, expected",
    [
        ([], "cpu", {"dtype": "float32", "max_model_len": 64, "enforce_eager": True, "max_num_batched_tokens": 8192}),
        ([], "cuda", {"dtype": "bfloat16", "gpu_memory_utilization": 0.5, "enable_sleep_mode": True}),
        (
            [
                "reward_model.rollout.dtype=float16",
                "reward_model.rollout.gpu_memory_utilization=0.8",
                "reward_model.rollout.free_cache_engine=False",
                "reward_model.rollout.max_num_seqs=32",
            ],
            "cuda",
            {"dtype": "float16", "gpu_memory_utilization": 0.8, "enable_sleep_mode": False, "max_num_seqs": 32},
        ),
        (
            [
                "+reward_model.rollout.engine_kwargs.vllm.max_num_seqs=7",
                "reward_model.rollout.enable_prefix_caching=False",
            ],
            "cpu",
            {"max_num_seqs": 7, "enable_prefix_caching": False},
        ),
        (
            ["reward_model.rollout.tensor_model_parallel_size=4", "trainer.n_gpus_per_node=8"],
            "cuda",
            {"tensor_parallel_size": 4, "distributed_executor_backend": "mp"},
        ),
    ],
)
def test_reward_loop_engine_arguments(overrides, device, expected):
    from rlrig.trainer.reward.vllm_scorer import engine_kwargs

    r = parse_overrides([*BASE, "reward_model.use_reward_loop=True", *overrides]).reward_model.rollout
    kw = engine_kwargs(r, "/rm", device, 64)
    assert kw["runner"] == "pooling" and kw["convert"] == "classify" and kw["pooler_config"] == {"task": "classify"}
    assert {k: kw[k] for k in expected} == expected
    if device == "cpu":
        assert "gpu_memory_utilization" not in kw and "enable_sleep_mode" not in kw


@pytest.mark.parametrize(
    "overrides, model_limit, expected",
    [
        ([], None, 4096),  # verl's prompt_length + response_length
        ([], 64, 64),  # capped at the model's positions
        (["reward_model.rollout.prompt_length=10", "reward_model.rollout.response_length=6"], 64, 16),
        (["reward_model.rollout.max_model_len=100"], 64, 100),  # the user's word, as verl passes it to vLLM
    ],
)
def test_reward_loop_max_length(overrides, model_limit, expected):
    from rlrig.trainer.reward.vllm_scorer import max_length

    assert max_length(parse_overrides([*BASE, *overrides]).reward_model.rollout, model_limit) == expected


def test_reward_loop_without_vllm_is_refused_before_workers_start(monkeypatch):
    import importlib.util

    from rlrig.trainer.reward.reward_model import check_installed

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    cfg = parse_overrides([*BASE, "reward_model.use_reward_loop=True"])
    with pytest.raises(ConfigError) as e:
        check_installed(cfg.reward_model)
    assert "scores with vLLM, which is not installed here" in str(e.value) and "\n" not in str(e.value)
    check_installed(parse_overrides(BASE).reward_model)  # transformers: nothing to check


def test_a_custom_function_beside_the_reward_model_must_take_rm_score_or_the_judges_address(tmp_path):
    from rlrig.trainer.reward.rules import check_reward_setup, reward_fn

    f = tmp_path / "r.py"
    f.write_text(
        "def plain(data_source, solution, ground_truth, extra_info=None):\n    return 0.0\n"
        "def combined(data_source, solution, ground_truth, extra_info=None, rm_score=0.0):\n    return rm_score\n"
    )
    cfg = parse_overrides([*BASE, f"custom_reward_function.path={f}", "custom_reward_function.name=plain"])
    with pytest.raises(ConfigError, match="rm_score, or, for a generative judge, .* reward_router_address"):
        check_reward_setup(cfg, {"anything"})
    cfg.custom_reward_function.name = "combined"
    check_reward_setup(cfg, {"anything"})
    assert reward_fn(cfg).__name__ == "combined"
    # with a reward model, data sources without a rule need no function: the model's score is the reward
    check_reward_setup(parse_overrides(BASE), {"anything"})
    assert reward_fn(parse_overrides(BASE)) is None


def test_grpo_scored_by_the_embedded_reward_model_in_one_process():
    from rlrig.trainer.driver.single_process import run_steps

    ms = run_steps(
        [
            *BASE,
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=4",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "data.max_response_length=8",
            "reward_model.micro_batch_size_per_gpu=3",
        ],
        2,
    )
    scores = [ms[0]["critic/score/min"], ms[0]["critic/score/mean"], ms[0]["critic/score/max"]]
    # the model's logits, not a rule's 0/1
    assert scores[0] < scores[1] < scores[2] and any(s not in (0.0, 1.0) for s in scores), scores


def test_the_reference_in_its_own_pool_computes_what_the_colocated_one_does():
    from rlrig.trainer.batch.step_batch import StepBatch
    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.rollout.engines import Sampling
    from rlrig.trainer.workers.ref_worker import RefWorker

    overrides = [
        "actor_rollout_ref.actor.use_kl_loss=True",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.max_response_length=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
    ]
    with single_worker(overrides) as (w, batches):
        rows = next(batches)
        batch = StepBatch.from_rollout(w.engine.generate([r["input_ids"] for r in rows], 2, Sampling()), 2)
        here = w.context.sources.ref(batch)  # the reference held here, at its micro batch of 3
        remote = RefWorker(w.cfg.to_dict(), ensure_tiny_model(), use_gpu=False)
        there = remote.logprobs(batch.only())
    assert there.shape == here.shape and torch.allclose(there, here, atol=1e-5)


def test_own_pools_need_a_size_and_a_reference_in_use():
    with pytest.raises(
        ConfigError, match="actor_rollout_ref.ref.enable_resource_pool=True but this run has no reference"
    ):
        parse_overrides(
            ["actor_rollout_ref.ref.enable_resource_pool=True", "actor_rollout_ref.actor.use_kl_loss=False"]
        )
    with pytest.raises(
        ConfigError, match="actor_rollout_ref.ref.enable_resource_pool=True needs actor_rollout_ref.ref.nnodes"
    ):
        parse_overrides(["actor_rollout_ref.ref.enable_resource_pool=True", "actor_rollout_ref.actor.use_kl_loss=True"])
    cfg = parse_overrides(
        [
            *BASE,
            "reward_model.enable_resource_pool=True",
            "reward_model.nnodes=2",
            "reward_model.n_gpus_per_node=1",
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.ref.enable_resource_pool=True",
            "actor_rollout_ref.ref.nnodes=1",
            "actor_rollout_ref.ref.n_gpus_per_node=1",
        ]
    )
    assert list(cfg.own_pools()) == ["actor_rollout_ref.ref", "reward_model"]
    with pytest.raises(
        ConfigError, match="one critic worker per training worker, so critic.nnodes x critic.n_gpus_per_node must be 2"
    ):
        parse_overrides(
            [
                "trainer.n_gpus_per_node=2",
                "critic.enable_resource_pool=True",
                "critic.nnodes=1",
                "critic.n_gpus_per_node=1",
            ]
        )
    with pytest.raises(
        ConfigError, match="critic.enable_resource_pool=True but algorithm.adv_estimator=grpo trains no critic"
    ):
        parse_overrides(
            ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "critic.enable_resource_pool=True"]
        )
    cfg = parse_overrides(
        [
            "trainer.n_gpus_per_node=2",
            "algorithm.adv_estimator=gae",
            "critic.enable_resource_pool=True",
            "critic.nnodes=1",
            "critic.n_gpus_per_node=2",
        ]
    )
    assert list(cfg.own_pools()) == ["critic"]


@pytest.mark.parametrize(
    "rows, workers, parts, fillers",
    [
        ([1, 2, 3, 4], 2, [[1, 2], [3, 4]], [False, False]),
        ([1, 2, 3], 2, [[1, 2], [3]], [False, False]),
        # fewer prompts than workers: every worker still asks (engines spanning workers need all of them)
        ([1], 3, [[1], [1], [1]], [False, True, True]),
        ([1, 2], 4, [[1], [2], [1], [1]], [False, False, True, True]),
    ],
)
def test_every_worker_takes_part_in_validation(rows, workers, parts, fillers):
    from rlrig.trainer.driver.validation import val_parts

    assert val_parts(rows, workers) == (parts, fillers)
