"""Reasoning at the token level: where a think block opens, and its budget.

A reasoning budget (Anthropic's `thinking.budget_tokens`) is kept as vLLM's
and llama.cpp's are: once the model has thought `budget` tokens without
closing the block, the think-end tokens are put into the output and the
target continues from there, so the answer is exactly what it generates
after `prompt + reasoning[:budget] + </think>`.
"""

from dataclasses import dataclass
from typing import Sequence, Set, Tuple


def opens_think(tokenizer, prompt: Sequence[int]) -> bool:
    """The prompt ends inside a think block its template opened (Qwen3.5 does)."""
    if not tokenizer.has_thinking:
        return False
    start = tokenizer.rfind_think_start(prompt, start=len(prompt) - 12)
    return start >= 0 and tokenizer.rfind_think_end(prompt, start=start) < 0


@dataclass
class ThinkBudget:
    """Counts reasoning tokens as they are generated; says when to close the block.

    The engine decodes in segments that end where a decision is due: at the
    budget (`limit`) or where a think block may open (`stops`). A segment that
    runs to its end leaves the caches holding exactly its output, so the next
    one continues with no rollback, whatever the cache type.
    """

    budget: int
    start: Tuple[int, ...]
    end: Tuple[int, ...]
    inside: bool = False  # in an open think block
    used: int = 0  # reasoning tokens so far
    closed: bool = False  # the (first) think block has ended: nothing left to cap

    def observe(self, out: Sequence[int]):
        """Account for `out[-1]`, just appended."""
        if self.closed:
            return
        if not self.inside:
            self.inside = tuple(out[-len(self.start) :]) == self.start
        elif tuple(out[-len(self.end) :]) == self.end:
            self.inside, self.closed = False, True
        else:
            self.used += 1

    def overdue(self) -> bool:
        return self.inside and self.used >= self.budget

    def limit(self, room: int) -> int:
        """Tokens the next segment may generate."""
        return min(room, self.budget - self.used) if self.inside else room

    def stops(self) -> Set[int]:
        """Extra stop tokens of the next segment: the last token of the think start."""
        return set() if self.inside or self.closed else {self.start[-1]}
