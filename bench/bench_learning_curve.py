"""Held-out reward over training, per seed, for two versions of the trainer side by side.

    git worktree add /tmp/before <commit>
    python bench/bench_learning_curve.py --code /tmp/before . --seeds 0 1 2 3 --steps 60

Each `--code` directory is a checkout whose `trainer` package and `conf/` are used; every run
trains the default config from the same model checkpoint (the tiny model this checkout builds),
alternating versions seed by seed. Prints and writes (bench/results/learning_curve.json) the
eval curves, and per version the final held-out reward's mean over seeds with its standard
error: a speed-up must leave the curve within that noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
RUN = """
import json, logging, sys, tempfile, time
sys.path.insert(0, {code!r})
from hydra import compose, initialize_config_dir
from trainer.run.train import train
logging.disable(logging.WARNING)
curve = {{}}
class Curve:
    def report(self, step, metrics):
        if "eval/reward/mean" in metrics:
            curve[step] = [metrics["eval/reward/mean"], metrics.get("eval/greedy/mean")]
with tempfile.TemporaryDirectory() as out, initialize_config_dir(
    config_dir={code!r} + "/conf", version_base="1.3"
):
    cfg = compose("config", overrides=[f"output_dir={{out}}", *{overrides!r}])
    started = time.perf_counter()
    train(cfg, Curve())
print(json.dumps({{"curve": curve, "wall_s": time.perf_counter() - started}}))
"""


def one_run(code: str, overrides: list[str]) -> dict:
    script = RUN.format(code=str(Path(code).resolve()), overrides=overrides)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"run in {code} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], float("nan")
    return statistics.mean(values), statistics.stdev(values) / len(values) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", nargs="+", default=["."], help="checkouts to compare")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hydra import compose, initialize_config_dir

    from trainer.base.config import config_dir
    from trainer.sampling.tiny_model import build_tiny_model

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        model = build_tiny_model(compose("config").model.tiny)
    label = {code: Path(code).resolve().name for code in args.code}  # no machine paths
    runs: dict[str, list[dict]] = {label[code]: [] for code in args.code}
    for seed in args.seeds:
        for code in args.code:
            overrides = [f"model.path={model}", f"seed={seed}", f"max_steps={args.steps}"]
            result = one_run(code, overrides)
            runs[label[code]].append({"seed": seed, **result})
            final = result["curve"][str(args.steps)]
            print(
                f"{label[code]} seed {seed}: final {final} in {result['wall_s']:.1f}s", flush=True
            )
    summary = {}
    for code, results in runs.items():
        sampled = [r["curve"][str(args.steps)][0] for r in results]
        greedy = [r["curve"][str(args.steps)][1] for r in results]
        summary[code] = {
            "final_sampled_mean_stderr": mean_and_stderr(sampled),
            "final_greedy_mean_stderr": mean_and_stderr(greedy),
            "wall_s_median": statistics.median(r["wall_s"] for r in results),
        }
    report = {"steps": args.steps, "date": time.strftime("%Y-%m-%d"), "runs": runs}
    report["summary"] = summary
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "learning_curve.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
