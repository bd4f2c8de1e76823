"""Extract the override lists of every shell script in verl's examples/ at a commit or tag into a table.

    .venv/bin/python tests/unit/trainer/config/verl_scripts/extract.py /path/to/verl-git-dir [--update-expected]
    .venv/bin/python tests/unit/trainer/config/verl_scripts/extract.py --git-dir DIR --ref v0.9.0 [--update-expected]

The pinned commit (COMMIT) writes overrides.json and expected.json; another ref writes overrides_<release>.json and
expected_<release>.json beside them (v0.9.0 -> overrides_0.9.0.json), with the commit the ref names.

Each script is run by bash with no external command available: every command is a stub that succeeds and does
nothing, and the one that runs a Python entry point (`python3 -m verl.trainer.main_ppo`, `python3 X.py`, also
behind srun or `ray job submit --`) records its arguments. So bash itself resolves the variables the script
defines (`${VAR:-default}`, `$((a + b))`, `$1` defaults), and `$@` is empty (the script gets no arguments).
Only bash builtins run, in an empty temporary folder, with HOME=/home/user, a one-node Slurm job's variables
(SLURM) and nothing else in the environment; `set -u` is dropped, so a variable the script does not define is
empty. A `python -c` probe for Ascend's torch_npu fails, as on a GPU machine (verl 0.9's scripts pick the device
by it). A variable the script requires (`${VAR:?message}`) is set to /required/VAR, a path the placeholders
below replace where it is a data or model path. A script that stops before its command (the SFT scripts want
arguments) gets its entry from its text.

Data and model paths are replaced by placeholders (PLACEHOLDERS below); every other value is kept as bash left
it. Each script gets its folder (the first folder under examples/), its entry point, its Hydra `--config-name`
if any, and `scope`: "in", or why it is out of scope (SCOPE_RULES, first match). With --update-expected,
expected.json (script -> "accepted" or the first refusal line of rlrig's parser) is rewritten from the result.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
HERE = Path(__file__).parent
HOME = "/home/user"
CWD = "/verl"  # how the temporary folder the scripts run in is written: verl's checkout, where they run from
# the Slurm scripts run as the one-node, 8-GPU job their #SBATCH lines ask for
SLURM = {"SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_GPUS_PER_NODE": "8"}

STUB = r"""
trap '' PIPE
ulimit() { :; }  # raising a limit needs a privilege the extraction does not have, and does not change a value
set() {  # without nounset: a variable the script reads from its environment expands to nothing
  local a out=()
  for a in "$@"; do
    case "$a" in
      -o) ;;
      nounset) ;;
      --*) out+=("$a") ;;
      -*) a="${a//u/}"; [[ "$a" != - ]] && out+=("$a") ;;
      *) out+=("$a") ;;
    esac
  done
  builtin set "${out[@]}"
}
command_not_found_handle() {
  local args=("$@") i entry=""
  if [[ "${args[0]}" == python* && " ${args[*]} " == *" -c "*torch_npu* ]]; then return 1; fi
  for ((i = 0; i < ${#args[@]}; i++)); do
    if [[ "${args[i]}" == -m && $((i + 1)) -lt ${#args[@]} && "${args[i+1]}" == verl.* ]]; then
      entry="${args[i+1]}"; i=$((i + 1)); break
    fi
    if [[ "${args[i]}" == *.py && "${args[0]}" == python* ]]; then entry="${args[i]}"; break; fi
  done
  if [[ -n "$entry" ]]; then
    printf '%s\0' "@@CALL@@" "$entry" "${args[@]:i+1}" >> "$VERL_EXTRACT_OUT"
  fi
  while IFS= read -r _; do :; done  # a stub reading a pipe drains it
  return 0
}
"""


def required_variables(text: str) -> dict[str, str]:
    """The variables the script stops without (`${VAR:?message}`), each set to a placeholder path."""
    return {v: f"/required/{v}" for v in re.findall(r"\$\{(\w+):?\?", text)}


def run_script(path: Path, workdir: Path) -> list[tuple[str, list[str]]]:
    """Every Python entry point the script runs, in order: (entry, arguments)."""
    out = workdir / "calls.bin"
    out.unlink(missing_ok=True)
    stub = workdir / "stub.sh"
    stub.write_text(STUB)
    run = workdir / "run"
    run.mkdir(exist_ok=True)
    env = {"HOME": HOME, "PATH": "/nonexistent", "BASH_ENV": str(stub), "VERL_EXTRACT_OUT": str(out), **SLURM}
    env = {**required_variables(path.read_text()), **env}
    try:
        subprocess.run(
            ["/bin/bash", str(path)],
            cwd=run,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pass
    if not out.exists():
        return []
    parts = out.read_bytes().decode().split("\0")[:-1]
    calls: list[tuple[str, list[str]]] = []
    for p in parts:
        if p == "@@CALL@@":
            calls.append(("", []))
        elif not calls[-1][0]:
            calls[-1] = (p, [])
        else:
            calls[-1][1].append(p.replace(str(run), CWD))
    return calls


def split_hydra(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """Hydra's own flags (--config-path/--config-name, `=` or a separate value) apart from the overrides."""
    flags: dict[str, str] = {}
    overrides: list[str] = []
    it = iter(args)
    for a in it:
        if a.startswith("--"):
            name, _, value = a[2:].partition("=")
            flags[name] = value if _ else next(it, "")
        elif a.strip():
            overrides.append(a)
    return flags, overrides


def _placeholder(key: str, value: str) -> str:
    k = key.lstrip("+")
    if k in ("data.train_files", "data.val_files"):
        stem = "train" if k == "data.train_files" else "test"
        try:
            v = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            v = value
        if isinstance(v, list) and len(v) > 1:
            return "[" + ", ".join(f"'/data/{stem}_{i}.parquet'" for i in range(len(v))) + "]"
        return f"/data/{stem}.parquet"
    if re.fullmatch(r"[a-z_]+\.model\.(path|tokenizer_path|lora_adapter_path)", k):
        return "/models/" + k.split(".")[0]
    if k == "reward_model.sandbox_fusion.url":
        return "http://sandbox:8080"
    return value


def placeholders(overrides: list[str]) -> list[str]:
    out = []
    for o in overrides:
        key, eq, value = o.partition("=")
        out.append(f"{key}={_placeholder(key, value)}" if eq else o)
    return out


# Why a script is out of scope, first match wins: (reason, test on (name, text, entry, config_name, overrides)).
def _has(overrides: list[str], pattern: str) -> bool:
    return any(re.search(pattern, o) for o in overrides)


def _ascend_only(text: str) -> bool:
    """The script names Ascend, and is not one for both devices: one that picks its device by probing torch_npu has
    run its GPU path here, and one whose comments name GPUs and NPUs together runs on either."""
    both = "import torch_npu" in text or re.search(r"^#.*(GPU.*NPU|NPU.*GPU)", text, re.M)
    return "ascend" in text.lower() and not both


SCOPE_RULES = [
    (
        "other entry point (SFT, generation, eval, split placement's main_ppo_split.py)",
        lambda n, t, e, c, o: e != "verl.trainer.main_ppo",
    ),
    (
        "Megatron (ppo_megatron_trainer config, a megatron or mindspeed strategy or model engine, Megatron Lite)",
        lambda n, t, e, c, o: (
            "megatron" in c
            or "megatron" in n.lower()
            or _has(o, r"strategy=(mindspeed_)?megatron|model_engine=(megatron|mindspeed)")
            or _has(o, r"\.megatron\.")
        ),
    ),
    (
        "NPU/Ascend",
        lambda n, t, e, c, o: "npu" in n.lower() or "ascend" in n.lower() or _has(o, r"device=npu") or _ascend_only(t),
    ),
    (
        "another training engine (VeOmni, Automodel, TorchTitan)",
        lambda n, t, e, c, o: (
            bool(re.search(r"veomni|automodel|torchtitan", n.lower()))
            or _has(o, r"(model_engine|strategy|\.engine)=(veomni|automodel|torchtitan)")
        ),
    ),
    (
        "TensorRT-LLM",
        lambda n, t, e, c, o: "trtllm" in n.lower() or _has(o, r"rollout\.name=trtllm"),
    ),
    (
        "vision-language (multi-modal data or model)",
        lambda n, t, e, c, o: (
            bool(re.search(r"(^|[_\-/])vl([_\-.]|m|$)|geo3k", n.lower()))
            or _has(o, r"image_key|video_key|multi_modal|-VL")
            or "geo3k" in c
        ),
    ),
    (
        "multi-turn/agent (sglang_multiturn, tools, agent loop)",
        lambda n, t, e, c, o: (
            n.startswith("sglang_multiturn/")
            or "multiturn" in c
            or _has(o, r"multi_turn\.enable=[Tt]rue|tool_config_path|interaction_config_path|rollout\.agent\.")
        ),
    ),
]


def scope_of(name: str, text: str, entry: str, config_name: str, overrides: list[str]) -> str:
    for reason, test in SCOPE_RULES:
        if test(name, text, entry, config_name, overrides):
            return reason
    return "in"


def extract(examples: Path) -> dict[str, dict]:
    scripts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(examples.rglob("*.sh")):
            name = str(path.relative_to(examples))[: -len(".sh")]
            text = path.read_text()
            # `key=value \  # comment` ends the command in bash (the lines after it run as another command);
            # the script means one command: the comment is dropped
            fixed = re.sub(r"\\[ \t]+#[^\n]*\n", "\\\n", text)
            if fixed != text:
                path.write_text(fixed)
            calls = run_script(path, Path(tmp))
            ppo = [c for c in calls if c[0] == "verl.trainer.main_ppo"]
            entry, args = (ppo or calls or [("", [])])[0]
            if not entry:  # it stopped before its command (the SFT scripts want arguments): the entry from its text
                m = re.search(r"-m\s+(verl\.[\w.]+)", path.read_text())
                entry = m.group(1) if m else ""
            flags, overrides = split_hydra(args)
            config_name = flags.get("config-name", "").strip("'\"")
            s: dict = {"folder": name.split("/")[0], "entry": entry or "none"}
            if config_name:
                s["config_name"] = config_name
            if len(ppo) > 1:
                s["main_ppo_runs"] = len(ppo)
            if fixed != text:
                s["note"] = "a comment after a line continuation dropped, so the command goes on past it"
            s["scope"] = scope_of(name, text, entry, config_name, overrides)
            s["overrides"] = placeholders(overrides)
            scripts[name] = s
    return scripts


def outcome(overrides: list[str]) -> str:
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    try:
        parse_overrides(overrides)
    except ConfigError as e:
        return str(e).splitlines()[0]
    return "accepted"


def table_names(ref: str, commit: str) -> tuple[str, str]:
    """The table files a ref is written to: the pinned commit's own, or ones named for the release."""
    if commit == COMMIT:
        return "overrides.json", "expected.json"
    release = ref.removeprefix("v")
    return f"overrides_{release}.json", f"expected_{release}.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("verl_git_dir", nargs="?", help="verl's git directory (bare or not); or --git-dir")
    p.add_argument("--git-dir", dest="git_dir", help="verl's git directory (bare or not)")
    p.add_argument("--ref", default=COMMIT, help=f"the commit or tag whose examples/ are read (default {COMMIT})")
    p.add_argument("--update-expected", action="store_true", help="rewrite the expected table from the result")
    a = p.parse_args()
    git_dir = a.git_dir or a.verl_git_dir
    if not git_dir:
        p.error("name verl's git directory (positional or --git-dir)")
    git = ["git", "--git-dir", git_dir] if Path(git_dir, "HEAD").is_file() else ["git", "-C", git_dir]
    commit = subprocess.run([*git, "rev-parse", a.ref + "^{commit}"], check=True, capture_output=True, text=True)
    commit = commit.stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tar = subprocess.run([*git, "archive", commit, "examples"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
        scripts = extract(Path(tmp) / "examples")
    data = {"verl_commit": commit, "scripts": scripts}
    if commit != COMMIT:
        data = {"verl_ref": a.ref, **data}
    overrides_name, expected_name = table_names(a.ref, commit)
    (HERE / overrides_name).write_text(json.dumps(data, indent=1) + "\n")
    n_in = sum(s["scope"] == "in" for s in scripts.values())
    print(f"{len(scripts)} scripts, {n_in} in scope -> {overrides_name}", file=sys.stderr)
    if a.update_expected:
        expected = {n: outcome(s["overrides"]) for n, s in scripts.items() if s["scope"] == "in"}
        (HERE / expected_name).write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    os.umask(0o022)
    main()
