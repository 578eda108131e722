"""A drafter's vocabulary: the tokens it may draft (`draft_vocab.json`).

A DFlash draft pass ends in the target's LM head: at the default target's
49k-token vocabulary, dequantized to fp32 on a CPU, that head was 60 of a
3-token draft pass's 92 ms (this repo's 2-core CPU). A drafter whose
checkpoint lists the tokens it drafts reads only those rows
(`DFlashDrafter(vocab=...)`, loaded by `load.read_draft_vocab`); the output
stays the target's own, since a token the drafter cannot propose is found by
the verify as any rejected draft is.

The list is the tokens the drafter was trained to draft, with the
tokenizer's special tokens: with `--data`, every token of the target's
responses in the training data (`data.npz`, what the drafter learnt to
predict); without, every token of the training prompts' code corpus (the
stdlib files in `agent_context`'s training share, tokenized by the target's
tokenizer). The evaluation share and the held-out sets are not read.

    python -m mlx_dflash.train.vocab DIR [--model GGUF_OR_REPO] [--data A.npz ...]
"""

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Iterable, List, Sequence

from .agent_context import _read, stdlib_files


def special_ids(tokenizer) -> set:
    """The tokenizer's special tokens (end of sequence, chat markers): every
    draft vocabulary keeps them."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    return ids | set(getattr(tokenizer, "eos_token_ids", []) or [])


def corpus_vocab(tokenizer, texts: Iterable[str], min_count: int = 1) -> List[int]:
    """Sorted ids of the tokens seen at least `min_count` times in `texts`,
    with the tokenizer's special tokens."""
    counts = Counter(i for t in texts for i in tokenizer.encode(t))
    return sorted({i for i, c in counts.items() if c >= min_count} | special_ids(tokenizer))


def response_vocab(tokenizer, data_paths: Sequence[str]) -> List[int]:
    """Sorted ids of every token of the responses in training data files
    (`Dataset`: the tokens after each sequence's prompt), with the
    tokenizer's special tokens."""
    import numpy as np

    from .data import Dataset

    ids = set()
    for path in data_paths:
        d = Dataset.load(path)
        starts = d.offsets[:-1] + d.prompt_lens
        keep = np.zeros(d.tokens.size, bool)
        for s, e in zip(starts, d.offsets[1:]):
            keep[s:e] = True
        ids |= set(np.unique(d.tokens[keep]).tolist())
    return sorted(ids | special_ids(tokenizer))


def training_texts() -> List[str]:
    """The code corpus of the training prompts (`agent_context`'s training share)."""
    return [_read(rel) for rel in stdlib_files("train")]


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m mlx_dflash.train.vocab",
        description="write a drafter checkpoint's draft_vocab.json",
    )
    p.add_argument("draft", help="the drafter's checkpoint directory")
    p.add_argument("--model", default=None, help="its target (default: the default target)")
    p.add_argument(
        "--data", nargs="+", default=None, help="training data (data.npz): the responses' tokens"
    )
    a = p.parse_args(argv)
    from ..load import DRAFT_VOCAB, load_model

    tokenizer = load_model(a.model)[1]
    if a.data:
        ids = response_vocab(tokenizer, a.data)
    else:
        ids = corpus_vocab(tokenizer, training_texts())
    out = Path(a.draft) / DRAFT_VOCAB
    out.write_text(json.dumps(ids))
    print(f"{out}: {len(ids)} token ids")


if __name__ == "__main__":
    main()
