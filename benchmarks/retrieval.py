"""Retrieval benchmark: exact Flat vs HNSW vs IVF (FAISS) vs torch matmul + topk, d = 64.

The catalogue is clustered random data, so that nearest neighbours are structured as with
trained embeddings (for pure Gaussian vectors in 64 dimensions every point is about as near as
any other and ANN recall says little): ``C`` cluster centres ~ N(0, I) (``--clusters``,
default one per 100 items), items = a centre + N(0, spread² I) with spread = 1 (noise as long
as the centres, so neighbourhoods cross cluster borders), queries drawn the same way. More
clusters per item make the graph harder to navigate: at 1M items, 10,000 clusters is much
harder for HNSW and IVF than 1,000. Search is by inner product for the top ``k = 50``.

Every method searches the same ``--queries`` queries in one call (batch throughput, all CPU
threads); recall@k is the overlap with exact FAISS Flat's top k. Build time covers training
(IVF) and adding the vectors. Prints one ratio table per catalogue size::

    python benchmarks/retrieval.py                        # 100k and 1M items
    python benchmarks/retrieval.py --sizes 100000 --queries 500
    python benchmarks/retrieval.py --sizes 1000000 --clusters 1000 --ef-construction 80

Target: on 1M items, HNSW at recall >= 0.95 with >= 5x the queries/s of exact Flat.
"""

from __future__ import annotations

import argparse
import os
import time

import faiss
import numpy as np
import torch


def clustered(n: int, q: int, d: int, clusters: int, seed: int, spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Items ``[n, d]`` and queries ``[q, d]`` (float32) around the same ``clusters`` centres
    ~ N(0, I), each a random centre plus N(0, spread² I) noise."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, d), dtype=np.float32)

    def draw(count: int) -> np.ndarray:
        out = centres[rng.integers(0, clusters, size=count)]
        out += spread * rng.standard_normal((count, d), dtype=np.float32)
        return out

    return draw(n), draw(q)


def num_clusters(n: int, args: argparse.Namespace) -> int:
    """``--clusters``, or one cluster per 100 items by default."""
    return args.clusters or max(n // 100, 10)


def torch_topk(items: torch.Tensor, queries: torch.Tensor, k: int, chunk: int = 256) -> np.ndarray:
    """Exact top ``k`` ids ``[Q, k]`` by ``queries @ items.T``, ``chunk`` queries at a time."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(queries), chunk):
            out.append(torch.topk(queries[start : start + chunk] @ items.T, k, dim=1).indices)
    return torch.cat(out).numpy()


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean share of each row of ``exact [Q, k]`` present in ``found [Q, k]``."""
    return float(np.mean([len(np.intersect1d(f, e)) / len(e) for f, e in zip(found, exact)]))


def timed(fn, repeat: int = 1) -> tuple[object, float]:
    """``fn()``'s result and its best wall time over ``repeat`` calls."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return result, best


def bench_size(n: int, args: argparse.Namespace) -> list[dict]:
    items, queries = clustered(n, args.queries, args.dim, num_clusters(n, args), args.seed, args.spread)
    k, rows = args.k, []

    flat = faiss.IndexFlatIP(args.dim)
    (_, flat_build) = timed(lambda: flat.add(items))
    (_, exact), flat_s = timed(lambda: flat.search(queries, k), args.repeat)
    rows.append({"method": "faiss Flat (exact)", "build_s": flat_build, "search_s": flat_s, "recall": 1.0})

    t_items, t_queries = torch.from_numpy(items), torch.from_numpy(queries)
    found, torch_s = timed(lambda: torch_topk(t_items, t_queries, k), args.repeat)
    rows.append({"method": "torch matmul + topk", "build_s": 0.0, "search_s": torch_s, "recall": recall(found, exact)})

    hnsw = faiss.index_factory(args.dim, f"HNSW{args.hnsw_m},Flat", faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = args.ef_construction
    (_, build) = timed(lambda: hnsw.add(items))
    print(f"  {n:,} items: HNSW{args.hnsw_m} built in {build:.1f}s", flush=True)
    for ef in args.ef_search:
        hnsw.hnsw.efSearch = ef
        (_, found), s = timed(lambda: hnsw.search(queries, k), args.repeat)
        rows.append(
            {
                "method": f"HNSW{args.hnsw_m},Flat efSearch={ef}",
                "build_s": build,
                "search_s": s,
                "recall": recall(found, exact),
            }
        )

    nlist = args.nlist
    ivf = faiss.index_factory(args.dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    (_, build) = timed(lambda: (ivf.train(items), ivf.add(items)))
    print(f"  {n:,} items: IVF{nlist} trained and built in {build:.1f}s", flush=True)
    for nprobe in args.nprobe:
        faiss.extract_index_ivf(ivf).nprobe = nprobe
        (_, found), s = timed(lambda: ivf.search(queries, k), args.repeat)
        rows.append(
            {
                "method": f"IVF{nlist},Flat nprobe={nprobe}",
                "build_s": build,
                "search_s": s,
                "recall": recall(found, exact),
            }
        )
    for r in rows:
        r["qps"] = args.queries / r["search_s"]
        r["speedup"] = flat_s / r["search_s"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=80, help="HNSW build beam (recsys default)")
    parser.add_argument("--ef-search", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--repeat", type=int, default=2, help="searches timed per method (best kept)")
    parser.add_argument("--clusters", type=int, default=0, help="cluster centres (default: items // 100)")
    parser.add_argument("--spread", type=float, default=1.0, help="noise scale around the centres")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    threads = os.cpu_count() or 1
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, {threads} CPUs, faiss {faiss.__version__} "
        f"({faiss.omp_get_max_threads()} threads), torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"load average {os.getloadavg()[0]:.2f}; d={args.dim}, k={args.k}, {args.queries} queries per batch",
        flush=True,
    )
    for n in args.sizes:
        rows = bench_size(n, args)
        print(
            f"\n{n:,} items ({num_clusters(n, args):,} clusters, spread {args.spread:g}, "
            f"efConstruction {args.ef_construction}); load average {os.getloadavg()[0]:.2f}"
        )
        print(f"| method | build s | queries/s | × Flat | recall@{args.k} |")
        print("|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['method']} | {r['build_s']:.1f} | {r['qps']:,.0f} | {r['speedup']:.2f} | {r['recall']:.4f} |")


if __name__ == "__main__":
    main()
