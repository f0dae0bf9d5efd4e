"""Serving benchmark: `recsys serve` under a bounded concurrent load; throughput and p50/p99.

The server runs as its own process (``python -m recsys serve RUN``, one worker, torch/FAISS
at one thread) on a free port of 127.0.0.1. The load comes from a second process: ``C``
closed-loop asyncio clients (each with one keep-alive HTTP/1.1 connection) send
``POST /recommend`` requests for ``--seconds`` after a warm-up; half ask for a dataset user
(``{"user": id}``), half send a click sequence (``{"items": [...]}``, a user's last clicks),
all with ``n = --n``. Every non-200 answer, and every 200 answer without ``n`` items, counts
as an error; the benchmark fails unless there are none.

Without ``--run`` it makes an untrained 100,000-item run (see make_random_run.py; K = 4,
d = 64, max_len = 50; item embeddings clustered by category with noise ``--spread``, as a
trained table is) under ``--work`` and saves its index there first, printing the index's
recall@50 against exact search on the run's users::

    python benchmarks/serving.py                          # 100k items, IVF1024,Flat nprobe 16
    python benchmarks/serving.py --spread 0 --factory HNSW32,Flat --ef-search 64   # i.i.d. random
    python benchmarks/serving.py --run RUN --concurrency 1 8 32 --seconds 10

Targets: >= 500 requests/s with p99 < 50 ms, K = 4, N = 50, 100k items, no error.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before it was ready (see its log)")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"server on port {port} not healthy after {timeout_s:.0f}s")


def get_info(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/info")
    return json.loads(conn.getresponse().read())


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_bodies(run: Path, n: int, count: int, seed: int = 0) -> list[bytes]:
    """Request bodies: alternately a user id and that user's last 50 clicks as raw items."""
    from recsys.run import RunDir

    ds = RunDir(run).load_dataset()
    rng = np.random.default_rng(seed)
    users = rng.integers(0, ds.num_users, size=count)
    bodies = []
    for i, u in enumerate(users):
        if i % 2 == 0:
            body = {"user": str(ds.user_raw[u]), "n": n}
        else:
            clicks = ds.items[ds.indptr[u] : ds.indptr[u + 1]][-50:]
            body = {"items": ds.item_raw[clicks].tolist(), "n": n}
        body["exclude_seen"] = False  # as docs/results.md's numbers were measured (the service's default is true)
        bodies.append(json.dumps(body).encode())
    return bodies


async def _client(
    port: int, requests: list[bytes], first: int, step: int, n: int, clock: dict, lat: list[float], errors: list[str]
) -> None:
    """One closed-loop client on one keep-alive connection: send, read the whole answer, repeat."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = first
    while time.perf_counter() < clock["start"]:
        await asyncio.sleep(0.001)
    while True:
        t0 = time.perf_counter()
        if t0 >= clock["stop"]:
            break
        writer.write(requests[i % len(requests)])
        i += step
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            data = await reader.readexactly(int(length.group(1)) if length else 0)
            status = int(head[9:12])
            ok = status == 200 and data.count(b'"item":') == n
            why = "" if ok else f"HTTP {status}: {data[:200]!r}"
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
            why = repr(err)
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if t0 >= clock["measure"]:
            lat.append(time.perf_counter() - t0)
            if why:
                errors.append(why)
    writer.close()


def client_load(port: int, bodies: list[bytes], concurrency: int, seconds: float, warmup_s: float, n: int) -> dict:
    """Closed-loop load: ``concurrency`` asyncio clients (raw HTTP/1.1 keep-alive, so the load
    generator spends little CPU) for ``warmup_s + seconds``; only the last ``seconds`` count."""
    head = b"POST /recommend HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    requests = [head + b"Content-Length: %d\r\n\r\n" % len(body) + body for body in bodies]
    lat: list[float] = []
    errors: list[str] = []

    async def run() -> None:
        now = time.perf_counter()
        clock = {"start": now + 0.2, "measure": now + 0.2 + warmup_s, "stop": now + 0.2 + warmup_s + seconds}
        await asyncio.gather(
            *(_client(port, requests, c, concurrency, n, clock, lat, errors) for c in range(concurrency))
        )

    asyncio.run(run())
    ms = np.asarray(lat) * 1e3
    return {
        "concurrency": concurrency,
        "requests": len(ms),
        "errors": len(errors),
        "req_per_s": len(ms) / seconds,
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else float("nan"),
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else float("nan"),
        "max_ms": float(ms.max()) if len(ms) else float("nan"),
        "first_error": errors[0] if errors else "",
    }


def run_client(args: argparse.Namespace) -> None:
    """The ``--client`` process: load the server, print one JSON line per concurrency."""
    bodies = make_bodies(Path(args.run), args.n, 4096)
    for c in args.concurrency:
        print(json.dumps(client_load(args.port, bodies, c, args.seconds, args.warmup, args.n)), flush=True)


def ensure_run(args: argparse.Namespace) -> Path:
    from recsys.run import RunDir, build_run_index, load_run, retrieval_settings

    if args.run:
        run = Path(args.run)
    else:
        from make_random_run import make_random_run

        run = Path(args.work) / f"random-{args.items // 1000}k-spread{args.spread:g}"
        if not run.is_dir() or not RunDir(run).has_best():
            print(f"making an untrained run with {args.items:,} items at {run} ...", flush=True)
            make_random_run(run, [f"synthetic.num_items={args.items}"], spread=args.spread)
    if not RunDir(run).index_files(args.factory)[0].exists():
        print(f"building {args.factory} for {run} ...", flush=True)
        loaded = load_run(run)
        settings = retrieval_settings(loaded, args.factory, nprobe=args.nprobe, ef_search=args.ef_search, saved=False)
        report = build_run_index(loaded, settings, log=print)
        print(f"  built in {report.build_s:.1f}s, recall@50 vs exact {report.recall:.3f}", flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="run directory (default: an untrained run made under --work)")
    parser.add_argument("--work", default="/tmp/recsys-bench", help="where the default run is made")
    parser.add_argument("--items", type=int, default=100_000, help="catalogue of the default run")
    parser.add_argument(
        "--spread",
        type=float,
        default=0.5,
        help="default run: item-embedding noise around category centres (0: i.i.d. random)",
    )
    parser.add_argument("--factory", default="IVF1024,Flat")
    parser.add_argument("--nprobe", type=int, default=16, help="IVF lists searched per query")
    parser.add_argument("--ef-search", type=int, default=64, help="HNSW search beam width")
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per concurrency")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each measurement")
    parser.add_argument("--max-batch", type=int, default=64, help="serve.max_batch (micro-batch cap)")
    parser.add_argument("--batch-workers", type=int, default=1, help="serve.batch_workers (batches at once)")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        run_client(args)
        return

    run = ensure_run(args)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    Path(args.work).mkdir(parents=True, exist_ok=True)
    server_log = Path(args.work) / "server.log"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recsys",
            "serve",
            str(run),
            "--port",
            str(port),
            "--factory",
            args.factory,
            "--nprobe",
            str(args.nprobe),
            "--ef-search",
            str(args.ef_search),
            "--set",
            f"serve.max_batch={args.max_batch}",
            "--set",
            f"serve.batch_workers={args.batch_workers}",
        ],
        env=env,
        stdout=server_log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_healthy(port, server, timeout_s=300)
        info = get_info(port)
        cpu0 = cpu_seconds(server.pid)
        print(
            f"server: {info['model']}, {info['items']:,} items, index {info['index']}, K={info['num_interests']}, "
            f"d={info['dim']}, max_len={info['max_len']}; load average {os.getloadavg()[0]:.2f} "
            f"on {os.cpu_count()} CPUs",
            flush=True,
        )
        client = subprocess.run(
            [
                sys.executable,
                __file__,
                "--client",
                "--run",
                str(run),
                "--port",
                str(port),
                "--n",
                str(args.n),
                "--seconds",
                str(args.seconds),
                "--warmup",
                str(args.warmup),
                "--concurrency",
                *map(str, args.concurrency),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        cpu_s = cpu_seconds(server.pid) - cpu0
        info = get_info(port)
    finally:
        server.terminate()
        server.wait(timeout=30)
    rows = [json.loads(line) for line in client.stdout.splitlines() if line.strip()]
    print(
        f"\nPOST /recommend, n={args.n}, {args.seconds:g}s per row after {args.warmup:g}s warm-up; "
        f"load average now {os.getloadavg()[0]:.2f}; mean micro-batch "
        f"{info['requests'] / max(info['batches'], 1):.1f} requests; server CPU "
        f"{1e3 * cpu_s / max(info['requests'], 1):.2f} ms per request (all rows, warm-ups included)"
    )
    print("| clients | requests | errors | req/s | p50 ms | p99 ms | max ms |")
    print("|--------:|---------:|-------:|------:|-------:|-------:|-------:|")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['requests']:,} | {r['errors']} | {r['req_per_s']:,.0f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} |"
        )
    failed = [r for r in rows if r["errors"]]
    for r in failed:
        print(f"errors at {r['concurrency']} clients, first: {r['first_error']}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
