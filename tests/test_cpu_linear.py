"""oneDNN's float32 linear layers (trainer/model/cpu_linear.py): what torch's own give, to
float32's rounding, with every gradient; small weights left on torch's path bit for bit; the
auto setting's check (trainer/model/onednn_check.py), its cache and its fallback."""

import json
import logging

import pytest
import torch
import torch.nn.functional as F

from records import metrics
from trainer.backends.run_params import run_params
from trainer.model import cpu_linear, onednn_check
from trainer.model.cpu_linear import OneDNNLinear, decide, linear, use_onednn
from trainer.run.train import train
from trainer.sampling.model_source import onednn_param

pytestmark = pytest.mark.skipif(not cpu_linear.AVAILABLE, reason="this torch has no oneDNN")


@pytest.fixture(autouse=True)
def fresh_decision(tmp_path, monkeypatch):
    """Each test decides anew, with its own cache directory; oneDNN on unless it decides."""
    monkeypatch.setattr(onednn_check, "CACHE_DIR", tmp_path / "onednn")
    monkeypatch.setattr(cpu_linear, "decided", {})
    monkeypatch.setattr(cpu_linear, "ENABLED", True)
    monkeypatch.delenv(cpu_linear.VARIABLE, raising=False)


def small_llm() -> torch.nn.Module:
    """Two of SmolLM2's shapes, shrunk in width: every weight over the size bound."""
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256, bias=False))


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("layout", ["3-D", "strided"])
def test_a_large_linear_and_its_gradients_match_torchs(layout):
    torch.manual_seed(0)
    weight = (torch.randn(384, 256) * 0.05).requires_grad_()
    bias = torch.randn(384).requires_grad_()
    x = torch.randn(3, 7, 256)
    if layout == "strided":  # a slice, as a model hands its hidden states over
        x = torch.randn(3, 7, 512)[..., ::2]
    x.requires_grad_()
    assert cpu_linear.takes_onednn(x, weight)  # ENABLED: as forced or decided
    upstream = torch.randn(3, 7, 384)
    ours = linear(x, weight, bias)
    grads = torch.autograd.grad((ours * upstream).sum(), [x, weight, bias])
    theirs = F.linear(x, weight, bias)
    expected = torch.autograd.grad((theirs * upstream).sum(), [x, weight, bias])
    assert close(ours, theirs)
    for got, want in zip(grads, expected, strict=True):
        assert close(got, want)
    with torch.no_grad():  # the plain op, no graph
        assert close(linear(x, weight.T.contiguous().T), theirs - bias)


def test_small_weights_and_other_dtypes_stay_on_torchs_path_bit_for_bit():
    torch.manual_seed(0)
    x, small = torch.randn(5, 128), torch.randn(256, 128)  # the tiny model's widest layer
    assert not cpu_linear.takes_onednn(x, small)
    assert torch.equal(linear(x, small), F.linear(x, small))
    big = torch.randn(512, 128, dtype=torch.float64)
    assert not cpu_linear.takes_onednn(x.double(), big)
    assert torch.equal(linear(x.double(), big), F.linear(x.double(), big))


def test_switched_layers_keep_their_parameters_and_tied_weights(monkeypatch):
    monkeypatch.setenv(cpu_linear.VARIABLE, "1")  # the switch itself, whatever a timing decides
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(1024, 128)
    head = torch.nn.Linear(128, 1024, bias=False)
    head.weight = embedding.weight  # tied, as SmolLM2's output layer is
    model = torch.nn.Sequential(embedding, head)
    keys = list(model.state_dict())
    expected = model(torch.tensor([[1, 2, 3]]))
    use_onednn(model)
    assert type(head) is OneDNNLinear and head.weight is embedding.weight
    assert list(model.state_dict()) == keys
    assert close(model(torch.tensor([[1, 2, 3]])), expected)


def outputs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.randn(4, 256, generator=torch.Generator().manual_seed(1)))


def test_a_failing_op_falls_back_to_torchs_path_with_one_line(monkeypatch, caplog):
    """An op that rejects an input (an older torch) cannot be produced here: it is made to."""

    def rejects(*_):
        raise RuntimeError("mkldnn: unsupported input")

    monkeypatch.setattr(cpu_linear, "onednn_linear", rejects)
    model = small_llm()
    expected = outputs(model)
    with caplog.at_level(logging.INFO, logger=cpu_linear.__name__):
        use_onednn(model)
        use_onednn(model)  # a second model of the same shapes: decided, no second line
    assert cpu_linear.ENABLED is False
    assert [type(m) for m in model] == [torch.nn.Linear, torch.nn.Linear]
    assert torch.equal(outputs(model), expected)
    assert [r.getMessage() for r in caplog.records] == [
        "oneDNN off, torch's linear layers instead: the check failed: RuntimeError: mkldnn: "
        "unsupported input"
    ]


def test_a_slower_onednn_falls_back_with_the_timings_in_the_line(monkeypatch, caplog):
    monkeypatch.setattr(onednn_check, "FASTER", 0.0)  # no time is fast enough
    with caplog.at_level(logging.WARNING, logger=cpu_linear.__name__):
        use, why = decide(small_llm())
    assert not use and "ms against torch's" in why
    assert len(caplog.records) == 1 and why in caplog.records[0].getMessage()


def test_the_decision_is_cached_per_host_torch_and_shapes(monkeypatch):
    use, why = decide(small_llm())
    assert use is cpu_linear.ENABLED
    files = list(onednn_check.CACHE_DIR.iterdir())  # one file, no temporary left behind
    assert len(files) == 1 and files[0].suffix == ".json"
    stored = json.loads(files[0].read_text())
    assert stored["use"] is use and stored["why"] == why
    assert stored["shapes"] == [[256, 512], [512, 256]] and stored["torch"] == torch.__version__
    assert stored["cpu"] == onednn_check.cpu_identity()

    def never(*_):
        raise AssertionError("timed again")

    monkeypatch.setattr(onednn_check, "check", never)
    monkeypatch.setattr(cpu_linear, "decided", {})  # another process on this host
    assert decide(small_llm()) == (use, f"{why} (cached in {files[0]})")
    other = torch.nn.Sequential(torch.nn.Linear(256, 1024))  # another shape set: checked anew
    assert decide(other) == (False, "the check failed: AssertionError: timed again")


@pytest.mark.parametrize("setting", ["0", "1"])
def test_0_and_1_force_without_a_check(setting, monkeypatch):
    monkeypatch.setenv(cpu_linear.VARIABLE, setting)
    monkeypatch.setattr(onednn_check, "check", None)  # called, it would raise
    model = small_llm()
    use_onednn(model)
    assert cpu_linear.ENABLED is (setting == "1")
    expected = OneDNNLinear if setting == "1" else torch.nn.Linear
    assert [type(m) for m in model] == [expected, expected]
    assert not list(onednn_check.CACHE_DIR.parent.glob("onednn/*"))


def test_a_bad_setting_is_one_line_naming_it(monkeypatch):
    monkeypatch.setenv(cpu_linear.VARIABLE, "yes")
    with pytest.raises(ValueError, match="GRPO_SWEEPER_ONEDNN='yes': must be one of auto, 1, 0"):
        decide(small_llm())


def test_the_tiny_model_trains_bit_for_bit_alike_with_onednn_forced_on_or_off(
    composed, new_recorder, monkeypatch
):
    """Its weights are all under the size bound: no setting changes a single value (but the
    clocks')."""
    clocks = {name.partition("/")[0] for name in (metrics.TIME_SAMPLE, metrics.ROLLOUTS_PER_S)}
    runs = []
    for setting in ("1", "0"):
        monkeypatch.setenv(cpu_linear.VARIABLE, setting)
        recorder = new_recorder()
        train(composed("max_steps=3", "task.eval_size=16"), recorder)
        assert recorder.decided == {metrics.ONEDNN_PARAM: "off"}  # handed in as it loaded
        runs.append(
            {s: {k: v for k, v in m.items() if k.partition("/")[0] not in clocks}
             for s, m in recorder.steps.items()}
        )  # fmt: skip
    assert runs[0] == runs[1] and len(runs[0]) == 4


@pytest.mark.real_model
@pytest.mark.parametrize(("setting", "expected"), [("1", "on"), ("0", "off")])
def test_the_decision_is_a_run_param_read_from_the_models_shapes(
    setting, expected, smollm2, composed, monkeypatch
):
    monkeypatch.setenv(cpu_linear.VARIABLE, setting)
    enabled = cpu_linear.ENABLED
    assert onednn_param(composed(f"model.path={smollm2}")) == expected
    assert enabled == cpu_linear.ENABLED  # reading the choice flips nothing; the policy does
    assert onednn_param(composed()) == "off"  # the tiny model: nothing that large
    # Known before a model loads: TRL's trainer never uses it; ours hands it in once loaded.
    assert (
        run_params(composed(f"model.path={smollm2}", "backend=trl"))[metrics.ONEDNN_PARAM] == "off"
    )
    assert metrics.ONEDNN_PARAM not in run_params(composed(f"model.path={smollm2}"))
