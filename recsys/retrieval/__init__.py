"""Candidate retrieval: an inner-product index over item embeddings, and per-user aggregation."""

from recsys.retrieval.aggregate import dedup_sorted, diverse_merge, max_merge
from recsys.retrieval.index import (
    Retriever,
    build_index,
    load_index,
    save_index,
    set_search_params,
)

__all__ = [
    "Retriever",
    "build_index",
    "dedup_sorted",
    "diverse_merge",
    "load_index",
    "max_merge",
    "save_index",
    "set_search_params",
]
