"""`--config-path DIR --config-name NAME`: verl YAML configs composed into overrides, held to the override rules."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlrig.trainer.config.config_files import assemble, load
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

VERL_FILES = Path(__file__).parent / "verl_config_files"
MODEL = "actor_rollout_ref.model.path=/m"

RUN_YAML = """\
hydra:
  searchpath:
    - file://verl/trainer/config

defaults:
  - ppo_trainer
  - _self_

data:
  train_batch_size: 8
  max_prompt_length: 16
  truncation: left
actor_rollout_ref:
  model:
    path: /m
    override_config:
      attn_implementation: eager
  actor:
    ppo_mini_batch_size: 8
    optim:
      lr: 5e-4
    policy_loss:
      loss_mode: vanilla
  rollout:
    n: 4
    name: "hf"
trainer:
  logger: ['console', 'wandb']
  test_freq: -1
  val_before_train: False
  experiment_name: from_file
  default_local_dir: ckpt/${trainer.experiment_name}
  default_hdfs_dir:
ray_init:
  num_cpus: 4
"""

# the same keys as RUN_YAML, as a verl command line would give them
RUN_OVERRIDES = [
    "data.train_batch_size=8",
    "data.max_prompt_length=16",
    "data.truncation=left",
    MODEL,
    "+actor_rollout_ref.model.override_config.attn_implementation=eager",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.optim.lr=5e-4",
    "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.name=hf",
    "trainer.logger=['console','wandb']",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "trainer.experiment_name=from_file",
    "trainer.default_local_dir=ckpt/from_file",
    "trainer.default_hdfs_dir=null",
    "ray_init.num_cpus=4",
]


def write(folder: Path, **files: str) -> Path:
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def from_file(folder: Path, name: str = "run", cli: list[str] = (), preset: str | None = None):
    return parse_overrides(assemble(preset, str(folder), name, list(cli)))


def error(folder: Path, name: str = "run", cli: list[str] = ()) -> str:
    with pytest.raises(ConfigError) as e:
        from_file(folder, name, cli)
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", ["run", "run.yaml"])
def test_a_file_equals_its_keys_given_as_overrides(tmp_path, name):
    write(tmp_path, **{"run.yaml": RUN_YAML})
    assert from_file(tmp_path, name) == parse_overrides(RUN_OVERRIDES)


@pytest.mark.parametrize(
    "files, equals",
    [
        # _self_ last: the file's keys win over the file it lists
        (
            {
                "run.yaml": "defaults: [ppo_trainer, base, _self_]\ndata: {train_batch_size: 512}\n",
                "base.yaml": "data: {train_batch_size: 256, max_prompt_length: 16}\n",
            },
            ["data.train_batch_size=512", "data.max_prompt_length=16"],
        ),
        # _self_ before a file: the file listed after it wins
        (
            {
                "run.yaml": "defaults: [ppo_trainer, _self_, base]\ndata: {train_batch_size: 512}\n",
                "base.yaml": "data: {train_batch_size: 256, max_prompt_length: 16}\n",
            },
            ["data.train_batch_size=256", "data.max_prompt_length=16"],
        ),
        # no _self_: Hydra puts it last
        (
            {
                "run.yaml": "defaults: [/ppo_trainer, base]\ndata: {train_batch_size: 512}\n",
                "base.yaml": "defaults: [_self_]\ndata: {train_batch_size: 256}\n",
            },
            ["data.train_batch_size=512"],
        ),
        # no defaults list at all; an empty file is an empty config
        ({"run.yaml": "trainer: {total_epochs: 3}\n"}, ["trainer.total_epochs=3"]),
        ({"run.yaml": ""}, []),
        # interpolations read the final value, whichever file or line sets it
        (
            {
                "run.yaml": "defaults: [ppo_trainer, base, _self_]\n"
                "actor_rollout_ref: {actor: {ppo_mini_batch_size: '${data.train_batch_size}'}}\n"
                "critic: {ppo_micro_batch_size_per_gpu: '${oc.select:actor_rollout_ref.rollout.n,2}'}\n"
                "trainer: {experiment_name: '${oc.select:no.such.key,x}-${data.max_prompt_length}'}\n",
                "base.yaml": "data: {train_batch_size: 8}\n",
            },
            [
                "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "critic.ppo_micro_batch_size_per_gpu=1",
                "trainer.experiment_name=x-512",
            ],
        ),
    ],
)
def test_defaults_list_and_self_order_as_in_hydra(tmp_path, files, equals):
    write(tmp_path, **files)
    assert from_file(tmp_path, cli=[MODEL]) == parse_overrides([*equals, MODEL])


def test_the_command_line_wins_and_interpolations_see_its_values(tmp_path):
    write(tmp_path, **{"run.yaml": RUN_YAML})
    cfg = from_file(tmp_path, cli=["data.train_batch_size=16", "trainer.experiment_name=cli"])
    assert cfg.data.train_batch_size == 16
    assert cfg.trainer.default_local_dir == "ckpt/cli"
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 8  # from the file, untouched


def test_preset_then_file_then_command_line(tmp_path):
    write(tmp_path, **{"run.yaml": "data: {train_batch_size: 16, max_prompt_length: 32}\n"})
    cfg = from_file(tmp_path, cli=["data.max_prompt_length=24"], preset="embedded")
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length) == (16, 24)
    assert cfg.trainer.experiment_name == "embedded"  # the preset's key the file leaves alone
    # a model path in the file keeps the embedded preset away, as one on the command line does
    write(tmp_path, **{"run.yaml": "actor_rollout_ref: {model: {path: /m}}\n"})
    assert from_file(tmp_path).trainer.experiment_name != "embedded"


def test_relative_env_and_list_interpolations_in_a_file_resolve(tmp_path, monkeypatch):
    monkeypatch.setenv("RLRIG_CONFIG_FILES_VAR", "from-env")
    monkeypatch.delenv("RLRIG_CONFIG_FILES_UNSET", raising=False)
    write(
        tmp_path,
        **{
            "run.yaml": "trainer:\n  project_name: p\n"
            "  experiment_name: ${.project_name}-${oc.env:RLRIG_CONFIG_FILES_VAR}\n"
            "  default_local_dir: ${oc.env:RLRIG_CONFIG_FILES_UNSET,/ck}/${..trainer.project_name}\n"
            "data:\n  train_files: [x.parquet, '${trainer.project_name}.parquet']\n  val_files: a,b.parquet\n"
        },
    )
    cfg = from_file(tmp_path, cli=[MODEL])
    t = cfg.trainer
    assert (t.experiment_name, t.default_local_dir) == ("p-from-env", "/ck/p")
    assert (cfg.data.train_files, cfg.data.val_files) == (["x.parquet", "p.parquet"], "a,b.parquet")


def test_interpolation_on_the_command_line_resolves_as_in_verl():
    cfg = parse_overrides(
        [MODEL, "trainer.experiment_name=e1", "trainer.default_local_dir=ck/${trainer.experiment_name}"]
    )
    assert cfg.trainer.default_local_dir == "ck/e1"


@pytest.mark.parametrize(
    "files, cli, says",
    [
        (
            {"run.yaml": "data:\n  train_batch_size: 8\n  train_batch_sise: 8\n"},
            [],
            "run.yaml:3: unknown config key 'data.train_batch_sise'; did you mean data.train_batch_size?",
        ),
        (
            {"run.yaml": "actor_rollout_ref:\n  rollout:\n    agent:\n      custom_async_server: {path: s.py}\n"},
            [],
            "run.yaml:4: actor_rollout_ref.rollout.agent.custom_async_server.path: a verl key rlrig does not implement",
        ),
        (
            {"run.yaml": "trainer:\n  total_epochs: many\n"},
            [],
            "run.yaml:2: trainer.total_epochs='many': expected a whole number",
        ),
        # a key from a listed file names that file
        (
            {"run.yaml": "defaults: [ppo_trainer, base, _self_]\n", "base.yaml": "\ncritic: {bogus: 1}\n"},
            [],
            "base.yaml:2: unknown config key 'critic.bogus'",
        ),
        (
            {"run.yaml": "hydra:\n  run:\n    dir: out\n"},
            [],
            "run.yaml:3: hydra.run.dir: Hydra's own settings are not in rlrig",
        ),
        ({"run.yaml": "data: {train_batch_size: 8\n"}, [], "run.yaml:2: not valid YAML: expected ',' or '}'"),
        ({"run.yaml": "a: 1\n b: 2\n"}, [], "run.yaml:2: not valid YAML: mapping values are not allowed here"),
        ({"run.yaml": "- data.train_batch_size=8\n"}, [], "run.yaml: a config file is a mapping of keys"),
        (
            {"run.yaml": "just text\n"},
            [],
            "run.yaml: a config file is a mapping of keys (data:, trainer:, ...), not a single value",
        ),
        ({"run.yaml": "defaults: ppo_trainer\n"}, [], "run.yaml:1: defaults must be a list"),
        (
            {"run.yaml": "defaults:\n  - ppo_trainer\n  - actor@actor_rollout_ref.actor: dp_actor\n"},
            [],
            "run.yaml:3: defaults entry 'actor@actor_rollout_ref.actor: dp_actor' chooses a config group",
        ),
        (
            {"run.yaml": "defaults:\n  - override hydra/job_logging: disabled\n"},
            [],
            "run.yaml:2: defaults entry 'override hydra/job_logging: disabled' chooses a config group",
        ),
        ({"run.yaml": "defaults:\n  - optional my_site\n"}, [], "run.yaml:2: defaults entry 'optional my_site'"),
        (
            {"run.yaml": "defaults:\n  - ppo_megatron_trainer\n"},
            [],
            "run.yaml:2: defaults entry 'ppo_megatron_trainer': Megatron is not in rlrig",
        ),
        (
            {"run.yaml": "defaults:\n  - ppo_trainer\n  - missing_base\n"},
            [],
            "run.yaml:3: defaults entry 'missing_base': no config file",
        ),
        (
            {"run.yaml": "defaults: [_self_, ppo_trainer]\ndata: {train_batch_size: 8}\n"},
            [],
            "run.yaml:1: defaults entry ppo_trainer after entries that set keys would reset them",
        ),
        ({"run.yaml": "defaults: [ppo_trainer, _self_, _self_]\n"}, [], "run.yaml:1: _self_ is listed twice"),
        ({"run.yaml": "defaults: [ppo_trainer, run]\n"}, [], "(its defaults list includes itself)"),
        # interpolations OmegaConf cannot resolve: its reason, after the file, line and key
        (
            {"run.yaml": "trainer: {experiment_name: '${oc.env:RLRIG_CONFIG_FILES_UNSET}'}\n"},
            [],
            "run.yaml:1: trainer.experiment_name: ${oc.env:RLRIG_CONFIG_FILES_UNSET}: KeyError raised while resolving "
            "interpolation: \"Environment variable 'RLRIG_CONFIG_FILES_UNSET' not found\"",
        ),
        (
            {"run.yaml": "trainer: {experiment_name: '${no.such.key}'}\n"},
            [],
            "run.yaml:1: trainer.experiment_name: ${no.such.key}: Interpolation key 'no.such.key' not found",
        ),
        (
            {
                "run.yaml": "trainer: {experiment_name: '${trainer.project_name}', "
                "project_name: '${trainer.experiment_name}'}"
            },
            [],
            "Recursive interpolation detected",
        ),
        # a comma on the command line is Hydra's sweep; in a YAML file it is text (below)
        ({"run.yaml": "data: {train_batch_size: 8}\n"}, ["trainer.experiment_name=a,b"], "Hydra reads this as a sweep"),
        # a bad command-line key after a good file still fails as before, with no file named
        ({"run.yaml": "data: {train_batch_size: 8}\n"}, ["data.bogus=1"], "unknown config key 'data.bogus'"),
    ],
)
def test_errors_are_one_line_naming_file_line_and_key(tmp_path, files, cli, says):
    write(tmp_path, **files)
    message = error(tmp_path, cli=[MODEL, *cli])
    assert says in message
    if cli:
        assert "run.yaml" not in message


@pytest.mark.parametrize(
    "path, name, says",
    [
        ("nowhere", "run", "--config-path {tmp}/nowhere: no such folder"),
        (".", "absent", "--config-name absent: no config file {tmp}/absent.yaml"),
        (".", None, "--config-path needs --config-name"),
        (None, "run", "--config-name needs --config-path"),
    ],
)
def test_missing_folder_file_or_half_of_the_pair(tmp_path, path, name, says):
    folder = None if path is None else str(tmp_path / path) if path != "." else str(tmp_path)
    with pytest.raises(ConfigError, match=None) as e:
        assemble(None, folder, name, [])
    assert says.format(tmp=tmp_path) in str(e.value)


# verl's own config files (copied in verl_config_files/ with their path and commit): what rlrig says of each
VERL_CONFIGS = [
    (
        "gsm8k_multiturn_megatron_grpo",
        "gsm8k_multiturn_megatron_grpo.yaml:7: defaults entry 'ppo_megatron_trainer': Megatron is not in rlrig",
    ),
    # data.tokenizer: null is verl's default, accepted (verl_keys); the first refusal is a value rlrig does not take
    ("ppo_trainer_split", "ppo_trainer_split.yaml:57: actor_rollout_ref.actor.optim.min_lr_ratio=null is not allowed"),
    (
        "ppo_trainer",
        "ppo_trainer.yaml:13: defaults entry 'actor@actor_rollout_ref.actor: dp_actor' chooses a config group",
    ),
]


@pytest.mark.parametrize("name, says", VERL_CONFIGS)
def test_verl_config_files_are_read_or_refused_in_one_line(name, says):
    message = error(VERL_FILES, name)
    assert f"{VERL_FILES}/{says}" in message


def test_verls_fully_async_config_is_taken_with_its_scripts_switches():
    """Its scripts switch the hybrid engine off and set data.train_batch_size=0, which verl asserts."""
    assert "need a pool of their own: set actor_rollout_ref.hybrid_engine=False" in error(
        VERL_FILES, "fully_async_ppo_trainer"
    )
    cli = ["actor_rollout_ref.hybrid_engine=False", "data.train_batch_size=0"]
    cfg = parse_overrides([*load(str(VERL_FILES), "fully_async_ppo_trainer"), *cli])
    at = cfg.async_training
    assert cfg.trainer.async_mode == "fully_async_policy"
    assert (at.staleness_threshold, at.trigger_parameter_sync_step, at.require_batches) == (0.1, 4, 1)
    assert at.partial_rollout and at.use_rollout_log_probs and not at.compute_prox_log_prob
    r = cfg.rollout
    assert (r.nnodes, r.n_gpus_per_node, r.total_rollout_steps, r.total_epochs, r.test_freq) == (1, 8, 100, 10, 1)
    assert cfg.data.gen_batch_size == 1 and cfg.data.train_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size


def test_verls_one_step_off_policy_config_is_taken_with_its_scripts_switch():
    """The recipe's file sizes a rollout pool; its scripts add hybrid_engine=False, without which the pool's keys
    would be left unused, so they are refused."""
    assert "rollout.n_gpus_per_node sizes the rollout pool of actor_rollout_ref.hybrid_engine=False" in error(
        VERL_FILES, "one_step_off_ppo_trainer"
    )
    cli = ["actor_rollout_ref.hybrid_engine=False", "trainer.async_mode=one_step_off_policy"]
    cfg = parse_overrides([*load(str(VERL_FILES), "one_step_off_ppo_trainer"), *cli])
    assert (cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node) == (1, 8)
    assert cfg.algorithm.rollout_correction.bypass_mode and not cfg.actor_rollout_ref.rollout.free_cache_engine


def test_verl_example_composes_past_what_rlrig_lacks():
    """Everything in verl's split-placement example but its keys rlrig lacks reads as verl reads it, the
    interpolations included (`${data.max_prompt_length}`, `${trainer.project_name}` inside a string)."""
    overrides = load(str(VERL_FILES), "ppo_trainer_split")
    assert overrides[0].where == f"{VERL_FILES}/ppo_trainer_split.yaml:13"
    wanted = {
        "data.max_prompt_length",
        "data.train_batch_size",
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "trainer.default_local_dir",
        "trainer.logger",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        "trainer.project_name",
        "trainer.experiment_name",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "trainer.n_gpus_per_node",
        "actor_rollout_ref.rollout.name",
    }
    cfg = parse_overrides([o for o in overrides if o.split("=")[0] in wanted])
    assert cfg.data.max_prompt_length == 512 and cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.trainer.default_local_dir == "checkpoints/verl_examples/gsm8k"
    assert cfg.trainer.logger == ["console", "wandb"]


def test_rlrig_train_print_config_reads_the_file(tmp_path):
    """The whole path a user takes: the entry point's parser, passed through to the trainer's."""
    write(tmp_path, **{"run.yaml": RUN_YAML})
    args = ["--config-path", str(tmp_path), "--config-name", "run", "--print-config", "data.train_batch_size=16"]
    out = subprocess.run([sys.executable, "-m", "rlrig.entrypoint.cli", "train", *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    assert (cfg["data"]["train_batch_size"], cfg["actor_rollout_ref"]["rollout"]["n"]) == (16, 4)
    write(tmp_path, **{"run.yaml": "data:\n  bogus: 1\n"})
    out = subprocess.run([sys.executable, "-m", "rlrig.entrypoint.cli", "train", *args], capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert (
        out.stderr == f"rlrig: error: {tmp_path}/run.yaml:2: unknown config key 'data.bogus'; did you mean data.seed?\n"
    )
