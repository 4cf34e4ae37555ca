"""The health rules' error rates on recorded curves: each default rule alone and the defaults
together, per model, at the default eval cadence and a dense one (bench/HEALTH.md, "Error
rates").

    python bench/health_rates.py --part calibration [--variants]   # choose (and see candidates)
    python bench/health_rates.py --part heldout [--first-seed 35]   # judge: the frozen defaults

Runs: the recorded-curve library (bench/record_curves.py, bench/results/curves/, split by seed
parity) and, on the calibration side only, the older whole-run recordings the rules were first
tuned on (bench/results/health_curves*.json: tiny lr x num_substeps, SmolLM2 lr x seed). Each
run is replayed through trainer/run/health.py's own monitor with the rules built for its
held-out metric, as a sweep with that objective builds them (analysis/rule_replay.py).
Without `--variants` it writes bench/results/health_rates_<part>.json; the held-out one is what
docs/health.md's table quotes (tests/test_health.py checks they agree).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from analysis import rule_replay
from analysis.rule_replay import Run, Tally
from records import metrics
from trainer.run.health import HealthRule, default_rules

RESULTS = Path(__file__).resolve().parent / "results"
LIBRARY = RESULTS / "curves"
# The first recordings (bench/bench_health.py's format), all used to choose the rules before.
LEGACY = {
    "health_curves.json": ("tiny", 400, 32, 10),
    "health_curves_heldout.json": ("tiny", 400, 32, 10),
    "health_curves_smollm2_seed0.json": ("smollm2", 64, 8, 2),
    "health_curves_smollm2_seed1.json": ("smollm2", 64, 8, 2),
}
DEFAULT_EVERY = 10  # TrainConfig.eval_every: the cadence a sweep runs at unless told
# The held-out seeds recorded after the rules were last frozen (the KL guard's margin, commit
# "Health: KL guard margin 0"): docs/health.md quotes their rates. The earlier held-out seeds
# (1-33) showed the false prunes that the change answers, so they are reported beside them.
FROZEN_FIRST_SEED = 35
DENSE_EVERY = 2  # the library's own cadence


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


def seed_of(run: Run) -> int:
    """A library run's seed, from its name (`...-seed<s>`); the older recordings have none."""
    tail = run.run.rsplit("-seed", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else -1


def runs_of(part: str, first_seed: int = 0) -> list[Run]:
    """The part's runs; with first_seed, only library runs of that seed or later (a held-out
    batch recorded after a later freeze)."""
    runs = rule_replay.load_library([LIBRARY], part) if LIBRARY.exists() else []
    runs += legacy_runs() if part == "calibration" else []
    return [r for r in runs if seed_of(r) >= first_seed] if first_seed else runs


def rates_path(part: str, first_seed: int = 0) -> Path:
    """Where a part's rates are written (and, held out from FROZEN_FIRST_SEED, read by
    docs/health.md's test)."""
    return RESULTS / f"health_rates_{part}{f'_seed{first_seed}+' if first_seed else ''}.json"


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
        "post_update_kl x5": changed("post_update_kl", bound=5 * kl),
        "post_update_kl x20": changed("post_update_kl", bound=20 * kl),
        "post_update_kl patience 2": changed("post_update_kl", patience=2),
        "post_update_kl unguarded": changed("post_update_kl", guard="none"),
        # The guard's margin: fire while the held-out reward is at most its baseline + rise.
        # 0: not above it; negative: below it by that much (about 1 and 2 standard errors of
        # the tiny model's 400-problem eval), "while the held-out reward falls".
        "post_update_kl rise 0": changed("post_update_kl", rise=0.0),
        "post_update_kl rise -0.025": changed("post_update_kl", rise=-0.025),
        "post_update_kl rise -0.05": changed("post_update_kl", rise=-0.05),
        "post_update_kl patience 5": changed("post_update_kl", patience=5),
        "eval_collapse 0.05": changed("eval_collapse", bound=0.05),
        "eval_collapse 0.15": changed("eval_collapse", bound=0.15),
        "train_eval_divergence prune": changed("train_eval_divergence", action="prune"),
        "train_eval_divergence 0.06": changed("train_eval_divergence", bound=0.06),
    }


def table(make: Callable[[str], list[HealthRule]], runs: Sequence[Run], every: int) -> list[Tally]:
    usable = [r for r in runs if every % r.eval_every == 0]
    return rule_replay.tallies(rule_replay.for_objective(make), usable, every)


def as_json(t: Tally) -> dict:
    return {
        "runs": t.runs,
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
        for every in (DEFAULT_EVERY, DENSE_EVERY):
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


def docs_cells(t: dict) -> list[str]:
    """A tally (as_json) as docs/health.md's held-out columns: false prunes of learning runs,
    broken runs caught as required, median delay; counts with their 95% Wilson interval."""

    def counted(hits: int, n: int) -> str:
        low, high = rule_replay.wilson(hits, n)
        return f"{hits}/{n} [{low:.0%}, {high:.0%}]" if n else "-/0"

    delay = t["median_delay"]
    return [
        counted(t["false_prunes"], t["learning"]),
        counted(t["caught_as_required"], t["broken"]),
        "-" if delay is None else f"{delay:+.0%}",
    ]


def write_docs(tiny: dict) -> None:
    """Put each rule's held-out cells (docs_cells) into docs/health.md's table."""
    path = RESULTS.parents[1] / "docs" / "health.md"
    lines = path.read_text().split("\n")
    for i, line in enumerate(lines):
        name = line.split("|")[1].strip() if line.startswith("| ") else ""
        key = "all together" if name == "all default rules together" else name.strip("`")
        if key in tiny:
            cells = line.split("|")
            cells[-4:-1] = [f" {c} " for c in docs_cells(tiny[key])]
            lines[i] = "|".join(cells)
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["calibration", "heldout"], required=True)
    p.add_argument("--variants", action="store_true", help="candidate changes beside the defaults")
    p.add_argument("--write-docs", action="store_true", help="docs/health.md's held-out cells")
    p.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="only the library's runs of this seed or later (e.g. those recorded after a freeze)",
    )
    args = p.parse_args(argv)
    runs = runs_of(args.part, args.first_seed)
    if not runs:
        p.error(f"--part={args.part}: no recorded runs")
    makes = variants() if args.variants else {"defaults": defaults_for}
    out = report(runs, makes)
    if not args.variants:
        path = rates_path(args.part, args.first_seed)
        summary = {"part": args.part, "runs": sorted(r.run for r in runs), "models": out}
        path.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"\nwrote {path.relative_to(RESULTS.parents[1])}")
        if args.write_docs:
            if (args.part, args.first_seed) != ("heldout", FROZEN_FIRST_SEED):
                p.error(f"--write-docs quotes --part heldout --first-seed {FROZEN_FIRST_SEED}")
            write_docs(out["tiny"][str(DEFAULT_EVERY)]["defaults"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
