"""The chunked exact softmax against full_softmax_loss, and the ``mask`` of all three softmax losses."""

import pytest
import torch

from recsys.kernels import triton_available
from recsys.train.losses import (
    chunked_softmax_loss,
    full_softmax_loss,
    make_sampler,
    sampled_softmax_loss,
)

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _case(rows, num_items, dim=6, k=None, seed=0, masked=0.3, device="cpu"):
    """Random ``(user [R, d], target [R], item_emb [N, d], mask [R], interests [R, K, d] | None)``,
    fp32 leaves; masked rows have target 0 (padding), as dense training's empty positions do."""
    g = torch.Generator().manual_seed(seed)
    user = torch.randn(rows, dim, generator=g)
    item_emb = torch.randn(num_items, dim, generator=g)
    target = torch.randint(1, num_items, (rows,), generator=g)
    mask = torch.rand(rows, generator=g) >= masked
    target[~mask] = 0
    interests = None if k is None else torch.randn(rows, k, dim, generator=g).to(device).requires_grad_()
    return (
        user.to(device).requires_grad_(),
        target.to(device),
        item_emb.to(device).requires_grad_(),
        mask.to(device),
        interests,
    )


def _loss_and_grads(fn, user, target, item_emb, interests, **kwargs):
    """``(LossOutput, grads of user, item_emb and interests)``; a grad that never arrives is zeros."""
    out = fn(user, target, item_emb, interests=interests, **kwargs)
    leaves = [x for x in (user, item_emb, interests) if x is not None]
    grads = torch.autograd.grad(out.loss, leaves, allow_unused=True)
    return out, [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]


def _assert_same(got, want, rtol=1e-5, atol=1e-6):
    (out, grads), (ref, ref_grads) = got, want
    for field in ("loss", "log_z", "max_logit"):
        torch.testing.assert_close(getattr(out, field), getattr(ref, field), rtol=rtol, atol=atol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=rtol, atol=atol)


@pytest.mark.parametrize("k", [None, 3], ids=["user", "max-interests"])
@pytest.mark.parametrize(
    ("rows", "num_items", "chunk_size"),
    [
        (13, 50, 7),  # 49 items: the last chunk is short
        (13, 50, 1),  # one item per chunk
        (13, 50, 49),  # one chunk, exactly
        (13, 50, 500),  # chunk larger than the catalogue
        (1, 50, 8),  # one row
        (13, 2, 4),  # one real item: with max interests no item but the target is left
    ],
)
@pytest.mark.parametrize("z_loss", [0.0, 0.2])
def test_chunked_equals_full_softmax_in_value_and_gradients(k, rows, num_items, chunk_size, z_loss):
    user, target, item_emb, mask, interests = _case(rows, num_items, k=k, masked=0.0 if rows == 1 else 0.3)
    want = _loss_and_grads(
        full_softmax_loss, user, target, item_emb, interests, mask=mask, z_loss=z_loss, backend="torch"
    )
    got = _loss_and_grads(
        chunked_softmax_loss,
        user,
        target,
        item_emb,
        interests,
        mask=mask,
        z_loss=z_loss,
        chunk_size=chunk_size,
        backend="torch",
    )
    _assert_same(got, want)
    assert got[0].loss.isfinite() and not got[0].log_z.requires_grad and not got[0].max_logit.requires_grad


@pytest.mark.skipif(not triton_available(torch.device("cpu")), reason="needs TRITON_INTERPRET=1 (set by conftest)")
def test_chunked_through_the_max_score_kernel_equals_the_full_softmax_on_the_twin():
    user, target, item_emb, mask, interests = _case(10, 40, dim=8, k=3)
    want = _loss_and_grads(full_softmax_loss, user, target, item_emb, interests, mask=mask, z_loss=0.1, backend="torch")
    got = _loss_and_grads(
        chunked_softmax_loss, user, target, item_emb, interests, mask=mask, z_loss=0.1, chunk_size=16, backend="triton"
    )
    _assert_same(got, want, rtol=1e-4, atol=1e-5)


def test_chunked_without_mask_is_the_plain_mean():
    user, _, item_emb, _, _ = _case(9, 40)
    target = torch.randint(1, 40, (9,), generator=torch.Generator().manual_seed(3))
    want = _loss_and_grads(full_softmax_loss, user, target, item_emb, None)
    _assert_same(_loss_and_grads(chunked_softmax_loss, user, target, item_emb, None, chunk_size=6), want)
    all_valid = torch.ones(9, dtype=torch.bool)
    _assert_same(
        _loss_and_grads(chunked_softmax_loss, user, target, item_emb, None, chunk_size=6, mask=all_valid), want
    )


def _sampled(user, target, item_emb, *, interests=None, **kwargs):
    """sampled_softmax_loss with 12 fixed negatives and the unigram sampler's logQ: id 0 (the
    masked rows' target) has ``log q = -inf``, so its row's logits hold ``+inf``."""
    counts = torch.arange(item_emb.shape[0], dtype=torch.float64)  # counts[0] = 0: padding
    sampler = make_sampler("unigram", item_emb.shape[0], counts)
    negatives = torch.randint(1, item_emb.shape[0], (12,), generator=torch.Generator().manual_seed(5))
    return sampled_softmax_loss(
        user,
        target,
        item_emb,
        negatives,
        log_q_target=sampler.log_expected_count(target, 12),
        log_q_neg=sampler.log_expected_count(negatives, 12),
        interests=interests,
        **kwargs,
    )


def _chunked(user, target, item_emb, **kwargs):
    return chunked_softmax_loss(user, target, item_emb, chunk_size=7, **kwargs)


LOSSES = {"sampled": _sampled, "full": full_softmax_loss, "chunked": _chunked}


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("k", [None, 2], ids=["user", "max-interests"])
def test_masked_rows_take_no_part_and_get_exactly_zero_gradient(loss, k):
    user, target, item_emb, mask, interests = _case(16, 30, k=k)
    assert 0 < mask.sum() < 16
    out, (d_user, d_items, *d_interests) = _loss_and_grads(
        LOSSES[loss], user, target, item_emb, interests, mask=mask, z_loss=0.1
    )
    assert out.loss.isfinite() and d_items.isfinite().all()
    assert (d_user[~mask] == 0).all() and (d_user[mask] != 0).any()
    for d in d_interests:
        assert (d[~mask] == 0).all()
    # whatever the masked rows hold, the loss is the valid rows' alone
    valid = _loss_and_grads(
        LOSSES[loss], user[mask], target[mask], item_emb, None if interests is None else interests[mask], z_loss=0.1
    )
    torch.testing.assert_close(out.loss, valid[0].loss)
    torch.testing.assert_close(out.log_z, valid[0].log_z)
    torch.testing.assert_close(out.max_logit, valid[0].max_logit)
    torch.testing.assert_close(d_items, valid[1][1])


@pytest.mark.parametrize("loss", LOSSES)
def test_all_rows_masked_gives_zero_loss_and_zero_gradients(loss):
    user, target, item_emb, _, interests = _case(5, 30, k=2)
    mask = torch.zeros(5, dtype=torch.bool)
    out, grads = _loss_and_grads(LOSSES[loss], user, target, item_emb, interests, mask=mask, z_loss=0.1)
    assert out.loss == 0 and out.log_z == 0 and out.max_logit == float("-inf")
    assert all((g == 0).all() for g in grads)


@pytest.mark.parametrize("k", [None, 2], ids=["user", "max-interests"])
def test_nothing_of_the_logits_size_is_saved_for_backward(k):
    rows, num_items = 24, 301
    user, target, item_emb, mask, interests = _case(rows, num_items, k=k)
    sizes: list[int] = []

    def pack(t):
        sizes.append(t.numel())
        return t

    def largest_saved(fn, **kwargs):
        sizes.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(user, target, item_emb, interests=interests, mask=mask, z_loss=0.1, backend="torch", **kwargs)
        return max(sizes)

    assert largest_saved(full_softmax_loss) >= rows * (num_items - 1)  # the hook sees the logits
    assert largest_saved(chunked_softmax_loss, chunk_size=32) <= max(item_emb.numel(), user.numel() * (k or 1))


def test_bf16_autocast_matches_full_softmax_to_bf16_precision():
    user, target, item_emb, mask, _ = _case(20, 90, dim=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _loss_and_grads(full_softmax_loss, user, target, item_emb, None, mask=mask, z_loss=0.1)
        got = _loss_and_grads(chunked_softmax_loss, user, target, item_emb, None, mask=mask, z_loss=0.1, chunk_size=16)
    _assert_same(got, want, rtol=2e-2, atol=2e-2)
    out, (d_user, d_items) = got
    assert out.loss.dtype == torch.float32 and d_user.dtype == d_items.dtype == torch.float32
    fp32 = _loss_and_grads(full_softmax_loss, user, target, item_emb, None, mask=mask, z_loss=0.1)
    # the matmul really ran in bf16: the logits differ from fp32 by bf16 rounding
    assert (out.max_logit - fp32[0].max_logit).abs() > 1e-5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mask": torch.ones(4, dtype=torch.long)}, r"mask must be bool \[4\]"),
        ({"mask": torch.ones(3, dtype=torch.bool)}, r"mask must be bool \[4\]"),
        ({"chunk_size": 0}, "chunk_size must be an int >= 1"),
        ({"chunk_size": 2.5}, "chunk_size must be an int >= 1"),
        ({"interests": torch.randn(4, 2, 5)}, r"interests: expected \[4 / m, K, 6\]"),
        ({"interests": torch.randn(3, 2, 6)}, r"interests: expected \[4 / m, K, 6\]"),
    ],
)
def test_chunked_rejects_bad_arguments(kwargs, message):
    user, target, item_emb, _, _ = _case(4, 20)
    with pytest.raises(ValueError, match=message):
        chunked_softmax_loss(user, target, item_emb, **kwargs)


@pytest.mark.parametrize("loss", ["sampled", "full"])
def test_the_other_losses_check_the_mask(loss):
    user, target, item_emb, _, _ = _case(4, 20)
    with pytest.raises(ValueError, match=r"mask must be bool \[4\]"):
        LOSSES[loss](user, target, item_emb, mask=torch.ones(4, 1, dtype=torch.bool))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("k", [None, 4], ids=["user", "max-interests"])
def test_chunked_on_cuda_in_bf16_is_captured_by_a_cuda_graph_and_matches_eager(k):
    user, target, item_emb, mask, interests = _case(256, 5000, dim=64, k=k, device="cuda")
    leaves = [x for x in (user, item_emb, interests) if x is not None]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            out = chunked_softmax_loss(
                user, target, item_emb, interests=interests, mask=mask, z_loss=0.1, chunk_size=1024
            )
        return out.loss.detach(), torch.autograd.grad(out.loss, leaves)

    eager_loss, eager_grads = step()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = _loss_and_grads(full_softmax_loss, user, target, item_emb, interests, mask=mask, z_loss=0.1)
    torch.testing.assert_close(eager_loss, want[0].loss, rtol=2e-2, atol=2e-2)
    del want  # its loss holds an autograd graph (and the leaves' accumulators) made on the default stream
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # fails on any host sync
        graph_loss, graph_grads = step()
    graph.replay()
    torch.cuda.synchronize()
    # bf16 products: cuBLAS may pick other kernels inside a capture than outside it
    torch.testing.assert_close(graph_loss, eager_loss, rtol=1e-3, atol=1e-3)
    for g, e in zip(graph_grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-2, atol=1e-3)
