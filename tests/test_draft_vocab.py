"""A draft vocabulary (`draft_vocab.json`): the drafter proposes only its ids,
over only those rows of the LM head; the output stays stock greedy's."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from helpers import PROMPT, N, random_dflash, run, run_cli, setup
from models import VOCAB, tiny_model

from mlx_dflash.decode import prefill
from mlx_dflash.drafters import DFlashDrafter, prefetch
from mlx_dflash.load import DRAFT_VOCAB, make_drafter, read_draft_vocab
from mlx_dflash.target import Target


def vocab_drafter(target, ref):
    """The random DFlash drafter over every other id plus half of `ref`'s
    tokens: some of the target's tokens can be drafted, some never."""
    full = random_dflash(target)
    ids = sorted(set(range(0, VOCAB, 2)) | set(ref[::2]))
    return full, DFlashDrafter(full.draft, target, ids), ids


@pytest.mark.parametrize("family", ["llama", "qwen3_5", "qwen3_moe"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_greedy_equals_stock_with_a_draft_vocabulary(family, block_size):
    model, ref = setup(family)
    target = Target(model)
    _, drafter, _ = vocab_drafter(target, ref)
    out, stats = run(target, drafter, max_tokens=N, block_size=block_size)
    assert out == ref
    assert stats.emitted == N - 1


@pytest.mark.parametrize("family", ["llama", "qwen3"])  # tied and untied heads
@pytest.mark.parametrize("quantized", [False, True])
def test_proposals_are_the_full_heads_argmax_over_the_vocabulary(family, quantized):
    """Each drafted token is the whole vocabulary's argmax with every other
    id's logit at -inf, for plain and quantized heads."""
    model, ref = setup(family)
    if quantized:
        model = tiny_model(family)
        nn.quantize(model, group_size=32, bits=4)
    target = Target(model)
    full, drafter, ids = vocab_drafter(target, ref)
    for d in (full, drafter):
        prefill(target, target.make_cache(), d, PROMPT)
    logits = np.array(full._logits(PROMPT[-1], 7))
    masked = np.full_like(logits, -np.inf)
    masked[:, ids] = logits[:, ids]
    np.testing.assert_allclose(np.array(drafter._logits(PROMPT[-1], 7)), logits[:, ids], atol=1e-4)
    got = drafter.propose(PROMPT[-1], 7).tolist()
    assert got == masked.argmax(-1).tolist()
    assert set(got) <= set(ids)


def test_a_batched_draft_forward_keeps_each_rows_vocabulary():
    """`prefetch` groups rows by draft and head: rows with and without a
    vocabulary get the logits of their own solo forward."""
    model, ref = setup("qwen3")
    target = Target(model)
    full, drafter, _ = vocab_drafter(target, ref)
    other = DFlashDrafter(drafter.draft, target, drafter.vocab.tolist())
    rows = [(full, 5, 3), (drafter, 5, 4), (other, 5, 2)]
    for d, _, _ in rows:
        prefill(target, target.make_cache(), d, PROMPT)
    solo = [np.array(d._logits(a, n)) for d, a, n in rows]
    prefetch(*zip(*rows))
    for (d, a, n), own in zip(rows, solo):
        np.testing.assert_allclose(np.array(d._logits(a, n)), own, atol=1e-4)


def test_checkpoint_vocabulary_is_read_unless_all(draft_dir):
    target = Target(tiny_model("qwen3"))
    assert make_drafter(draft_dir, target)[0].vocab is None  # none shipped
    (Path(draft_dir) / DRAFT_VOCAB).write_text(json.dumps([7, 3, 3, 95]))
    assert make_drafter(draft_dir, target)[0].vocab.tolist() == [3, 7, 95]
    assert make_drafter(draft_dir, target, vocab="all")[0].vocab is None


@pytest.mark.parametrize(
    "text", ["[1, 2", "{}", "[]", "[1, 96]", "[-1]", "[1.0]", "[true]"]
)
def test_bad_draft_vocabulary_names_the_file(draft_dir, text):
    f = Path(draft_dir) / DRAFT_VOCAB
    f.write_text(text)
    with pytest.raises(ValueError, match=str(f)):
        read_draft_vocab(draft_dir, Target(tiny_model("qwen3")))


def test_generate_reports_and_switches_the_draft_vocabulary(model_dir, draft_dir):
    (Path(draft_dir) / DRAFT_VOCAB).write_text(json.dumps(list(range(0, VOCAB, 3))))
    base = ("generate", "--model", str(model_dir), "--draft", draft_dir)
    base += ("--prompt", "hello", "--max-tokens", "12", "--json")
    texts = {}
    for flag in ("auto", "all"):
        proc = run_cli(*base, "--draft-vocab", flag)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["draft_vocab"] == (32 if flag == "auto" else None)
        texts[flag] = result["text"]
    assert texts["auto"] == texts["all"]
    (Path(draft_dir) / DRAFT_VOCAB).write_text("[1,")
    proc = run_cli(*base)
    assert proc.returncode != 0
    assert DRAFT_VOCAB in proc.stderr and "Traceback" not in proc.stderr


def test_response_vocabulary_is_the_responses_tokens_and_the_specials(tmp_path):
    """`vocab.py --data`: every token after each sequence's prompt, never a
    prompt-only one, with the tokenizer's end-of-sequence ids."""
    from types import SimpleNamespace

    from mlx_dflash.train.data import Dataset
    from mlx_dflash.train.vocab import response_vocab

    seqs = [[10, 11, 12, 40, 41], [12, 13, 42, 40], [14, 43]]
    Dataset.from_lists(seqs, [3, 2, 1]).save(tmp_path / "data.npz")
    tok = SimpleNamespace(all_special_ids=[0, 1], eos_token_ids=[2])
    assert response_vocab(tok, [tmp_path / "data.npz"]) == [0, 1, 2, 40, 41, 42, 43]


def test_eval_only_drafts_over_the_checkpoints_vocabulary_unless_all(model_dir, draft_dir):
    """`train --eval-only` runs the drafter as `generate` does (its
    draft_vocab.json) and reports the vocabulary; output stays stock greedy."""
    from mlx_dflash.train.evaluate import as_drafter

    (Path(draft_dir) / DRAFT_VOCAB).write_text(json.dumps(list(range(0, VOCAB, 3))))
    base = ("train", "--eval-only", "--model", str(model_dir), "--out", draft_dir)
    base += ("--dtype", "float32", "--eval-prompts", "1", "--eval-max-tokens", "8")
    for flag, size in (("auto", 32), ("all", None)):
        proc = run_cli(*base, "--draft-vocab", flag)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["draft_vocab"] == size and result["identical_to_greedy"]
    target = Target(tiny_model("qwen3"))
    drafter = make_drafter(draft_dir, target)[0]
    copy = as_drafter(drafter, target)
    assert copy is not drafter and copy.vocab.tolist() == drafter.vocab.tolist()


def test_a_head_split_across_ranks_drafts_over_the_whole_vocabulary(draft_dir):
    """Under `mlx.launch` with a head split by vocabulary (mlx_lm's `shard`),
    each rank holds only a slice of the rows: `auto` drafts over all ids."""
    (Path(draft_dir) / DRAFT_VOCAB).write_text(json.dumps([3, 7, 95]))
    target = Target(tiny_model("qwen3"))
    target.lm.sharding_group = object()  # what mlx_lm's shard sets on the model
    assert target.head_sharded
    assert make_drafter(draft_dir, target)[0].vocab is None
    with pytest.raises(ValueError, match="whole LM head"):
        DFlashDrafter(make_drafter(draft_dir, target)[0].draft, target, [3, 7])
