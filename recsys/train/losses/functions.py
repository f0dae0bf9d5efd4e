"""The loss functions and their parts: ComiRec's readout, negative samplers (and hard negatives),
sampled, full and chunked softmax, z-loss, the attention (routing) and interest regularisers. The
training step reaches them through a :class:`~recsys.train.losses.CatalogueLoss`.

A training step with shared negatives looks like this (no host sync anywhere)::

    sampler = make_sampler("log_uniform", num_items)
    negatives = sampler.sample(num_sampled, generator=gen, device=device)      # [S]
    user = readout(model.interests(seq, lengths), item_emb[target])           # [B, d]
    out = sampled_softmax_loss(
        user, target, item_emb, negatives,
        log_q_target=sampler.log_expected_count(target, num_sampled),         # [B]
        log_q_neg=sampler.log_expected_count(negatives, num_sampled),         # [S]
    )
    out.loss.backward()

**logQ convention.** Negatives are ``S`` independent draws (with replacement) from the
sampler's distribution ``p``. The correction subtracts ``log(S * p(id))``, the log *expected
count* of ``id`` among the ``S`` draws, from both the target's and the negatives' logits, as
TensorFlow's ``sampled_softmax_loss`` does (``subtract_log_q=True``; drawing with replacement,
TF's ``unique=False``, the expected count is exactly ``S * p``). ComiRec's TF code drew unique
candidates instead (``unique=True``, expected count ``1 - (1 - p) ** tries``); with replacement
keeps sampling one vectorised draw on the device. The ``log S`` part shifts every logit of a row
equally, so it leaves the loss unchanged; it makes ``log_z`` an importance-sampling estimate of
the log-partition over the whole catalogue, so z-loss means roughly the same thing with either
loss. :meth:`Sampler.log_prob` is the log probability of a single draw, ``log p(id)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from recsys.kernels import catalogue_logsumexp, length_softmax, max_interest_scores
from recsys.kernels.catalogue_logsumexp import uses_kernel
from recsys.nn.multi_interest import interest_cosines

SAMPLER_KINDS = ("uniform", "log_uniform", "unigram")
CATALOGUE_CHUNK = 8192  # items per chunk of the exact softmax (chunked_softmax_loss): [rows, chunk] fp32 at a time


def readout(interests: Tensor, target_emb: Tensor, soft: Tensor | float = 0.0) -> Tensor:
    """ComiRec's hard readout: per row, the interest with the largest inner product with the target.

    ``interests [B, K, d]``, ``target_emb [B, d]`` -> ``[B, d]``. The choice (argmax) carries no
    gradient; the gradient flows into the chosen interest only. ``K = 1`` returns the single
    interest.

    ``soft`` (a float or a 0-d device tensor in ``[0, 1]``, so a CUDA graph can change it between
    replays) blends in the soft readout ``sum_k softmax_k(<v_k, e>) v_k`` (MIND's label-aware
    attention with power 1): ``(1 - soft) · hard + soft · soft_readout``. The soft part sends
    gradient to every interest in proportion to how well it matches the target, so interests
    that lose every argmax early still learn (``train.soft_readout_steps``).
    """
    if interests.dim() != 3 or target_emb.dim() != 2:
        raise ValueError(
            f"readout: expected interests [B, K, d] and target_emb [B, d], "
            f"got {tuple(interests.shape)} and {tuple(target_emb.shape)}"
        )
    batch, _, dim = interests.shape
    if target_emb.shape != (batch, dim):
        raise ValueError(
            f"readout: target_emb {tuple(target_emb.shape)} does not match interests "
            f"{tuple(interests.shape)} (want [{batch}, {dim}])"
        )
    if isinstance(soft, float) and soft == 0.0:
        with torch.no_grad():
            choice = torch.einsum("bkd,bd->bk", interests, target_emb).argmax(dim=1)  # [B]
        return interests[torch.arange(batch, device=interests.device), choice]  # [B, d]
    match = torch.einsum("bkd,bd->bk", interests, target_emb.detach())  # [B, K]
    hard = interests[torch.arange(batch, device=interests.device), match.detach().argmax(dim=1)]
    weights = torch.softmax(match.float(), dim=1).to(interests.dtype)  # [B, K]
    return hard + soft * (torch.einsum("bk,bkd->bd", weights, interests) - hard)


def readouts(
    interests: Tensor,
    target_emb: Tensor,
    *,
    soft: Tensor | float = 0.0,
    max_scores: bool = False,
    state_interest: bool = False,
) -> list[tuple[Tensor, Tensor | None]]:
    """The user vectors a step's loss reads, each with the interests that score its negatives.

    ``interests [R, K, d]``, ``target_emb [R, d]`` -> ``[(user [R, d], interests [R, K', d] or None)]``:
    one pair, :func:`readout` over the ``K`` interests, whose negatives are scored by their best
    match where ``max_scores`` (``train.negative_readout = "max"``); with ``state_interest`` two:
    interest 0 alone (the encoder's next-click state, trained on every target as a single-interest
    model is, negatives scored by it), then :func:`readout` over interests ``1 .. K - 1``.
    """
    if not state_interest:
        return [(readout(interests, target_emb, soft), interests if max_scores else None)]
    rest = interests[:, 1:]
    return [(interests[:, 0], None), (readout(rest, target_emb, soft), rest if max_scores else None)]


def attention_collision(scores: Tensor, lengths: Tensor) -> Tensor:
    """Mean over rows and interests of ``sum_l A_bkl²``: the routing regulariser (``train.attention_reg``).

    ``scores [B, L, K]`` attention logits, ``lengths [B]`` -> scalar. ``A = softmax over the valid
    positions``; ``sum_l A²`` is the probability that two clicks drawn from ``A`` coincide, 1
    for an interest that reads one click and ``1 / n`` for one that reads ``n`` clicks evenly
    (``1 / sum_l A²`` is the Rényi-2 effective number of clicks). Rows of length 0 count 0.

    Xie et al. (RecSys 2023, "REMI") penalise the variance of each interest's attention over
    positions; for a distribution over ``n`` positions that variance is ``(sum_l A² - 1/n) / n``
    so both push towards reading several clicks; the collision form needs no padding
    convention and its value reads directly as an inverse click count.
    """
    a = length_softmax(scores, lengths)  # [B, L, K], fp32
    return a.square().sum(dim=1).mean()


def interest_cosine(interests: Tensor, margin: float = -1.0, count: Tensor | None = None) -> Tensor:
    """Mean over rows and pairs of interests of ``max(0, cos - margin)``: the interest regulariser
    (``train.interest_reg``, ``train.interest_margin``). With ``margin = -1`` it is the mean
    pairwise cosine the health metrics report as ``mi_cosine``, plus one.

    ``interests [R, K, d]`` (``K >= 2``) -> scalar. A pair less alike than ``margin`` costs
    nothing, so the term only parts interests that point nearly the same way and leaves the rest
    to the recall. A row with a zero interest (a fully padded prefix of dense training) is not
    counted and sends no gradient (:func:`~recsys.nn.multi_interest.interest_cosines`).

    ``count`` (0-d, optional): what the sum over rows divides by instead of the rows counted; under
    DDP the global batch's rows over the number of processes (:func:`masked_mean`).
    """
    k = interests.shape[1]
    cos, ok = interest_cosines(interests)  # [R, K, K], [R]
    # off the diagonal, by a product rather than a boolean index, which would sync with the host
    # and break the step's CUDA graph capture
    pairs = 1.0 - torch.eye(k, dtype=cos.dtype, device=cos.device)  # [K, K]
    excess = (torch.relu(cos - margin) * pairs).sum(dim=(1, 2)) / (k * (k - 1))  # [R]
    return masked_mean(excess, ok, count)


def masked_mean(x: Tensor, mask: Tensor, count: Tensor | None = None) -> Tensor:
    """``x [R]`` averaged over the rows where ``mask [R]`` is True: their sum over ``count``, by
    default the number of them (at least 1). Masked rows enter through ``torch.where``, so they
    get exactly zero gradient whatever their values.

    Under DDP the ranks' valid rows differ in number, so their own means would weigh the rows of
    a rank with fewer more than one process does; with ``count`` = the global batch's valid rows
    over the number of processes (a 0-d device tensor: no host sync), each rank's value is its
    share of the global mean times the number of processes, and DDP's average of the ranks'
    gradients (and the row-sparse table's, :meth:`recsys.items.RowSparseTable.collect`)
    is the gradient of the global mean (:meth:`recsys.train.step.TrainStep.counts`)."""
    return torch.where(mask, x, 0.0).sum() / (mask.sum().clamp(min=1) if count is None else count)


def interest_proposal(interests: Tensor, item_emb: Tensor, temperature: float = 1.0) -> Tensor:
    """The hard-negative proposal ``q(j) = mean over (b, k) of softmax_j(<v_bk, e_j> / T)``.

    ``interests [B, K, d]``, ``item_emb [N, d]`` -> ``[N]`` fp32 probabilities, ``q(0) = 0``
    (padding). Detached: the proposal is a sampling distribution, not part of the model.
    Items close to any interest of the batch are likely, so the sampled softmax sees the
    negatives that retrieval would confuse with the targets. Memory: ``B · K · N`` floats.
    """
    with torch.no_grad():
        users = interests.reshape(-1, interests.shape[-1])  # [B K, d]
        logits = (users @ item_emb[1:].T).float() / temperature  # [B K, N - 1]
        q = torch.softmax(logits, dim=1).mean(dim=0)  # [N - 1]
        return torch.cat([q.new_zeros(1), q])


def draw_from(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF draws: ``probs [N]`` (sums to 1), ``uniforms [S]`` in ``[0, 1)`` -> ids ``[S]``.

    Never returns an id of probability 0 (``searchsorted`` with ``right=True`` skips flat CDF
    steps); no host sync, so it can run inside a CUDA graph with the uniforms as input.
    """
    cdf = torch.cumsum(probs.double(), 0)
    u = uniforms.double() * cdf[-1]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[0] - 1)


def mixture_log_expected_count(ids: Tensor, base: Sampler, num_base: int, hard_probs: Tensor, num_hard: int) -> Tensor:
    """``log E[count of id]`` among ``num_base`` draws from ``base`` and ``num_hard`` from ``hard_probs``.

    ``ids [...]`` long -> ``[...]`` fp32 ``log(num_base · p(id) + num_hard · q(id))``: the exact
    logQ term of a stratified mixture proposal (the two groups' expected counts add).
    """
    log_base = base.log_prob(ids).float() + math.log(num_base) if num_base else None
    log_hard = torch.log(hard_probs[ids]) + math.log(num_hard)
    return log_hard if log_base is None else torch.logaddexp(log_base, log_hard)


class Sampler:
    """A distribution over item ids ``1 .. num_items - 1`` (id 0 is padding, never drawn).

    Subclasses implement :meth:`sample` and :meth:`log_prob`; tables live on the CPU and are
    copied once per device on first use.
    """

    kind: str = ""

    def __init__(self, num_items: int) -> None:
        if num_items < 2:
            raise ValueError(f"num_items: need at least 2 (padding + one item), got {num_items}")
        self.num_items = num_items

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ) -> Tensor:
        """``n`` independent draws (with replacement) -> ids ``[n]`` long on ``device``.

        ``generator`` (on ``device``) makes the draws reproducible; ``None`` uses torch's
        default generator for that device. Runs entirely on ``device``.
        """
        raise NotImplementedError

    def log_prob(self, ids: Tensor) -> Tensor:
        """``ids [...]`` long -> ``[...]`` float32: ``log p(id)`` of a single draw."""
        raise NotImplementedError

    def log_expected_count(self, ids: Tensor, num_sampled: int) -> Tensor:
        """``ids [...]`` long -> ``[...]`` float32: ``log(num_sampled * p(id))`` (the logQ term)."""
        return self.log_prob(ids) + math.log(num_sampled)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_items={self.num_items})"


class UniformSampler(Sampler):
    """``p(id) = 1 / (num_items - 1)`` for ``id`` in ``1 .. num_items - 1``."""

    kind = "uniform"

    def sample(self, n: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> Tensor:
        return torch.randint(1, self.num_items, (n,), generator=generator, device=device)

    def log_prob(self, ids: Tensor) -> Tensor:
        return torch.full(ids.shape, -math.log(self.num_items - 1), device=ids.device)


class LogUniformSampler(Sampler):
    """Zipfian prior over popularity-ranked ids (TensorFlow's ``log_uniform_candidate_sampler``).

    ``p(id) = (log(id + 1) - log(id)) / log(num_items)`` for ``id`` in ``1 .. num_items - 1``
    (TensorFlow's formula with its class ``c = id - 1``, ``range_max = num_items - 1``). It suits
    our ids, which rank items by falling popularity. One draw is ``floor(exp(u log num_items))``
    with ``u ~ U[0, 1)``: the inverse CDF in closed form.
    """

    kind = "log_uniform"

    def sample(self, n: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> Tensor:
        u = torch.rand(n, generator=generator, device=device, dtype=torch.float64)
        ids = torch.exp(u * math.log(self.num_items)).long()  # floor, in 1 .. num_items - 1
        return ids.clamp_(1, self.num_items - 1)  # guards exp() rounding up to num_items

    def log_prob(self, ids: Tensor) -> Tensor:
        x = ids.to(torch.float64)
        p = torch.log1p(1.0 / x) / math.log(self.num_items)
        return torch.log(p).float()


class UnigramSampler(Sampler):
    """``p(id)`` proportional to ``item_counts[id] ** alpha`` (word2vec's unigram^0.75).

    Drawn by inverse CDF (``cumsum`` + ``searchsorted`` on one uniform per draw). Items with a
    zero count have probability 0 (``log_prob`` = ``-inf``) and are never drawn.
    """

    kind = "unigram"

    def __init__(self, num_items: int, item_counts: Tensor | np.ndarray, alpha: float = 0.75) -> None:
        super().__init__(num_items)
        counts = torch.as_tensor(np.asarray(item_counts), dtype=torch.float64)
        if counts.shape != (num_items,):
            raise ValueError(
                f"item_counts: expected shape [{num_items}] (one count per id, row 0 = padding), "
                f"got {tuple(counts.shape)}"
            )
        if not torch.isfinite(counts).all() or (counts < 0).any():
            raise ValueError("item_counts: counts must be finite and >= 0")
        if alpha < 0:
            raise ValueError(f"alpha: must be >= 0, got {alpha}")
        weights = counts[1:].pow(alpha) * (counts[1:] > 0)  # 0 ** 0 would give weight 1
        total = weights.sum()
        if total <= 0:
            raise ValueError("item_counts: every item (ids 1..num_items-1) has count 0")
        self.alpha = alpha
        cum = torch.cumsum(weights, 0)
        self._cdf = cum / cum[-1]  # [num_items - 1], last entry exactly 1.0
        log_p = torch.full((num_items,), -math.inf, dtype=torch.float64)
        log_p[1:] = torch.log(weights / total)
        self._log_p = log_p.float()  # [num_items]; padding row -inf
        self._on_device: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def _tables(self, device: torch.device) -> tuple[Tensor, Tensor]:
        if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0": one copy
            device = torch.device("cuda", torch.cuda.current_device())
        if device not in self._on_device:
            self._on_device[device] = (self._cdf.to(device), self._log_p.to(device))
        return self._on_device[device]

    def sample(self, n: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> Tensor:
        cdf, _ = self._tables(torch.device(device))
        u = torch.rand(n, generator=generator, device=cdf.device, dtype=torch.float64)
        # first index with cdf > u: never a zero-weight item, never past the end as u < 1 = cdf[-1]
        return torch.searchsorted(cdf, u, right=True) + 1

    def log_prob(self, ids: Tensor) -> Tensor:
        _, log_p = self._tables(ids.device)
        return log_p[ids]


def make_sampler(
    kind: str,
    num_items: int,
    item_counts: Tensor | np.ndarray | None = None,
    alpha: float = 0.75,
) -> Sampler:
    """Build a sampler by name (``train.sampler``): ``uniform``, ``log_uniform`` or ``unigram``.

    ``item_counts [num_items]`` (click counts, row 0 = padding) is required by ``unigram``;
    ``alpha`` is its exponent (``train.sampler_alpha``).
    """
    if kind == "uniform":
        return UniformSampler(num_items)
    if kind == "log_uniform":
        return LogUniformSampler(num_items)
    if kind == "unigram":
        if item_counts is None:
            raise ValueError("train.sampler = 'unigram' needs item_counts (click counts per item id)")
        return UnigramSampler(num_items, item_counts, alpha)
    raise ValueError(f"train.sampler: unknown sampler {kind!r}; known: {', '.join(SAMPLER_KINDS)}")


@dataclass(frozen=True)
class LossOutput:
    """What a softmax loss returns. All fields are tensors; none forces a host sync.

    ``loss``: scalar, mean cross-entropy + ``z_loss * mean(log_z ** 2)`` (differentiable).
    ``log_z``: scalar, detached batch mean of the log-partition (per-row logsumexp of the logits).
    ``max_logit``: scalar, detached largest logit in the batch.

    With a ``mask`` (bool ``[B]``, False = padding row) every mean and the max run over the valid
    rows only; with no valid row the loss and ``log_z`` are 0 and ``max_logit`` is ``-inf``.
    """

    loss: Tensor
    log_z: Tensor
    max_logit: Tensor


def _check_user_items(name: str, user: Tensor, target: Tensor, item_emb: Tensor, mask: Tensor | None = None) -> None:
    if mask is not None and (mask.dtype != torch.bool or mask.shape != (user.shape[0],)):
        raise ValueError(f"{name}: mask must be bool [{user.shape[0]}], got {mask.dtype} {tuple(mask.shape)}")
    if user.dim() != 2 or item_emb.dim() != 2 or user.shape[1] != item_emb.shape[1]:
        raise ValueError(
            f"{name}: expected user [B, d] and item_emb [N, d], got {tuple(user.shape)} and {tuple(item_emb.shape)}"
        )
    if target.shape != (user.shape[0],) or target.dtype != torch.long:
        raise ValueError(f"{name}: target must be long [{user.shape[0]}], got {target.dtype} {tuple(target.shape)}")


def _finish(
    logits: Tensor, target_col: Tensor, z_loss: float, mask: Tensor | None = None, count: Tensor | None = None
) -> LossOutput:
    """``logits [B, C]`` float32, ``target_col [B]`` column of each row's target, ``mask [B]`` bool
    or None -> LossOutput.

    Masked rows' logits are set to 0 before the logsumexp: a padding row can hold infinite logits
    (id 0 has ``log q = -inf`` under the unigram sampler), and its softmax would turn the zero
    upstream gradient into NaN.
    """
    if mask is not None:
        logits = logits.masked_fill(~mask[:, None], 0.0)
    log_z = torch.logsumexp(logits, dim=1)  # [B]
    ce = log_z - logits.gather(1, target_col[:, None]).squeeze(1)  # [B]
    return _reduce(ce, log_z, logits.detach().amax(dim=1), z_loss, mask, count)


def _reduce(
    ce: Tensor, log_z: Tensor, row_max: Tensor, z_loss: float, mask: Tensor | None, count: Tensor | None = None
) -> LossOutput:
    """Per-row cross-entropy, log-partition and largest logit (``[B]`` float32 each) -> LossOutput,
    averaged over the rows where ``mask [B]`` is True (every row when None; :func:`masked_mean`
    with ``count``), the z-loss and ``log_z`` as the cross-entropy."""

    def mean(x: Tensor) -> Tensor:
        return x.mean() if mask is None else masked_mean(x, mask, count)

    loss = mean(ce)
    if z_loss > 0:
        loss = loss + z_loss * mean(log_z.square())
    if mask is not None:
        row_max = row_max.masked_fill(~mask, -math.inf)
    return LossOutput(loss=loss, log_z=mean(log_z.detach()), max_logit=row_max.detach().max())


def sampled_softmax_loss(
    user: Tensor,
    target: Tensor,
    item_emb: Tensor,
    negatives: Tensor,
    *,
    log_q_target: Tensor | None = None,
    log_q_neg: Tensor | None = None,
    remove_accidental_hits: bool = True,
    z_loss: float = 0.0,
    interests: Tensor | None = None,
    backend: str = "auto",
    mask: Tensor | None = None,
    count: Tensor | None = None,
) -> LossOutput:
    """Softmax cross-entropy over each row's target and ``S`` negatives shared by the batch.

    Args:
        user: ``[B, d]`` user vectors (after :func:`readout`).
        target: ``[B]`` long, each row's positive item id.
        item_emb: ``[N, d]`` item embeddings (tied input/output table; row 0 = padding).
        negatives: ``[S]`` long, sampled ids shared by all rows.
        log_q_target: ``[B]`` log expected count of each target
            (:meth:`Sampler.log_expected_count`); subtracted from the target logit.
        log_q_neg: ``[S]`` log expected count of each negative; subtracted from its logits.
        remove_accidental_hits: a negative equal to the row's target gets logit ``-inf``, so a
            row's own positive never counts as its negative.
        z_loss: weight of ``mean(log_z ** 2)`` added to the loss (0 disables).
        interests: ``[B, K, d]`` or ``[B / m, K, d]`` (optional, ``train.negative_readout =
            "max"``): score each negative by its best-matching interest, ``max_k <v_bk, e_neg>``,
            instead of by ``user``; see :func:`negative_logits`.
        backend: kernel backend of that max score (``"auto" | "triton" | "torch"``).
        mask: ``[B]`` bool (optional): False rows are padding (dense training's empty positions,
            target id 0 allowed): left out of every mean, exactly zero gradient.
        count: 0-d (optional, with ``mask``): what the means divide by instead of the valid rows
            (:func:`masked_mean`; under DDP, so that the ranks' gradients average to one process's).

    Row ``b``'s logits are ``[u_b . e_target_b, u_b . e_neg_1, ..., u_b . e_neg_S]`` (minus the
    logQ terms), computed by the matmul in the ambient (autocast) precision and then cast to
    float32 for the logsumexp. Ids are not range-checked (that would sync the host).
    """
    _check_user_items("sampled_softmax_loss", user, target, item_emb, mask)
    if negatives.dim() != 1 or negatives.dtype != torch.long:
        raise ValueError(f"negatives: must be long [S], got {negatives.dtype} {tuple(negatives.shape)}")
    # one gather for targets and negatives: on the CPU its backward allocates one [N, d]
    # gradient buffer instead of two
    rows = item_emb[torch.cat([target, negatives])]  # [B + S, d]
    pos = (user * rows[: target.shape[0]]).sum(dim=1).float()  # [B]
    neg = negative_logits(user, rows[target.shape[0] :], interests, backend=backend)  # [B, S]
    logits = _sampled_logits(pos, neg, target, negatives, log_q_target, log_q_neg, remove_accidental_hits)
    return _finish(logits, torch.zeros_like(target), z_loss, mask, count)


def _sampled_logits(
    pos: Tensor,
    neg: Tensor,
    target: Tensor,
    negatives: Tensor,
    log_q_target: Tensor | None,
    log_q_neg: Tensor | None,
    remove_accidental_hits: bool,
) -> Tensor:
    """``[B, 1 + S]`` logits of :func:`sampled_softmax_loss`: each row's target logit ``pos [B]``,
    then its negatives' ``neg [B, S]``, each minus its log expected count where given (the logQ
    correction of the module docstring) and, with ``remove_accidental_hits``, a negative equal to
    the row's ``target`` at ``-inf``."""
    if log_q_target is not None:
        if log_q_target.shape != target.shape:
            raise ValueError(f"log_q_target: expected [{target.shape[0]}], got {tuple(log_q_target.shape)}")
        pos = pos - log_q_target.float()
    if log_q_neg is not None:
        if log_q_neg.shape != negatives.shape:
            raise ValueError(f"log_q_neg: expected [{negatives.shape[0]}], got {tuple(log_q_neg.shape)}")
        neg = neg - log_q_neg.float()[None, :]
    if remove_accidental_hits:
        neg = neg.masked_fill(negatives[None, :] == target[:, None], -math.inf)
    return torch.cat([pos[:, None], neg], dim=1)


def full_softmax_loss(
    user: Tensor,
    target: Tensor,
    item_emb: Tensor,
    *,
    z_loss: float = 0.0,
    interests: Tensor | None = None,
    backend: str = "auto",
    mask: Tensor | None = None,
    count: Tensor | None = None,
) -> LossOutput:
    """Exact softmax cross-entropy over the whole catalogue, padding row 0 excluded.

    ``user [B, d]``, ``target [B]`` long in ``1 .. N - 1``, ``item_emb [N, d]``. Logits
    ``[B, N - 1]`` are ``user @ item_emb[1:].T`` cast to float32. For small catalogues. With
    ``interests [B, K, d]`` every other item is scored by its best-matching interest
    (:func:`negative_logits`, on kernel ``backend``) and the target keeps ``<user, e_target>``.
    ``mask [B]`` bool: False rows are padding (any target, 0 included): left out of every mean,
    exactly zero gradient; ``count``: as in :func:`sampled_softmax_loss`. :func:`chunked_softmax_loss`
    is the same loss without the ``[B, N]`` logits.
    """
    _check_user_items("full_softmax_loss", user, target, item_emb, mask)
    target_col = target - 1 if mask is None else torch.where(mask, target - 1, 0)  # [B]
    logits = negative_logits(user, item_emb[1:], interests, backend=backend)  # [B, N - 1]
    if interests is not None:  # the target's own logit is the readout's
        pos = (user * item_emb[target]).sum(dim=1, keepdim=True).float()  # [B, 1]
        logits = logits.scatter(1, target_col[:, None], pos)
    return _finish(logits, target_col, z_loss, mask, count)


def chunked_softmax_loss(
    user: Tensor,
    target: Tensor,
    item_emb: Tensor,
    *,
    mask: Tensor | None = None,
    count: Tensor | None = None,
    z_loss: float = 0.0,
    chunk_size: int = CATALOGUE_CHUNK,
    interests: Tensor | None = None,
    backend: str = "auto",
) -> LossOutput:
    """:func:`full_softmax_loss` without holding the ``[R, N]`` logits (the idea of Cut
    Cross-Entropy, Wijmans et al., 2024): on the fused kernel, or ``chunk_size`` items at a time.

    Dense training has ``R = B * L`` targets (every position of a window), where ``[R, N]`` fp32
    logits outgrow the GPU at catalogue sizes that the model itself handles easily.

    Args:
        user: ``[R, d]`` user vectors (after :func:`readout`), one per target.
        target: ``[R]`` long, item ids in ``1 .. N - 1`` (any id on a masked row).
        item_emb: ``[N, d]``; row 0 is padding and takes no part in the softmax.
        mask: ``[R]`` bool (optional); False rows are padding: left out of every mean, exactly
            zero gradient.
        count: 0-d (optional, with ``mask``): what the means divide by, as in :func:`sampled_softmax_loss`.
        z_loss: weight of ``mean(log_z ** 2)``.
        chunk_size: items per chunk of the torch loop; its largest transient is
            ``[R, chunk_size]`` fp32 (and ``[R, K, chunk_size]`` for ``interests`` on the torch
            twin).
        interests: ``[R, K, d]`` or ``[R / m, K, d]`` (optional): every item but the target scored by its
            best-matching interest, as in :func:`full_softmax_loss`.
        backend: kernel backend of that max score.

    The target's logit is ``<user, e_target>``; the catalogue's logsumexp comes from the Triton
    kernels of :func:`recsys.kernels.catalogue_logsumexp` where they run (CUDA in fp16/bf16, the
    interpreter; ``chunk_size`` does not apply there: the logits only exist tile by tile in
    registers), else from an autograd Function that keeps one running fp32 logsumexp per row and
    recomputes each chunk's logits in the backward (:class:`_CatalogueLogSumExp`; always with
    ``interests``); the cross-entropy, the mask and the z-loss are composed on the ``[R]``
    results by ordinary autograd. Nothing syncs the host, so the loss can be captured in a CUDA
    graph; ids are not range-checked (that would sync).
    """
    _check_user_items("chunked_softmax_loss", user, target, item_emb, mask)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunked_softmax_loss: chunk_size must be an int >= 1, got {chunk_size!r}")
    pos = (user * item_emb[target]).sum(dim=1).float()  # [R]
    if interests is None and uses_kernel(user, item_emb[1:], backend=backend):  # no logits in memory at all
        log_z, row_max = catalogue_logsumexp(user, item_emb[1:], backend=backend)
    elif interests is None:  # the target's column of user @ item_emb.T is pos already
        log_z, row_max = _CatalogueLogSumExp.apply(user, item_emb, None, None, chunk_size, backend)
    else:  # the target is left out of the max-scored items and enters with its readout logit
        lse_others, row_max = _CatalogueLogSumExp.apply(user, item_emb, target, interests, chunk_size, backend)
        log_z = torch.logaddexp(lse_others, pos)  # [R]
        row_max = torch.maximum(row_max, pos.detach())
    return _reduce(log_z - pos, log_z, row_max, z_loss, mask, count)


def _chunk_logits(
    user: Tensor, items: Tensor, first: int, exclude: Tensor | None, interests: Tensor | None, backend: str
) -> Tensor:
    """Float32 logits ``[R, C]`` (:func:`negative_logits`) of ``items [C, d]``, the rows of ids
    ``first .. first + C - 1``; with ``exclude [R]`` ids, each row's excluded id at ``-inf``."""
    logits = negative_logits(user, items, interests, backend=backend)
    if exclude is None:
        return logits
    ids = torch.arange(first, first + items.shape[0], device=exclude.device)  # [C]
    return logits.masked_fill(ids[None, :] == exclude[:, None], -math.inf)


class _CatalogueLogSumExp(torch.autograd.Function):
    """``(lse [R], row_max [R])``, fp32: logsumexp and max over items ``j`` in ``1 .. N - 1``
    (``j != exclude_r`` when ``exclude [R]`` is given) of :func:`negative_logits`, one chunk of
    items at a time.

    The forward keeps a running logsumexp and max per row and saves only ``lse``; the backward
    recomputes each chunk's logits under the forward's autocast state and sends
    ``grad_lse_r * softmax_rj`` back through them (``torch.autograd.grad`` of the chunk, so the
    max score's kernel backward is reused), writing that chunk's rows of ``d_item_emb`` and
    adding into ``d_user`` (or ``d_interests``) in fp32. ``row_max`` is not differentiable.
    """

    @staticmethod
    def forward(
        ctx: Any,
        user: Tensor,
        item_emb: Tensor,
        exclude: Tensor | None,
        interests: Tensor | None,
        chunk_size: int,
        backend: str,
    ) -> tuple[Tensor, Tensor]:
        device_type = user.device.type
        ctx.autocast = {
            "device_type": device_type,
            "dtype": torch.get_autocast_dtype(device_type),
            "enabled": torch.is_autocast_enabled(device_type),
            "cache_enabled": False,
        }
        ctx.chunk_size, ctx.backend = chunk_size, backend
        lse = torch.full((user.shape[0],), -math.inf, device=user.device)  # [R]
        row_max = torch.full_like(lse, -math.inf)
        for first in range(1, item_emb.shape[0], chunk_size):  # row 0 is padding
            items = item_emb[first : first + chunk_size]  # [C, d]
            logits = _chunk_logits(user, items, first, exclude, interests, backend)  # [R, C]
            lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=1))
            row_max = torch.maximum(row_max, logits.amax(dim=1))
        ctx.save_for_backward(user, item_emb, exclude, interests, lse)
        ctx.mark_non_differentiable(row_max)
        return lse, row_max

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_lse: Tensor, _grad_row_max: Tensor) -> tuple[Tensor | None, ...]:
        user, item_emb, exclude, interests, lse = ctx.saved_tensors
        scored = user if interests is None else interests  # what the logits differentiate into
        leaf = scored.detach().requires_grad_()
        user_in, interests_in = (leaf, None) if interests is None else (user.detach(), leaf)
        d_scored = torch.zeros_like(scored, dtype=torch.float32)
        d_items = torch.zeros_like(item_emb)  # row 0 (padding) keeps 0
        # an excluded id's logit is -inf and exp(-inf - lse) may be NaN (lse = -inf when the target
        # is a row's only item), but masked_fill's backward drops those entries
        lse = lse[:, None]  # [R, 1]
        with torch.enable_grad(), torch.autocast(**ctx.autocast):
            for first in range(1, item_emb.shape[0], ctx.chunk_size):
                items = item_emb[first : first + ctx.chunk_size].detach().requires_grad_()  # [C, d]
                logits = _chunk_logits(user_in, items, first, exclude, interests_in, ctx.backend)  # [R, C]
                grad_logits = torch.sub(logits.detach(), lse).exp_().mul_(grad_lse[:, None])  # [R, C]
                d_leaf, d_chunk = torch.autograd.grad(logits, (leaf, items), grad_logits)
                d_scored += d_leaf
                d_items[first : first + ctx.chunk_size] = d_chunk
        if interests is None:
            return d_scored.to(user.dtype), d_items, None, None, None, None
        return None, d_items, None, d_scored.to(interests.dtype), None, None


def negative_logits(user: Tensor, items: Tensor, interests: Tensor | None = None, *, backend: str = "auto") -> Tensor:
    """``user [B, d]``, ``items [S, d]`` -> float32 logits ``[B, S]`` of the items as negatives.

    Without ``interests``: ``user @ items.T`` (ComiRec: the interest the readout chose for the
    row's target scores every negative). With ``interests [B, K, d]``: ``max_k <v_bk, e_s>``,
    the score retrieval ranks candidates by (the best of a user's interests), so an interest
    that ranks a wrong item high is pushed down even on rows whose target it did not win. The
    gradient of each negative goes to its best-matching interest
    (:func:`recsys.kernels.max_interest_scores` on kernel ``backend``: on CUDA without the
    ``[B, K, S]`` product).

    ``interests`` may also be ``[B / m, K, d]``: each of its rows then serves ``m`` consecutive
    rows of ``user`` (``train.predict_next``: a history's m following clicks share its interests),
    and its scores are computed once and repeated instead of m times.
    """
    if interests is None:
        return (user @ items.T).float()
    rows = interests.shape[0]
    if interests.dim() != 3 or rows == 0 or user.shape[0] % rows or interests.shape[2] != user.shape[1]:
        raise ValueError(
            f"interests: expected [{user.shape[0]} / m, K, {user.shape[1]}] (m >= 1 rows of user each), "
            f"got {tuple(interests.shape)}"
        )
    scores = max_interest_scores(interests, items, backend=backend).float()  # [B / m, S]
    return scores if rows == user.shape[0] else scores.repeat_interleave(user.shape[0] // rows, dim=0)
