"""`python -m analysis {report,best,compare,rules}`: read a sweep's stores, say what happened.

report   leaderboard in the terminal; HTML report + PNG figures in reports/<study>/,
         also logged to the study's MLflow parent run
best     the tuned YAML of the best trial (what `+tuned=<study>` composes); --log-model logs
         its LoRA adapter as an MLflow model
compare  two studies' best configs and objectives side by side
rules    replay health rules on finished runs: each rule's prunes, catches, false prunes;
         with --experiment, which rule would have stopped each run of an MLflow experiment
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import optuna

from analysis.advice import advise
from analysis.load import (
    AnalysisError,
    StudyData,
    load_study,
    mlflow_client,
    quick_mlflow,
)
from analysis.mlflow_ui import study_link
from analysis.report import advice_text, leaderboard_text, summary_lines, write_report
from records.defaults import DEFAULT_EXPERIMENT, DEFAULT_STORAGE
from records.errors import first_line
from records.sweep import StudyAttr
from trainer.base.config import TrainConfig
from trainer.run.health import default_rules


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except AnalysisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(required=True, metavar="command")
    storage_help = f"Optuna storage URL (default: {DEFAULT_STORAGE}, the sweeper's default)"

    r = sub.add_parser("report", help="leaderboard, HTML report and figures")
    r.add_argument("--study", help="study name (default: the only / most recent one)")
    r.add_argument("--storage", default=DEFAULT_STORAGE, help=storage_help)
    r.add_argument("--out", type=Path, help="output folder (default: reports/<study>/)")
    r.add_argument(
        "--no-mlflow-log",
        action="store_true",
        help="do not log the report to the study's MLflow parent run",
    )
    r.set_defaults(func=cmd_report)

    b = sub.add_parser("best", help="print the tuned YAML of the best trial")
    b.add_argument("--study", help="study name (default: the only / most recent one)")
    b.add_argument("--storage", default=DEFAULT_STORAGE, help=storage_help)
    b.add_argument(
        "--trl-recipe",
        action="store_true",
        help="print the trials' `trl grpo` recipe (backend.config) with the tuned values",
    )
    b.add_argument(
        "--log-model",
        action="store_true",
        help="log the best configuration's LoRA adapter as an MLflow model under the study's run",
    )
    b.set_defaults(func=cmd_best)

    c = sub.add_parser("compare", help="two studies' best configs side by side")
    c.add_argument("study_a")
    c.add_argument("study_b")
    c.add_argument("--storage", default=DEFAULT_STORAGE, help=storage_help)
    c.add_argument("--storage-b", help="storage of the second study (default: --storage)")
    c.set_defaults(func=cmd_compare)

    h = sub.add_parser("rules", help="replay health rules on finished runs, with error rates")
    h.add_argument("--study", help="a study's runs (default: --curves, else the most recent)")
    h.add_argument(
        "--experiment",
        help="the runs of this MLflow experiment (MLFLOW_TRACKING_URI; a plain TRL script's "
        "too): which rule would have stopped each run, at which step, and the steps saved",
    )
    h.add_argument("--storage", default=DEFAULT_STORAGE, help=storage_help)
    h.add_argument("--curves", nargs="+", type=Path, help="recorded-curve JSON files or folders")
    h.add_argument("--part", help="only the library's runs of this part (calibration, heldout)")
    h.add_argument("--eval-every", type=int, default=TrainConfig.eval_every, help="eval cadence")
    h.add_argument("--defaults", action="store_true", help="today's default rules, not the study's")
    h.set_defaults(func=cmd_rules)
    return p


def cmd_report(args: argparse.Namespace) -> int:
    data = load_study(args.storage, args.study)
    if args.study is None and len(others := optuna.get_all_study_names(data.storage)) > 1:
        print(
            f"note: {len(others)} studies in {data.storage}; reporting the most recent, "
            f"{data.name} (another: --study NAME)",
            file=sys.stderr,
        )
    for note in data.notes:
        print(f"note: {note}", file=sys.stderr)
    print("\n".join(summary_lines(data)))
    if data.trials:
        print()
        print(leaderboard_text(data))
    print()
    print(advice_text(advise(data)))
    out = args.out or Path("reports") / data.name
    page = write_report(data, out)
    print(f"\nReport: {page.absolute()}")
    if not args.no_mlflow_log:
        log_report(data, out)
    for line in runs_link(data, write=not args.no_mlflow_log):
        print(line)
    return 0


def runs_link(data: StudyData, write: bool) -> list[str]:
    """The link that opens the study's runs in the MLflow UI; write: save the study's view
    (its columns) on the experiment first, as the sweep does (analysis/mlflow_ui.py)."""
    uri = data.attrs.get(StudyAttr.MLFLOW_TRACKING_URI)
    experiment = data.attrs.get(StudyAttr.MLFLOW_EXPERIMENT, DEFAULT_EXPERIMENT)
    if not uri:
        return []
    try:
        with quick_mlflow():
            lines = study_link(mlflow_client(uri), uri, experiment, data.name, data.attrs, write)
    except Exception as e:  # an unreachable server, a missing file
        print(f"note: no MLflow link: {uri} could not be read ({first_line(e)})", file=sys.stderr)
        return []
    return ["", *lines] if lines else []


def log_report(data: StudyData, out: Path) -> None:
    """The report as an `analysis/` artifact of the study's MLflow parent run, if reachable."""
    run_id = data.attrs.get(StudyAttr.MLFLOW_PARENT_RUN_ID)
    uri = data.attrs.get(StudyAttr.MLFLOW_TRACKING_URI)
    if not run_id or not uri:
        print("note: no MLflow parent run recorded; the report was not logged", file=sys.stderr)
        return
    from records.tracking import MLflowRun

    try:
        with quick_mlflow():
            run = MLflowRun.existing(run_id, mlflow_client(uri))
            run.save_artifacts(out, "analysis")
            url = run.url(uri)
    except Exception as e:  # an unreachable server must not lose the report written on disk
        print(
            f"note: could not log the report to MLflow run {run_id}: {first_line(e)}",
            file=sys.stderr,
        )
        return
    print(f"Logged to MLflow run {url} (analysis/index.html)")


def cmd_best(args: argparse.Namespace) -> int:
    from analysis.adapter_model import load_line, log_adapter_model, logged_model_line
    from analysis.tuned import tuned_yaml

    data = load_study(args.storage, args.study, with_mlflow=False)
    text = tuned_yaml(data, trl_recipe=args.trl_recipe)
    line = load_line(log_adapter_model(data)) if args.log_model else logged_model_line(data)
    sys.stdout.write(text + (f"{line}\n" if line else ""))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from analysis.compare import compare_text

    a = load_study(args.storage, args.study_a, with_mlflow=False)
    b = load_study(args.storage_b or args.storage, args.study_b, with_mlflow=False)
    print(compare_text(a, b))
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    from analysis import rule_replay

    if args.eval_every < 1:
        raise AnalysisError(f"--eval-every={args.eval_every}: must be an integer >= 1")
    if args.experiment:
        return experiment_rules(args.experiment)
    rules = None
    if args.curves:
        missing = [str(p) for p in args.curves if not p.exists()]
        if missing:
            raise AnalysisError(f"--curves={missing[0]}: no such file or folder")
        runs = rule_replay.load_library(args.curves, args.part)
        problem = rule_replay.cadence_problem(runs, args.eval_every)
        if problem:
            raise AnalysisError(problem)
        source = f"{len(runs)} recorded runs" + (f" ({args.part})" if args.part else "")
    else:
        data = load_study(args.storage, args.study, with_mlflow=False)
        uri = data.attrs.get(StudyAttr.MLFLOW_TRACKING_URI)
        if not uri:
            raise AnalysisError(f"study {data.name} recorded no MLflow tracking URI: no curves")
        with quick_mlflow():
            runs = rule_replay.study_runs(data, mlflow_client(uri))
        rules = None if args.defaults else rule_replay.study_rules(data.attrs)
        source = f"study {data.name}"
    if not runs:
        raise AnalysisError(f"{source}: no runs to replay")
    which = "the study's rules" if rules is not None else "the default rules"
    if rules is None:  # read each run's held-out reward, as a sweep with its objective does
        rules = rule_replay.for_objective(lambda objective: default_rules(objective=objective))
    print(f"{source}, {which}:")
    print("\n".join(rule_replay.replay_table(rules, runs, args.eval_every)))
    return 0


def experiment_rules(experiment: str) -> int:
    """`rules --experiment NAME`: the default rules (each run's held-out reward) over the
    experiment's runs, in the store MLFLOW_TRACKING_URI names."""
    import os

    from analysis.experiment_rules import experiment_runs, stops_text

    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise AnalysisError("--experiment: set MLFLOW_TRACKING_URI to the runs' tracking store")
    try:
        with quick_mlflow():
            runs = experiment_runs(mlflow_client(uri), experiment)
    except FileNotFoundError as e:
        raise AnalysisError(f"MLFLOW_TRACKING_URI={uri}: {first_line(e)}") from None
    if not runs:
        raise AnalysisError(f"--experiment={experiment!r}: no runs with per-step metrics")
    print("\n".join(stops_text(experiment, default_rules(), runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
