"""Compile the attention kernels (and the max-over-interests score and multi-interest kernels)
for an H100/H200 (sm_90) on a machine without a GPU, and read the result: registers per thread,
spill stack, shared memory and the instructions of each inner loop.

Uses the ptxas and cuobjdump that the Triton wheel ships (``triton/backends/nvidia/bin``). Needs
``TRITON_INTERPRET`` unset (the interpreter wraps the kernels). ``test_sm90_compile.py`` runs
``--json`` in a subprocess; from the repository root

    python tests/kernels/sm90.py

prints the table for the bf16, D = 64 configurations the H200 bench uses.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TENSORS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV", "E", "U"}  # in the launch's dtype
FP32_TENSORS = {"OUT", "G", "DI", "DE", "DU", "M_OUT", "S_OUT"}  # scores, gradients and sums in fp32
FLOATS = {"qk_scale", "tanh_scale", "cap_log2", "sm_scale"}
ALIGNED_INTS = {"sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "som"}
UNIT_STRIDES = ("sqd", "skd", "svd")


def available() -> bool:
    """Whether the wheel's ptxas and cuobjdump are there (Linux x86-64 wheels ship them)."""
    return all(os.access(os.path.join(BIN, tool), os.X_OK) for tool in ("ptxas", "cuobjdump"))


# the multi-interest kernels' arguments that are not in the launch's dtype, and their 16-divisible
# integers at the bench shape (B L, d, hidden and their strides)
MI_TYPES = {
    "S": "*fp32",
    "LSE": "*fp32",
    "DW_PART": "*fp32",
    "PART": "*fp32",
    "PARTS": "*fp32",
    "PARTS2": "*fp32",
    "LENGTHS": "*i64",
    "CU": "*i32",
    "IDX": "*i32",
    "CAP": "fp32",
    **dict.fromkeys(("B", "R", "L", "D", "HID", "K", "P", "N", "P2", "N2", "CHUNK", "STEPS"), "i32"),
}
MI_ALIGNED_INTS = {
    "R",
    "D",
    "HID",
    "stride_pl",
    "stride_w1",
    "stride_hb",
    "stride_hl",
    "stride_ob",
    "stride_ok",
    "N",
    "N2",
    "CHUNK",
}


def _signature(fn: Any, dtype: str, consts: dict, types: dict[str, str] | None = None) -> dict[str, str]:
    """Argument types as a launch on contiguous ``dtype`` tensors with int64 lengths gives them
    (``types``: per-name types, pointer or scalar; with it, other upper-case names are ``dtype``
    pointers and lower-case ones ``i32``)."""
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif types is not None:
            sig[name] = types.get(name, "*" + dtype if name.isupper() else "i32")
        elif name in TENSORS:
            sig[name] = "*" + dtype
        elif name in FP32_TENSORS:
            sig[name] = "*fp32"
        elif name == "WIN":
            sig[name] = "*i8"
        elif name in ("LSE", "DELTA"):
            sig[name] = "*fp32"
        elif name == "LENS":
            sig[name] = "*i64"
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    return sig


def compile_sm90(
    fn: Any,
    consts: dict,
    num_warps: int,
    num_stages: int,
    dtype: str = "bf16",
    types: dict[str, str] | None = None,
    aligned_ints: set[str] = ALIGNED_INTS,
    max_registers: int | None = None,
) -> Any:
    # returns a triton CompiledKernel
    """``fn`` compiled for sm_90 with the compile-time arguments ``consts`` (unit head-dim strides and
    16-divisible pointers and strides, as Triton specialises a contiguous launch); ``types`` as
    :func:`_signature`, ``aligned_ints`` the integer arguments that are multiples of 16."""
    consts = dict(consts, **{n: 1 for n in UNIT_STRIDES if n in fn.arg_names})
    sig = _signature(fn, dtype, consts, types)
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if n not in consts and (sig[n].startswith("*") or n in aligned_ints)
    }
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(n),): v for n, v in consts.items()}, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if max_registers is not None:
        options["maxnreg"] = max_registers
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _cuobjdump(kernel: Any, *flags: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run(
            [os.path.join(BIN, "cuobjdump"), *flags, f.name], capture_output=True, text=True, check=True
        ).stdout


def resources(kernel: Any) -> dict[str, int]:
    """Registers per thread, spill stack bytes and shared memory bytes of a compiled kernel."""
    usage = re.search(r"REG:(\d+).*?STACK:(\d+)", _cuobjdump(kernel, "--dump-resource-usage"))
    return {"regs": int(usage.group(1)), "stack": int(usage.group(2)), "smem": kernel.metadata.shared}


def loops(kernel: Any) -> list[collections.Counter]:
    """Per inner loop (a backward branch in the SASS), its instructions counted by opcode."""
    sass = _cuobjdump(kernel, "-sass")
    pattern = r"/\*([0-9a-f]{4,6})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)"
    ins = [(int(a, 16), op) for a, op in re.findall(pattern, sass)]
    out = []
    for m in re.finditer(r"/\*([0-9a-f]{4,6})\*/\s+(?:@!?U?P\w+\s+)?BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", sass):
        end, start = int(m.group(1), 16), int(m.group(2), 16)
        if start < end:
            out.append(collections.Counter(op for a, op in ins if start <= a <= end))
    return out


# the bench's shape: bf16, D = 64, key lengths, no causal mask, no soft-cap
_COMMON = {"HEAD_DIM": 64, "BLOCK_D": 64, "HAS_LENS": True, "CAUSAL": False, "SOFTCAP": False, "DOT_PREC": "tf32"}
# label, kernel, constexprs, warps, stages, dtype[, register cap]
Variant = tuple[str, Any, dict, int, int, str] | tuple[str, Any, dict, int, int, str, int | None]


def bench_variants() -> list[Variant]:
    """The H200 bench's kernels (bf16, D = 64) in configurations the autotuner picks or may pick."""
    from recsys.kernels.attention import triton as attn

    fwd, dq, dkdv = attn._fwd_kernel, attn._bwd_dq_kernel, attn._bwd_dkdv_kernel
    return [
        ("fwd 128x64 w8 s3", fwd, {**_COMMON, "RAW": True, "BLOCK_M": 128, "BLOCK_N": 64}, 8, 3, "bf16"),
        ("fwd 128x64 w8 s3 scaled", fwd, {**_COMMON, "RAW": False, "BLOCK_M": 128, "BLOCK_N": 64}, 8, 3, "bf16"),
        ("fwd 128x128 w8 s2", fwd, {**_COMMON, "RAW": True, "BLOCK_M": 128, "BLOCK_N": 128}, 8, 2, "bf16"),
        ("fused 64x16 w4 s2", dq, {**_COMMON, "FUSED": True, "BLOCK_M": 64, "BLOCK_N": 16}, 4, 2, "bf16"),
        ("dq 128x64 w8 s3", dq, {**_COMMON, "FUSED": False, "BLOCK_M": 128, "BLOCK_N": 64}, 8, 3, "bf16"),
        *(
            (f"dkdv 32x128 w{w} s{st}", dkdv, {**_COMMON, "BLOCK_M": 32, "BLOCK_N": 128}, w, st, "bf16")
            for w, st in ((4, 2), (8, 2))
        ),
        ("dkdv 64x128 w8 s2", dkdv, {**_COMMON, "BLOCK_M": 64, "BLOCK_N": 128}, 8, 2, "bf16"),
        ("dq 64x32 w4 s2", dq, {**_COMMON, "FUSED": False, "BLOCK_M": 64, "BLOCK_N": 32}, 4, 2, "bf16"),
        ("dkdv 32x64 w4 s3", dkdv, {**_COMMON, "BLOCK_M": 32, "BLOCK_N": 64}, 4, 3, "bf16"),
    ]


def flag_variants() -> list[Variant]:
    """Every kernel with causal masking and soft-capping, and without lengths at a padded head dim
    (fp16; fp32's IEEE products add compile time, not other code paths in these kernels)."""
    from recsys.kernels.attention import triton as attn

    out = []
    for dtype in ("fp16",):
        for tag, flags in (
            ("causal-softcap", {"CAUSAL": True, "SOFTCAP": True}),
            ("nolengths-d48", {"HAS_LENS": False, "HEAD_DIM": 48}),
        ):
            common = {**_COMMON, **flags, "DOT_PREC": "ieee" if dtype == "fp32" else "tf32"}
            for name, fn, consts in (
                ("fwd", attn._fwd_kernel, {"RAW": False, "BLOCK_M": 64, "BLOCK_N": 32}),
                ("fused", attn._bwd_dq_kernel, {"FUSED": True, "BLOCK_M": 64, "BLOCK_N": 16}),
                ("dq", attn._bwd_dq_kernel, {"FUSED": False, "BLOCK_M": 64, "BLOCK_N": 32}),
                ("dkdv", attn._bwd_dkdv_kernel, {"BLOCK_M": 32, "BLOCK_N": 64}),
            ):
                out.append((f"{name} {tag} {dtype}", fn, {**common, **consts}, 4, 2, dtype))
    return out


def max_score_variants() -> list[Variant]:
    """The max-over-interests score kernels at the training step's launch (bf16 and fp32, d = 64)."""
    from recsys.kernels.max_interest_scores import triton as ms

    out = []
    for dtype in ("bf16", "fp32"):
        consts = {
            "D": 64,
            "BLOCK_D": 64,
            "BLOCK_B": ms.BLOCK_B,
            "BLOCK_S": ms.BLOCK_S,
            "DOT_PREC": "ieee" if dtype == "fp32" else "tf32",
        }
        for fn in (ms._fwd_kernel, ms._d_interests_kernel, ms._d_items_kernel):
            out.append((f"max-scores {fn.__name__.strip('_')} {dtype}", fn, consts, 4, 2, dtype))
    return out


def catalogue_variants() -> list[Variant]:
    """The catalogue logsumexp kernels at the exact softmax's launch (bf16 and fp16, d = 64)."""
    from recsys.kernels.catalogue_logsumexp import triton as cl

    out = []
    for dtype in ("bf16", "fp16"):
        consts = {"D": 64, "BLOCK_D": 64, "BLOCK_R": cl.BLOCK_R, "BLOCK_N": cl.BLOCK_N, "DOT_PREC": "tf32"}
        for fn in (cl._fwd_kernel, cl._d_user_kernel, cl._d_items_kernel):
            label = f"catalogue {fn.__name__.strip('_')} {dtype}"
            out.append((label, fn, consts, cl.NUM_WARPS, 2, dtype))
    return out


def multi_interest_variants() -> list[Variant]:
    """The multi-interest kernels at the default launches of the H200 bench (bf16, d = 64, hidden =
    256, K = 4, positions on, programmatic dependent launch): ``gpu_forward_config`` and
    ``gpu_backward_config`` of :mod:`recsys.kernels.multi_interest.triton`, register caps included."""
    from recsys.kernels.multi_interest import triton as mi

    cfg, fwd = mi.gpu_backward_config(50, 64, 256), mi.gpu_forward_config(50, 64, 256)
    blocks = {"BLOCK_D": 64, "BLOCK_K": 16, "TANH_MODE": 1, "PRECISION": "tf32", "HAS_POS": True}

    def row_kernel(name: str, fn: Any, launch: Any, **consts: Any) -> Variant:
        label = f"mi {name} {launch.block_l}x{launch.block_h} w{launch.num_warps} s{launch.num_stages}"
        return (
            label,
            fn,
            {**blocks, **consts, "BLOCK_M": launch.block_l, "BLOCK_H": launch.block_h},
            launch.num_warps,
            launch.num_stages,
            "bf16",
            launch.max_registers,
        )

    scores, pool = cfg.scores, fwd.pool
    variants = [
        row_kernel("scores", mi._mi_scores_kernel, fwd.scores, HAS_CAP=False),
        (
            f"mi pool {pool.block_l} w{pool.num_warps}",
            mi._mi_pool_kernel,
            {"SINGLE_BLOCK": True, "BLOCK_L": pool.block_l, "BLOCK_D": 64, "BLOCK_K": 16, "PRECISION": "tf32"},
            pool.num_warps,
            pool.num_stages,
            "bf16",
            pool.max_registers,
        ),
        ("mi rows", mi._mi_rows_kernel, mi.gpu_rows_blocks(4096, 50)[1], 4, 1, "bf16", None),
        (
            f"mi bwd_scores {scores.block_l} w{scores.num_warps}",
            mi._mi_bwd_scores_kernel,
            {"HAS_CAP": False, "BLOCK_L": scores.block_l, "BLOCK_D": 64, "BLOCK_K": 16, "PRECISION": "tf32"},
            scores.num_warps,
            scores.num_stages,
            "bf16",
            scores.max_registers,
        ),
        row_kernel("bwd_dx", mi._mi_bwd_dx_kernel, cfg.dx),
        row_kernel("bwd_weights", mi._mi_bwd_weights_kernel, cfg.weights),
        ("mi dpos 32 w4 s2", mi._mi_dpos_kernel, {"BLOCK_B": 32, "BLOCK_D": 64}, 4, 2, "bf16", None),
        (
            "mi sum_parts two",
            mi._sum_parts_kernel,
            {"TWO": True, "BLOCK_P": 256, "BLOCK_N": mi.SUM_BLOCK_N},
            4,
            2,
            "bf16",
            None,
        ),
    ]
    # as launched on Hopper: chained by programmatic dependent launch
    return [(label, fn, {**consts, "PDL": True}, *rest) for label, fn, consts, *rest in variants]


def report(variants: list[Variant]) -> dict[str, dict]:
    """Per label: registers, stack, shared memory and the inner loops' opcode counts."""
    out = {}
    for label, fn, consts, warps, stages, dtype, *cap in variants:
        mi = label.startswith("mi ")
        kernel = compile_sm90(
            fn,
            consts,
            warps,
            stages,
            dtype=dtype,
            types=MI_TYPES if mi else None,
            aligned_ints=MI_ALIGNED_INTS if mi else ALIGNED_INTS,
            max_registers=(cap or [None])[0],
        )
        out[label] = {**resources(kernel), "loops": [dict(c) for c in loops(kernel)]}
    return out


def main() -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--json", action="store_true", help="bench, flag, max-score, catalogue and multi-interest variants as JSON"
    )
    args = parser.parse_args()
    if args.json:
        variants = bench_variants() + flag_variants() + max_score_variants() + catalogue_variants()
        print(json.dumps(report(variants + multi_interest_variants())))
        return
    print(f"{'kernel':30} {'regs':>4} {'stack':>5} {'smem':>6}  inner loops: instructions (MUFU, HGMMA)")
    for label, res in report(bench_variants() + multi_interest_variants()).items():
        body = ", ".join(f"{sum(c.values())} ({c.get('MUFU', 0)}, {c.get('HGMMA', 0)})" for c in res["loops"])
        print(f"{label:30} {res['regs']:4d} {res['stack']:5d} {res['smem']:6d}  {body}")


if __name__ == "__main__":
    main()
