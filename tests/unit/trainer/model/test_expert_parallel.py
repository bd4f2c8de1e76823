"""Expert parallelism over 2 Gloo ranks equals one process: each rank holds half of every layer's experts and its
own half of the global batch; the mean of the ranks' losses is the single process's loss on the whole batch, each
rank's expert gradients are the single process's for its experts, and the other gradients, averaged over the ranks
as data parallelism averages them, are the single process's."""

import copy

import pytest
import torch
import torch.distributed as dist

from tests.helpers import gloo_ranks

pytestmark = pytest.mark.process

_TOL = dict(rtol=1e-4, atol=1e-6)


def _equal_to_one_process(rank, world, family):
    from torch.distributed.device_mesh import init_device_mesh

    from rlrig.trainer.model.expert_parallel import ExpertParallelExperts, finish_grads, gather_experts, parallelize
    from tests.helpers.tiny_moe import build

    model, tok = build(family, seed=0)
    ep_model = copy.deepcopy(model)
    torch.manual_seed(1)
    ids = torch.randint(3, len(tok), (4, 12))  # the global batch, the same on every rank

    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()

    names = parallelize(ep_model, init_device_mesh("cpu", (world,)), grad_divisor=world)
    assert len(names) == 2  # one experts module per layer
    # moved as param_offload moves it: its parameters' tensors swapped, which drops any hook on them
    ep_model.double().float()
    half = ids.chunk(world)[rank]
    ep_loss = ep_model(input_ids=half, labels=half).loss
    ep_loss.backward()
    finish_grads(ep_model)

    mean_loss = ep_loss.detach().clone()
    dist.all_reduce(mean_loss)
    torch.testing.assert_close(mean_loss / world, loss.detach(), **_TOL)

    full = dict(model.named_parameters())
    for name, p in ep_model.named_parameters():
        ref = full[name].grad
        owner = ep_model.get_submodule(name.rpartition(".")[0])
        if isinstance(owner, ExpertParallelExperts):
            own = slice(owner.first, owner.first + owner.local)
            assert p.to_local().shape[0] == ref.shape[0] // world
            torch.testing.assert_close(p.grad.to_local(), ref[own], **_TOL)
            torch.testing.assert_close(p.detach().to_local(), full[name].detach()[own])
        else:
            g = p.grad.clone()
            dist.all_reduce(g)
            torch.testing.assert_close(g / world, ref, **_TOL)

    layer = ep_model.get_submodule(names[0])
    whole = model.get_submodule(names[0])
    gathered = gather_experts(layer)
    assert torch.equal(gathered["gate_up_proj"], whole.gate_up_proj.detach())
    assert torch.equal(gathered["down_proj"], whole.down_proj.detach())


def _sharded_equal_to_one_process(rank, world, ep):
    """FSDP2 with expert_parallel_size=ep over `world` Gloo ranks (rows of ep ranks; world > ep: the rows replicate
    the experts) against one process on the whole batch: the loss, every gradient, the clipped norm, the full
    tensors a weight sync reads, and a checkpoint's state gathered and loaded into a fresh sharded model."""
    from rlrig.trainer.model import parallel
    from rlrig.trainer.model.expert_parallel import ExpertParallelExperts, finish_grads
    from tests.helpers.tiny_moe import build

    model, tok = build("qwen3_moe", seed=0)
    sharded, fresh = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(1)
    ids = torch.randint(3, len(tok), (world * 2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])

    parallel.fsdp_shard(sharded, expert_parallel_size=ep)
    assert sum(isinstance(m, ExpertParallelExperts) for m in sharded.modules()) == 2
    mine = ids.chunk(world)[rank]
    sharded(input_ids=mine, labels=mine).loss.backward()
    finish_grads(sharded)
    torch.testing.assert_close(parallel.grad_norm_tensor(sharded, max_norm=1e9), norm, **_TOL)
    full = dict(model.named_parameters())
    for name, p in sharded.named_parameters():
        torch.testing.assert_close(p.grad.full_tensor(), full[name].grad, **_TOL)
    for name, t in parallel.full_tensors(sharded):
        assert torch.equal(t, model.state_dict()[name]), name

    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-2)
    opt.step()
    model_sd, optim_sd = parallel.gather_state(sharded, opt)
    if rank == 0:  # whole tensors, as one process holds them
        assert {k: v.shape for k, v in model_sd.items()} == {k: v.shape for k, v in model.state_dict().items()}
    shared = [model_sd, optim_sd]
    dist.broadcast_object_list(shared, src=0)
    parallel.fsdp_shard(fresh, expert_parallel_size=ep)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    fresh(input_ids=mine, labels=mine).loss.backward()  # the optimizer's state exists before it is loaded
    fresh_opt.step()
    parallel.load_state(fresh, fresh_opt, *shared)
    for (name, a), (_, b) in zip(parallel.full_tensors(sharded), parallel.full_tensors(fresh)):
        assert torch.equal(a, b), name
    again = parallel.gather_state(fresh, fresh_opt)[1]
    if rank == 0:
        for name, st in optim_sd["state"].items():
            for k, v in st.items():
                torch.testing.assert_close(again["state"][name][k], v)


def _no_tokens_for_one_rank(rank, world):
    """Every token of every rank routed to rank 0's experts, so rank 1's receive none: rank 1's backward still
    meets rank 0's in the all-to-all that brought rank 0 its tokens (it skipped it and left rank 0 waiting), and
    every gradient is the single process's on the whole batch."""
    from torch.distributed.device_mesh import init_device_mesh

    from rlrig.trainer.model.expert_parallel import ExpertParallelExperts, experts_modules, finish_grads
    from tests.helpers.tiny_moe import build

    model, _ = build("qwen3_moe", seed=0)
    whole = next(m for _, m in experts_modules(model))
    ep = ExpertParallelExperts(copy.deepcopy(whole), init_device_mesh("cpu", (world,)))
    assert ep.local >= 2  # experts 0 and 1 are both rank 0's
    torch.manual_seed(1)
    hidden = torch.randn(6 * world, whole.gate_up_proj.shape[-1], requires_grad=True)
    index = torch.tensor([[0, 1]] * hidden.shape[0])
    weights = torch.full(index.shape, 0.5)
    whole(hidden, index, weights).sum().backward()

    mine = slice(rank * 6, rank * 6 + 6)
    h = hidden.detach()[mine].clone().requires_grad_(True)
    ep(h, index[mine], weights[mine]).sum().backward()
    finish_grads(ep)
    torch.testing.assert_close(h.grad, hidden.grad[mine], **_TOL)
    own = slice(ep.first, ep.first + ep.local)
    for name in ("gate_up_proj", "down_proj"):
        torch.testing.assert_close(getattr(ep, name).grad.to_local(), getattr(whole, name).grad[own], **_TOL)


def test_a_rank_whose_experts_get_no_tokens_joins_the_backward():
    gloo_ranks.run(2, _no_tokens_for_one_rank)


class _ClampedExperts(torch.nn.Module):
    """An experts module in the fused layout whose family gates its own way (as step3p7's clamp)."""

    num_experts = 2

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.zeros(2, 4, 3))
        self.down_proj = torch.nn.Parameter(torch.zeros(2, 3, 2))

    def _apply_gate(self, gate_up_out):
        gate, up = gate_up_out.chunk(2, dim=-1)
        return gate.clamp(max=7.0) * up


def test_experts_that_gate_their_own_way_are_not_split():
    from rlrig.trainer.model.expert_parallel import experts_modules, refusal

    model = torch.nn.Sequential(_ClampedExperts())
    assert list(experts_modules(model)) == []
    assert "no experts module in transformers' fused layout" in refusal(model, 2)


# long: (2, 2), where CI runs (4, 2): the same rows with their experts replicated across two of them
@pytest.mark.parametrize("world, ep", [pytest.param(2, 2, marks=pytest.mark.long), (4, 2)])
def test_fsdp_with_expert_parallel_ranks_equals_one_process(world, ep):
    gloo_ranks.run(world, _sharded_equal_to_one_process, ep)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_two_expert_parallel_ranks_equal_one_process(family):
    gloo_ranks.run(2, _equal_to_one_process, family)


def test_a_model_without_fused_experts_is_refused():
    from rlrig.trainer.model.expert_parallel import parallelize

    with pytest.raises(ValueError, match="has no fused experts module"):
        parallelize(torch.nn.Linear(2, 2), mesh=None)


FSDP2 = ["actor_rollout_ref.actor.strategy=fsdp", "trainer.n_gpus_per_node=4"]
EP = "actor_rollout_ref.actor.fsdp_config.expert_parallel_size"


@pytest.mark.parametrize(
    "overrides, refusal",
    [
        ([*FSDP2, f"{EP}=2"], None),
        ([*FSDP2, f"{EP}=4", "actor_rollout_ref.ref.fsdp_config.expert_parallel_size=2"], None),
        (
            ["actor_rollout_ref.actor.strategy=ddp", "trainer.n_gpus_per_node=4", f"{EP}=2"],
            f"{EP}=2: experts split under FSDP2; set .*strategy=fsdp",
        ),
        ([*FSDP2, f"{EP}=3"], f"{EP}=3: it does not divide the role's 4 workers"),
        ([*FSDP2, f"{EP}=0"], f"{EP}=0: a number of workers, at least 1"),
        ([*FSDP2, "critic.model.fsdp_config.expert_parallel_size=2"], "expert parallelism for the critic is not in"),
        (
            [*FSDP2, f"{EP}=2", "actor_rollout_ref.model.lora_rank=4"],
            f"{EP}=2: with LoRA is not in rlrig; set actor_rollout_ref.model.lora_rank=0",
        ),
        (
            [*FSDP2, f"{EP}=2", "actor_rollout_ref.actor.fsdp_config.offload_policy=True"],
            f"{EP}=2: with FSDP2's offload policy is not in rlrig: .*set offload_policy=False",
        ),
        (
            [
                *FSDP2,
                f"{EP}=2",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                "actor_rollout_ref.model.use_remove_padding=True",
            ],
            f"{EP}=2: with Ulysses sequence parallelism is not in rlrig",
        ),
        (
            [
                *FSDP2,
                "actor_rollout_ref.ref.fsdp_config.expert_parallel_size=2",
                "actor_rollout_ref.ref.enable_resource_pool=True",
                "actor_rollout_ref.ref.nnodes=1",
                "actor_rollout_ref.ref.n_gpus_per_node=1",
            ],
            "ref.fsdp_config.expert_parallel_size=2: the reference's own pool holds whole copies",
        ),
    ],
)
def test_expert_parallel_size_is_taken_where_built_and_refused_in_one_line_elsewhere(overrides, refusal):
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    if refusal is None:
        parse_overrides(overrides)
        return
    with pytest.raises(ConfigError, match=refusal):
        parse_overrides(overrides)


@pytest.mark.parametrize(
    "family, ep, why",
    [
        ("qwen3_moe", 2, None),
        ("qwen3_moe", 3, "the model's 8 experts do not split evenly over 3 ranks"),
        ("dense", 2, "has no experts module in transformers' fused layout"),
    ],
)
def test_the_start_up_check_reads_the_model(tmp_path, family, ep, why):
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.rollout.engines import engine_class
    from rlrig.trainer.workers.start_checks import expert_parallel_refusal
    from tests.helpers import tiny_moe

    if family == "dense":
        from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

        path = ensure_tiny_model()
    else:
        path = tiny_moe.ensure(family)
    cfg = parse_overrides(["actor_rollout_ref.actor.strategy=fsdp"])
    cfg.actor_rollout_ref.actor.fsdp_config.expert_parallel_size = ep  # the workers' count is not this check's
    got = expert_parallel_refusal(cfg, path, engine_class("vllm"))
    assert (got is None) if why is None else (why in got), got
    hf = expert_parallel_refusal(cfg, path, engine_class("hf"))
    assert f"{EP}={ep}: the hf engine generates with a whole copy of the actor's modules" in hf
