"""Multi-interest health: does each of the K interests read several clicks and win some targets?

A model "collapses" when its interests stop being distinct summaries of the history: each
interest's attention lands on one click (routing collapse), one interest wins every target in
the readout or the retrieval, or the K vectors point the same way. :func:`interest_health` measures all of it on
evaluation users (logged to ``metrics.jsonl`` at every validation, printed by
``recsys inspect``). Definitions, per evaluation user ``u`` with input clicks ``1..n``:

- ``A_u [n, K]``: each interest's attention over the input clicks (comirec_sa, sasrec_mi; for the
  capsule models mind and comirec_dr, each capsule's share of every click, ``w_kl / sum_l w_kl``
  from the last routing iteration). ``entropy_k = -sum_l A_lk log A_lk``;
  **effective clicks** ``= exp(entropy_k)`` (1: the interest reads one click; ``n``: it reads
  all evenly). Averaged over users with at least 2 input clicks.
- **readout share** of interest ``k``: the share of the users' truth clicks whose best interest
  (largest inner product, ComiRec's readout) is ``k``. ``1 / K`` each when balanced.
- **served share** of interest ``k``: the share of the items a user is served (the top
  ``served_n`` of an exact search where each item scores its best inner product over the ``K``
  interests, ComiRec's max-merge; the user's input excluded where the evaluation excludes it)
  whose best interest is ``k``, pooled over users. An interest with no share retrieves nothing
  anyone sees, however distinct it looks.
- **interest cosine**: the mean pairwise cosine of a user's K interests (``K >= 2``).
- **planted recovery** (synthetic data only, where each user's planted categories are known):
  for each interest, its top ``top_m`` items by inner product over the catalogue; the
  interest's category is the most frequent category among them (ties: the smallest category
  id). A user's recovery is the share of its planted categories that are the category of some
  interest; the mean over users is reported, beside ``planted_in_input``, the share of planted
  categories that occur at all among the user's input clicks (what a model could recover), and
  ``planted_recovery_of_present``, the recovery counted over those present categories only
  (users with at least one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from recsys.config import Config, RetrievalConfig, require_resolved
from recsys.device import model_device
from recsys.evaluate.evaluator import eval_mode, history_block
from recsys.kernels import length_softmax
from recsys.nn.multi_interest import interest_cosines
from recsys.retrieval.index import Retriever

if TYPE_CHECKING:
    from recsys.data.split import EvalSet
    from recsys.models.base import InterestModel

__all__ = ["attention_weights", "effective_clicks", "health_with_config", "interest_health", "majority_categories"]

Add = Callable[[str, Tensor], None]  # adds a tensor into the named running sum
_SCORE_BUDGET = 1 << 25  # most query x item scores held at once by majority_categories (128 MiB in fp32)


def attention_weights(scores: Tensor, lengths: Tensor) -> Tensor:
    """Attention logits ``[B, L, K]`` -> weights ``[B, L, K]`` (softmax over valid clicks, 0 elsewhere)."""
    return length_softmax(scores, lengths)


def effective_clicks(attn: Tensor) -> Tensor:
    """Attention weights ``[B, L, K]`` -> ``[B, K]``: exp of each interest's entropy over the clicks."""
    return torch.exp(-(attn * torch.log(attn.clamp_min(1e-30))).sum(dim=1))


def majority_categories(interests: Tensor, item_emb: Tensor, item_category: Tensor, top_m: int) -> Tensor:
    """Each interest's category: the most frequent among its ``top_m`` items.

    ``interests [B, K, d]``, ``item_emb [N, d]`` (row 0 padding, never counted),
    ``item_category [N]`` long -> ``[B, K]`` long (ties: the smallest category id).
    """
    b, k, _ = interests.shape
    queries, items = interests.reshape(b * k, -1).float(), item_emb[1:].float()
    rows = max(1, _SCORE_BUDGET // max(1, items.shape[0]))  # queries per chunk: bounded memory on any catalogue
    top = (
        torch.cat(
            [
                (queries[i : i + rows] @ items.T).topk(min(top_m, items.shape[0]), dim=1).indices
                for i in range(0, b * k, rows)
            ]
        )
        + 1
    )  # [B K, M] item ids
    cats = item_category[top]  # [B K, M]
    counts = torch.zeros(b * k, int(item_category.max()) + 1, device=cats.device)
    counts.scatter_add_(1, cats, torch.ones_like(cats, dtype=counts.dtype))
    return counts.argmax(dim=1).reshape(b, k)  # argmax returns the first maximum


def interest_health(
    model: InterestModel,
    eval_set: EvalSet,
    *,
    max_users: int = 2048,
    batch_size: int = 512,
    item_category: np.ndarray | None = None,
    planted: list[set[int]] | None = None,
    top_m: int = 20,
    served_n: int = 50,
    exclude_history: bool = False,
) -> dict[str, float]:
    """The health metrics of the module docstring on the first ``max_users`` users of ``eval_set``.

    Args:
        model: the model (put in eval mode for the call; its mode is restored).
        eval_set: inputs ``[U, L]``, lengths ``[U]`` and truth CSR.
        item_category: ``[num_items]`` category ids, needed with ``planted``.
        planted: per evaluation user (aligned with ``eval_set.users``), the set of planted
            category ids in the dataset's category numbering.
        top_m: items per interest that vote for its category.
        served_n: the length of the served list whose items the served share attributes.
        exclude_history: the served list leaves out each user's input clicks (as
            ``eval.exclude_history`` does for the evaluation).

    Returns:
        ``{"mi_eff_clicks", "mi_eff_clicks_min", "mi_eff_clicks_k{i}", "mi_readout_share_min",
        "mi_readout_share_k{i}", "mi_served_share_min",
        "mi_served_share_k{i}", "mi_cosine", "mi_planted_recovery", "mi_planted_in_input",
        "mi_planted_recovery_of_present"}``,
        each present where it applies (attention models; ``K >= 2``; planted truth given); ``{}``
        for an empty ``eval_set``.
    """
    if min(max_users, batch_size, served_n) <= 0:
        got = f"{max_users}, {batch_size}, {served_n}"
        raise ValueError(f"interest_health: max_users, batch_size and served_n must be > 0, got {got}")
    sums: dict[str, Tensor] = {}

    def add(name: str, value: Tensor) -> None:
        sums[name] = sums[name] + value if name in sums else value

    with eval_mode(model), torch.no_grad():
        item_emb = model.item_embeddings()
        search = Retriever(item_emb, RetrievalConfig(backend="torch"))  # exact, where the model lives
        cat_t = None if item_category is None else torch.as_tensor(item_category, device=item_emb.device)
        for start, stop, seq, lengths in _batches(eval_set, min(max_users, len(eval_set.lengths)), batch_size, model):
            interests, scores = model.interests_with_attention(seq, lengths)  # [B, K, d], [B, L, K]
            interests = interests.float()
            if scores is not None:
                _add_attention(add, attention_weights(scores, lengths), lengths)
            _add_readout(add, interests, item_emb, eval_set, start, stop)
            if interests.shape[1] >= 2:
                _add_cosine(add, interests)
                exclude = history_block(eval_set, start, stop, seq.device) if exclude_history else None
                _add_served(add, search.top_items(interests, served_n, exclude)[2], interests.shape[1])
            if planted is not None and cat_t is not None:
                _add_planted(add, interests, item_emb, cat_t, seq, lengths, planted[start:stop], top_m)
    return _finish(sums)


def _batches(
    eval_set: EvalSet, users: int, batch_size: int, model: InterestModel
) -> Iterator[tuple[int, int, Tensor, Tensor]]:
    """The first ``users`` evaluation users, ``batch_size`` at a time: ``(start, stop, seq [B, L],
    lengths [B])``, the inputs on the model's device."""
    device = model_device(model)
    for start in range(0, users, batch_size):
        stop = min(start + batch_size, users)
        seq = torch.as_tensor(eval_set.inputs[start:stop], device=device)
        lengths = torch.as_tensor(eval_set.lengths[start:stop], device=device)
        yield start, stop, seq, lengths


def health_with_config(
    model: InterestModel,
    eval_set: EvalSet,
    cfg: Config,
    *,
    max_users: int = 2048,
    item_category: np.ndarray | None = None,
    planted: list[set[int]] | None = None,
) -> dict[str, float]:
    """:func:`interest_health` with the served list of the run's evaluation: its longest
    cutoff (``max(eval.topn)``) and its history exclusion (``eval.exclude_history``; ``cfg``
    resolved)."""
    require_resolved(cfg, "health_with_config", section="eval.")
    return interest_health(
        model,
        eval_set,
        max_users=max_users,
        item_category=item_category,
        planted=planted,
        served_n=max(cfg.eval.topn),
        exclude_history=bool(cfg.eval.exclude_history),
    )


def _add_attention(add: Add, attn: Tensor, lengths: Tensor) -> None:
    """Accumulate per-interest effective clicks over rows with >= 2 clicks."""
    rows = lengths >= 2
    add("attn_rows", rows.sum().double())
    add("eff_clicks", effective_clicks(attn)[rows].sum(dim=0).double())  # [K]


def _add_cosine(add: Add, interests: Tensor) -> None:
    """Accumulate the mean off-diagonal cosine of each user's interests (rows with non-zero interests)."""
    cos, ok = interest_cosines(interests)  # [B, K, K], [B]
    k = interests.shape[1]
    off = (cos.sum(dim=(1, 2)) - cos.diagonal(dim1=1, dim2=2).sum(dim=1)) / (k * (k - 1))  # [B]
    add("cos_rows", ok.sum().double())
    add("cos", off[ok].sum().double())


def _add_readout(add: Add, interests: Tensor, item_emb: Tensor, eval_set: EvalSet, start: int, stop: int) -> None:
    """Accumulate ``wins [K]``: how many truth clicks of users ``start:stop`` each interest reads out
    (the largest inner product with the clicked item, ComiRec's readout), from ``interests [B, K, d]``
    and ``item_emb [N, d]``."""
    device = interests.device
    indptr = np.asarray(eval_set.truth_indptr, dtype=np.int64)
    truth = torch.as_tensor(eval_set.truth_items[indptr[start] : indptr[stop]], device=device)
    owner = torch.repeat_interleave(
        torch.arange(stop - start, device=device),
        torch.as_tensor(np.diff(indptr[start : stop + 1]), device=device),
    )  # [T] the row of each truth click
    best = torch.einsum("tkd,td->tk", interests[owner], item_emb[truth].float()).argmax(dim=1)
    add("wins", torch.bincount(best, minlength=interests.shape[1]).double())


def _add_served(add: Add, served: Tensor, k: int) -> None:
    """Accumulate ``served [K]``: how many served items each of the ``k`` interests brought in, from
    each served item's interest ``[B, n]`` (-1 where a user has fewer than ``n`` items)."""
    add("served", torch.bincount(served[served >= 0], minlength=k).double())


def _add_planted(
    add: Add,
    interests: Tensor,
    item_emb: Tensor,
    item_category: Tensor,
    seq: Tensor,
    lengths: Tensor,
    planted: list[set[int]],
    top_m: int,
) -> None:
    """Accumulate planted recovery and the share of planted categories present in the input."""
    found = majority_categories(interests, item_emb, item_category, top_m).cpu().numpy()  # [B, K]
    valid = (torch.arange(seq.shape[1], device=seq.device)[None] < lengths[:, None]).cpu().numpy()
    input_cats = item_category[seq].cpu().numpy()
    recovered = present = of_present = rows_present = 0.0
    for row, cats in enumerate(planted):  # per user: set intersections of at most K elements
        got, seen = cats & set(found[row].tolist()), cats & set(input_cats[row][valid[row]].tolist())
        recovered += len(got) / len(cats)
        present += len(seen) / len(cats)
        if seen:
            of_present += len(got & seen) / len(seen)
            rows_present += 1
    for name, value in (
        ("planted_rows", float(len(planted))),
        ("planted", recovered),
        ("planted_in_input", present),
        ("planted_present_rows", rows_present),
        ("planted_of_present", of_present),
    ):
        add(name, torch.tensor(value, dtype=torch.float64))


def _finish(sums: dict[str, Tensor]) -> dict[str, float]:
    out: dict[str, float] = {}
    if "eff_clicks" in sums and float(sums["attn_rows"]) > 0:
        eff = (sums["eff_clicks"] / sums["attn_rows"]).tolist()
        out["mi_eff_clicks"] = float(np.mean(eff))
        out["mi_eff_clicks_min"] = float(np.min(eff))
        out.update({f"mi_eff_clicks_k{i}": v for i, v in enumerate(eff)})
    wins = sums.get("wins", torch.zeros(0))  # absent when no user was evaluated
    if len(wins) >= 2 and float(wins.sum()) > 0:
        share = (wins / wins.sum()).tolist()
        out["mi_readout_share_min"] = float(np.min(share))
        out.update({f"mi_readout_share_k{i}": v for i, v in enumerate(share)})
    served = sums.get("served", torch.zeros(0))
    if len(served) >= 2 and float(served.sum()) > 0:
        share = (served / served.sum()).tolist()
        out["mi_served_share_min"] = float(np.min(share))
        out.update({f"mi_served_share_k{i}": v for i, v in enumerate(share)})
    if "cos" in sums and float(sums["cos_rows"]) > 0:
        out["mi_cosine"] = float(sums["cos"] / sums["cos_rows"])
    if "planted" in sums and float(sums["planted_rows"]) > 0:
        out["mi_planted_recovery"] = float(sums["planted"] / sums["planted_rows"])
        out["mi_planted_in_input"] = float(sums["planted_in_input"] / sums["planted_rows"])
    if "planted" in sums and float(sums["planted_present_rows"]) > 0:
        out["mi_planted_recovery_of_present"] = float(sums["planted_of_present"] / sums["planted_present_rows"])
    return out
