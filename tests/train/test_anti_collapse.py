"""The switches against interest collapse: each loss term and sampler against a small exact computation."""

import json
import math

import pytest
import torch
from scipy.stats import chi2

from recsys.config import ConfigError, load_config
from recsys.run.settings import check
from recsys.train.losses import (
    attention_collision,
    draw_from,
    full_softmax_loss,
    interest_cosine,
    interest_proposal,
    make_sampler,
    mixture_log_expected_count,
    negative_logits,
    readout,
    sampled_softmax_loss,
)
from recsys.train.trainer import train
from tests.conftest import TINY_TRAIN_OVERRIDES

TINY = TINY_TRAIN_OVERRIDES


def _scores(seed=0, batch=5, seq_len=6, k=3):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, seq_len, k, generator=g, dtype=torch.float64) * 2
    lengths = torch.tensor([0, 1, 3, seq_len, 4][:batch])
    return scores, lengths


def test_attention_collision_matches_a_loop():
    scores, lengths = _scores()
    total = 0.0
    for b in range(scores.shape[0]):
        n = int(lengths[b])
        for k in range(scores.shape[2]):
            if n == 0:
                continue  # an empty row reads nothing: contributes 0
            w = [math.exp(x) for x in scores[b, :n, k].tolist()]
            total += sum((x / sum(w)) ** 2 for x in w)
    expected = total / (scores.shape[0] * scores.shape[2])
    assert attention_collision(scores, lengths).item() == pytest.approx(expected, rel=1e-12)


def test_attention_collision_gradient_is_exact_and_zero_on_padding():
    scores, lengths = _scores(1)
    scores.requires_grad_()
    assert torch.autograd.gradcheck(lambda s: attention_collision(s, lengths), (scores,))
    attention_collision(scores, lengths).backward()
    padded = torch.arange(scores.shape[1])[None, :] >= lengths[:, None]
    assert (scores.grad[padded] == 0).all() and torch.isfinite(scores.grad).all()
    # one click: the collision is 1 whatever the score, so no gradient either
    assert (scores.grad[1] == 0).all()


@pytest.mark.parametrize("margin", [-1.0, 0.0, 0.3])
def test_interest_cosine_matches_a_loop_and_skips_rows_with_a_zero_interest(margin):
    g = torch.Generator().manual_seed(5)
    interests = torch.randn(6, 3, 4, generator=g, dtype=torch.float64)
    interests[0, 1] = interests[0, 0] * 2 + 0.1  # a near-duplicate pair: above every margin
    interests[2] = 0.0  # a fully padded prefix: every interest zero
    interests[4, 1] = 0.0  # one zero interest: its direction is undefined
    total, counted = 0.0, 0
    for r in (0, 1, 3, 5):
        u = [interests[r, i] / interests[r, i].norm() for i in range(3)]
        total += sum(max(0.0, float(u[i] @ u[j]) - margin) for i in range(3) for j in range(3) if i != j) / 6
        counted += 1
    assert total > 0
    assert interest_cosine(interests, margin).item() == pytest.approx(total / counted, rel=1e-12)
    interests.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: interest_cosine(x, margin), (interests,))
    interest_cosine(interests, margin).backward()
    assert (interests.grad[[2, 4]] == 0).all() and torch.isfinite(interests.grad).all()


def test_interest_cosine_makes_no_host_sync():
    """The hinge runs inside the training step's CUDA graph, which an op that waits for the host
    breaks (a boolean index runs ``nonzero``; ``.item()`` copies): forward and backward use none."""
    from torch.utils._python_dispatch import TorchDispatchMode

    syncing: list[str] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            flat = [a for a in args if isinstance(a, (list, tuple))]
            bool_index = any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for seq in flat for t in seq)
            if "nonzero" in name or "_local_scalar_dense" in name or "masked_select" in name or bool_index:
                syncing.append(name)
            return func(*args, **(kwargs or {}))

    x = torch.randn(6, 4, 8, requires_grad=True)
    with Watch():
        interest_cosine(x, 0.7).backward()
    assert syncing == [] and x.grad is not None


def test_interest_cosine_of_identical_and_opposed_interests():
    same = torch.ones(1, 4, 3)
    assert interest_cosine(same, margin=-1.0).item() == pytest.approx(2.0)  # mean cosine 1, plus one
    assert interest_cosine(same, margin=0.5).item() == pytest.approx(0.5)
    simplex = torch.eye(3) - 1 / 3  # three vectors summing to zero: every cosine -1/2
    assert interest_cosine(simplex[None], margin=-1.0).item() == pytest.approx(0.5)
    assert interest_cosine(simplex[None], margin=0.0).item() == 0.0


def test_attention_collision_is_one_over_n_for_uniform_attention():
    scores = torch.zeros(2, 8, 4)
    lengths = torch.tensor([8, 2])
    assert attention_collision(scores, lengths).item() == pytest.approx((1 / 8 + 1 / 2) / 2)


def test_soft_readout_blends_and_routes_gradient_to_every_interest():
    g = torch.Generator().manual_seed(2)
    interests = torch.randn(4, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randn(4, 5, generator=g, dtype=torch.float64)
    hard = readout(interests, target)
    assert torch.equal(readout(interests, target, soft=torch.tensor(0.0, dtype=torch.float64)), hard)
    match = torch.einsum("bkd,bd->bk", interests, target)
    soft_only = torch.einsum("bk,bkd->bd", torch.softmax(match, dim=1), interests)
    torch.testing.assert_close(readout(interests, target, soft=torch.tensor(1.0, dtype=torch.float64)), soft_only)
    torch.testing.assert_close(readout(interests, target, soft=0.25), 0.75 * hard + 0.25 * soft_only)
    readout(interests, target, soft=0.5).sum().backward()
    assert (interests.grad.abs().sum(dim=2) > 0).all(), "every interest learns under a soft readout"


def test_interest_proposal_is_the_mean_softmax_over_interests():
    g = torch.Generator().manual_seed(3)
    interests = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    item_emb = torch.randn(7, 4, generator=g, dtype=torch.float64)
    q = interest_proposal(interests, item_emb, temperature=0.5)
    expected = torch.zeros(7, dtype=torch.float64)
    for b in range(2):
        for k in range(3):
            logits = [float(interests[b, k] @ item_emb[j]) / 0.5 for j in range(1, 7)]
            z = sum(math.exp(x) for x in logits)
            for j, x in enumerate(logits, start=1):
                expected[j] += math.exp(x) / z / 6
    torch.testing.assert_close(q.double(), expected, rtol=1e-5, atol=1e-7)
    assert q[0] == 0


def _chi2_ok(ids: torch.Tensor, expected_counts: torch.Tensor) -> bool:
    observed = torch.bincount(ids, minlength=len(expected_counts)).double()
    support = expected_counts > 0
    assert observed[~support].sum() == 0, "an id of probability 0 was drawn"
    stat = ((observed[support] - expected_counts[support]) ** 2 / expected_counts[support]).sum().item()
    return stat < chi2.ppf(1 - 1e-4, int(support.sum()) - 1)


def test_draw_from_follows_the_probabilities():
    probs = torch.tensor([0.0, 0.1, 0.0, 0.3, 0.6])
    ids = draw_from(probs, torch.rand(100_000, generator=torch.Generator().manual_seed(4)))
    assert _chi2_ok(ids, probs.double() * 100_000)


def test_mixture_expected_counts_are_exact_on_a_toy_catalogue():
    """Stratified draws (S_base from the sampler, S_hard from q) land at the rates the logQ term assumes."""
    num_items, s_base, s_hard, rounds = 12, 30, 10, 4000
    base = make_sampler("log_uniform", num_items)
    q = torch.softmax(torch.randn(num_items, generator=torch.Generator().manual_seed(5)), 0)
    q[0] = 0
    q = q / q.sum()
    ids = torch.arange(num_items)
    log_e = mixture_log_expected_count(ids[1:], base, s_base, q, s_hard)
    by_hand = torch.log(s_base * base.log_prob(ids[1:]).double().exp() + s_hard * q[1:].double())
    torch.testing.assert_close(log_e.double(), by_hand, rtol=1e-5, atol=1e-6)
    gen = torch.Generator().manual_seed(6)
    draws = torch.cat(
        [
            torch.cat([base.sample(s_base, generator=gen), draw_from(q, torch.rand(s_hard, generator=gen))])
            for _ in range(rounds)
        ]
    )
    expected = torch.zeros(num_items, dtype=torch.float64)
    expected[1:] = log_e.double().exp() * rounds
    assert _chi2_ok(draws, expected)


def test_hard_negative_correction_recovers_the_full_partition_function():
    """With the exact logQ, sum_j exp(s_j - log E_j) over the drawn negatives estimates the full
    sum_j exp(s_j); a correction that ignored the hard proposal would be biased."""
    g = torch.Generator().manual_seed(7)
    num_items, dim = 40, 6
    item_emb = torch.randn(num_items, dim, generator=g, dtype=torch.float64)
    interests = torch.randn(3, 2, dim, generator=g, dtype=torch.float64)
    user = torch.randn(dim, generator=g, dtype=torch.float64) * 1.5
    base = make_sampler("log_uniform", num_items)
    q = interest_proposal(interests, item_emb, temperature=0.3).double()
    s_base, s_hard = 100_000, 100_000
    draws = torch.cat([base.sample(s_base, generator=g), draw_from(q, torch.rand(s_hard, generator=g))])
    logits = item_emb[draws] @ user
    full = torch.logsumexp(item_emb[1:] @ user, 0).item()
    exact = torch.logsumexp(logits - mixture_log_expected_count(draws, base, s_base, q, s_hard).double(), 0).item()
    base_only = torch.logsumexp(logits - base.log_expected_count(draws, s_base + s_hard).double(), 0).item()
    assert exact == pytest.approx(full, abs=0.02)
    assert abs(base_only - full) > 0.1


def _interests_case(seed=0, batch=5, k=3, dim=6, num_items=25, num_neg=9):
    g = torch.Generator().manual_seed(seed)
    interests = torch.randn(batch, k, dim, generator=g, dtype=torch.float64, requires_grad=True)
    item_emb = torch.randn(num_items, dim, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, num_items, (batch,), generator=g)
    negatives = torch.randint(1, num_items, (num_neg,), generator=g)
    negatives[0] = target[0]  # an accidental hit
    return interests, item_emb, target, negatives


def _max_score_loss_by_loops(interests, item_emb, target, negatives, log_q):
    """Per row: softmax over {target scored by its best interest} + negatives each scored by its
    best interest, a float64 tensor built with loops (differentiable, the oracle)."""
    total = 0.0
    for b, t in enumerate(target.tolist()):
        ids = [t] + [n for n in negatives.tolist() if n != t]  # the target first
        logits = torch.stack([(interests[b] @ item_emb[j]).max() - log_q(j) for j in ids])
        total = total + torch.logsumexp(logits, 0) - logits[0]
    return total / len(target)


def test_max_negative_scores_match_a_loop_in_value_and_gradient():
    interests, item_emb, target, negatives = _interests_case()
    sampler = make_sampler("log_uniform", item_emb.shape[0])

    def log_q(ids: torch.Tensor) -> torch.Tensor:
        return sampler.log_expected_count(ids, len(negatives)).double()

    user = readout(interests, item_emb[target])
    got = sampled_softmax_loss(
        user, target, item_emb, negatives, log_q_target=log_q(target), log_q_neg=log_q(negatives), interests=interests
    ).loss  # fp32 logits
    expected = _max_score_loss_by_loops(interests, item_emb, target, negatives, lambda j: log_q(torch.tensor(j)))
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    grads = torch.autograd.grad(got, (interests, item_emb))
    for g, e in zip(grads, torch.autograd.grad(expected, (interests, item_emb))):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_max_negative_scores_send_gradient_to_the_interest_that_ranks_a_negative_highest():
    interests = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], requires_grad=True)  # [1, 2, 2]
    item_emb = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0]])  # target 1 matches interest 0
    target, negatives = torch.tensor([1]), torch.tensor([2])  # the negative matches interest 1
    user = readout(interests, item_emb[target])
    sampled_softmax_loss(user, target, item_emb, negatives).loss.backward()
    assert interests.grad[0, 1].abs().sum() == 0  # ComiRec: the other interest never hears of it
    interests.grad = None
    sampled_softmax_loss(
        readout(interests, item_emb[target]), target, item_emb, negatives, interests=interests
    ).loss.backward()
    assert interests.grad[0, 1, 1] > 0  # pushed away from the negative it ranks highest
    assert interests.grad[0, 1, 0] == 0


def test_max_negative_scores_with_one_interest_and_the_full_softmax():
    interests, item_emb, target, negatives = _interests_case(k=1)
    user = interests[:, 0]
    plain = sampled_softmax_loss(user, target, item_emb, negatives).loss
    torch.testing.assert_close(sampled_softmax_loss(user, target, item_emb, negatives, interests=interests).loss, plain)
    interests, item_emb, target, _ = _interests_case(k=3)
    user = readout(interests, item_emb[target])
    got = full_softmax_loss(user, target, item_emb, interests=interests).loss
    every_item = torch.arange(1, item_emb.shape[0])
    expected = _max_score_loss_by_loops(interests, item_emb, target, every_item, lambda j: 0.0)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    with pytest.raises(ValueError, match="interests"):
        negative_logits(user, item_emb, interests[:, :, :2])


def test_switches_on_models_they_cannot_affect_are_errors(tmp_path):
    with pytest.raises(ValueError, match="train.attention_reg"):
        train(
            load_config(None, TINY + [f"output_dir={tmp_path}", "model.name=youtube_dnn", "train.attention_reg=1"]),
            log=lambda s: None,
        )
    with pytest.raises(ValueError, match="model.score_cap"):
        train(
            load_config(None, TINY + [f"output_dir={tmp_path}", "model.name=gru4rec", "model.score_cap=2"]),
            log=lambda s: None,
        )
    for model, k in (("youtube_dnn", 4), ("comirec_sa", 1)):
        with pytest.raises(ConfigError, match="train.interest_reg=0.5 has no effect"):
            check(load_config(None, [f"model.name={model}", f"model.num_interests={k}", "train.interest_reg=0.5"]))
    with pytest.raises(ConfigError, match="train.interest_reg: must be >= 0"):
        load_config(None, ["train.interest_reg=-0.5"])
    with pytest.raises(ConfigError, match=r"train.interest_margin: a cosine in \[-1, 1\), got 1.0"):
        load_config(None, ["train.interest_margin=1.0"])
    with pytest.raises(ConfigError, match="train.hard_negatives"):
        load_config(None, ["train.hard_negatives=0.5", "train.full_softmax=true"])
    with pytest.raises(ConfigError, match="train.hard_negatives"):
        load_config(None, ["train.hard_negatives=1.0"])
    with pytest.raises(ConfigError, match="train.negative_readout"):
        load_config(None, ["train.negative_readout=best"])


@pytest.mark.parametrize("model", ["comirec_sa", "sasrec_mi"])
def test_training_with_every_switch_logs_interest_health(tmp_path, model):
    cfg = load_config(
        None,
        TINY
        + [
            f"output_dir={tmp_path}",
            f"model.name={model}",
            "model.score_cap=3",
            "train.attention_reg=1",
            "train.soft_readout_steps=20",
            "train.hard_negatives=0.5",
            "train.negative_readout=max",
            "train.interest_reg=0.5",
            "name=switches",
        ],
    )
    result = train(cfg, log=lambda s: None)
    rows = [json.loads(line) for line in (tmp_path / "switches" / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in rows if r.get("split") == "valid"]
    assert valid and all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
    for key in (
        "mi_eff_clicks",
        "mi_readout_share_min",
        "mi_served_share_min",
        "mi_cosine",
        "mi_planted_recovery",
        "mi_planted_in_input",
    ):
        assert key in valid[-1], key
    assert 1.0 <= valid[-1]["mi_eff_clicks"] <= 10.0  # at most max_len clicks
    assert 0.0 <= valid[-1]["mi_planted_recovery"] <= 1.0
    assert result.test_metrics["recall@50"] > 0


def test_attention_reg_spreads_the_attention(tmp_path):
    """The routing regulariser raises the effective number of clicks each interest reads."""
    eff = {}
    for reg in (0.0, 10.0):
        cfg = load_config(
            None,
            TINY
            + [
                f"output_dir={tmp_path}",
                f"name=reg{reg}",
                f"train.attention_reg={reg}",
                "train.lr=0.01",
                "train.max_steps=80",
                "train.eval_every=80",
            ],
        )
        train(cfg, log=lambda s: None)
        rows = [json.loads(line) for line in (tmp_path / f"reg{reg}" / "metrics.jsonl").read_text().splitlines()]
        eff[reg] = [r for r in rows if r.get("split") == "valid"][-1]["mi_eff_clicks"]
    assert eff[10.0] > eff[0.0] + 0.5, eff
