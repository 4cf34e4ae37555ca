"""The health rules' error rates on recorded curves: each default rule alone and the defaults
together, per model, at eval_every 1, 2, 5 and 10 (bench/HEALTH.md, "Error rates").

    python bench/health_rates.py --part calibration [--variants]   # choose (and see candidates)
    python bench/health_rates.py --part heldout [--write-docs]      # judge: the frozen defaults
    python bench/health_rates.py --part heldout --runs smollm2      # a row a run, no rates
    python bench/health_rates.py --part heldout --model smollm2     # one model's rates only
    python bench/health_rates.py --part calibration --window-falls  # train_reward_fell's choice

Errors are counted on each run's end, whatever its label (analysis/curve_labels.py, `ending`):
a pruned run that ended up is a false prune, a run that broke down and was neither pruned nor
warned a miss; their 95% intervals are clustered by seed. A run replays the cadences its own
eval_every divides: the library's every-2 runs 2 and 10, the held-out every-1 runs all four.

Runs: held out, the runs recorded after the last freeze (bench/results/curves_after_freeze/);
calibration, the rest of the recorded-curve library (bench/record_curves.py,
bench/results/curves/: both seed parities have been looked at) and the older whole-run
recordings the rules were first tuned on (bench/results/health_curves*.json). Each
run is replayed through trainer/run/health.py's own monitor with the rules built for its
held-out metric, as a sweep with that objective builds them (analysis/rule_replay.py).
Without `--variants` it writes bench/results/health_rates_<part>.json; the held-out one is what
docs/health.md's table quotes (tests/test_health.py checks they agree).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from analysis import rule_replay
from analysis.curve_labels import BROKE_DOWN, ENDED_UP
from analysis.rule_replay import Run, Tally
from records import metrics
from trainer.run.health import SYMPTOMS, HealthRule, default_rules, warnings

RESULTS = Path(__file__).resolve().parent / "results"
LIBRARY = RESULTS / "curves"
# Recorded after a freeze, never looked at before it: the held-out part. Tiny: odd seeds
# 265-309 with an eval every step (so 1, 2, 5 and 10 replay exactly), recorded after the
# freeze "Health: learned_then_broke and the KL rule wait for a second eval"; the KL rule's
# later change (its fall on 2 evals, 2 early steps) was chosen on the calibration part alone.
# SmolLM2: 32 steps, an eval every 2 and at every step up to 10 (an eval on demand's), recorded
# after the freeze "Health: an eval on demand decides the KL rule's early prune"; every
# SmolLM2 run recorded before it calibrates now.
AFTER_FREEZE = RESULTS / "curves_after_freeze"
# The first recordings (bench/bench_health.py's format), all used to choose the rules before.
LEGACY = {
    "health_curves.json": ("tiny", 400, 32, 10),
    "health_curves_heldout.json": ("tiny", 400, 32, 10),
    "health_curves_smollm2_seed0.json": ("smollm2", 64, 8, 2),
    "health_curves_smollm2_seed1.json": ("smollm2", 64, 8, 2),
}
DEFAULT_EVERY = 10  # TrainConfig.eval_every: the cadence a sweep runs at unless told
DENSE_EVERY = 2  # the densest cadence both parts replay
CADENCES = (1, DENSE_EVERY, 5, DEFAULT_EVERY)  # a run replays those its eval_every divides


def legacy_runs() -> list[Run]:
    """The older recordings as library runs: {config: {step: metrics}}, one file a sweep."""
    runs = []
    for name, (model, eval_size, batch, every) in LEGACY.items():
        data = json.loads((RESULTS / name).read_text())
        for config, steps in data.items():
            if config == "machine":
                continue
            clean = {
                int(s): {k: float(v) for k, v in m.items() if isinstance(v, int | float | str)}
                for s, m in steps.items()
            }
            run = f"{model}-legacy-{config.replace(' ', '-')}"
            part = "calibration"
            runs.append(
                Run(run, clean, metrics.EVAL_REWARD, eval_size, batch, part, eval_every=every)
            )
    return runs


def model_of(run: Run) -> str:
    return run.run.split("-", 1)[0]


def runs_of(part: str) -> list[Run]:
    """The part's runs. Held out: the runs recorded after the last freeze. Calibration: the
    rest of the library (both its parity halves were looked at while the rules were chosen)
    and the older recordings."""
    if part == "heldout":
        return rule_replay.load_library([AFTER_FREEZE]) if AFTER_FREEZE.exists() else []
    runs = rule_replay.load_library([LIBRARY]) if LIBRARY.exists() else []
    return runs + legacy_runs()


def rates_path(part: str) -> Path:
    """Where a part's rates are written (the held-out one read by docs/health.md's test)."""
    return RESULTS / f"health_rates_{part}.json"


def defaults_for(objective: str) -> list[HealthRule]:
    return default_rules(objective=objective)


def variants() -> dict[str, Callable[[str], list[HealthRule]]]:
    """Candidate changes to the defaults, each replayed beside them on the calibration part."""

    def changed(name: str, **fields: object) -> Callable[[str], list[HealthRule]]:
        def make(objective: str) -> list[HealthRule]:
            return [
                HealthRule(**{**r.as_dict(), **fields}) if r.name == name else r
                for r in default_rules(objective=objective)
            ]

        return make

    kl = 0.01
    return {
        "defaults": defaults_for,
        # The KL rule: its bound, patience, and the guard's margin (standard errors above the
        # baseline; the old absolute "not above its baseline") and fall from the best.
        "post_update_kl x10": changed("post_update_kl", bound=10 * kl),
        "post_update_kl x50": changed("post_update_kl", bound=50 * kl),
        "post_update_kl patience 4": changed("post_update_kl", patience=4),
        "post_update_kl not above baseline": changed(
            "post_update_kl", rise=0.0, guard_unit="absolute"
        ),
        "post_update_kl rise -2 se": changed("post_update_kl", rise=-2.0),
        "post_update_kl rise -3 se": changed("post_update_kl", rise=-3.0),
        "post_update_kl no fall": changed("post_update_kl", guard_fall=None),
        "post_update_kl fall 3 se": changed("post_update_kl", guard_fall=3.0),
        "post_update_kl fall on 1 eval": changed("post_update_kl", fall_evals=1),
        "post_update_kl early 1 step": changed("post_update_kl", early_patience=1),
        "post_update_kl early 3 steps": changed("post_update_kl", early_patience=3),
        "eval_collapse 0.1 absolute": changed(
            "eval_collapse", bound=0.1, unit="absolute", patience=1
        ),
        "eval_collapse 2.5 se": changed("eval_collapse", bound=2.5),
        "eval_collapse patience 1": changed("eval_collapse", patience=1),
        "learned_then_broke 4 se": changed("learned_then_broke", bound=4.0),
        "learned_then_broke patience 1": changed("learned_then_broke", patience=1),
        "train_eval_divergence prune": changed("train_eval_divergence", action="prune"),
        "train_reward_fell 3.0 se x 5": changed("train_reward_fell", bound=3.0, window=5),
        "train_reward_fell 5.0 se x 5": changed("train_reward_fell", bound=5.0, window=5),
        "train_reward_fell 4.0 se x 4": changed("train_reward_fell", bound=4.0, window=4),
        "train_reward_fell 4.0 se x 8": changed("train_reward_fell", bound=4.0, window=8),
    }


def table(make: Callable[[str], list[HealthRule]], runs: Sequence[Run], every: int) -> list[Tally]:
    usable = [r for r in runs if every % r.eval_every == 0]
    return rule_replay.tallies(rule_replay.for_objective(make), usable, every)


def as_json(t: Tally) -> dict:
    up, down = t.ended_up(), t.missed()
    return {
        "runs": t.runs,
        "ended_up": up[1],
        "ended_up_pruned": up[0],
        "ended_up_pruned_interval": [round(x, 4) for x in up[2]],
        "broke_down": down[1],
        "broke_down_missed": down[0],
        "broke_down_missed_interval": [round(x, 4) for x in down[2]],
        "errors_by_label": dict(sorted(t.errors_by_label.items())),
        "prunes": t.prunes,
        "learning": t.learning,
        "false_prunes": t.false_prunes,
        "flat": t.flat,
        "flat_pruned": t.flat_pruned,
        "broken": t.broken,
        "caught": t.caught,
        "caught_by_prune": t.caught_pruned,
        "caught_as_required": t.caught_as_required,
        "median_delay": t.median_delay,
        "delays": t.delays,
        "steps": t.steps,
        "saved": t.saved,
    }


def report(runs: Sequence[Run], makes: dict[str, Callable[[str], list[HealthRule]]]) -> dict:
    out: dict = {}
    for model in sorted({model_of(r) for r in runs}):
        mine = [r for r in runs if model_of(r) == model]
        for every in CADENCES:
            usable = [r for r in mine if every % r.eval_every == 0]
            if not usable:
                continue
            print(f"\n== {model} ==  " + rule_replay.replay_table([], usable, every)[0])
            print(rule_replay.HEADER)
            for name, make in makes.items():
                tallies = table(make, usable, every)
                rows = tallies if name == "defaults" else tallies[-1:]
                for t in rows:
                    label = t.name if name == "defaults" else name
                    print(_renamed(t, label).line())
                out.setdefault(model, {}).setdefault(str(every), {})[name] = {
                    t.name: as_json(t) for t in rows
                }
    return out


def _renamed(t: Tally, name: str) -> Tally:
    copy = Tally(**{**t.__dict__})
    copy.name = name
    return copy


def docs_cells(at_2: dict, at_10: dict) -> list[str]:
    """A rule's held-out tallies (as_json) at eval_every 2 and 10 as docs/health.md's columns:
    runs that ended up and were pruned, runs that broke down and were missed (each with its
    95% interval clustered by seed), median delay at 10."""

    def counted(t: dict, hits: str, n: str) -> str:
        low, high = t[f"{hits}_interval"]
        return f"{t[hits]}/{t[n]} [{low:.1%}, {high:.1%}]" if t[n] else "-/0"

    delay = at_10["median_delay"]
    return [
        counted(at_2, "ended_up_pruned", "ended_up"),
        counted(at_10, "ended_up_pruned", "ended_up"),
        counted(at_2, "broke_down_missed", "broke_down"),
        counted(at_10, "broke_down_missed", "broke_down"),
        "-" if delay is None else f"{delay:+.0%}",
    ]


def write_docs(tiny: dict) -> None:
    """Put each rule's held-out cells (docs_cells) into docs/health.md's table."""
    path = RESULTS.parents[1] / "docs" / "health.md"
    lines = path.read_text().split("\n")
    at_2, at_10 = tiny[str(DENSE_EVERY)]["defaults"], tiny[str(DEFAULT_EVERY)]["defaults"]
    for i, line in enumerate(lines):
        name = line.split("|")[1].strip() if line.startswith("| ") else ""
        key = "all together" if name == "all default rules together" else name.strip("`")
        if key in at_2:
            cells = line.split("|")
            cells[-6:-1] = [f" {c} " for c in docs_cells(at_2[key], at_10[key])]
            lines[i] = "|".join(cells)
    path.write_text("\n".join(lines))


def window_falls(runs: Sequence[Run]) -> list[str]:
    """How train_reward_fell's window and bound were chosen: per model, end and (window, bound),
    the runs it warns at all (the monitor's own check, alone, on every step)."""
    rule = next(r for r in default_rules() if r.name == "train_reward_fell")
    shapes = [(window, bound) for window in (4, 5, 8) for bound in (3.0, 4.0, 5.0)]
    lines = [
        "model, end (runs): runs warned at window x bound "
        + ", ".join(f"{w} x {b:g}" for w, b in shapes)
    ]
    for model in sorted({model_of(r) for r in runs}):
        for end in (ENDED_UP, BROKE_DOWN):
            mine = [r for r in runs if model_of(r) == model and rule_replay.run_ending(r) == end]
            counts = [
                sum(bool(warnings([replace(rule, window=w, bound=b)], r.steps)) for r in mine)
                for w, b in shapes
            ]
            lines.append(f"{model}, {end} ({len(mine)}): " + ", ".join(map(str, counts)))
    return lines


def run_lines(
    runs: Sequence[Run], cadences: Sequence[int] = (DENSE_EVERY, DEFAULT_EVERY)
) -> list[str]:
    """A row a run: its evals (baseline -> best -> last), its end, and what the defaults did at
    each cadence (pruned where, or the warnings that say it broke; a GRPO symptom's are left
    out, as the count leaves them)."""
    rows = [
        "| run | evals: baseline -> best -> last | end | "
        + " | ".join(f"every {every}" for every in cadences)
        + " |",
        "|---" * (3 + len(cadences)) + "|",
    ]
    for run in sorted(runs, key=lambda r: r.run):
        evals = [p.value for p in rule_replay.heldout_points(run)]
        cells = []
        for every in cadences:
            o = rule_replay.outcome(defaults_for(run.heldout_metric), run, every, None)
            said = sorted(r for r in o.warned if r not in SYMPTOMS)
            if o.pruned_at is not None:
                cells.append(f"pruned at {o.pruned_at} ({o.pruned_by})")
            else:
                cells.append("kept" + (f", warned: {', '.join(said)}" if said else ""))
        shown = f"{evals[0]:.2f} -> {max(evals):.2f} -> {evals[-1]:.2f}"
        rows.append(
            f"| {run.run} | {shown} | {rule_replay.run_ending(run)} | " + " | ".join(cells) + " |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["calibration", "heldout"], required=True)
    p.add_argument("--variants", action="store_true", help="candidate changes beside the defaults")
    p.add_argument("--write-docs", action="store_true", help="docs/health.md's held-out cells")
    p.add_argument("--window-falls", action="store_true", help="train_reward_fell's choice")
    p.add_argument("--runs", metavar="MODEL", help="a row a run of MODEL (e.g. smollm2), no rates")
    p.add_argument("--model", help="only this model's runs: its part of the JSON is rewritten")
    args = p.parse_args(argv)
    runs = [r for r in runs_of(args.part) if args.model in (None, model_of(r))]
    if not runs:
        p.error(f"--part={args.part}: no recorded runs")
    if args.window_falls:
        print("\n".join(window_falls(runs)))
        return 0
    if args.runs:
        print("\n".join(run_lines([r for r in runs if model_of(r) == args.runs])))
        return 0
    makes = variants() if args.variants else {"defaults": defaults_for}
    out = report(runs, makes)
    if not args.variants:
        path = rates_path(args.part)
        summary = {"part": args.part, "runs": sorted(r.run for r in runs), "models": out}
        if args.model and path.exists():  # the other models' parts as they were
            kept = json.loads(path.read_text())
            others = [r for r in kept["runs"] if not r.startswith(f"{args.model}-")]
            summary["runs"] = sorted(others + summary["runs"])
            summary["models"] = {**kept["models"], **out}
        path.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"\nwrote {path.relative_to(RESULTS.parents[1])}")
        if args.write_docs:
            if args.part != "heldout":
                p.error("--write-docs quotes --part heldout")
            write_docs(summary["models"]["tiny"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
