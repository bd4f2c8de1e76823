"""One training worker per device: actor, rollout and reference colocated (verl's hybrid engine).

Workers train data parallel: each holds a shard of the prompts, and DDP or FSDP (actor.strategy)
averages gradients over all of them with torch.distributed (Gloo on CPU, NCCL on GPU), across nodes.
A step is a sequence of named phases (timing_s/<phase>); the pieces live in their own modules:
model/build.py (setup), reward/scoring.py, model/forward.py, the estimators/ and policy_losses/ registries,
workers/ppo_update.py, workers/checkpoint_state.py (checkpoints).
"""

from __future__ import annotations

import contextlib
import random
import socket
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from rlrig.trainer import metrics as M
from rlrig.trainer.algos import core_algos as algos
from rlrig.trainer.algos import estimators, pf_ppo, rollout_correction
from rlrig.trainer.batch import balance as balance_batch
from rlrig.trainer.model import build as models
from rlrig.trainer.model import lora, lr_schedule, offload, parallel, precision
from rlrig.trainer.model import micro_batches as batching
from rlrig.trainer.model.devices import gpu_index
from rlrig.trainer.model.forward import in_micro_batches, token_logprobs
from rlrig.trainer.model.forward import values as critic_values
from rlrig.trainer.reward import scoring as generate_score
from rlrig.trainer.reward.managers import overlong
from rlrig.trainer.reward.rules import load_reward_fn
from rlrig.trainer.rollout.engines import GREEDY, EngineContext, EngineUnavailable, Sampling, engine_class, make_engine
from rlrig.trainer.workers import checkpoint_state as worker_state
from rlrig.trainer.workers.ppo_update import mean_stats, update_actor, update_critic
from rlrig.trainer.workers.timing import Phases


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_address() -> tuple[str, int]:
    import ray

    return ray.util.get_node_ip_address(), free_port()


def ensure_local_embedded_model(path: str) -> None:
    """The embedded models (policy, reward model) are built where they are used (deterministic; DDP then
    broadcasts rank 0's weights), so a node without the head's filesystem, e.g. a second container, still has
    them. It must run before torch.distributed starts: transformers' save_pretrained then writes only on rank 0,
    and another rank's node would get the tokenizer without the model (seen with compose)."""
    import os

    from rlrig.trainer.embedded.tiny_model import cache_dir, ensure_tiny_model
    from rlrig.trainer.embedded.tiny_reward_model import ensure_tiny_reward_model, rm_cache_dir

    builders = {str(cache_dir()): ensure_tiny_model, str(rm_cache_dir()): ensure_tiny_reward_model}
    if not os.path.exists(path) and os.path.abspath(path) in builders:
        builders[os.path.abspath(path)]()


def probs_diff(engine_logp, actor_logp, mask) -> dict:
    """verl's rollout-vs-actor check: |p_engine - p_actor| per response token, after the last sync."""
    diff = (engine_logp.exp() - actor_logp.exp()).abs()[mask > 0]
    if diff.numel() == 0:
        return {}
    return {
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std(unbiased=False).item(),
    }


MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def moe_refusal(model_path: str, load_kwargs: dict, engine_cls) -> str | None:
    """transformers 5 fuses a mixture-of-experts model's expert weights into one tensor per layer, whose
    names vLLM's and SGLang's loaders do not know: syncing them would fail or, worse, load nothing.
    Until those names are mapped back, such a model rolls out with hf only."""
    if engine_cls.generates_with_actor_module:
        return None
    from transformers import AutoConfig

    conf = AutoConfig.from_pretrained(model_path, **load_kwargs)
    if any(getattr(conf, k, 0) for k in MOE_KEYS):
        return (
            f"{conf.model_type} is a mixture-of-experts model, whose fused expert weights rlrig cannot yet hand to "
            f"{engine_cls.name}; use actor_rollout_ref.rollout.name=hf"
        )
    return None


def allreduce_sum(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t


def start_rank(cfg, rank: int, world: int, master: tuple[str, int], model_paths: list[str | None]) -> torch.device:
    """Seeds, this rank's device, the embedded models it needs, and its process group (Gloo on CPU, NCCL on GPU)."""
    seed = cfg.trainer.seed + rank
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    torch.set_num_threads(1)
    dev, device = cfg.trainer.device, torch.device("cpu")
    if dev == "cuda" or (dev == "auto" and torch.cuda.is_available()):
        device = torch.device("cuda", gpu_index())
        torch.cuda.set_device(device)
        precision.allow_tf32()
    for path in model_paths:
        if path:
            ensure_local_embedded_model(path)  # before the process group: see there
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{master[0]}:{master[1]}",
        rank=rank,
        world_size=world,
        timeout=timedelta(minutes=10),
    )
    return device


class Worker:
    def __init__(
        self,
        cfg_dict: dict,
        rank: int,
        world: int,
        master: tuple[str, int],
        model_path: str,
        rm_path: str | None = None,
        rm_worker=None,
        ref_worker=None,
        critic_worker=None,
    ):
        """rm_path: the reward model (reward_model.enable); rm_worker, ref_worker, critic_worker: the handles of the
        own-pool workers this worker sends its samples to, or None to hold that model here (colocated)."""
        self.ref_worker, self.critic_worker = ref_worker, critic_worker
        from rlrig.trainer.config.schema import from_dict

        self.cfg = cfg = from_dict(cfg_dict)
        self.budgets = batching.token_budgets(cfg)
        self.rank, self.world = rank, world
        self.device = start_rank(cfg, rank, world, master, [model_path, rm_path if rm_worker is None else None])
        a = cfg.actor_rollout_ref
        self.estimator = estimators.get(cfg.algorithm.adv_estimator)
        self.tok = models.load_tokenizer(cfg, model_path)
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        engine_cls = engine_class(a.rollout.name)
        self.engine_error = moe_refusal(model_path, models.load_kwargs(a.model), engine_cls)
        if self.engine_error:
            self.engine = None
            return
        self.models = models.build(
            cfg,
            model_path,
            self.device,
            self.estimator.needs_critic and critic_worker is None,
            engine_cls.generates_with_actor_module,
            remote_ref=ref_worker is not None,
        )
        self.reward = self._reward_source(model_path, rm_path, rm_worker)
        # the ranks of one tensor-parallel engine sample the same tokens only from the same seed
        ctx = EngineContext(
            self.models.gen_module,
            self.tok,
            a.rollout,
            cfg.data.max_prompt_length,
            cfg.data.max_response_length,
            model_path,
            self.device.type,
            cfg.trainer.seed + rank // a.rollout.tensor_model_parallel_size,
            self.models.actor.precision.param_dtype if self.models.actor.precision.mixed else None,
        )
        try:
            self.engine = make_engine(engine_cls, ctx)
        except EngineUnavailable as e:  # reported by engine_name(): one line for the driver, not a dead actor
            self.engine, self.engine_error = None, str(e)
            return
        # the wrapper just broadcast rank 0's weights, which this node's copy on disk need not equal
        self._sync_engine()
        for t in (self.models.actor, self.models.critic):
            if t is not None and t.param_offload:
                t.module.to("cpu")  # param_offload: back on the device only for the phases that use it

    def _sync_engine(self) -> None:
        """The actor's weights into the rollout engine (merged with LoRA's adapters), every rank taking part."""
        m = self.models
        if m.gen_is_actor:
            return
        tensors = parallel.full_tensors(m.actor.module)
        if self.cfg.actor_rollout_ref.model.uses_lora:
            tensors = lora.merged(lora.scalings(m.actor.module), tensors)
        self.engine.sync_weights(tensors)

    def _reward_source(self, model_path: str, rm_path: str | None, rm_worker) -> generate_score.RewardSource:
        cfg, rf = self.cfg, self.cfg.custom_reward_function
        rm = cfg.reward_model
        fn = load_reward_fn(rf.path, rf.name) if not rm.enable or rf.path else None
        model = input_tok = self.rm_scorer = None  # rm_scorer: the reward model when it is held here
        if rm.enable:
            if rm_worker is not None:
                import ray

                model = lambda kind, inputs: ray.get(getattr(rm_worker, f"score_{kind}").remote(inputs))
            else:
                from rlrig.trainer.reward.reward_model import make_scorer, scorer_settings

                self.rm_scorer = make_scorer(rm, rm_path, self.device, *scorer_settings(cfg))
                model = lambda kind, inputs: getattr(self.rm_scorer, f"score_{kind}")(inputs)
            if rm.model.input_tokenizer is not None:
                from transformers import AutoTokenizer

                same = rm.model.input_tokenizer in ("", model_path)
                input_tok = self.tok if same else AutoTokenizer.from_pretrained(rm.model.input_tokenizer)
        return generate_score.RewardSource(fn, model, input_tok, cfg.data.prompt_key, overlong(rm))

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def engine_name(self) -> tuple[str | None, str | None]:
        """(engine name, None), or (None, why the configured engine could not start)."""
        if self.engine is None:
            return (
                None,
                f"actor_rollout_ref.rollout.name={self.cfg.actor_rollout_ref.rollout.name}: {self.engine_error}",
            )
        return self.engine.describe(), None

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def evaluate(self, rows) -> tuple[list[float], list[str], list[dict]]:
        """Validation with rollout.val_kwargs: each prompt's n scores, texts and reward-function fields, prompt by prompt."""
        vk = self.cfg.actor_rollout_ref.rollout.val_kwargs
        ro = self.engine.generate([r["input_ids"] for r in rows], vk.n, Sampling.of(vk))
        scores, texts, extras = generate_score.score(self.tok, self.reward, rows, ro, vk.n)
        return scores.tolist(), texts, extras

    def _agree_max(self, k: int) -> int:
        t = torch.tensor([k], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _parts(self, ro, start: int, stop: int, micro: int | None, budget_key: str) -> list:
        """Micro batches of rows start..stop-1: `micro` rows each, or by the pass's token budget (use_dynamic_bsz)."""
        return batching.rows(ro.attention_mask, start, stop, micro, self.budgets[budget_key], self._agree_max)

    def _logprobs(self, module, ro, micro, prec, budget_key) -> torch.Tensor:
        """No-grad log-probs in micro batches; `module` is the bare model (under DDP, the wrapper's
        forward would broadcast buffers: a collective for a pass that needs none)."""
        a = self.cfg.actor_rollout_ref

        def part(sl):
            with prec.autocast():
                return token_logprobs(
                    module,
                    ro.input_ids[sl],
                    ro.attention_mask[sl],
                    ro.prompt_len,
                    remove_padding=a.model.use_remove_padding,
                    share_prompts=a.actor.use_prefix_grouper,
                )[0]

        return in_micro_batches(self._parts(ro, 0, len(ro.input_ids), micro, budget_key), part)

    def _values(self, ro) -> torch.Tensor:
        c, t = self.cfg.critic, self.models.critic

        def part(sl):
            with t.precision.autocast():
                return critic_values(
                    t.module, ro.input_ids[sl], ro.attention_mask[sl], ro.prompt_len, c.model.use_remove_padding
                )

        parts = self._parts(
            ro,
            0,
            len(ro.input_ids),
            c.forward_micro_batch_size_per_gpu or c.ppo_micro_batch_size_per_gpu,
            "critic.forward_max_token_len_per_gpu",
        )
        return in_micro_batches(parts, part)

    def step(self, rows, kl_coef: float, global_step: int) -> dict:
        """One PPO step on this worker's shard of prompts; `global_step` counts from 1."""
        a, m = self.cfg.actor_rollout_ref, self.models
        n = a.rollout.n
        phases = Phases(self._sync_device)
        if self.device.type == "cuda" and not self.engine.generates_with_actor_module:
            torch.cuda.empty_cache()  # what training freed goes back before the engine's KV cache wakes
        with phases("gen"):
            ro = generate_score.generate(self.engine, rows, n, self.device)
        with phases("reward"):
            sc = generate_score.score_rollout(self.tok, self.reward, rows, ro, n)
        baselines = None
        if self.estimator.needs_greedy_baseline:  # verl's ReMax: each prompt's greedy response, scored
            with phases("gen_max"):
                greedy = generate_score.generate(self.engine, rows, 1, self.device, GREEDY)
                baselines = generate_score.score_rollout(
                    self.tok, self.reward, rows, greedy, 1
                ).scores.repeat_interleave(n)
        balanced = {}
        if self.cfg.trainer.balance_batch:
            with phases("balance"):
                ro, sc, baselines, balanced = balance_batch.balance(ro, sc, baselines, n, self.tok.pad_token_id)
        actor_on = offload.module_on(m.actor.module, self.device, m.actor.param_offload)
        critic_on = (
            offload.module_on(m.critic.module, self.device, m.critic.param_offload)
            if m.critic
            else contextlib.nullcontext()
        )
        # param_offload: the actor is on the device from its log-prob pass to the weight sync, the critic from
        # its values to its update; both in host memory through generation and scoring
        with actor_on, critic_on:
            return {**self._train_phases(phases, ro, sc, kl_coef, global_step, baselines), **balanced}

    def _train_phases(self, phases, ro, sc, kl_coef: float, global_step: int, baselines=None) -> dict:
        cfg, a, m = self.cfg, self.cfg.actor_rollout_ref, self.models
        n, mask = a.rollout.n, sc.mask
        update_actor_now = global_step >= cfg.trainer.critic_warmup  # verl: the critic trains alone until then
        # On-policy (one epoch, one mini batch, so one optimizer step after all the forwards) the
        # update's own first forward yields these log-probs: skip the extra pass, as verl and TRL do
        rc = cfg.algorithm.rollout_correction
        on_policy = (
            a.actor.ppo_epochs == 1
            and a.actor.ppo_mini_batch_size * n // self.world >= len(ro.input_ids)
            and not cfg.algorithm.use_kl_in_reward
            and update_actor_now
            and not rc.rollout_is
        )
        old_logp = ref_logp = values = None
        with torch.no_grad():
            with phases("old_log_prob"):
                if not on_policy:
                    old_logp = self._logprobs(
                        m.actor.module,
                        ro,
                        a.rollout.log_prob_micro_batch_size_per_gpu,
                        m.actor.precision,
                        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                    )
            if self.ref_worker is not None:
                import ray

                with phases("ref"):
                    ref_logp = ray.get(
                        self.ref_worker.logprobs.remote(ro.input_ids.cpu(), ro.attention_mask.cpu(), ro.prompt_len)
                    ).to(self.device)
            elif m.ref is not None:
                with phases("ref"), offload.module_on(m.ref, self.device, m.ref_offload):
                    ref_logp = self._logprobs(
                        m.ref,
                        ro,
                        a.ref.log_prob_micro_batch_size_per_gpu,
                        m.ref_precision,
                        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
                    )
            elif m.ref_in_actor:
                with phases("ref"), m.actor.module.disable_adapter():
                    ref_logp = self._logprobs(
                        m.actor.module,
                        ro,
                        a.ref.log_prob_micro_batch_size_per_gpu,
                        m.actor.precision,
                        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
                    )
            if self.critic_worker is not None:
                import ray

                with phases("values"):
                    values = ray.get(self.critic_worker.values.remote(*self._ro_cpu(ro))).to(self.device) * mask
            elif m.critic is not None:
                with phases("values"):
                    values = self._values(ro) * mask
        out = {}
        with phases("adv"):
            rewards = sc.token_scores
            if cfg.algorithm.use_kl_in_reward:
                rewards, kl_mean = algos.apply_kl_in_reward(
                    sc.token_scores, old_logp, ref_logp, mask, kl_coef, cfg.algorithm.kl_penalty
                )
                out["actor/reward_kl_penalty"] = kl_mean
            al = cfg.algorithm
            adv, returns = self.estimator.fn(
                estimators.AdvantageInput(
                    rewards,
                    mask,
                    [i // n for i in range(len(mask))],
                    values,
                    al.gamma,
                    al.lam,
                    al.norm_adv_by_std_in_grpo,
                    allreduce_sum,
                    baselines,
                )
            )
            is_w = None
            if rc.rollout_is:  # between the policy that trains (old log-probs) and the engine that sampled
                is_w, corr = rollout_correction.is_weights(
                    old_logp,
                    ro.engine_logp,
                    mask,
                    rc.rollout_is,
                    rc.rollout_is_threshold,
                    rc.rollout_is_batch_normalize,
                    allreduce_sum,
                )
                out.update(corr)
        if al.use_pf_ppo:
            with phases("pf_ppo"):
                ro, r = pf_ppo.resample(
                    ro,
                    dict(
                        mask=mask,
                        old_logp=old_logp,
                        ref_logp=ref_logp,
                        values=values,
                        adv=adv,
                        returns=returns,
                        rewards=rewards,
                        scores=sc.scores,
                        token_scores=sc.token_scores,
                        is_w=is_w,
                    ),
                    sc.token_scores.sum(-1),
                    al.pf_ppo.reweight_method,
                    al.pf_ppo.weight_pow,
                    cfg.trainer.seed * 1_000_003 + global_step,
                    self.tok.pad_token_id,
                )
                mask, old_logp, ref_logp, values, adv, returns, rewards, is_w = (
                    r[k] for k in ("mask", "old_logp", "ref_logp", "values", "adv", "returns", "rewards", "is_w")
                )
                sc = generate_score.Scored(ro, mask, r["scores"], r["token_scores"])
        # the update's random draws (dropout) come from a forked stream: the ranks of one tensor-parallel
        # engine, which must sample the same tokens, keep the same generator state whatever the update draws
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            update_stats, actor_logp = self._update(
                phases, ro, mask, old_logp, ref_logp, adv, values, returns, global_step, update_actor_now, is_w
            )
        out.update(update_stats)
        actor_logp = actor_logp if actor_logp is not None else old_logp
        if update_actor_now:
            with phases("update_weights"):
                self._sync_engine()  # the next rollout samples from the new policy
        if ro.engine_logp is not None and actor_logp is not None:
            out.update(probs_diff(ro.engine_logp, actor_logp, mask))
        lengths = mask.sum(-1)
        out.update(
            {
                "critic/score/mean": sc.scores.mean().item(),
                "critic/score/max": sc.scores.max().item(),
                "critic/score/min": sc.scores.min().item(),
                "critic/rewards/mean": rewards.sum(-1).mean().item(),
                "critic/advantages/mean": algos.masked_mean(adv, mask).item(),
                "response_length/mean": lengths.mean().item(),
                "response_length/max": lengths.max().item(),
                "response_length/min": lengths.min().item(),
                "response_length/clip_ratio": (lengths >= cfg.data.max_response_length).float().mean().item(),
                "perf/total_num_tokens": float(ro.attention_mask.sum().item()),
                M.TOKENS: float(lengths.sum().item()),
                **phases.metrics(),
            }
        )
        if values is not None:
            out["critic/vf_explained_var"] = algos.explained_variance(values, returns, mask)
        if self.device.type == "cuda":
            out["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return out

    def _update(
        self,
        phases,
        ro,
        mask,
        old_logp,
        ref_logp,
        adv,
        values,
        returns,
        global_step: int,
        update_actor_now: bool,
        is_w=None,
    ):
        """The critic's update, then the actor's (each at its scheduled learning rate); returns the stats and
        the actor's log-probs before its first optimizer step (None when the actor did not update)."""
        cfg, a, m = self.cfg, self.cfg.actor_rollout_ref, self.models
        total = cfg.trainer.total_training_steps
        mini, rows = a.actor.ppo_mini_batch_size * a.rollout.n // self.world, len(mask)
        minis = lambda micro, key: [
            self._parts(ro, s, min(s + mini, rows), min(micro or mini, mini), key) for s in range(0, rows, mini)
        ]
        out, actor_logp = {}, None
        remote_critic = None
        if self.critic_worker is not None:  # the critic's update runs in its own pool while the actor updates here
            remote_critic = self.critic_worker.update.remote(
                *self._ro_cpu(ro), values.cpu(), returns.cpu(), global_step
            )
        elif m.critic is not None:
            with phases("update_critic"):
                out["critic/lr"] = lr_schedule.lr_at(cfg.critic.optim, global_step - 1, total)
                lr_schedule.apply(m.critic.opt, out["critic/lr"])
                out.update(
                    mean_stats(
                        update_critic(
                            m.critic,
                            ro,
                            mask,
                            values,
                            returns,
                            cfg,
                            minis(cfg.critic.ppo_micro_batch_size_per_gpu, "critic.ppo_max_token_len_per_gpu"),
                            mini,
                            cfg.critic.model.use_remove_padding,
                        )
                    )
                )
        if update_actor_now:
            with phases("update_actor"):
                out["actor/lr"] = lr_schedule.lr_at(a.actor.optim, global_step - 1, total)
                lr_schedule.apply(m.actor.opt, out["actor/lr"])
                stats, actor_logp = update_actor(
                    m.actor,
                    ro,
                    mask,
                    old_logp,
                    ref_logp,
                    adv,
                    cfg,
                    minis(a.actor.ppo_micro_batch_size_per_gpu, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
                    mini,
                    a.model.use_remove_padding,
                    is_w,
                )
                out.update(mean_stats(stats))
        if remote_critic is not None:
            import ray

            with phases("update_critic"):  # only the wait that is left after the actor's update
                out.update(ray.get(remote_critic))
        return out, actor_logp

    @staticmethod
    def _ro_cpu(ro) -> tuple:
        return ro.input_ids.cpu(), ro.attention_mask.cpu(), ro.response_mask.cpu(), ro.prompt_len

    # --- checkpoints: full tensors by name; every rank gathers (a collective), rank 0 returns them ---
    def state(self) -> dict | None:
        return worker_state.gather(self.models, self.rank)

    def rng_state(self) -> dict:
        return worker_state.rng_state()

    def load(self, state: dict, rng: dict | None) -> None:
        worker_state.load(self.models, state)
        if rng:
            worker_state.set_rng_state(rng)
        actor = self.models.actor
        with offload.module_on(actor.module, self.device, actor.param_offload):
            self._sync_engine()

    def shutdown(self) -> None:
        if getattr(self, "rm_scorer", None) is not None:
            self.rm_scorer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
