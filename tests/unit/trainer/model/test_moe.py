"""An MoE's routers seen from the trainer (model/moe.py), on a tiny random Qwen3-MoE and Mixtral: the auxiliary
load-balancing loss over the real tokens equals transformers' own with an attention mask, packed or padded; the
expert-load statistics count each real token's top-k picks once; routing recorded and replayed: the model's own
routing replayed gives the same log-probs, another routing changes them and is the routing the routers then use."""

import pytest
import torch

from rlrig.trainer.model import moe
from rlrig.trainer.model.forward import ForwardOptions, token_logprobs
from tests.helpers import tiny_moe


def _batch(vocab: int, seed: int = 0):
    """Left-padded prompts of 3..6 tokens and right-padded responses of 2..5, as the engines return them."""
    g = torch.Generator().manual_seed(seed)
    prompt_len, resp_len, rows = 6, 5, 4
    ids = torch.randint(3, vocab, (rows, prompt_len + resp_len), generator=g)
    mask = torch.zeros_like(ids)
    for r, (p, n) in enumerate(((3, 5), (6, 2), (4, 4), (5, 3))):
        mask[r, prompt_len - p : prompt_len + n] = 1
    return ids * mask, mask, prompt_len


def _moe_model(family: str, **conf):
    model, _ = tiny_moe.build(family)
    for k, v in conf.items():
        setattr(model.config, k, v)
    return model.eval()


@pytest.mark.parametrize("family", tiny_moe.FAMILIES)
@pytest.mark.parametrize("packed", [False, True])
def test_the_aux_loss_is_transformers_own_over_the_real_tokens(family, packed):
    model = _moe_model(family, output_router_logits=True, router_aux_loss_coef=0.02)
    spec = moe.MoeSpec.of(model)
    assert (spec.num_experts, spec.top_k, spec.aux_coef) == (8, 2, 0.02)
    ids, mask, p = _batch(model.config.vocab_size)
    tap = moe.RouterTap(spec, spec.routers(model), with_aux=True, stats=None)
    token_logprobs(model, ids, mask, p, ForwardOptions(remove_padding=packed, tap=tap))
    ours = tap.take_aux()
    # the padded forward leaves out the last column (it predicts nothing scored); the packed one holds every token
    cut = slice(None) if packed else slice(None, -1)
    want = model(input_ids=ids[:, cut], attention_mask=mask[:, cut], output_router_logits=True).aux_loss
    torch.testing.assert_close(ours, want)
    assert ours.requires_grad and tap.take_aux() is None


def test_padding_is_left_out_of_the_aux_loss():
    model = _moe_model("qwen3_moe", output_router_logits=True)
    ids, mask, p = _batch(model.config.vocab_size)
    spec = moe.MoeSpec.of(model)
    tap = moe.RouterTap(spec, spec.routers(model), with_aux=True, stats=None)
    token_logprobs(model, ids, mask, p, ForwardOptions(remove_padding=True, tap=tap))
    with_pad = model(input_ids=ids, output_router_logits=True).aux_loss  # every column counted, pad included
    assert not torch.allclose(tap.take_aux(), with_pad)


def test_no_aux_loss_unless_the_config_asks_and_a_dense_model_has_no_spec():
    from rlrig.trainer.embedded.tiny_model import build_model, build_tokenizer

    assert moe.MoeSpec.of(_moe_model("qwen3_moe")).aux_coef == 0  # output_router_logits defaults to False
    assert moe.MoeSpec.of(_moe_model("mixtral", output_router_logits=True, router_aux_loss_coef=0.0)).aux_coef == 0
    assert moe.MoeSpec.of(build_model(build_tokenizer())) is None


@pytest.mark.parametrize("packed", [False, True])
def test_load_stats_count_each_real_tokens_picks(packed):
    model = _moe_model("mixtral")
    spec = moe.MoeSpec.of(model)
    ids, mask, p = _batch(model.config.vocab_size)
    stats = moe.LoadStats()
    tap = moe.RouterTap(spec, spec.routers(model), with_aux=True, stats=stats)
    assert tap.take_aux() is None  # no coefficient: no loss computed
    with torch.no_grad():
        token_logprobs(model, ids, mask, p, ForwardOptions(remove_padding=packed, tap=tap))
    real = int(mask.sum() if packed else mask[:, :-1].sum())
    assert stats.counts.shape == (2, 8) and stats.counts.sum(1).tolist() == [2.0 * real] * 2
    assert float(stats.tokens) == real
    out = stats.read("actor/moe")
    assert stats.counts is None  # read starts over
    for name in ("max_vio", "min_vio", "avg_vio", "router_entropy"):
        assert {f"actor/moe/{name}/{s}" for s in ("layer_0", "layer_1", "max", "avg")} <= out.keys()
    assert -1 <= out["actor/moe/min_vio/layer_0"] <= 0 <= out["actor/moe/max_vio/layer_0"] <= 7
    assert 0 < out["actor/moe/router_entropy/layer_1"] <= torch.log(torch.tensor(8.0)).item() + 1e-6


def test_load_stats_read_as_verl_computes_them():
    stats = moe.LoadStats()
    logits = [torch.zeros(4, 4)]  # uniform router: entropy log 4
    picks = [torch.tensor([[0], [0], [1], [2]])]  # expert 0 twice, 1 and 2 once, 3 never
    stats.add(logits, picks, torch.ones(4), 4)
    out = stats.read("p")
    # share [0.5, 0.25, 0.25, 0] x 4 - 1 = [1, 0, 0, -1]
    assert out["p/max_vio/layer_0"] == 1.0 and out["p/min_vio/layer_0"] == -1.0 and out["p/avg_vio/layer_0"] == 0.5
    assert out["p/router_entropy/layer_0"] == pytest.approx(torch.log(torch.tensor(4.0)).item())


def test_without_a_tap_the_routers_are_not_hooked():
    model = _moe_model("qwen3_moe")
    spec = moe.MoeSpec.of(model)
    tap = moe.RouterTap(spec, spec.routers(model), with_aux=False, stats=moe.LoadStats())
    ids, mask, p = _batch(model.config.vocab_size)
    with tap.around(moe.Layout.padded(mask)):
        assert all(r._forward_hooks for r in tap.routers.values())
    assert not any(r._forward_hooks for r in tap.routers.values())


def test_shared_prompts_with_the_routers_recorded_are_refused_at_start_up():
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.workers.start_checks import moe_check

    path = tiny_moe.ensure("qwen3_moe")
    shared = "actor_rollout_ref.actor.use_prefix_grouper=True"
    metrics = "actor_rollout_ref.rollout.moe_load_balance_metrics_interval=1"
    aux = "+actor_rollout_ref.model.override_config.output_router_logits=True"
    for keys in ([shared, metrics], [shared, aux]):
        why = moe_check(parse_overrides([f"actor_rollout_ref.model.path={path}", *keys]), path)
        assert why.startswith("actor_rollout_ref.actor.use_prefix_grouper=True: ") and "\n" not in why
    assert moe_check(parse_overrides([f"actor_rollout_ref.model.path={path}", shared]), path) is None
    assert moe_check(parse_overrides([f"actor_rollout_ref.model.path={path}", metrics]), path) is None


def _record(model, ids, mask, p, packed, routing=None):
    """(log-probs, the routing the forward used [B, S, L, k]) with `routing` replayed, if given."""
    spec = moe.MoeSpec.of(model)
    tap = moe.RouterTap(spec, spec.routers(model), False, None, record=True, replay=routing is not None)
    tap.feed(routing)
    logp, _ = token_logprobs(model, ids, mask, p, ForwardOptions(remove_padding=packed, tap=tap))
    return logp, tap.recorded


@pytest.mark.parametrize("family", tiny_moe.FAMILIES)
@pytest.mark.parametrize("packed", [False, True])
def test_the_models_own_routing_replayed_gives_the_same_logprobs(family, packed):
    model = _moe_model(family)
    ids, mask, p = _batch(model.config.vocab_size)
    with torch.no_grad():
        plain, _ = token_logprobs(model, ids, mask, p, ForwardOptions(remove_padding=packed))
        logp, own = _record(model, ids, mask, p, packed)
        again, used = _record(model, ids, mask, p, packed, routing=own)
    torch.testing.assert_close(logp, plain)
    torch.testing.assert_close(again, plain, rtol=0, atol=1e-6)
    assert torch.equal(used, own)
    read = mask.bool() if packed else torch.cat((mask[:, :-1].bool(), torch.zeros_like(mask[:, :1].bool())), 1)
    assert own.shape == (*ids.shape, 2, 2) and (own[read] >= 0).all() and (own[~read] == -1).all()


@pytest.mark.parametrize("family", tiny_moe.FAMILIES)
@pytest.mark.parametrize("packed", [False, True])
def test_another_routing_replayed_is_the_one_used_and_changes_the_logprobs(family, packed):
    model = _moe_model(family)
    ids, mask, p = _batch(model.config.vocab_size)
    with torch.no_grad():
        plain, own = _record(model, ids, mask, p, packed)
    other = torch.where(own >= 0, (own + 3) % 8, own)  # every real token to other experts
    logp, used = _record(model, ids, mask, p, packed, routing=other)
    assert torch.equal(used, other)
    assert (logp - plain).abs().max() > 1e-3
    logp.sum().backward()  # the gates are the router's own probabilities: its weight still learns
    assert all(
        r.weight.grad is not None and r.weight.grad.abs().sum() > 0
        for r in moe.MoeSpec.of(model).routers(model).values()
    )


def test_tokens_without_recorded_routing_keep_the_routers_own_choice():
    model = _moe_model("qwen3_moe")
    ids, mask, p = _batch(model.config.vocab_size)
    with torch.no_grad():
        plain, own = _record(model, ids, mask, p, True)
        partial = torch.where(own >= 0, (own + 3) % 8, own)
        partial[:, : p + 2] = -1  # nothing recorded for the prompts and the first two response tokens
        _, used = _record(model, ids, mask, p, True, routing=partial)
    torch.testing.assert_close(used[:, : p + 2], own[:, : p + 2], rtol=0, atol=0)
    torch.testing.assert_close(used[:, p + 2 :], partial[:, p + 2 :], rtol=0, atol=0)


def test_routing_replay_is_refused_for_a_family_it_is_not_built_for():
    from transformers import AutoModelForCausalLM, OlmoeConfig

    conf = OlmoeConfig(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2)  # fmt: skip
    with torch.device("meta"):
        spec = moe.MoeSpec.of(AutoModelForCausalLM.from_config(conf))
    assert spec is not None and "not olmoe" in spec.replay_refusal()
    assert moe.MoeSpec.of(_moe_model("mixtral")).replay_refusal() is None


def test_an_engines_routed_experts_count_as_verl_counts_them():
    """verl's _compute_rollout_moe_load_counts: the response tokens' top-k picks, each sequence's last one left out."""
    routed = torch.tensor([[[[0, 1]], [[0, 2]], [[3, 3]]], [[[1, 2]], [[-1, -1]], [[0, 0]]]])  # [B=2, R=3, L=1, k=2]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    stats = moe.LoadStats(engine=True)
    stats.add_routed(routed, mask, 4, [0])
    # row 0: its first two tokens (the third is its last); row 1: its first (its second is its last)
    assert stats.counts.tolist() == [[2.0, 2.0, 2.0, 0.0]] and float(stats.tokens) == 3
    out = stats.read("rollout/moe")
    assert out["rollout/moe/routed_expert_assignments"] == 6 and out["rollout/moe/routed_experts_found"] == 1.0
    assert out["rollout/moe/max_vio/layer_0"] == pytest.approx(2 / 6 * 4 - 1)
    assert out["rollout/moe/min_vio/layer_0"] == -1.0 and not any("entropy" in k for k in out)


@pytest.mark.parametrize("family", tiny_moe.FAMILIES)
def test_replay_holds_through_gradient_checkpointings_recompute(family):
    """The backward pass runs each checkpointed layer again, its router included: it must route as the replayed
    forward did, so the gradients equal those of the same replay without checkpointing."""
    grads = []
    for checkpointing in (False, True):
        model = _moe_model(family).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ids, mask, p = _batch(model.config.vocab_size)
        with torch.no_grad():
            _, own = _record(model, ids, mask, p, True)
        spec = moe.MoeSpec.of(model)
        tap = moe.RouterTap(spec, spec.routers(model), False, None, replay=True)
        tap.feed(torch.where(own >= 0, (own + 3) % 8, own))
        logp, _ = token_logprobs(model, ids, mask, p, ForwardOptions(remove_padding=True, tap=tap))
        logp.sum().backward()
        tap.release()
        assert not any(r._forward_hooks for r in tap.routers.values())
        grads.append(torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0])


def _with_a_dense_layer():
    """A Qwen3-MoE of 3 layers whose middle one is dense (mlp_only_layers): its 2 routers sit in layers 0 and 2."""
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import build_tokenizer

    conf = tiny_moe.config("qwen3_moe", build_tokenizer())
    conf.num_hidden_layers, conf.mlp_only_layers = 3, [1]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(conf, dtype=torch.float32).eval()


def test_routing_is_laid_out_by_decoder_layer_where_a_layer_is_dense():
    """The engines record routed experts for every decoder layer (vLLM's and SGLang's [tokens, num_hidden_layers, k],
    a dense layer's left at 0): recorded routing takes the same layout, and replay reads each router's own layer."""
    model = _with_a_dense_layer()
    spec = moe.MoeSpec.of(model)
    assert sorted(spec.routers(model)) == [0, 2] and spec.num_layers == 3
    ids, mask, p = _batch(model.config.vocab_size)
    with torch.no_grad():
        plain, own = _record(model, ids, mask, p, True)
        assert own.shape == (*ids.shape, 3, 2) and (own[:, :, 1] == -1).all() and (own[:, :, [0, 2]] >= 0).any()
        engine = torch.where(own >= 0, (own + 3) % 8, own)
        engine[:, :, 1] = torch.where(own[:, :, 0] >= 0, 0, -1)  # the engine's filler in the dense layer
        logp, used = _record(model, ids, mask, p, True, routing=engine)
    assert torch.equal(used[:, :, [0, 2]], engine[:, :, [0, 2]]) and (used[:, :, 1] == -1).all()
    assert (logp - plain).abs().max() > 1e-3
    with pytest.raises(ValueError, match="recorded routing has 2 layers and the model 3"):
        moe.RouterTap(spec, spec.routers(model), False, None, replay=True).feed(engine[:, :, :2])
    stats = moe.LoadStats(engine=True)
    stats.add_routed(engine[:, p:], mask[:, p:], 8, sorted(spec.routers(model)))
    assert stats.counts.shape == (2, 8)  # the dense layer's filler is not counted as expert 0's load
    torch.testing.assert_close(stats.counts.sum(1), stats.counts.sum(1)[:1].expand(2))
