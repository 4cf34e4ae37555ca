"""`python -m analysis` on real stores: Optuna studies and MLflow runs written per
docs/records.md (sqlite files in tmp_path), no mocks.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import needs_chromium, rendered_dom, sweep_env
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from analysis.__main__ import main
from analysis.advice import advise
from analysis.kl_plots import kl_curves, reward_vs_kl
from analysis.load import load_study
from analysis.plot_style import EVAL_CI_LABEL, STDERR_GID
from analysis.plots import (
    mean_stderr,
    objective_vs_params,
    pareto_front,
    reward_curves,
    stderr_band,
)
from analysis.text import breach_text
from judge.forecast import FORECAST
from records.metrics import EVAL_REWARD, KL_PRE_POST_V2, stderr_of
from records.sweep import Role, StudyAttr, Tag, TrialAttr, replicates
from trainer.run.health import Breach, default_rules

KL = "kl_sample_train_v2"
RULE = {"name": "sampler_kl", "metric": KL, "check": "above", "bound": 0.01, "patience": 1}
EVAL_STDERR = 0.02  # each eval's standard error over problems, as the trainer logs it
GROUPS = {"groups/frac_mixed": 0.6, "groups/frac_all_good": 0.2, "groups/frac_all_bad": 0.2}
SPACE = {
    "lr": FloatDistribution(1e-5, 1e-3, log=True),
    "group_size": CategoricalDistribution([2, 4, 8]),
}


class Sweep:
    """A study and its MLflow runs, written the way the sweeper and job write them."""

    def __init__(
        self,
        root: Path,
        name: str = "s1",
        threshold: float = 0.01,
        rules: list[dict] | None = None,
        log_params: tuple[str, ...] = ("lr",),
    ) -> None:
        self.root = root
        self.storage = f"sqlite:///{root / 'sweeps.db'}"
        self.tracking = f"sqlite:///{root / 'mlflow.db'}"
        self.client = MlflowClient(self.tracking)
        exp = self.client.get_experiment_by_name("grpo")
        self.exp = exp.experiment_id if exp else self.client.create_experiment("grpo")
        self.name = name
        self.study = optuna.create_study(
            study_name=name, storage=self.storage, direction="maximize"
        )
        parent = self.client.create_run(
            self.exp, run_name=name, tags={Tag.ROLE: Role.STUDY, Tag.STUDY: name}
        )
        self.parent = parent.info.run_id
        attrs = {
            StudyAttr.OBJECTIVE: "eval/reward/mean",
            StudyAttr.DIRECTION: "maximize",
            StudyAttr.HEALTH_RULES: [RULE] if rules is None else rules,
            StudyAttr.KL_THRESHOLD: threshold,
            StudyAttr.SEARCH_SPACE: {"lr": "tag(log, interval(1e-5, 1e-3))", "group_size": "2,4,8"},
            StudyAttr.LOG_PARAMS: list(log_params),
            StudyAttr.FIXED_OVERRIDES: ["max_steps=4"],
            StudyAttr.MLFLOW_TRACKING_URI: self.tracking,
            StudyAttr.MLFLOW_EXPERIMENT: "grpo",
            StudyAttr.MLFLOW_PARENT_RUN_ID: self.parent,
        }
        for k, v in attrs.items():
            self.study.set_user_attr(k, v)
        self.space = dict(SPACE)  # a test may sweep lr as a grid

    def add(
        self,
        params: dict,
        state: TrialState | None,
        steps: int = 4,
        kl: float = 0.002,
        reward0: float = 0.3,
        gain: float = 0.05,
        fail: str = "",
        prune_at: int | None = None,
        mlflow: bool = True,
        reason: dict | None = None,
    ) -> optuna.Trial:
        """One trial: per-step metrics in MLflow, evals in Optuna, then its ending.

        state None leaves it running (the job writes steps_run etc. when it ends).
        """
        self.study.enqueue_trial(params)  # how the sweeper's grid pins a point
        trial = self.study.ask(fixed_distributions={k: self.space[k] for k in params})
        overrides = ["max_steps=4", *(f"{k}={v}" for k, v in params.items())]
        trial.set_user_attr(TrialAttr.OVERRIDES, overrides)
        run_id = self._run(trial, params) if mlflow else None
        last = steps if prune_at is None else prune_at
        metrics = []
        for s in range(0, last + 1):
            ev = reward0 + gain * s
            if s in (0, 2, last):
                metrics.append(Metric("eval/reward/mean", ev, 0, s))
                metrics.append(Metric(stderr_of(EVAL_REWARD), EVAL_STDERR, 0, s))
                trial.report(ev, s)
            if s > 0:
                k = kl * s if prune_at is None else kl * 10**s
                metrics += [Metric("reward/mean", ev - 0.05, 0, s), Metric(KL, k, 0, s)]
                metrics.append(Metric(KL_PRE_POST_V2, 3 * k, 0, s))
                metrics += [Metric(m, v, 0, s) for m, v in GROUPS.items()]
        if run_id:
            self.client.log_batch(run_id, metrics=metrics)
        if state is None:
            return trial
        final_kl = [m.value for m in metrics if m.key == KL][-1]
        trial.set_user_attr(TrialAttr.STEPS_RUN, last)
        trial.set_user_attr(TrialAttr.BASELINE, reward0)
        if state == TrialState.PRUNED:
            breach = {"rule": RULE["name"], "metric": KL, "value": final_kl, "bound": 0.01}
            breach.update(step=last, advice="lower lr or num_substeps")
            trial.set_user_attr(TrialAttr.PRUNE_REASON, reason or breach)
            self.study.tell(trial, state=state)
        elif state == TrialState.FAIL:
            trial.set_user_attr(TrialAttr.FAIL_REASON, fail)
            self.study.tell(trial, state=state)
        else:
            self.study.tell(trial, reward0 + gain * last)
        if run_id:
            status = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}[state.name]
            self.client.set_tag(run_id, Tag.STATE, state.name)
            self.client.set_terminated(run_id, status=status)
        return trial

    def _run(self, trial: optuna.Trial, params: dict) -> str:
        shown = " ".join(f"{k}={v}" for k, v in params.items())
        tags = {
            "mlflow.parentRunId": self.parent,
            Tag.ROLE: Role.TRIAL,
            Tag.STUDY: self.name,
            Tag.TRIAL_NUMBER: str(trial.number),
            Tag.SEED: "0",
        }
        run = self.client.create_run(self.exp, run_name=f"t{trial.number} {shown}", tags=tags)
        trial.set_user_attr(TrialAttr.MLFLOW_RUN_ID, run.info.run_id)
        return run.info.run_id


@pytest.fixture
def finished(tmp_path: Path) -> Sweep:
    """5 completed trials, 1 pruned on KL, 1 failed: enough for every figure."""
    sw = Sweep(tmp_path)
    for i, (lr, gs) in enumerate([(1e-5, 2), (3e-5, 4), (1e-4, 8), (2e-4, 4), (5e-4, 8)]):
        sw.add({"lr": lr, "group_size": gs}, TrialState.COMPLETE, gain=0.02 * (i + 1))
    sw.add({"lr": 1e-3, "group_size": 8}, TrialState.PRUNED, kl=0.0005, prune_at=3)
    sw.add({"lr": 1e-3, "group_size": 2}, TrialState.FAIL, fail="RuntimeError: CUDA out of memory")
    return sw


def test_load_matches_the_stores(finished: Sweep) -> None:
    data = load_study(finished.storage)
    assert data.name == "s1" and data.notes == []
    for t in finished.study.get_trials():
        row = data.trials[t.number]
        assert (
            row.state
            == {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}[t.state.name]
        )
        assert row.params == t.params
        assert row.steps_run == t.user_attrs[TrialAttr.STEPS_RUN]
        history = finished.client.get_metric_history(t.user_attrs[TrialAttr.MLFLOW_RUN_ID], KL)
        points = [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)]
        assert row.histories[KL] == points
        assert row.final_kl == pytest.approx(points[-1][1])  # the last KL the run logged
        if t.state == TrialState.COMPLETE:
            assert row.value == pytest.approx(t.value)
    assert data.trials[5].note == breach_text(data.trials[5].prune_reason)
    assert "kl_sample_train_v2=0.5 > 0.01 at step 3" in data.trials[5].note
    assert data.trials[6].note == "RuntimeError: CUDA out of memory"
    assert data.best().number == 4


def test_report_writes_figures_html_and_logs_to_mlflow(finished: Sweep, capsys) -> None:
    out = finished.root / "report"
    assert main(["report", "--storage", finished.storage, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    board = lines[lines.index(next(x for x in lines if x.startswith("trial"))) :]
    assert board[1].startswith("t4 ") and "0.7" in board[1]  # best first
    assert "kl_sample_train_v2=0.5 > 0.01 at step 3" in printed
    assert "RuntimeError: CUDA out of memory" in printed
    figures = ("verdict", "reward_curves", "kl_curves", "objective_vs_params", "importance")
    for name in (*figures, "reward_vs_kl"):
        png = out / f"{name}.png"
        assert png.stat().st_size > 5000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 6 and "http" not in page.replace('lang="en"', "")
    logged = {a.path for a in finished.client.list_artifacts(finished.parent, "analysis")}
    assert "analysis/index.html" in logged and "analysis/kl_curves.png" in logged


def test_advice_follows_the_rules_of_thumb(tmp_path: Path) -> None:
    sw = Sweep(tmp_path)
    sw.add({"lr": 1e-5, "group_size": 2}, TrialState.COMPLETE, reward0=0.85, gain=0.0)
    sw.add({"lr": 1e-3, "group_size": 8}, TrialState.COMPLETE, reward0=0.85, gain=0.02)
    for lr in (5e-4, 7e-4, 9e-4):
        sw.add({"lr": lr, "group_size": 4}, TrialState.PRUNED, reward0=0.85, kl=0.0005, prune_at=3)
    titles = [a.title for a in advise(load_study(sw.storage))]
    assert any(t.startswith("Lower lr or num_substeps") for t in titles)
    assert any(t.startswith("Make the task harder") for t in titles)
    assert "Extend the range of lr upward" in titles
    assert "Extend the range of group_size upward" in titles


def test_forecast_stops_are_not_called_unstable(tmp_path: Path) -> None:
    """Three of four trials stopped by the forecast: no "pruned as unstable", no "make the
    updates smaller"; the advice says they could not beat the best."""
    sw = Sweep(tmp_path)
    sw.add({"lr": 1e-3, "group_size": 8}, TrialState.COMPLETE)
    stop = Breach("forecast", "", 0.2, 0.5, 2, FORECAST, "", "prune", "eval/reward/mean ...")
    for lr in (5e-4, 7e-4, 9e-4):
        sw.add({"lr": lr, "group_size": 4}, TrialState.PRUNED, prune_at=2, reason=stop.as_dict())
    given = advise(load_study(sw.storage))
    assert not any("unstable" in a.why or "smaller" in a.title for a in given)
    (stopped,) = [a for a in given if "forecast" in a.title]
    assert stopped.title == "3 trial(s) stopped by forecast: could not beat the best"
    assert stopped.why.startswith("t1, t2, t3: ")


def test_only_failed_trials_gives_a_message(tmp_path: Path, capsys) -> None:
    sw = Sweep(tmp_path)
    for gs in (2, 4):
        sw.add({"group_size": gs}, TrialState.FAIL, fail="ValueError: batch_size % 3 != 0")
    assert main(["report", "--storage", sw.storage, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "No completed trial: all 2 trials failed" in out and "ValueError" in out
    assert "Skipped" in (tmp_path / "r" / "index.html").read_text()
    assert main(["best", "--storage", sw.storage]) == 1
    assert "all 2 trials failed" in capsys.readouterr().err


def test_running_study_partial_data(tmp_path: Path, capsys) -> None:
    sw = Sweep(tmp_path)
    sw.add({"lr": 1e-4, "group_size": 4}, TrialState.COMPLETE)
    sw.add({"lr": 2e-4, "group_size": 4}, None, steps=2)  # mid-run: no steps_run attr yet
    sw.add({"lr": 5e-4, "group_size": 2}, None, mlflow=False)  # killed before its MLflow run
    sw.study.enqueue_trial({"lr": 3e-4})  # queued, not started
    assert main(["report", "--storage", sw.storage, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    data = load_study(sw.storage)
    running = data.trials[1]
    assert running.state == "running" and running.steps_run == 2
    assert running.final_kl == pytest.approx(0.004) and running.baseline == pytest.approx(0.3)
    assert "1 complete, 2 running, 1 waiting" in out
    assert "No MLflow run found for t2" in " ".join(data.notes)
    assert (tmp_path / "r" / "kl_curves.png").stat().st_size > 5000


def test_missing_mlflow_degrades_to_optuna_only(finished: Sweep, capsys) -> None:
    (finished.root / "mlflow.db").unlink()  # the store is gone: said once, never re-created
    out = finished.root / "r"
    assert main(["report", "--storage", finished.storage, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "could not be read" in captured.err and "t4" in captured.out
    assert "could not log the report" in captured.err
    assert (out / "objective_vs_params.png").exists() and not (out / "reward_curves.png").exists()
    assert not (finished.root / "mlflow.db").exists()

    finished.study.set_user_attr("mlflow_tracking_uri", "http://127.0.0.1:9/")  # refused
    started = time.monotonic()
    assert main(["report", "--storage", finished.storage, "--out", str(out)]) == 0
    assert "could not be read" in capsys.readouterr().err
    assert time.monotonic() - started < 60  # not MLflow's minutes of retries


def test_errors_are_one_line(tmp_path: Path, capsys) -> None:
    assert main(["report", "--storage", f"sqlite:///{tmp_path}/nope.db"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nope.db").exists()
    sw = Sweep(tmp_path)
    assert main(["report", "--storage", sw.storage, "--study", "typo"]) == 1
    assert "no study 'typo'" in capsys.readouterr().err


def test_compare_side_by_side(tmp_path: Path, capsys) -> None:
    a = Sweep(tmp_path, "a")
    a.add({"lr": 1e-4, "group_size": 4}, TrialState.COMPLETE)
    b = Sweep(tmp_path, "b")
    b.add({"lr": 3e-4, "group_size": 8}, TrialState.COMPLETE, gain=0.1)
    assert main(["compare", "a", "b", "--storage", a.storage]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert rows["best"] == ["0.5", "(t0)", "0.7", "(t0)"]
    assert rows["lr"] == ["0.0001", "0.0003"] and rows["group_size"] == ["4", "8"]


def test_report_says_which_of_several_studies_it_picked(tmp_path: Path, capsys) -> None:
    for name in ("older", "newer"):
        Sweep(tmp_path, name).add({"lr": 1e-4}, TrialState.COMPLETE)
    storage = f"sqlite:///{tmp_path / 'sweeps.db'}"
    out = str(tmp_path / "r")
    assert main(["report", "--storage", storage, "--out", out, "--no-mlflow-log"]) == 0
    err = capsys.readouterr().err
    assert "note: 2 studies in " in err and "reporting the most recent, newer" in err
    assert (
        main(["report", "--storage", storage, "--study", "older", "--out", out, "--no-mlflow-log"])
        == 0
    )
    assert "studies in" not in capsys.readouterr().err  # named: nothing to say


def test_pareto_front() -> None:
    points = [(0.001, 0.5, 0), (0.002, 0.7, 1), (0.003, 0.6, 2), (0.0005, 0.2, 3)]
    assert pareto_front(points, maximize=True) == [3, 0, 1]


def _rule_lines(ax, vertical: bool = False) -> dict[str, tuple[float, str]]:
    """The threshold lines a KL panel drew: label -> (bound, linestyle)."""
    return {
        line.get_label(): (
            (line.get_xdata() if vertical else line.get_ydata())[0],
            line.get_linestyle(),
        )
        for line in ax.get_lines()
        if line.get_label().split(" ")[0] in {"post_update_kl", "sampler_kl", "kl"}
    }


def _default_rules(threshold: float) -> list[dict]:
    return [rule.as_dict() for rule in default_rules(threshold)]  # as the sweeper stores them


def _two_trials(sw: Sweep) -> Sweep:
    sw.add({"lr": 1e-4, "group_size": 4}, TrialState.COMPLETE)
    sw.add({"lr": 1e-3, "group_size": 8}, TrialState.PRUNED, kl=0.0005, prune_at=3)
    return sw


def test_kl_figure_draws_the_studys_own_rules(tmp_path: Path) -> None:
    sw = _two_trials(Sweep(tmp_path / "a", rules=_default_rules(0.01)))
    fig = kl_curves(load_study(sw.storage))
    post, sampler = fig.axes
    assert post.get_title().startswith("post_update_kl: kl_pre_post_v2\npost-update KL")
    assert sampler.get_title().startswith("sampler_kl: kl_sample_train_v2\nsampler-vs-learner KL")
    assert _rule_lines(post) == {
        "post_update_kl prunes above 0.2 for 3 steps in a row, while eval/reward/mean falls": (
            pytest.approx(0.2),
            "--",
        )
    }
    assert _rule_lines(sampler) == {
        "sampler_kl prunes above 0.01 for 2 steps in a row": (pytest.approx(0.01), "--")
    }
    assert post.get_yscale() == "log"
    vertical = _rule_lines(
        reward_vs_kl(load_study(sw.storage)).axes[0], vertical=True
    )  # x: the post-update KL
    assert [v for v, _ in vertical.values()] == [pytest.approx(0.2)]

    # kl_threshold=0.02 scales both bounds: the lines move with the rules the sweep stored.
    moved = _two_trials(Sweep(tmp_path / "b", threshold=0.02, rules=_default_rules(0.02)))
    post, sampler = kl_curves(load_study(moved.storage)).axes
    assert [v for v, _ in _rule_lines(post).values()] == [pytest.approx(0.4)]
    assert list(_rule_lines(sampler)) == ["sampler_kl prunes above 0.02 for 2 steps in a row"]


def test_kl_figure_warn_rule_dotted_and_rules_off_draw_nothing(tmp_path: Path) -> None:
    warn = {"name": "kl", "metric": KL_PRE_POST_V2, "bound": 0.05, "patience": 2, "action": "warn"}
    sw = _two_trials(Sweep(tmp_path / "w", rules=[warn]))
    (ax,) = kl_curves(load_study(sw.storage)).axes
    assert ax.get_title().startswith("kl: kl_pre_post_v2\npost-update KL")
    assert _rule_lines(ax) == {"kl warns above 0.05 for 2 steps in a row": (0.05, ":")}

    off = _two_trials(Sweep(tmp_path / "off", rules=[]))  # hydra.sweeper.health=[]
    (ax,) = kl_curves(load_study(off.storage)).axes
    assert ax.get_title().startswith("kl_pre_post_v2 (no health rule watches it)")
    assert _rule_lines(ax) == {} and not ax.get_legend_handles_labels()[1].count("pruned here")


def test_lr_is_on_a_log_axis(finished: Sweep, tmp_path: Path) -> None:
    panels = {ax.get_title(): ax for ax in objective_vs_params(load_study(finished.storage)).axes}
    assert panels["lr"].get_xscale() == "log" and panels["lr"].get_xlabel() == "lr (log scale)"
    assert panels["group_size"].get_xscale() == "linear"

    grid = Sweep(tmp_path / "grid", log_params=())  # lr=1e-4,1e-3: a grid, not declared log
    grid.space["lr"] = CategoricalDistribution([1e-4, 1e-3])
    for lr in (1e-4, 1e-3):
        grid.add({"lr": lr, "group_size": 4}, TrialState.COMPLETE)
    (ax,) = [a for a in objective_vs_params(load_study(grid.storage)).axes if a.get_title() == "lr"]
    assert ax.get_xscale() == "log"


def test_eval_curves_have_a_stderr_band(finished: Sweep) -> None:
    data = load_study(finished.storage)
    _, evals = reward_curves(data).axes
    bands = [c for c in evals.collections if c.get_gid() == STDERR_GID]
    assert len(bands) == 7  # every trial with evals (the failed one logged some too)
    best = data.trials[4]  # evals at steps 0, 2, 4: 0.3, 0.5, 0.7, each +-0.02
    ys = bands[4].get_paths()[0].vertices[:, 1]  # their 95% CI: +-1.96 stderr
    assert min(ys) == pytest.approx(0.3 - 1.96 * EVAL_STDERR, abs=1e-4)
    assert max(ys) == pytest.approx(0.7 + 0.0392, abs=1e-4)
    assert stderr_band(best, EVAL_REWARD) == ([0, 2, 4], pytest.approx([0.3, 0.5, 0.7]), [0.02] * 3)
    assert EVAL_CI_LABEL in [t.get_text().replace("\n", " ") for t in evals.get_legend().texts]


def test_stderr_of_a_mean_over_seeds() -> None:
    assert mean_stderr([0.03, 0.04]) == pytest.approx(0.025)  # sqrt(0.0009 + 0.0016) / 2
    assert mean_stderr([0.02]) == pytest.approx(0.02)


CHECK_IMAGES = """<script>
window.addEventListener("load", () => {
  const imgs = Array.from(document.images);
  const ok = imgs.filter((i) => i.complete && i.naturalWidth > 0).length;
  document.body.setAttribute("data-images", ok + "/" + imgs.length);
});
</script></body>"""


@needs_chromium
def test_html_images_load_in_headless_chromium(finished: Sweep) -> None:
    out = finished.root / "report"
    assert (
        main(["report", "--storage", finished.storage, "--out", str(out), "--no-mlflow-log"]) == 0
    )
    page = (out / "index.html").read_text()
    probe = out / "probe.html"  # next to the report, so relative links resolve the same
    probe.write_text(page.replace("</body>", CHECK_IMAGES))
    dom = rendered_dom(probe.as_uri(), finished.root / "chrome", 5000, 120)
    assert 'data-images="6/6"' in dom, dom[:500]


def test_best_renders_the_tuned_yaml_with_the_sweepers_renderer(
    finished: Sweep, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(finished.root)  # no tuned/ here: composed again from the overrides
    assert main(["best", "--storage", finished.storage]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# @package _global_\n# study: s1 (storage sqlite:///")
    assert "# best trial: t4, eval/reward/mean = 0.7 (maximize)" in text
    body = yaml.safe_load(text)
    assert (body["lr"], body["group_size"], body["max_steps"]) == (5e-4, 8, 4)

    exported = finished.root / "tuned" / "s1.yaml"  # what the sweeper wrote: printed as is
    exported.parent.mkdir()
    exported.write_text(text.replace("max_steps: 4", "max_steps: 4  # exported"))
    assert main(["best", "--storage", finished.storage, "--study", "s1"]) == 0
    assert "# exported" in capsys.readouterr().out


@pytest.mark.slow
def test_real_sweep_end_to_end(tmp_path: Path) -> None:
    """The default sweep (its seeds raced), then every analysis command on its study."""
    env = sweep_env(tmp_path)
    sweep = [
        sys.executable,
        "-m",
        "sweeper",
        "-m",
        "group_size=2,4",
        "max_steps=2",
        "batch_size=4",
        "eval_every=0",
        "task.eval_size=16",
    ]
    subprocess.run(sweep, cwd=tmp_path, env=env, check=True, capture_output=True, timeout=600)

    def analysis(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "analysis", *args]
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    run = analysis("report")
    assert run.returncode == 0, run.stderr
    study = optuna.load_study(
        study_name=optuna.get_all_study_names(f"sqlite:///{tmp_path / 'sweeps.db'}")[0],
        storage=f"sqlite:///{tmp_path / 'sweeps.db'}",
    )
    for t in study.trials:
        assert f"t{t.number}  " in run.stdout and f"{t.value:.4g}" in run.stdout
    out = tmp_path / "reports" / study.study_name
    for name in ("verdict", "reward_curves", "kl_curves", "objective_vs_params", "reward_vs_kl"):
        assert (out / f"{name}.png").stat().st_size > 5000
    best = subprocess.run(
        [sys.executable, "-m", "analysis", "best", "--study", study.study_name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tuned = (tmp_path / "tuned" / f"{study.study_name}.yaml").read_text()
    assert best.returncode == 0 and best.stdout == tuned
    (tmp_path / "tuned" / f"{study.study_name}.yaml").unlink()  # rebuilt: the same YAML
    again = subprocess.run(
        [sys.executable, "-m", "analysis", "best"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and again.stdout == tuned, again.stderr
    # the same finished sweep, its default rules replayed on its runs' whole MLflow histories
    rules = analysis("rules", "--eval-every", "2")
    assert rules.returncode == 0, rules.stderr
    assert f"study {study.study_name}, the study's rules:" in rules.stdout
    runs = sum(len(replicates(t)) for t in study.trials)  # raced by default: 2+ seeds each
    assert runs >= 4 and f"{runs} runs at eval_every=2:" in rules.stdout, rules.stdout
    assert "all together" in rules.stdout
