"""Probe: one decode step vs one 16-token verify of a real-shape random target.

Times, at a fixed context length, (a) stock mlx_lm: one token with a plain cache,
(b) our Target: a 16-token verify with its cache (bucketed KV, fused GatedDeltaNet
on CUDA) followed by a rollback that keeps 7 positions. Random bf16 weights.

    python bench/probe_verify.py qwen3_8b|qwen3_5_9b [--layers N] [--context 1024]
"""

import argparse
import json
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import _get_classes

from mlx_dflash.rollback import rollback, snapshot
from mlx_dflash.target import Target

SHAPES = {
    "qwen3_8b": dict(
        model_type="qwen3",
        hidden_size=4096,
        num_hidden_layers=36,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        vocab_size=151936,
        max_position_embeddings=40960,
        rope_theta=1e6,
        tie_word_embeddings=False,
    ),
    "qwen3_5_9b": dict(
        model_type="qwen3_5",
        text_config=dict(
            model_type="qwen3_5_text",
            hidden_size=4096,
            num_hidden_layers=32,
            intermediate_size=12288,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=256,
            rms_norm_eps=1e-6,
            vocab_size=248320,
            max_position_embeddings=262144,
            linear_num_value_heads=32,
            linear_num_key_heads=16,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            full_attention_interval=4,
            tie_word_embeddings=False,
            rope_parameters=dict(
                type="default", rope_theta=1e7, partial_rotary_factor=0.25
            ),
        ),
    ),
}


def build(name, layers):
    cfg = json.loads(json.dumps(SHAPES[name]))
    (cfg.get("text_config") or cfg)["num_hidden_layers"] = (
        layers or (cfg.get("text_config") or cfg)["num_hidden_layers"]
    )
    model_cls, args_cls = _get_classes(cfg)
    model = model_cls(args_cls.from_dict(cfg))
    model.set_dtype(mx.bfloat16)
    model.eval()  # as mlx_lm.load does: inference kernels, not the training path
    mx.eval(model.parameters())
    return model


def timed(fn, reps):
    times = []
    for _ in range(reps):
        tic = time.perf_counter()
        fn()
        times.append((time.perf_counter() - tic) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=list(SHAPES))
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    model = build(args.shape, args.layers)
    prompt = mx.random.randint(0, 1000, (1, args.context))

    # (a) stock: one decode step at this context length.
    cache = make_prompt_cache(model)
    mx.eval(model(prompt, cache=cache))

    def ar_step():
        mx.eval(model(mx.array([[5]]), cache=cache))
        for c in cache:
            if hasattr(c, "trim") and c.is_trimmable():
                c.trim(1)
            else:
                pass  # GatedDeltaNet state just advances; cost is what matters

    for _ in range(3):
        ar_step()
    ar_ms = timed(ar_step, args.reps)

    # (b) ours: 16-token verify + rollback to 7 kept positions, same context.
    target = Target(model)
    tcache = target.make_cache()
    mx.eval(target.forward(prompt, tcache, last_only=True)[0])
    block = mx.random.randint(0, 1000, (1, 16))

    def verify_cycle():
        saved = snapshot(tcache, target.delta_taps)
        logits, _ = target.forward(block, tcache)
        mx.eval(mx.argmax(logits, -1))
        rollback(tcache, target.delta_taps, saved, verified=16, kept=7)
        mx.eval([c.state for c in tcache])
        # Return to the same context length so every rep measures the same thing.
        for c in tcache:
            if hasattr(c, "offset"):
                c.trim(7)

    for _ in range(3):
        verify_cycle()
    verify_ms = timed(verify_cycle, args.reps)
    print(
        json.dumps(
            {
                "shape": args.shape,
                "layers": args.layers,
                "context": args.context,
                "ar_step_ms": round(ar_ms, 3),
                "verify16_plus_rollback_ms": round(verify_ms, 3),
                "ratio": round(verify_ms / ar_ms, 3),
                "device": str(mx.default_device()),
            }
        )
    )


if __name__ == "__main__":
    main()
