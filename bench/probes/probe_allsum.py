"""all_sum latency between ranks: what one tensor-parallel collective costs here.

Run under MLX's launcher (rank 0 prints one JSON line per payload):

    mlx.launch -n 2 --backend ring -- python bench/probes/probe_allsum.py

For each payload (float16 elements; a decode step's all-reduce carries one
hidden-state row, a 16-token verify's 16 rows) it times `reps` all_sums, each
evaluated alone, after a warm-up, and reports the median and the 10th / 90th
percentiles in microseconds.
"""

import argparse
import json
import os
import time

import mlx.core as mx
import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1,3072,4096,49152,65536,1048576")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--dtype", default="float16")
    args = p.parse_args()
    group = mx.distributed.init()
    assert group.size() > 1, "run under mlx.launch with 2 or more ranks"
    for n in map(int, args.sizes.split(",")):
        x = mx.ones((n,), dtype=getattr(mx, args.dtype))
        mx.eval(x)
        for _ in range(20):
            mx.eval(mx.distributed.all_sum(x, group=group))
        times = []
        for _ in range(args.reps):
            tic = time.perf_counter()
            mx.eval(mx.distributed.all_sum(x, group=group))
            times.append((time.perf_counter() - tic) * 1e6)
        if group.rank() == 0:
            q10, q50, q90 = np.percentile(times, [10, 50, 90])
            print(json.dumps({
                "ranks": group.size(), "elements": n, "bytes": x.nbytes,
                "min_us": round(min(times), 1),
                "median_us": round(q50, 1), "p10_us": round(q10, 1),
                "p90_us": round(q90, 1),
                "GB_per_s": round(x.nbytes / (q50 * 1e-6) / 1e9, 3),
                "load_avg_1min": round(os.getloadavg()[0], 2),
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
