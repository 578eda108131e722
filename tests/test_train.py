"""Trainer: objective against the inference path, mask, weights, steps, checkpoints."""

import json
import math

import mlx.core as mx
import numpy as np
import pytest
from models import VOCAB, tiny_model

from mlx_dflash.draft import load_draft
from mlx_dflash.target import Target
from mlx_dflash.train.data import Dataset, generate_responses, greedy_batch
from mlx_dflash.train.objective import (
    block_attention_mask,
    block_loss,
    dense_head,
    draft_blocks_forward,
    label_rows,
    make_blocks,
    position_weights,
    sample_anchors,
    soft_labels,
    target_features,
)
from mlx_dflash.train.prompts import HELD_OUT, build_prompts
from mlx_dflash.train.checkpoint import train_finished
from mlx_dflash.train.trainer import TrainArgs, grow_draft, init_draft, train

MASK = VOCAB - 1


def _setup(block_size=4, layers=2, seed=0):
    target = Target(tiny_model("llama", seed=seed))
    draft = init_draft(
        target, num_layers=layers, mask_token_id=MASK, block_size=block_size, seed=1
    )
    target.set_capture_layers(draft.args.target_layer_ids)
    return target, draft


def _random_tokens(n, s, seed=0):
    return mx.array(np.random.default_rng(seed).integers(3, VOCAB - 1, (n, s)))


def test_grown_draft_computes_the_same_then_trains_its_new_layers():
    """Layers appended by grow_draft add nothing at first (zeroed output
    projections), so the grown drafter's blocks equal the original's; one
    training step gives the new layers' output projections a gradient."""
    target, draft = _setup(block_size=4, layers=2)
    grown = grow_draft(draft, 4)
    assert grown.args.num_hidden_layers == 4 and len(grown.args.layer_types) == 4
    assert grow_draft(draft, 2) is draft
    tok = _random_tokens(2, 40)
    feats = target_features(target, tok)
    anchors = mx.array([[3, 11, 20], [5, 17, 23]])
    ids, _, _ = make_blocks(tok, anchors, 4, MASK)
    emb = target.embed(ids)
    before = draft_blocks_forward(draft, emb, feats, anchors)
    after = draft_blocks_forward(grown, emb, feats, anchors)
    assert mx.allclose(before, after, atol=1e-6).item()
    new = grown.layers[3]
    assert not mx.any(new.self_attn.o_proj.weight).item()
    assert mx.array_equal(new.self_attn.q_proj.weight, draft.layers[1].self_attn.q_proj.weight)

    def loss(model):
        return mx.mean(draft_blocks_forward(model, emb, feats, anchors) ** 2)

    import mlx.nn as nn

    grads = nn.value_and_grad(grown, loss)(grown)[1]
    g = grads["layers"][3]
    assert mx.any(g["self_attn"]["o_proj"]["weight"]).item()
    assert mx.any(g["mlp"]["down_proj"]["weight"]).item()


@pytest.mark.parametrize("block_size", [4, 16])
def test_training_forward_matches_inference(block_size):
    target, draft = _setup(block_size)
    tok = _random_tokens(2, 40)
    feats = target_features(target, tok)
    anchors = mx.array([[3, 11, 20], [5, 17, 23]])
    ids, _, _ = make_blocks(tok, anchors, block_size, MASK)
    h = draft_blocks_forward(draft, target.embed(ids), feats, anchors)
    for n in range(2):
        for a in range(3):
            p = anchors[n, a].item()
            cache = draft.make_cache()
            draft.append_context(feats[n : n + 1, :p], cache)
            ref = draft(target.embed(ids[n : n + 1, a]), cache)
            assert mx.allclose(ref[0], h[n, a], atol=1e-5).item()


def test_mask_blocks_see_only_own_block_and_earlier_context():
    B, S = 4, 12
    anchors = mx.array([[2, 5, 9]])
    m = np.array(block_attention_mask(anchors, S, B)[0])
    # Keys are [context ; the query's own block]: other blocks are never scored.
    assert m.shape == (3 * B, S + B)
    for q in range(3 * B):
        p = int(anchors[0, q // B].item())
        ctx = m[q, :S]
        assert ctx[:p].all() and not ctx[p:].any()  # strictly before the anchor
        assert m[q, S:].all()  # itself, bidirectionally
    # Causal (sliding-window drafts): a query sees its own block up to itself.
    m = np.array(block_attention_mask(anchors, S, B, causal=True)[0])
    assert (m[:B, S:] == np.tril(np.ones((B, B), bool))).all()


def test_mask_changing_other_blocks_or_later_context_changes_nothing():
    target, draft = _setup(4)
    tok = _random_tokens(1, 30)
    feats = target_features(target, tok)
    anchors = mx.array([[6, 14]])
    ids, _, _ = make_blocks(tok, anchors, 4, MASK)
    emb = target.embed(ids)
    h = draft_blocks_forward(draft, emb, feats, anchors)
    # Perturb the second block's inputs and all context at/after the first anchor.
    emb2 = mx.concatenate([emb[:, :1], emb[:, 1:] + 1.0], axis=1)
    feats2 = mx.concatenate([feats[:, :6], feats[:, 6:] * -3.0], axis=1)
    h2 = draft_blocks_forward(draft, emb2, feats2, anchors)
    assert mx.allclose(h[:, 0], h2[:, 0], atol=1e-6).item()
    assert not mx.allclose(h[:, 1], h2[:, 1], atol=1e-3).item()


def test_loss_weights_and_label_masking():
    w = position_weights(16, 7.0)
    assert w.shape == (15,)
    assert math.isclose(w[0].item(), 1.0)
    assert math.isclose(w[7].item(), math.exp(-1.0), rel_tol=1e-6)
    # Labels past the sequence end do not count: padding after it is irrelevant.
    target, draft = _setup(4)
    tok = _random_tokens(1, 16)
    lengths = mx.array([10])
    anchors, valid = mx.array([[7, 8]]), mx.array([[True, True]])
    feats = target_features(target, tok)
    loss, stats = block_loss(
        draft, target, tok, lengths, feats, anchors, valid, gamma=7.0
    )
    tok2 = mx.concatenate([tok[:, :10], mx.zeros((1, 6), tok.dtype)], axis=1)
    loss2, _ = block_loss(
        draft,
        target,
        tok2,
        lengths,
        target_features(target, tok2),
        anchors,
        valid,
        gamma=7.0,
    )
    assert math.isclose(loss.item(), loss2.item(), rel_tol=1e-5)
    assert stats["valid"].tolist() == [2, 1, 0]  # anchor 7: 8,9 ; anchor 8: 9


def test_label_rows_and_dense_head_give_the_same_loss():
    # Scoring only the rows that count, through a dequantized copy of a
    # quantized head, changes nothing but rounding.
    import mlx.nn as nn

    model = tiny_model("llama")
    nn.quantize(model, group_size=32, bits=8)
    target = Target(model)
    draft = init_draft(target, num_layers=1, mask_token_id=MASK, block_size=4)
    target.set_capture_layers(draft.args.target_layer_ids)
    tok = _random_tokens(2, 24)
    lengths = np.array([24, 15])
    anc = np.array([[6, 12, 20], [5, 13, 0]])
    counts = np.array([3, 2])
    valid = np.arange(3)[None] < counts[:, None]
    feats = target_features(target, tok)
    args = (draft, target, tok, mx.array(lengths), feats, mx.array(anc))
    full, s_full = block_loss(*args, mx.array(valid), gamma=7.0)
    rows = label_rows(anc, counts, lengths, 4)
    assert len(rows) % 256 == 0 and (rows >= 0).sum() == s_full["valid"].sum().item()
    fast, s_fast = block_loss(
        *args,
        mx.array(valid),
        gamma=7.0,
        rows=mx.array(rows),
        head=dense_head(target, mx.float32),
    )
    assert math.isclose(full.item(), fast.item(), rel_tol=1e-4)
    for k in s_full:
        assert s_full[k].tolist() == s_fast[k].tolist(), k


def test_soft_labels_are_the_targets_distributions():
    # Weight 0 is the hard loss; weight 1 over the whole vocabulary is the
    # cross-entropy against the target's next-token distribution at the
    # label's previous position, computed here label by label.
    target, draft = _setup(4)
    tok = _random_tokens(2, 20)
    lengths, anchors = mx.array([20, 13]), mx.array([[4, 9], [6, 10]])
    valid = mx.array([[True, True], [True, False]])
    feats, soft = soft_labels(target, tok, VOCAB)
    assert mx.allclose(feats, target_features(target, tok)).item()
    args = (draft, target, tok, lengths, feats, anchors, valid)
    hard, _ = block_loss(*args, gamma=7.0)
    zero, _ = block_loss(*args, gamma=7.0, soft=soft, soft_weight=0.0)
    assert zero.item() == hard.item()
    full, _ = block_loss(*args, gamma=7.0, soft=soft, soft_weight=1.0)
    ids, _, pos = make_blocks(tok, anchors, 4, MASK)
    h = draft_blocks_forward(draft, target.embed(ids), feats, anchors)
    z = target.head(h[:, :, 1:]).astype(mx.float32)
    logq = z - mx.logsumexp(z, axis=-1, keepdims=True)
    logits, _ = target.forward(tok, None)
    p = mx.softmax(logits.astype(mx.float32), axis=-1)
    w = position_weights(4, 7.0)
    num = den = 0.0
    for n in range(2):
        for a in range(2):
            for j in range(3):
                t = pos[n, a, j].item()
                if valid[n, a].item() and t < lengths[n].item():
                    ce = -(p[n, t - 1] * logq[n, a, j]).sum().item()
                    num, den = num + w[j].item() * ce, den + w[j].item()
    assert math.isclose(full.item(), num / den, rel_tol=1e-4)
    half, _ = block_loss(*args, gamma=7.0, soft=soft, soft_weight=0.5)
    assert math.isclose(half.item(), (hard.item() + full.item()) / 2, rel_tol=1e-4)
    # Only the rows that count, as the trainer scores them: the same loss.
    rows = label_rows(np.array(anchors), np.array([2, 1]), np.array(lengths), 4)
    fast, _ = block_loss(
        *args, gamma=7.0, rows=mx.array(rows), soft=soft, soft_weight=0.5,
        head=dense_head(target, mx.float32),
    )
    assert math.isclose(fast.item(), half.item(), rel_tol=1e-4)


def test_training_with_soft_labels_lowers_the_loss(tmp_path):
    target, draft = _setup(4)
    tok = _random_tokens(6, 24, seed=5)
    data = Dataset.from_lists(tok.tolist(), [4] * 6)
    args = TrainArgs(steps=12, batch_size=3, anchors=6, block_size=4, lr=3e-3,
                     warmup=1, report_every=1, save_every=100, soft_labels=0.5,
                     soft_top_k=8)
    history = train(draft, target, data, args, out=tmp_path, log=lambda *_: None)
    assert history[-1]["loss"] < history[0]["loss"]


def test_batched_greedy_equals_each_prompt_alone():
    # Padding, the fixed-size cache and shrinking the batch must not change a
    # single token: every row equals mlx_lm's own greedy run of that prompt.
    from collections import Counter

    from mlx_lm.generate import generate_step

    target = Target(tiny_model("llama"))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, VOCAB - 1, n).tolist() for n in rng.integers(2, 40, 11)]
    ref = [
        [int(t) for t, _ in generate_step(mx.array(p), target.model, max_tokens=24)]
        for p in prompts
    ]
    # A stop token that ends some rows early (kept at the end of the response).
    stop = Counter(t for r in ref for t in r[2:12]).most_common(1)[0][0]
    ref = [r[: r.index(stop) + 1] if stop in r else r for r in ref]
    # Most rows stop early, so the batch also shrinks (11 -> 8 -> 4 rows).
    assert len(ref) // 2 < sum(len(r) < 24 for r in ref) < len(ref)
    got = greedy_batch(target, prompts, stop_tokens=[stop], max_tokens=24, min_rows=2)
    assert got == ref
    data = generate_responses(
        target, prompts, stop_tokens=[stop], max_tokens=24, batch_size=4, min_response=0
    )
    out = {
        tuple(data.sequence(i)[: data.prompt_lens[i]].tolist()): data.sequence(i)[
            data.prompt_lens[i] :
        ].tolist()
        for i in range(len(data))
    }
    assert [out[tuple(p)] for p in prompts] == ref


def test_anchors_are_response_positions():
    rng = np.random.default_rng(0)
    a = sample_anchors(10, 30, 512, rng)
    assert len(a) == 19 and a.min() >= 10 and a.max() <= 28
    assert len(sample_anchors(10, 30, 5, rng)) == 5
    assert len(sample_anchors(10, 11, 5, rng)) == 0


def _tiny_data(target, n=12, prompt_len=6, resp=24, seed=0):
    # Self-distilled: the tiny target's own greedy continuation of random prompts.
    from mlx_lm.generate import generate_step

    rng = np.random.default_rng(seed)
    seqs, plens = [], []
    for _ in range(n):
        p = rng.integers(3, VOCAB - 1, prompt_len).tolist()
        out = [
            int(t) for t, _ in generate_step(mx.array(p), target.model, max_tokens=resp)
        ]
        seqs.append(p + out)
        plens.append(prompt_len)
    return Dataset.from_lists(seqs, plens)


def test_a_few_steps_lower_the_loss(tmp_path):
    target, draft = _setup(4, layers=1)
    data = _tiny_data(target)
    args = TrainArgs(
        steps=30,
        batch_size=4,
        anchors=8,
        block_size=4,
        lr=3e-3,
        warmup=3,
        save_every=0,
        report_every=5,
    )
    hist = train(draft, target, data, args, out=tmp_path, log=lambda m: None)
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"]


def test_checkpoint_round_trip_and_resume(tmp_path):
    target, draft = _setup(4, layers=1)
    data = _tiny_data(target, n=8)
    args = TrainArgs(
        steps=8,
        batch_size=4,
        anchors=8,
        block_size=4,
        warmup=1,
        save_every=2,
        report_every=1,
    )
    train(draft, target, data, args, out=tmp_path, stop_after=4, log=lambda m: None)
    assert not train_finished(tmp_path)
    loaded = load_draft(tmp_path, target=target)
    tok = _random_tokens(1, 20)
    feats = target_features(target, tok)
    emb = target.embed(mx.array([[5] + [MASK] * 3]))
    outs = []
    for d in (draft, loaded):
        cache = d.make_cache()
        d.append_context(feats[:, :9], cache)
        outs.append(d(emb, cache))
    assert mx.array_equal(outs[0], outs[1]).item()

    # Resume: 4 more steps continue from step 4 and reproduce an uninterrupted 8-step run.
    resumed = init_draft(target, num_layers=1, mask_token_id=MASK, block_size=4, seed=7)
    train(resumed, target, data, args, out=tmp_path, resume=True, log=lambda m: None)
    assert train_finished(tmp_path)
    straight = init_draft(
        target, num_layers=1, mask_token_id=MASK, block_size=4, seed=1
    )
    train(straight, target, data, args, out=tmp_path / "b", log=lambda m: None)
    for (k, a), (_, b) in zip(
        sorted(dict(_flat(resumed)).items()), sorted(dict(_flat(straight)).items())
    ):
        assert mx.allclose(a, b, atol=1e-5).item(), k


def _flat(model):
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())


def test_prompt_set_is_offline_and_split():
    train_p, held = build_prompts()
    assert len(train_p) > 5000 and 50 < len(held) < len(train_p) // 10
    assert not {p.text for p in train_p} & {p.text for p in held}
    assert {p.kind for p in train_p} == {"code", "general"}
    # The same on every machine: the held-out list is shipped, no text carries an address.
    assert [p.text for p in held] == [
        p["text"] for p in json.loads(HELD_OUT.read_text())
    ]
    assert not any(" at 0x" in p.text for p in train_p + held)
    # The wide set (default) contains the core set, whose draws it leaves alone.
    core, held_core = build_prompts(wide=False)
    assert held_core == held and 5000 < len(core) < len(train_p) / 3
    assert {p.text for p in core} <= {p.text for p in train_p}


def test_cli_trains_then_eval_only_prints_tau(tmp_path, capsys):
    import json

    from models import save_tiny_model_dir

    from mlx_dflash.train.cli import main

    model, out = tmp_path / "model", tmp_path / "draft"
    save_tiny_model_dir("llama", model)
    common = ["--model", str(model), "--out", str(out)]
    report = main(
        common + "--num-prompts 4 --max-new-tokens 16 --gen-batch 4 --layers 1 "
        "--mask-token-id 95 --steps 3 --batch-size 2 --anchors 4 --warmup 1 "
        "--save-every 0 --eval-prompts 0".split()
    )
    assert report["sequences"] > 0 and (out / "data.npz").is_file()
    assert train_finished(out)
    capsys.readouterr()
    main(common + "--eval-only --eval-prompts 1 --eval-max-tokens 8".split())
    result = json.loads(capsys.readouterr().out)
    assert result["identical_to_greedy"] and result["tau"] >= 1.0
    # Suites: --eval-json is written after each one and holds the whole result at the end.
    ej = tmp_path / "eval.json"
    main(common + ["--eval-only", "--eval-sets", "natural,old", "--eval-natural", "1",
                   "--eval-temperatures", "", "--eval-prompts", "1", "--eval-max-tokens", "8",
                   "--eval-json", str(ej)])
    result = json.loads(capsys.readouterr().out)
    assert json.loads(ej.read_text()) == result and set(result) >= {"natural", "old"}


def test_cli_sharded_extended_data_and_init(tmp_path):
    """Shards of the generation, joined, equal one unsharded run; --extend answers
    only what reused data lacks; --init starts from a drafter's weights."""
    from mlx.utils import tree_flatten
    from models import save_tiny_model_dir

    from mlx_dflash.train.cli import main
    from mlx_dflash.train.data import Dataset

    model = tmp_path / "model"
    save_tiny_model_dir("llama", model)

    def run(out, *extra):
        return main(
            ["--model", str(model), "--out", str(tmp_path / out)]
            + "--num-prompts 6 --max-new-tokens 12 --gen-batch 4 --gen-only".split()
            + list(extra)
        )

    def seqs(out):
        d = Dataset.load(tmp_path / out / "data.npz")
        return sorted(tuple(d.sequence(i).tolist()) for i in range(len(d)))

    report = run("all")
    assert json.loads((tmp_path / "all" / "report.json").read_text()) == report
    assert report["sequences"] == len(seqs("all")) and report["generate_seconds"] > 0
    run("s0", "--gen-shard", "0/2")
    run("s1", "--gen-shard", "1/2")
    assert 0 < len(seqs("s0")) < len(seqs("all"))
    data = [str(tmp_path / s / "data.npz") for s in ("s0", "s1", "s0")]
    report = run("joined", "--data", *data)
    assert "generate_seconds" not in report and seqs("joined") == seqs("all")
    run("extended", "--data", data[0], "--extend")
    assert seqs("extended") == seqs("all")

    train = "--layers 1 --mask-token-id 95 --batch-size 2 --anchors 4 --warmup 1 "
    train += "--save-every 0 --eval-prompts 0 --data " + data[0]
    common = ["--model", str(model)]
    main(common + ["--out", str(tmp_path / "d1")] + (train + " --steps 3").split())
    main(
        common
        + ["--out", str(tmp_path / "d2"), "--init", str(tmp_path / "d1")]
        + (train + " --steps 1 --lr 0").split()
    )
    a, b = (load_draft(tmp_path / d).parameters() for d in ("d1", "d2"))
    main(
        common
        + ["--out", str(tmp_path / "d3"), "--init", str(tmp_path / "d1"), "--grow-layers", "2"]
        + (train + " --steps 1 --lr 0").split()
    )
    grown = load_draft(tmp_path / "d3")
    assert grown.args.num_hidden_layers == 2
    assert not mx.any(grown.layers[1].mlp.down_proj.weight).item()
    kept = tree_flatten(grown.layers[0].parameters())
    for (_, x), (_, y) in zip(tree_flatten(a["layers"][0]), kept):
        assert mx.array_equal(x, y)
    Dataset.from_lists([], []).save(tmp_path / "empty.npz")
    for bad, words in (
        (["--data", str(tmp_path / "empty.npz")], "no training sequences"),
        (["--gen-shard", "2/2"], "0 <= K < N"),
        (["--gen-shard", "x"], "0 <= K < N"),
        (["--data", str(tmp_path / "none.npz")], "no such file"),
        (["--init", str(tmp_path)], "no config.json"),
        (["--grow-layers", "3"], "needs --init"),
        (["--self-requests", "4"], "needs --prompt-set natural"),
        (["--self-requests", "-1"], "need N >= 0"),
    ):
        with pytest.raises(SystemExit, match=words):
            main(common + ["--out", str(tmp_path / "bad")] + bad)
    for (_, x), (_, y) in zip(tree_flatten(a), tree_flatten(b)):
        assert mx.array_equal(x, y)


def test_tau_estimate_equals_decoded_greedy_tau(tmp_path):
    """estimate_tau walks greedy decoding's cycles through one teacher-forced
    pass over the target's own greedy answers: its tau and each sequence's
    (tokens, cycles) equal a real DFlash decode's of the same prompts, before
    and after training (partial acceptance, the answer's end mid-block)."""
    from dataclasses import replace

    from mlx_dflash.train.trainer import estimate_tau, evaluate_tau, tau_by

    target, draft = _setup(4, layers=1)
    data = _tiny_data(target)
    prompts = [data.sequence(i)[: data.prompt_lens[i]].tolist() for i in range(len(data))]
    args = TrainArgs(steps=40, batch_size=4, anchors=8, block_size=4, lr=3e-3, warmup=3,
                     save_every=0, report_every=5, val_every=0)
    taus = []
    for trained in (False, True):
        if trained:
            train(draft, target, data, args, out=tmp_path, log=lambda m: None)
        est = estimate_tau(draft, target, data, args)
        stats, per_prompt, identical = evaluate_tau(target, draft, prompts, max_tokens=24, block_size=4)
        assert identical
        assert est["tau_est"] == stats.tau and est["cycles"] == stats.cycles
        assert [t / c for t, c in est["per_sequence"]] == per_prompt
        # Pooled by key (a probe's categories) as the estimate pools them all.
        assert tau_by(["all"] * len(data), est["per_sequence"]) == {"all": round(stats.tau, 3)}
        taus.append(est["tau_est"])
    assert taus[1] > taus[0]
    # Sequences past --max-len are walked as training truncates them.
    short = replace(args, max_len=20)
    cut = Dataset.from_lists([data.sequence(i)[:20] for i in range(len(data))], data.prompt_lens)
    assert estimate_tau(draft, target, data, short) == estimate_tau(draft, target, cut, short)


def test_training_reports_validation_sets_it_does_not_train_on(tmp_path):
    from mlx_dflash.train.trainer import estimate_tau

    target, draft = _setup(4, layers=1)
    data = _tiny_data(target)
    held, rest = data.subset(range(3)), data.subset(range(3, len(data)))
    assert held.sequence(1).tolist() == data.sequence(1).tolist()
    logs = []
    args = TrainArgs(steps=5, batch_size=4, anchors=8, block_size=4, warmup=1,
                     save_every=0, report_every=1, val_every=2)
    hist = train(draft, target, rest, args, out=tmp_path, val={"held": held}, log=logs.append)
    vals = [h for h in hist if "val" in h]
    assert [h["step"] for h in vals] == [0, 2, 4, 5]
    # The last estimate is the finished drafter's.
    last = estimate_tau(draft, target, held, args)
    del last["per_sequence"]
    assert vals[-1]["val"]["held"] == last
    assert any(m.startswith("val held step 4: tau ") for m in logs)
    assert all("loss" in h for h in hist if "val" not in h)


def test_cli_validation_share_and_natural_set(tmp_path):
    from models import save_tiny_model_dir

    from mlx_dflash.train.cli import main

    model = tmp_path / "model"
    save_tiny_model_dir("llama", model)
    common = ["--model", str(model), "--num-prompts", "8", "--max-new-tokens", "8",
              "--gen-batch", "4", "--layers", "1", "--mask-token-id", "95", "--steps", "2",
              "--batch-size", "2", "--anchors", "4", "--warmup", "1", "--save-every", "0",
              "--eval-prompts", "0"]
    report = main(common + ["--out", str(tmp_path / "a"), "--val-share", "0.25",
                            "--val-natural", "--val-every", "1"])
    assert report["val_sequences"]["draw"] == round(report["sequences"] * 0.25)
    # The held-out set's answers (a few of the tiny target's may stop too short to keep).
    assert 90 <= report["val_sequences"]["natural"] <= 101
    assert [v["step"] for v in report["val"]] == [0, 1, 2]
    last = report["val"][-1]["val"]
    assert set(last) == {"draw", "natural"} and all(e["cycles"] > 0 for e in last.values())
    with pytest.raises(SystemExit, match="--val-share 1.0"):
        main(common + ["--out", str(tmp_path / "b"), "--val-share", "1.0"])
