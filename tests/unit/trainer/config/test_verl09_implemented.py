"""verl 0.9 keys rlrig implements (issue: every key of verl 0.9's config does what verl does with it): each key's
effect, table-driven, and the keys verl 0.9.1 itself refuses refused in one line with the fix."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

MODEL = "actor_rollout_ref.model.path=/m"


@pytest.mark.parametrize(
    "override,fix",
    [
        ("+actor_rollout_ref.actor.policy_loss.tau_pos=1.0", "actor_rollout_ref.actor.tau_pos"),
        ("+actor_rollout_ref.actor.policy_loss.tau_neg=1.05", "actor_rollout_ref.actor.tau_neg"),
    ],
)
def test_sapo_temperatures_under_policy_loss_are_refused_as_verl_0_9_refuses_them(override, fix):
    """verl 0.9.1's PolicyLossConfig has no tau_pos/tau_neg (hydra's instantiate raises a TypeError); SAPO reads them
    from the actor in verl and rlrig, where they take effect."""
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, override])
    text = str(e.value)
    assert "\n" not in text and text.startswith(override[1:].split("=")[0]) and "set that" in text and fix in text
    cfg = parse_overrides([MODEL, f"{fix}=1.5"])
    assert getattr(cfg.actor_rollout_ref.actor, fix.rsplit(".", 1)[1]) == 1.5  # the place SAPO reads


QUARTER_MIB = [(f"w{i}", (2**16,), torch.float32) for i in range(16)]  # 16 tensors of 256 KiB, none sent alone


@pytest.mark.parametrize("megabytes,transfers", [(None, 1), (1, 4), (2, 2), (4, 1)])
def test_update_weights_bucket_megabytes_is_the_weight_syncs_bucket(megabytes, transfers):
    """verl 0.9's rollout.checkpoint_engine.update_weights_bucket_megabytes (bytes = MiB << 20) cuts the weights into
    transfers: the rollout pool's broadcasts (both sides) and SGLang's update_weights_from_tensor calls."""
    from rlrig.trainer.rollout.engines.sglang_engine import buckets as sglang_buckets
    from rlrig.trainer.rollout.weight_sync import Entry, buckets

    key = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
    cfg = parse_overrides([MODEL] + ([f"{key}={megabytes}"] if megabytes else []))
    limit = cfg.actor_rollout_ref.rollout.checkpoint_engine.bucket_bytes
    assert limit == (megabytes or 512) << 20
    assert len(buckets([Entry(*e) for e in QUARTER_MIB], limit)) == transfers
    weights = [(n, torch.zeros(s, dtype=d)) for n, s, d in QUARTER_MIB]
    assert len(list(sglang_buckets(iter(weights), torch.float32, limit))) == transfers


def test_the_pools_both_sides_cut_by_the_configured_bucket():
    from rlrig.trainer.workers.actor_weights import ActorWeights
    from rlrig.trainer.workers.rollout_worker import RolloutWorker

    cfg = parse_overrides([MODEL, "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=3"])
    seen = []
    sync = SimpleNamespace(
        send=lambda tensors, bucket_bytes, own=None: seen.append(("send", bucket_bytes)) or 0,
        receive=lambda in_place, bucket_bytes: seen.append(("receive", bucket_bytes)) or iter(()),
    )
    sender = ActorWeights.__new__(ActorWeights)
    actor = SimpleNamespace(
        module=torch.nn.Linear(1, 1), param_offload=False, precision=SimpleNamespace(param_dtype=None)
    )
    sender.cfg, sender.models, sender.device, sender.sync, sender._sent_from = (
        cfg,
        SimpleNamespace(actor=actor),
        torch.device("cpu"),
        sync,
        None,
    )
    sender.tensors = lambda dtype: iter(())
    sender.push()
    receiver = RolloutWorker.__new__(RolloutWorker)
    receiver.cfg, receiver.sync, receiver.layout = cfg, sync, None
    receiver.engine = SimpleNamespace(in_place=None, sync_weights=lambda w: list(w))
    receiver.report, receiver.step = SimpleNamespace(during=lambda *a: contextlib.nullcontext()), 0
    getattr(RolloutWorker.receive_weights, "__wrapped__", RolloutWorker.receive_weights)(receiver, 1)
    assert seen == [("send", 3 << 20), ("receive", 3 << 20)]


def test_a_bucket_of_no_megabytes_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=0"])
    assert "update_weights_bucket_megabytes" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides,environ,kwargs",
    [
        ([], {}, {"log_to_driver": True}),
        (["ray_kwargs.ray_init.num_cpus=3"], {}, {"log_to_driver": True, "num_cpus": 3}),
        # joining a running cluster: its size is its own
        (["ray_kwargs.ray_init.num_cpus=3"], {"RAY_ADDRESS": "h:6379"}, {"log_to_driver": True}),
        # verl's default runtime_env.py_executable=null is no field for Ray
        (["ray_kwargs.ray_init.runtime_env.py_executable=null"], {}, {"log_to_driver": True}),
        (
            [
                "+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=INFO",
                "+ray_kwargs.ray_init.runtime_env.env_vars.CUDA_LAUNCH_BLOCKING=1",
                "+ray_kwargs.ray_init.runtime_env.env_vars.X=true",
                "+ray_kwargs.ray_init.runtime_env.working_dir=/code",
                "ray_kwargs.ray_init.runtime_env.py_executable='uv run'",
            ],
            {},
            {
                "log_to_driver": True,
                "runtime_env": {
                    "env_vars": {"NCCL_DEBUG": "INFO", "CUDA_LAUNCH_BLOCKING": "1", "X": "true"},
                    "working_dir": "/code",
                    "py_executable": "uv run",
                },
            },
        ),
    ],
)
def test_ray_init_takes_ray_kwargs_ray_init_as_verl_passes_it(overrides, environ, kwargs, monkeypatch):
    """verl's main_ppo: ray.init(**ray_kwargs.ray_init) with its runtime_env; env_vars' values as the text Ray takes."""
    import sys

    from rlrig.trainer.driver import prepare

    cfg = parse_overrides([MODEL, *overrides])
    assert prepare.ray_init_kwargs(cfg, environ) == kwargs
    called = []
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(init=lambda **kw: called.append(kw)))
    monkeypatch.setattr(prepare.os, "environ", environ)
    prepare.start_ray(cfg)
    assert called == [kwargs]


@pytest.mark.parametrize(
    "key",
    [
        "actor_rollout_ref.actor.fsdp_config.use_orig_params",
        "actor_rollout_ref.ref.fsdp_config.use_orig_params",
        "critic.model.fsdp_config.use_orig_params",
        "critic.fsdp.use_orig_params",
    ],
)
@pytest.mark.parametrize("value", ["True", "False"])
def test_use_orig_params_is_taken_at_any_value_with_its_reason(key, value):
    """verl's FSDP engine passes use_orig_params to FSDP1 alone; FSDP2's parameters are the originals."""
    from rlrig.trainer.config import verl_keys

    before = parse_overrides([MODEL])
    assert parse_overrides([MODEL, f"{key}={value}"]) == before
    canonical = verl_keys.ALIASES.get(key, key)
    assert "FSDP1" in verl_keys.NO_EFFECT[canonical]


@pytest.mark.parametrize(
    "overrides,error",
    [
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.policy_loss.dro_beta=0.1"],
            None,
        ),
        # verl reads dro_beta only in its DRO loss
        (["actor_rollout_ref.actor.policy_loss.dro_beta=0.1"], None),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=dro"], "set actor_rollout_ref.actor.policy_loss.dro_beta"),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.policy_loss.dro_beta=0"],
            "actor_rollout_ref.actor.policy_loss.dro_beta",
        ),
    ],
)
def test_dro_needs_a_positive_beta_as_verl(overrides, error):
    from rlrig.trainer.config.validation import validate

    if error is None:
        validate(parse_overrides([MODEL, *overrides]))
        return
    with pytest.raises(ConfigError) as e:
        validate(parse_overrides([MODEL, *overrides]))
    assert error in str(e.value) and "\n" not in str(e.value)


def test_dro_loss_moves_the_policy_as_its_formula():
    """-(logp A - beta/2 (logp - old)^2): at logp = old the gradient is -A per token; beta pulls logp back to old."""
    from rlrig.trainer.algos import policy_losses
    from rlrig.trainer.config.schema import ActorConfig

    a = ActorConfig()
    a.policy_loss.dro_beta = 2.0
    old = torch.tensor([[-1.0, -2.0]])
    logp = old.clone().requires_grad_()
    loss, metrics = policy_losses.get("dro").fn(
        old, logp, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), a, "token-sum"
    )
    loss.backward()
    assert logp.grad.tolist() == [[-1.0, 1.0]] and float(metrics["actor/ppo_kl"]) == 0.0


@pytest.mark.parametrize(
    "overrides,error",
    [
        (["algorithm.adv_estimator=gdpo", "+algorithm.gdpo_reward_keys=[acc,fmt]"], None),
        (
            [
                "algorithm.adv_estimator=gdpo",
                "algorithm.gdpo_reward_keys=[acc,fmt]",
                "algorithm.gdpo_reward_weights=[1,2]",
            ],
            None,
        ),
        (["algorithm.gdpo_reward_keys=[acc]"], None),  # read by gdpo alone, as in verl
        (["algorithm.adv_estimator=gdpo"], "set algorithm.gdpo_reward_keys"),
        (
            [
                "algorithm.adv_estimator=gdpo",
                "algorithm.gdpo_reward_keys=[acc,fmt]",
                "algorithm.gdpo_reward_weights=[1]",
            ],
            "1 weights for 2 algorithm.gdpo_reward_keys",
        ),
    ],
)
def test_gdpo_needs_its_reward_keys_as_verl(overrides, error):
    if error is None:
        cfg = parse_overrides([MODEL, "actor_rollout_ref.rollout.n=2", *overrides])
        assert cfg.algorithm.gdpo_reward_keys
        return
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, "actor_rollout_ref.rollout.n=2", *overrides])
    assert error in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["True", "False"])
def test_lora_merge_is_taken_at_either_value_as_rlrigs_merged_sync(value):
    """verl's model.lora.merge=True merges the adapter into the weights the engines get, which rlrig always does;
    False (verl's default) hands the engine the adapter, the same policy."""
    from rlrig.trainer.config import verl_keys

    lora = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=all-linear"]
    before = parse_overrides([MODEL, *lora])
    assert parse_overrides([MODEL, *lora, f"actor_rollout_ref.model.lora.merge={value}"]) == before
    assert "merged into the weights" in verl_keys.NO_EFFECT["actor_rollout_ref.model.lora.merge"]
    assert parse_overrides([MODEL, f"critic.model.lora.merge={value}"]) == parse_overrides([MODEL])
