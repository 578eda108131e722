"""GatedDeltaNet recurrence for multi-token verify off Metal.

mlx_lm runs the recurrence as a fused kernel on Metal only; elsewhere it loops
over time steps with small ops, which made a 16-token verify on CUDA cost ~1.8 ms
per layer against ~0.19 ms for one decode step (measured on an H200, see
bench/results/speed.md). Here the whole block is one CUDA kernel launch: each
warp keeps one row of the (Dv x Dk) state in registers for all T steps.

`gated_delta` is a drop-in for `mlx_lm.models.gated_delta.gated_delta_update`
that takes the kernel when a backend (cuda.py's) is given and it applies, and
the stock function otherwise (Metal kernel on Apple GPUs, ops path on CPU).
`BlockDelta` wraps one GatedDeltaNet *instance* and runs the stock forward
with its four input projections in one launch and, where the backend takes
it, everything from the conv input to the recurrence's output in one more
(`gated_delta_conv_cuda`); the block path (path.py) puts it on the
target's instances for the duration of `Target.forward` (the stock class and
every other instance stay untouched).
"""

from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gated_delta import compute_g, gated_delta_update, normalize_qk
from mlx_lm.models.qwen3_5 import GatedDeltaNet

from ..cache import MAX_BLOCK
from ..wrapper import Wrapper, innermost
from .linear import fusable
from .matmul import Fits, block_of, weight_of

_HEADER = """
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
  return x;
}
"""

# Grid (32, Dv, B*Hv), block (32, 4, 1): lane x splits Dk, y picks the state row.
_SOURCE = """
  const int lane = threadIdx.x;
  const int dv = blockIdx.y * blockDim.y + threadIdx.y;
  const int n = blockIdx.z;
  const int T = q_shape[1];  // runtime: one compiled kernel for every block length
  const int b = n / Hv, hv = n % Hv, hk = hv / (Hv / Hk);
  constexpr int PER = Dk / 32;
  const int k0 = lane * PER;

  float s[PER];
  const float* s_in = state_in + ((size_t)n * Dv + dv) * Dk + k0;
  for (int i = 0; i < PER; ++i) s[i] = s_in[i];

  for (int t = 0; t < T; ++t) {
    const size_t qk = ((size_t)(b * T + t) * Hk + hk) * Dk + k0;
    const size_t vy = ((size_t)(b * T + t) * Hv + hv) * Dv + dv;
    const size_t gb = (size_t)(b * T + t) * Hv + hv;
    const float gt = static_cast<float>(g[gb]);
    float kv = 0.0f;
    for (int i = 0; i < PER; ++i) {
      s[i] *= gt;
      kv += s[i] * static_cast<float>(k[qk + i]);
    }
    kv = warp_sum(kv);
    const float delta = (static_cast<float>(v[vy]) - kv) * static_cast<float>(beta[gb]);
    float out = 0.0f;
    for (int i = 0; i < PER; ++i) {
      s[i] += static_cast<float>(k[qk + i]) * delta;
      out += s[i] * static_cast<float>(q[qk + i]);
    }
    out = warp_sum(out);
    if (lane == 0) y[vy] = static_cast<InT>(out);
    STEP_STATES
  }
  float* s_out = state_out + ((size_t)n * Dv + dv) * Dk + k0;
  for (int i = 0; i < PER; ++i) s_out[i] = s[i];
"""

# The verify variant also writes the state after every step, so rollback is a
# slice instead of a replay of the kept steps (DESIGN §3): (T, B*Hv, Dv, Dk).
_STEP_STATES = """{
    float* s_t = states + (((size_t)t * gridDim.z + n) * Dv + dv) * Dk + k0;
    for (int i = 0; i < PER; ++i) s_t[i] = s[i];
  }"""

_kernels = {}


def _cuda_kernel(kind: str, step_states: bool):
    """The recurrence kernel of `kind` (`_KINDS`), with or without the state
    after each step."""
    key = (kind, step_states)
    if key not in _kernels:
        inputs, source = _KINDS[kind]
        outputs = ["y", "state_out"] + (["states"] if step_states else [])
        _kernels[key] = mx.fast.cuda_kernel(
            name="dflash_gated_delta" + kind + ("_steps" if step_states else ""),
            input_names=inputs,
            output_names=outputs,
            source=source.replace("STEP_STATES", _STEP_STATES if step_states else ""),
            header=_HEADER,
        )
    return _kernels[key]


def _launch(kind: str, inputs, template, state, y_shape, dtype, step_states: bool):
    """One launch of `kind`'s kernel: a warp per (batch, value head, row of
    Dv); returns (y, state) and, with `step_states`, each step's state."""
    B, T, Hv, Dv = y_shape
    shapes = [y_shape, state.shape] + ([(T, *state.shape)] if step_states else [])
    return _cuda_kernel(kind, step_states)(
        inputs=inputs,
        template=template,
        grid=(32, Dv, B * Hv),
        threadgroup=(32, 4, 1),
        output_shapes=shapes,
        output_dtypes=[dtype] + [mx.float32] * (len(shapes) - 1),
    )


def cuda_applies(q: mx.array, v: mx.array, state: mx.array, mask) -> bool:
    """Whether `gated_delta_cuda` takes this call (MLX CUDA's GPU assumed)."""
    return (
        mx.default_device() == mx.gpu
        and mask is None
        and state.dtype == mx.float32
        and q.shape[-1] % 32 == 0
        and v.shape[-1] % 4 == 0
    )


def gated_delta_cuda(q, k, v, g, beta, state, step_states: bool = False):
    """Scalar-gated delta rule over all T steps in one launch.

    Returns (y, state), plus the state after each step, shape (T, *state.shape),
    when `step_states`.
    """
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    return _launch(
        "",
        [q, k, v, g, beta, state],
        [("InT", q.dtype), ("Hk", Hk), ("Hv", Hv), ("Dk", Dk), ("Dv", Dv)],
        state,
        (B, T, Hv, Dv),
        q.dtype,
        step_states,
    )


# The same recurrence with everything from the layer's conv input to it in the
# launch: the depthwise causal conv + SiLU of each channel a lane needs, q/k
# L2-normalised (and scaled) per head across the warp, g and beta from a and b.
# Each value is rounded to the input type where the stock ops round it (conv,
# SiLU, rms_norm, the scale; a + dt_bias, softplus; sigmoid), so the launch
# stands for 12 graph nodes per layer (Convolution, SiLU, Split, 3 Reshapes,
# 2 RMSNorms, 2 Multiplies, compute_g, Sigmoid) of a host-bound verify.
# Grid and block as `_SOURCE`; conv_in (B, K-1+T, C), conv_w (C, K, 1).
_CONV_SOURCE = """
  const int lane = threadIdx.x;
  const int dv = blockIdx.y * blockDim.y + threadIdx.y;
  const int n = blockIdx.z;
  const int T = a_in_shape[1];
  const int b = n / Hv, hv = n % Hv, hk = hv / (Hv / Hk);
  constexpr int PER = Dk / 32;
  constexpr int C = 2 * Hk * Dk + Hv * Dv;
  const int k0 = lane * PER;
  // A value as the stock op leaves it: rounded to the input type.
  auto rnd = [](float f) { return static_cast<float>(static_cast<InT>(f)); };
  const InT* x = conv_in + (size_t)b * (T + K - 1) * C;
  // silu(conv(x))[t, c] of the depthwise causal conv (MLX's: no flip).
  auto conv_silu = [&](int t, int c) {
    float acc = 0.0f;
    for (int j = 0; j < K; ++j)
      acc += static_cast<float>(x[(size_t)(t + j) * C + c]) *
             static_cast<float>(conv_w[c * K + j]);
    const float u = rnd(acc);
    return rnd(u * rnd(1.0f / (1.0f + expf(-u))));
  };
  const float inv2 = rnd(1.0f / Dk), inv = rnd(rsqrtf((float)Dk));
  const float eps = 1e-6f / Dk;  // mlx_lm normalize_qk: eps * inv_scale**2
  const float A = expf(static_cast<float>(A_log[hv]));
  const float dtb = static_cast<float>(dt_bias[hv]);

  float s[PER];
  const float* s_in = state_in + ((size_t)n * Dv + dv) * Dk + k0;
  for (int i = 0; i < PER; ++i) s[i] = s_in[i];

  for (int t = 0; t < T; ++t) {
    float q[PER], k[PER], sq = 0.0f, sk = 0.0f;
    for (int i = 0; i < PER; ++i) {
      q[i] = conv_silu(t, hk * Dk + k0 + i);
      k[i] = conv_silu(t, Hk * Dk + hk * Dk + k0 + i);
      sq += q[i] * q[i];
      sk += k[i] * k[i];
    }
    const float rq = rsqrtf(warp_sum(sq) / Dk + eps);
    const float rk = rsqrtf(warp_sum(sk) / Dk + eps);
    for (int i = 0; i < PER; ++i) {
      q[i] = rnd(rnd(q[i] * rq) * inv2);
      k[i] = rnd(rnd(k[i] * rk) * inv);
    }
    const float vt = conv_silu(t, 2 * Hk * Dk + hv * Dv + dv);
    const size_t gb = (size_t)(b * T + t) * Hv + hv;
    const float at = rnd(static_cast<float>(a_in[gb]) + dtb);
    const float gt = expf(-A * rnd(fmaxf(at, 0.0f) + log1pf(expf(-fabsf(at)))));
    const float bt = rnd(1.0f / (1.0f + expf(-static_cast<float>(b_in[gb]))));
    const size_t vy = ((size_t)(b * T + t) * Hv + hv) * Dv + dv;
    float kv = 0.0f;
    for (int i = 0; i < PER; ++i) {
      s[i] *= gt;
      kv += s[i] * k[i];
    }
    kv = warp_sum(kv);
    const float delta = (vt - kv) * bt;
    float out = 0.0f;
    for (int i = 0; i < PER; ++i) {
      s[i] += k[i] * delta;
      out += s[i] * q[i];
    }
    out = warp_sum(out);
    if (lane == 0) y[vy] = static_cast<InT>(out);
    STEP_STATES
  }
  float* s_out = state_out + ((size_t)n * Dv + dv) * Dk + k0;
  for (int i = 0; i < PER; ++i) s_out[i] = s[i];
"""

# Each recurrence kernel's inputs and source: the recurrence alone, and with
# everything from the layer's conv input.
_KINDS = {
    "": (["q", "k", "v", "g", "beta", "state_in"], _SOURCE),
    "_conv": (
        ["conv_in", "conv_w", "a_in", "b_in", "A_log", "dt_bias", "state_in"],
        _CONV_SOURCE,
    ),
}


def conv_applies(layer: GatedDeltaNet, conv_in: mx.array, state, mask) -> bool:
    """Whether `gated_delta_conv_cuda` takes this layer's call (MLX CUDA's GPU
    assumed): the stock conv (no bias) and heads the recurrence kernel takes."""
    conv = innermost(layer.conv1d)
    return (
        mx.default_device() == mx.gpu
        and mask is None
        and (state is None or state.dtype == mx.float32)
        and conv_in.dtype in (mx.bfloat16, mx.float16, mx.float32)
        and type(conv) is nn.Conv1d
        and "bias" not in conv
        and conv.weight.shape == (layer.conv_dim, layer.conv_kernel_size, 1)
        and layer.head_k_dim % 32 == 0
        and layer.head_v_dim % 4 == 0
    )


def gated_delta_conv_cuda(
    layer: GatedDeltaNet, conv_in, a, b, state, step_states: bool = False
):
    """`gated_delta_cuda` of the layer's recurrence inputs computed from its
    conv input (B, K-1+T, conv_dim) in the same launch; returns as it does."""
    B = conv_in.shape[0]
    T = a.shape[1]
    Hk, Dk = layer.num_k_heads, layer.head_k_dim
    Hv, Dv = layer.num_v_heads, layer.head_v_dim
    conv = innermost(layer.conv1d)
    return _launch(
        "_conv",
        [conv_in, conv["weight"], a, b, layer.A_log, layer.dt_bias, state],
        [
            ("InT", conv_in.dtype),
            ("Hk", Hk),
            ("Hv", Hv),
            ("Dk", Dk),
            ("Dv", Dv),
            ("K", layer.conv_kernel_size),
        ],
        state,
        (B, T, Hv, Dv),
        conv_in.dtype,
        step_states,
    )


# Verify blocks keep every step's state for rollback; longer forwards (prefill
# chunks) keep only the final one.
MAX_STEP_STATES = MAX_BLOCK


class StepStates:
    """Plain holder (never a module parameter) of the per-step states of a
    layer's last verify forward, and the backend that made them; the block
    path gives one to each GatedDeltaNet it wraps (rollback.py reads it)."""

    __slots__ = ("states", "ops")

    def __init__(self, ops=None):
        self.states = None
        self.ops = ops


def gated_delta(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state=None,
    mask=None,
    *,
    use_kernel=True,
    steps: Optional[StepStates] = None,
    ops=None,
):
    """`gated_delta_update` with the backend `ops`' kernel (cuda.py's; None:
    none) for the unmasked, scalar-gated case.

    With `steps`, a kernel run of 2 .. MAX_STEP_STATES steps (a verify block)
    also leaves the state after every step in `steps.states`; otherwise None.
    """
    if steps is not None:
        steps.states = None
    if state is None:
        B, _, _, Dk = q.shape
        state = mx.zeros((B, *v.shape[-2:], Dk), dtype=mx.float32)
    if use_kernel and ops is not None and ops.delta_applies(q, v, state, mask):
        g, beta = compute_g(A_log, a, dt_bias), mx.sigmoid(b)
        return kept_steps(
            steps, q.shape[1], lambda keep: ops.gated_delta(q, k, v, g, beta, state, keep)
        )
    return gated_delta_update(
        q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=use_kernel
    )


def kept_steps(steps: Optional[StepStates], T: int, launch):
    """(y, state) of `launch(keep)`, a kernel run of T steps; for a verify
    block (2 .. MAX_STEP_STATES steps, with `steps`) it also returns the state
    after each step, which go to `steps.states` for rollback."""
    keep = steps is not None and 1 < T <= MAX_STEP_STATES
    out = launch(keep)
    if keep:
        steps.states = out[2]
    return out[0], out[1]


def recurrence_inputs(layer: GatedDeltaNet, conv_out: mx.array):
    """q, k (normalised), v of the recurrence from the layer's conv output, as
    `GatedDeltaNet.__call__` of the pinned mlx_lm minor computes them."""
    B, S, _ = conv_out.shape
    q, k, v = [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [layer.key_dim, 2 * layer.key_dim], -1),
            [layer.num_k_heads, layer.num_k_heads, layer.num_v_heads],
            [layer.head_k_dim, layer.head_k_dim, layer.head_v_dim],
        )
    ]
    q, k = normalize_qk(q, k, inv_scale=layer.head_k_dim**-0.5, eps=1e-6)
    return q, k, v


def _inputs(layer: GatedDeltaNet):
    """The layer's input projections, in `GatedDeltaNet.__call__`'s order."""
    return [layer[n] for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")]


class BlockDelta(Wrapper):
    """Wraps one stock Qwen3.5 GatedDeltaNet instance: its forward with the
    recurrence call swapped for `gated_delta` (backend `ops`).

    Mirrors `GatedDeltaNet.__call__` of the pinned mlx_lm minor for a single
    unpadded sequence (tests compare the two on the same inputs); other calls
    go to the stock layer.
    """

    def __init__(self, inner: GatedDeltaNet, ops=None, fuse_in: bool = False):
        super().__init__(inner)
        self.ops = ops
        # Its four input projections in one launch of matmul.py's kernel
        # (with the linear kernels on): a kernel launch costs the host more
        # than a stock op, and a 9B verify is host-bound.
        bases = [innermost(m) for m in _inputs(inner)]
        self.fuse_in = fuse_in and ops is not None and fusable(*bases)
        self.fits = Fits()
        self.fold_fits = Fits()

    def projections(self, x: mx.array, norm: Optional[nn.RMSNorm] = None):
        """qkv, z, b, a of block `x` (of `norm(x)` with `norm`, which only
        `folds` blocks take): one launch where the kernel takes it (the taps
        on b and a, target.py's, still see their outputs)."""
        mods = _inputs(self.inner)
        if self.fuse_in:
            ws = [weight_of(innermost(m)) for m in mods]
            if norm is not None or self.fits(x, lambda: self.ops.applies(x, *ws)):
                folded = None if norm is None else (norm["weight"], norm.eps)
                outs = self.ops.block_matmuls(x, ws, norm=folded)
                for m, out in zip(mods, outs):
                    if hasattr(m, "seen"):
                        m.seen(x, out)
                return outs
        return [m(x) for m in mods]

    def _from_conv_input(self, conv_input, a, b, state, steps):
        """The recurrence from the conv input in one launch (`gated_delta_conv`);
        rollback's tap on conv1d (target.py's) still sees the conv's input, and
        its output as a lazy node a replay may evaluate, never this forward."""
        l = self.inner
        conv = l.conv1d
        if hasattr(conv, "seen"):
            out = innermost(conv)(conv_input) if conv.recording else None
            conv.seen(conv_input, out)
        if state is None:
            B = conv_input.shape[0]
            state = mx.zeros((B, l.num_v_heads, l.head_v_dim, l.head_k_dim), mx.float32)
        if steps is not None:
            steps.states = None
        return kept_steps(
            steps,
            a.shape[1],
            lambda keep: self.ops.gated_delta_conv(l, conv_input, a, b, state, keep),
        )

    def folds(self, x: mx.array, norm: nn.RMSNorm, cache: Any) -> bool:
        """Whether a call with `norm=norm, residual=x` takes block `x` (the
        decoder layer's input, not yet normed): its input projections' launch
        applies the norm, and out_proj's adds the residual (layer.py's
        `HybridBlockLayer`)."""
        l = self.inner
        if not self.fuse_in or l.sharding_group is not None:
            return False
        if cache is not None and cache.lengths is not None:
            return False

        def check():
            out = innermost(l.out_proj)
            if not fusable(out) or norm["weight"].dtype != x.dtype:
                return False
            ws = [weight_of(innermost(m)) for m in _inputs(l)]
            w = weight_of(out)
            return self.ops.applies(x, *ws) and self.ops.applies(block_of(x, w), w)

        return self.fold_fits(x, check)

    def __call__(
        self,
        inputs: mx.array,
        mask: Optional[mx.array] = None,
        cache: Any = None,
        norm: Optional[nn.RMSNorm] = None,
        residual: Optional[mx.array] = None,
    ):
        """The stock forward of `inputs`; with `norm` and `residual` (a block
        that `folds`), `residual + forward(norm(inputs))` in the same launches."""
        l = self.inner
        if l.sharding_group is not None or (
            cache is not None and cache.lengths is not None
        ):
            return l(inputs, mask, cache)
        B, S, _ = inputs.shape
        qkv, z, b, a = self.projections(inputs, norm)
        z = z.reshape(B, S, l.num_v_heads, l.head_v_dim)

        if cache is not None and cache[0] is not None:
            conv_state = cache[0]
        else:
            conv_state = mx.zeros((B, l.conv_kernel_size - 1, l.conv_dim), inputs.dtype)
        if mask is not None:
            qkv = mx.where(mask[..., None], qkv, 0)
        conv_input = mx.concatenate([conv_state, qkv], axis=1)
        if cache is not None:
            cache[0] = mx.contiguous(conv_input[:, -(l.conv_kernel_size - 1) :, :])
        state = cache[1] if cache else None
        steps = getattr(l, "step_states", None)  # set by the block path
        ops = self.ops
        # Verify and draft blocks only: there the host's graph is the cost; a
        # prefill chunk keeps the separate ops (each warp would redo its
        # heads' conv for every step of a long chunk).
        if (
            ops is not None
            and not l.training
            and S <= MAX_STEP_STATES
            and ops.delta_conv_applies(l, conv_input, state, mask)
        ):
            out, state = self._from_conv_input(conv_input, a, b, state, steps)
        else:
            q, k, v = recurrence_inputs(l, nn.silu(l.conv1d(conv_input)))
            out, state = gated_delta(
                q,
                k,
                v,
                a,
                b,
                l.A_log,
                l.dt_bias,
                state,
                mask,
                use_kernel=not l.training,
                steps=steps,
                ops=ops,
            )
        if cache is not None:
            cache[1] = state
            cache.advance(S)
        out = l.norm(out, z).reshape(B, S, -1)
        if residual is not None:
            w = weight_of(innermost(l.out_proj))
            return self.ops.block_matmul(out, w, residual=residual)
        return l.out_proj(out)
