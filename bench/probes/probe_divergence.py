"""Probe: where a greedy DFlash run's output leaves mlx_lm's own greedy output, and by how much
the target's choice was decided there.

    python bench/probes/probe_divergence.py [--model GGUF] [--draft DIR] [--prompts 24] [--max-tokens 128]

The H200 eval of the eighteenth session found the old held-out list (`train/held_out.json`)
not identical to plain greedy for either drafter, while the natural set and the agent
transcripts were (bench/results/train-natural-s18-eval-h200.json). A 16-row verify and a
one-row step reach a token's logits by different products (the block kernels against MLX's
own, other summation orders), so where the target's top two logits are nearly tied the two
paths may pick differently. For each prompt: the first position where the two outputs
differ, both tokens, and at that position mlx_lm's own step logits of both (their gap) and
of its top two. One JSON line per prompt, then a summary line.
"""

import argparse
import json

import mlx.core as mx


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="target (default: the default GGUF)")
    p.add_argument("--draft", default=None, help="drafter (default: the shipped one)")
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--dtype", default=None)
    a = p.parse_args()

    from mlx_lm.generate import generate_step as stock_step

    from mlx_dflash.decode import generate_step
    from mlx_dflash.load import DEFAULT_DRAFT, load_pair
    from mlx_dflash.train.data import build_prompts, encode

    pair = load_pair(a.model, a.draft or str(DEFAULT_DRAFT), dtype=getattr(mx, a.dtype) if a.dtype else None)
    tok, target = pair.tokenizer, pair.target
    stops = set(tok.eos_token_ids)
    _, held = build_prompts(seed=0)
    diverged = 0
    for i, h in enumerate(held[: a.prompts]):
        ids = encode(tok, h.text)
        ours = []
        for t, _ in generate_step(target, ids, pair.drafter.fresh(), max_tokens=a.max_tokens, block_size=16, stop_tokens=sorted(stops)):
            ours.append(int(t))
        stock, lps = [], []
        for t, lp in stock_step(mx.array(ids), target.model, max_tokens=len(ours)):
            stock.append(int(t))
            lps.append(lp)
            if int(t) in stops:
                break
        at = next((k for k, (x, y) in enumerate(zip(ours, stock)) if x != y), None)
        row = {"prompt": i, "tokens": len(ours), "identical": ours == stock}
        if at is not None:
            diverged += 1
            lp = lps[at].astype(mx.float32)
            top = mx.argsort(-lp)[:2].tolist()
            row.update(
                position=at,
                ours=ours[at],
                stock=stock[at],
                gap_stock_minus_ours=round(float(lp[stock[at]] - lp[ours[at]]), 5),
                stock_top2=top,
                stock_top2_gap=round(float(lp[top[0]] - lp[top[1]]), 5),
            )
        print(json.dumps(row), flush=True)
    print(json.dumps({"prompts": min(a.prompts, len(held)), "diverged": diverged, "dtype": str(pair.target.embed(mx.array([[0]])).dtype)}))


if __name__ == "__main__":
    main()
