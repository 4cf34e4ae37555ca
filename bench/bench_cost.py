"""Cost to a verdict, end to end: whole grid sweeps simulated over recorded pools with the
sweeper's own decision code, per policy the trial-steps spent and how often the verdict is
right.

    python bench/bench_cost.py --curves 'bench/results/curves/*.json' [--part heldout]
    python bench/bench_cost.py --values bench/results/racing_racing-truth-20.json
    python bench/bench_cost.py --validate /tmp/val-ours       # a real sweep's folder

A pool is a grid recorded once: for each configuration (lr) and seed a whole run, pruning off
(bench/record_curves.py: every step's metrics, an eval every 2 steps; or a racing truth's
final values only, whose policies then cannot prune). The truth is each configuration's mean
final objective over every recorded seed (bench_racing.py's Truth: its best, the pairs it
calls tied, the minimal difference that counts).

A replay is one grid sweep with one lane, as sweeper/sweep/loop.py runs it with the basic
launcher: the configurations queued in a random order (the grid's slots, WAITING trials of
an in-memory Optuna study), the recorded seeds in one random order shared by every
configuration (a sweep from another base seed: `seeds_of`), each seed's job replayed step by
step through the job's own TrialReporter (sweeper/sweep/job.py: the objective to Optuna, the
health rules of trainer/run/health.py, Optuna's pruner, the Forecaster of
sweeper/sweep/forecaster.py reading the other seeds' curves from an in-memory MLflow client),
its record from job.py's ended_replicate, the configuration's race from
sweeper/sweep/racing.py's look and its outcome from sweeper/sweep/tell.py's combine, and the
verdict from analysis/verdict.py's sweep_verdict on the study's trials, as the sweep prints
it. Only the loop's bookkeeping is written again here (`Sweep`), checked against real sweeps
by --validate: the same decisions from the same curves.

Per policy and pool: trial-steps (training steps, all seeds and configurations), P(the
verdict names the truth's best, or calls it tied with a pick the truth ties with it), the
strict best apart, both error types, regret (truth's best mean minus the pick's), with 95%
intervals over replays (Wilson; normal for means; paired with fixed seeds=3 on the same
draws) and over truths (t over the pools' figures). Replays share each pool's recorded runs:
they measure the decisions on this pool, not fresh training.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import math
import random
import re
import sys
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from bench_racing import Truth, paired  # bench/ is on the path: this runs as a script
from machine_info import machine
from optuna.trial import TrialState

from analysis.proportions import wilson
from analysis.rule_replay import at_cadence, library_run
from analysis.verdict import sweep_verdict
from judge import forecast as forecast_math
from judge import race, stats
from judge.configs import break_floor, counts_broken
from judge.stats import MIN_SEEDS, mean_and_stderr
from records.metrics import EVAL_REWARD, stderr_of
from records.sweep import Replicate, State, StudyAttr, TrialAttr, replicate_key, replicates
from sweeper.plan.settings_schema import GRPOSweeperConf
from sweeper.sweep import racing
from sweeper.sweep.flights import planned
from sweeper.sweep.job import ended_replicate, trial_reporter
from sweeper.sweep.stopping import TrialPruned, make_pruner
from sweeper.sweep.tell import combine
from trainer.base.config import TrainConfig
from trainer.run.health import default_rules, rules_from_settings

RESULTS = Path(__file__).resolve().parent / "results"
CONFIG = "bench_config"  # the trial's user attr naming its configuration (the pool's label)

Curve = dict[int, dict[str, float]]  # {step: that step's metrics}, as the reporter gets them


@dataclass(frozen=True)
class Policy:
    """How a grid is swept: the sweeper's settings (hydra.sweeper.*) a policy stands for."""

    name: str
    seeds: int | str  # an int, or "auto" (racing)
    pruner: str = "none"  # none, median, hyperband (the sweeper's), forecast; asha (Optuna's)
    health: bool = False  # the default health rules (False: hydra.sweeper.health=[])
    max_seeds: int = 5
    level: float = 0.75  # forecast_level
    warmup: int = 1  # pruner_warmup_steps
    min_difference: float | None = None  # hydra.sweeper.min_difference (None: eval stderr)
    wait_for_leader: bool = True  # False: racing before its stops waited for the leader
    # A one-seed screen before the race (issue 72, a prototype here, not in the sweeper):
    # every configuration runs one seed; once all have, one whose value is below the
    # leader's by more than screen_z x sqrt(2 screen_sd^2 + both eval stderrs^2) stops
    # there; the others race as `seeds=auto` does. screen_sd: a prior seed-to-seed sd of
    # the final objective (0: no screen).
    screen_sd: float = 0.0
    screen_z: float = 2.0
    # judge/race.py's futility rule and leader rule. The defaults here are the race before
    # issue 72 (every policy measured before it keeps its meaning); the sweeper's default
    # since then is `default` below (power futility, hopeful-only leader rule, max_seeds=3).
    futility: str = race.OPTIMISTIC
    leader_rule: str = race.ALWAYS
    # A seed a health rule stopped counts at the objective's floor and its configuration goes
    # on, as the sweeper does since issue 72 (judge/configs.py); False: the sweeper before,
    # which pruned the configuration at its first broken seed and left it out of the verdict.
    count_broken: bool = True
    # hydra.sweeper.budget_seeds (racing.Budget): a grid race spends at most this many seeds'
    # grid of steps; 0, the race before it (every policy measured before keeps its meaning).
    budget_seeds: int = 0
    # The verdict names the best away from the edge of stability (judge/edge.py), as the
    # sweeper's does since issue 72's edge rule; False: the top-ranked, as before it.
    edge: bool = True

    @property
    def race(self) -> bool:
        return self.seeds == "auto"

    @property
    def start_seeds(self) -> int:
        if self.screen_sd:
            return 1
        return MIN_SEEDS if self.race else int(self.seeds)

    @property
    def most_seeds(self) -> int:
        return self.max_seeds if self.race else int(self.seeds)


# the sweeper's `seeds=auto` since issue 72 (judge/race.py's defaults, frozen on the
# calibration pools before any held-out replay): race_power_max3, capped since at a 2-seed
# grid's steps (budget_seeds)
DEFAULT = Policy(
    "default",
    "auto",
    health=True,
    max_seeds=GRPOSweeperConf.max_seeds,
    futility=race.POWER,
    leader_rule=race.HOPEFUL,
    budget_seeds=GRPOSweeperConf.budget_seeds,
)
POLICIES = (
    Policy("fixed1", 1),
    Policy("fixed2", 2),
    Policy("fixed3", 3),
    Policy("fixed5", 5),
    # the grids a user of this tool runs with `seeds=N`: the default health rules on
    Policy("fixed1_health", 1, health=True),
    Policy("fixed2_health", 2, health=True),
    Policy("fixed3_health", 3, health=True),
    Policy("median", 1, "median"),
    Policy("median_seeds3", 3, "median"),
    Policy("hyperband", 1, "hyperband"),
    Policy("asha", 1, "asha"),
    Policy("health_forecast", 1, "forecast", health=True),
    Policy("racing", "auto"),
    Policy("racing_max3", "auto", max_seeds=3),
    Policy("ours", "auto", "forecast", health=True),
    Policy("ours_max3", "auto", "forecast", health=True, max_seeds=3),
    DEFAULT,
)
# Variants of ours, replayed on the calibration part to choose a default (bench/COST.md,
# "The default"); named with --policies, not run by default.
VARIANTS = (
    Policy("ours_l90", "auto", "forecast", health=True, level=0.9),
    Policy("health_racing", "auto", health=True),
    Policy("ours_md0", "auto", "forecast", health=True, min_difference=0.0),
    Policy("ours_max3_md0", "auto", "forecast", health=True, max_seeds=3, min_difference=0.0),
    Policy("ours_max3_l90", "auto", "forecast", health=True, max_seeds=3, level=0.9),
    Policy("ours_max3_l95", "auto", "forecast", health=True, max_seeds=3, level=0.95),
    Policy("health_racing_max3", "auto", health=True, max_seeds=3),
    # toward the racing bar in runs (<= 75% of seeds=3's): the default with one seed less
    Policy("health_racing_max4", "auto", health=True, max_seeds=4),
    Policy("ours_max4", "auto", "forecast", health=True, max_seeds=4),
    # the default before a stop against a racing leader waited (bench/COST.md, "Waiting for
    # the leader")
    Policy("health_racing_nowait", "auto", health=True, wait_for_leader=False),
    # a one-seed screen, then the default race (issue 72): the prior seed sd 0.02 is the
    # calibration library's (even seeds 0-22, the top five lrs of both tasks: 0.016-0.036)
    Policy("screen_z2", "auto", health=True, screen_sd=0.02, screen_z=2.0),
    Policy("screen_z1.5", "auto", health=True, screen_sd=0.02, screen_z=1.5),
    Policy("screen_z3", "auto", health=True, screen_sd=0.02, screen_z=3.0),
    # issue 72: futility judged at min_difference (power) or at the larger of it and the
    # observed difference, not at the optimistic bound; the leader rule only for a hopeful
    # rival; and with max_seeds=3 (judge/race.py)
    Policy("race_optimistic", "auto", health=True, futility="optimistic", leader_rule="always"),
    Policy("race_power", "auto", health=True, futility="power", leader_rule="always"),
    Policy("race_power_hopeful", "auto", health=True, futility="power", leader_rule="hopeful"),
    Policy(
        "race_power_max3", "auto", health=True, max_seeds=3, futility="power", leader_rule="hopeful"
    ),
    # issue 72: the sweeper before a seed that broke counted at the floor
    replace(DEFAULT, name="default_uncounted", count_broken=False),
    replace(DEFAULT, name="default_unbudgeted", budget_seeds=0),  # the default before the cap
    # issue 72: the verdicts before the edge rule named the top-ranked of a tie
    replace(DEFAULT, name="default_top", edge=False),
    Policy("fixed2_health_top", 2, health=True, edge=False),
    Policy("fixed3_health_top", 3, health=True, edge=False),
    Policy("fixed2_health_uncounted", 2, health=True, count_broken=False),
    Policy("fixed3_health_uncounted", 3, health=True, count_broken=False),
    Policy(
        "race_optimistic_hopeful_max3",
        "auto",
        health=True,
        max_seeds=3,
        futility="optimistic",
        leader_rule="hopeful",
    ),
)
BASELINE = "fixed3"  # the plain seeds=3 grid (what users of other tools run)
# What a user of this tool would otherwise run: seeds=3 with the same (default) health rules.
# Every headline compares with it first and with the plain grid second.
HEALTH_BASELINE = "fixed3_health"
BASELINES = (HEALTH_BASELINE, BASELINE)


@dataclass
class Pool:
    """A grid recorded once: {configuration: {seed: curve}}, every curve to max_steps."""

    name: str
    max_steps: int
    runs: dict[str, dict[int, Curve]]
    objective: str = EVAL_REWARD
    curves: bool = True  # False: final values only (no pruner can act)
    # {configuration: {seed: the final eval's reward per problem}} where recorded: the verdict
    # pairs one-seed configurations over problems with it (else on the eval stderrs)
    per_problem: dict[str, dict[int, tuple[float, ...]]] = field(default_factory=dict)
    eval_size: int | None = None  # the truth's stderr where the objective's is not logged
    _steps: dict = field(default_factory=dict, repr=False)

    def steps(
        self, config: str, seed: int, eval_every: int, read: frozenset[str]
    ) -> list[tuple[int, dict]]:
        """job_steps of a run with only the metrics something reads (`read`, and every eval
        metric), kept: every replay hands the same run the same steps. The health monitor
        decides on its rules' metrics and guard metrics alone (trainer/run/health.py), and
        remembering the ~25 others at every step was half of the bench's time."""
        key = (config, seed, eval_every, read)
        if key not in self._steps:
            self._steps[key] = [
                (
                    step,
                    self._with_stderr(
                        {k: v for k, v in m.items() if k in read or k.startswith("eval/")}
                    ),
                )
                for step, m in job_steps(self.runs[config][seed], eval_every)
            ]
        return self._steps[key]

    def _with_stderr(self, metrics: dict) -> dict:
        """The objective's stderr where the run was recorded before the trainer logged one for
        each reward (eval/reward/exact_match/stderr): a 0/1 reward, one sample a problem, so
        exactly what the trainer logs now, sqrt(p (1 - p) / (n - 1)) (records/metrics.py
        mean_and_stderr of n values, p n of them 1). Without it racing's min_difference is 0."""
        value, key = metrics.get(self.objective), stderr_of(self.objective)
        if value is None or key in metrics or not self.eval_size or self.eval_size < 2:
            return metrics
        return {**metrics, key: math.sqrt(max(value * (1 - value), 0.0) / (self.eval_size - 1))}

    @property
    def seeds(self) -> list[int]:
        """The seeds every configuration has (a sweep gives each the same ones)."""
        shared = set.intersection(*(set(s) for s in self.runs.values()))
        return sorted(shared)

    def final(self, config: str, seed: int) -> tuple[float, float | None]:
        """A run's final objective and its stderr; a run that blew up (its curve ends
        early) counts as 0, the reward's floor."""
        curve = self.runs[config][seed]
        last = curve.get(self.max_steps, {})
        value = last.get(self.objective)
        if value is None or not math.isfinite(value):
            return 0.0, None
        stderr = last.get(stderr_of(self.objective))
        if stderr is None and self.eval_size:  # a 0/1 reward's mean over the eval's problems
            stderr = math.sqrt(max(value * (1 - value), 0.0) / self.eval_size)
        return value, stderr

    def truth(self) -> Truth:
        return Truth({c: [self.final(c, s) for s in self.seeds] for c in self.runs})


def load_curves(
    paths: Sequence[str], part: str, max_steps: int | None, objective: str | None
) -> dict[str, Pool]:
    """bench/record_curves.py's files, one pool per (model, task, steps): the configurations
    are the lrs; the objective the file's held-out metric (correctness where the training
    reward can be gamed) unless given; a run's curve cut at max_steps (the lr schedule is
    constant by default, so a cut run is the shorter run; it must be an eval step)."""
    grouped: dict[tuple, dict[str, dict[int, Curve]]] = {}
    for path in sorted(paths):
        data = json.loads(Path(path).read_text())
        if part != "all" and data["part"] != part:
            continue
        recorded = int(dict(o.split("=", 1) for o in data["overrides"])["max_steps"])
        steps = max_steps or recorded
        if steps > recorded or steps % data["eval_every"]:
            sys.exit(f"error: --max-steps={steps}: must be an eval step <= {recorded} ({path})")
        cut = "" if steps == recorded else f"-cut{steps}"
        grid = f"-{data['grid']}" if "grid" in data else ""  # bench/record_small_grids.py's
        name = f"{data['model']}-{data['task']}{grid}-{recorded}steps{cut}"
        key = (name, steps, objective or data["heldout_metric"], data["eval_size"])
        curve = {s: m for s, m in library_run(data).steps.items() if s <= steps}
        label = f"lr={data['lr']:g}"
        if "group_size" in data:  # a grid over group_size too: both, as the sweep lists them
            label = f"group_size={data['group_size']} {label}"
        grouped.setdefault(key, {}).setdefault(label, {})[data["seed"]] = curve
    return {
        name: Pool(name, steps, runs, chosen, eval_size=size)
        for (name, steps, chosen, size), runs in sorted(grouped.items())
    }


def load_values(path: str, max_steps: int) -> Pool:
    """A racing truth (bench_racing.py's results JSON): final values only, so a run's curve
    is its last step's objective and stderr (nothing to prune on)."""
    truth = json.loads(Path(path).read_text())["truth"]
    runs = {}
    for c, t in truth.items():
        errs = t.get("stderrs") or [None] * len(t["values"])
        runs[c] = {
            s: {max_steps: {EVAL_REWARD: v, stderr_of(EVAL_REWARD): e}}
            for s, (v, e) in enumerate(zip(t["values"], errs, strict=True))
        }
    return Pool(Path(path).stem.removeprefix("racing_"), max_steps, runs, curves=False)


def job_steps(curve: Curve, eval_every: int) -> list[tuple[int, dict]]:
    """What a job's reporter is handed, step by step, at this eval cadence: step 0 (the
    baseline eval), then each training step's metrics, the eval's at its steps and the last
    (analysis/rule_replay.py at_cadence); a curve that ends early (blew up) ends there."""
    return sorted(at_cadence(curve, eval_every).items())


# --- the job and the loop, with the sweeper's own decisions ----------------------------


class Logged:
    """An in-memory MLflow client and run: what the reporter logs, as get_metric_history
    gives it back (the Forecaster reads the other seeds' curves through it)."""

    @dataclass(frozen=True)
    class Point:
        step: int
        value: float

    def __init__(self) -> None:
        self.metrics: dict[tuple[str, str], list[Logged.Point]] = {}

    def get_metric_history(self, run_id: str, key: str) -> list[Logged.Point]:
        return self.metrics.get((run_id, key), [])

    def run(self, run_id: str) -> Run:
        return Run(self, run_id)


@dataclass
class Run:
    client: Logged
    run_id: str

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            if key.startswith("eval/"):  # all the Forecaster reads back (the rest: time)
                point = Logged.Point(step, float(value))
                self.client.metrics.setdefault((self.run_id, key), []).append(point)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass  # the warning tags: the record's warnings carry the same lines


def pruner(policy: Policy) -> optuna.pruners.BasePruner:
    if policy.pruner == "asha":  # Optuna's asynchronous successive halving (not a setting)
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, policy.warmup))
    return make_pruner(policy.pruner, policy.warmup)


@dataclass(frozen=True)
class Result:
    """What ended_replicate reads of a finished training's TrainResult."""

    final_eval_rewards: dict[str, tuple[float, ...]]


@dataclass
class Flight:
    """sweeper/sweep/flights.py's InFlight, with seed positions for seeds."""

    trial: optuna.Trial
    seeds: list[int]  # positions in the replay's seed order (the sweeper's base + i)
    started: int = 0
    ended: dict[int, bool] = field(default_factory=dict)  # position -> the job raised
    phase: str = "training"  # training, broken, holding

    @property
    def seeds_ended(self) -> bool:
        started_all = self.phase == "broken" or self.started == len(self.seeds)
        return started_all and len(self.ended) == self.started


class Sweep:
    """One grid sweep with one lane (loop.py with the basic launcher), over a pool."""

    def __init__(
        self,
        pool: Pool,
        policy: Policy,
        queue: Sequence[str],
        order: Sequence[int],
        name: str,
        eval_every: int,
    ):
        self.pool, self.policy, self.order, self.eval_every = pool, policy, list(order), eval_every
        self.logged = Logged()
        study = optuna.create_study(
            study_name=name, direction="maximize", pruner=pruner(policy)
        )  # the study's name places Hyperband's brackets (crc32 of name and trial number)
        rules = (
            [r.as_dict() for r in default_rules(TrainConfig.kl_threshold, pool.objective)]
            if policy.health
            else []
        )
        attrs = {
            StudyAttr.OBJECTIVE: pool.objective,
            StudyAttr.DIRECTION: "maximize",
            StudyAttr.HEALTH_RULES: rules,
            StudyAttr.KL_THRESHOLD: TrainConfig.kl_threshold,
            StudyAttr.PRUNER: policy.pruner,
            StudyAttr.PRUNER_WARMUP_STEPS: policy.warmup,
            StudyAttr.FORECAST_LEVEL: policy.level,
            StudyAttr.SEEDS: policy.start_seeds,
            **({StudyAttr.MAX_SEEDS: policy.max_seeds} if policy.race else {}),
        }
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        watched = rules_from_settings(rules, TrainConfig.kl_threshold)
        self.read = frozenset(
            {pool.objective, stderr_of(pool.objective)}
            | {r.metric for r in watched}
            | {r.guard_metric for r in watched}
        )
        for c in queue:  # the grid's slots, queued in this order
            study.enqueue_trial(params_of(c), user_attrs={CONFIG: c})
        # each parameter's grid values, as a grid sweep's trials hold them
        grid = [params_of(c) for c in queue]
        self.choices = {name: sorted({p[name] for p in grid}) for name in (grid[0] if grid else {})}
        self.study = study
        self.flights: dict[int, Flight] = {}
        self.races: dict[int, str] = {}

    def run(self) -> optuna.Study:
        pending: deque[tuple[int, int]] = deque()  # (trial number, seed position)
        while True:
            job = self.next_job(pending)
            if job is not None:
                raised = self.job(*job)
                self.job_ended(job, raised, pending)
            elif self.flights:  # only held ones, waiting for others to end
                self.look_again(pending)
                phases = [f.phase == "holding" for f in self.flights.values()]
                if phases and all(phases) and not pending:
                    held = ", ".join(f"t{n}" for n in self.flights)
                    raise RuntimeError(f"held forever: {held}")  # the real loop would poll on
            else:
                return self.study

    def next_job(self, pending: deque) -> tuple[int, int] | None:
        while True:
            while pending:
                number, pos = pending.popleft()
                flight = self.flights.get(number)
                if flight is not None and flight.phase == "training":
                    flight.started += 1
                    return number, pos
            if not self.take(pending):
                return None

    def take(self, pending: deque) -> bool:
        if not any(t.state == TrialState.WAITING for t in self.study.get_trials(deepcopy=False)):
            return False
        trial = self.study.ask()
        for name, values in self.choices.items():
            trial.suggest_categorical(name, values)  # the enqueued value
        self.flights[trial.number] = Flight(trial, list(range(self.policy.start_seeds)))
        pending.extend((trial.number, pos) for pos in self.flights[trial.number].seeds)
        return True

    def job(self, number: int, pos: int) -> bool:
        """One seed's job (job.py run_trial, after its setup): True when it raised."""
        flight = self.flights[number]
        trial, seed = flight.trial, self.order[pos]
        config = trial.user_attrs[CONFIG]
        attrs = self.study.user_attrs
        run = self.logged.run(f"{config}/seed{seed}")
        started = Replicate(seed, State.RUNNING, None, None, 0, None, "", run.run_id)
        trial.set_user_attr(replicate_key(seed), started.as_attr())
        first = flight.seeds.index(pos) == 0
        reporter = trial_reporter(run, trial, attrs, started, first, self.pool.max_steps, seed)
        error = None
        try:
            for step, metrics in self.pool.steps(config, seed, self.eval_every, self.read):
                reporter.report(step, metrics)
            if reporter.steps_run < self.pool.max_steps:
                raise FloatingPointError(f"the recorded run blew up at step {reporter.steps_run}")
            value = reporter.last.get(reporter.objective)
            if value is None or not math.isfinite(value):
                raise FloatingPointError(f"objective {reporter.objective}={value}")
        except (TrialPruned, FloatingPointError) as e:
            error = e
        problems = self.pool.per_problem.get(config, {}).get(seed)
        result = Result({reporter.objective: problems} if problems else {})
        ended = ended_replicate(started, reporter, None if error else result, error)
        trial.set_user_attr(replicate_key(seed), ended.as_attr())
        return error is not None

    def floor(self) -> float | None:
        """What a seed that broke counts at (loop.py's _floor)."""
        if not self.policy.count_broken:
            return None
        return break_floor(self.pool.objective, True, self.study.get_trials(deepcopy=False))

    def job_ended(self, job: tuple[int, int], raised: bool, pending: deque) -> None:
        number, pos = job
        flight = self.flights[number]
        flight.ended[pos] = raised
        trial = self.study._storage.get_trial(flight.trial._trial_id)
        if raised and not counts_broken(trial, self.order[pos], self.floor()):
            flight.phase = "broken"
        if flight.seeds_ended and self.look(flight, pending):
            self.look_again(pending)

    def look(self, flight: Flight, pending: deque) -> bool:
        """loop.py _look: one more seed, a hold, or told. True: told."""
        step = None
        if self.policy.screen_sd and flight.phase != "broken" and len(flight.seeds) == 1:
            screen = self.screened(flight)
            if screen is None:
                flight.phase = "holding"
                return False
            if screen:
                del self.flights[flight.trial.number]
                self.tell(flight, screen)
                return True
            flight.phase = "training"  # through: the race seeds it (one value)
        if self.policy.race and flight.phase != "broken":
            trials = self.study.get_trials(deepcopy=False)
            me = self.study._storage.get_trial(flight.trial._trial_id)
            step = racing.look(
                trials,
                me,
                self.policy.max_seeds,
                True,
                True,
                self.policy.min_difference,
                self.policy.wait_for_leader,
                self.policy.futility,
                self.policy.leader_rule,
                self.floor(),
                racing.Budget(self.policy.budget_seeds, self.pool.max_steps, planned(self.flights)),
            )
            if step.action == race.SEED:
                flight.phase = "training"
                flight.seeds.append(max(flight.seeds) + 1)
                pending.appendleft((flight.trial.number, flight.seeds[-1]))
                return False
            if step.action == race.HOLD:
                flight.phase = "holding"
                return False
        del self.flights[flight.trial.number]
        self.tell(flight, step.why if step else "")
        return True

    def screened(self, flight: Flight) -> str | None:
        """The screen's call on a configuration with one seed: None (hold: others are still
        to screen), "" (race on) or why it stops."""
        trials = self.study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials) or any(
            f.phase == "training" and f is not flight for f in self.flights.values()
        ):
            return None
        first = {}
        for t in trials:
            recorded = [r for r in replicates(t) if r.state == State.COMPLETE]
            if recorded:
                r = min(recorded, key=lambda r: self.order.index(r.seed))
                first[t.number] = (r.value, r.stderr or 0.0)
        me = first.get(flight.trial.number)
        if me is None:
            return ""
        lead_number = max(first, key=lambda n: first[n][0])
        lead = first[lead_number]
        gap = lead[0] - me[0]
        sd = math.sqrt(2 * self.policy.screen_sd**2 + lead[1] ** 2 + me[1] ** 2)
        if gap > self.policy.screen_z * sd:
            return (
                f"screened out after 1 seed: t{lead_number} is better by {gap:.3g} "
                f"(> {self.policy.screen_z:g} x {sd:.3g})"
            )
        return ""

    def look_again(self, pending: deque) -> None:
        while True:
            held = [f for f in self.flights.values() if f.phase == "holding"]
            if not any(self.look(f, pending) for f in held):
                return

    def tell(self, flight: Flight, race: str) -> None:
        """tell.py tell_outcome, for jobs that recorded their seed (none is lost here)."""
        trial = flight.trial
        if race:
            trial.set_user_attr(TrialAttr.RACE, race)
        recorded = {r.seed: r for r in replicates(self.study._storage.get_trial(trial._trial_id))}
        ended = [recorded[self.order[p]] for p in flight.ended]
        out = combine(ended, len(flight.seeds), self.floor())
        trial.set_user_attr(TrialAttr.STEPS_RUN, out.steps_run)
        if out.baseline is not None:
            trial.set_user_attr(TrialAttr.BASELINE, out.baseline)
        if out.breach is not None:
            trial.set_user_attr(TrialAttr.PRUNE_REASON, out.breach)
        if out.state == State.COMPLETE:
            self.study.tell(trial, values=out.value)
        elif out.state == State.PRUNED:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            trial.set_user_attr(TrialAttr.FAIL_REASON, out.reason)
            self.study.tell(trial, state=TrialState.FAIL)


def memoized_forecasts() -> None:
    """judge/forecast.py's forecast is pure (its bootstrap seeded): the same curve gives
    the same forecast, so replays share them (400 bootstrap refits per eval step otherwise
    dominate the bench). Checked: tests/test_bench_cost.py."""
    if getattr(forecast_math.forecast, "memoized", False):
        return
    pure = forecast_math.forecast

    @functools.lru_cache(maxsize=200_000)
    def cached(steps, values, stderrs, final_step, rest, options):
        return pure(list(steps), list(values), list(stderrs), final_step, *rest, **dict(options))

    def forecast(steps, values, stderrs, final_step, *rest, **options):
        key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))
        return cached(tuple(steps), tuple(values), tuple(stderrs), final_step, rest, key)

    forecast.memoized = True
    forecast_math.forecast = forecast


# --- scoring: what the sweep's verdict says against the truth ---------------------------


def params_of(config: str) -> dict[str, float]:
    """A pool's configuration label as parameters: "group_size=4 lr=0.001" ->
    {"group_size": 4.0, "lr": 0.001}; {} for a label that is not one ("a")."""
    out = {}
    for part in config.split():
        name, _, value = part.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            return {}
    return out


def outcome(study: optuna.Study, edge: bool = True) -> dict:
    """What the sweep spent and what its verdict says, by configuration. edge: the verdict
    names the best away from the edge of stability (judge/edge.py), as the sweeper's does."""
    trials = study.get_trials(deepcopy=False)
    label = {f"t{t.number}": t.user_attrs[CONFIG] for t in trials}
    v = sweep_verdict(trials, study.user_attrs, True, edge=edge)
    pick = label[v.best.label] if v.best is not None else None
    return {
        "trial_steps": sum(r.steps_run for t in trials for r in replicates(t)),
        "pick": pick,
        "tied": [label[x] for x in v.tied_with_best],
        # A difference with no interval (no eval stderr logged) is unknown, not decided.
        "decided": [
            label[s.label]
            for s in v.ranked[1:]
            if s.label not in v.tied_with_best and s.interval.known and v.best.interval.known
        ],
        "seeds": {label[f"t{t.number}"]: len(replicates(t)) for t in trials},
        "states": {label[f"t{t.number}"]: t.state.name for t in trials},
        # what stopped each pruned configuration: which seed, and why
        "stops": {
            label[f"t{t.number}"]: [
                f"{len(seeds)} seeds run, one stopped: {r.reason[:70]}"
                for r in seeds
                if r.state == State.PRUNED
            ]
            for t in trials
            if t.state == TrialState.PRUNED and (seeds := replicates(t))
        },
    }


def scored(truth: Truth, out: dict) -> dict:
    """The verdict against the truth. right: it names the truth's best, or a pick the truth
    ties with the best while calling the best tied with it; strict: the pick is the best;
    type I: a pair the verdict decides (the pick over another) that the truth ties; type II:
    a pair it ties whose true gap exceeds the minimal difference; ties_called: every
    configuration the truth ties with the pick is called tied with it."""
    best, pick = truth.best, out["pick"]
    worst = min(truth.means.values())
    tie = pick is not None and frozenset((pick, best)) in truth.ties
    return {
        "strict": pick == best,
        "right": pick == best or (tie and best in out["tied"]),
        "within_ties": pick == best or tie,
        "regret": truth.means[best] - (truth.means[pick] if pick is not None else worst),
        "type1": sum(frozenset((pick, o)) in truth.ties for o in out["decided"]),
        "type2": sum(truth.gap(pick, o) > truth.min_difference for o in out["tied"]),
        # every configuration the truth ties with the pick is called tied with it (issue 72:
        # a small grid's verdict calls the tie wherever the truth ties)
        "ties_called": pick is not None
        and all(
            o in out["tied"]
            for o in truth.means
            if o != pick and frozenset((pick, o)) in truth.ties
        ),
        "best_stopped": out["states"].get(best) != "COMPLETE",
        "best_stopped_by": out.get("stops", {}).get(best, []),
    }


def draws(pool: Pool, reps: int, seed: int) -> Iterator[tuple[int, list[int], list[str], str]]:
    """`reps` replays' draws, as a sweep makes them: (replay, the recorded seeds in one order
    shared by every configuration, the configurations' queue, the study's name)."""
    rng = random.Random(seed)
    for rep in range(reps):
        order = rng.sample(pool.seeds, len(pool.seeds))
        queue = rng.sample(sorted(pool.runs), len(pool.runs))
        yield rep, order, queue, f"{pool.name}-{seed}-{rep}"


def replays(
    pool: Pool, truth: Truth, policies: Sequence[Policy], reps: int, seed: int, eval_every: int
):
    """`reps` replays of every policy on the same draws: (rows, skipped policies)."""
    usable = [
        p
        for p in policies
        if p.most_seeds <= len(pool.seeds)
        and (pool.curves or (p.pruner == "none" and not p.health))
    ]
    rows = []
    for rep, order, queue, name in draws(pool, reps, seed):
        row = {"replay": rep, "seed": seed, "order": order, "queue": queue}
        for p in usable:
            out = outcome(Sweep(pool, p, queue, order, name, eval_every).run(), p.edge)
            row[p.name] = {**out, **scored(truth, out)}
        rows.append(row)
    return rows, [p.name for p in policies if p not in usable]


# --- summaries -------------------------------------------------------------------------


def mean_interval(xs: Sequence[float]) -> list[float]:
    """mean and its 95% normal interval (over replays)."""
    i = stats.normal_interval(*mean_and_stderr(list(xs)))
    return [i.estimate, i.low, i.high]


def over(xs: Sequence[float], rate: bool = False) -> list[float]:
    """mean and its 95% t interval over a few truths (the mean alone for one); a rate's
    clipped to [0, 1]."""
    if len(xs) < 2:
        return [xs[0]] * 3
    i = stats.t_interval(list(xs))
    return [i.estimate, max(i.low, 0.0), min(i.high, 1.0)] if rate else [i.estimate, i.low, i.high]


def summary(rows: list[dict], names: Sequence[str]) -> dict:
    out = {}
    for name in names:
        got = [r[name] for r in rows]
        n = len(got)
        steps = [g["trial_steps"] for g in got]
        s = {
            "trial_steps": mean_interval(steps),
            "right": [sum(g["right"] for g in got) / n, *wilson(sum(g["right"] for g in got), n)],
            "strict": [
                sum(g["strict"] for g in got) / n,
                *wilson(sum(g["strict"] for g in got), n),
            ],
            "within_ties": sum(g["within_ties"] for g in got) / n,
            "ties_called": [
                sum(g.get("ties_called", False) for g in got) / n,
                *wilson(sum(g.get("ties_called", False) for g in got), n),
            ],
            "regret": mean_interval([g["regret"] for g in got]),
            "type1": sum(g["type1"] for g in got),
            "type2": sum(g["type2"] for g in got),
            "best_stopped": sum(g["best_stopped"] for g in got) / n,
            # why, over the replays that stopped it (the rule or the forecast, and the seed)
            "best_stopped_by": dict(Counter(why for g in got for why in g["best_stopped_by"])),
            "mean_seeds": {c: sum(g["seeds"][c] for g in got) / n for c in got[0]["seeds"]},
        }
        for b in BASELINES:  # paired with each baseline the replays ran, on the same draws
            if b not in rows[0]:
                continue
            base = [r[b] for r in rows]
            b_steps = sum(x["trial_steps"] for x in base) / n
            s[f"steps_share_of_{b}"] = (sum(steps) / n) / b_steps
            for key in ("right", "strict", "regret"):
                s[f"{key}_minus_{b}"] = paired(
                    [float(g[key]) for g in got], [float(x[key]) for x in base]
                )
        if "fixed1" in rows[0]:  # where the pool has too few seeds for fixed3: against one seed
            for key in ("right", "strict", "regret"):
                s[f"{key}_minus_fixed1"] = paired(
                    [float(g[key]) for g in got], [float(r["fixed1"][key]) for r in rows]
                )
        out[name] = s
    return out


def qualifies(s: dict) -> dict:
    """Issue 49's bar against the plain seeds=3 grid on one truth: regret no worse, verdict
    right at least as often (point estimates; the paired intervals beside), <= 25% of its
    trial-steps. Issue 72's against the with-rules grid (fixed3_health), where it ran: the
    same, at <= 75% of its trial-steps."""
    out = {}
    for b, most in ((BASELINE, 0.25), (HEALTH_BASELINE, 0.75)):
        share = s.get(f"steps_share_of_{b}")
        if share is None:
            continue
        regret, right = s[f"regret_minus_{b}"], s[f"right_minus_{b}"]
        bar = {
            "steps_share": share,
            "regret_no_worse": regret[0] <= 0,
            "right_at_least": right[0] >= 0,
            "cheap_enough": share <= most,
            "qualifies": regret[0] <= 0 and right[0] >= 0 and share <= most,
        }
        if b == BASELINE:
            out.update(bar)
        else:
            out[f"against_{b}"] = bar
    return out


def over_truths(per_pool: dict[str, dict]) -> dict:
    """Each policy's figures over the pools it ran on: mean and 95% t interval over truths."""
    names = {n for s in per_pool.values() for n in s}
    out = {}
    for name in sorted(names):
        here = [s[name] for s in per_pool.values() if name in s]
        row = {"truths": len(here)}
        for key in ("right", "strict", "regret"):
            row[key] = over([h[key][0] for h in here], rate=key != "regret")
        for b in BASELINES:
            for key in (f"right_minus_{b}", f"strict_minus_{b}", f"regret_minus_{b}"):
                if all(key in h for h in here):  # paired per truth
                    row[key] = over([h[key][0] for h in here])
            share = f"steps_share_of_{b}"
            if any(share in h for h in here):
                row[share] = over([h[share] for h in here if share in h])
        out[name] = row
    return out


def shown(x: Sequence[float] | None, digits: int = 3, sign: str = "") -> str:
    """A figure and its interval, [estimate, low, high], for a table ("-": not measured)."""
    if x is None:
        return "-"
    low, high = (f"{v:{sign}.{digits}f}" for v in x[1:])
    return f"{x[0]:{sign}.{digits}f} [{low}, {high}]"


def tables(results: dict) -> list[str]:
    """The results as COST.md's markdown tables: per pool, then over truths. Each policy
    against the with-rules seeds=3 grid first, the plain one second (where they ran; on a
    pool with too few seeds for either, against one seed)."""
    lines = []
    for name, pool in results["pools"].items():
        grid = 3 * len(pool["truth"]) * pool["max_steps"]  # a seeds=3 grid prunes nothing
        vs = [b for b in BASELINES if b in pool["summary"]] or ["fixed1"]
        lines += [
            f"{name} ({len(pool['truth'])} configurations, seeds {pool['seeds']}, "
            f"best {pool['truth_best']}, {pool['replays']} replays):",
            "",
            f"| policy | trial-steps (share of a plain seeds=3 grid's {grid}) | right | strict | "
            "regret | "
            + "".join(f"share of {b} | strict - {b} | regret - {b} | " for b in vs)
            + "I | II | ties called | best stopped |",
            "|---|---|---|---|---|" + "---|---|---|" * len(vs) + "---|---|---|---|",
        ]
        for p, s in pool["summary"].items():
            share = s["trial_steps"][0] / grid
            cells = [
                f"{s['trial_steps'][0]:.1f} ({share:.3f})",
                shown(s["right"]),
                shown(s["strict"]),
                shown(s["regret"], 4),
            ]
            for b in vs:
                of = s.get(f"steps_share_of_{b}")
                cells += [
                    "-" if of is None else f"{of:.3f}",
                    shown(s.get(f"strict_minus_{b}"), 3, "+"),
                    shown(s.get(f"regret_minus_{b}"), 4, "+"),
                ]
            called = s.get("ties_called")
            cells += [str(s["type1"]), str(s["type2"]), shown(called) if called else "-"]
            cells.append(f"{s['best_stopped']:.3f}")
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines + over_table(results["over_truths"])


def over_table(rows: dict) -> list[str]:
    """over_truths' figures as a markdown table: against the with-rules seeds=3 grid first
    and the plain one second, where the results ran them."""
    vs = [b for b in BASELINES if any(f"steps_share_of_{b}" in r for r in rows.values())]
    lines = [
        "Over truths (mean [95% t interval] over the pools' figures; share of each baseline's "
        "trial-steps; minus a baseline: each truth's paired difference):",
        "",
        "| policy | truths | right | strict | regret | "
        + "".join(
            f"right - {b} | strict - {b} | regret - {b} | share of {b} | " for b in vs
        ).rstrip(" "),
        "|---|---|---|---|---|" + "---|---|---|---|" * len(vs),
    ]
    for p, row in rows.items():
        cells = [str(row["truths"]), shown(row["right"]), shown(row["strict"])]
        cells.append(shown(row["regret"], 4))
        for b in vs:
            cells += [
                shown(row.get(f"right_minus_{b}"), 3, "+"),
                shown(row.get(f"strict_minus_{b}"), 3, "+"),
                shown(row.get(f"regret_minus_{b}"), 4, "+"),
                shown(row.get(f"steps_share_of_{b}")),
            ]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines


def headline(paths: Sequence[str], policy: str) -> list[str]:
    """One policy on each pool of several results files, a row each: its share of the
    with-rules seeds=3 grid's trial-steps (and of the plain one's), right and strict beside
    each grid's, and its regret minus each grid's, paired over replays."""
    lines = [
        f"| {policy} | steps / {HEALTH_BASELINE}'s | / {BASELINE}'s | right ({HEALTH_BASELINE}, "
        f"{BASELINE}) | strict (same) | regret - {HEALTH_BASELINE} | regret - {BASELINE} |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        for pool in json.loads(Path(path).read_text())["pools"].values():
            s, summ = pool["summary"][policy], pool["summary"]

            def rate(key: str, of: str, summ: dict = summ) -> str:
                return f"{summ[of][key][0]:.2f}" if of in summ else "-"

            lines.append(
                f"| {Path(path).stem.removeprefix('cost_')} ({pool['replays']}) | "
                f"{shown_share(s, HEALTH_BASELINE)} | {shown_share(s, BASELINE)} | "
                f"{s['right'][0]:.2f} ({rate('right', HEALTH_BASELINE)}, "
                f"{rate('right', BASELINE)}) | {s['strict'][0]:.2f} "
                f"({rate('strict', HEALTH_BASELINE)}, {rate('strict', BASELINE)}) | "
                f"{shown(s.get(f'regret_minus_{HEALTH_BASELINE}'), 4, '+')} | "
                f"{shown(s.get(f'regret_minus_{BASELINE}'), 4, '+')} |"
            )
    return lines


def shown_share(s: dict, baseline: str) -> str:
    share = s.get(f"steps_share_of_{baseline}")
    return "-" if share is None else f"{share:.3f}"


def over_results(paths: Sequence[str]) -> dict:
    """over_truths of every pool in several results files (one truth each: a held-out set
    judged in its own run), keyed by file and pool, since each file names its pool alike."""
    per_pool = {}
    for path in paths:
        for name, pool in json.loads(Path(path).read_text())["pools"].items():
            per_pool[f"{Path(path).name}:{name}"] = pool["summary"]
    return over_truths(per_pool)


# --- validation: the simulation against a real sweep -----------------------------------

SKIPPED_METRICS = ("forecast/", "warning/")  # what the job logs about itself, not training


def real_sweep(folder: Path) -> tuple[optuna.Study, Any]:
    """The one study a real sweep in `folder` left (sweeps.db) and its MLflow store."""
    from mlflow import MlflowClient

    storage = f"sqlite:///{folder}/sweeps.db"
    (name,) = optuna.get_all_study_names(storage)
    client = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db")
    return optuna.load_study(study_name=name, storage=storage), client


def logged_curve(client: Any, run_id: str) -> Curve:
    """A seed's run as the reporter was handed it: {step: metrics}, from MLflow."""
    curve: Curve = {}
    for key in client.get_run(run_id).data.metrics:
        if key.startswith(SKIPPED_METRICS):
            continue
        for m in client.get_metric_history(run_id, key):
            curve.setdefault(m.step, {})[key] = m.value
    return curve


def policy_of(attrs: Mapping[str, Any]) -> Policy:
    """The policy a real study ran (its settings as the study recorded them)."""
    rules = attrs[StudyAttr.HEALTH_RULES]
    kl, objective = attrs[StudyAttr.KL_THRESHOLD], attrs[StudyAttr.OBJECTIVE]
    defaults = [r.as_dict() for r in default_rules(kl, objective)]
    if rules not in ([], defaults):
        raise ValueError("health rules other than the defaults or none: not a bench policy")
    raced = StudyAttr.MAX_SEEDS in attrs
    return Policy(
        "real",
        "auto" if raced else attrs[StudyAttr.SEEDS],
        attrs[StudyAttr.PRUNER],
        bool(rules),
        attrs.get(StudyAttr.MAX_SEEDS, GRPOSweeperConf.max_seeds),
        attrs[StudyAttr.FORECAST_LEVEL],
        attrs[StudyAttr.PRUNER_WARMUP_STEPS],
        futility=race.POWER,  # a real sweep decides with judge/race.py's defaults
        leader_rule=race.HOPEFUL,
    )


def decisions(study: optuna.Study) -> dict:
    """What a sweep decided, by configuration, and its verdict: what must agree."""
    trials = study.get_trials(deepcopy=False)
    out = {"configs": {}}
    for t in trials:
        c = t.user_attrs.get(CONFIG) or f"lr={t.params['lr']:g}"
        out["configs"][c] = {
            "trial": t.number,
            "state": t.state.name,
            "value": t.value,
            "race": t.user_attrs.get(TrialAttr.RACE, ""),
            "seeds": {
                str(r.seed): [r.state, r.steps_run, r.value, (r.breach or {}).get("rule")]
                for r in sorted(replicates(t), key=lambda r: r.seed)
            },
        }
    v = sweep_verdict(trials, study.user_attrs, True)
    # The simulated trials carry no params: "t0 (lr=0.002)" is "t0 (defaults)" there.
    out["verdict"] = re.sub(r"\((lr=[^)]*|defaults)\)", "(...)", v.text)
    out["trial_steps"] = sum(r.steps_run for t in trials for r in replicates(t))
    return out


def validate(folder: Path) -> dict:
    """Replay a real sweep's own curves (from its MLflow runs) through the simulation, the
    configurations in its trials' order and its seeds: every decision must come out the same
    (any difference is the simulation's, not training's: the curves are the same)."""
    real, client = real_sweep(folder)
    trials = sorted(real.get_trials(deepcopy=False), key=lambda t: t.number)
    runs: dict[str, dict[int, Curve]] = {}
    per_problem: dict[str, dict[int, tuple[float, ...]]] = {}
    params = {}
    for t in trials:
        c = f"lr={t.params['lr']:g}"
        for r in replicates(t):
            runs.setdefault(c, {})[r.seed] = logged_curve(client, r.run_id)
            if r.per_problem is not None:
                per_problem.setdefault(c, {})[r.seed] = r.per_problem
            params = client.get_run(r.run_id).data.params
    max_steps, eval_every = int(params["max_steps"]), int(params["eval_every"])
    objective = real.user_attrs[StudyAttr.OBJECTIVE]
    pool = Pool(real.study_name, max_steps, runs, objective, per_problem=per_problem)
    seeds = sorted({s for c in runs.values() for s in c})
    order = list(range(seeds[0], seeds[0] + max(MAX_ORDER, len(seeds))))
    queue = [f"lr={t.params['lr']:g}" for t in trials]
    policy = policy_of(real.user_attrs)
    simulated = Sweep(pool, policy, queue, order, real.study_name, eval_every).run()
    want, got = decisions(real), decisions(simulated)
    return {
        "study": real.study_name,
        "policy": policy.__dict__,
        "max_steps": max_steps,
        "eval_every": eval_every,
        "same": want == got,
        "trial_steps": f"real {want['trial_steps']}, simulated {got['trial_steps']}",
        "real": want,
        "simulated": got,
    }


def same_runs(folders: Sequence[Path]) -> list[dict]:
    """Runs two of the sweeps both trained (the same training params: lr, seed, steps, ...):
    their metrics at the steps both reached, compared (timings aside). Equal: training is
    deterministic here, so a recorded run stands for any sweep's run of it."""
    runs: dict[tuple, list[tuple[str, Curve]]] = {}
    for folder in folders:
        study, client = real_sweep(folder)
        for t in study.get_trials(deepcopy=False):
            for r in replicates(t):
                params = client.get_run(r.run_id).data.params
                key = tuple(sorted((k, v) for k, v in params.items() if k not in RUN_BOUND))
                name = f"{study.study_name} t{t.number} seed {r.seed}"
                runs.setdefault(key, []).append((name, logged_curve(client, r.run_id)))
    out = []
    for found in runs.values():
        (first, a), *others = found
        for name, b in others:
            diffs = [
                abs(a[s][k] - b[s][k])
                for s in set(a) & set(b)
                for k in set(a[s]) & set(b[s])
                if not k.startswith(("time/", "throughput/"))
            ]
            out.append({"runs": [first, name], "steps": len(set(a) & set(b)), "max": max(diffs)})
    return out


RUN_BOUND = ("output_dir", "experiment", "onednn")  # params naming where a run went, not what


MAX_ORDER = 10  # seed positions a replayed real sweep may reach (a KeyError past its runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--curves", nargs="+", default=[], help="record_curves.py files (globs)")
    p.add_argument("--part", default="all", choices=["calibration", "heldout", "all"])
    p.add_argument("--max-steps", type=int, help="cut the curves here (default: as recorded)")
    p.add_argument("--objective", help="default: each file's heldout_metric")
    p.add_argument(
        "--truth",
        nargs="+",
        default=[],
        help="the truth from these curve files (globs; e.g. the held-out seeds), not from the "
        "runs the sweeps draw",
    )
    p.add_argument(
        "--values",
        nargs="+",
        default=[],
        help="racing truths (final values only) as FILE:MAX_STEPS",
    )
    p.add_argument("--eval-every", type=int, default=10, help="the sweep's eval cadence")
    p.add_argument("--policies", nargs="+", default=[q.name for q in POLICIES])  # or VARIANTS
    p.add_argument("--repetitions", type=int, default=100)
    p.add_argument("--seed", type=int, nargs="+", default=[0])
    p.add_argument("--out", help="file name under bench/results (default: cost_<name>.json)")
    p.add_argument("--name", default="curves")
    p.add_argument("--validate", nargs="+", help="real sweeps' folders (sweeps.db, mlflow.db)")
    p.add_argument("--table", help="print a results JSON's tables as markdown, and stop")
    p.add_argument("--over", nargs="+", help="results JSONs: their figures over truths, and stop")
    p.add_argument(
        "--headline", nargs="+", metavar="POLICY FILE", help="a policy's row per pool, and stop"
    )
    args = p.parse_args(argv)
    if args.table:
        print("\n".join(tables(json.loads(Path(args.table).read_text()))))
        return 0
    if args.over:
        print("\n".join(over_table(over_results(args.over))))
        return 0
    if args.headline:
        print("\n".join(headline(args.headline[1:], args.headline[0])))
        return 0
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    memoized_forecasts()
    if args.validate:
        checks = [validate(Path(d)) for d in args.validate]
        for c in checks:
            print(f"{c['study']}: {'same' if c['same'] else 'DIFFERENT'} ({c['trial_steps']})")
        shared = same_runs([Path(d) for d in args.validate])
        for row in shared:
            print(f"{row['runs']}: {row['steps']} steps in common, max |difference| {row['max']}")
        path = RESULTS / (args.out or "cost_validation.json")
        body = {"machine": machine(), "sweeps": checks, "same_run_in_two_sweeps": shared}
        path.write_text(json.dumps(body, indent=1) + "\n")
        print(f"wrote {path}")
        return 0 if all(c["same"] for c in checks) else 1
    known = (*POLICIES, *VARIANTS)
    chosen = [q for q in known if q.name in args.policies]
    unknown = set(args.policies) - {q.name for q in known}
    if unknown:
        p.error(f"--policies {' '.join(sorted(unknown))}: not among {[q.name for q in known]}")
    paths = [f for pattern in args.curves for f in sorted(glob.glob(pattern))]
    if args.curves and not paths:
        p.error(f"--curves {' '.join(args.curves)}: no file matches")
    pools = list(load_curves(paths, args.part, args.max_steps, args.objective).values())
    for v in args.values:
        path, _, steps = v.rpartition(":")
        if not path or not steps.isdigit():
            p.error(f"--values {v}: must be FILE:MAX_STEPS (e.g. racing_racing-truth-20.json:20)")
        pools.append(load_values(path, int(steps)))
    truth_paths = [f for pattern in args.truth for f in sorted(glob.glob(pattern))]
    truths = load_curves(truth_paths, "all", args.max_steps, args.objective)
    results = {"machine": machine(), "eval_every": args.eval_every, "policies": {}, "pools": {}}
    results["policies"] = {q.name: q.__dict__ for q in chosen}
    per_pool = {}
    for pool in pools:
        truth_pool = truths.get(pool.name, pool) if truth_paths else pool
        if truth_paths and (pool.name not in truths or set(truth_pool.runs) != set(pool.runs)):
            p.error(f"--truth: no runs of every configuration of {pool.name}")
        truth = truth_pool.truth()
        rows, skipped = [], []
        for s in args.seed:
            got, skipped = replays(pool, truth, chosen, args.repetitions, s, args.eval_every)
            rows += got
        ran = [q.name for q in chosen if q.name not in skipped]
        summ = summary(rows, ran)
        per_pool[pool.name] = summ
        results["pools"][pool.name] = {
            "max_steps": pool.max_steps,
            "objective": pool.objective,
            "curves": pool.curves,
            "seeds": pool.seeds,
            "truth_seeds": truth_pool.seeds,
            "truth": {c: truth.means[c] for c in sorted(truth.means)},
            "truth_best": truth.best,
            "truth_ties": sorted(sorted(t) for t in truth.ties),
            "min_difference": truth.min_difference,
            "skipped": skipped,
            "replays": len(rows),
            "summary": summ,
            "qualifies": {n: qualifies(s) for n, s in summ.items()},
            "rows": rows,
        }
        print(
            f"{pool.name}: {len(pool.runs)} configurations x {len(pool.seeds)} seeds, best "
            f"{truth.best}, skipped {skipped or 'none'}"
        )
        for n, s in summ.items():
            share = s.get(f"steps_share_of_{HEALTH_BASELINE}", float("nan"))
            plain = s.get(f"steps_share_of_{BASELINE}", float("nan"))
            print(
                f"  {n:14s} steps {s['trial_steps'][0]:7.1f} ({share:5.2f} of "
                f"{HEALTH_BASELINE}, {plain:5.2f} of {BASELINE}) "
                f"right {s['right'][0]:.3f} strict {s['strict'][0]:.3f} "
                f"regret {s['regret'][0]:.4f} [{s['regret'][1]:.4f}, {s['regret'][2]:.4f}] "
                f"I {s['type1']} II {s['type2']}"
            )
    results["over_truths"] = over_truths(per_pool)
    path = RESULTS / (args.out or f"cost_{args.name}.json")
    path.write_text(dumped(results))
    print(f"wrote {path}")
    return 0


def dumped(results: dict) -> str:
    """JSON with each replay on one line (thousands of them)."""
    rows = {name: pool.pop("rows") for name, pool in results["pools"].items()}
    text = json.dumps(results, indent=1)
    for name, pool in results["pools"].items():
        pool["rows"] = rows[name]
    body = json.loads(text)
    for name in body["pools"]:
        body["pools"][name]["rows"] = "@ROWS:" + name
    text = json.dumps(body, indent=1)
    for name, r in rows.items():
        lines = ",\n".join(f"    {json.dumps(x)}" for x in r)
        text = text.replace(f'"@ROWS:{name}"', f"[\n{lines}\n   ]")
    return text + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
