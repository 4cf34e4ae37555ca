"""Every report figure fits its canvas and says what it shows, at 1, 2 and 4 swept
parameters with long names: drawn from real stores (the Sweep builder of test_analysis),
laid out, and every visible text's extent compared with the figure's."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.legend import Legend
from matplotlib.text import Text
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState
from test_analysis import EVAL_STDERR, Sweep, _default_rules

from analysis import plot_style as ps
from analysis.load import StudyData, load_study
from analysis.plot_style import STDERR_GID
from analysis.plots import FIGURES
from records.sweep import Replicate, State, TrialAttr, replicate_key

LONG = {  # long names, as a nested config's keys are
    "loss.clip_ratio_upper_bound_for_importance_sampling": FloatDistribution(0.1, 0.5),
    "sampler.temperature_of_the_training_rollouts": FloatDistribution(0.5, 1.5),
    "group_size": IntDistribution(2, 8),
}


@pytest.fixture(scope="module")
def studies(tmp_path_factory) -> dict[int, StudyData]:
    """By number of swept parameters (1, 2, 4): a study in one shared pair of stores."""
    root = tmp_path_factory.mktemp("figures")
    return {swept: study_with(root, swept) for swept in (1, 2, 4)}


def study_with(root: Path, swept: int) -> StudyData:
    """7 trials (5 completed, 1 pruned, 1 failed) sweeping lr and swept - 1 long names."""
    names = ["lr", *list(LONG)[: swept - 1]]
    name = f"grpo-{swept}-swept-and-a-study-name-as-long-as-they-get"
    sw = Sweep(root, name=name, rules=_default_rules(0.01))
    sw.space.update(LONG)
    points = [(1e-5, 0.1, 0.5, 2), (3e-5, 0.2, 0.7, 4), (1e-4, 0.3, 0.9, 8), (2e-4, 0.4, 1.1, 4)]
    points += [(5e-4, 0.5, 1.3, 8), (1e-3, 0.2, 1.5, 8), (1e-3, 0.3, 0.6, 2)]
    for i, point in enumerate(points):
        params = dict(zip(names, point, strict=False))
        if i == 5:
            sw.add(params, TrialState.PRUNED, kl=0.0005, prune_at=3)
        elif i == 6:
            sw.add(params, TrialState.FAIL, fail="RuntimeError: CUDA out of memory")
        else:  # as the job records a seed: its value and its eval's stderr
            gain = 0.02 * (i + 1)
            trial = sw.add(params, None, gain=gain)
            value = 0.3 + 4 * gain
            seed = Replicate(0, State.COMPLETE, value, EVAL_STDERR, 4, 0.3, "", None)
            trial.set_user_attr(replicate_key(0), seed.as_attr())
            trial.set_user_attr(TrialAttr.STEPS_RUN, 4)
            trial.set_user_attr(TrialAttr.BASELINE, 0.3)
            sw.study.tell(trial, value)
    return load_study(sw.storage, name)


def outside(fig) -> list[str]:
    """Each visible text that reaches past the canvas, with how far. Tick labels count as
    their axis draws them (ticks outside the view limits are not drawn)."""
    fig.canvas.draw()
    renderer, canvas = fig.canvas.get_renderer(), fig.bbox
    axes = [ax for ax in fig.axes if ax.get_visible()]
    ticks = {
        id(label)
        for ax in fig.axes
        for axis in (ax.xaxis, ax.yaxis)
        for tick in axis.get_major_ticks() + axis.get_minor_ticks()
        for label in (tick.label1, tick.label2)
    }
    boxes = [
        (f"{axis.axis_name} axis of {ax.get_title()!r}", axis.get_tightbbox(renderer))
        for ax in axes
        for axis in (ax.xaxis, ax.yaxis)
    ]
    for text in fig.findobj(Text):
        shown = text.get_visible() and text.get_text().strip() and id(text) not in ticks
        if shown and (text.axes is None or text.axes.get_visible()):
            boxes.append((repr(text.get_text()), text.get_window_extent(renderer)))
    found = []
    for name, box in boxes:
        if box is None:
            continue
        over = max(canvas.x0 - box.x0, box.x1 - canvas.x1, canvas.y0 - box.y0, box.y1 - canvas.y1)
        if over > 1:  # pixels
            found.append(f"{name} by {over:.0f} px")
    return found


def legends_over_data(fig) -> list[str]:
    """Legends (an axes' or the figure's) drawn over any axes' data area."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for legend in fig.findobj(Legend):
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            if ax.get_visible() and box.overlaps(ax.get_window_extent(renderer)):
                found.append(f"a legend over {ax.get_title()!r}")
    return found


@pytest.mark.parametrize("swept", [1, 2, 4])
def test_every_figure_fits_its_canvas(studies, swept):
    data = studies[swept]
    drawn = 0
    for name, (_, draw) in FIGURES.items():
        fig = draw(data)
        if isinstance(fig, str):  # skipped, with its reason
            assert name == "importance" and swept == 1, fig
            continue
        drawn += 1
        assert not outside(fig), (name, outside(fig))
        assert not legends_over_data(fig), (name, legends_over_data(fig))
        plt.close(fig)
    assert drawn >= 5


def test_error_bars_are_95_percent_intervals_and_say_so(studies):
    data = studies[2]
    verdict = FIGURES["verdict"][1](data)
    params = FIGURES["objective_vs_params"][1](data)
    curves = FIGURES["reward_curves"][1](data)
    for fig in (verdict, params, curves):
        texts = [t.get_text() for t in fig.findobj(Text)]
        assert any("95%" in t for t in texts), texts
    (legend,) = params.legends  # one for every panel
    assert "95% CI (as in the verdict)" in [t.get_text() for t in legend.texts]
    band = [c for c in curves.axes[1].collections if c.get_gid() == STDERR_GID][0]
    ys = band.get_paths()[0].vertices[:, 1]  # t0: evals 0.3, 0.34, 0.38, each +-1.96 * 0.02
    assert min(ys) == pytest.approx(0.3 - 0.0392, abs=1e-4)
    assert max(ys) == pytest.approx(0.38 + 0.0392, abs=1e-4)


def test_every_point_is_named_on_the_reward_vs_kl_chart(studies):
    data = studies[2]
    fig = FIGURES["reward_vs_kl"][1](data)
    names = {t.get_text() for t in fig.axes[0].texts}
    assert names == {ps.name(t) for t in data.trials if t.final_kl is not None}  # settings
