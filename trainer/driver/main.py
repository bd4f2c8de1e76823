"""`rlrig train [--config-path DIR --config-name NAME] KEY=VALUE ...`: the command line of the driver, which runs
on the head under the Ray cluster."""

from __future__ import annotations

import argparse
import json
import sys

from ..config.config_files import assemble
from ..config.overrides import parse_overrides
from ..errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="rlrig train")
    parser.add_argument("--print-config", action="store_true")
    parser.add_argument("--preset")
    parser.add_argument("--config-path", help="the folder of a verl YAML config (as verl's --config-path)")
    parser.add_argument("--config-name", help="its name, with or without .yaml; the command line's keys win over it")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    try:
        cfg = parse_overrides(assemble(args.preset, args.config_path, args.config_name, args.overrides))
        if args.print_config:
            print(json.dumps(cfg.described(), indent=2))
            return 0
        from ..reward.sandbox.local import beside_run
        from .train import train

        with beside_run(cfg) as run_cfg:  # reward_model.sandbox_fusion.url=local: rlrig sandbox for the run's length
            return train(run_cfg)
    except ConfigError as e:  # bad input, found where it was read; anything else is a bug and shows its traceback
        # one a worker raised arrives as Ray's error of the call (its traceback in its text): the worker's own line
        cause = getattr(e, "cause", None)
        print(f"rlrig: error: {cause if isinstance(cause, ConfigError) else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from ..process_exit import leave

    leave(main())
