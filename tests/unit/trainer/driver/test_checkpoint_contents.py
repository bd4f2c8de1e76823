"""checkpoint.save_contents / load_contents (verl's model, optimizer, extra, hf_model) with the embedded tiny model."""

from types import SimpleNamespace

import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.driver import checkpoint
from rlrig.trainer.driver.single_process import single_worker
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.workers.step.request import StepRequest

pytestmark = pytest.mark.process

FAST = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.device=cpu",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.max_response_length=8"]  # fmt: skip
SAVES = "actor_rollout_ref.actor.checkpoint.save_contents"


def test_without_optimizer_no_optimizer_state_is_gathered():
    with single_worker([*FAST, f"{SAVES}=[model,extra]"]) as (w, batches):
        w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0))
        st = w.state()
    assert "model" in st and "optim" not in st


def test_hf_model_writes_a_hugging_face_directory_with_the_trained_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    with single_worker([*FAST, f"{SAVES}=[hf_model]"]) as (w, batches):
        w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0))
        st = w.state()
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    run = SimpleNamespace(cfg=parse_overrides(FAST), model_path=ensure_tiny_model(), adapter=None)
    checkpoint.hf_models(run, st, {"actor": ["hf_model"]})(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "actor" / "huggingface").state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in st["model"].items() if k in loaded)
    assert (tmp_path / "actor" / "huggingface" / "tokenizer_config.json").is_file()


def test_load_contents_model_only_leaves_the_optimizer_fresh():
    with single_worker([*FAST, "actor_rollout_ref.actor.checkpoint.load_contents=[model]"]) as (w, batches):
        w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0))
        st = w.state()
        w.models.actor.opt.state.clear()
        w.load(st, None)
        assert not w.models.actor.opt.state  # the optimizer's moments were not loaded
        assert all(torch.equal(p, st["model"][k]) for k, p in w.models.actor.module.state_dict().items())


def test_a_resume_asking_for_what_the_checkpoint_lacks_is_refused(tmp_path):
    held = {"actor": ["model", "extra"]}
    why = checkpoint.load_refusal(tmp_path, held, {"actor_rollout_ref.actor": ["model", "optimizer", "extra"]})
    assert "holds no optimizer state of the actor" in why and "load_contents" in why and "\n" not in why
    assert checkpoint.load_refusal(tmp_path, held, {"actor_rollout_ref.actor": ["model", "hf_model"]}) is None
    # a checkpoint from before contents were recorded holds everything
    assert checkpoint.load_refusal(tmp_path, {}, {"actor_rollout_ref.actor": ["model", "optimizer", "extra"]}) is None


@pytest.mark.parametrize("key", [SAVES, "critic.checkpoint.load_contents"])
def test_unknown_contents_are_refused_naming_verls_choices(key):
    with pytest.raises(ConfigError, match="model, optimizer, extra, hf_model"):
        parse_overrides([f"{key}=[model,weights]"])
