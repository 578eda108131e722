"""TokenStream: the one detokenise-and-time loop of generate, the server and the bench."""

from helpers import make_tokenizer

from mlx_dflash.stream import TokenStream


def test_text_is_the_decoded_tokens_and_stop_tokens_are_not_text():
    tok = make_tokenizer(words=["hello"])
    eos = tok.eos_token_ids
    ids = tok.encode("hello, world\nok", add_special_tokens=False)
    stream = TokenStream(tok.detokenizer, eos)
    assert stream.prefill_s == 0.0  # no token yet
    pieces = [stream.add(t) for t in ids]
    assert stream.add(next(iter(eos))) == ""
    pieces.append(stream.finish())
    assert "".join(pieces) == tok.decode(ids)
    assert stream.prefill_s > 0 and stream.decode_s >= 0
    end = stream.decode_s
    assert stream.decode_s == end  # finish froze the clock


def test_inserted_tokens_are_text_but_not_timed():
    tok = make_tokenizer()
    stream = TokenStream(tok.detokenizer)
    ids = tok.encode("ab", add_special_tokens=False)
    assert "".join(stream.text(t) for t in ids) + stream.finish() == "ab"
    assert stream.first is None and stream.prefill_s == 0.0


def test_without_a_detokenizer_it_only_times():
    stream = TokenStream()
    assert stream.add(5) == "" and stream.finish() == ""
    assert stream.first is not None and stream.decode_s >= 0
