"""Probe: the host time of building a verify graph through the CUDA block path,
on any machine (issue #25: the 9B verify is host-bound,
bench/results/h200-probe-verify-profile-qwen3_5-9b.txt).

    python bench/probes/probe_build_host.py qwen3.5-9b --layers 8 [--quantize 4] [--batch 4]
    python bench/probes/probe_build_host.py qwen3-8b --draft [--draft-quantize 4]
Builds a real shape with fewer layers (and a small vocabulary), and runs
`Target.forward` of a 16-row block after 65 tokens of context (or a batch's
B rows after 65 + b, their joining evaluated first: only a cycle's graph is
counted) through CUDA's wrappers and launch code
(kernels/cuda.py, matmul.py, gdn.py ...) with every `mx.fast.cuda_kernel`
replaced by a stand-in that returns lazy zeros of the launch's output shapes,
and the wrappers' GPU checks answered yes. The forward is never evaluated: the time is
Python's and MLX's graph building, what the H200 profile counted as `build_ms`.
With --draft: one draft pass instead (the shape's real-size 5-layer DFlash draft,
bf16 or --draft-quantize bits, over 64 tokens of drafter context, then the
target's head), which is what the engine's `propose` builds each cycle.
Prints one JSON line: median (and least) ms per build, median per layer, and the top own-time
functions (cProfile) if --profile.
"""

import argparse
import copy
import cProfile
import gc
import io
import json
import pstats
import statistics
import time

import mlx.core as mx
import mlx.nn as nn


def ragged(target, rows: int):
    """A batch's cache layers (batch.py's `RaggedCache`) of `rows` rows with
    65 + b tokens of context each (prefilled by the stock path: > 64 rows)."""
    from mlx_dflash.ragged import RaggedCache

    batch = RaggedCache()
    for b in range(rows):
        batch.add(prefilled(target, 65 + b))
    # Joining is done once per row, not per cycle: keep its graph out of the count.
    mx.eval([c.state for c in batch.layers])
    return batch.layers


def prefilled(target, n: int):
    """One row's caches after a prompt of `n` tokens."""
    cache = target.make_cache()
    target.forward(mx.zeros((1, n), mx.uint32), cache)
    mx.eval([c.state for c in cache])
    return cache


def stub_kernel(**kernel):
    def launch(inputs, output_shapes, output_dtypes, **_):
        outs = [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]
        return mx.depends(outs, inputs)  # so the graph reaches the inputs

    return launch


def timed_builds(setup, reps: int, profile: bool):
    """ms of each of `reps` builds (after 3 unkept), the first build's graph
    size, and the cProfile of the kept ones (None unless `profile`).
    `setup()` prepares one build (untimed) and returns it."""
    times, count, prof = [], None, cProfile.Profile() if profile else None
    gc.disable()  # a collection inside one build is noise, not its cost
    for r in range(reps + 3):
        build = setup()
        t0 = time.perf_counter()
        if prof and r >= 3:
            prof.enable()
        out = build()
        if prof and r >= 3:
            prof.disable()
        if r >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
        if r == 0:
            count = nodes(out)
    gc.enable()
    return times, count, prof


def nodes(*outputs) -> int:
    """Primitives in the graph of `outputs` (a stand-in launch counts three:
    its zeros, their broadcast and the dependency)."""
    f = io.StringIO()
    mx.export_to_dot(f, *outputs)
    return f.getvalue().count("shape=rectangle")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3.5-9b")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--quantize", type=int, default=None)
    p.add_argument("--vocab", type=int, default=4096, help="a small head: its size is not the point")
    p.add_argument("--profile", action="store_true")
    p.add_argument(
        "--batch", type=int, default=0,
        help="B > 0: a batched verify (batch.py's) of B rows x --rows over a ragged cache",
    )
    p.add_argument("--draft", action="store_true", help="time one draft pass instead")
    p.add_argument("--draft-quantize", type=int, default=None)
    a = p.parse_args()

    mx.fast.cuda_kernel = stub_kernel
    real_default = mx.default_device
    # A new Device each call, as MLX returns them: the wrappers key their memos on it
    mx.default_device = lambda: mx.Device(mx.gpu)  # their "on MLX CUDA?" checks
    from mlx_lm.utils import _get_classes

    from mlx_dflash.bench.shapes import PRESETS, _text
    from mlx_dflash.kernels import BlockPath
    from mlx_dflash.kernels.cuda import CudaKernels
    from mlx_dflash.target import Target

    config = dict(PRESETS[a.shape][0])
    fewer = dict(num_hidden_layers=a.layers, vocab_size=a.vocab)
    if "text_config" in config:
        config["text_config"] = dict(config["text_config"], **fewer)
    else:
        config.update(fewer)
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    model.set_dtype(mx.bfloat16)
    model.eval()
    if a.quantize:
        nn.quantize(model, group_size=64, bits=a.quantize)
    mx.eval(model.parameters())  # so the graph counted is the forward's alone
    target = Target(model, block_path=BlockPath.choose(CudaKernels()), flush_every=0)
    if a.draft:
        return draft_pass(a, target)
    tokens = mx.zeros((max(a.batch, 1), a.rows), mx.uint32)
    # A verify's caches hold context (65 tokens, prefilled by the stock path:
    # > 64 rows): a fresh cache would take the block path's first-block branch.
    context = ragged(target, a.batch) if a.batch else prefilled(target, 65)

    def build():
        cache = copy.deepcopy(context)
        return lambda: target.forward(tokens, cache)[0]

    times, count, prof = timed_builds(build, a.reps, a.profile)
    mx.default_device = real_default
    ms = statistics.median(times)
    print(json.dumps(dict(
        shape=a.shape, layers=a.layers,
        of=_text(PRESETS[a.shape][0])["num_hidden_layers"],
        bits=a.quantize or 16, rows=a.rows, batch=a.batch, build_ms=round(ms, 3),
        min_ms=round(min(times), 3),
        per_layer_ms=round(ms / a.layers, 4), nodes=count,
    )), flush=True)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def draft_pass(a, target):
    """Host time of one engine draft pass (drafters.DFlashDrafter._logits)."""
    from probe_draft_pass import context_drafter  # bench/probes/, beside this script

    drafter = context_drafter(a.shape, target, a.draft_quantize or 0, 64)
    # CUDA's draft flush starts layers on the device mid-build; here there is
    # no device (the launches are stand-ins), and the build alone is timed.
    drafter.flush_every = 0
    times, count, prof = timed_builds(
        lambda: lambda: drafter._logits(5, a.rows - 1), a.reps, a.profile
    )
    ms = statistics.median(times)
    print(json.dumps(dict(
        shape=a.shape, draft_bits=a.draft_quantize or 16, rows=a.rows,
        layers=len(drafter.draft.layers), build_ms=round(ms, 3), min_ms=round(min(times), 3),
        nodes=count,
    )), flush=True)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
