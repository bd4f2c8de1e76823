"""Writes verl_trainer_keys.tsv: every leaf key of verl's PPO trainer config with verl's default, plus the older
names verl's examples and recipes still pass as overrides.

verl commit b178a3cd56f58b2d502255daba591e92833930a7 (verl-recipe 21892b9276936efab5375c3f6b8415e472ef7118, the
submodule at that commit). At a new pin: update the two commits here and run

    python tests/unit/trainer/config/verl_keys_table/generate.py /path/to/verl \
        [/path/to/verl-recipe]

(bare git directories or checkouts), then test_verl_keys_table.py says which new keys need a decision in
trainer/config/verl_keys.py.

Columns: key, default (override text: null, True/False, numbers, ['a','b'], {} and `${...}` as verl writes them),
source (`generated`: verl/trainer/config/_generated_ppo_trainer.yaml; `examples`: only in an override of
examples/ or the recipes). A mapping that verl leaves empty or that rlrig takes whole (engine_kwargs.vllm) is one key.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import yaml

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
RECIPE_COMMIT = "21892b9276936efab5375c3f6b8415e472ef7118"
GENERATED = "verl/trainer/config/_generated_ppo_trainer.yaml"
TOP = (
    "actor_rollout_ref",
    "critic",
    "data",
    "algorithm",
    "trainer",
    "reward_model",
    "custom_reward_function",
    "ray_kwargs",
    "global_profiler",
    "transfer_queue",
    "reward",
    "reward_manager",
    "ray_init",
    "async_training",
)
OVERRIDE = re.compile(r"(?<![\w.$])\+{0,2}((?:" + "|".join(TOP) + r")\.[A-Za-z0-9_.]+)=")
# mappings taken whole: their items are the engine's own arguments, not verl's keys
WHOLE = re.compile(r"\.engine_kwargs\.(vllm|sglang|trtllm)$|\.override_config$|\.apply_chat_template_kwargs$")
PPO_MAIN = r"verl\.trainer\.main_ppo|fully_async_main|-m recipe\.[a-z_.]*main"
OTHER_MAIN = re.compile(r"sft_trainer|main_generation|main_eval")
OUT = pathlib.Path(__file__).with_name("verl_trainer_keys.tsv")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def text(value) -> str:
    """A default as override text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (list, dict)):
        return repr(value)
    return str(value)


def flatten(node: dict, prefix: str = ""):
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not WHOLE.search(key):
            yield from flatten(v, key + ".")
        else:
            yield key, text(v)


def example_keys(repo: str, commit: str, paths: list[str]) -> set[str]:
    """Keys overridden in the scripts that run verl's PPO trainer or a recipe's trainer built on its config (not the
    SFT, generation or evaluation scripts, whose configs are others)."""
    found = set()
    for name in git(repo, "grep", "-lE", PPO_MAIN, commit, "--", *paths).splitlines():
        body = git(repo, "show", name)  # name is "commit:path"
        if OTHER_MAIN.search(body):
            continue
        for m in re.finditer(r"\+{0,2}[A-Za-z0-9_.]+=", body):
            k = OVERRIDE.fullmatch(m.group(0))
            if k:
                found.add(k.group(1).rstrip("."))
    return found


def covered(key: str, table: dict) -> bool:
    """In the table, or an item of a mapping the table has as one key (engine_kwargs.vllm.swap_space)."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in table for i in range(len(parts), 0, -1))


def main(verl: str, recipe: str | None = None) -> None:
    table = dict(flatten(yaml.safe_load(git(verl, "show", f"{VERL_COMMIT}:{GENERATED}"))))
    extra = example_keys(verl, VERL_COMMIT, ["examples"])
    if recipe:
        extra |= example_keys(recipe, RECIPE_COMMIT, ["."])
    rows = [(k, v, "generated") for k, v in table.items()]
    rows += [(k, "", "examples") for k in sorted(extra) if not covered(k, table)]
    lines = [
        f"# verl {VERL_COMMIT}, verl-recipe {RECIPE_COMMIT}: written by generate.py beside this file",
        "# key\tdefault\tsource",
    ]
    OUT.write_text("\n".join(lines + ["\t".join(r) for r in rows]) + "\n")
    print(f"{len(rows)} keys ({len(table)} generated, {len(rows) - len(table)} from examples) -> {OUT}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
