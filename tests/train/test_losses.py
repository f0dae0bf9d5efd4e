"""Losses and samplers against brute-force float64 references."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import chi2

from recsys.train.losses import (
    LogUniformSampler,
    chunked_softmax_loss,
    full_softmax_loss,
    make_sampler,
    negative_logits,
    readout,
    sampled_softmax_loss,
)


def _brute_force_sampled(user, target, item_emb, negatives, lq_t, lq_n, remove_hits, z_loss):
    """Per-row softmax over {target} + negatives with Python loops in float64 (the oracle)."""
    u, e = user.double().tolist(), item_emb.double().tolist()

    def dot(row, item):
        return sum(x * y for x, y in zip(u[row], e[item]))

    total_ce = total_z = 0.0
    for b, t in enumerate(target.tolist()):
        pos = dot(b, t) - (lq_t[b].item() if lq_t is not None else 0.0)
        logits = [pos]
        for j, n in enumerate(negatives.tolist()):
            if remove_hits and n == t:
                continue
            logits.append(dot(b, n) - (lq_n[j].item() if lq_n is not None else 0.0))
        m = max(logits)
        log_z = m + math.log(sum(math.exp(x - m) for x in logits))
        total_ce += log_z - pos
        total_z += log_z**2
    rows = len(target)
    return total_ce / rows + z_loss * total_z / rows


def _case(seed=0, batch=6, num_items=30, dim=8, num_neg=12):
    g = torch.Generator().manual_seed(seed)
    user = torch.randn(batch, dim, generator=g)
    item_emb = torch.randn(num_items, dim, generator=g)
    target = torch.randint(1, num_items, (batch,), generator=g)
    negatives = torch.randint(1, num_items, (num_neg,), generator=g)
    negatives[:3] = target[:3]  # guaranteed accidental hits
    return user, target, item_emb, negatives


@pytest.mark.parametrize("logq", [False, True])
@pytest.mark.parametrize("remove_hits", [False, True])
@pytest.mark.parametrize("z_loss", [0.0, 0.1])
def test_sampled_softmax_matches_brute_force(logq, remove_hits, z_loss):
    user, target, item_emb, negatives = _case()
    sampler = make_sampler("log_uniform", item_emb.shape[0])
    lq_t = sampler.log_expected_count(target, len(negatives)) if logq else None
    lq_n = sampler.log_expected_count(negatives, len(negatives)) if logq else None
    out = sampled_softmax_loss(
        user,
        target,
        item_emb,
        negatives,
        log_q_target=lq_t,
        log_q_neg=lq_n,
        remove_accidental_hits=remove_hits,
        z_loss=z_loss,
    )
    expected = _brute_force_sampled(user, target, item_emb, negatives, lq_t, lq_n, remove_hits, z_loss)
    assert out.loss.dtype == torch.float32
    assert out.loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_accidental_hit_contributes_nothing():
    user, target, item_emb, _ = _case(batch=1)
    clean = torch.tensor([3, 7, 11])
    clean = clean[clean != target[0]]
    with_hit = torch.cat([clean, target])  # the row's own positive drawn as a negative
    removed = sampled_softmax_loss(user, target, item_emb, with_hit)
    reference = sampled_softmax_loss(user, target, item_emb, clean)
    kept = sampled_softmax_loss(user, target, item_emb, with_hit, remove_accidental_hits=False)
    assert removed.loss.item() == pytest.approx(reference.loss.item(), rel=1e-6)
    assert kept.loss.item() > reference.loss.item() + 1e-3


def test_sampled_softmax_gradients():
    user, target, item_emb, negatives = _case(batch=3, num_items=10, dim=4, num_neg=5)
    user, item_emb = user.double().requires_grad_(), item_emb.double().requires_grad_()
    lq_n = torch.randn(len(negatives), dtype=torch.float64)

    def f(u, e):
        return sampled_softmax_loss(u, target, e, negatives, log_q_neg=lq_n, z_loss=0.05).loss.double()

    # the loss is computed in float32 by design, hence the loose tolerances
    assert torch.autograd.gradcheck(f, (user, item_emb), eps=1e-3, atol=1e-3, rtol=1e-2)


def test_sampled_softmax_fp32_under_autocast():
    user, target, item_emb, negatives = _case()
    exact = sampled_softmax_loss(user, target, item_emb, negatives)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sampled_softmax_loss(user, target, item_emb, negatives)
    assert out.loss.dtype == torch.float32 and out.log_z.dtype == torch.float32
    assert out.loss.item() == pytest.approx(exact.loss.item(), rel=5e-2)


def test_sampled_softmax_reports_log_z_and_max_logit():
    user, target, item_emb, negatives = _case()
    out = sampled_softmax_loss(user, target, item_emb, negatives, remove_accidental_hits=False)
    logits = torch.cat([(user * item_emb[target]).sum(1, keepdim=True), user @ item_emb[negatives].T], 1)
    torch.testing.assert_close(out.log_z, torch.logsumexp(logits, 1).mean())
    torch.testing.assert_close(out.max_logit, logits.max())
    assert not out.log_z.requires_grad and not out.max_logit.requires_grad


def test_full_softmax_equals_cross_entropy_without_padding():
    user, target, item_emb, _ = _case(num_items=25)
    out = full_softmax_loss(user, target, item_emb)
    expected = F.cross_entropy(user @ item_emb[1:].T, target - 1)
    torch.testing.assert_close(out.loss, expected)
    # padding row 0 takes no part: changing it leaves the loss unchanged
    item_emb2 = item_emb.clone()
    item_emb2[0] = 100.0
    torch.testing.assert_close(full_softmax_loss(user, target, item_emb2).loss, expected)


@pytest.mark.parametrize("loss_fn", ["sampled", "full"])
def test_z_loss_term_is_weight_times_mean_log_z_squared(loss_fn):
    user, target, item_emb, negatives = _case()

    def run(z):
        if loss_fn == "sampled":
            return sampled_softmax_loss(user, target, item_emb, negatives, remove_accidental_hits=False, z_loss=z)
        return full_softmax_loss(user, target, item_emb, z_loss=z)

    if loss_fn == "sampled":
        logits = torch.cat([(user * item_emb[target]).sum(1, keepdim=True), user @ item_emb[negatives].T], 1)
    else:
        logits = user @ item_emb[1:].T
    weight = 0.3
    direct = weight * torch.logsumexp(logits, 1).square().mean()
    torch.testing.assert_close(run(weight).loss - run(0.0).loss, direct, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss_fn", ["sampled", "full", "chunked"])
def test_two_shares_of_a_masked_batch_average_to_its_mean_with_the_global_count(loss_fn):
    """Two halves of a batch, each dividing its valid rows' sum by the whole batch's count over 2
    (what each rank does under DDP): the mean of the halves' losses and of their gradients is
    the whole batch's loss and gradient, z-loss included, though the halves hold 5 and 1 valid rows."""
    g = torch.Generator().manual_seed(0)
    item_emb = torch.randn(20, 8, generator=g, dtype=torch.float64).requires_grad_()
    user = torch.randn(8, 8, generator=g, dtype=torch.float64)
    target = torch.randint(1, 20, (8,), generator=g)
    mask = torch.tensor([True, True, True, True, True, False, False, True])
    negatives = torch.randint(1, 20, (6,), generator=g)

    def loss(rows: slice, count: torch.Tensor | None = None) -> torch.Tensor:
        args = (user[rows], target[rows], item_emb)
        kwargs = {"z_loss": 0.1, "mask": mask[rows], "count": count}
        if loss_fn == "sampled":
            return sampled_softmax_loss(*args, negatives, **kwargs).loss
        return (full_softmax_loss if loss_fn == "full" else chunked_softmax_loss)(*args, **kwargs).loss

    (whole,) = torch.autograd.grad(want := loss(slice(None)), item_emb)
    count = mask.sum() / 2
    halves = [loss(slice(0, 5), count), loss(slice(5, None), count)]
    got = (halves[0] + halves[1]) / 2
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, item_emb)[0], whole)
    # each half's own mean (no count) weighs the half with one valid row five times as much
    assert not torch.allclose((loss(slice(0, 5)) + loss(slice(5, None))) / 2, want)


def test_readout_picks_argmax_interest_and_routes_gradient():
    g = torch.Generator().manual_seed(1)
    interests = torch.randn(5, 4, 6, generator=g, requires_grad=True)
    target_emb = torch.randn(5, 6, generator=g, requires_grad=True)
    out = readout(interests, target_emb)
    choice = torch.einsum("bkd,bd->bk", interests, target_emb).argmax(1)
    torch.testing.assert_close(out, interests[torch.arange(5), choice])
    out.sum().backward()
    chosen = torch.zeros(5, 4, dtype=torch.bool)
    chosen[torch.arange(5), choice] = True
    assert (interests.grad[chosen] == 1).all() and (interests.grad[~chosen] == 0).all()
    assert target_emb.grad is None  # no gradient through the argmax


def test_readout_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="target_emb"):
        readout(torch.zeros(2, 3, 4), torch.zeros(2, 5))


def _chi_square_ok(ids, log_prob, num_items, draws):
    observed = torch.bincount(ids, minlength=num_items)[1:].double()
    expected = log_prob.double().exp() * draws
    support = expected > 0
    assert observed[~support].sum() == 0, "drew an item of probability 0"
    stat = ((observed[support] - expected[support]) ** 2 / expected[support]).sum().item()
    dof = int(support.sum()) - 1
    return stat < chi2.ppf(1 - 1e-4, dof), stat


@pytest.mark.parametrize("kind", ["uniform", "log_uniform", "unigram"])
def test_sampler_frequencies_match_log_prob(kind):
    num_items, draws = 40, 200_000
    counts = np.arange(num_items, 0, -1) ** 2
    counts[[0, 5, 17]] = 0  # padding and two items never clicked
    sampler = make_sampler(kind, num_items, item_counts=counts, alpha=0.75)
    ids = sampler.sample(draws, generator=torch.Generator().manual_seed(3))
    assert ids.dtype == torch.long and ids.shape == (draws,)
    assert ids.min() >= 1 and ids.max() <= num_items - 1
    log_prob = sampler.log_prob(torch.arange(1, num_items))
    assert log_prob.exp().sum().item() == pytest.approx(1.0, abs=1e-5)
    ok, stat = _chi_square_ok(ids, log_prob, num_items, draws)
    assert ok, f"{kind}: chi-square {stat:.1f} too large"
    lq = sampler.log_expected_count(torch.tensor([1, 2]), 50)
    torch.testing.assert_close(lq, sampler.log_prob(torch.tensor([1, 2])) + math.log(50))


def test_unigram_follows_count_power():
    counts = np.array([0, 16, 1, 0, 81])
    sampler = make_sampler("unigram", 5, item_counts=counts, alpha=0.5)
    expected = np.log(np.array([4.0, 1.0, 1.0, 9.0]) / 14.0)
    expected[2] = -np.inf  # count 0: never drawn
    np.testing.assert_allclose(sampler.log_prob(torch.arange(1, 5)).numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("num_items", [2, 3, 1000, 10**7])
def test_log_uniform_range(num_items):
    sampler = LogUniformSampler(num_items)
    ids = sampler.sample(200_000, generator=torch.Generator().manual_seed(0))
    assert ids.min().item() >= 1 and ids.max().item() <= num_items - 1
    p = sampler.log_prob(torch.tensor([1])).exp().item()
    assert p == pytest.approx(math.log(2) / math.log(num_items), rel=1e-6)


def test_sampling_is_reproducible_with_a_generator():
    sampler = make_sampler("log_uniform", 500)
    a = sampler.sample(100, generator=torch.Generator().manual_seed(9))
    b = sampler.sample(100, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b)


def test_make_sampler_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown sampler"):
        make_sampler("zipf", 10)
    with pytest.raises(ValueError, match="needs item_counts"):
        make_sampler("unigram", 10)
    with pytest.raises(ValueError, match=r"item_counts: expected shape \[10\]"):
        make_sampler("unigram", 10, item_counts=np.ones(9))
    with pytest.raises(ValueError, match="num_items"):
        make_sampler("uniform", 1)


def test_loss_rejects_bad_shapes():
    user, target, item_emb, negatives = _case()
    with pytest.raises(ValueError, match="target"):
        sampled_softmax_loss(user, target.float(), item_emb, negatives)
    with pytest.raises(ValueError, match="log_q_neg"):
        sampled_softmax_loss(user, target, item_emb, negatives, log_q_neg=torch.zeros(3))
    with pytest.raises(ValueError, match="item_emb"):
        full_softmax_loss(user, target, item_emb[:, :3])


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["uniform", "log_uniform", "unigram"])
def test_cuda_sampling_and_loss_never_sync(kind):
    device = torch.device("cuda")
    num_items = 1000
    sampler = make_sampler(kind, num_items, item_counts=np.arange(num_items, 0, -1), alpha=0.75)
    generator = torch.Generator(device=device).manual_seed(0)
    user = torch.randn(64, 16, device=device, requires_grad=True)
    item_emb = torch.randn(num_items, 16, device=device, requires_grad=True)
    target = torch.randint(1, num_items, (64,), device=device)
    sampler.sample(8, generator=generator, device=device)  # first use copies tables to the GPU
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        negatives = sampler.sample(640, generator=generator, device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = sampled_softmax_loss(
                user,
                target,
                item_emb,
                negatives,
                log_q_target=sampler.log_expected_count(target, 640),
                log_q_neg=sampler.log_expected_count(negatives, 640),
                z_loss=1e-4,
            )
        out.loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert negatives.device.type == "cuda" and out.loss.dtype == torch.float32
    assert torch.isfinite(out.loss).item()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_grouped_interests_score_negatives_as_their_repeats_do(backend):
    """interests [B / m, K, d] serve m consecutive rows each: the same logits and gradients as the
    interests repeated m times (train.predict_next), for the max score's kernel (the interpreter on the
    CPU, conftest) and its twin."""
    torch.manual_seed(7)
    b, m, k, d, s = 5, 3, 4, 16, 9
    interests = torch.randn(b, k, d, dtype=torch.float64 if backend == "torch" else torch.float32)
    items = torch.randn(s, d, dtype=interests.dtype)
    user = torch.randn(b * m, d, dtype=interests.dtype)
    grads = []
    outs = []
    for grouped in (True, False):
        leaf = interests.clone().requires_grad_()
        given = leaf if grouped else leaf.repeat_interleave(m, dim=0)
        logits = negative_logits(user, items, given, backend=backend)
        assert logits.shape == (b * m, s)
        (logits * torch.arange(b * m * s, dtype=logits.dtype).view(b * m, s)).sum().backward()
        outs.append(logits.detach())
        grads.append(leaf.grad)
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(grads[0], grads[1])
    with pytest.raises(ValueError, match=r"interests: expected \[15 / m, K, 16\]"):
        negative_logits(user, items, interests[:4], backend=backend)
