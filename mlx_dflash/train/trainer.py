"""The training loop: batches of sequences, AdamW with warmup + cosine, clipping,
checkpoints (checkpoint.py) and resume, a progress line; the τ evaluation."""

import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from ..draft import DFlashDraft, DraftArgs, default_target_layer_ids
from .checkpoint import load_state, save_state
from .data import Dataset
from .objective import (
    block_loss,
    default_gamma,
    dense_head,
    label_rows,
    sample_anchors,
    soft_labels,
    target_features,
)


@dataclass
class TrainArgs:
    steps: int = field(
        default=2000, metadata={"help": "optimizer steps (sets the schedule)"}
    )
    batch_size: int = field(default=16, metadata={"help": "sequences per step"})
    anchors: int = field(default=512, metadata={"help": "max anchors per sequence"})
    block_size: int = field(default=16, metadata={"help": "block size B"})
    gamma: Optional[float] = field(
        default=None, metadata={"help": "loss decay (7 for B=16)"}
    )
    lr: float = field(default=6e-4, metadata={"help": "peak learning rate"})
    warmup: int = field(default=100, metadata={"help": "linear warmup steps"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "cosine floor / peak"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "global grad-norm clip"})
    max_len: int = field(default=1024, metadata={"help": "truncate sequences"})
    batch_tokens: Optional[int] = field(
        default=None,
        metadata={
            "help": "cap on sequences x padded length per batch: batches of long "
            "sequences hold fewer (and similar lengths are batched together)"
        },
    )
    soft_labels: float = field(
        default=0.0,
        metadata={
            "help": "weight (0-1) of the target's own next-token distributions "
            "(its top --soft-top-k probabilities) in the loss; the rest is the "
            "cross-entropy with the data's tokens"
        },
    )
    soft_top_k: int = field(
        default=16, metadata={"help": "target probabilities kept per position"}
    )
    seed: int = field(default=0, metadata={"help": "rng seed"})
    save_every: int = field(
        default=500, metadata={"help": "checkpoint interval (steps)"}
    )
    report_every: int = field(
        default=10, metadata={"help": "progress interval (steps)"}
    )
    val_every: int = field(
        default=500,
        metadata={
            "help": "steps between the validation sets' tau estimates "
            "(--val-share, --val-natural; also at the end)"
        },
    )
    time_budget: Optional[float] = field(
        default=None,
        metadata={
            "help": "seconds of training in all, --resume calls included; the "
            "step count shrinks to fit after step 30 of each call"
        },
    )
    stop_seconds: Optional[float] = field(
        default=None,
        metadata={
            "help": "end this call after this many seconds of training "
            "(checkpointed; continue with --resume)"
        },
    )


def init_draft(
    target,
    *,
    num_layers: int = 2,
    num_features: Optional[int] = None,
    mask_token_id: int,
    block_size: int = 16,
    intermediate_size: Optional[int] = None,
    seed: int = 0,
) -> DFlashDraft:
    """A fresh drafter shaped after the target (hidden size, heads, rope)."""
    a = target.lm.args
    n_feat = num_features or num_layers
    head_dim = getattr(a, "head_dim", None) or a.hidden_size // a.num_attention_heads
    args = DraftArgs(
        hidden_size=target.hidden_size,
        intermediate_size=intermediate_size or a.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_key_value_heads,
        rms_norm_eps=a.rms_norm_eps,
        vocab_size=a.vocab_size,
        target_layer_ids=default_target_layer_ids(target.num_layers, n_feat),
        mask_token_id=mask_token_id,
        block_size=block_size,
        num_target_layers=target.num_layers,
        head_dim=head_dim,
        rope_theta=float(getattr(a, "rope_theta", 1e6)),
        rope_scaling=getattr(a, "rope_scaling", None),
        max_position_embeddings=getattr(a, "max_position_embeddings", 40960),
    )
    mx.random.seed(seed)
    draft = DFlashDraft(args)
    draft.set_dtype(mx.float32)
    mx.eval(draft.parameters())
    return draft


def grow_draft(draft: DFlashDraft, num_layers: int) -> DFlashDraft:
    """`draft` with layers appended up to `num_layers`, computing the same
    function at first: each new layer is a copy of the last one with its
    o_proj and down_proj zeroed, so both residual branches add nothing until
    training moves them (zero-initialised residual branches, as in
    function-preserving growth). Starting a larger drafter this way keeps
    everything the smaller one learned instead of training from scratch."""
    old = draft.args
    if num_layers <= old.num_hidden_layers:
        return draft
    extra = num_layers - old.num_hidden_layers
    args = replace(
        old,
        num_hidden_layers=num_layers,
        layer_types=list(old.layer_types) + [old.layer_types[-1]] * extra,
    )
    grown = DFlashDraft(args)
    grown.update(draft.parameters())  # the shared weights and layers 0..L-1
    last = draft.layers[-1].parameters()
    for layer in grown.layers[old.num_hidden_layers :]:
        layer.update(last)
        attn_o, mlp_down = layer.self_attn.o_proj, layer.mlp.down_proj
        attn_o.weight = mx.zeros_like(attn_o.weight)
        mlp_down.weight = mx.zeros_like(mlp_down.weight)
    grown.set_dtype(draft.dtype)
    mx.eval(grown.parameters())
    return grown


def schedule(args: TrainArgs, total: List[int]):
    """Linear warmup then cosine to min_lr_ratio; `total[0]` may shrink mid-run."""

    def lr(step):
        step = step.astype(mx.float32)
        warm = mx.minimum(1.0, (step + 1) / max(1, args.warmup))
        span = max(1, total[0] - args.warmup)
        t = mx.clip((step - args.warmup) / span, 0.0, 1.0)
        cos = args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (
            1 + mx.cos(math.pi * t)
        )
        return args.lr * warm * cos

    return lr


def make_batch(
    data: Dataset, idx: Sequence[int], args: TrainArgs, rng: np.random.Generator
):
    """Right-padded tokens, lengths, anchors, their validity and the label rows
    that count (`label_rows`) for `idx`."""
    seqs = [data.sequence(i)[: args.max_len] for i in idx]
    S = max(len(s) for s in seqs)
    S = -(-S // 64) * 64  # few distinct shapes: fewer kernel compiles on GPU
    anchors = [
        sample_anchors(int(data.prompt_lens[i]), len(s), args.anchors, rng)
        for i, s in zip(idx, seqs)
    ]
    A = max(1, max(len(a) for a in anchors))
    A = -(-A // 16) * 16
    tok = np.zeros((len(seqs), S), dtype=np.int32)
    anc = np.zeros((len(seqs), A), dtype=np.int32)
    val = np.zeros((len(seqs), A), dtype=bool)
    for n, (s, a) in enumerate(zip(seqs, anchors)):
        tok[n, : len(s)] = s
        anc[n, : len(a)] = a
        val[n, : len(a)] = True
    lengths = np.array([len(s) for s in seqs], dtype=np.int32)
    counts = np.array([len(a) for a in anchors])
    rows = label_rows(anc, counts, lengths, args.block_size)
    return (
        mx.array(tok),
        mx.array(lengths),
        mx.array(anc),
        mx.array(val),
        mx.array(rows),
    )


def shuffled(data: Dataset, args: TrainArgs, rng: np.random.Generator) -> np.ndarray:
    """A random order of the sequences; with `batch_tokens`, sorted by length
    within windows of 64 batches, so long sequences share their batches, and
    those batch-sized groups shuffled (the time budget measures a mix)."""
    order = rng.permutation(len(data))
    if not args.batch_tokens:
        return order
    lens = np.minimum(np.diff(data.offsets)[order], args.max_len)
    bs, groups = args.batch_size, []
    for i in range(0, len(order), 64 * bs):
        win = order[i : i + 64 * bs][np.argsort(lens[i : i + 64 * bs], kind="stable")]
        part = [win[j : j + bs] for j in range(0, len(win), bs)]
        groups += [part[k] for k in rng.permutation(len(part))]
    return np.concatenate(groups)


def batch_rows(data: Dataset, idx: np.ndarray, args: TrainArgs) -> int:
    """How many of `idx` (the next `batch_size` in order) the batch takes."""
    if not args.batch_tokens:
        return len(idx)
    lens = -(-np.minimum(np.diff(data.offsets)[idx], args.max_len) // 64) * 64
    fits = np.arange(1, len(idx) + 1) * np.maximum.accumulate(lens) <= args.batch_tokens
    return max(1, int(fits.sum()))  # a prefix: the product only grows


def every_position_batches(target, data: Dataset, args: TrainArgs):
    """`data` in order as `make_batch` batches with a block anchored at every
    response position: yields (idx, (tokens, lengths, anchors, real, rows),
    target features)."""
    args = replace(args, anchors=1 << 30)
    rng = np.random.default_rng(0)  # unused: all positions are anchors
    pos = 0
    while pos < len(data):
        idx = np.arange(pos, min(pos + args.batch_size, len(data)))
        idx = idx[: batch_rows(data, idx, args)]
        pos += len(idx)
        batch = make_batch(data, idx, args, rng)
        yield idx, batch, target_features(target, batch[0])


def walk_cycles(runs: np.ndarray, data: Dataset, idx, max_len: int) -> list:
    """[(tokens, cycles)] of greedy decodes of `idx`'s answers, row r of `runs`
    holding the correct run of the block anchored at each response position
    of idx[r], in order: a cycle anchored at p keeps its run plus the bonus
    token, and the next is anchored after them (no bonus past the end)."""
    out = []
    for r, i in enumerate(idx):
        first = int(data.prompt_lens[i])
        end = min(len(data.sequence(i)), max_len)  # as make_batch truncates
        p, tokens, cycles = first, 0, 0
        while p <= end - 2:  # a cycle needs a token after its anchor
            take = min(int(runs[r, p - first]) + 1, end - 1 - p)
            tokens, cycles, p = tokens + take, cycles + 1, p + take
        out.append((tokens, cycles))
    return out


def tau_by(keys, per_sequence) -> dict:
    """{key: tau pooled over its sequences}, as `estimate_tau` pools them all
    (`keys`: one a sequence, e.g. its category)."""
    sums = {}
    for k, (tokens, cycles) in zip(keys, per_sequence):
        t, c = sums.get(k, (0, 0))
        sums[k] = (t + tokens, c + cycles)
    return {k: round(t / max(c, 1), 3) for k, (t, c) in sorted(sums.items())}


def estimate_tau(draft: DFlashDraft, target, data: Dataset, args: TrainArgs, *, head=None) -> dict:
    """Greedy decoding's tau of `draft` on `data`'s answers, from one
    teacher-forced pass instead of a decode.

    The answers are the target's greedy ones, so a greedy decode of their
    prompts would produce them exactly, and a cycle anchored at response
    position p accepts the run of block positions the drafter gets right
    there, plus the bonus token. Scoring a block at every response position
    (as training scores one) gives every such run at once; walking the
    cycles from the first response token (p -> p + run + 1) gives the
    decode's cycles, and tau = tokens / cycles as `--eval-only` pools it. On
    a GPU a hundred answers take a forward, not minutes of decoding.

    Returns {"tau_est", "loss", "first": first-position accuracy over every
    position, "cycles", "per_sequence": [(tokens, cycles)] in `data`'s order}.
    """
    gamma = args.gamma or default_gamma(args.block_size)
    head = head or dense_head(target, draft.dtype)
    loss = weight = correct = valid = 0.0
    per_sequence = []
    for idx, (tok, lengths, anc, real, rows), feats in every_position_batches(target, data, args):
        batch_loss, st = block_loss(
            draft, target, tok, lengths, feats, anc, real, gamma=gamma, rows=rows, head=head
        )
        n = st["blocks"].item()
        loss, weight = loss + batch_loss.item() * n, weight + n
        correct, valid = correct + st["correct"][0].item(), valid + st["valid"][0].item()
        per_sequence += walk_cycles(np.array(st["run"]), data, idx, args.max_len)
    tokens, cycles = (sum(x) for x in zip(*per_sequence)) if per_sequence else (0, 0)
    return {
        "tau_est": tokens / max(cycles, 1),
        "loss": loss / max(weight, 1),
        "first": correct / max(valid, 1),
        "cycles": cycles,
        "per_sequence": per_sequence,
    }


class Progress:
    """One status line: step, loss, lr, tokens/s, per-block tau estimate, eta."""

    def __init__(self, total: int, stream=sys.stderr):
        self.stream, self.total, self.t0 = stream, total, time.perf_counter()
        self.tty = stream.isatty()

    def update(self, step: int, total: int, **vals):
        el = time.perf_counter() - self.t0
        eta = el / max(step, 1) * (total - step)
        width = 20
        fill = int(width * step / max(total, 1))
        bar = "#" * fill + "." * (width - fill)
        parts = " ".join(f"{k} {v}" for k, v in vals.items())
        line = f"[{bar}] {step}/{total} {parts} | {el:.0f}s eta {eta:.0f}s"
        print(
            ("\r" if self.tty else "") + line,
            end="" if self.tty else "\n",
            file=self.stream,
            flush=True,
        )

    def close(self):
        if self.tty:
            print(file=self.stream)


def train(
    draft: DFlashDraft,
    target,
    data: Dataset,
    args: TrainArgs,
    *,
    out,
    resume: bool = False,
    stop_after: Optional[int] = None,
    val: Optional[Dict[str, Dataset]] = None,
    log=print,
):
    """Train `draft` on `data` against the frozen `target`; checkpoints go to `out`.

    `stop_after` ends the run at that step (checkpointed), as an interruption
    would; `resume=True` continues from the checkpoint in `out`. `val` names
    sets never trained on: at the start, every `args.val_every` steps and at
    the end each gets `estimate_tau` (greedy decoding's tau from one
    teacher-forced pass), logged and recorded without the per-sequence lists.

    Returns the per-step history of (loss, tau estimate) at report steps, and
    the validation records ({"step", "val": {name: estimate}}).
    """
    out = Path(out)
    gamma = args.gamma or default_gamma(args.block_size)
    total = [args.steps]
    lr_at = schedule(args, total)
    opt = optim.AdamW(learning_rate=lr_at, weight_decay=args.weight_decay)
    opt.init(draft.trainable_parameters())
    rng = np.random.default_rng(args.seed)
    order, pos = shuffled(data, args, rng), 0
    start, prior_seconds = 0, 0.0
    if resume and (out / "train_state" / "trainer_state.json").is_file():
        st = load_state(out, draft, opt)
        start, total[0] = st["step"], st["total_steps"]
        rng.bit_generator.state = st["rng"]
        order, pos = np.array(st["order"]), st["pos"]
        prior_seconds = st.get("seconds", 0.0)
        log(f"resumed from {out} at step {start}")
    target.set_capture_layers(draft.args.target_layer_ids)
    if len(data) == 0:
        raise ValueError("the training set is empty")
    head = dense_head(target, draft.dtype)

    def loss_fn(model, tok, lengths, feats, anc, val, rows, soft):
        return block_loss(
            model,
            target,
            tok,
            lengths,
            feats,
            anc,
            val,
            gamma=gamma,
            rows=rows,
            head=head,
            soft=soft,
            soft_weight=args.soft_labels,
        )

    grad_fn = nn.value_and_grad(draft, loss_fn)

    def step_fn(tok, lengths, anc, val, rows):
        if args.soft_labels > 0:
            feats, soft = soft_labels(target, tok, args.soft_top_k)
        else:
            feats, soft = target_features(target, tok), None
        (loss, stats), grads = grad_fn(draft, tok, lengths, feats, anc, val, rows, soft)
        grads, norm = optim.clip_grad_norm(grads, args.grad_clip)
        opt.update(draft, grads)
        return loss, stats, norm

    def next_batch():
        nonlocal order, pos
        if pos + args.batch_size > len(order):
            order, pos = shuffled(data, args, rng), 0
        idx = order[pos : pos + args.batch_size]
        idx = idx[: batch_rows(data, idx, args)]
        pos += len(idx)
        return make_batch(data, idx, args, rng)

    prog = Progress(total[0])
    history, acc = [], dict(loss=0.0, n=0, accepted=0, blocks=0, tokens=0)
    t_start = time.perf_counter()
    clock = dict(last=t_start, ten=t_start)

    def read(step, loss, stats):
        """Account one finished step: time-budget fit, progress line."""
        acc["loss"] += loss.item()
        acc["n"] += 1
        acc["accepted"] += stats["accepted"].item()
        acc["blocks"] += stats["blocks"].item()
        acc["tokens"] += int(stats["valid"].sum().item())
        now = time.perf_counter()
        if step == start + 10:
            clock["ten"] = now  # the first steps include kernel compiles
        if step == start + 30 and args.time_budget:
            per = (now - clock["ten"]) / 20
            left = args.time_budget - prior_seconds - (now - t_start)
            fit = step + int(left / per)
            if fit < total[0]:
                total[0] = max(fit, step + 1)
                log(f"time budget: {per * 1000:.0f} ms/step, training {total[0]} steps")
        if step % args.report_every == 0 or step == total[0]:
            tau = 1 + acc["accepted"] / max(acc["blocks"], 1)
            rec = dict(step=step, loss=acc["loss"] / acc["n"], tau_est=tau)
            history.append(rec)
            # From the schedule: the optimizer may already be a step ahead.
            lr = lr_at(mx.array(step - 1)).item()
            prog.update(
                step,
                total[0],
                loss=f"{rec['loss']:.3f}",
                tau_est=f"{tau:.2f}",
                lr=f"{lr:.1e}",
                tok_s=f"{acc['tokens'] / (now - clock['last']):.0f}",
            )
            acc.update(loss=0.0, n=0, accepted=0, blocks=0, tokens=0)
            clock["last"] = now

    def save(step):
        save_state(
            out,
            draft,
            opt,
            {
                "step": step,
                "total_steps": total[0],
                "rng": rng.bit_generator.state,
                "order": order.tolist(),
                "pos": pos,
                "seconds": prior_seconds + time.perf_counter() - t_start,
                "args": asdict(args),
            },
        )

    validated = [None]  # the step last validated

    def validate(step):
        if not val:
            return
        validated[0] = step
        est = {
            name: estimate_tau(draft, target, d, args, head=head)
            for name, d in val.items()
        }
        for e in est.values():
            del e["per_sequence"]
        history.append({"step": step, "val": est})
        for name, e in est.items():
            log(
                f"val {name} step {step}: tau {e['tau_est']:.3f} "
                f"first {e['first']:.3f} loss {e['loss']:.3f}"
            )

    def stopping(step):
        if stop_after is not None and step >= stop_after:
            return True
        return bool(args.stop_seconds) and (
            time.perf_counter() - t_start >= args.stop_seconds
        )

    step, pending = start, []
    validate(step)  # where this call starts: the initial or resumed drafter
    while step < total[0] and not stopping(step):
        loss, stats, _ = step_fn(*next_batch())
        mx.async_eval(loss, stats, draft.parameters(), opt.state)
        step += 1
        pending.append((step, loss, stats))
        # Read the previous step while this one runs: the host builds the next
        # graph instead of idling. A checkpoint or validation waits for its own step.
        saving = args.save_every and step % args.save_every == 0
        validating = bool(val) and args.val_every and step % args.val_every == 0
        while len(pending) > (0 if saving or validating else 1):
            read(*pending.pop(0))
        if saving:
            save(step)
        if validating:
            validate(step)
    for p in pending:
        read(*p)
    prog.close()
    save(step)
    if validated[0] != step:
        validate(step)
    return history


def evaluate_tau(
    target,
    draft,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int = 128,
    block_size: int = 16,
    stop_tokens: Sequence[int] = (),
    check_lossless: bool = True,
):
    """Mean tau of greedy DFlash decoding on `prompts`, checked against plain greedy.

    `draft`: a draft model, or a `DFlashDrafter` (with its draft vocabulary).

    Returns `(stats, per-prompt taus, identical)`: `stats` is a `SpecStats` over
    all cycles (its `tau` is the mean accepted length per cycle); `identical`
    says every output equalled mlx_lm's own greedy `generate_step`.
    """
    from mlx_lm.generate import generate_step as mlx_generate_step

    from ..decode import generate_step
    from ..stats import SpecStats
    from .evaluate import as_drafter

    target.set_capture_layers(as_drafter(draft, target).capture_layers)
    stats = SpecStats(block_size)
    taus, identical = [], True
    for p in prompts:
        s = SpecStats(block_size)
        drafter = as_drafter(draft, target)
        out = [
            t
            for t, _ in generate_step(
                target,
                list(p),
                drafter,
                max_tokens=max_tokens,
                block_size=block_size,
                stop_tokens=stop_tokens,
                stats=s,
            )
        ]
        stats.merge(s)
        taus.append(s.tau)
        if check_lossless:
            ref = []
            for tok, _ in mlx_generate_step(
                mx.array(list(p)), target.model, max_tokens=len(out)
            ):
                ref.append(int(tok))
                if int(tok) in set(stop_tokens):
                    break
            identical &= ref == out
    return stats, taus, identical
