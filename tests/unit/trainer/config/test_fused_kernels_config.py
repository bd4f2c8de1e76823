"""actor_rollout_ref.model.use_fused_kernels and fused_kernel_options.impl_backend are rlrig keys that act (the
fused head, model/fused_logprobs.py): shown by --print-config, and what rlrig does not implement with them refused in
one line."""

import pytest

from rlrig.trainer.config import verl_keys
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

ON = "actor_rollout_ref.model.use_fused_kernels=True"


@pytest.mark.parametrize(
    "overrides, refused",
    [
        (
            [ON, "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton"],
            "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton: verl's triton kernel for the fused "
            "head is not in rlrig; use impl_backend=torch (the same numbers, a chunk of tokens at a time)",
        ),
        (
            [ON, "actor_rollout_ref.model.fused_kernel_options.impl_backend=liger"],
            "actor_rollout_ref.model.fused_kernel_options.impl_backend=liger: verl's liger kernel for the fused "
            "head is not in rlrig; use impl_backend=torch (the same numbers, a chunk of tokens at a time)",
        ),
        (
            [ON, "actor_rollout_ref.model.fused_kernel_options.impl_backend=cuda"],
            "actor_rollout_ref.model.fused_kernel_options.impl_backend='cuda': choose one of torch, triton, liger "
            "(rlrig implements torch)",
        ),
        (
            [ON, "actor_rollout_ref.actor.calculate_sum_pi_squared=True"],
            "actor_rollout_ref.actor.calculate_sum_pi_squared=True is not supported with "
            "actor_rollout_ref.model.use_fused_kernels=True: fused kernels do not materialize the full logits "
            "needed for sum_pi_squared (verl refuses it too); set one of them False",
        ),
        (
            [ON, "actor_rollout_ref.actor.use_prefix_grouper=True"],
            "actor_rollout_ref.actor.use_prefix_grouper=True with actor_rollout_ref.model.use_fused_kernels=True is "
            "not in rlrig (the shared prompts' forward predicts for a prompt, not a sample); set one of them False",
        ),
        (
            ["actor_rollout_ref.actor.use_fused_kernels=True"],
            "actor_rollout_ref.actor.use_fused_kernels=True with actor_rollout_ref.model.use_fused_kernels=False: "
            "verl's workers read only the model's key; set actor_rollout_ref.model.use_fused_kernels (and drop the "
            "actor's)",
        ),
        # accepted: the torch backend by default or by name, padded or packed, sequence parallel, and the
        # backend's name unread while the head is not fused (verl reads it only then)
        ([ON], None),
        ([ON, "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch"], None),
        ([ON, "actor_rollout_ref.actor.use_fused_kernels=True"], None),
        (["actor_rollout_ref.model.fused_kernel_options.impl_backend=triton"], None),
        (
            [
                ON,
                "actor_rollout_ref.model.use_remove_padding=True",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                "trainer.n_gpus_per_node=2",
            ],
            None,
        ),
    ],
)
def test_fused_kernel_settings_accepted_or_refused_in_one_line(overrides, refused):
    if refused is None:
        parse_overrides(overrides)
        return
    with pytest.raises(ConfigError) as e:
        parse_overrides(overrides)
    assert str(e.value) == refused


@pytest.mark.parametrize("model_value", [False, True])
def test_the_actors_copy_follows_the_models_key_and_print_config_shows_both(model_value):
    cfg = parse_overrides([f"actor_rollout_ref.model.use_fused_kernels={model_value}"])
    shown = cfg.described()
    assert shown["actor_rollout_ref"]["model"]["use_fused_kernels"] is model_value
    assert shown["actor_rollout_ref"]["model"]["fused_kernel_options"] == {"impl_backend": "torch"}
    assert shown["actor_rollout_ref"]["actor"]["use_fused_kernels"] is model_value
    no_effect = shown["_no_effect_in_rlrig"]
    assert not any(k.startswith("actor_rollout_ref.") and "fused_kernel" in k for k in no_effect)
    assert "reward_model.model.use_fused_kernels" in verl_keys.NO_EFFECT  # the reward model computes no log-probs


def test_the_forward_options_take_the_key():
    from rlrig.trainer.model.forward import ForwardOptions

    assert ForwardOptions.of(parse_overrides([ON])).fused_head
    assert not ForwardOptions.of(parse_overrides([])).fused_head
