"""The project's import graph, read from the source with `ast`: no cycle, the packages in
their layers (records, what runs and sweeps record and the stores that keep it, at the bottom;
the judge (how a sweep decides, and the statistics the trainer's eval reports) on it, the
trainer above, analysis above it, the sweeper on top, Hydra's plugin over all), the trainer's
sub-packages in theirs (TRAINER_LAYERS, bottom first), the algorithm (trainer/rl/) reading of
trainer/model only the policy's contract (POLICY_CONTRACT), and the sweeper's stages in theirs
(SWEEPER_STAGES).

Every import counts, including those inside functions and under `if TYPE_CHECKING:`: a lazy
import hides a cycle from the interpreter, not from a reader who has to follow it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The packages bottom first: each may import its own modules and those of the packages before
# it here, never one after (hydra_plugins is the plugin Hydra finds, which hands over to the
# sweeper).
PACKAGES = ("records", "judge", "trainer", "analysis", "sweeper", "hydra_plugins")
FORBIDDEN = {package: set(PACKAGES[i + 1 :]) for i, package in enumerate(PACKAGES)}
# Hydra imports the sweeper's settings schema whenever it scans its plugins: it stays light.
SETTINGS_SCHEMA = "sweeper.plan.settings_schema"

# The sweeper's stages, bottom first (sweeper/__init__.py): a stage's module may import its
# own stage and those before it here, never one after. The modules beside the stages
# (SweepError in the package, optuna_adapter) are below every stage; __main__ is on top.
SWEEPER_STAGES = ["results", "plan", "study", "sweep"]
SWEEPER_BESIDE = frozenset({"sweeper", "sweeper.optuna_adapter"})

# The trainer's sub-packages, bottom first: a module of one may import its own sub-package and
# those before it here, never one after it (trainer/__init__.py says what each holds).
TRAINER_LAYERS = ["base", "model", "env", "sampling", "rl", "run", "packed", "backends"]
# The trainer's modules outside the layers: the package (it registers the schemas) and the
# command line, both on top.
TRAINER_TOP = {"trainer", "trainer.__main__"}
# What trainer/rl/ may import of trainer/model: the policy and what its passes compute, the
# tensors they take and the rollouts those are made of; never the speed machinery behind them
# (trainer/model/__init__.py says which module is which).
POLICY_CONTRACT = {"trainer.model.policy", "trainer.model.token_batch", "trainer.model.rollout"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {
        _module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The project modules one import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, base] if base else package)
        # `from pkg import name` imports the submodule pkg.name where there is one.
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
            for alias in node.names
        ]
    else:
        return []
    found = []
    for name in names:
        # `import a.b.c` where only a.b is a module of ours: the nearest one that is.
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            found.append(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each project module and the project modules it imports anywhere in its source."""
    sources = _sources()
    known = set(sources)
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        edges = {
            target
            for node in ast.walk(tree)
            for target in _imported(node, module, is_package, known)
        }
        edges.discard(module)
        graph[module] = edges
    return graph


def tied_groups(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other, directly or around a loop (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each tied group as its modules and a shortest loop through each of them."""
    found = []
    for group in tied_groups(graph):
        loops = {_as_chain(_cycle_through(graph, group, start)) for start in sorted(group)}
        found.append(f"{len(group)} modules tied: {', '.join(sorted(group))}")
        found += [f"  {loop}" for loop in sorted(loops)]
    return found


def _as_chain(loop: list[str]) -> str:
    """`a -> b -> a`, started at its first module by name so that a loop is written once."""
    ring = loop[:-1]
    first = ring.index(min(ring))
    ring = ring[first:] + ring[:first]
    return " -> ".join([*ring, ring[0]])


def _cycle_through(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """A shortest loop from `start` back to it inside the group (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(came_from[chain[-1]])
                    return [start, *reversed(chain[:-1]), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a group of two or more always has one


def test_the_graph_sees_lazy_and_type_checking_imports():
    graph = import_graph()
    # validation.py imports trainer.env.tasks inside a function, torch_sampler.py
    # trainer.model.policy under TYPE_CHECKING: the test must see both.
    assert "trainer.env.tasks" in graph["trainer.run.validation"]
    assert "trainer.model.policy" in graph["trainer.sampling.torch_sampler"]
    assert len(graph) > 60, "the project's modules were not all read"


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(found)


def test_packages_import_only_their_layer_and_below():
    wrong = []
    for module, targets in sorted(import_graph().items()):
        package = module.split(".")[0]
        for target in sorted(targets):
            if target.split(".")[0] in FORBIDDEN[package]:
                wrong.append(f"{module} imports {target} (a layer above it)")
            elif target.endswith(".__main__"):
                wrong.append(f"{module} imports {target} (a command line, not a library)")
    assert not wrong, "\n".join(wrong)


def layer_violations(
    graph: dict[str, set[str]],
    package: str,
    layers: list[str],
    top: set[str],
    below: frozenset[str] = frozenset(),
) -> list[str]:
    """Each import of a `package` module that reaches a layer above its own: `layers` its
    sub-packages bottom first, `top` modules above every layer, `below` modules under all."""
    rank = {layer: i for i, layer in enumerate(layers)}

    def layer_of(module: str) -> str:
        return module.partition(".")[2].split(".")[0]

    wrong = []
    for module, targets in sorted(graph.items()):
        if module.split(".")[0] != package or module in top:
            continue
        layer = "below the layers" if module in below else layer_of(module)
        own = -1 if module in below else rank.get(layer)
        if own is None:
            wrong.append(f"{module} is in no layer ({', '.join(layers)})")
            continue
        for target in sorted(targets):
            if target.split(".")[0] != package or target in below:
                continue
            if target in top:
                wrong.append(f"{module} imports {target} (the top, above every layer)")
            elif rank.get(layer_of(target), len(rank)) > own:
                wrong.append(f"{module} ({layer}) imports {target} (a layer above it)")
    return wrong


def trainer_layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return layer_violations(graph, "trainer", TRAINER_LAYERS, TRAINER_TOP)


def sweeper_stage_violations(graph: dict[str, set[str]]) -> list[str]:
    return layer_violations(graph, "sweeper", SWEEPER_STAGES, {"sweeper.__main__"}, SWEEPER_BESIDE)


def test_trainer_layers_import_only_their_own_and_below():
    wrong = trainer_layer_violations(import_graph())
    assert not wrong, "\n".join(wrong)


def test_the_trainer_layer_check_catches_an_upward_import():
    graph = {
        "trainer.model.policy": {"trainer.base.errors", "trainer.model.packing"},
        "trainer.sampling.protocol": {"trainer.env.prompts", "trainer.rl.step"},
        "trainer.rl.step": {"trainer"},
        "trainer.stray": set(),
    }
    assert trainer_layer_violations(graph) == [
        "trainer.rl.step imports trainer (the top, above every layer)",
        "trainer.sampling.protocol (sampling) imports trainer.rl.step (a layer above it)",
        "trainer.stray is in no layer (base, model, env, sampling, rl, run, packed, backends)",
    ]


@pytest.mark.parametrize(
    "package, layers", [("trainer", TRAINER_LAYERS), ("sweeper", SWEEPER_STAGES)]
)
def test_every_sub_package_is_a_layer(package, layers):
    found = {path.parent.name for path in (ROOT / package).glob("*/__init__.py")}
    assert found == set(layers)


def test_the_algorithm_imports_only_the_policys_contract():
    machinery = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if module.startswith("trainer.rl")
        for target in targets
        if target.startswith("trainer.model") and target not in POLICY_CONTRACT
    )
    assert not machinery, "\n".join(machinery)


def test_the_judge_reads_records_only():
    """The judge decides on plain numbers and recorded trials: no trainer, no torch path."""
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if module.split(".")[0] == "judge"
        for target in targets
        if target.split(".")[0] not in ("judge", "records")
    )
    assert not wrong, "\n".join(wrong)


def test_the_settings_schema_hydra_scans_imports_only_names():
    inside = {t for t in import_graph()[SETTINGS_SCHEMA] if t.split(".")[0] in PACKAGES}
    assert inside <= {"records.metrics", "records.defaults"}, inside


def test_the_package_order_forbids_every_import_upward():
    assert FORBIDDEN["records"] == {"trainer", "judge", "analysis", "sweeper", "hydra_plugins"}
    assert FORBIDDEN["judge"] == {"trainer", "analysis", "sweeper", "hydra_plugins"}
    assert FORBIDDEN["trainer"] == {"analysis", "sweeper", "hydra_plugins"}
    assert FORBIDDEN["analysis"] == {"sweeper", "hydra_plugins"}
    assert FORBIDDEN["hydra_plugins"] == set()


def test_sweeper_stages_import_only_their_own_and_below():
    wrong = sweeper_stage_violations(import_graph())
    assert not wrong, "\n".join(wrong)


def test_the_sweeper_stage_check_catches_an_import_up_the_chain():
    graph = {
        "sweeper.plan.settings": {"sweeper.study.heartbeat", "sweeper.results.runs"},
        "sweeper.results.display": {"sweeper.optuna_adapter", "sweeper"},
        "sweeper.optuna_adapter": {"sweeper.plan.space"},
        "sweeper.stray": set(),
    }
    assert sweeper_stage_violations(graph) == [
        "sweeper.optuna_adapter (below the layers) imports sweeper.plan.space (a layer above it)",
        "sweeper.plan.settings (plan) imports sweeper.study.heartbeat (a layer above it)",
        "sweeper.stray is in no layer (results, plan, study, sweep)",
    ]
