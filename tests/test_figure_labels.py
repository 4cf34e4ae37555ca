"""The report's figures name settings, not trial ids, in the order their axis claims, with
axes that fit the data and metric names a researcher reads (the logged name beside it once).
Figures built from a hand-made study in real stores (tests/test_analysis.py's Sweep)."""

from pathlib import Path

from optuna.trial import TrialState
from test_analysis import KL, Sweep

from analysis.kl_plots import kl_curves, reward_vs_kl
from analysis.load import load_study
from analysis.plots import config_intervals, objective_vs_params, reward_curves

# (params, gain per step): final means 0.3 + 4 x gain, best first: t2, t1, t3, t0
GRID = [
    ({"lr": 1e-4, "group_size": 2}, 0.01),
    ({"lr": 1e-4, "group_size": 8}, 0.05),
    ({"lr": 1e-3, "group_size": 2}, 0.07),
    ({"lr": 1e-3, "group_size": 8}, 0.03),
]


def _study(root: Path, kl: float = 0.002) -> Sweep:
    sweep = Sweep(root)
    for params, gain in GRID:
        sweep.add(params, TrialState.COMPLETE, gain=gain, kl=kl)
    return sweep


def test_the_verdict_figure_names_settings_best_mean_first(tmp_path: Path):
    fig = config_intervals(load_study(_study(tmp_path).storage))
    (ax,) = fig.axes
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == [
        "lr=0.001\ngroup_size=2",
        "lr=0.0001\ngroup_size=8",
        "lr=0.001\ngroup_size=8",
        "lr=0.0001\ngroup_size=2",
    ]
    means = [line.get_ydata()[0] for line in ax.get_lines() if len(line.get_ydata()) == 1]
    assert means == sorted(means, reverse=True)  # "best mean first", as the axis says
    assert ax.get_xlabel() == "configuration (best mean first)"
    title = ax.get_title().replace("\n", " ")
    assert title.startswith("held-out reward (eval/reward/mean): mean and 95% CI")
    assert ax.get_ylabel() == "held-out reward"


def test_curve_legends_and_labels_name_settings(tmp_path: Path):
    data = load_study(_study(tmp_path).storage)
    train, held_out = reward_curves(data).axes
    entries = held_out.get_legend().get_texts()
    names = [t.get_text().replace("\n", " ") for t in entries]
    assert "best: lr=0.001, group_size=2" in names
    assert "lr=0.0001, group_size=2" in names
    assert not any(n.startswith("t") and n[1:2].isdigit() for n in names)
    assert held_out.get_title() == "held-out reward (eval/reward/mean), step 0 = baseline"
    assert train.get_ylabel() == "training reward (per rollout)"
    panels = objective_vs_params(data)
    labels = panels.legends[0].get_texts()
    assert "best: lr=0.001, group_size=2" in [t.get_text() for t in labels]
    points = reward_vs_kl(data).axes[0]
    assert sorted(a.get_text() for a in points.texts) == sorted(
        f"lr={p['lr']:.4g}, group_size={p['group_size']}" for p, _ in GRID
    )


def test_a_kl_panel_fits_its_curves_not_a_bound_decades_away(tmp_path: Path):
    data = load_study(_study(tmp_path, kl=1e-13).storage)  # sampler KL of one update a batch
    (ax,) = kl_curves(data).axes
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "log"
    assert low >= 1e-14 and high <= 1e-11  # the curves span 1e-13 to 4e-13
    labels = [t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()]
    assert "sampler_kl prunes above 0.01 for 1 step (above this panel)" in labels
    assert ax.get_ylabel() == "sampler-vs-learner KL (nats per token)"

    near = load_study(_study(tmp_path / "near", kl=0.002).storage)  # 0.002-0.008 beside 0.01
    (ax,) = kl_curves(near).axes
    assert ax.get_ylim()[1] >= 0.01  # a bound near the curves stays on the axis
    assert KL in ax.get_title()
