"""oneDNN's float32 linear layers (trainer/model/cpu_linear.py): what torch's own give, to
float32's rounding, with every gradient; small weights left on torch's path bit for bit."""

import pytest
import torch
import torch.nn.functional as F

from trainer.model import cpu_linear
from trainer.model.cpu_linear import OneDNNLinear, linear, use_onednn

pytestmark = pytest.mark.skipif(not cpu_linear.AVAILABLE, reason="this torch has no oneDNN")


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
    assert cpu_linear.takes_onednn(x, weight)
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


def test_switched_layers_keep_their_parameters_and_tied_weights():
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
