"""Every attention (and multi-interest backward) kernel variant compiles for sm_90 (H100/H200) here, without a GPU: the
interpreter tests cannot catch what only the GPU compiler rejects. Also pins the facts the
autotune candidates and the forward's FMA form rely on (no spills; no multiply per score)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sm90  # tests/kernels is on sys.path

pytestmark = pytest.mark.skipif(not sm90.available(), reason="the Triton wheel's ptxas/cuobjdump are missing")


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    """``sm90.py --json`` in a subprocess without TRITON_INTERPRET (which wraps the kernels)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton's default (3.9 warns that 3.10 changes it)
    run = subprocess.run(
        [sys.executable, str(Path(sm90.__file__)), "--json"], capture_output=True, text=True, env=env, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_every_kernel_variant_compiles(compiled):
    assert len(compiled) == (
        len(sm90.bench_variants())
        + len(sm90.flag_variants())
        + len(sm90.max_score_variants())
        + len(sm90.catalogue_variants())
        + len(sm90.multi_interest_variants())
    )


def test_catalogue_kernels_do_not_spill_and_multiply_on_wgmma(compiled):
    """The exact softmax's log-partition kernels at their launch: no spill, the products on wgmma."""
    for label, *_ in sm90.catalogue_variants():
        assert compiled[label]["stack"] == 0, (label, compiled[label])
        assert any(loop.get("HGMMA") for loop in compiled[label]["loops"]), label


# the weight-gradient kernel's default launch, the fastest of the H200 sweeps although it spills
# (255 registers + 192 bytes; 224 since its loads run one tile ahead, 8% faster): it may not spill more
WEIGHTS_DEFAULT, WEIGHTS_DEFAULT_STACK = "mi bwd_weights 64x128 w4 s2", 224


def test_multi_interest_kernels_do_not_spill(compiled):
    """The multi-interest kernels (the forward's scores and pool; the valid-row list, the
    backward's scores, dX, dP and sums), at the bench's launches: no spill, but the weight kernel's
    default, which spills no more than before."""
    labels = [label for label, *_ in sm90.multi_interest_variants() if label != WEIGHTS_DEFAULT]
    assert not {label: compiled[label]["stack"] for label in labels if compiled[label]["stack"]}
    assert compiled[WEIGHTS_DEFAULT]["stack"] <= WEIGHTS_DEFAULT_STACK


def test_bench_configurations_do_not_spill(compiled):
    """bf16, D = 64, among them the dk/dv candidates added because the H200's old pick spilled."""
    bench = {label for label, *_ in sm90.bench_variants()}
    assert not {label: r["stack"] for label, r in compiled.items() if label in bench and r["stack"]}


def test_forward_loop_has_one_fma_and_no_multiply_per_score(compiled):
    """128 x 64 tile on 8 warps: 32 scores per thread; the rescale of 32 accumulator elements stays."""
    raw, scaled = (
        next(loop for loop in compiled[label]["loops"] if loop.get("HGMMA"))  # not a tail block's
        for label in ("fwd 128x64 w8 s3", "fwd 128x64 w8 s3 scaled")
    )
    assert raw["MUFU"] == scaled["MUFU"] == 34  # an exp2 per score and one rescale factor per row (2 rows)
    assert raw["FMUL"] <= scaled["FMUL"] - 30
    assert sum(raw.values()) < sum(scaled.values())


def test_last_partial_query_block_gets_a_small_tile(compiled):
    """Forward and dq: a program whose block holds at most TAIL_M rows runs TAIL_M-row tiles (two more
    key loops, on mma.sync instead of wgmma)."""
    for label in ("fwd 128x64 w8 s3", "dq 128x64 w8 s3", "dq 64x32 w4 s2"):
        loops = compiled[label]["loops"]
        assert len(loops) == 4 and sum(1 for loop in loops if not loop.get("HGMMA")) == 2, label


def test_register_caps_hold_without_spills(compiled):
    """A launch with ``max_registers`` (Triton's ``maxnreg``) compiles within its cap, so that the
    programs per multiprocessor it was chosen for fit, and does not spill for it."""
    capped = [(v[0], v[6]) for v in sm90.multi_interest_variants() if len(v) > 6 and v[6] is not None]
    assert capped  # the backward scores kernel's default is capped
    for label, cap in capped:
        assert compiled[label]["regs"] <= cap and compiled[label]["stack"] == 0, (label, compiled[label])
