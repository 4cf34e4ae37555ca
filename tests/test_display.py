"""What the sweep's terminal shows of a trial's parameters."""

from sweeper.results.display import short


def test_a_searched_float_shows_four_significant_digits():
    params = {"lr": 0.0023456789012345678, "group_size": 4, "model.device": "cuda:1"}
    assert short(params) == "lr=0.002346 group_size=4 model.device=cuda:1"
    assert short({"lr": 1e-3, "temperature": 0.7, "x": None}) == "lr=0.001 temperature=0.7 x=null"
