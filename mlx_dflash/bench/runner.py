"""Run stock mlx_lm and speculative decoding on the same prompt ids, alternating.

One `Case` is one prompt at one generation length and one temperature. For
it we run:
  - the baseline: `mlx_lm.generate.generate_step` (stock, EOS off; greedy, or
    at a temperature with `mlx_lm.sample_utils.make_sampler`);
  - one arm per drafter setting (e.g. engine mode at tau = 4, 6.5, 9);
  - a profile of the cycle's parts (cycle_profile.py).
Warm-up runs come first and are never timed; then `repeats` rounds whose arm
order alternates (stats.run_order), with a cooldown between runs. With a
temperature, repeat r seeds both sides with `seed + r`: `mx.random.seed` for
stock mlx_lm, `SamplingParams.seed` for ours.
"""

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import generate_step as mlx_generate_step
from mlx_lm.sample_utils import make_sampler

from ..decode import generate_step
from ..fallback import Fallback
from ..sampling import SamplingParams
from ..stats import SpecStats
from ..stream import TokenStream
from ..target import Target
from .cycle_profile import profile_cycle
from .stats import ideal_speedup, run_order, summarize, token_match

BASELINE = "mlx_lm"


@dataclass
class Case:
    suite: str
    name: str
    prompt: List[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class Arm:
    """One speculative setting. `make(reference)` returns a fresh drafter.

    `reference` is prompt + expected output (used by oracle-based drafters).
    `calibrate`: rerun until the drafter's reference equals the engine's own
    output (engine mode; keeps the oracle in step where bf16 numerics of a
    16-token verify and a 1-token step pick different argmaxes).
    """

    name: str
    make: Callable[[List[int]], Any]
    block_size: int = 16
    tau_target: Optional[float] = None
    calibrate: bool = False
    fallback: Optional[Fallback] = None  # plain decoding while speculation loses
    # Called before each of the arm's runs (e.g. the target's kernel choice,
    # so two arms can differ in it and still alternate within one case).
    setup: Optional[Callable[[], None]] = None
    # A decoding loop of its own, run instead of ours (z-lab's, bench/zlab.py):
    # run(prompt, max_tokens, prefill_step, sampling) -> RunResult; no profile.
    run: Optional[Callable[..., "RunResult"]] = None

    def start(self, reference: List[int]):
        """Apply `setup`, then return a fresh drafter."""
        if self.setup is not None:
            self.setup()
        return self.make(reference)


@dataclass
class RunResult:
    tokens: List[int]
    ttft_s: float
    decode_s: float
    peak_memory_gb: float
    stats: Optional[dict] = None
    spec: Optional[SpecStats] = None

    @property
    def decode_tps(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 else 0.0


def _timed(gen, max_tokens: int):
    """(tokens, time to the first token, first token to the last)."""
    tokens, stream = [], TokenStream()
    for tok in gen:
        tokens.append(int(tok))
        stream.add(tokens[-1])
        if len(tokens) == max_tokens:
            break
    stream.finish()
    return tokens, stream.prefill_s, stream.decode_s


def _fresh():
    mx.clear_cache()
    mx.reset_peak_memory()


def run_baseline(
    target: Target,
    prompt: Sequence[int],
    max_tokens: int,
    prefill_step: int,
    sampling: Optional[SamplingParams] = None,
):
    _fresh()
    sampler = None
    if sampling is not None and not sampling.greedy:
        sampler = make_sampler(
            sampling.temperature,
            top_p=sampling.top_p,
            min_p=sampling.min_p,
            top_k=sampling.top_k,
        )
        mx.random.seed(sampling.seed or 0)
    gen = mlx_generate_step(
        mx.array(prompt),
        target.model,
        max_tokens=max_tokens,
        sampler=sampler,
        prefill_step_size=prefill_step,
    )
    tokens, ttft, dec = _timed((t for t, _ in gen), max_tokens)
    return RunResult(tokens, ttft, dec, mx.get_peak_memory() / 1e9)


def run_spec(
    target: Target,
    prompt: Sequence[int],
    drafter,
    max_tokens: int,
    block: int,
    prefill_step: int,
    sampling: Optional[SamplingParams] = None,
    fallback: Optional[Fallback] = None,
):
    _fresh()
    stats = SpecStats(block)
    gen = generate_step(
        target,
        prompt,
        drafter,
        max_tokens=max_tokens,
        block_size=block,
        prefill_step_size=prefill_step,
        sampling=sampling,
        fallback=fallback,
        stats=stats,
    )
    tokens, ttft, dec = _timed((t for t, _ in gen), max_tokens)
    d = stats.as_dict()
    d["tau_decode"] = d["tau"]
    return RunResult(tokens, ttft, dec, mx.get_peak_memory() / 1e9, d, stats)


def pool_stats(stats: Sequence[SpecStats]) -> dict:
    """Speculative statistics summed over runs (counts first, then the ratios).

    Sampled runs differ per repeat, so τ is pooled over all timed runs rather
    than taken from one; greedy runs are identical and pool to any one of them.
    """
    pooled = SpecStats(stats[0].block_size)
    for st in stats:
        pooled.merge(st)
    out = pooled.as_dict()
    out.update(
        runs=len(stats),
        emitted=pooled.emitted,
        accepted_at=list(pooled.accepted_at),
        drafted_at=list(pooled.drafted_at),
    )
    return out


# ---- one case --------------------------------------------------------------------


def run_case(
    target: Target,
    case: Case,
    arms: Sequence[Arm],
    *,
    repeats: int = 5,
    cooldown: float = 1.0,
    prefill_step: int = 2048,
    profile: bool = True,
    on_run: Optional[Callable[[str], None]] = None,
) -> dict:
    """Warm up, profile, calibrate, then time `repeats` alternating rounds."""
    note = on_run or (lambda _: None)
    N = case.max_tokens
    sampled = not case.sampling.greedy
    seed = case.sampling.seed or 0

    def params(r: int) -> Optional[SamplingParams]:
        # Repeat r of either side draws from seed + r.
        return replace(case.sampling, seed=seed + r) if sampled else None

    def spec_run(arm: Arm, reference: List[int], r: int) -> RunResult:
        """A run of `arm` with a fresh drafter that knows `reference`."""
        if arm.run is not None:
            return arm.run(case.prompt, N, prefill_step, params(r))
        drafter = arm.start(reference)
        return run_spec(
            target,
            case.prompt,
            drafter,
            N,
            arm.block_size,
            prefill_step,
            params(r),
            arm.fallback,
        )

    # Warm-up, untimed (with the sampler, so its compile is not timed); the
    # greedy run also gives the reference output for oracle-based drafters.
    run_baseline(target, case.prompt, min(N, 8), prefill_step, params(0))
    ref = run_baseline(target, case.prompt, N, prefill_step).tokens
    note("warm-up")

    # Profile before any speculative run, so the first call at a new key
    # length still includes its compile where the backend JIT-compiles.
    profiles = {}
    if profile:
        for arm in (a for a in arms if a.run is None):
            drafter = arm.start(list(case.prompt) + ref)
            profiles[arm.name] = profile_cycle(
                target, case.prompt, drafter, arm.block_size
            )
        note("profile")

    # The first spec run of an arm meets every key length for the first time
    # (on CUDA: JIT compiles); it is kept as the "cold" run, never in medians.
    # Calibration replays the engine's own greedy output, so it is greedy-only.
    references, calibration = {}, {}
    for arm in arms:
        out = ref
        passes, cold = 0, None
        calibrate = arm.calibrate and not sampled
        for passes in range(1, (4 if calibrate else 1) + 1):
            r = spec_run(arm, list(case.prompt) + out, 0)
            cold = cold or r
            got = r.tokens
            if got == out or not calibrate:
                break
            out = got
        references[arm.name] = list(case.prompt) + (ref if sampled else out)
        calibration[arm.name] = {
            "passes": passes,
            "self_consistent": None if sampled else got == out,
            "cold_decode_tps": cold.decode_tps,
            "cold_ttft_s": cold.ttft_s,
        }
        note(f"warm-up {arm.name}")

    runs: Dict[str, List[RunResult]] = {BASELINE: []}
    runs.update({a.name: [] for a in arms})
    by_name = {a.name: a for a in arms}
    for r, order in enumerate(run_order(repeats, [BASELINE] + [a.name for a in arms])):
        for name in order:
            if name == BASELINE:
                res = run_baseline(target, case.prompt, N, prefill_step, params(r))
            else:
                res = spec_run(by_name[name], references[name], r)
            runs[name].append(res)
            note(name)
            if cooldown > 0:
                time.sleep(cooldown)

    return summarize_case(case, arms, runs, profiles, calibration)


def summarize_case(case: Case, arms, runs, profiles, calibration) -> dict:
    base = runs[BASELINE]
    base_tokens = base[0].tokens
    sampled = not case.sampling.greedy
    result = {
        "suite": case.suite,
        "name": case.name,
        "prompt_tokens": len(case.prompt),
        "max_tokens": case.max_tokens,
        "sampling": asdict(case.sampling),
        "baseline": _arm_summary(base),
        # Sampled repeats draw from different seeds: not meant to agree.
        "baseline_deterministic": (
            None if sampled else all(r.tokens == base_tokens for r in base)
        ),
        "arms": {},
    }
    t_ar_ms = 1e3 / result["baseline"]["decode_tps"]["median"]
    result["baseline"]["t_ar_ms"] = t_ar_ms
    first = arms[0].name if arms else None
    for arm in arms:
        rs = runs[arm.name]
        s = _arm_summary(rs)
        s["speedup"] = summarize(
            [r.decode_tps / b.decode_tps for r, b in zip(rs, base)]
        )
        if arm.name != first:
            # Arms against each other, repeat by repeat (both ran in each, in
            # alternating order): on a host whose speed drifts between runs
            # the medians of two arms' own tok/s can differ by more than the
            # arms do.
            s["paired"] = {
                "against": first,
                "ratio": summarize(
                    [r.decode_tps / f.decode_tps for r, f in zip(rs, runs[first])]
                ),
            }
        s["ttft_ratio"] = summarize([r.ttft_s / b.ttft_s for r, b in zip(rs, base)])
        s["spec"] = pool_stats([r.spec for r in rs])
        s["tau_per_run"] = summarize(
            [round(r.spec.tau, 4) for r in rs if r.spec.tau is not None]
        )
        s["tau_target"] = arm.tau_target
        s["block_size"] = arm.block_size
        # At a temperature the two sides draw different (equally valid)
        # samples, so token agreement says nothing: None, shown as n/a.
        s["token_match"] = None if sampled else token_match(base_tokens, rs[-1].tokens)
        s["calibration"] = cal = calibration.get(arm.name)
        if cal:
            s["cold_speedup"] = (
                cal["cold_decode_tps"] / result["baseline"]["decode_tps"]["median"]
            )
        prof = profiles.get(arm.name)
        if prof:
            tau = s["spec"]["tau"]
            cycles = max(s["spec"]["cycles"] / len(rs), 1)
            # Cycles after the first token = decode cycles; the decode window
            # holds exactly those.
            t_cycle = 1e3 * summarize([r.decode_s for r in rs])["median"] / cycles
            ideal = ideal_speedup(tau, t_ar_ms, prof["draft_ms"], prof["verify_ms"])
            prof = dict(prof, t_ar_ms=t_ar_ms, cycle_ms=t_cycle)
            prof["overhead_ms"] = t_cycle - prof["draft_ms"] - prof["verify_ms"]
            s["profile"] = prof
            s["ideal_speedup"] = ideal
            s["efficiency"] = s["speedup"]["median"] / ideal
        result["arms"][arm.name] = s
    return result


def _arm_summary(rs: List[RunResult]) -> dict:
    return {
        "decode_tps": summarize([r.decode_tps for r in rs]),
        "ttft_s": summarize([r.ttft_s for r in rs]),
        "peak_memory_gb": max(r.peak_memory_gb for r in rs),
        "tokens": len(rs[0].tokens),
        "per_run": [
            {
                "decode_tps": r.decode_tps,
                "ttft_s": r.ttft_s,
                "peak_memory_gb": r.peak_memory_gb,
                **(
                    {"tau": round(r.spec.tau, 4)}
                    if r.spec and r.spec.tau is not None
                    else {}
                ),
            }
            for r in rs
        ],
    }
