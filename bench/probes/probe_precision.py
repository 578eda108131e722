"""Probe: is fp32 matmul on this device full fp32, or reduced (TF32)?

python bench/probes/probe_precision.py
"""

import json

import mlx.core as mx
import numpy as np

rng = np.random.default_rng(0)
out = {"device": str(mx.default_device())}
for rows in (1, 16):
    a = rng.normal(size=(rows, 1024)).astype(np.float32)
    b = rng.normal(size=(1024, 1024)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    got = np.array(mx.array(a) @ mx.array(b)).astype(np.float64)
    out[f"matmul_rows{rows}_max_rel_err"] = float(
        np.abs(got - ref).max() / np.abs(ref).max()
    )
print(json.dumps(out))
