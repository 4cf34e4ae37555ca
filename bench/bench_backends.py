"""The same sweep on both backends: time to verdict, each trial's step time, and whether the two
pick the same winner (or call it tied).

    python bench/bench_backends.py [--rounds 2] [--steps 6] [--model-path DIR] [--note TEXT]

One sweep is a 2 x 2 grid like the README's (`group_size=4,8 lr=...`), run as a user runs it
(`python -m sweeper -m`, a fresh directory, the default SQLite stores), once with
`backend=ours` and once with `backend=trl`, alternated round by round (A B A B) so load drift
on a shared host hits both alike. A trial's step time is the median gap between its
consecutive training steps' MLflow timestamps, eval steps left out. The verdict's first line
("Best: ...") and its tie lines are kept as printed. Results: bench/results/backends.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
from machine_info import machine  # bench/ is on the path: this runs as a script
from mlflow.tracking import MlflowClient

from records.metrics import LOSS
from records.sweep import TrialAttr

RESULTS = Path(__file__).parent / "results"
GRID = ["group_size=4,8", "lr=1e-3,3e-3"]


def one_sweep(backend: str, steps: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db"}
        args = [*GRID, f"backend={backend}", f"max_steps={steps}", f"eval_every={steps // 2}"]
        args += ["batch_size=8", "hydra.sweeper.seeds=1", *extra]  # one run a point, as recorded
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "sweeper", "-m", *args],
            cwd=cwd, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        wall = time.perf_counter() - start
        storage = f"sqlite:///{cwd}/sweeps.db"
        study = optuna.load_study(
            study_name=optuna.get_all_study_names(storage)[0], storage=storage
        )
        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        trials = {}
        for t in study.trials:
            history = client.get_metric_history(t.user_attrs[TrialAttr.MLFLOW_RUN_ID], LOSS)
            stamps = sorted((m.step, m.timestamp) for m in history)
            gaps = [(b[1] - a[1]) / 1000 for a, b in zip(stamps, stamps[1:], strict=False)]
            eval_steps = {s for s in range(steps // 2, steps + 1, steps // 2)}
            train_gaps = [
                g for (s, _), g in zip(stamps[1:], gaps, strict=True) if s not in eval_steps
            ]
            trials[f"t{t.number} {t.params}"] = {
                "state": t.state.name,
                "value": t.value,
                "step_s": statistics.median(train_gaps) if train_gaps else None,
            }
        verdict = [line for line in done.stdout.splitlines() if line.startswith(("Best:", "Tied"))]
        return {"backend": backend, "wall_s": wall, "trials": trials, "verdict": verdict}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--note", default="")
    a = parser.parse_args()
    extra = (
        [f"model.path={a.model_path}", "task=arithmetic", "max_tokens=16"] if a.model_path else []
    )
    runs = []
    for round_ in range(a.rounds):
        for backend in ("ours", "trl"):
            runs.append({"round": round_, **one_sweep(backend, a.steps, extra)})
            print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for backend in ("ours", "trl"):
        mine = [r for r in runs if r["backend"] == backend]
        steps = [t["step_s"] for r in mine for t in r["trials"].values() if t["step_s"]]
        summary[backend] = {
            "wall_s_median": statistics.median(r["wall_s"] for r in mine),
            "wall_s": [round(r["wall_s"], 1) for r in mine],
            "step_s_median": statistics.median(steps) if steps else None,
            "step_s_range": [min(steps), max(steps)] if steps else None,
            "best": [r["verdict"][:1] for r in mine],
        }
    out = {
        "grid": GRID,
        "steps": a.steps,
        "model": Path(a.model_path).name if a.model_path else "tiny",  # no machine's path
        "machine": machine(a.note),
        "summary": summary,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    name = "backends_smollm2.json" if a.model_path else "backends.json"
    (RESULTS / name).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
