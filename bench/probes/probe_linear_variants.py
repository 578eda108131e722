"""Probe: variants of linear.py's kernel on a Qwen3-8B layer's four launches.

Each variant rewrites the kernel text (load addresses, cache hints, unrolling)
and is timed on the four launches of one verify layer (16 rows): q/k/v with the
RMSNorm, o_proj with the residual, gate/up with SwiGLU and the norm, down_proj
with the residual; plus the lm_head. Per call, from `--calls` calls queued and
evaluated at once over 8 rotating weight sets (far more than the L2 holds).
GB/s counts the weight bytes. `diff` is the largest difference from the
shipped kernel's output. These timings include the Python time to queue the
calls; for the GPU's time per launch, `--reps 0` makes one launch of each for
a profiler (how speed.md section 12 used it):

    python bench/probes/probe_linear_variants.py [--calls 72] [--variants base,u2] [--rounds 3]
    python bench/probes/probe_linear_variants.py --bits 4 --variants base,wide4,wide4u2 \
        --tilings auto,16x8,32x4   # the 64-k 4-bit fetch against the shipped 16-k one
    python bench/probes/probe_linear_variants.py --bits 4 --variants base,shift4 --tilings auto
    ncu --clock-control none --csv -k regex:"dflash_block_linear|gemv" \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        python bench/probes/probe_linear_variants.py --reps 0 --tilings auto,16x16
"""

import argparse
import json
import time

import mlx.core as mx
from mlx.nn import silu as nn_silu

from mlx_dflash.kernels import matmul as linear

# ld.global.nc with L1 no-allocate and a 256-byte L2 prefetch: weights are
# streamed once per launch.
_LDW = """
__device__ __forceinline__ uint4 ldw(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint4 ldn(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
"""


def coalesced(src):
    # Lane t reads k [8t, 8t + 8) and [32 + 8t, 40 + 8t) of each 64: four lanes
    # cover 64 contiguous bytes per load instead of 4 half sectors.
    return src.replace("kc + t * 16", "kc + t * 8").replace("q[1]", "q[4]")


def weights_via(fn, second=1):
    """Weight loads through `fn`; `second`: the uint4 offset of a lane's second
    load (1, or 4 after `coalesced`)."""

    def edit(src):
        return src.replace("wv[p][j][0] = q[0];", f"wv[p][j][0] = {fn}(q);").replace(
            f"wv[p][j][1] = q[{second}];", f"wv[p][j][1] = {fn}(q + {second});"
        )

    return edit


def unroll(n):
    return lambda src: src.replace(
        "#pragma unroll 4\n  for (int kc", f"#pragma unroll {n}\n  for (int kc"
    )


# 4-bit weights, one row tile: a lane fetches 64 consecutive k of a weight row
# in one 32-byte load (the size of a dense lane's) and feeds 4 mma steps of 16
# k from it, the group's scale and bias loaded once. Tried in the fifteenth
# session at 16 x 8 only, where each warp's K slice (512) is two such steps:
# fewer than the loop's unroll of 4, so likely one fetch in flight at a time
# (h200-probe-linear-packed-fetch.jsonl: slower on every launch). Packed
# 4-bit launches only (--bits 4): the text names the packed pointers.
_LOOP = """  #pragma unroll 4
  for (int kc = k_begin; kc < k_begin + kper; kc += 64) {
    const int kk = kc + t * 16;
"""
_WIDE_LOOP = """  struct alignas(32) Words { unsigned w[8]; };
  Words pw[P][NT];
  PAIR sc2[P][NT], zb2[P][NT];
  #pragma unroll UNROLL
  for (int kc = k_begin; kc < k_begin + kper; kc += 256) {
    #pragma unroll
    for (int p = 0; p < P; ++p) {
      #pragma unroll
      for (int j = 0; j < NT; ++j) {
        const size_t wrow = n0 + j * 8 + g;
        pw[p][j] = *reinterpret_cast<const Words*>(wq[p] + (wrow * K + kc + t * 64) / 8);
      }
    }
    #pragma unroll
    for (int u = 0; u < 4; ++u) {
    const int kk = kc + t * 64 + 16 * u;
"""
_LOOP_END = """            mma16816(acc[p][m][j], a, uw[2 * s], uw[2 * s + 1]);
          }
        }
      }
    }
  }
"""
_WIDE_LOAD = """if ((16 * u) % GS == 0) {
          const size_t gi = wrow * (K / GS) + kk / GS;
          sc2[p][j].x = sc2[p][j].y = ws[p][gi];
          zb2[p][j].x = zb2[p][j].y = wz[p][gi];
        }
        const unsigned magic = MAGIC;
        const PAIR base = *reinterpret_cast<const PAIR*>(&magic);
        unsigned* tw = reinterpret_cast<unsigned*>(wv[p][j]);
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
          const unsigned t = pw[p][j].w[2 * u + i / 4] >> (8 * (i & 3));
          unsigned h = (t & 0xFu) | ((t << 12) & 0xF0000u) | magic;
          PAIR v = __hfma2(__hsub2(*reinterpret_cast<PAIR*>(&h), base), sc2[p][j], zb2[p][j]);
          tw[i] = *reinterpret_cast<unsigned*>(&v);
        }"""
# The 64-k fetch with matmul.py's byte-permute dequantization (the wide4
# variants above shift and mask: 6 instructions a pair against 4). Both halves
# were measured apart (sixteenth and seventeenth sessions), never together.
# `--variants wide4p,wide4pu2,wide4pu1`.
_WIDE_PRMT_LOAD = _WIDE_LOAD[: _WIDE_LOAD.index("        unsigned* tw")] + """        const unsigned w0 = pw[p][j].w[2 * u], w1 = pw[p][j].w[2 * u + 1];
        const unsigned hi[2] = {w0 >> 4, w1 >> 4};
        unsigned* tw = reinterpret_cast<unsigned*>(wv[p][j]);
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
          const unsigned b = i & 3;
          const unsigned t = __byte_perm(i < 4 ? w0 : w1, hi[i / 4], b | ((b + 4) << 8));
          unsigned h;
          asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(h) : "r"(t), "r"(magic));
          PAIR v = __hfma2(__hsub2(*reinterpret_cast<PAIR*>(&h), base), sc2[p][j], zb2[p][j]);
          tw[i] = *reinterpret_cast<unsigned*>(&v);
        }"""
# 4 bits by shifts and masks, as shipped until the seventeenth session (6
# instructions a pair; matmul.py's byte permute takes 4; never timed against
# it: h200-probe-linear-prmt4.jsonl's `prmt4` rows ran this decode again,
# the kernel `base` had built, see use_variant). `--variants shift4`.
_PERMUTE = linear._PACKED4_LOAD[linear._PACKED4_LOAD.index("const unsigned hi[2]"):]
_SHIFT4_LOAD = linear._PACKED4_LOAD.replace(
    _PERMUTE,
    """unsigned* tw = reinterpret_cast<unsigned*>(wv[p][j]);
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
          const unsigned t = (i < 4 ? u.x : u.y) >> (8 * (i & 3));
          unsigned h = (t & 0xFu) | ((t << 12) & 0xF0000u) | magic;
          PAIR v = __hfma2(__hsub2(*reinterpret_cast<PAIR*>(&h), base), s2, z2);
          tw[i] = *reinterpret_cast<unsigned*>(&v);
        }""",
)
_SHIPPED = (linear._SOURCE, linear._PACKED4_LOAD)


# 4 bits, decoded where the mma reads them: a lane keeps each tile's packed
# word pair, scale and bias (4 registers against the shipped 8 decoded ones)
# and decodes the two pairs an mma step takes just before it. With fewer
# registers a tile, wider column tiles fit (32 or 64 columns at 16 rows), so
# each x fragment a warp loads feeds more weight bytes: at 16 columns a lane
# loads 64 bytes of x for every 16 bytes of 4-bit weights. `--variants late4`.
_LATE_DECL = "    uint2 pu[P][NT];  // 16 consecutive k of one weight row, packed\n    PAIR sc2[P][NT], zb2[P][NT];\n"
_LATE_LOAD = """const size_t gi = wrow * (K / GS) + kk / GS;
        sc2[p][j].x = sc2[p][j].y = ws[p][gi];
        zb2[p][j].x = zb2[p][j].y = wz[p][gi];
        pu[p][j] = *reinterpret_cast<const uint2*>(wq[p] + (wrow * K + kk) / 8);"""
_LATE_MMA = """const unsigned wd = s < 2 ? pu[p][j].x : pu[p][j].y;
            const unsigned magic = MAGIC;
            const PAIR base = *reinterpret_cast<const PAIR*>(&magic);
            unsigned bw[2];
            #pragma unroll
            for (int e = 0; e < 2; ++e) {
              const unsigned b = (2 * s + e) & 3;
              const unsigned tt = __byte_perm(wd, wd >> 4, b | ((b + 4) << 8));
              unsigned h;
              asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(h) : "r"(tt), "r"(magic));
              PAIR v = __hfma2(__hsub2(*reinterpret_cast<PAIR*>(&h), base), sc2[p][j], zb2[p][j]);
              bw[e] = *reinterpret_cast<unsigned*>(&v);
            }
            mma16816(acc[p][m][j], a, bw[0], bw[1]);"""
_DECODED_DECL = "    uint4 wv[P][NT][2];  // 16 consecutive k of one weight row, as T\n"
_DECODED_MMA = """const unsigned* uw = reinterpret_cast<const unsigned*>(wv[p][j]);
            mma16816(acc[p][m][j], a, uw[2 * s], uw[2 * s + 1]);"""


def late_decode():
    """linear.py's kernel text with 4-bit weights decoded at the mma."""
    source = _SHIPPED[0]
    assert _DECODED_DECL in source and _DECODED_MMA in source, "matmul.py's loop changed"
    return source.replace(_DECODED_DECL, _LATE_DECL).replace(_DECODED_MMA, _LATE_MMA), _LATE_LOAD


def wide_fetch(unroll, load=_WIDE_LOAD):
    """linear.py's kernel text with the 64-k 4-bit fetch, unrolled `unroll` deep."""
    source = _SHIPPED[0]
    assert _LOOP in source and _LOOP_END in source, "matmul.py's loop changed"
    source = source.replace(_LOOP, _WIDE_LOOP.replace("UNROLL", str(unroll)))
    source = source.replace(_LOOP_END, _LOOP_END + "  }\n")
    return source, load


WIDE = {"wide4": 4, "wide4u2": 2, "wide4u1": 1}
WIDE_PRMT = {"wide4p": 4, "wide4pu2": 2, "wide4pu1": 1}

VARIANTS = {
    "base": [],
    "u1": [unroll(1)],
    "u2": [unroll(2)],
    # More weight loads in flight per warp: what the packed launches lack
    # (8 bytes a lane a step against dense's 32; h200-ncu-batch-cycle-qwen3-8b.txt).
    "u8": [unroll(8)],
    "nc256": [weights_via("ldw")],
    "coal": [coalesced],
    "coal_nc": [coalesced, weights_via("ldn", 4)],
    "coal_nc256": [coalesced, weights_via("ldw", 4)],
    "shift4": [],
    **{name: [] for name in WIDE},
    **{name: [] for name in WIDE_PRMT},
    "late4": [],
}
# Variants whose text assumes 4-bit words and one row tile.
FOUR_BIT_ONE_TILE = {*WIDE, *WIDE_PRMT, "late4"}

_original = mx.fast.cuda_kernel


def use_variant(name):
    """Route linear.py's kernel builds through `name`'s text edits."""
    edits = VARIANTS[name]

    def build(*, name: str, source: str, header: str = "", **kw):
        for e in edits:
            source = e(source)
        if edits:
            header += _LDW
        return _original(name=f"{name}_{tag}", source=source, header=header, **kw)

    tag = name
    mx.fast.cuda_kernel = build
    linear._kernels.clear()
    # matmul._plan keeps each kind of launch's kernel: without this, every
    # variant after the first ran the kernel the first built at that tiling
    # (so from 79244f7 to the thirty-seventh session, variants compared in one
    # run timed one kernel: bench/results/README.md, "Thirty-seventh session").
    linear._plan.cache_clear()
    linear._SOURCE, linear._PACKED4_LOAD = variant_text(name)


def variant_text(name):
    """(kernel source, 4-bit weight load) that variant `name` compiles."""
    if name in WIDE:
        return wide_fetch(WIDE[name])
    if name in WIDE_PRMT:
        return wide_fetch(WIDE_PRMT[name], _WIDE_PRMT_LOAD)
    if name == "late4":
        return late_decode()
    if name == "shift4":
        return _SHIPPED[0], _SHIFT4_LOAD
    return _SHIPPED


def parse(tiling):
    """'16x16' -> (16, 16) columns and warps; 'auto' -> linear.py's choice."""
    return (None, None) if tiling == "auto" else tuple(map(int, tiling.split("x")))


def fits(case, cols, warps, h, f):
    """Whether the tiling divides the case's shapes and its reduction buffer
    fits the 48 KB of static shared memory."""
    if cols is None:
        return True
    k = f if case == "down" else h
    panels = 2 if case == "gate_up" else 1
    return k % (64 * warps) == 0 and panels * warps * 16 * cols * 4 <= 48 * 1024


def timed(fn, reps=20):
    mx.eval(fn())
    ts = []
    for _ in range(reps):
        tic = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - tic)
    return sorted(ts)[len(ts) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=72)
    p.add_argument("--variants", default="base,u1,u2,nc256,coal,coal_nc,coal_nc256")
    p.add_argument("--tilings", default="auto,16x16,32x8")
    p.add_argument("--reps", type=int, default=20, help="0: one launch each, for ncu")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--bits", type=int, choices=(4, 8), help="packed weights (group 64)")
    p.add_argument("--stock", action="store_true", help="also time the stock ops")
    p.add_argument("--rounds", type=int, default=1,
                   help="time the variants this many times over, in turn (order effects)")
    a = p.parse_args()
    if FOUR_BIT_ONE_TILE & set(a.variants.split(",")) and (a.bits != 4 or a.rows > 16):
        p.error("the wide4 and late4 variants are for --bits 4 at 16 rows or fewer")
    h, f, v, kvh = 4096, 12288, 151936, 1024
    bf = mx.bfloat16
    rnd = lambda *s: (mx.random.normal(s) * s[-1] ** -0.5).astype(bf)
    sets = [
        dict(
            q=rnd(h, h),
            k=rnd(kvh, h),
            v=rnd(kvh, h),
            o=rnd(h, h),
            g=rnd(f, h),
            u=rnd(f, h),
            d=rnd(h, f),
            n1=rnd(h),
            n2=rnd(h),
        )
        for _ in range(8)
    ]
    head = rnd(v, h)
    x, hid = rnd(1, a.rows, h), rnd(1, a.rows, f)
    if a.bits:
        pack = lambda w: linear.Packed(*mx.quantize(w, 64, a.bits), 64, a.bits)
        sets = [{k: pack(w) if w.ndim == 2 else w for k, w in s.items()} for s in sets]
        head = pack(head)
    mx.eval(sets, head, x, hid)
    L = linear._launch
    cases = {  # name: (bytes of weights, one call for weight set s, cols, warps)
        "qkv": (
            2 * h * (h + 2 * kvh),
            lambda s, c, w: L(
                x, [s["q"], s["k"], s["v"]], norm=(s["n1"], 1e-6), cols=c, warps=w
            ),
        ),
        "o": (2 * h * h, lambda s, c, w: L(x, [s["o"]], residual=x, cols=c, warps=w)),
        "gate_up": (
            4 * h * f,
            lambda s, c, w: L(
                x, [s["g"], s["u"]], swiglu=True, norm=(s["n2"], 1e-6), cols=c, warps=w
            ),
        ),
        "down": (
            2 * h * f,
            lambda s, c, w: L(hid, [s["d"]], residual=x, cols=c, warps=w),
        ),
        "lm_head": (2 * h * v, lambda s, c, w: L(x, [head], cols=c, warps=w)),
    }
    if a.bits:  # bytes read: the packed words, scales and biases
        per = a.bits / 16 + 2 * 2 / 64 / 2
        cases = {n: (int(b * per), call) for n, (b, call) in cases.items()}

    def mm(y, w):
        if isinstance(w, linear.Packed):
            return mx.quantized_matmul(y, w.weight, w.scales, w.biases, True, 64, w.bits)
        return y @ w.T

    norm = lambda y, n: mx.fast.rms_norm(y, n, 1e-6)
    stock = {  # the same products as stock ops
        "qkv": lambda s: [mm(norm(x, s["n1"]), s[k]) for k in "qkv"],
        "o": lambda s: [x + mm(x, s["o"])],
        "gate_up": lambda s: [
            nn_silu(mm(norm(x, s["n2"]), s["g"])) * mm(norm(x, s["n2"]), s["u"])
        ],
        "down": lambda s: [x + mm(hid, s["d"])],
        "lm_head": lambda s: [mm(x, head)],
    }
    ref = {}
    use_variant("base")
    for name, (_, call) in cases.items():
        ref[name] = call(sets[0], None, None)
    mx.eval(ref)
    x1 = rnd(1, 1, h)
    if a.reps == 0:
        # One launch each, in this order, for a profiler (ncu) to time.
        order = []
        mx.eval(mm(x1, sets[1]["g"]), mm(hid[:, :1], sets[1]["d"]))
        order += ["gemv_1row gate", "gemv_1row down"]
        for var in a.variants.split(","):
            use_variant(var)
            for tiling in a.tilings.split(","):
                cols, warps = parse(tiling)
                for name, (_, call) in cases.items():
                    if not fits(name, cols, warps, h, f):
                        continue
                    try:
                        mx.eval(call(sets[2], cols, warps))
                    except Exception as e:  # e.g. too many resources requested
                        print(json.dumps({"skipped": f"{var} {cols}x{warps} {name}",
                                          "error": str(e)[:80]}), flush=True)
                        continue
                    order.append(f"{var} {cols}x{warps} {name}")
        print(json.dumps({"order": order}))
        mx.fast.cuda_kernel = _original
        return
    # MLX's gemv on one row, for the ceiling.
    t = timed(lambda: [mm(x1, sets[i % 8]["g"]) for i in range(a.calls)])
    gate_bytes = cases["down"][0]  # one h x f matrix, as stored
    print(json.dumps({"gemv_1row_gate_GBps": round(gate_bytes * a.calls / t / 1e9)}))
    if a.stock:
        row = {"variant": "stock ops", "rows": a.rows, "bits": a.bits}
        for name, (nbytes, _) in cases.items():
            calls = 4 if name == "lm_head" else a.calls
            t = timed(lambda: [stock[name](sets[i % 8]) for i in range(calls)], a.reps)
            row[name] = {"us": round(t / calls * 1e6, 1), "GBps": round(nbytes * calls / t / 1e9)}
        print(json.dumps(row), flush=True)
    # Rounds alternate the variants (A B A B ...): the same kernel timed first
    # and later in one run has differed by 5-20%, more than most variants do.
    for rnd_i, var in [(r, v) for r in range(a.rounds) for v in a.variants.split(",")]:
        use_variant(var)
        for tiling in a.tilings.split(","):
            cols, warps = parse(tiling)
            row = {"variant": var, "round": rnd_i, "cols": cols, "warps": warps,
                   "rows": a.rows, "bits": a.bits}
            total_b = total_t = 0.0
            for name, (nbytes, call) in cases.items():
                if not fits(name, cols, warps, h, f):
                    continue
                calls = 4 if name == "lm_head" else a.calls
                try:
                    t = timed(
                        lambda: [call(sets[i % 8], cols, warps) for i in range(calls)],
                        a.reps,
                    )
                except Exception as e:  # e.g. too many resources requested
                    row[name] = {"error": str(e)[:80]}
                    continue
                diff = max(
                    mx.abs(o.astype(mx.float32) - r.astype(mx.float32)).max().item()
                    for o, r in zip(call(sets[0], cols, warps), ref[name])
                )
                row[name] = {
                    "us": round(t / calls * 1e6, 1),
                    "GBps": round(nbytes * calls / t / 1e9),
                    "diff": diff,
                }
                if name != "lm_head":
                    total_b += nbytes * calls
                    total_t += t
            if total_t:
                row["layer_GBps"] = round(total_b / total_t / 1e9)
            print(json.dumps(row), flush=True)
    mx.fast.cuda_kernel = _original


if __name__ == "__main__":
    main()
