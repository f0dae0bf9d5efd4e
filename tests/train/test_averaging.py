"""The weight average (train.ema_decay): bias-corrected, swapped in and out exactly, resumable."""

import pytest
import torch
from torch import nn

from recsys.train.averaging import WeightAverage


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(7, 5), nn.Linear(5, 3))
    return model


def _walk(
    model: nn.Module, average: WeightAverage, steps: int, seed: int = 1, first: int = 0
) -> list[list[torch.Tensor]]:
    """Move the weights randomly at steps ``first, first + 1, ...``, folding each into ``average``; the iterates."""
    gen = torch.Generator().manual_seed(seed)
    iterates = []
    for step in range(first, first + steps):
        average.prepare(step)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen))
        average.update()
        iterates.append([p.detach().clone() for p in model.parameters()])
    return iterates


@pytest.mark.parametrize("decay, steps", [(0.5, 1), (0.9, 7), (0.999, 50)])
def test_the_average_is_the_bias_corrected_weighted_mean_of_the_iterates(decay, steps):
    model = _model()
    average = WeightAverage(model, decay)
    iterates = _walk(model, average, steps)
    weights = torch.tensor([decay ** (steps - 1 - i) for i in range(steps)], dtype=torch.float64)
    weights /= weights.sum()  # no weight on the initial weights: they never enter the average
    for j, got in enumerate(average.weights):
        want = sum(w * it[j].double() for w, it in zip(weights, iterates))
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_before_any_update_the_average_is_the_weights_themselves():
    model = _model()
    average = WeightAverage(model, 0.99, step=3)
    for got, p in zip(average.weights, model.parameters()):
        assert torch.equal(got, p)


def test_swapped_in_holds_the_average_and_restores_the_weights_exactly_also_on_error():
    model = _model()
    average = WeightAverage(model, 0.9)
    _walk(model, average, 5)
    own = [p.detach().clone() for p in model.parameters()]
    expected = [a.clone() for a in average.weights]
    assert not all(torch.equal(a, o) for a, o in zip(expected, own))
    with pytest.raises(RuntimeError, match="inside"), average.swapped_in():
        for p, a in zip(model.parameters(), expected):
            assert torch.equal(p, a)
        raise RuntimeError("inside")
    for p, o in zip(model.parameters(), own):
        assert torch.equal(p, o)


def test_reset_averages_afresh_from_its_step():
    model = _model()
    average = WeightAverage(model, 0.9)
    _walk(model, average, 4)
    average.reset(4)
    for got, p in zip(average.weights, model.parameters()):
        assert torch.equal(got, p)
    iterates = _walk(model, average, 1, seed=2, first=4)
    for got, want in zip(average.weights, iterates[0]):
        torch.testing.assert_close(got, want)  # one update since the reset: that iterate alone


def test_state_round_trip_continues_as_the_uninterrupted_average():
    model, twin = _model(), _model()
    a, b = WeightAverage(model, 0.95), WeightAverage(twin, 0.95)
    _walk(model, a, 6)
    twin.load_state_dict(model.state_dict())
    b.load_state_dict(a.state_dict())
    _walk(model, a, 3, seed=5, first=6)
    _walk(twin, b, 3, seed=5, first=6)
    for x, y in zip(a.weights, b.weights):
        assert torch.equal(x, y)


def test_a_checkpoint_of_another_shape_or_decay_is_refused_by_name():
    model = _model()
    state = WeightAverage(model, 0.9).state_dict()
    with pytest.raises(ValueError, match="train.ema_decay 0.99"):
        WeightAverage(model, 0.99).load_state_dict(state)
    assert sorted(state["weights"]) == ["0.weight", "1.bias", "1.weight"]  # the model's state_dict names
    with pytest.raises(ValueError, match="has 3 tensors"):
        WeightAverage(nn.Linear(2, 2), 0.9).load_state_dict(state)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.1])
def test_a_decay_outside_0_1_is_refused(decay):
    with pytest.raises(ValueError, match="train.ema_decay"):
        WeightAverage(_model(), decay)
