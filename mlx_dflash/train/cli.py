"""`mlx-dflash train`: distil a DFlash drafter for an mlx_lm model.

    mlx-dflash train --model M --out DIR [--data data.npz] [--steps N] ...
    mlx-dflash train --eval-only [--model M] [--out DIR] [--eval-sets natural,long,old]

Stages: build the offline prompt set -> the target answers it (batched greedy,
a share sampled with --sampled-share; cached as DIR/data.npz) -> train ->
held-out tau at block 16 (greedy, output checked against mlx_lm's own greedy
decoding) -> DIR holds a z-lab format checkpoint (config.json +
model.safetensors, bf16) plus report.json. `--eval-only` runs the eval suites
(evaluate.py: natural held-out prompts by category, long agent contexts, the
old list; greedy and sampled) on DIR (default: the shipped drafter against the
default target) and prints the result as one JSON line.
"""

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

import mlx.core as mx

from .evaluate import add_eval_args, eval_only, held_out_tau
from .trainer import TrainArgs

# SmolLM2's `<empty_output>` (id 16): a Jupyter-notebook control token that the
# chat template never emits and chat answers never contain.
DEFAULT_MASK_TOKENS = {49152: 16}


def build_parser(parser=None):
    p = parser or argparse.ArgumentParser(
        prog="mlx-dflash train", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--model",
        default=None,
        help="HF repo, mlx_lm directory or .gguf (default: SmolLM2-135M GGUF)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="dequantize the target to this dtype (float32 is faster on CPU)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="checkpoint directory (required unless --eval-only, which reads it; "
        "default there: the shipped drafter)",
    )
    p.add_argument(
        "--gen-only",
        action="store_true",
        help="stop once the data set (DIR/data.npz) and DIR/report.json are written",
    )
    p.add_argument(
        "--eval-only",
        action="store_true",
        help="only print the held-out tau of the drafter in --out",
    )
    p.add_argument(
        "--data",
        nargs="+",
        default=None,
        help="reuse data.npz files of earlier runs (joined; a prompt answered "
        "twice counts once)",
    )
    p.add_argument(
        "--extend",
        action="store_true",
        help="with --data: also answer the training prompts those files lack",
    )
    p.add_argument(
        "--gen-shard",
        default=None,
        metavar="K/N",
        help="answer only the K-th of N interleaved shares of the prompts to "
        "answer (one process per GPU; join the results with --data)",
    )
    p.add_argument(
        "--prompt-set",
        default="wide",
        choices=["core", "wide", "natural"],
        help="core: module-level stdlib callables x 8 code templates + 100 topics "
        "x 12 general templates (13.4k prompts); wide: adds class methods, more "
        "modules, templates and topics (49.8k, contains core); natural: "
        "--natural-prompts natural requests + the first --wide-prompts of wide + "
        "--long-prompts agent transcripts (natural.py)",
    )
    p.add_argument(
        "--natural-prompts", type=int, default=20000, help="natural set: requests like people's"
    )
    p.add_argument(
        "--natural-pieces",
        type=int,
        default=1,
        choices=[1, 2, 3, 4, 5, 6],
        help="natural set: version of the hand-written pieces its requests are "
        "composed from (1: the default drafter's stages 3-5; 2: its stage 6, those and more "
        "tasks, request phrasings, concept questions, chat topics, word problems, "
        "pasted project snippets, files and text to edit, non-coding tool harnesses; "
        "3: those and more kinds of math problems and everyday questions; "
        "4: those and, for a third of each category, whole requests written free-form "
        "by other authors: natural_free.json; 5: those and a second set, natural_free_2.json, "
        "drawn for 60%% of each category; 6: those and a third, natural_free_3.json, "
        "drawn for 70%%)",
    )
    p.add_argument(
        "--wide-prompts", type=int, default=6000, help="natural set: 'wide' prompts kept in the mix"
    )
    p.add_argument(
        "--long-prompts", type=int, default=1000, help="natural set: long agent transcripts"
    )
    p.add_argument(
        "--self-requests",
        type=int,
        default=0,
        metavar="N",
        help="natural set: also N user requests the target writes itself, sampled "
        "from its chat template at --self-temperature (self_requests.py), then "
        "answered like the rest; their generation counts against --gen-time-budget",
    )
    p.add_argument("--self-temperature", type=float, default=0.8)
    p.add_argument(
        "--long-tokens",
        default="1024,7552",
        metavar="MIN,MAX",
        help="natural set: transcript prompt lengths (drawn uniformly)",
    )
    p.add_argument(
        "--sampled-share",
        type=float,
        default=0.0,
        help="share of the prompts (seeded) answered by sampling at --sample-temperature",
    )
    p.add_argument("--sample-temperature", type=float, default=1.0)
    p.add_argument(
        "--gen-batch-tokens",
        type=int,
        default=None,
        help="cap on rows x (prompt + new tokens) per generation batch (long prompts)",
    )
    p.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="use only this many training prompts",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=256, help="response length cap"
    )
    p.add_argument(
        "--gen-batch", type=int, default=512, help="sequences generated at once"
    )
    p.add_argument(
        "--gen-time-budget",
        type=float,
        default=None,
        help="seconds of generation at most",
    )
    p.add_argument(
        "--val-share",
        type=float,
        default=0.0,
        help="hold this share of the data's sequences (seeded) out of training and "
        "report greedy decoding's tau on them (walked from one teacher-forced pass) "
        "at the start, every --val-every steps and at the end: unseen answers of the "
        "same draw",
    )
    p.add_argument(
        "--val-natural",
        action="store_true",
        help="answer the natural held-out set (greedy, --max-new-tokens) and report "
        "greedy decoding's tau on it like --val-share's; monitoring only, never "
        "trained on",
    )
    p.add_argument("--layers", type=int, default=2, help="draft layers")
    p.add_argument(
        "--features",
        type=int,
        default=None,
        help="target layers tapped (default: --layers)",
    )
    p.add_argument(
        "--intermediate-size",
        type=int,
        default=None,
        help="draft MLP width (default: target's)",
    )
    p.add_argument(
        "--mask-token-id", type=int, default=None, help="unused embedding row for MASK"
    )
    p.add_argument(
        "--eval-prompts", type=int, default=16, help="held-out prompts for tau"
    )
    p.add_argument("--eval-max-tokens", type=int, default=128)
    add_eval_args(p)
    p.add_argument(
        "--save-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"]
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from DIR's checkpoint"
    )
    p.add_argument(
        "--init",
        default=None,
        metavar="DRAFT_DIR",
        help="start from this drafter's weights (fresh optimizer and schedule) "
        "instead of a random initialisation; --resume of a checkpoint in DIR wins",
    )
    p.add_argument(
        "--grow-layers",
        type=int,
        default=None,
        metavar="N",
        help="with --init: append layers up to N, each a copy of the last with its "
        "output projections zeroed, so the grown drafter starts as the --init one",
    )
    for f in fields(TrainArgs):
        flag = "--" + f.name.replace("_", "-")
        typ = type(f.default) if f.default is not None else float
        p.add_argument(flag, type=typ, default=f.default, help=f.metadata.get("help"))
    return p


def load_target(model, dtype=None):
    from ..load import load_target as _load

    # `load_pair`'s target; model None: the default one in fp32 on CPU.
    return _load(model, dtype=None if dtype is None else getattr(mx, dtype))


def mask_token_for(tokenizer, vocab: int, override=None) -> int:
    if override is not None:
        if not 0 <= override < vocab:
            raise ValueError(
                f"--mask-token-id {override} is outside the vocabulary ({vocab})"
            )
        return override
    if vocab in DEFAULT_MASK_TOKENS:
        return DEFAULT_MASK_TOKENS[vocab]
    raise ValueError(
        f"no known unused embedding row for a {vocab}-token vocabulary: pass --mask-token-id"
    )


def _answer_missing(target, tokenizer, prompts, reused, a):
    """`reused` plus the target's answers to the `prompts` it lacks (or this
    process's `--gen-shard` share of them), and the seconds that took."""
    import random

    from .data import Dataset, generate_responses
    from .prompts import encode_prompt

    have = reused.prompt_set()
    ids = [
        t for t in (encode_prompt(tokenizer, p) for p in prompts) if tuple(t) not in have
    ]
    if a.gen_shard:
        k, n = a.gen_shard
        ids = ids[k::n]
    # A seeded share answered by sampling (the rest greedy), each in its own batches.
    rng = random.Random(a.seed + 7)
    pick = [rng.random() < a.sampled_share for _ in ids]
    groups = [([t for t, s in zip(ids, pick) if not s], 0.0)]
    groups += [([t for t, s in zip(ids, pick) if s], a.sample_temperature)]

    def progress(done, n, tok, el):
        print(
            f"generate: {done}/{n} prompts, {tok} tokens, {el:.0f}s, "
            f"{tok / max(el, 1e-9):.0f} tok/s",
            file=sys.stderr,
            flush=True,
        )

    tg, parts = time.perf_counter(), [reused]
    for group, temp in groups:
        if not group:
            continue
        # The time budget is split by the groups' shares of the prompts.
        budget = a.gen_time_budget and a.gen_time_budget * len(group) / len(ids)
        parts.append(
            generate_responses(
                target,
                group,
                stop_tokens=sorted(tokenizer.eos_token_ids),
                max_tokens=a.max_new_tokens,
                batch_size=a.gen_batch,
                time_budget=budget,
                seed=a.seed,
                max_batch_tokens=a.gen_batch_tokens,
                temperature=temp,
                progress=progress,
            )
        )
    return Dataset.join(parts), round(time.perf_counter() - tg, 1)


def validation_sets(target, tokenizer, data, a):
    """(training data, {name: validation set}) for `--val-share` / `--val-natural`.

    The held-out share is the same for the same --seed and data (a resumed run
    holds out what the first call did)."""
    import numpy as np

    from .data import Dataset
    from .evaluate import natural_held_out

    val = {}
    if a.val_share > 0:
        order = np.random.default_rng(a.seed + 11).permutation(len(data))
        n = int(round(len(data) * a.val_share))
        if not 0 < n < len(data):
            raise SystemExit(
                f"error: --val-share {a.val_share}: holds out {n} of {len(data)} sequences"
            )
        val["draw"], data = data.subset(np.sort(order[:n])), data.subset(np.sort(order[n:]))
    if a.val_natural:
        ns = argparse.Namespace(**{**vars(a), "gen_shard": None, "sampled_share": 0.0})
        val["natural"], _ = _answer_missing(
            target, tokenizer, natural_held_out(), Dataset.from_lists([], []), ns
        )
    for name, d in val.items():
        print(f"val {name}: {len(d)} sequences, {d.response_tokens()} response tokens", file=sys.stderr)
    return data, val


def training_prompts(tokenizer, a, seed):
    """The prompt set of `--prompt-set` (natural: the explicit mix of its flags)."""
    from .data import build_prompts

    if a.prompt_set != "natural":
        return build_prompts(seed=seed, wide=a.prompt_set == "wide")[0]
    from .natural import long_prompts, natural_prompts

    lo, hi = (int(x) for x in a.long_tokens.split(","))
    wide = build_prompts(seed=seed, wide=True)[0][: a.wide_prompts]
    return (
        natural_prompts(a.natural_prompts, seed=seed, pieces=a.natural_pieces)
        + wide
        + long_prompts(tokenizer, a.long_prompts, seed=seed, lengths=(lo, hi))
    )


def written_requests(target, tokenizer, a):
    """(`--self-requests` requests the target writes, seconds that took);
    at most a third of `--gen-time-budget` is spent on them."""
    from .evaluate import natural_held_out
    from .self_requests import self_requests

    t0 = time.perf_counter()
    own = self_requests(
        target,
        tokenizer,
        a.self_requests,
        seed=a.seed,
        temperature=a.self_temperature,
        batch_size=a.gen_batch,
        time_budget=a.gen_time_budget and a.gen_time_budget / 3,
        held_out=natural_held_out(),
    )
    spent = round(time.perf_counter() - t0, 1)
    print(f"self requests: {len(own)} of {a.self_requests} kept, {spent}s", file=sys.stderr)
    return own, spent


def _check_inputs(a):
    """Fail on bad arguments before the target is loaded."""
    if a.gen_shard:
        try:
            k, n = (int(x) for x in a.gen_shard.split("/"))
        except ValueError:
            k, n = -1, 0
        if not 0 <= k < n:
            raise SystemExit(
                f"error: --gen-shard {a.gen_shard}: need K/N with 0 <= K < N"
            )
        a.gen_shard = (k, n)
    for f in a.data or []:
        if not Path(f).is_file():
            raise SystemExit(f"error: --data {f}: no such file")
    if a.init and not (Path(a.init) / "config.json").is_file():
        raise SystemExit(f"error: --init {a.init}: no config.json there")
    if a.grow_layers is not None and not (a.init and a.grow_layers > 0):
        raise SystemExit("error: --grow-layers: needs --init and a positive layer count")
    try:
        lo, hi = (int(x) for x in a.long_tokens.split(","))
    except ValueError:
        lo, hi = 0, -1
    if not 0 < lo <= hi:
        raise SystemExit(f"error: --long-tokens {a.long_tokens}: need MIN,MAX with 0 < MIN <= MAX")
    if a.self_requests < 0 or a.self_temperature <= 0:
        raise SystemExit(
            f"error: --self-requests {a.self_requests} / --self-temperature "
            f"{a.self_temperature}: need N >= 0 and T > 0"
        )
    if a.self_requests and a.prompt_set != "natural":
        raise SystemExit(
            f"error: --self-requests {a.self_requests}: needs --prompt-set natural"
        )
    if not 0 <= a.sampled_share <= 1:
        raise SystemExit(f"error: --sampled-share {a.sampled_share}: need 0 <= F <= 1")
    if not 0 <= a.soft_labels <= 1:
        raise SystemExit(f"error: --soft-labels {a.soft_labels}: need 0 <= W <= 1")
    if a.soft_top_k < 1:
        raise SystemExit(f"error: --soft-top-k {a.soft_top_k}: need K >= 1")


def main(argv=None):
    from .checkpoint import train_finished
    from .data import Dataset
    from .trainer import init_draft, train

    a = build_parser().parse_args(argv)
    if a.eval_only:
        return eval_only(a)
    if a.out is None:
        raise SystemExit("error: --out is required (unless --eval-only)")
    _check_inputs(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    targs = TrainArgs(**{f.name: getattr(a, f.name) for f in fields(TrainArgs)})
    t0 = time.perf_counter()
    target, tokenizer = load_target(a.model, a.dtype)
    vocab = target.vocab_size
    report = {
        "command": "mlx-dflash train "
        + " ".join(sys.argv[1:] if argv is None else argv)
    }

    data_path = out / "data.npz"
    if data_path.is_file():  # a resumed run
        data = Dataset.load(data_path)
        print(f"data: {len(data)} sequences from {data_path}", file=sys.stderr)
    else:
        reused = Dataset.join([Dataset.load(f) for f in a.data or []])
        if a.data:
            print(
                f"data: {len(reused)} sequences from {' '.join(a.data)}",
                file=sys.stderr,
            )
        data = reused
        if not a.data or a.extend:
            train_prompts = training_prompts(tokenizer, a, targs.seed)
            if a.num_prompts:
                train_prompts = train_prompts[: a.num_prompts]
            if a.self_requests:
                own, spent = written_requests(target, tokenizer, a)
                train_prompts += own
                report.update(self_requests=len(own), self_request_seconds=spent)
                if a.gen_time_budget:
                    a.gen_time_budget = max(a.gen_time_budget - spent, 1.0)
            data, seconds = _answer_missing(target, tokenizer, train_prompts, reused, a)
            report["generate_seconds"] = seconds
        data.save(data_path)
    report.update(sequences=len(data), response_tokens=data.response_tokens())
    print(
        f"data: {len(data)} sequences, {data.response_tokens()} response tokens",
        file=sys.stderr,
    )
    if a.gen_only:
        return _save_report(out, report, t0)
    if len(data) == 0:
        # Generation that produced nothing (its time budget spent on loading, say).
        raise SystemExit(f"error: {data_path}: no training sequences (generate more first)")

    if (a.resume and (out / "config.json").is_file()) or a.init:
        from ..draft import load_draft

        src = out if a.resume and (out / "config.json").is_file() else Path(a.init)
        draft = load_draft(src, target=target, dtype=mx.float32)
        if a.grow_layers and src != out:
            from .trainer import grow_draft

            draft = grow_draft(draft, a.grow_layers)
    else:
        draft = init_draft(
            target,
            num_layers=a.layers,
            num_features=a.features,
            mask_token_id=mask_token_for(tokenizer, vocab, a.mask_token_id),
            block_size=targs.block_size,
            intermediate_size=a.intermediate_size,
            seed=targs.seed,
        )
    data, val = validation_sets(target, tokenizer, data, a)
    if val:
        report["val_sequences"] = {name: len(d) for name, d in val.items()}
    tt = time.perf_counter()
    history = train(
        draft,
        target,
        data,
        targs,
        out=out,
        resume=a.resume,
        val=val,
        log=lambda m: print(m, file=sys.stderr),
    )
    report["train_seconds"] = round(time.perf_counter() - tt, 1)
    report["history"] = [h for h in history if "loss" in h][-5:]
    if val:
        report["val"] = [h for h in history if "val" in h]
    # Ship in a half-precision dtype; fp32 weights for --resume stay in
    # DIR/train_state.
    draft.set_dtype(getattr(mx, a.save_dtype))
    from ..draft import save_draft

    save_draft(draft, out)
    if not train_finished(out):
        print(
            "stopped before the end of the schedule (--stop-seconds): run the "
            "same command with --resume to continue",
            file=sys.stderr,
        )
    elif a.eval_prompts:
        report["held_out"] = held_out_tau(target, tokenizer, draft, a)
    return _save_report(out, report, t0)


def _save_report(out: Path, report: dict, t0: float) -> dict:
    """DIR/report.json: the command, the data (and the generation's time and
    self-written requests), the training's history; `report` returned."""
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    with open(out / "report.json", "w") as f:
        json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
