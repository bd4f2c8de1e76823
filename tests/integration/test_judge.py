"""A generative judge for real (the hf engine, CPU): a judge served in each training worker scores every sample
through rlrig's judge function, with its counters and parse failures in the metrics; verl 0.9's own GenRM reward
function (its docs' example: aiohttp to /v1/chat/completions, the reply read
as openai's ChatCompletion) runs unchanged against the judge on a pool of its own, named by verl 0.9's reward.*
keys. Marked long: `--preset judge` with its trained judge, and the policy learning what that judge prefers."""

from pathlib import Path

import pytest

from rlrig.trainer.embedded.tiny_judge import TEMPLATE, ensure_tiny_judge
from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
from tests.integration.test_train import metrics, rlrig

pytestmark = pytest.mark.integration

SCORE, JUDGED, RULE = "critic/score/mean", "reward/judge/score/mean", "val-aux/rlrig/arithmetic/rule_score/mean@1"
QUICK = ["trainer.val_before_train=False", "trainer.test_freq=0", "trainer.save_freq=0"]
SAMPLES = 32 * 8  # the embedded preset's prompts x samples a step
SMALL = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]  # a quarter of its prompts
SMALL_SAMPLES = 8 * 8

# verl 0.9's GenRM example (docs/advance/reward_loop.rst, tests/experimental/reward_loop/reward_fn.py), as a user
# copies it; only the prompt speaks the embedded judge's language
VERL_GENRM = """
import json

import aiohttp
from openai.types.chat import ChatCompletion
from transformers import PreTrainedTokenizer

GRM_PROMPT_TEMPLATE = "{solution},{answer},,"


async def chat_complete(router_address: str, chat_complete_request: dict):
    url = f"http://{router_address}/v1/chat/completions"
    try:
        timeout = aiohttp.ClientTimeout(total=None)
        session = aiohttp.ClientSession(timeout=timeout)
        async with session.post(url, json=chat_complete_request) as resp:
            output = await resp.text()
            output = json.loads(output)
            return ChatCompletion(**output)
    except Exception as e:
        raise e
    finally:
        await session.close()


async def compute_score_gsm8k(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict,
    reward_router_address: str,
    reward_model_tokenizer: PreTrainedTokenizer,
):
    grm_prompt = GRM_PROMPT_TEMPLATE.format(solution=solution_str, answer=ground_truth)
    messages = [{"role": "user", "content": grm_prompt}]
    sampling_params = {"temperature": 0.7, "top_p": 0.8, "max_tokens": 4096}
    chat_complete_request = {"messages": messages, "model": "judge", **sampling_params}
    result = await chat_complete(router_address=reward_router_address, chat_complete_request=chat_complete_request)
    grm_response = result.choices[0].message.content
    try:
        score = int(grm_response.split("\\n\\n")[-1].strip())
    except Exception:
        score = 0
    return {"score": score, "acc": score == 1, "genrm_response": grm_response}
"""


def judge_run(run: Path, *extra: str, steps: int, preset: str = "judge") -> tuple[list[dict], str]:
    r = rlrig(
        "train",
        "--preset",
        preset,
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={run}",
        *extra,
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return metrics(run), r.stdout + r.stderr


# long: the preset builds its trained judge (about 100 s once); CI serves the policy's own model as the judge below
@pytest.mark.long
def test_the_presets_judge_scores_every_sample(tmp_path):
    rows, out = judge_run(tmp_path / "run", *QUICK, steps=1)
    assert f"reward_model ({ensure_tiny_judge()})" in out  # colocated with the actor
    (m,) = rows
    assert m["reward/judge/requests"] == SAMPLES and m["reward/judge/failures"] == 0
    assert m["reward/judge/completion_tokens"] <= 2 * SAMPLES  # the preset's max_tokens
    assert m["reward/judge/parse_failures"] == 0
    assert 0.0 < m[JUDGED] < 1.0 and m[SCORE] == pytest.approx(m[JUDGED])  # the judge alone is the score


def test_a_colocated_judge_scores_every_sample_and_counts_what_it_cannot_read(tmp_path):
    """Any causal model serves as a judge: the embedded policy's own, asked through rlrig's judge function with a
    verdict rule its replies never match, so every sample is a parse failure scored unparsed_score."""
    judge = [
        "reward_model.enable=True",
        f"reward_model.model.path={ensure_tiny_model()}",
        "reward_model.rollout.name=hf",
        "custom_reward_function.path=pkg://rlrig.trainer.reward.judge_fn",
        f"+custom_reward_function.reward_kwargs.template='{TEMPLATE}'",
        "+custom_reward_function.reward_kwargs.max_tokens=2",
        "+custom_reward_function.reward_kwargs.verdict='x(\\d)'",
        "+custom_reward_function.reward_kwargs.unparsed_score=-1",
    ]
    rows, out = judge_run(tmp_path / "run", *QUICK, *SMALL, *judge, steps=1, preset="embedded")
    assert f"reward_model ({ensure_tiny_model()})" in out  # colocated with the actor
    (m,) = rows
    assert m["reward/judge/requests"] == SMALL_SAMPLES and m["reward/judge/failures"] == 0
    assert 0 < m["reward/judge/completion_tokens"] <= 2 * SMALL_SAMPLES
    assert m["reward/judge/parse_failures"] == SMALL_SAMPLES and m[SCORE] == -1.0 and m[JUDGED] == -1.0


def test_verl_09s_genrm_function_runs_unchanged_against_a_judge_on_its_own_pool(tmp_path):
    fn = tmp_path / "genrm.py"
    fn.write_text(VERL_GENRM)
    verl_keys = [
        "reward.reward_model.enable=True",
        "reward.reward_model.enable_resource_pool=True",
        "reward.reward_model.nnodes=1",
        "reward.reward_model.n_gpus_per_node=1",
        f"reward.reward_model.model_path={ensure_tiny_model()}",  # any causal model serves; the preset's is long
        "reward.reward_model.rollout.name=hf",
        f"reward.custom_reward_function.path={fn}",
        "reward.custom_reward_function.name=compute_score_gsm8k",
        "trainer.n_gpus_per_node=1",  # one training worker and the judge's: the machine's two CPUs
    ]
    rows, out = judge_run(tmp_path / "run", *QUICK, *SMALL, *verl_keys, steps=2, preset="embedded")
    assert f"; reward_model ({ensure_tiny_model()}) on " in out  # a pool of its own
    assert [m["reward/judge/requests"] for m in rows] == [SMALL_SAMPLES, SMALL_SAMPLES]
    assert all(m["reward/judge/failures"] == 0 and m[SCORE] >= 0 for m in rows)  # int(reply), else 0


def learned(rows: list[dict]) -> None:
    """The judge's score over the first and the last fifth of the steps rose, and so did the rule's in validation."""
    train = [r for r in rows if SCORE in r]
    k = max(1, len(train) // 5)
    first, last = (round(sum(r[SCORE] for r in part) / len(part), 3) for part in (train[:k], train[-k:]))
    val = [round(r[RULE], 3) for r in rows if RULE in r]
    print({"judge's score": (first, last), "rule score in validation": val})
    assert last > first + 0.1, (first, last)
    assert val[-1] > val[0], val


# long: the learning run; CI keeps the judge's scoring in the tests above
@pytest.mark.long
def test_the_policy_learns_what_the_judge_prefers(tmp_path):
    learned(judge_run(tmp_path / "run", "actor_rollout_ref.rollout.name=hf", steps=60)[0])
