"""A worker of the reference model's own pool (actor_rollout_ref.ref.enable_resource_pool, OpenRLHF's separate
reference nodes): a whole copy of the frozen reference on one device, computing the log-probs of the samples the
training workers send it. Forward passes only, so no process group."""

from __future__ import annotations

import torch

from rlrig.trainer.model.devices import gpu_index


class RefWorker:
    def __init__(self, cfg_dict: dict, model_path: str, use_gpu: bool):
        from transformers import AutoModelForCausalLM

        from rlrig.trainer.config.schema import from_dict
        from rlrig.trainer.model import micro_batches as batching
        from rlrig.trainer.model.build import import_external_lib, model_kwargs
        from rlrig.trainer.model.precision import cast_buffers, resolve
        from rlrig.trainer.workers.training_worker import ensure_local_embedded_model

        cfg = from_dict(cfg_dict)
        a = cfg.actor_rollout_ref
        torch.set_num_threads(1)
        self.device = torch.device("cuda", gpu_index()) if use_gpu else torch.device("cpu")
        ensure_local_embedded_model(model_path)
        import_external_lib(a.model)
        prec = resolve(a.ref.fsdp_config, self.device.type, "ddp", "ref")  # bf16 on GPU, as in the training workers
        self.offload = a.ref.fsdp_config.param_offload
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=prec.model_dtype, **model_kwargs(a.model, model_path)
        )
        self.model.eval().requires_grad_(False)
        cast_buffers(self.model, prec)
        self.model.to("cpu" if self.offload else self.device)
        self.micro, self.packed, self.shared = (
            a.ref.log_prob_micro_batch_size_per_gpu,
            a.model.use_remove_padding,
            a.actor.use_prefix_grouper,
        )
        self.budget = batching.token_budgets(cfg)["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"]

    @torch.no_grad()
    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """[B, R] log-probs of the response tokens, on the CPU for the trip back."""
        from rlrig.trainer.model import micro_batches as batching
        from rlrig.trainer.model import offload
        from rlrig.trainer.model.forward import in_micro_batches, token_logprobs

        ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
        lengths = mask.sum(-1).tolist() if self.budget else []
        # the whole model is here, so micro batches need no agreement with other workers
        parts = batching.plan(lengths, 0, len(ids), self.micro, self.budget, lambda k: k)
        with offload.module_on(self.model, self.device, self.offload):
            out = in_micro_batches(
                parts,
                lambda p: token_logprobs(
                    self.model, ids[p], mask[p], prompt_len, remove_padding=self.packed, share_prompts=self.shared
                )[0],
            )
        return out.cpu()

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()
