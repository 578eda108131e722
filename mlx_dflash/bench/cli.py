"""`mlx-dflash bench`: stock mlx_lm against speculative decoding, one table out.

Examples:
  mlx-dflash bench --draft lookup,engine --max-tokens 128          # default pair
  mlx-dflash bench --shape qwen3-8b --draft engine --tau 4,6.5,9   # random 8B shape
  mlx-dflash bench --draft path/to/draft --temp 0,0.7,1.0            # τ per temperature
  mlx-dflash bench --draft DIR,zlab:DIR      # ours beside z-lab's reference loop
  mlx-dflash bench --draft lookup --concurrency 1,2,4   # C requests at once
  mlx.launch -n 2 --backend ring -- mlx-dflash bench --shape tiny-qwen3.5 --draft lookup
                                    # target split across ranks; rank 0 reports
"""

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import List

from ..distributed import World
from ..fallback import POLICY_HELP
from ..load import one_line_errors
from ..sampling import SamplingParams
from ..warmup import PROMPT_TOKENS, warm_up
from . import report
from .arms import load, make_arms
from .runner import Case, run_case
from .shapes import PRESETS
from .suites import SUITES, suite_prompts


def _floats(s):
    return [float(x) for x in s.split(",") if x]


def _ints(s):
    return [int(x) for x in s.split(",") if x]


def _draft_bits(s):
    """`--draft-quantize`: a comma list of 4, 8 or none (the draft as built)."""
    out = []
    for x in s.split(","):
        if x not in ("4", "8", "none"):
            raise argparse.ArgumentTypeError(f"{x!r} is not 4, 8 or none")
        out.append(None if x == "none" else int(x))
    return out


def _names(s):
    return [x for x in s.split(",") if x]


def build_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--model",
        help="target: HF repo, mlx_lm directory or .gguf (default: the default GGUF)",
    )
    src.add_argument(
        "--shape", choices=sorted(PRESETS), help="random-weight target of a named shape"
    )
    p.add_argument(
        "--peaked",
        action="store_true",
        help="with --shape: condition the random weights so every greedy choice wins "
        "by a wide margin (same shapes and cost; plain random weights have near-flat "
        "logits, so bf16 rounding alone flips tokens and token match is meaningless)",
    )
    p.add_argument(
        "--quantize",
        type=int,
        choices=(4, 8),
        help="with --shape: affine-quantize the target's Linear and Embedding layers "
        "to this many bits after building it (mlx.nn.quantize, as mlx_lm.convert -q)",
    )
    p.add_argument(
        "--group-size",
        type=int,
        choices=(32, 64, 128),
        default=64,
        help="quantization group size for --quantize and --draft-quantize (default 64)",
    )
    p.add_argument(
        "--draft-quantize",
        type=_draft_bits,
        default=[None],
        help="quantize the engine arms' random DFlash draft to this many bits; a "
        "comma list (none,4) runs every engine arm once per choice, alternating "
        "within each case (checkpoint drafts: append @q4 / @q8 to the path)",
    )
    p.add_argument(
        "--draft",
        type=_names,
        default=["engine"],
        help="comma list of: engine (real-size random DFlash forward + oracle tokens at --tau), "
        "lookup (prompt lookup), or a DFlash checkpoint directory; append @q8 or @q4 "
        "to a checkpoint to quantize its Linear layers (e.g. DIR,DIR@q8,DIR@q4), and "
        "@full to draft over the whole vocabulary instead of its draft_vocab.json "
        "(e.g. DIR,DIR@full), @lookup / @nolookup to turn prompt lookup's help on or "
        "off (default: on for the shipped drafter only; see generate --prompt-lookup); "
        "zlab:DIR runs z-lab's reference loop (dflash.model_mlx.stream_generate; "
        "pip install --no-deps dflash==0.1.0) with that checkpoint on its own copy "
        "of the target (e.g. DIR,zlab:DIR)",
    )
    p.add_argument(
        "--fallback",
        action="store_true",
        help="run speculative arms with the acceptance-collapse fallback that "
        "`generate` and `serve` use by default: "
        + POLICY_HELP
        + " (default: full-block speculation every cycle, measuring the drafter)",
    )
    p.add_argument(
        "--tau",
        type=_floats,
        default=[4.0, 6.5, 9.0],
        help="engine mode: target τ values",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="verify block size (default: a checkpoint's own, else 16)",
    )
    p.add_argument(
        "--draft-layers",
        type=int,
        default=None,
        help="engine draft depth (default 5 for shapes, 1 otherwise)",
    )
    p.add_argument(
        "--suites",
        type=_names,
        default=["code", "math", "chat", "copy_edit"],
        help=f"comma list of {','.join(SUITES)}",
    )
    p.add_argument("--prompts-per-suite", type=int, default=None)
    p.add_argument(
        "--synthetic-tokens",
        type=int,
        default=128,
        help="prompt length of short suites for --shape targets",
    )
    p.add_argument(
        "--max-tokens",
        type=_ints,
        default=[256],
        help="comma list of generation lengths",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--concurrency",
        type=_ints,
        default=None,
        help="comma list of request counts decoded at once (e.g. 1,2,4): per arm, "
        "stock mlx_lm's BatchGenerator, our one-at-a-time loop and our batched "
        "verify on the same C prompts (the suites' prompts in turn, the first "
        "--max-tokens each, greedy): aggregate and per-stream tok/s, TTFT",
    )
    p.add_argument(
        "--cooldown",
        type=float,
        default=1.0,
        help="seconds of sleep after each timed run",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        default=None,
        help="target/draft dtype (default: bfloat16 for --shape, the file's otherwise)",
    )
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument(
        "--block-linear",
        type=_names,
        default=["auto"],
        help="verify and draft blocks through the linear layers with our kernel "
        "(linear.py): auto (on CUDA, where it exists), on, or off (MLX's own "
        "products); a comma list (on,off) runs every arm once per choice, "
        "alternating within each case",
    )
    p.add_argument(
        "--attention-kernel",
        type=_names,
        default=["auto"],
        help="verify blocks attend through our kernels (flash.py: norms and RoPE "
        "in one launch, split-K attention over the valid keys): auto (on CUDA), "
        "on, or off; a comma list runs every arm once per choice, as "
        "--block-linear does",
    )
    p.add_argument(
        "--draft-flush",
        type=_names,
        default=["auto"],
        help="a DFlash draft pass starts every N-th layer's output while the rest is "
        "built: auto (every layer on CUDA, off elsewhere) or N (0: off); a comma list "
        "runs every arm once per choice, as --block-linear does",
    )
    p.add_argument(
        "--verify-flush",
        type=_names,
        default=["auto"],
        help="a verify pass starts every E-th layer's output while the rest is built: "
        "auto (every 4th on CUDA, off elsewhere), E (0: off) or E@F (the first start "
        "after F layers, then every E-th); a comma list runs every arm once per "
        "choice, as --block-linear does",
    )
    p.add_argument(
        "--no-profile", action="store_true", help="skip the per-part cycle profile"
    )
    p.add_argument(
        "--warm-up",
        action="store_true",
        help="before the first case, warm every speculative arm as `serve` does before "
        "it reports ready (one short generation per --temp value, its sampling steps "
        "at every block shape): the JSON's cold runs are then the first requests a "
        "warmed server answers",
    )
    p.add_argument("--no-png", action="store_true")
    p.add_argument(
        "--temp",
        type=_floats,
        default=[0.0],
        help="comma list of sampling temperatures; 0 = greedy. At T > 0 stock mlx_lm "
        "samples with make_sampler and ours with lossless speculative sampling",
    )
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="random weights, engine schedules, and sampling: repeat r draws from seed + r",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output stem (writes STEM.json/.md/.png); default bench/results/bench-<time>",
    )
    p.add_argument("--title", default=None)
    return p


def _progress(total):
    # A redirected stderr (a log file) gets one timestamped line per run instead
    # of a live bar, which rich would only draw when it stops.
    try:
        if not sys.stderr.isatty():
            raise ImportError
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        prog = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            transient=False,
        )
        prog.start()
        task = prog.add_task("bench", total=total)
        return (lambda msg: prog.update(task, advance=1, description=msg)), prog.stop
    except ImportError:
        n = [0]

        def step(msg):
            n[0] += 1
            stamp = time.strftime("%H:%M:%S")
            print(f"{stamp} [{n[0]}/{total}] {msg}", file=sys.stderr, flush=True)

        return step, lambda: None


def sampling_settings(args) -> List[SamplingParams]:
    """One `SamplingParams` per `--temp` value (validated there), seeded with `--seed`."""
    if not args.temp:
        raise ValueError("--temp needs at least one temperature")
    return [SamplingParams.from_options(args, temperature=t) for t in args.temp]


def run(args, argv) -> dict:
    if args.block_size is not None and args.block_size < 2:
        raise ValueError(f"--block-size must be >= 2, got {args.block_size}")
    samplings = sampling_settings(args)
    # Under mlx.launch: the target split across the ranks; rank 0 reports.
    world = args.world = World.init()
    if world.size > 1 and args.fallback:
        raise ValueError(
            "--fallback times cycles on each rank, whose choices could differ: "
            "leave it out under mlx.launch"
        )
    target, tokenizer, label, make_draft = load(args)
    vocab = target.vocab_size
    arms = make_arms(args, target, vocab, make_draft)
    if args.warm_up:
        for arm in (a for a in arms if a.run is None):
            # An engine arm's oracle needs a continuation; any tokens do here.
            drafter = arm.start(list(range(1, PROMPT_TOKENS + 4 * arm.block_size)))
            warm_up(target, drafter, arm.block_size, samplings)
    cases = []
    for suite in args.suites:
        for pid, ids in suite_prompts(
            suite,
            tokenizer,
            vocab_size=vocab,
            limit=args.prompts_per_suite,
            synthetic_tokens=args.synthetic_tokens,
            seed=args.seed,
        ):
            for n in args.max_tokens:
                for sp in samplings:
                    cases.append(Case(suite, pid, ids, n, sp))
    if args.concurrency:
        from .concurrency import run_from_args

        runs = len(args.concurrency) * len(arms) * 3 * (args.repeats + 1)
        step, stop = _progress(runs)
        try:
            return run_from_args(args, target, label, arms, cases, on_run=step)
        finally:
            stop()
    per_case = (
        1 + len(arms) + (0 if args.no_profile else 1) + args.repeats * (len(arms) + 1)
    )
    if world.leader:
        step, stop = _progress(per_case * len(cases))
    else:
        step, stop = (lambda msg: None), (lambda: None)
    results = []
    try:
        for case in cases:
            results.append(
                run_case(
                    target,
                    case,
                    arms,
                    repeats=args.repeats,
                    cooldown=args.cooldown,
                    prefill_step=args.prefill_step_size,
                    profile=not args.no_profile,
                    on_run=lambda m, c=case: step(f"{c.suite}/{c.name} {m}"),
                )
            )
    finally:
        stop()
    settings = {k: v for k, v in vars(args).items() if k != "world"}
    sizes = sorted({a.block_size for a in arms})
    settings.update(
        target=label,
        block_size=sizes[0] if len(sizes) == 1 else sizes,
        arms=[a.name for a in arms],
        draft_layers=args.draft_layers,
        greedy=all(sp.greedy for sp in samplings),
        eos="off (fixed lengths)",
        distributed=world.info(),
        baseline="mlx_lm.generate.generate_step"
        + (
            ""
            if all(sp.greedy for sp in samplings)
            else " (T > 0: sampler=mlx_lm.sample_utils.make_sampler(temp, top_p, "
            "min_p, top_k), mx.random.seed(seed + repeat))"
        ),
    )
    blocks = ",".join(str(b) for b in sizes)
    results = {
        "title": args.title or f"mlx-dflash bench: {label}, block {blocks}",
        "settings": settings,
        "environment": report.environment(),
        "cases": results,
    }
    results["by_temperature"] = report.by_temperature(results)
    return results


# How the results name the program that ran: a probe wrapper around the bench
# (bench/probes/with_variant.py) puts its own command here, so that results it
# produced say so.
PROGRAM = "mlx-dflash bench"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(
        argparse.ArgumentParser(
            prog="mlx-dflash bench",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(argv)
    with one_line_errors(parser):
        results = run(args, argv)
    if not args.world.leader:
        return
    stem = Path(args.out or f"bench/results/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    command = PROGRAM + " " + " ".join(shlex.quote(a) for a in argv)
    if "concurrency" in results:
        from .concurrency import table, write

        paths = write(results, stem, command)
        print(table(results["concurrency"]))
        print("wrote " + ", ".join(str(p) for p in paths))
        return
    paths = report.write(results, stem, command, png=not args.no_png)
    print(report.table(results))
    print("wrote " + ", ".join(str(p) for p in paths))
    head = [
        {
            "case": f"{c['suite']}/{c['name']}",
            "arm": n,
            "temp": c.get("sampling", {}).get("temperature", 0.0),
            "speedup": round(a["speedup"]["median"], 3),
            "tau": a["spec"]["tau"],
            "efficiency": round(a.get("efficiency", float("nan")), 3),
        }
        for c in results["cases"]
        for n, a in c["arms"].items()
    ]
    print(json.dumps(head))


if __name__ == "__main__":
    main()
