"""Probe: what a small array made on the host costs the GPU kernel that reads it.

MLX CUDA puts an array made from host data (`mx.array([...])`) in CUDA
managed memory: pages the host wrote live on the host, and the first kernel
that touches them faults them over. Arrays of at most 8 bytes come from a
small pool the device maps (`cudaMemAdviseSetAccessedBy`), so they are read
in place. Nsight Compute counted 146-404 us for gathers and adds of a few
dozen bytes in a batched cycle (bench/results/h200-ncu-batch-cycle-qwen3-8b-r4.txt).

Each way below is timed as a wall median of `--reps` synchronous rounds:
a draft block's embedding (16 ids, the anchor new each round) from a host
list, from one host scalar and ids kept on the device, and from uint64 host
scalars stacked on the device; and a round that reads 16 ids back to the host
(`tolist`, as the verify's acceptance does) against one that does not.

    python bench/probes/probe_host_arrays.py [--reps 300]
"""

import argparse
import json
import time

import mlx.core as mx


def median_ms(fn, reps):
    for _ in range(10):
        fn()
    ts = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return round(ts[len(ts) // 2] * 1e3, 4)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=4096)
    a = p.parse_args()
    mask = 16
    w = mx.random.normal((a.vocab, a.hidden)).astype(mx.bfloat16)
    masks = mx.full((15,), mask, mx.int32)
    logits = mx.random.normal((16, a.vocab)).astype(mx.bfloat16)
    mx.eval(w, masks, logits)

    def host_list(i=0):
        mx.eval(w[mx.array([[i % 900 + 1] + [mask] * 15])])

    def scalar_and_device(i=0):
        ids = mx.concatenate([mx.array([i % 900 + 1], mx.int32), masks])
        mx.eval(w[ids[None]])

    def u64_scalars(i=0):
        ids = [i % 900 + 1] + [mask] * 15
        parts = [mx.array(ids[j] | ids[j + 1] << 32, mx.uint64) for j in range(0, 16, 2)]
        mx.eval(w[mx.stack(parts).view(mx.uint32)[None]])

    def argmax_only(i=0):
        mx.eval(mx.argmax(logits + (i % 3), axis=-1))

    def argmax_read(i=0):
        mx.argmax(logits + (i % 3), axis=-1).tolist()

    for name, fn in [
        ("embed: host list of 16 ids", host_list),
        ("embed: host scalar + device ids", scalar_and_device),
        ("embed: 8 uint64 host scalars stacked", u64_scalars),
        ("argmax of 16 x vocab, evaluated", argmax_only),
        ("argmax of 16 x vocab, read to host", argmax_read),
    ]:
        print(json.dumps({"way": name, "wall_ms_median": median_ms(fn, a.reps)}), flush=True)


if __name__ == "__main__":
    main()
