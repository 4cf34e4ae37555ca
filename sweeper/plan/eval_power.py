"""What a sweep cannot learn, said before its first trial and at its first baseline eval.

An eval of n problems tells two configurations apart only when their means differ by at
least judge.stats.detectable_difference (its noise alone, at the verdict's 95%): a 4-problem
eval needs 0.69 of a 0-1 reward, so every configuration of such a sweep comes out tied, and
"more seeds" cannot help, as every seed scores the same few problems. Before the first trial
the reward's spread is not known: the widest a reward in [0, 1] can have stands in for it.
Completions that all hit max_tokens at the baseline are known only once the first trial's
baseline eval ran: that one is said then, once a sweep (sweeper/sweep/job.py). Both facts are
defined below this stage (judge/stats.py, records/metrics.py), so the verdict's next step
names them in the same numbers once the sweep ends (analysis/next_step.py).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping

from omegaconf import DictConfig

from judge.stats import LOOKED_FOR, WIDEST_SD, detectable_difference, problems_short
from records.metrics import EVAL_TRUNCATED, all_cut
from sweeper.plan.preflight import compose, trial_config
from sweeper.plan.space import SearchSpace

log = logging.getLogger(__name__)


def warn_eval_size(
    config_loader, master_config: DictConfig, space: SearchSpace, objective: str, wanted
) -> None:
    """Log a line for each task config of the sweep whose eval is too small (see module)."""
    if not objective.startswith("eval/"):
        return
    for task_cfg in _task_configs(config_loader, master_config, space):
        from trainer.env.tasks import make_task  # loaded by the checks before this one

        problems = len(make_task(task_cfg).eval_problems())
        if line := eval_size_warning(task_cfg, problems, objective, wanted or LOOKED_FOR):
            log.warning(line)


def eval_size_warning(task_cfg, problems: int, objective: str, looked_for: float) -> str | None:
    need = problems_short(problems, looked_for)
    if need is None:
        return None
    smallest = detectable_difference(WIDEST_SD, problems)
    # Short enough for one terminal line: (docs/sweeping.md, "What a sweep cannot learn") says why.
    return (
        f"Eval too small: {problems} problems tell apart only gaps of {smallest:.2f}+ "
        f"({_more_problems(task_cfg, problems, need, looked_for)})"
    )


def _more_problems(task_cfg, problems: int, need: int, looked_for: float) -> str:
    """What would tell gaps of looked_for apart: the setting, or more data."""
    if "eval_size" in task_cfg:
        return f"task.eval_size={need} tells {looked_for:g}"
    fraction = task_cfg.get("eval_fraction")
    if fraction and task_cfg.get("eval_split") is None:
        rows = round(problems / fraction)
        if need < rows:
            return f"task.eval_fraction={need / rows:.2g}, about {need} of {rows} rows, tells {looked_for:g}"
        return f"{looked_for:g} takes {need} held-out rows; the file holds about {rows}"
    return f"a larger eval set tells {looked_for:g}"


def _task_configs(config_loader, master_config: DictConfig, space: SearchSpace):
    """The distinct task configs the sweep reaches: every combination of its swept task keys
    (the `task` group, `task.*`) at the ends of their ranges, the other keys at their first."""
    names = list(space.params)
    ends = [
        space.params[n].endpoints if n.split(".")[0] == "task" else space.params[n].endpoints[:1]
        for n in names
    ]
    seen: dict[str, DictConfig] = {}
    for combo in itertools.product(*ends):
        overrides = space.overrides(dict(zip(names, combo, strict=True)))
        task_cfg = trial_config(compose(config_loader, master_config, overrides, True)).task
        seen.setdefault(repr(task_cfg), task_cfg)
    return list(seen.values())


def truncation_warning(baseline: Mapping[str, float], max_tokens: int) -> str | None:
    """The line for a baseline eval whose completions all hit max_tokens, else None."""
    if not all_cut(baseline.get(EVAL_TRUNCATED)):
        return None
    return (
        f"every completion of the baseline eval hit max_tokens={max_tokens} before it ended: "
        "the rewards score cut-off answers, so the sweep can learn little about its settings: "
        "raise max_tokens"
    )
