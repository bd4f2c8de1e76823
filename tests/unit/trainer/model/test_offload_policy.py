"""fsdp_config.offload_policy: FSDP2's CPUOffloadPolicy handed to fully_shard (verl's fsdp2 engine), for the trained
models and the reference. Two ranks in a real Gloo group with the embedded model: the policy reaches every FSDP unit,
the shards and their gradients are in host memory between steps, param_offload and optimizer_offload give way to it,
and the losses, gradient norms and weights after two AdamW steps are those of a run without it. On a CPU device the
policy's copies are host to host; the GPU's host-device copies are FSDP2's own."""

import os

import pytest
import torch

from tests.helpers import gloo_ranks

pytestmark = pytest.mark.process


def _offloaded(module) -> list[bool]:
    """Whether each FSDP unit's parameters were sharded under a CPU offload policy (FSDP2's own record of it)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    return [p.offload_to_cpu for u in units for p in u._get_fsdp_state()._fsdp_param_group.fsdp_params]


def _rank(rank, world, out_dir, policy):
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.model import parallel
    from rlrig.trainer.model.build import trainable
    from rlrig.trainer.model.precision import resolve

    torch.manual_seed(0)
    flags = [f"actor_rollout_ref.actor.fsdp_config.{k}=True" for k in ("param_offload", "optimizer_offload")]
    cfg = parse_overrides(
        ["trainer.device=cpu", f"actor_rollout_ref.actor.fsdp_config.offload_policy={policy}", *flags]
    )
    a = cfg.actor_rollout_ref
    module = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)
    prec = resolve(a.actor.fsdp_config, "cpu", "fsdp", "actor")
    t = trainable(module, torch.device("cpu"), prec, a.actor.optim, a.model, a.actor.fsdp_config)
    ids = torch.randint(0, module.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(rank))
    losses, norms = [], []
    for _ in range(2):
        loss = t.train(input_ids=ids, labels=ids).loss
        loss.backward()
        norms.append(parallel.grad_norm(t.module, 0.5))  # clipped: the norm's reduction and the clip both matter
        t.opt.step()
        t.opt.zero_grad(set_to_none=False)
        losses.append(loss.item())
    shards = [p.to_local() for p in t.module.parameters()]
    grads = [p.grad.to_local() for p in t.module.parameters() if p.grad is not None]
    moments = [v for s in t.opt.state.values() for k, v in s.items() if k != "step"]
    weights = dict(parallel.full_tensors(t.module))
    model_sd, _ = parallel.gather_state(t.module, t.opt)  # a checkpoint's gather runs under the policy too
    torch.save(
        {
            "losses": losses,
            "norms": norms,
            "weights": weights,
            "offloaded": _offloaded(t.module),
            "devices": {x.device.type for x in shards + grads + [m.to_local() for m in moments]},
            "flags": (t.param_offload, t.optimizer_offload),
            "gathered": sorted(model_sd) == sorted(weights) if rank == 0 else None,
        },
        os.path.join(out_dir, f"{rank}.pt"),
    )


def _run(tmp_path, policy: bool) -> list[dict]:
    out = tmp_path / str(policy)
    out.mkdir()
    gloo_ranks.run(2, _rank, str(out), policy)
    return [torch.load(out / f"{r}.pt") for r in range(2)]


def test_offload_policy_reaches_fully_shard_and_changes_no_number(tmp_path):
    with_policy, without = _run(tmp_path, True), _run(tmp_path, False)
    for got, plain in zip(with_policy, without):
        assert got["offloaded"] and all(got["offloaded"]) and not any(plain["offloaded"])
        assert got["devices"] == {"cpu"}
        # the policy holds the weights and the optimizer state in host memory: verl's own offload turns off
        assert got["flags"] == (False, False) and plain["flags"] == (True, True)
        assert got["losses"] == plain["losses"] and got["norms"] == plain["norms"]
        assert got["weights"].keys() == plain["weights"].keys()
        assert all(torch.equal(got["weights"][k], plain["weights"][k]) for k in got["weights"])
    assert with_policy[0]["gathered"]
    assert with_policy[0]["losses"] != with_policy[1]["losses"]  # each rank trained on its own rows


@pytest.mark.parametrize(
    "extra, refusal",
    [
        (["actor_rollout_ref.actor.strategy=fsdp2", "critic.fsdp.offload_policy=True"], None),
        (["actor_rollout_ref.actor.strategy=ddp", "critic.fsdp.offload_policy=True"], "keeps whole DDP replicas"),
        (
            [
                "actor_rollout_ref.actor.use_kl_loss=True",
                "actor_rollout_ref.ref.enable_resource_pool=True",
                "actor_rollout_ref.ref.nnodes=1",
                "actor_rollout_ref.ref.n_gpus_per_node=1",
                "actor_rollout_ref.ref.fsdp_config.offload_policy=True",
            ],
            "the reference's own pool holds whole copies",
        ),
    ],
)
def test_offload_policy_is_refused_where_fsdp2_does_not_shard(extra, refusal):
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    if refusal is None:
        cfg = parse_overrides(extra)
        assert cfg.critic.model.fsdp_config.offload_policy
        return
    with pytest.raises(ConfigError, match=refusal):
        parse_overrides(extra)
