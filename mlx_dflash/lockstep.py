"""The server's decoding in lockstep across ranks: rank 0 leads, the others follow.

Rank 0 serves HTTP; its generation thread calls `Leader` where it would call
`decode.generate_step`. Every other rank runs `follow`, which makes the same
`generate_step` calls on its shard of the target. What is decided outside the
model is shared from rank 0 (`World.share`) at the point it is decided:

- "steps": a call's arguments (prompt ids, cached prefix, limits, stop ids,
  sampling with a seed, logprobs);
- "stop?": each answer of the prefill's `should_stop` (client gone, timeout);
- "next" / "close": the consumer asking for one more token, or closing the
  generator (a cancelled request: both sides rewind their caches);
- "exit": the server is shutting down.

Everything else -- drafts, verify, accept, rollback -- runs the same on every
rank from replicated inputs. An error inside decoding on any rank ends that
rank with a message (`World.fail`), and MLX's launcher then ends the rest:
the ranks' collectives could no longer be matched.
"""

import dataclasses
import os
from typing import Any, List, Optional

from .decode import Cancelled, generate_step
from .distributed import World
from .sampling import SamplingParams


class Leader:
    """`generate_step`'s signature on rank 0, told to every rank.

    The fallback is off: it times cycles on each rank and its choices could
    differ between ranks.
    """

    def __init__(self, world: World):
        self.world = world

    def __call__(self, target, prompt, drafter, *, cache, should_stop=None, **kw):
        kw["fallback"] = None
        sampling = kw.get("sampling")
        if sampling is not None and not sampling.greedy and sampling.seed is None:
            # One key for all ranks: the seed goes out with the call.
            seed = int.from_bytes(os.urandom(4), "little")
            kw["sampling"] = sampling = dataclasses.replace(sampling, seed=seed)
        call = dict(kw, prompt=list(prompt))
        call["stop_tokens"] = sorted(kw.get("stop_tokens", ()))
        call["sampling"] = None if sampling is None else dataclasses.asdict(sampling)
        call.pop("fallback")
        call.pop("stats", None)
        self.world.share({"op": "steps", "call": call})

        def stop():
            answer = bool(should_stop()) if should_stop is not None else False
            return self.world.share({"op": "stop?", "value": answer})["value"]

        steps = generate_step(
            target, prompt, drafter, cache=cache, should_stop=stop, **kw
        )
        return Lockstep(self.world, steps)

    def exit(self):
        """Tell the followers the server has stopped."""
        self.world.share({"op": "exit"})


class Lockstep:
    """The leader's generator: each `next` and `close` is told to the followers
    before it is done here."""

    def __init__(self, world: World, steps):
        self.world, self.steps, self.done = world, steps, False

    def __iter__(self):
        return self

    def __next__(self):
        if self.done:
            raise StopIteration
        self.world.share({"op": "next"})
        try:
            return next(self.steps)
        except (StopIteration, Cancelled):  # the followers meet the same end
            self.done = True
            raise
        except Exception as e:  # noqa: BLE001 - the ranks cannot stay matched
            self.world.fail(f"decoding failed: {type(e).__name__}: {e}")

    def close(self):
        if not self.done:
            self.done = True
            self.world.share({"op": "close"})
            self.steps.close()


def follow(world: World, target, drafter):
    """Rank > 0 of `serve`: repeat rank 0's decoding until it exits."""
    cache: Optional[List[Any]] = None
    steps = None
    try:
        while True:
            msg = world.share()
            op = msg["op"]
            if op == "exit":
                return
            if op == "steps":
                if steps is not None:
                    steps.close()  # rank 0 dropped its generator unclosed
                call = msg["call"]
                if call["cached"] == 0 or cache is None:
                    cache = target.make_cache()
                sampling = call.pop("sampling")
                steps = generate_step(
                    target,
                    call.pop("prompt"),
                    drafter,
                    cache=cache,
                    sampling=None if sampling is None else SamplingParams(**sampling),
                    should_stop=lambda: world.share()["value"],
                    **call,
                )
            elif op == "next":
                try:
                    next(steps)
                except (StopIteration, Cancelled):
                    steps = None
            elif op == "close":
                steps.close()
                steps = None
            else:
                raise ValueError(f"unexpected message {op!r} from rank 0")
    except Exception as e:  # noqa: BLE001 - see the module docstring
        world.fail(f"following rank 0 failed: {type(e).__name__}: {e}")
