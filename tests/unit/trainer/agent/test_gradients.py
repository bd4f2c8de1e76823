"""A multi-turn sample trains the model on its own tokens only: the tool's and the user's tokens get no gradient, and
the model's turns get exactly the gradient they get as single-turn samples (the first turn as a response to the
prompt, the second as a response to everything before it). The actor's loss as the update computes it: the real
forward, the clipped policy loss, the entropy bonus and the KL loss, each aggregated over the response mask."""

import pytest
import torch

from rlrig.trainer.algos import core_algos as algos
from rlrig.trainer.algos import policy_losses
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.embedded.tiny_model import build_model
from rlrig.trainer.embedded.tool_model import build_tool_tokenizer, call_text
from rlrig.trainer.model.forward import ForwardOptions, token_logprobs

TOK = build_tool_tokenizer()
ACTOR = parse_overrides([]).actor_rollout_ref.actor


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


PROMPT = ids("<tools>37*48=")
TURN1 = ids(call_text(37, 48) + TOK.eos_token)
TOOL = ids("<tool_response>1776</tool_response>")
TURN2 = ids("#### 1776" + TOK.eos_token)


def loss_and_logits(model, prompt, response, mask, adv, ref_shift):
    """The actor's loss on one sample (as workers/ppo_update.py composes it) and the logits it is computed from, their
    gradient kept."""
    seen = {}
    head = model.get_output_embeddings()

    def keep(module, args, out):
        out.retain_grad()
        seen["logits"] = out

    hook = head.register_forward_hook(keep)
    input_ids = torch.tensor([prompt + response])
    attention = torch.ones_like(input_ids)
    logp, ent = token_logprobs(model, input_ids, attention, len(prompt), ForwardOptions(with_entropy=True))
    hook.remove()
    m = torch.tensor([mask], dtype=torch.float)
    old = logp.detach() - 0.1  # a ratio away from 1, inside the clip range
    agg = "seq-mean-token-sum"  # a token's share does not depend on how many tokens the sample has
    pg, _ = policy_losses.get("vanilla").fn(old, logp, torch.full_like(logp, adv), m, ACTOR, agg)
    kl = algos.agg_loss(algos.kl_penalty(logp, logp.detach() + ref_shift, "low_var_kl"), m, agg)
    return pg - 0.01 * algos.agg_loss(ent, m, agg) + 0.1 * kl, seen["logits"]


@pytest.mark.parametrize("adv", [1.0, -0.5])
def test_tool_tokens_get_no_gradient_and_the_models_turns_their_single_turn_gradient(adv):
    torch.manual_seed(0)
    model = build_model(TOK, max_positions=128).double()
    multi = TURN1 + TOOL + TURN2
    mask = [1] * len(TURN1) + [0] * len(TOOL) + [1] * len(TURN2)
    ref_shift = 0.05

    def param_grads(loss):
        model.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    loss, logits = loss_and_logits(model, PROMPT, multi, mask, adv, ref_shift)
    g_multi = param_grads(loss)
    dlogits = logits.grad[0]  # [response positions, vocabulary]: the position before each response token
    tool = slice(len(TURN1), len(TURN1) + len(TOOL))
    assert torch.count_nonzero(dlogits[tool]) == 0  # the tool's tokens: no gradient at all
    assert torch.count_nonzero(dlogits[: len(TURN1)]) > 0 and torch.count_nonzero(dlogits[tool.stop :]) > 0

    loss1, logits1 = loss_and_logits(model, PROMPT, TURN1, [1] * len(TURN1), adv, ref_shift)
    g1 = param_grads(loss1)
    loss2, logits2 = loss_and_logits(model, PROMPT + TURN1 + TOOL, TURN2, [1] * len(TURN2), adv, ref_shift)
    g2 = param_grads(loss2)
    # each turn's logits get the gradient they get as a single-turn response ...
    torch.testing.assert_close(dlogits[: len(TURN1)], logits1.grad[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(dlogits[tool.stop :], logits2.grad[0], rtol=1e-9, atol=1e-12)
    # ... so the weights get the sum of the two single-turn samples' gradients (up to the rotary embedding, which
    # transformers computes in float32 whatever the model's dtype)
    for a, b, c in zip(g_multi, g1, g2):
        torch.testing.assert_close(a, b + c, rtol=1e-4, atol=1e-6)
