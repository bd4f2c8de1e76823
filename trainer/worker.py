"""One training worker per device: actor, rollout and reference colocated (verl's hybrid engine).

Workers train data parallel: each holds a shard of the prompts, and DDP or FSDP (actor.strategy)
averages gradients over all of them with torch.distributed (Gloo on CPU, NCCL on GPU), across nodes.
"""

from __future__ import annotations

import copy
import random
import socket
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from . import core_algos as algos
from . import packing, parallel
from .rewards import load_reward_fn
from .rollout import EngineUnavailable, make_engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_address() -> tuple[str, int]:
    import ray

    return ray.util.get_node_ip_address(), free_port()


def response_outputs(model, input_ids, attention_mask, prompt_len, remove_padding=False):
    """The model's outputs where each response token is predicted (the position before it), and those
    tokens: padded ([B, R, ...], [B, R], None), or packed (see packing.py) ([N, ...], [N], the [B, R]
    slots they fill). Position ids respect left padding."""
    if remove_padding:
        pk = packing.pack(input_ids, attention_mask, prompt_len)
        out = model(input_ids=pk.input_ids, position_ids=pk.position_ids, use_cache=False).logits
        # the position before a response token is always in the same sequence
        return out.flatten(0, 1)[pk.at - 1], pk.input_ids.flatten()[pk.at], pk.filled
    pos = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False).logits
    return out[:, prompt_len - 1:-1], input_ids[:, prompt_len:], None


def token_logprobs(model, input_ids, attention_mask, prompt_len, with_entropy=False, entropy_grad=True, remove_padding=False):
    """Log-probs [B, R] of the response tokens under the model. With entropy_coeff 0 the entropy is
    only a metric: `entropy_grad=False` keeps it out of the backward pass."""
    logits, targets, filled = response_outputs(model, input_ids, attention_mask, prompt_len, remove_padding)
    logp_all = torch.log_softmax(logits.float(), -1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = algos.entropy_from_logprobs(logp_all)
    if filled is not None:
        logp, ent = packing.unpack(logp, filled), (packing.unpack(ent, filled) if ent is not None else None)
    return logp, ent


def ensure_local_embedded_model(path: str) -> None:
    """The embedded model is built where it is used (deterministic; DDP then broadcasts rank 0's
    weights), so a node without the head's filesystem, e.g. a second container, still has it. It must
    run before torch.distributed starts: transformers' save_pretrained then writes only on rank 0, and
    another rank's node would get the tokenizer without the model (seen with compose)."""
    import os

    from .tiny_model import cache_dir, ensure_tiny_model

    if not os.path.exists(path) and os.path.abspath(path) == str(cache_dir()):
        ensure_tiny_model()


def probs_diff(engine_logp, actor_logp, mask) -> dict:
    """verl's rollout-vs-actor check: |p_engine - p_actor| per response token, after the last sync."""
    diff = (engine_logp.exp() - actor_logp.exp()).abs()[mask > 0]
    if diff.numel() == 0:
        return {}
    return {"training/rollout_probs_diff_max": diff.max().item(), "training/rollout_probs_diff_mean": diff.mean().item(),
            "training/rollout_probs_diff_std": diff.std(unbiased=False).item()}


class Worker:
    def __init__(self, cfg_dict: dict, rank: int, world: int, master: tuple[str, int], model_path: str):
        from .config import from_dict

        self.cfg = from_dict(cfg_dict)
        self.rank, self.world = rank, world
        seed = self.cfg.trainer.seed + rank
        random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
        torch.set_num_threads(1)
        dev = self.cfg.trainer.device
        self.device = torch.device("cpu")
        if dev == "cuda" or (dev == "auto" and torch.cuda.is_available()):
            # Ray shows each worker only its own GPU (CUDA_VISIBLE_DEVICES), so it is cuda:0 here
            self.device = torch.device("cuda", 0)
            torch.cuda.set_device(self.device)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        ensure_local_embedded_model(model_path)  # before the process group: see there
        dist.init_process_group(backend, init_method=f"tcp://{master[0]}:{master[1]}", rank=rank, world_size=world,
                                timeout=timedelta(minutes=10))
        self._load(model_path)

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def engine_name(self) -> tuple[str | None, str | None]:
        """(engine name, None), or (None, why the configured engine could not start)."""
        if self.engine is None:
            return None, f"actor_rollout_ref.rollout.name={self.cfg.actor_rollout_ref.rollout.name}: {self.engine_error}"
        return self.engine.describe(), None

    def _load(self, path: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        a = self.cfg.actor_rollout_ref
        kw = {"gguf_file": a.model.gguf_file} if a.model.gguf_file else {}
        self.tok = AutoTokenizer.from_pretrained(path, **kw)
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        module = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).to(self.device)
        if a.model.enable_gradient_checkpointing:
            module.gradient_checkpointing_enable()
        strategy = a.actor.strategy
        # transformers' generate cannot run on a sharded module (ranks would step out of lockstep at
        # EOS), so under FSDP the hf engine generates with its own full copy, refreshed by sync_weights
        gen_module = copy.deepcopy(module) if strategy == "fsdp" and a.rollout.name in ("hf", "auto") else module
        self.model = parallel.wrap(module, strategy, self.device)
        self.module = module
        self.opt = torch.optim.AdamW(module.parameters(), lr=a.actor.optim.lr, weight_decay=a.actor.optim.weight_decay)
        need_ref = a.actor.use_kl_loss or self.cfg.algorithm.use_kl_in_reward
        self.ref = None
        if need_ref:
            self.ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).to(self.device).eval()
            self.ref.requires_grad_(False)
            if strategy == "fsdp":
                parallel.fsdp_shard(self.ref)
        self.critic = None
        if self.cfg.algorithm.adv_estimator == "gae":
            from transformers import AutoModelForTokenClassification

            cpath = self.cfg.critic.model.path or path
            critic = AutoModelForTokenClassification.from_pretrained(cpath, num_labels=1, dtype=torch.float32, **kw).to(self.device)
            self.critic_module = critic
            self.critic = parallel.wrap(critic, strategy, self.device)
            self.critic_opt = torch.optim.AdamW(critic.parameters(), lr=self.cfg.critic.optim.lr)
        self.engine_error = None
        # the ranks of one tensor-parallel engine sample the same tokens only from the same seed
        try:
            self.engine = make_engine(a.rollout.name, gen_module, self.tok, a.rollout, self.cfg.data.max_response_length,
                                      model_path=path, max_prompt_length=self.cfg.data.max_prompt_length,
                                      device=self.device.type, seed=self.cfg.trainer.seed + self.rank // a.rollout.tensor_model_parallel_size)
        except EngineUnavailable as e:  # reported by engine_name(): one line for the driver, not a dead actor
            self.engine, self.engine_error = None, str(e)
            return
        # the wrapper just broadcast rank 0's weights, which this node's copy on disk need not equal
        self.engine.sync_weights(parallel.full_tensors(module))
        self.reward_fn = load_reward_fn(self.cfg.custom_reward_function.path, self.cfg.custom_reward_function.name)

    def _values(self, batch, grad: bool):
        """Critic values [B, R]: the value of the state before each response token."""
        with torch.set_grad_enabled(grad):
            v, _, filled = response_outputs(self.critic, batch.input_ids, batch.attention_mask, batch.prompt_len,
                                            self.cfg.critic.model.use_remove_padding)
        v = v.squeeze(-1)
        return packing.unpack(v, filled) if filled is not None else v

    def score(self, rows, rollout, n):
        texts = self.tok.batch_decode(rollout.input_ids[:, rollout.prompt_len:].tolist(), skip_special_tokens=True)
        out = []
        for i, text in enumerate(texts):
            r = rows[i // n]
            out.append(float(self.reward_fn(r["data_source"], text, r["reward_model"]["ground_truth"], r.get("extra_info"))))
        return torch.tensor(out), texts

    def evaluate(self, rows) -> list[float]:
        ro = self.engine.generate([r["input_ids"] for r in rows], 1, greedy=True)
        return self.score(rows, ro, 1)[0].tolist()

    def step(self, rows, kl_coef: float) -> dict:
        cfg, a = self.cfg, self.cfg.actor_rollout_ref
        n = a.rollout.n
        t0 = time.perf_counter()
        ro = self.engine.generate([r["input_ids"] for r in rows], n).to(self.device)
        t_gen = time.perf_counter()
        scores = self.score(rows, ro, n)[0].to(self.device)
        mask = ro.response_mask.float()
        last = (mask.sum(-1).long() - 1).clamp_min(0)
        token_scores = torch.zeros_like(mask)
        token_scores[torch.arange(len(scores)), last] = scores  # outcome reward on the last response token
        t_reward = time.perf_counter()
        # On-policy (one epoch, one mini batch, so one optimizer step after all the forwards) the
        # update's own first forward yields these log-probs: skip the extra pass, as verl and TRL do
        on_policy = (a.actor.ppo_epochs == 1 and a.actor.ppo_mini_batch_size * n // self.world >= len(ro.input_ids)
                     and not cfg.algorithm.use_kl_in_reward)
        packed = a.model.use_remove_padding
        with torch.no_grad():
            old_logp = None if on_policy else token_logprobs(self.module, ro.input_ids, ro.attention_mask, ro.prompt_len,
                                                             remove_padding=packed)[0]
            t_logp = time.perf_counter()
            ref_logp = (token_logprobs(self.ref, ro.input_ids, ro.attention_mask, ro.prompt_len, remove_padding=packed)[0]
                        if self.ref is not None else None)
        t_ref = time.perf_counter()
        values = self._values(ro, grad=False).detach() * mask if self.critic is not None else None  # gae's critic
        t_values = time.perf_counter()
        metrics = {}
        rewards = token_scores
        if cfg.algorithm.use_kl_in_reward:
            rewards, kl_mean = algos.apply_kl_in_reward(token_scores, old_logp, ref_logp, mask, kl_coef, cfg.algorithm.kl_penalty)
            metrics["actor/reward_kl_penalty"] = kl_mean
        index = [i // n for i in range(len(scores))]
        est = cfg.algorithm.adv_estimator
        if est == "gae":
            adv, returns = algos.gae_advantages(rewards, values, mask, cfg.algorithm.gamma, cfg.algorithm.lam)
        elif est == "grpo":
            adv, returns = algos.grpo_advantages(rewards.sum(-1), mask, index, cfg.algorithm.norm_adv_by_std_in_grpo)
        elif est == "rloo":
            adv, returns = algos.rloo_advantages(rewards.sum(-1), mask, index)
        else:
            adv, returns = algos.reinforce_pp_advantages(rewards, mask, cfg.algorithm.gamma)
        t_adv = time.perf_counter()
        update, actor_logp, critic_s = self._update(ro, mask, old_logp, ref_logp, adv, values, returns)
        metrics.update(update)
        t_upd = time.perf_counter()
        self.engine.sync_weights(parallel.full_tensors(self.module))  # the next rollout samples from the new policy
        t_sync = time.perf_counter()
        if ro.engine_logp is not None:
            metrics.update(probs_diff(ro.engine_logp, actor_logp, mask))
        lengths = mask.sum(-1)
        metrics.update({
            "critic/score/mean": scores.mean().item(), "critic/score/max": scores.max().item(), "critic/score/min": scores.min().item(),
            "critic/rewards/mean": rewards.sum(-1).mean().item(), "critic/advantages/mean": algos.masked_mean(adv, mask).item(),
            "response_length/mean": lengths.mean().item(), "response_length/max": lengths.max().item(),
            "response_length/min": lengths.min().item(),
            "response_length/clip_ratio": (lengths >= cfg.data.max_response_length).float().mean().item(),
            # verl's names; the critic's share of the shared update loop is timed on its own
            "timing_s/gen": t_gen - t0, "timing_s/reward": t_reward - t_gen, "timing_s/old_log_prob": t_logp - t_reward,
            "timing_s/adv": t_adv - t_values, "timing_s/update_actor": t_upd - t_adv - critic_s,
            "timing_s/update_weights": t_sync - t_upd, "perf/total_num_tokens": float(ro.attention_mask.sum().item()),
        })
        if self.ref is not None:
            metrics["timing_s/ref"] = t_ref - t_logp
        if values is not None:
            metrics.update({"timing_s/values": t_values - t_ref, "timing_s/update_critic": critic_s,
                            "critic/vf_explained_var": algos.explained_variance(values, returns, mask)})
        if self.device.type == "cuda":
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return metrics

    def _update(self, ro, mask, old_logp, ref_logp, adv, values, returns) -> tuple[dict, torch.Tensor, float]:
        """The PPO epochs; returns the stats, the log-probs before the first optimizer step (old_logp,
        or when it is None, on-policy, those of the first forwards) and the seconds the critic took."""
        a = self.cfg.actor_rollout_ref.actor
        rows = ro.input_ids.shape[0]
        mini = a.ppo_mini_batch_size * self.cfg.actor_rollout_ref.rollout.n // self.world
        micro = min(a.ppo_micro_batch_size_per_gpu or mini, mini)
        lo = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
        hi = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
        stats: dict[str, list[float]] = {}
        first: list[torch.Tensor] = []
        critic_s = 0.0
        for _ in range(a.ppo_epochs):
            for start in range(0, rows, mini):
                self.opt.zero_grad()
                if self.critic is not None:
                    self.critic_opt.zero_grad()
                for ms in range(start, min(start + mini, rows), micro):
                    sl = slice(ms, ms + micro)
                    m = mask[sl]
                    logp, ent = token_logprobs(self.model, ro.input_ids[sl], ro.attention_mask[sl], ro.prompt_len, with_entropy=True,
                                               entropy_grad=a.entropy_coeff != 0,
                                               remove_padding=self.cfg.actor_rollout_ref.model.use_remove_padding)
                    if old_logp is None:
                        first.append(logp.detach())
                    old = old_logp[sl] if old_logp is not None else first[-1]
                    pg, clipfrac, ppo_kl = algos.policy_loss(old, logp, adv[sl], m, lo, hi, a.clip_ratio_c, a.loss_agg_mode)
                    entropy = algos.agg_loss(ent, m, a.loss_agg_mode)
                    loss = pg - a.entropy_coeff * entropy
                    if a.use_kl_loss:
                        kl = algos.agg_loss(algos.kl_penalty(logp, ref_logp[sl], a.kl_loss_type), m, a.loss_agg_mode)
                        loss = loss + a.kl_loss_coef * kl
                        stats.setdefault("actor/kl_loss", []).append(kl.item())
                    (loss * micro / mini).backward()
                    for k, v in (("actor/pg_loss", pg), ("actor/pg_clipfrac", clipfrac), ("actor/ppo_kl", ppo_kl), ("actor/entropy", entropy)):
                        stats.setdefault(k, []).append(v.item())
                    if self.critic is not None:
                        tc = time.perf_counter()
                        v = self._values(type(ro)(ro.input_ids[sl], ro.attention_mask[sl], ro.response_mask[sl], ro.prompt_len), grad=True)
                        vf, vclip = algos.value_loss(v, values[sl], returns[sl], m, self.cfg.critic.cliprange_value)
                        (vf * micro / mini).backward()
                        stats.setdefault("critic/vf_loss", []).append(vf.item())
                        stats.setdefault("critic/vf_clipfrac", []).append(vclip.item())
                        critic_s += time.perf_counter() - tc
                stats.setdefault("actor/grad_norm", []).append(parallel.grad_norm(self.module, a.optim.clip_grad))
                self.opt.step()
                if self.critic is not None:
                    tc = time.perf_counter()
                    stats.setdefault("critic/grad_norm", []).append(parallel.grad_norm(self.critic_module, self.cfg.critic.optim.clip_grad))
                    self.critic_opt.step()
                    critic_s += time.perf_counter() - tc
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        out["actor/lr"] = a.optim.lr
        return out, (old_logp if old_logp is not None else torch.cat(first)), critic_s

    # --- checkpoints: full tensors by name; every rank gathers (a collective), rank 0 returns them ---
    def state(self) -> dict | None:
        st = dict(zip(("model", "optim"), parallel.gather_state(self.module, self.opt)))
        if self.critic is not None:
            st.update(zip(("critic", "critic_optim"), parallel.gather_state(self.critic_module, self.critic_opt)))
        return st if self.rank == 0 else None

    def rng_state(self) -> dict:
        return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}

    def load(self, state: dict, rng: dict | None) -> None:
        parallel.load_state(self.module, self.opt, state["model"], state["optim"])
        if self.critic is not None and "critic" in state:
            parallel.load_state(self.critic_module, self.critic_opt, state["critic"], state["critic_optim"])
        if rng:
            torch.set_rng_state(rng["torch"]), np.random.set_state(rng["numpy"]), random.setstate(rng["python"])
        self.engine.sync_weights(parallel.full_tensors(self.module))

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

