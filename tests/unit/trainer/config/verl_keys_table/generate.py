"""Writes the tables of verl's trainer-config keys that rlrig's tests read, and reports how rlrig takes each key.

The reference is a verl release on PyPI (REFERENCE). Moving to another release is one command:

    python tests/unit/trainer/config/verl_keys_table/generate.py --release 0.9.2

It downloads the release's wheel (`pip download --no-deps verl==0.9.2`), copies the wheel's
verl/trainer/config/_generated_ppo_trainer.yaml beside this file as verl_0.9.2_ppo_trainer.yaml (under a header
naming it), and prints how rlrig takes the release's leaf keys (report.py): the count of each class and the keys
rlrig does not know, each of which needs a decision in trainer/config/verl09_keys.py. The exit status is 1 while any
key is unknown. Then set REFERENCE to the release: test_verl09_keys.py reads the file it names. `--out DIR` writes
the file elsewhere (to try a release without adding it here).

    python tests/unit/trainer/config/verl_keys_table/generate.py --report [b178a3c 0.9.1 ...]

prints the same report for the tables kept here (all of them by default), with no download.

The older table, verl_trainer_keys.tsv (test_verl_keys_table.py): every leaf key of the generated config at verl
commit b178a3cd56f58b2d502255daba591e92833930a7 with verl's default, plus the older names verl's examples and
recipes still pass as overrides (verl-recipe 21892b9276936efab5375c3f6b8415e472ef7118, the submodule at that
commit), written from git by

    python tests/unit/trainer/config/verl_keys_table/generate.py --git /path/to/verl [--recipe /path/to/verl-recipe]

(bare git directories or checkouts). Its columns: key, default (override text: null, True/False, numbers,
['a','b'], {} and `${...}` as verl writes them), source (`generated`: the generated config; `examples`: only in an
override of examples/ or the recipes). A mapping that verl leaves empty or that rlrig takes whole
(engine_kwargs.vllm) is one key, in both tables.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile

import yaml

if __package__:
    from .report import Report, report
else:  # run as a script
    from report import Report, report

REFERENCE = "0.9.1"
FOLDER = pathlib.Path(__file__).parent
GENERATED = "verl/trainer/config/_generated_ppo_trainer.yaml"
VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
RECIPE_COMMIT = "21892b9276936efab5375c3f6b8415e472ef7118"
COMMIT_TABLE = FOLDER / "verl_trainer_keys.tsv"
COMMIT_NAME = VERL_COMMIT[:7]
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


def release_file(release: str, folder: pathlib.Path = FOLDER) -> pathlib.Path:
    """Where the generated config of verl `release` is kept."""
    return folder / f"verl_{release}_ppo_trainer.yaml"


def header(release: str) -> str:
    return (
        f"# verl {release}'s {GENERATED} (volcengine/verl, the verl=={release} wheel), copied\n"
        "# unchanged below this header. Copyright 2024 Bytedance Ltd. and/or its affiliates; Apache License 2.0\n"
        "# (http://www.apache.org/licenses/LICENSE-2.0).\n"
    )


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


# --- a release, from its wheel on PyPI


def fetch(release: str, into: pathlib.Path) -> pathlib.Path:
    """The wheel of verl `release`, downloaded into `into` by pip (no dependencies)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(into)]
    done = subprocess.run([*command, f"verl=={release}"], capture_output=True, text=True)
    wheels = sorted(into.glob("verl-*.whl"))
    if done.returncode or len(wheels) != 1:
        last = (done.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise SystemExit(f"pip download --no-deps verl=={release}: {last}")
    return wheels[0]


def vendor(wheel: pathlib.Path, release: str, folder: pathlib.Path = FOLDER) -> pathlib.Path:
    """The wheel's generated trainer config written, unchanged under header(release), to release_file()."""
    with zipfile.ZipFile(wheel) as whl:
        if GENERATED not in whl.namelist():
            raise SystemExit(f"{wheel.name} has no {GENERATED}: verl's generated trainer config moved; find it there")
        body = whl.read(GENERATED).decode()
    out = release_file(release, folder)
    out.parent.mkdir(parents=True, exist_ok=True)  # --out may name a folder that is not there yet
    out.write_text(header(release) + body)
    return out


def release_report(path: pathlib.Path, release: str) -> Report:
    """How rlrig takes each leaf key of a release's generated config kept at `path`."""
    return report(f"verl {release}", flatten(yaml.safe_load(path.read_text())))


def commit_table_report(path: pathlib.Path = COMMIT_TABLE) -> Report:
    """How rlrig takes each key of the table written from git (a key only the examples pass has no default)."""
    rows = [line.split("\t") for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return report(f"verl {COMMIT_NAME}", ((k, v if source == "generated" else None) for k, v, source in rows))


def tracked() -> list[str]:
    """The tables kept here: the commit's, then each release's in version order."""
    releases = [p.name.removeprefix("verl_").removesuffix("_ppo_trainer.yaml") for p in FOLDER.glob("verl_*.yaml")]
    return [COMMIT_NAME, *sorted(releases, key=lambda r: [int(x) if x.isdigit() else x for x in r.split(".")])]


def table_report(name: str) -> Report:
    if name not in tracked():
        raise SystemExit(f"no table of verl {name} here; kept: {', '.join(tracked())} (--release {name} adds one)")
    return commit_table_report() if name == COMMIT_NAME else release_report(release_file(name), name)


# --- the commit's table, from git


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


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


def write_commit_table(verl: str, recipe: str | None = None) -> None:
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
    COMMIT_TABLE.write_text("\n".join(lines + ["\t".join(r) for r in rows]) + "\n")
    print(f"{len(rows)} keys ({len(table)} generated, {len(rows) - len(table)} from examples) -> {COMMIT_TABLE}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--release", help="a verl release on PyPI: write its generated config here, then report it")
    what.add_argument("--report", nargs="*", metavar="TABLE", help=f"report tables kept here (default: {tracked()})")
    what.add_argument("--git", metavar="VERL", help=f"write {COMMIT_TABLE.name} from a verl git repository")
    parser.add_argument("--recipe", help="with --git: the verl-recipe repository, for the older names it passes")
    parser.add_argument("--out", type=pathlib.Path, default=FOLDER, help="with --release: the folder to write to")
    args = parser.parse_args(argv)
    if args.git:
        write_commit_table(args.git, args.recipe)
        return 0
    if args.release:
        with tempfile.TemporaryDirectory() as tmp:
            path = vendor(fetch(args.release, pathlib.Path(tmp)), args.release, args.out)
        print(f"-> {path}")
        reports = [release_report(path, args.release)]
    else:
        reports = [table_report(name) for name in args.report or tracked()]
    print("\n".join(r.text() for r in reports))
    return 1 if any(r.unknown for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
