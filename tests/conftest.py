import os
import sys
from pathlib import Path

# Exactness tests compare algorithms, not hardware precision: MLX runs float32 matmuls
# as TF32 on CUDA (and M5) by default, where two equivalent formulations of different
# shapes (padded vs exact keys) differ by ~1e-2. Read by MLX on first use.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

# Tests import their tiny-model helpers as `models`.
sys.path.insert(0, str(Path(__file__).parent))
