"""Retriever (FAISS and torch backends) against a brute-force numpy reference."""

import numpy as np
import pytest
import torch
from scipy.sparse import csr_matrix

from recsys.config import RetrievalConfig
from recsys.retrieval import Retriever, build_index, load_index, save_index


def _data(seed=0, num_items=800, d=16, bsz=24, k=4):
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((num_items, d)).astype(np.float32)
    emb[0] = 100.0  # padding row: would win every search if it were indexed
    # Interests close to each other, so their top lists share many items.
    base = rng.standard_normal((bsz, 1, d))
    interests = (base + 0.3 * rng.standard_normal((bsz, k, d))).astype(np.float32)
    return rng, emb, interests


def _brute_force(emb, interests, n, exclude=None):
    """Dense [B, K, N] scores -> per-item max over interests -> top n (padding, exclusions out)."""
    scores = np.einsum("bkd,nd->bkn", interests.astype(np.float64), emb.astype(np.float64))
    best, which = scores.max(axis=1), scores.argmax(axis=1)
    best[:, 0] = -np.inf
    if exclude is not None:
        for b, row in enumerate(exclude):
            best[b, row[row > 0]] = -np.inf
    ids = np.argsort(-best, axis=1, kind="stable")[:, :n]
    return ids, np.take_along_axis(best, ids, axis=1), np.take_along_axis(which, ids, axis=1)


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize("with_exclude", [False, True])
def test_search_equals_brute_force(backend, with_exclude):
    rng, emb, interests = _data()
    exclude = None
    if with_exclude:
        ref_ids, _, _ = _brute_force(emb, interests, 30)
        exclude = np.zeros((len(interests), 12), dtype=np.int64)  # right-padded with 0
        exclude[:, :6] = ref_ids[:, ::5][:, :6]  # the true top items must go
        exclude[:, 6:9] = rng.integers(1, len(emb), size=(len(interests), 3))
    n = 30
    ids, scores, interest_of = Retriever(emb, RetrievalConfig(backend=backend)).search(interests, n, exclude)
    ref_ids, ref_scores, ref_int = _brute_force(emb, interests, n, exclude)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(interest_of, ref_int)
    assert ids.dtype == np.int64 and scores.dtype == np.float32 and interest_of.dtype == np.int64
    # Several interests found the same items, and each appears once.
    assert len(np.unique(interest_of)) > 1
    assert all(len(set(row)) == n for row in ids)
    assert (ids > 0).all()
    if exclude is not None:
        for row, ex in zip(ids, exclude):
            assert not set(row) & set(ex[ex > 0])


def test_exclude_as_csr_equals_dense():
    rng, emb, interests = _data(seed=1)
    dense = np.zeros((len(interests), 5), dtype=np.int64)
    lengths = rng.integers(0, 6, size=len(interests))
    for b, length in enumerate(lengths):
        dense[b, :length] = rng.integers(1, len(emb), size=length)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = np.concatenate([dense[b, :length] for b, length in enumerate(lengths)])
    retriever = Retriever(emb)
    want = retriever.search(interests, 20, dense)[0]
    np.testing.assert_array_equal(want, retriever.search(interests, 20, (indptr, items))[0])
    sparse = csr_matrix((np.ones(len(items)), items, indptr), shape=(len(interests), len(emb)))
    np.testing.assert_array_equal(want, retriever.search(interests, 20, sparse)[0])


def test_faiss_and_torch_backends_agree_on_torch_input():
    _, emb, interests = _data(seed=2, num_items=3000, d=32)
    faiss_out = Retriever(emb, RetrievalConfig(backend="faiss")).search(torch.from_numpy(interests), 50)
    on_device = Retriever(torch.from_numpy(emb), RetrievalConfig(backend="torch"))
    torch_out = on_device.search(torch.from_numpy(interests), 50)
    np.testing.assert_array_equal(faiss_out[0], torch_out[0])
    np.testing.assert_allclose(faiss_out[1], torch_out[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(faiss_out[2], torch_out[2])


def test_small_catalogue_pads_with_minus_one():
    rng = np.random.default_rng(3)
    emb = rng.standard_normal((6, 4)).astype(np.float32)  # 5 real items
    interests = rng.standard_normal((3, 2, 4)).astype(np.float32)
    for backend in ("faiss", "torch"):
        retriever = Retriever(emb, RetrievalConfig(backend=backend))
        ids, scores, interest_of = retriever.search(interests, 8, np.array([[1], [0], [0]]))
        assert sorted(ids[0, :4]) == [2, 3, 4, 5] and (ids[0, 4:] == -1).all()
        assert sorted(ids[1, :5]) == [1, 2, 3, 4, 5] and (ids[1, 5:] == -1).all()
        assert np.isneginf(scores[1, 5:]).all() and (interest_of[1, 5:] == -1).all()


@pytest.mark.parametrize("factory", ["HNSW16,Flat", "IVF8,Flat", "IVF8,PQ4x4"])
def test_ann_factories_return_valid_ids(factory):
    _, emb, interests = _data(seed=4, num_items=2000, d=16)
    retriever = Retriever(emb, RetrievalConfig(factory=factory, nprobe=8, ef_search=64))
    ids, scores, _ = retriever.search(interests, 20)
    assert ids.shape == (len(interests), 20)
    assert ((ids >= 1) & (ids < len(emb))).all()
    assert all(len(set(row)) == 20 for row in ids)
    assert (np.diff(scores, axis=1) <= 1e-6).all()
    if "PQ" not in factory:  # exact vectors: most of the true top 20 come back
        ref_ids, _, _ = _brute_force(emb, interests, 20)
        overlap = np.mean([len(set(a) & set(b)) / 20 for a, b in zip(ids, ref_ids)])
        assert overlap > 0.8


@pytest.mark.parametrize("factory", ["Flat", "HNSW16,Flat", "HNSW8,Flat", "IVF8,Flat", "IVF8,PQ4x4", "PQ4x4"])
def test_every_factory_returns_the_whole_catalogue_at_n_equal_to_its_size(factory):
    """An HNSW graph over inner products reaches only part of its items, so its own lists at
    n = catalogue size are short; every list must still hold every eligible item."""
    _, emb, interests = _data(seed=5, num_items=300, d=8, bsz=6)
    catalogue = len(emb) - 1
    exclude = np.zeros((len(interests), 3), dtype=np.int64)
    exclude[0] = [1, 2, 3]
    exclude[1, :1] = [7]
    settings = RetrievalConfig(factory=factory, nprobe=1, ef_search=16)
    for retriever in (Retriever(emb, settings), Retriever.from_index(build_index(emb, settings), item_emb=emb)):
        for n, skip in ((catalogue, None), (catalogue, exclude), (catalogue + 50, None)):
            ids, _, _ = retriever.search(interests, n, skip)
            held = (ids > 0).sum(axis=1)
            eligible = catalogue - (np.zeros(len(ids), int) if skip is None else (skip > 0).sum(axis=1))
            assert (held == eligible).all(), (factory, held, eligible)
            assert all(len(set(row[row > 0])) == len(row[row > 0]) for row in ids)
            if skip is not None:
                assert not set(ids[0]) & {1, 2, 3} and 7 not in ids[1]


def test_an_index_without_embeddings_keeps_its_short_lists():
    """The fill needs the embeddings: without them the index's own (short) answer stands."""
    _, emb, interests = _data(seed=5, num_items=300, d=8, bsz=6)
    index = build_index(emb, RetrievalConfig(factory="HNSW8,Flat", ef_search=16))
    ids, _, _ = Retriever.from_index(index).search(interests, len(emb) - 1)
    assert ((ids > 0).sum(axis=1) < len(emb) - 1).any()


def test_save_load_roundtrip(tmp_path):
    import faiss

    _, emb, interests = _data(seed=5)
    index = build_index(emb, RetrievalConfig(factory="IVF4,Flat", nprobe=4))
    save_index(index, tmp_path / "items.faiss")
    loaded = Retriever.from_index(load_index(tmp_path / "items.faiss"))
    assert loaded.num_items == len(emb) and loaded.factory == ""
    assert faiss.extract_index_ivf(loaded.index).nprobe == 4  # the file keeps its search settings
    np.testing.assert_array_equal(loaded.search(interests, 10)[0], Retriever(emb).search(interests, 10)[0])
    reset = Retriever.from_index(load_index(tmp_path / "items.faiss"), RetrievalConfig(factory="IVF4,Flat", nprobe=1))
    assert faiss.extract_index_ivf(reset.index).nprobe == 1 and reset.factory == "IVF4,Flat"


def test_ef_construction_sets_the_hnsw_build_beam():
    import faiss

    _, emb, interests = _data(seed=6)
    built = [
        build_index(emb, RetrievalConfig(factory="HNSW8,Flat", ef_construction=ef))  # keep them alive
        for ef in (8, 200)
    ]
    assert [faiss.downcast_index(index).hnsw.efConstruction for index in built] == [8, 200]
    # a flat index ignores it, and the same search comes back
    exact = Retriever(emb).search(interests, 10)[0]
    flat = Retriever(emb, RetrievalConfig(backend="faiss", ef_construction=8))
    np.testing.assert_array_equal(flat.search(interests, 10)[0], exact)
    with pytest.raises(ValueError, match="retrieval.ef_construction"):
        build_index(emb, RetrievalConfig(factory="HNSW8,Flat", ef_construction=0))


def test_bad_inputs_name_the_field():
    _, emb, interests = _data()
    with pytest.raises(ValueError, match="retrieval.backend"):
        Retriever(emb, RetrievalConfig(factory="HNSW32,Flat", backend="torch"))
    with pytest.raises(ValueError, match="retrieval.factory"):
        Retriever(emb[:50], RetrievalConfig(factory="IVF1024,Flat"))
    with pytest.raises(ValueError, match="interests"):
        Retriever(emb).search(interests[:, :, :3], 5)
    with pytest.raises(ValueError, match="exclude"):
        Retriever(emb).search(interests, 5, np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="item_category"):
        Retriever(emb).search(interests, 5, diversity_lambda=1.0)
    with pytest.raises(FileNotFoundError, match="index file"):
        load_index("/nonexistent/items.faiss")


def test_search_with_diversity_lambda_uses_categories():
    _, emb, interests = _data(seed=6)
    cats = np.arange(len(emb)) % 3
    retriever = Retriever(emb, item_category=cats)
    plain = retriever.search(interests, 15)
    diverse = retriever.search(interests, 15, diversity_lambda=100.0)
    # With a huge λ the picks cycle through the 3 categories, where the candidates allow it.
    cand = retriever.candidates(interests, 15)[0]
    available = np.stack([[len(set(row[(row > 0) & (cats[row] == c)])) for c in range(3)] for row in cand])
    counts = np.stack([(cats[diverse[0]] == c).sum(axis=1) for c in range(3)], axis=1)
    enough = (available >= 5).all(axis=1)
    assert enough.sum() > len(cand) // 2
    assert (counts[enough] == 5).all()
    assert not np.array_equal(plain[0], diverse[0])


def test_top_items_on_the_device_equals_faiss_search_with_and_without_history():
    _, emb, interests = _data(seed=4, num_items=3000, d=32)
    rng = np.random.default_rng(5)
    history = rng.integers(0, len(emb), size=(len(interests), 7))  # 0 = padding
    faiss = Retriever(emb, RetrievalConfig(backend="faiss"))
    on_device = Retriever(torch.from_numpy(emb), RetrievalConfig(backend="torch"))
    assert on_device.on_device and not faiss.on_device
    for exclude in (None, history):
        want = faiss.search(interests, 50, exclude)
        got = on_device.top_items(
            torch.from_numpy(interests), 50, None if exclude is None else torch.from_numpy(exclude)
        )
        assert all(isinstance(x, torch.Tensor) for x in got)
        np.testing.assert_array_equal(got[0].numpy(), want[0])
        np.testing.assert_allclose(got[1].numpy(), want[1], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[2].numpy(), want[2])
    with pytest.raises(ValueError, match="top_items"):
        faiss.top_items(torch.from_numpy(interests), 50)


def test_top_items_pads_a_small_catalogue_like_search():
    rng = np.random.default_rng(3)
    emb = rng.standard_normal((6, 4)).astype(np.float32)  # 5 real items
    interests = rng.standard_normal((3, 2, 4)).astype(np.float32)
    exclude = np.array([[1], [0], [0]])
    want = Retriever(emb, RetrievalConfig(backend="faiss")).search(interests, 8, exclude)
    on_device = Retriever(emb, RetrievalConfig(backend="torch"))
    got = on_device.top_items(torch.from_numpy(interests), 8, torch.from_numpy(exclude))
    np.testing.assert_array_equal(got[0].numpy(), want[0])
    np.testing.assert_allclose(got[1].numpy(), want[1], rtol=1e-5)
    np.testing.assert_array_equal(got[2].numpy(), want[2])


def _queries_and_exact(emb: np.ndarray, n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """300 users' two interests and exact search's top ``n`` for them."""
    interests = np.random.default_rng(seed).standard_normal((300, 2, emb.shape[1])).astype(np.float32)
    exact = Retriever(emb, RetrievalConfig(factory="Flat", backend="faiss")).search(interests, n)[0]
    return interests, exact


def test_calibrate_widens_an_hnsw_beam_until_it_finds_what_exact_search_finds():
    """Was: an index was searched at the beam it was given (a saved HNSW32 held 0.75 of exact
    search's top 50). A sparse graph (HNSW4, built with a beam of 16) searched with a beam of 16
    holds well under 0.95; widened, the beam reaches it, and the index is left searched so."""
    import faiss

    from recsys.retrieval.index import calibrate

    emb = np.random.default_rng(0).standard_normal((2000, 16)).astype(np.float32)
    interests, exact = _queries_and_exact(emb, 10)
    settings = RetrievalConfig(factory="HNSW4,Flat", ef_search=16, ef_construction=16)
    index = build_index(emb, settings)
    kept = calibrate(index, interests, exact, settings, widen=False)
    assert kept.key == "ef_search" and kept.tried == ((16, kept.recall),) and kept.recall < 0.9
    widened = calibrate(index, interests, exact, settings)
    assert widened.reached and widened.recall >= 0.95 and widened.value > 16
    assert faiss.downcast_index(index).hnsw.efSearch == widened.value
    assert widened.recall == dict(widened.tried)[widened.value]
    assert widened.describe().startswith(f"ef_search 16 -> {widened.value}: recall@10 {kept.recall:.3f} at 16, ")
    # the beam doubled until it reached 0.95, then the smallest one that does, to within an eighth
    doubled = [value for value, _ in widened.tried if value & (value - 1) == 0]
    assert doubled == [16 * 2**i for i in range(len(doubled))] and doubled[-1] >= widened.value
    short = max(value for value, recall in widened.tried if recall < 0.95)
    assert short < widened.value <= short + max(1, widened.value // 8)


def test_calibrate_probes_more_ivf_lists_and_stops_at_all_of_them():
    """Topic-clustered items in 32 lists: probing one misses neighbours in the next; more lists
    reach 0.95. Codes too coarse to reach it stop the widening at every list."""
    import faiss

    from recsys.retrieval.index import calibrate

    rng = np.random.default_rng(0)
    centers = rng.standard_normal((20, 32)).astype(np.float32)
    emb = (centers[rng.integers(0, 20, 3000)] + 0.3 * rng.standard_normal((3000, 32))).astype(np.float32)
    interests = (centers[rng.integers(0, 20, (200, 2))] + 0.3 * rng.standard_normal((200, 2, 32))).astype(np.float32)
    exact = Retriever(emb, RetrievalConfig(factory="Flat", backend="faiss")).search(interests, 20)[0]
    settings = RetrievalConfig(factory="IVF32,Flat", nprobe=1)
    index = build_index(emb, settings)
    widened = calibrate(index, interests, exact, settings)
    assert widened.key == "nprobe" and widened.tried[0][1] < 0.95 and widened.reached and widened.value > 1
    assert faiss.extract_index_ivf(index).nprobe == widened.value
    coarse = RetrievalConfig(factory="IVF32,PQ4x4", nprobe=1)  # 2 bytes an item: never near exact
    bounded = calibrate(build_index(emb, coarse), interests, exact, coarse)
    assert not bounded.reached and [value for value, _ in bounded.tried] == [1, 2, 4, 8, 16, 32]


def test_a_factory_faiss_cannot_build_is_one_line_naming_the_key():
    from recsys.config import ConfigError
    from recsys.retrieval.index import check_factory

    with pytest.raises(ConfigError, match=r"^retrieval.factory: FAISS cannot build 'Bogus' .*index string Bogus$"):
        check_factory("Bogus", 64)
    with pytest.raises(ConfigError, match=r"^retrieval.factory: .*'PQ16' over 60-wide .*multiple of the number"):
        check_factory("PQ16", 60)
    check_factory("HNSW32,Flat", 60)
    check_factory("Flat", 60)
