"""Soak test: `recsys serve` under 10 minutes of mixed valid and invalid traffic.

Skipped by default (see tests/conftest.py); run it with ``python -m pytest --soak -m soak``.
``RECSYS_SOAK_SECONDS`` shortens or lengthens it (default 600). It checks that no request fails
unexpectedly (valid ones answer 200, invalid ones the 4xx they should, never a 5xx or a dropped
connection) and that the server's resident memory stays flat after warm-up.
"""

import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="recsys serve needs the serve extra: pip install 'multi-interest-recsys[serve]'")

from recsys.data.prepare import Dataset

REPO = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("RECSYS_SOAK_SECONDS", "600"))
CLIENTS = 4
RSS_SLACK_MB = 25  # allowed growth of the server's resident memory after warm-up


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _requests(ds: Dataset, rng: random.Random):
    """An endless mix of (body bytes, allowed statuses): 60% valid, 40% invalid."""
    users = [str(u) for u in ds.user_raw]
    items = [str(i) for i in ds.item_raw[1:]]
    while True:
        kind = rng.random()
        if kind < 0.3:
            body, ok = {"user": rng.choice(users), "n": rng.randint(1, 100)}, {200}
        elif kind < 0.5:
            body, ok = (
                {
                    "items": rng.sample(items, rng.randint(1, 30)),
                    "n": rng.randint(1, 100),
                    "diversity_lambda": rng.choice([0, 0.1, 1e6]),
                },
                {200},
            )
        elif kind < 0.6:
            body, ok = {"items": rng.sample(items, 3) + ["unknown-" + str(rng.random())]}, {200}
        elif kind < 0.7:
            body, ok = {"user": "ghost-" + "x" * rng.randint(1, 100_000)}, {404}
        elif kind < 0.8:
            body, ok = {"items": ["\ud800", "nope"]}, {404}
        elif kind < 0.9:
            body, ok = {"user": rng.choice(users), "diversity_lambda": rng.choice([-1, 1e308])}, {422}
        else:
            yield rng.choice([b'{"items": [', b"[]", b"\xff\xfe", b'{"n": 5}']), {400, 422}
            continue
        yield json.dumps(body).encode(), ok


@pytest.mark.slow
@pytest.mark.soak
def test_soak_mixed_traffic_memory_stays_flat(tiny_run):
    ds = Dataset.load(f"{tiny_run}/dataset")
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recsys",
            "serve",
            tiny_run,
            "--port",
            str(port),
            "--factory",
            "Flat",
            "--set",
            "serve.max_n=100",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    pytest.fail("recsys serve did not start")
                time.sleep(0.2)

        stop = time.time() + SECONDS
        failures: list[str] = []
        counts = {"requests": 0}
        lock = threading.Lock()

        def client(seed: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for raw, ok in _requests(ds, random.Random(seed)):
                if time.time() > stop:
                    return
                try:
                    conn.request("POST", "/recommend", raw, {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    body = resp.read()
                    status = resp.status
                    if status == 200:
                        json.loads(body)
                except (OSError, http.client.HTTPException, ValueError) as err:
                    status, body = -1, repr(err).encode()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                with lock:
                    counts["requests"] += 1
                    if status not in ok:
                        failures.append(f"{status} for {raw[:80]!r}: {body[:200]!r}")

        threads = [threading.Thread(target=client, args=(seed,)) for seed in range(CLIENTS)]
        for t in threads:
            t.start()
        samples = []  # (seconds since start, RSS MB)
        start = time.time()
        while any(t.is_alive() for t in threads):
            samples.append((time.time() - start, _rss_mb(proc.pid)))
            time.sleep(min(10.0, SECONDS / 20))
        for t in threads:
            t.join()

        assert proc.poll() is None, "the server died"
        assert not failures, f"{len(failures)} unexpected answers of {counts['requests']}: {failures[:5]}"
        warm = [rss for t, rss in samples if t >= 0.2 * SECONDS]
        assert warm, samples
        growth = max(warm) - warm[0]
        print(
            f"soak: {counts['requests']:,} requests in {SECONDS:.0f}s; server RSS {warm[0]:.1f} MB after "
            f"warm-up, max {max(warm):.1f} MB (growth {growth:.1f} MB)"
        )
        assert growth <= RSS_SLACK_MB, samples
    finally:
        proc.terminate()
        proc.wait(timeout=30)
