"""How often `max_grad_norm` clips on each backend at one lr: the share of training steps whose
gradient norm (before clipping) exceeds it, per seed, and its mean and spread over seeds.

    python bench/bench_clip_share.py [--seeds 0 1 2] [--steps 10] [--lr 2e-3] [--note TEXT]
    python bench/bench_clip_share.py --model <SmolLM2 dir> --task arithmetic --lr 1e-3

Each backend at its own default loss (ours: importance_sampling, tokens summed; backend=trl:
TRL's default dapo, a token mean), the same model, batch and seeds, trained in this process
(`trainer.train` with a recorder), evals off. Runs alternate backends seed by seed so load
drift on a shared host hits both alike. Results: bench/results/clip_share.json (the tiny
model) or clip_share_<model directory's name>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from machine_info import machine  # bench/ is on the path: this runs as a script

import trainer
from records.metrics import GRAD_NORM
from trainer.base.config import config_dir

RESULTS = Path(__file__).parent / "results"


class Norms:
    """A reporter keeping each step's gradient norm."""

    def __init__(self) -> None:
        self.by_step: dict[int, float] = {}

    def report(self, step: int, metrics) -> None:
        if GRAD_NORM in metrics:
            self.by_step[step] = float(metrics[GRAD_NORM])


def one_run(backend: str, seed: int, args: argparse.Namespace) -> list[float]:
    overrides = [
        f"backend={backend}", f"seed={seed}", f"max_steps={args.steps}", f"lr={args.lr}",
        "eval_every=0", "batch_size=8", "group_size=4", f"task={args.task}",
        f"output_dir={args.out}/{backend}-{seed}",
    ]  # fmt: skip
    if args.model:
        overrides += ["model=hf", f"model.path={args.model}", "model.dtype=float32"]  # as TRL
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    norms = Norms()
    trainer.train(cfg, norms)
    return [norms.by_step[s] for s in sorted(norms.by_step)]


def share_clipped(norms: list[float], bound: float) -> float:
    return sum(n > bound for n in norms) / len(norms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--note", default="")
    parser.add_argument("--model", type=Path, default=None, help="a model directory (tiny if none)")
    parser.add_argument("--task", default="addition")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_clip_share"))
    args = parser.parse_args()
    bound = 1.0  # max_grad_norm's default on both backends
    runs: dict[str, list[dict]] = {"ours": [], "trl": []}
    for seed in args.seeds:
        for backend in runs:
            norms = one_run(backend, seed, args)
            runs[backend].append(
                {"seed": seed, "grad_norms": norms, "share_clipped": share_clipped(norms, bound)}
            )
            print(backend, seed, runs[backend][-1]["share_clipped"], file=sys.stderr)
    summary = {}
    for backend, done in runs.items():
        shares = [r["share_clipped"] for r in done]
        medians = [statistics.median(r["grad_norms"]) for r in done]
        summary[backend] = {
            "share_clipped_mean": statistics.mean(shares),
            "share_clipped_sd": statistics.stdev(shares) if len(shares) > 1 else None,
            "median_grad_norm_by_seed": medians,
        }
    result = {
        "machine": machine(args.note),
        "settings": {
            **vars(args),
            "out": None,  # no machine path
            "model": args.model.name if args.model else "tiny",
            "max_grad_norm": bound,
        },
        "summary": summary,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    name = f"clip_share_{args.model.name}.json" if args.model else "clip_share.json"
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
