"""One job on the generation thread: prompt cache in, events out, cache kept.

`generate(engine, job)` restores the longest cached prefix of the prompt,
decodes in segments (one, unless a reasoning budget closes the think block
part way), streams each piece of text as an `Event` and ends with the usage;
then the prompt cache keeps what the caches now hold. It is a generator: it
yields (nothing) whenever its row waits for the next cycle of a batch
(`serve --max-batch`, batch.py's `Batch.steps`), so that one thread can run
several jobs; one-at-a-time decoding never waits, and the engine runs it to
its end in one go.
"""

import dataclasses
from typing import List, Optional

from ..batch import WAIT
from ..decode import Cancelled, prefill
from ..stats import SpecStats
from ..stream import TokenStream
from .job import Event, Job, TokenLogprob, stopped
from .think import ThinkBudget, opens_think


def generate(engine, job: Job):
    """Run `job` on `engine`'s model (the generation thread only)."""
    target, tok, config = engine.target, engine.tokenizer, engine.config
    drafter = engine.drafter_for(job)
    eos = set(tok.eos_token_ids)
    cache, cached, prompt = _restore(engine, job, drafter)
    if len(prompt) != len(job.prompt):  # the previous reply's own ids
        room = (config.max_context or len(prompt) + 1) - len(prompt)
        job.max_tokens = max(1, min(job.max_tokens, room))
    pc, key = engine.prompt_cache, job.cache_key
    should_stop = lambda: engine.should_stop(job)  # noqa: E731
    stream = TokenStream(tok.detokenizer, eos)
    run_from = cached
    context = prompt  # what this segment of the output continues
    out: List[int] = []
    pending: List[TokenLogprob] = []  # log-probabilities not yet sent

    def put(token: int, logprob=None, *, forced=False):
        """One output token: detokenised, sent once it completes some text.
        `forced`: a think end the budget put in, not generated (not timed)."""
        nonlocal pending
        if points is not None:
            points.before(len(out), stream.detok)
        out.append(token)
        if think is not None:
            think.observe(out)
        if forced:
            piece, logprobs = stream.text(token), []
        else:
            if logprob is not None and token not in eos:
                pending.append((token, *logprob))
            piece, logprobs = stream.add(token), pending
        if piece:
            if points is not None:
                points.sent(piece)
            job.emit(Event(text=piece, token=token, logprobs=logprobs))
            if not forced:
                pending = []

    try:
        snapshot = None
        if pc is not None:
            snapshot = pc.snapshot_at(cache, cached, len(prompt))
        if snapshot is not None:
            prefill(
                target,
                cache,
                drafter,
                prompt[:snapshot],
                cached=cached,
                step_size=config.prefill_step_size,
                should_stop=should_stop,
            )
            run_from = snapshot
            pc.snapshot(prompt[:snapshot], cache, drafter, key)
        speculative = job.speculative
        stats = SpecStats(engine.block_size if speculative else 1)
        sampling = None if job.sampling.greedy else job.sampling
        think = _think_budget(tok, job)
        points = None if pc is None else pc.recorder(cache, len(prompt), job.text)
        cancelled = False
        while True:
            if think is not None and think.overdue():
                # Budget spent: the think end goes into the output and the
                # next segment continues after it.
                if len(out) + len(think.end) > job.max_tokens:
                    break
                for token in think.end:
                    put(token, forced=True)
            room = job.max_tokens - len(out)
            context = prompt + out
            if out and sampling is not None and sampling.seed is not None:
                # A seeded job's later segments must not replay its first keys.
                sampling = dataclasses.replace(
                    sampling, seed=job.sampling.seed + len(out)
                )
            steps = engine.steps(
                target,
                context,
                drafter,
                cache=cache,
                max_tokens=room if think is None else think.limit(room),
                block_size=stats.block_size,
                stop_tokens=eos if think is None else eos | think.stops(),
                prefill_step_size=config.prefill_step_size,
                cached=run_from,
                sampling=sampling,
                logprobs=job.logprobs,
                fallback=config.fallback,
                stats=stats,
                should_stop=should_stop,
            )
            begun = len(out)  # this segment's first token is still to come
            for step in steps:
                if step is WAIT:  # the batch's other rows get their turn
                    # Before its first token the row is prefilling: the
                    # prefill itself stops between chunks (`Cancelled`).
                    if len(out) == begun or not should_stop():
                        yield
                    if len(out) > begun and should_stop():
                        cancelled = True
                        steps.close()
                        break
                    continue
                put(step[0], step[2] if job.logprobs is not None else None)
                if should_stop():
                    cancelled = True
                    steps.close()  # rewinds the caches to prompt + out[:-1]
                    break
            if cancelled or out[-1] in eos or len(out) >= job.max_tokens:
                break
            # A segment ended at a think decision; it ran to its end, so the
            # caches hold prompt + out[:-1]: the next one prefills from there.
            assert think is not None
            run_from = len(prompt) + len(out) - 1
    except Cancelled as e:
        # Stopped mid-prefill: the chunks already run are a valid prefix
        # (a retry of an abandoned request starts from there).
        if pc is not None:
            pc.keep(context[: e.filled], cache, drafter, key)
        engine.refuse(job)
        return
    tail = stream.finish()
    if points is not None:
        points.sent(tail)

    if cancelled:
        finish = "cancelled"
        if pc is not None:
            pc.keep_cancelled(prompt + out[:-1], cache, drafter, key)
    else:
        finish = "stop" if out and out[-1] in eos else "length"
        # The cache and drafter now hold exactly prompt + out[:-1].
        if pc is not None:
            pc.keep_finished(
                prompt + out[:-1],
                cache,
                drafter,
                key,
                points=points,
                stopped=finish == "stop",
            )
    prefill_s, gen_s = stream.prefill_s, max(stream.decode_s, 1e-9)
    usage = {
        "prompt_tokens": len(prompt),
        "cached_tokens": cached,
        "completion_tokens": len(out),
        "prefill_seconds": round(prefill_s, 4),
        "prefill_tps": round((len(prompt) - cached) / max(prefill_s, 1e-9), 2),
        "generation_tps": round(len(out) / gen_s, 2),
        "engine": job.engine,
        "drafter": engine.drafter_name if speculative else "none",
        "block_size": stats.block_size,
        "spec": stats.as_dict() if stats.block_size > 1 else None,
    }
    _record(engine, job, finish, usage, stats, prefill_s)
    if cancelled:
        event = stopped(job.reason, config.request_timeout, usage=usage)
        event.text = tail
        event.logprobs = pending
        job.emit(event)
        return
    job.emit(Event(text=tail, finish_reason=finish, usage=usage, logprobs=pending))


def _restore(engine, job: Job, drafter):
    """A cache (and `drafter` state) holding the longest reusable prefix of
    the job's prompt, and the prompt to run (see `PromptCache.fetch`)."""
    hit = None
    if engine.prompt_cache is not None:
        hit = engine.prompt_cache.restore(
            job.prompt,
            drafter,
            job.cache_key,
            text=job.text,
            encode=lambda text: list(
                engine.tokenizer.encode(text, add_special_tokens=False)
            ),
        )
    if hit is None:
        engine.metrics.cache_misses.inc()
        return engine.target.make_cache(), 0, list(job.prompt)
    engine.metrics.cache_hits.inc()
    return hit.cache, hit.n, hit.prompt


def _think_budget(tok, job: Job) -> Optional[ThinkBudget]:
    if job.think_budget is None or not tok.has_thinking:
        return None
    return ThinkBudget(
        job.think_budget,
        tuple(tok.think_start_tokens),
        tuple(tok.think_end_tokens),
        inside=opens_think(tok, job.prompt),
    )


def _record(engine, job, finish, usage, stats, prefill_s):
    m = engine.metrics
    m.generations.labels(job.engine, finish).inc()
    m.prompt_tokens.inc(usage["prompt_tokens"])
    m.cached_tokens.inc(usage["cached_tokens"])
    m.generation_tokens.inc(usage["completion_tokens"])
    m.prefill_seconds.observe(prefill_s)
    m.generation_tps.set(usage["generation_tps"])
    if stats.cycles:
        m.drafted.inc(stats.drafted)
        m.accepted.inc(stats.accepted)
        m.cycles.inc(stats.cycles)
        m.tau.set(stats.tau)
        m.generation_tau.observe(stats.tau)
    if stats.drafted:  # lookup cycles can draft nothing: no rate to report
        m.acceptance.set(stats.acceptance_rate)
    if engine.prompt_cache is not None:
        m.cache_bytes.set(engine.prompt_cache.nbytes)
