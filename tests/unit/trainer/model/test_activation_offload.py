"""Activation offload (model/activation_offload.py) on CPU, where the tests make every saved tensor move (a copy into
new host memory) to show the arithmetic does not change: the same loss and gradients as without it, with and without
gradient checkpointing and LoRA; the blocks' weights never move; eval and no-grad forwards move nothing. On CUDA the
memory it saves: tests/gpu."""

import pytest
import torch

from rlrig.trainer.embedded.synthetic import Shape, ensure_model
from rlrig.trainer.model import activation_offload
from rlrig.trainer.model.build import set_checkpointing
from rlrig.trainer.workers.step.request import StepRequest

pytestmark = pytest.mark.process

SHAPE = Shape(512, 64, 128, 3, 4, 2, 256)


def model(lora: bool = False):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(ensure_model(SHAPE), dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)  # the same adapters in both models (nonzero B: the base's gradients flow through them)
        m = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    return m.train()


class EveryTensor(activation_offload.Offloader):
    """Moves whatever the block saves (not only device tensors), keeping what it packed to check afterwards."""

    def __init__(self):
        super().__init__(moves=lambda t: True)
        self.packed = []

    def pack(self, t):
        out = super().pack(t)
        self.packed.append((t, out))
        return out


def loss_and_grads(m, ids):
    m.zero_grad(set_to_none=True)
    logits = m(input_ids=ids, use_cache=False).logits  # as the trainer's forwards
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "checkpointing,lora",
    [(False, False), (True, False), (True, True), (False, True)],
)
def test_offloaded_forwards_give_the_same_loss_and_gradients(checkpointing, lora):
    ids = torch.randint(0, SHAPE.vocab_size, (4, 48), generator=torch.Generator().manual_seed(0))
    plain = model(lora)
    set_checkpointing(plain, checkpointing)  # transformers' own checkpointing, as without offload
    want_loss, want_grads = loss_and_grads(plain, ids)

    m = model(lora)
    off = activation_offload.enable(m, checkpointing, EveryTensor())
    calls = []
    q = next(mod for name, mod in m.named_modules() if name.endswith("layers.0.self_attn.q_proj"))
    q.register_forward_hook(lambda *a: calls.append(torch.is_grad_enabled()))
    loss, grads = loss_and_grads(m, ids)

    assert loss == want_loss
    assert set(grads) == set(want_grads) and grads  # LoRA: the adapters only
    for name, g in grads.items():
        torch.testing.assert_close(g, want_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    # checkpointed: the forward without grad, then its recompute in the backward
    assert calls == ([False, True] if checkpointing else [True])
    assert off.moved_bytes > 0
    weights = {p.untyped_storage().data_ptr() for p in m.parameters()}
    moved = [(t, out) for t, out in off.packed if isinstance(out, tuple)]
    kept = [t for t, out in off.packed if not isinstance(out, tuple)]
    assert moved and all(t.untyped_storage().data_ptr() not in weights for t, _ in moved)
    assert all(t.untyped_storage().data_ptr() in weights for t in kept)
    assert all(out[1].untyped_storage().data_ptr() != t.untyped_storage().data_ptr() for t, out in moved)
    if checkpointing:  # only each block's inputs are saved, and they are what moves
        assert len(moved) <= 5 * SHAPE.num_hidden_layers, len(moved)


def test_eval_and_no_grad_forwards_move_nothing():
    m = model()
    off = activation_offload.enable(m, True, EveryTensor())
    ids = torch.randint(0, SHAPE.vocab_size, (2, 16))
    with torch.no_grad():
        m(input_ids=ids)
    m.eval()
    m(input_ids=ids).logits.sum().backward()
    assert off.moved_bytes == 0 and off.packed == []


def test_on_cpu_nothing_moves_by_default():
    m = model()
    off = activation_offload.enable(m, False)
    loss_and_grads(m, torch.randint(0, SHAPE.vocab_size, (2, 16)))
    assert off.moved_bytes == 0


@pytest.mark.parametrize(
    "checkpointing,extra",
    [(True, []), (False, []), (False, ["actor_rollout_ref.actor.use_prefix_grouper=True"])],
    ids=["checkpointing", "plain", "prefix-grouper"],
)
def test_a_worker_step_under_fsdp_with_offload_equals_one_without(checkpointing, extra):
    """verl's multi-turn interaction example sets offload and checkpointing; one rank, Gloo."""
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    keys = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean")
    out = {}
    for offload in (False, True):
        with single_worker(
            [
                *EMBEDDED,
                "actor_rollout_ref.rollout.name=hf",
                "actor_rollout_ref.actor.strategy=fsdp",
                f"actor_rollout_ref.model.enable_gradient_checkpointing={checkpointing}",
                f"actor_rollout_ref.model.enable_activation_offload={offload}",
                *extra,
            ]
        ) as (w, batches):
            out[offload] = [w.step(StepRequest(next(batches), global_step=s + 1, kl_coef=0.001)) for s in range(2)]
    for a, b in zip(out[False], out[True]):
        assert [b[k] for k in keys] == pytest.approx([a[k] for k in keys], rel=1e-5, abs=1e-7)
