"""New items' share of a top-``n`` list (``retrieval.new_item_share``).

An item without training clicks (a new item of the feature file) is scored by its features and the
id row its attributes predict (:mod:`recsys.items.features`), on a scale that training never set
against the clicked items: features order new items among themselves well, yet few reach a list of
the whole catalogue (docs/results.md, "New items"). Reserving a share of each list for them is how
retrieval systems give fresh items their first exposure. A list keeps every new item that earns
its place by score; where fewer than ``⌊share · n⌋`` do, the best-scoring new items the user has not
excluded take the places of the last clicked ones. The items kept stay in their order and the new
items added follow them, best first: a list merged by score stays in score order (an added item
scores below every item of the list it joins, or it would have been in it), and ComiRec's
diversity pick keeps its own order.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["keep_new_items", "reserved_places"]

TopList = tuple[Tensor, Tensor, Tensor]  # ids [B, W] int64, scores [B, W] float32, interest_of [B, W] int64


def reserved_places(share: float, n: Tensor) -> Tensor:
    """``[B]`` int64: the places of a list of ``n [B]`` items that new items may take, ``⌊share · n⌋``."""
    return torch.floor(share * n.double()).long()


def keep_new_items(top: TopList, new_top: TopList, is_new: Tensor, n: Tensor, places: Tensor) -> TopList:
    """Each row's list with at least ``places`` new items among its first ``n`` (where that many exist).

    Args:
        top: a merged list per row, best first, ``[B, W]`` each; ``-1 / -inf / -1`` past its end.
        new_top: the best new items alone, best first, by the same scores and with the row's
            exclusions, ``[B, M]`` each (``M >= places.max()``).
        is_new: ``[num_items]`` bool, on ``top``'s device.
        n: ``[B]`` int64, each row's list length (``<= W``): places past it are not the row's.
        places: ``[B]`` int64, the new items each row keeps at least.

    Returns:
        ``(ids, scores, interest_of)`` ``[B, W]``: the row's new items of ``top`` and its first other
        items of ``top`` in the places left, in their order, then the new items of ``new_top`` it
        adds (up to ``max(places, new items already listed)`` new items in all, ``n`` at most);
        ``-1 / -inf / -1`` after them.
    """
    ids, scores, which = top
    width = ids.shape[1]
    listed = (ids > 0) & (torch.arange(width, device=ids.device)[None, :] < n[:, None])  # [B, W]
    new_listed = listed & is_new[ids.clamp_min(0)]
    already = (new_top[0][:, :, None] == torch.where(new_listed, ids, -1)[:, None, :]).any(-1)  # [B, M]
    extra = (new_top[0] > 0) & ~already
    count = new_listed.sum(1)  # [B] new items that earned their place
    room = (places.clamp(max=n) - count).clamp_min(0)  # [B] new items to add
    extra &= torch.cumsum(extra.long(), 1) <= room[:, None]
    others = listed & ~new_listed
    others &= torch.cumsum(others.long(), 1) <= (n - count - extra.sum(1))[:, None]
    keep = torch.cat([new_listed | others, extra], dim=1)  # [B, W + M]
    place = torch.arange(keep.shape[1], device=ids.device).expand_as(keep)  # the list's order, then the added
    order = torch.sort(torch.where(keep, place, keep.shape[1]), dim=1, stable=True).indices[:, :width]
    kept = keep.gather(1, order)
    return (
        torch.where(kept, torch.cat([ids, new_top[0]], dim=1).gather(1, order), -1),
        torch.where(kept, torch.cat([scores, new_top[1]], dim=1).gather(1, order), -torch.inf),
        torch.where(kept, torch.cat([which, new_top[2]], dim=1).gather(1, order), -1),
    )
