"""What `mlx-dflash bench` runs, from its flags: the target and the arms.

`load` gives the target (a random `--shape`, or the model `load_pair` would
load for `generate`) and a maker of matching random DFlash drafts; `make_arms`
one `Arm` per `--draft` entry (lookup, engine at each `--tau`, a checkpoint,
z-lab's reference loop on a checkpoint: zlab.py), each `--block-linear` /
`--attention-kernel` / `--draft-flush` choice an arm of its own.
"""

from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from ..distributed import SINGLE, shard
from ..drafters import DFlashDrafter, PromptLookupDrafter
from ..fallback import Fallback
from ..load import (
    block_size_for,
    load_drafter,
    load_model,
    load_target,
    model_name,
    quantize_draft,
)
from ..target import Target
from .engine import make_engine_drafter
from .runner import Arm
from .shapes import build_draft, build_target, draft_for_target
from .zlab import PREFIX as ZLAB, make_zlab_arm

# A checkpoint arm's suffixes: @full drafts over the whole vocabulary, not the
# checkpoint's draft_vocab.json (load.read_draft_vocab); @q4 / @q8 quantize
# its Linear layers; @lookup / @nolookup turn prompt lookup's help on or off
# (load.make_drafter's `lookup`; default: on for the shipped drafter only).
SUFFIXES = {
    "full": {"vocab": "all"},
    "q4": {"quantize": 4},
    "q8": {"quantize": 8},
    "lookup": {"lookup": "on"},
    "nolookup": {"lookup": "off"},
}


def checkpoint_options(spec: str):
    """`(path, load_drafter options)` of a checkpoint arm `DIR[@suffix...]`."""
    path, *suffixes = spec.split("@")
    options = {}
    for s in suffixes:
        if s not in SUFFIXES:
            raise SystemExit(
                f"--draft {spec}: unknown suffix @{s} (use {', '.join('@' + k for k in SUFFIXES)})"
            )
        options.update(SUFFIXES[s])
    return path, options


def _on(choice: str, flag: str = "--block-linear"):
    if choice not in ("auto", "on", "off"):
        raise SystemExit(f"{flag}: {choice!r} is not auto, on or off")
    return None if choice == "auto" else choice == "on"


def _every(choice: str, flag: str = "--draft-flush"):
    if choice == "auto":
        return None
    if not choice.isdigit():
        raise SystemExit(f"{flag}: {choice!r} is not auto or a layer count")
    return int(choice)


def verify_flush_choice(choice: str, flag: str = "--verify-flush"):
    """auto, E or E@F as `Target.set_verify_flush`'s (every, first)."""
    every, at, first = choice.partition("@")
    if choice == "auto":
        return None, None
    if not every.isdigit() or not (first.isdigit() or not at):
        raise SystemExit(f"{flag}: {choice!r} is not auto, E or E@F (layer counts)")
    if at and (int(every) == 0) != (int(first) == 0):
        raise SystemExit(f"{flag}: {choice!r}: E and F are both 0 (off) or both more")
    return int(every), int(first) if at else None


def _kernels(args) -> dict:
    """The Target kernel switches the first choice of each flag sets."""
    return dict(
        block_linear=_on(args.block_linear[0]),
        attention_kernel=_on(args.attention_kernel[0], "--attention-kernel"),
    )


def load(args):
    """(target, tokenizer or None, label, draft maker): a random draft of the
    shape that fits the target (`--draft-layers`, default 5 for a shape, 1 for
    a loaded target)."""
    dtype = getattr(mx, args.dtype) if args.dtype else None
    world = getattr(args, "world", SINGLE)  # run() sets it under mlx.launch
    if args.quantize and not args.shape:
        raise ValueError("--quantize needs --shape (a loaded --model keeps its own weights)")
    if args.shape:
        dtype = dtype or mx.bfloat16
        model = stock_model(args)
        shard(model, world, "--shape")  # the same seeded weights on every rank
        target, tokenizer = Target(model, **_kernels(args)), None
        kind = "peaked random" if args.peaked else "random"
        bits = f"{args.quantize}-bit g{args.group_size}" if args.quantize else None
        label = f"{kind} {args.shape} ({bits or args.dtype or 'bfloat16'})"
        build, shape, layers, draft_dtype = build_draft, args.shape, 5, dtype
    else:
        # `load_pair`'s target: the default one in fp32 on CPU, as `generate` runs it.
        target, tokenizer = load_target(
            args.model, dtype=dtype, world=world, **_kernels(args)
        )
        label = model_name(args.model)
        build, shape, layers = draft_for_target, target.model, 1
        draft_dtype = dtype or mx.float32
    if args.draft_quantize[0] and len(args.draft_quantize) == 1:
        label += f", {args.draft_quantize[0]}-bit draft"

    def make(bits=None):
        draft = build(
            shape,
            target.num_layers,
            num_layers=args.draft_layers or layers,
            block_size=block_size_for(args.block_size, None),
            dtype=draft_dtype,
        )
        if bits:
            quantize_draft(draft, bits, group_size=args.group_size)
        return draft

    return target, tokenizer, label, make


def stock_model(args):
    """A fresh, untapped copy of the weights `load` gives the target: the
    `--shape` built again from `--seed`, or the model loaded again."""
    dtype = getattr(mx, args.dtype) if args.dtype else None
    if args.shape:
        return build_target(
            args.shape,
            dtype=dtype or mx.bfloat16,
            seed=args.seed,
            peaked=args.peaked,
            quantize=args.quantize,
            group_size=args.group_size,
        )
    return load_model(args.model, dtype=dtype)[0]


def make_arms(args, target, vocab, make_draft):
    flush = _every(args.draft_flush[0])
    if flush is not None:  # one choice, set once (a list alternates below)
        target.set_draft_flush(flush)
    target.set_verify_flush(*verify_flush_choice(args.verify_flush[0]))
    arms = []
    block = block_size_for(args.block_size, None)  # lookup and engine arms
    for spec in args.draft:
        if spec == "lookup":
            arms.append(Arm("lookup", lambda ref: PromptLookupDrafter(), block))
        elif spec == "engine":
            for bits in args.draft_quantize:
                arms += _engine_arms(args, target, vocab, make_draft(bits), bits, block)
        elif spec.startswith(ZLAB):
            arms.append(make_zlab_arm(spec, args, lambda: stock_model(args)))
        else:
            # As `load_pair` loads it for `generate` and `serve`: the drafter
            # in the device's dtype, the flag's block size over its own.
            dtype = getattr(mx, args.dtype) if args.dtype else None
            path, options = checkpoint_options(spec)
            drafter, native, _ = load_drafter(path, target, dtype=dtype, **options)
            if isinstance(drafter, DFlashDrafter):
                # Fresh drafter state around the weights (and head rows) loaded once.
                make = lambda ref, d=drafter: d.fresh()
            else:
                make = lambda ref, path=path: load_drafter(path, target)[0]

            name = Path(path).name + spec[len(path) :]
            if getattr(drafter, "lookup", None) and "@lookup" not in spec:
                name += "+lookup"  # on by --prompt-lookup auto (the shipped drafter)
            arms.append(Arm(name, make, block_size_for(args.block_size, native)))
    if args.fallback:
        for arm in arms:
            if arm.run is None:  # z-lab's loop has no fallback
                arm.fallback = Fallback()
    # A comma list of choices: every arm once per choice, the switch set in
    # `Arm.setup` before each run (so the choices alternate within a case);
    # z-lab's arms run once (our Target's switches do not reach its copy).
    for flag, name, choices, switch, parse in [
        ("--block-linear", "linear", args.block_linear, target.set_block_linear, _on),
        (
            "--attention-kernel",
            "attention",
            args.attention_kernel,
            target.set_attention_kernel,
            _on,
        ),
        ("--draft-flush", "draft flush", args.draft_flush, target.set_draft_flush, _every),
        (
            "--verify-flush",
            "verify flush",
            args.verify_flush,
            lambda f: target.set_verify_flush(*f),
            verify_flush_choice,
        ),
    ]:
        if len(choices) > 1:
            arms = [
                replace(
                    arm,
                    name=f"{arm.name} {name}={choice}",
                    setup=_then(arm.setup, switch, parse(choice, flag)),
                )
                if arm.run is None
                else arm
                for arm in arms
                for choice in (choices if arm.run is None else choices[:1])
            ]
    return arms


def _engine_arms(args, target, vocab, draft, bits, block):
    """One engine arm per `--tau` on `draft`; named after its quantization when
    `--draft-quantize` lists several choices."""
    target.set_capture_layers(draft.args.target_layer_ids)
    which = ""
    if len(args.draft_quantize) > 1:
        which = f" {bits}-bit draft" if bits else " unquantized draft"

    def make(ref, tau):
        return make_engine_drafter(
            draft, target, ref, tau=tau, block_size=block, vocab_size=vocab, seed=args.seed
        )

    return [
        Arm(
            f"engine τ={tau:g}{which}",
            lambda ref, tau=tau: make(ref, tau),
            block,
            tau_target=tau,
            calibrate=True,
        )
        for tau in args.tau
    ]


def _then(setup, switch, on):
    """An `Arm.setup` that runs `setup` (if any), then `switch(on)`."""

    def both():
        if setup is not None:
            setup()
        switch(on)

    return both
