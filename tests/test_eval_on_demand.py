"""An eval on demand: before a run's first eval after its baseline, the KL rule's early gate
pruned on the KL alone. Now the monitor asks for an eval at that step
(HealthMonitor.wants_eval), and a run whose eval shows it learned goes on: in our trainer, in
TRL's callback and in a replay of a recorded curve (issue 73: SmolLM2 lr=2e-3 seed 41, pruned at step 7 at
eval_every=10 on a KL of 5.35 and 2.46, ended at 0.50 from a 0.25 baseline)."""

from __future__ import annotations

from types import SimpleNamespace

from hydra import compose, initialize_config_dir

from analysis.rule_replay import Run, evals_on_demand, library_run, outcome
from records import metrics
from trainer.run.health import HealthMonitor, default_rules, replay, warnings
from trainer.run.train import train

EVAL, EVAL_SE = metrics.EVAL_REWARD, metrics.stderr_of(metrics.EVAL_REWARD)
KL2 = metrics.KL_PRE_POST_V2
# Seed 41's KL over steps 1-9 (recorded at eval every 2: bench/results/curves/); its baseline
# 0.25 +- 0.055 over 64 problems.
SEED41_KL = [0.84, 0.34, 1.04, 1.11, 0.87, 5.35, 2.46, 5.28, 0.42]


def post_update_kl() -> list:
    return [r for r in default_rules(0.01) if r.name == "post_update_kl"]


def seed41(evals: dict[int, tuple[float, float]]) -> dict[int, dict[str, float]]:
    steps = {0: {EVAL: 0.25, EVAL_SE: 0.055}}
    for step, kl in enumerate(SEED41_KL, start=1):
        steps[step] = {KL2: kl, metrics.REWARD: 0.5}
    for step, (value, se) in evals.items():
        steps[step] |= {EVAL: value, EVAL_SE: se}
    return steps


def test_the_monitor_asks_for_an_eval_where_the_kl_alone_would_prune():
    """Steps 6 and 7 pass 10 x the bound (2.0), the third step in a row above the bound: the
    early gate. wants_eval says so at step 7 and only there, and counts nothing."""
    monitor = HealthMonitor(post_update_kl())
    run = seed41({})
    asked = []
    for step in sorted(run):
        before = monitor.state()
        if monitor.wants_eval(step, run[step]):
            asked.append(step)
        assert monitor.state() == before  # a question: no streak moved
        monitor.breaches(step, run[step] | ({EVAL: 0.55, EVAL_SE: 0.063} if step == 7 else {}))
    # step 8 (KL 5.28) has the step-7 eval: the guard decides, no second ask
    assert asked == [7]
    # a rule without the held-out guard, or a warning, never asks
    unguarded = [r for r in default_rules(0.01) if r.name in ("sampler_kl", "train_reward_fell")]
    quiet = HealthMonitor(unguarded)
    assert not any(
        quiet.wants_eval(s, m | {metrics.KL_SAMPLE_TRAIN_V2: 9.0}) for s, m in run.items()
    )


def test_the_early_prune_stands_unless_the_eval_shows_the_run_learned():
    """Without an eval on demand (a recording, or TRL users' own callback) the KL alone prunes
    at step 7, as before. With one, the KL's verdict stands unless the eval is 2 standard
    errors above the baseline (LEARNED_STDERRS, as learned_then_broke reads "learned"): seed
    41's 0.55 is (0.30 above, 2 x 0.083 = 0.17) and the run goes on; a collapse's 0.0 is not,
    nor is 0.30, within the noise of a 64-problem eval (a 16-problem one's cannot tell a
    collapse from its baseline either: the KL decides there)."""
    run = seed41({})
    assert replay(post_update_kl(), run).step == 7
    assert replay(post_update_kl(), run, {7: {EVAL: 0.55, EVAL_SE: 0.063}}) is None
    for value, se in ((0.0, 0.0), (0.30, 0.057)):
        breach = replay(post_update_kl(), run, {7: {EVAL: value, EVAL_SE: se}})
        assert (breach.rule, breach.step) == ("post_update_kl", 7)
    # the warnings a replay reports come from the same steps, the eval on demand included
    assert warnings(post_update_kl(), run, {7: {EVAL: 0.55, EVAL_SE: 0.063}}) == []


def test_a_library_run_recorded_every_2_steps_lends_its_next_eval():
    """A recording holds evals at its own steps: an eval asked for at an odd step of a run
    recorded every 2 is the next one recorded (one step late); a study's runs lend none."""
    recorded = seed41({2: (0.61, 0.061), 4: (0.59, 0.062), 6: (0.66, 0.06), 8: (0.55, 0.063)})
    run = Run("seed41", recorded, eval_every=2, recorded_densely=True)
    evals = evals_on_demand(run)
    assert evals[7] == {EVAL: 0.55, EVAL_SE: 0.063} and evals[6][EVAL] == 0.66
    assert 9 not in evals  # nothing recorded after step 8
    # at eval_every=10 the run keeps its evals at step 0 only: the ask at step 7 gets step 8's
    kept = outcome(post_update_kl(), run, 10, None)
    assert kept.pruned_at is None
    # a study's run lends the evals it logged at their own steps only: replayed at its
    # eval_every=10, one that ran no eval at step 7 is pruned there as it was live; one whose
    # trainer ran that eval on demand (logged at step 7) is kept as it was live
    assert sorted(evals_on_demand(Run("t0", recorded))) == [0, 2, 4, 6, 8]
    assert outcome(post_update_kl(), Run("t0", recorded), 10, None).pruned_at == 7
    live = seed41({7: (0.55, 0.063)})
    assert outcome(post_update_kl(), Run("t1", live), 10, None).pruned_at is None


def config(tmp_path, *overrides: str):
    from pathlib import Path

    conf = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        return compose("config", overrides=[f"output_dir={tmp_path}", *overrides])


def test_our_trainer_evaluates_off_its_schedule_when_the_rules_ask(tmp_path):
    """A real run on the tiny model at eval_every=10 with a KL bound any update passes
    (kl_threshold=1e-9): the third step in a row above it asks for an eval, and the trainer
    logs one at step 3, beside its baseline and its last step's."""
    seen: dict[int, dict[str, float]] = {}

    class Reporter:
        def report(self, step: int, step_metrics: dict[str, float]) -> None:
            seen[step] = dict(step_metrics)

    train(config(tmp_path, "max_steps=5", "eval_every=10", "kl_threshold=1e-9"), Reporter())
    assert [s for s, m in sorted(seen.items()) if EVAL in m] == [0, 3, 5]
    assert all(seen[s][KL2] > 2e-7 for s in (1, 2, 3))  # 10 x the bound of 20 x 1e-9


def test_trls_callback_evaluates_off_its_schedule_when_the_rules_ask():
    """TRL's steps through our callback: the same ask at the same step runs our evaluator."""
    from trainer.backends.trl.callback import Reporting

    cfg = SimpleNamespace(
        num_substeps=1, compute_post_kl=True, max_steps=20, eval_every=10, kl_threshold=0.01
    )
    trained: list[float] = []  # the KLs of the steps TRL has trained so far
    evaluated: list[int] = []

    def step_kls(post_update: bool) -> dict[str, float]:
        trained.append(SEED41_KL[len(trained)])
        return {KL2: trained[-1]}

    def evaluate():
        evaluated.append(len(trained))
        return {EVAL: 0.55, EVAL_SE: 0.063}, {}

    reporting = Reporting(cfg, None, evaluate, step_kls, False)
    control = SimpleNamespace(should_training_stop=False, should_save=True)
    reporting.report(0, {EVAL: 0.25, EVAL_SE: 0.055}, control)
    for step in range(1, 10):
        state = SimpleNamespace(global_step=step)
        reporting.on_log(None, state, control, logs={"reward": 0.5, "entropy": 0.9})
    assert evaluated == [7] and not control.should_training_stop


def test_the_library_records_an_eval_at_every_step_where_one_may_be_asked_for(tmp_path):
    """record_curves' --dense-until: a run recorded every 2 steps also holds evals at each
    step up to it, so a replay at eval_every=10 finds the eval a trainer would ask for."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import record_curves

    argv = ["--out", str(tmp_path), "--seeds", "1", "--lrs", "1e-3", "--tasks", "addition"]
    argv += ["--steps", "5", "--eval-every", "2", "--dense-until", "3"]
    assert record_curves.main(argv) == 0
    data = json.loads((tmp_path / "tiny-addition-lr0.001-seed0.json").read_text())
    assert data["dense_until"] == 3 and data["eval_every"] == 2
    assert [int(s) for s, m in data["steps"].items() if EVAL in m] == [0, 1, 2, 3, 4, 5]
    evals = evals_on_demand(library_run(data))
    assert evals[3][EVAL] == data["steps"]["3"][EVAL]
