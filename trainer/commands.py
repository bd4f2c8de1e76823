"""Trainer subcommands of `rlrig`: data, export, plot, sandbox."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .reward.sandbox.cli import add_parser as add_sandbox_parser


def cmd_data(args) -> int:
    from .data.datasets import GSM8K_TOOL, arithmetic_rows, gsm8k_rows, gsm8k_tool_rows, read_records, write_parquet

    out = Path(args.out)
    if args.tools and args.dataset != "gsm8k":
        print(
            "rlrig: error: --tools writes GSM8K in verl's multi-turn schema; use it with `rlrig data gsm8k`",
            file=sys.stderr,
        )
        return 2
    rows_of = gsm8k_tool_rows if args.tools else gsm8k_rows
    if args.dataset == "arithmetic":
        kw = dict(max_operand=args.max_operand, instruct=args.instruct)
        train, test = (
            arithmetic_rows(args.train_size, "train", 1, **kw),
            arithmetic_rows(args.test_size, "test", 2, **kw),
        )
    elif args.from_file:
        records = read_records(args.from_file)
        missing = {"question", "answer"} - set(records[0]) if records else {"question", "answer"}
        if missing:
            print(
                f"rlrig: error: {args.from_file} lacks GSM8K's column(s) {', '.join(sorted(missing))}", file=sys.stderr
            )
            return 2
        cut = max(1, len(records) // 10)
        train, test = rows_of(records[cut:], "train"), rows_of(records[:cut], "test")
    else:
        try:
            import datasets
        except ModuleNotFoundError as e:
            if e.name != "datasets":  # installed but broken: its own error says more than ours would
                raise
            print(
                "rlrig: error: downloading GSM8K needs the datasets package: pip install 'rlrig[data]' "
                "(and access to the Hugging Face Hub), or pass --from FILE with GSM8K's question/answer columns",
                file=sys.stderr,
            )
            return 2
        ds = datasets.load_dataset("openai/gsm8k", "main")
        train, test = rows_of(list(ds["train"]), "train"), rows_of(list(ds["test"]), "test")
    write_parquet(train, out / "train.parquet")
    write_parquet(test, out / "test.parquet")
    print(f"wrote {len(train)} train and {len(test)} test rows to {out}")
    if args.tools:  # the answer-check tool the rows name, as verl's example config writes it (rlrig loads its port)
        import yaml

        (out / "gsm8k_tool_config.yaml").write_text(yaml.safe_dump({"tools": [GSM8K_TOOL]}, sort_keys=False))
        print(
            f"and {out / 'gsm8k_tool_config.yaml'}: train with actor_rollout_ref.rollout.multi_turn.tool_config_path="
            f"{out / 'gsm8k_tool_config.yaml'}"
        )
    return 0


def cmd_export(args) -> int:
    """A checkpoint to a Hugging Face model directory (safetensors)."""
    from .driver import checkpoint
    from .model.hf_export import write_hf_model

    ckpt = Path(args.checkpoint)
    if (ckpt / checkpoint.POINTER).is_file():
        ckpt = checkpoint.latest(str(ckpt))
    state, _, ts = checkpoint.load(ckpt)
    base = args.base or ts.get("model_path")
    if not base:
        print("rlrig: error: the checkpoint does not name its base model; pass --base MODEL_DIR", file=sys.stderr)
        return 2
    if "model" not in state:
        print(
            f"rlrig: error: {ckpt} holds no model weights (saved without 'model' in "
            "actor_rollout_ref.actor.checkpoint.save_contents); take its actor/huggingface directory if it has one",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    gguf = ts.get("gguf_file") if not args.base else ""
    write_hf_model(state["model"], base, tmp, gguf or "", ts.get("lora"))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    print(f"exported step {ts['global_step']} to {out}")
    return 0


def cmd_plot(args) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(args.run_dir) / "metrics.jsonl"
    if not path.is_file():
        print(f"rlrig: error: {path} does not exist; pass the run's trainer.default_local_dir", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    panels = [
        ("critic/score/mean", "reward"),
        ("actor/kl_loss", "KL"),
        ("response_length/mean", "response length"),
        ("perf/throughput", "tokens/s per worker"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(axes.flat, panels):
        pts = [(r["training/global_step"], r[key]) for r in rows if key in r]
        if pts:
            ax.plot(*zip(*pts))
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    out = Path(args.out or Path(args.run_dir) / "metrics.png")
    fig.savefig(out)
    print(f"wrote {out}")
    return 0


def add_subcommands(sub) -> None:
    d = sub.add_parser("data", help="write a data set in verl's GSM8K parquet schema")
    d.add_argument("dataset", choices=["arithmetic", "gsm8k"])
    d.add_argument("--out", required=True)
    d.add_argument("--from", dest="from_file", help="gsm8k: a local file with GSM8K's question/answer columns")
    d.add_argument("--train-size", type=int, default=2048)
    d.add_argument("--test-size", type=int, default=128)
    d.add_argument("--max-operand", type=int, default=9, help="arithmetic: largest operand")
    d.add_argument(
        "--tools",
        action="store_true",
        help="gsm8k: verl's multi-turn schema (tool_agent rows, the answer-check tool's config beside them)",
    )
    d.add_argument(
        "--instruct",
        action="store_true",
        help="arithmetic: ask in words with GSM8K's instruction (for pretrained chat models)",
    )
    d.set_defaults(func=cmd_data)
    e = sub.add_parser("export", help="write a checkpoint as a Hugging Face model (safetensors)")
    e.add_argument("checkpoint", help="a global_step_N directory or the run directory (latest)")
    e.add_argument("--out", required=True)
    e.add_argument("--base", help="the model the run started from (default: recorded in the checkpoint)")
    e.set_defaults(func=cmd_export)
    p = sub.add_parser("plot", help="PNG of reward, KL, response length and throughput")
    p.add_argument("run_dir")
    p.add_argument("--out")
    p.set_defaults(func=cmd_plot)
    add_sandbox_parser(sub)
