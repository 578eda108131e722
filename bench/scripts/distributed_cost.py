"""Cost model: tensor-parallel decoding of big Qwen3.5 MoE targets on 1, 2 and 4 Macs,
plain (one token per step) and with DFlash (one verify of B tokens per cycle).

Prints one Markdown table (bench/results/distributed.md has it, with the inputs):

    python bench/scripts/distributed_cost.py [--tau 4 --block 16 --context 2048]

Where each input comes from:

- Shapes: the models' config.json (Qwen/Qwen3.5-122B-A10B, Qwen/Qwen3.5-397B-A17B),
  as quoted in the sources named in `MODELS`; 4-bit affine quantization with
  group size 64 (mlx-community's 4-bit conversions): 4.5 bits a weight, router
  gates 8-bit.
- Collectives per layer and their payloads: the real mlx_lm code that
  `model.shard(group)` sets up (mlx_lm 0.32 `qwen3_5.py` / `qwen3_next.py`):
  a GatedDeltaNet layer ends in one all_sum (`linear_attn.sharding_group`), an
  attention layer in one (`o_proj` is a `ShardedToAllLinear`), the MoE block in
  one (`mlp.sharding_group`): two all-reduces of T x hidden activations (bf16)
  per layer, and one all_gather of the vocabulary-split head's T x V/N logits.
  Experts are split inside (each expert's intermediate width / N), not spread
  over ranks; with more ranks than KV heads (2) the K/V projections repeat.
- Machine: M3 Ultra-class memory bandwidth 800 GB/s at an assumed 60 %
  efficiency, 28 TFLOP/s fp16 at an assumed 50 % (a verify of 16 rows of a
  4-bit MoE is not purely bandwidth-bound).
- Links (reported, not measured here): Thunderbolt 5 RDMA (`jaccl`, full mesh)
  6-8 GB/s and 25-31 us a collective (the mid values are used); the `ring`
  backend over TCP on Thunderbolt: an order of magnitude more latency (JACCL's
  README) and 3 GB/s (assumed). A ring all-reduce takes 2(N-1) hops.
- Verify: non-expert weights are read once for the block; routed experts once
  per distinct expert the block's T tokens pick: between k (every token picks
  the same experts: optimistic) and E(1-(1-k/E)^T) (independent uniform
  routing: pessimistic). GatedDeltaNet state is read and written twice
  (verify, then the rollback's replay of the accepted steps).
- Draft (DFlash): replicated on every rank; a 5-layer bf16 Qwen3-style
  drafter of the target's width (MLP 3x hidden) plus the target's head rows,
  assumed; its cost does not shrink with N.
- tau (mean tokens per cycle, bonus included): an input (`--tau`), not a
  prediction.
"""

import argparse
from dataclasses import dataclass

Q4 = 4.5 / 8  # bytes a weight: 4 bits + fp16 scale and bias per 64
Q8 = 8.5 / 8
ACT = 2  # bf16 activations


@dataclass
class Shape:
    name: str
    source: str
    hidden: int
    layers: int
    attention_every: int  # full attention every n-th layer, GatedDeltaNet otherwise
    heads: int
    kv_heads: int
    head_dim: int
    lin_k_heads: int
    lin_v_heads: int
    lin_dim: int  # key and value head dims
    experts: int
    top_k: int
    expert_dim: int
    shared_dim: int
    vocab: int


MODELS = [
    Shape(
        "Qwen3.5-122B-A10B-4bit",
        "config.json as quoted in public repos found by the library search "
        "(48 layers = 36 GatedDeltaNet + 12 attention, hidden 3072, heads 32 / KV 2, "
        "GDN key / value heads 16 / 64, 256 experts top-8, expert and shared 1024)",
        hidden=3072,
        layers=48,
        attention_every=4,
        heads=32,
        kv_heads=2,
        head_dim=256,
        lin_k_heads=16,
        lin_v_heads=64,
        lin_dim=128,
        experts=256,
        top_k=8,
        expert_dim=1024,
        shared_dim=1024,
        vocab=248320,
    ),
    Shape(
        "Qwen3.5-397B-A17B-4bit",
        "mlx-community/Qwen3.5-397B-A17B-4bit model card and THUDM/slime "
        "scripts/models/qwen3.5-397B-A17B.sh (60 layers, 15 x (3 GDN + 1 attention), "
        "hidden 4096, heads 32 / KV 2 of 256, GDN 16 / 64 heads of 128, 512 experts "
        "top-10 + shared, 1024)",
        hidden=4096,
        layers=60,
        attention_every=4,
        heads=32,
        kv_heads=2,
        head_dim=256,
        lin_k_heads=16,
        lin_v_heads=64,
        lin_dim=128,
        experts=512,
        top_k=10,
        expert_dim=1024,
        shared_dim=1024,
        vocab=248320,
    ),
]


@dataclass
class Link:
    name: str
    alpha_us: float  # one collective between 2 ranks, small payload
    gb_per_s: float
    mesh: bool  # every pair linked (jaccl) or a ring (TCP)

    def all_reduce(self, n: int, nbytes: float) -> float:
        if n == 1:
            return 0.0
        hops = 1 if self.mesh else 2 * (n - 1)
        alpha = self.alpha_us * 1e-6 * (1 if self.mesh else 0.5)
        return hops * alpha + 2 * (n - 1) / n * nbytes / (self.gb_per_s * 1e9)

    def all_gather(self, n: int, nbytes_total: float) -> float:
        if n == 1:
            return 0.0
        hops = 1 if self.mesh else n - 1
        alpha = self.alpha_us * 1e-6 * (1 if self.mesh else 0.5)
        return hops * alpha + (n - 1) / n * nbytes_total / (self.gb_per_s * 1e9)


LINKS = [
    Link("TB5 RDMA (jaccl)", alpha_us=28.0, gb_per_s=7.0, mesh=True),
    Link("TB ring over TCP", alpha_us=280.0, gb_per_s=3.0, mesh=False),
]


@dataclass
class Machine:
    gb_per_s: float = 800.0
    bw_eff: float = 0.6
    tflops: float = 28.0
    flop_eff: float = 0.5


def forward(m: Shape, n: int, tokens: int, *, context: int, routing: str):
    """(bytes read per rank, flops per rank, collective count, bytes per all-reduce,
    head all_gather bytes) of one target forward over `tokens` rows on n ranks."""
    H = m.hidden
    n_attn = m.layers // m.attention_every
    n_gdn = m.layers - n_attn
    key_dim = m.lin_k_heads * m.lin_dim
    value_dim = m.lin_v_heads * m.lin_dim
    gdn_w = H * (2 * key_dim + value_dim) + H * value_dim + 2 * H * m.lin_v_heads
    gdn_w += value_dim * H
    kv_per_rank = max(1, m.kv_heads // n)
    attn_q_o = H * 2 * m.heads * m.head_dim + m.heads * m.head_dim * H  # gated q
    attn_kv_rank = 2 * H * kv_per_rank * m.head_dim
    expert = 3 * H * m.expert_dim
    shared = 3 * H * m.shared_dim
    if routing == "optimistic" or tokens == 1:
        distinct = m.top_k
    else:
        distinct = m.experts * (1 - (1 - m.top_k / m.experts) ** tokens)
    # Weights: split over ranks except the router and the repeated K/V heads.
    split = n_gdn * gdn_w + n_attn * attn_q_o + m.layers * (distinct * expert + shared)
    weights = Q4 * (split / n + n_attn * attn_kv_rank)
    weights += Q8 * m.layers * H * m.experts  # router gates, replicated
    weights += Q4 * m.vocab * H / n  # the vocabulary-split head
    state = 2 * m.lin_v_heads * m.lin_dim * m.lin_dim * 4 / n * n_gdn
    state *= 1 if tokens == 1 else 2  # verify, then the rollback's replay
    kv = n_attn * 2 * kv_per_rank * m.head_dim * (context + tokens) * ACT
    nbytes = weights + state + kv
    flops = 2 * tokens * (
        (n_gdn * gdn_w + n_attn * attn_q_o + m.layers * (m.top_k * expert + shared))
        / n
        + m.vocab * H / n
    )
    return nbytes, flops, 2 * m.layers, tokens * H * ACT, tokens * m.vocab * ACT


def step_seconds(m, n, tokens, link, machine, *, context, routing="pessimistic"):
    """(compute, collectives) seconds of one forward over `tokens` rows."""
    nbytes, flops, count, payload, head = forward(
        m, n, tokens, context=context, routing=routing
    )
    compute = max(
        nbytes / (machine.gb_per_s * 1e9 * machine.bw_eff),
        flops / (machine.tflops * 1e12 * machine.flop_eff),
    )
    comm = count * link.all_reduce(n, payload) + link.all_gather(n, head)
    return compute, comm


def draft_seconds(m: Shape, machine: Machine, layers: int = 5) -> float:
    """One draft pass: memory-bound (a block of B rows through a few layers)."""
    H = m.hidden
    per_layer = 4 * H * H + 3 * H * 3 * H  # attention + MLP, bf16
    nbytes = layers * per_layer * 2 + Q4 * m.vocab * H  # + the target head (full)
    return nbytes / (machine.gb_per_s * 1e9 * machine.bw_eff)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tau", type=float, nargs="+", default=[4.0, 6.0])
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--rdma-us", type=float, default=28.0, help="one 2-rank collective")
    p.add_argument("--tcp-us", type=float, default=280.0, help="one 2-rank collective")
    args = p.parse_args()
    LINKS[0].alpha_us, LINKS[1].alpha_us = args.rdma_us, args.tcp_us
    machine = Machine()
    taus = args.tau
    print(
        "| target | Macs | link | step ms (weights + collectives) | plain tok/s "
        "(× 1 Mac) | "
        f"verify ms, B={args.block} (pess. / opt.) | verify / step | "
        + " | ".join(
            f"DFlash tok/s τ={t:g} (pess. / opt.) | speedup τ={t:g} vs plain here"
            for t in taus
        )
        + " |"
    )
    print("|" + "---|" * (7 + 2 * len(taus)))
    for m in MODELS:
        draft = draft_seconds(m, machine)
        one = sum(step_seconds(m, 1, 1, LINKS[0], machine, context=args.context))
        for n in (1, 2, 4):
            for link in LINKS if n > 1 else LINKS[:1]:
                c1, k1 = step_seconds(m, n, 1, link, machine, context=args.context)
                step = c1 + k1
                verify = {
                    r: sum(
                        step_seconds(
                            m, n, args.block, link, machine,
                            context=args.context, routing=r,
                        )
                    )  # fmt: skip
                    for r in ("pessimistic", "optimistic")
                }
                cells = [
                    m.name,
                    str(n),
                    link.name if n > 1 else "-",
                    f"{step * 1e3:.1f} ({c1 * 1e3:.1f} + {k1 * 1e3:.1f})",
                    f"{1 / step:.1f} ({one / step:.2f}×)",
                    f"{verify['pessimistic'] * 1e3:.1f} / {verify['optimistic'] * 1e3:.1f}",
                    f"{verify['pessimistic'] / step:.2f} / {verify['optimistic'] / step:.2f}",
                ]
                for t in taus:
                    tps = {r: t / (v + draft) for r, v in verify.items()}
                    cells.append(f"{tps['pessimistic']:.1f} / {tps['optimistic']:.1f}")
                    cells.append(
                        f"{tps['pessimistic'] * step:.2f}× / {tps['optimistic'] * step:.2f}×"
                        f" (1 Mac plain: {tps['pessimistic'] * one:.2f}× / "
                        f"{tps['optimistic'] * one:.2f}×)"
                    )
                print("| " + " | ".join(cells) + " |")
    print()
    print(
        "Draft pass (replicated, every N): "
        + ", ".join(
            f"{m.name} {draft_seconds(m, machine) * 1e3:.1f} ms"
            for m in MODELS
        )
        + f"; context {args.context} tokens."
    )


if __name__ == "__main__":
    main()
