"""`mlx-dflash generate`: one prompt in, the target's own greedy answer out."""

import argparse
import json
import os
import sys

from .stream import stream_generate
from .device import backend, device_info, traps
from .distributed import World, same_seed
from .fallback import Fallback
from .load import (
    add_engine_args,
    check_engine_args,
    engine_options,
    load_pair,
    one_line_errors,
)
from .lookup import lookup_of
from .memory import available_memory, check_memory, gb, memory_model
from .sampling import SamplingParams
from .warmup import warm_up


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_engine_args(parser)
    parser.add_argument(
        "--prompt", "-p", required=True, help="the prompt ('-' reads stdin)"
    )
    parser.add_argument("--max-tokens", "-m", type=int, default=256)
    parser.add_argument(
        "--no-chat-template", action="store_true", help="use the prompt as raw text"
    )
    parser.add_argument("--system", default=None, help="optional system message")
    parser.add_argument(
        "--temp", type=float, default=0.0, help="sampling temperature (0 = greedy)"
    )
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None, help="PRNG seed for sampling")
    parser.add_argument(
        "--max-memory-gb",
        type=float,
        default=None,
        help="refuse to start when the estimated memory (weights + caches) "
        "exceeds this (default: what the device has free)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: text, token ids, stats",
    )
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="say which drafter, drafter dtype (and why) and memory estimate are used",
    )
    return parser


def encode_prompt(
    tokenizer, prompt: str, *, chat: bool, system=None, template_args=None
):
    if chat and tokenizer.has_chat_template:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, **(template_args or {})
        )
    return tokenizer.encode(prompt)


def read_prompt(arg: str) -> str:
    """`--prompt`, or stdin for '-', decoded strictly as UTF-8."""
    # argv arrives surrogate-escaped; fsencode gives back its bytes.
    data = sys.stdin.buffer.read() if arg == "-" else os.fsencode(arg)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        where = "the prompt on stdin" if arg == "-" else "--prompt"
        byte = f"byte {data[e.start]:#04x} at offset {e.start}"
        raise ValueError(f"{where} is not valid UTF-8 ({byte})") from None


def log(args, message: str):
    if args.verbose and args.world.leader:
        print(message, file=sys.stderr, flush=True)


def run(args) -> dict:
    check_engine_args(args)
    # Under mlx.launch: the target split across the ranks; rank 0 prints.
    world = args.world = World.init(pipeline=args.pipeline)
    prompt_text = read_prompt(args.prompt)
    sampling = same_seed(world, SamplingParams.from_options(args, temperature=args.temp))
    options = engine_options(args)
    pair = load_pair(args.model, args.draft, **options, world=world)
    target, tokenizer, drafter = pair.target, pair.tokenizer, pair.drafter
    block_size, policy = pair.block_size, pair.draft_dtype
    uses_draft = pair.uses_draft_model
    if pair.from_registry:
        log(args, f"[mlx-dflash] drafter for {args.model}: {pair.draft} (registry)")
    if uses_draft:
        log(args, f"[mlx-dflash] drafter dtype {policy.name}: {policy.reason}")
    info, where = device_info(), backend()
    for trap in traps(info, where, dtype=options["dtype"]) if world.leader else ():
        print(f"[mlx-dflash] warning: {trap}", file=sys.stderr)
    prompt = encode_prompt(
        tokenizer,
        prompt_text,
        chat=not args.no_chat_template,
        system=args.system,
        template_args=args.chat_template_args,
    )
    prompt = world.share(list(prompt))  # rank 0's ids (stdin went to every rank)
    limit = None if args.max_memory_gb is None else int(args.max_memory_gb * 1e9)
    estimate = memory_model(target, drafter).estimate(
        len(prompt),
        args.max_tokens,
        block_size=block_size,
        prefill_step=args.prefill_step_size,
        backend=where,
    )
    available = available_memory(info, where, limit=limit)
    log(
        args,
        f"[mlx-dflash] memory: ~{gb(estimate.new)} for {estimate.tokens} tokens "
        f"beyond {gb(estimate.weights)} of weights; "
        f"{'unknown' if available is None else gb(available)} available",
    )
    check_memory(estimate, available)
    # Only the sampling steps of this run's setting: the generation warms the rest.
    warm_up(target, drafter, block_size, [sampling], generate=False)
    pieces, tokens = [], []
    last = None
    for r in stream_generate(
        target,
        tokenizer,
        prompt,
        drafter,
        max_tokens=args.max_tokens,
        block_size=block_size,
        prefill_step_size=args.prefill_step_size,
        sampling=sampling,
        # The fallback times cycles on each rank; its choices could differ.
        fallback=None if args.no_fallback or world.size > 1 else Fallback(),
    ):
        pieces.append(r.text)
        tokens.append(r.token)
        if not args.json and world.leader:
            print(r.text, end="", flush=True)
        last = r
    if last.finish_reason == "stop":
        tokens = tokens[:-1] if tokens[-1] in tokenizer.eos_token_ids else tokens
    result = {
        "text": "".join(pieces),
        "tokens": tokens,
        "finish_reason": last.finish_reason,
        "prompt_tokens": last.prompt_tokens,
        "generation_tokens": len(tokens),
        "prompt_tps": round(last.prompt_tps, 3),
        "generation_tps": round(last.generation_tps, 3),
        "peak_memory_gb": round(last.peak_memory, 3),
        "drafter": drafter.name if pair.speculative else "none",
        "draft_dtype": policy.name if uses_draft else None,
        "draft_dtype_reason": policy.reason if uses_draft else None,
        "draft_quantize": args.draft_quantize if uses_draft else None,
        # Tokens the drafter may propose (None: the whole vocabulary).
        "draft_vocab": len(drafter.vocab) if uses_draft and drafter.vocab is not None else None,
        # --prompt-lookup as resolved (None: off).
        "prompt_lookup": lookup_of(drafter) if uses_draft else None,
        "stats": last.stats.as_dict(),
        "distributed": world.info(),
    }
    return result


def main(argv=None):
    parser = build_parser(
        argparse.ArgumentParser(
            prog="mlx-dflash generate",
            description="Generate with DFlash speculative decoding. Greedy output is "
            "token for token the target's own; with --temp, speculative sampling keeps "
            "the output distributed exactly as sampling from the target alone. Under "
            "mlx.launch the target is split across the ranks and rank 0 prints.",
        )
    )
    args = parser.parse_args(argv)
    with one_line_errors(parser):
        result = run(args)
    if not args.world.leader:
        return
    if args.json:
        print(json.dumps(result))
        return
    s = result["stats"]
    fb = s["fallback"]
    tau = "n/a" if s["tau"] is None else f"{s['tau']:.2f}"
    acc = "n/a" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.1%}"
    lookup = " + prompt lookup" if result["prompt_lookup"] else ""
    print(
        f"\n==========\nprompt: {result['prompt_tokens']} tokens, "
        f"{result['prompt_tps']:.1f} tok/s | generation: {result['generation_tokens']} "
        f"tokens, {result['generation_tps']:.1f} tok/s | drafter {result['drafter']}{lookup}, "
        f"block {s['block_size']}, tau {tau} (mean accepted length incl. bonus), "
        f"per-draft-token acceptance {acc}, "
        f"fallback: {fb['plain_tokens']} tokens plain in {fb['plain_seconds']:.2f} s "
        f"({fb['probes']} probes), {fb['speculative_tokens']} speculative in "
        f"{fb['speculative_seconds']:.2f} s | "
        f"peak memory {result['peak_memory_gb']:.2f} GB",
        file=sys.stderr,
    )
