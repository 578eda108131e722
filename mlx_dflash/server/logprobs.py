"""Log-probabilities as the OpenAI APIs report them: each token's own bytes and
text, in the chat format and the legacy completions format."""

import re
from typing import Dict

def _gpt2_byte_decoder() -> Dict[str, int]:
    """Byte-level BPE's printable stand-ins for bytes (GPT-2's bytes_to_unicode)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


_BYTE_LEVEL = _gpt2_byte_decoder()
_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenText:
    """A token's own UTF-8 bytes and display string, as the API reports them.

    Decoding one token alone drops BPE/SentencePiece leading spaces and turns
    partial UTF-8 into U+FFFD, so we read the vocabulary piece instead, the
    way mlx_lm's streaming detokenizer for this tokenizer does.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.kind = type(tokenizer.detokenizer).__name__
        self._memo: Dict[int, bytes] = {}

    def bytes(self, token: int) -> bytes:
        if token not in self._memo:
            self._memo[token] = self._bytes(token)
        return self._memo[token]

    def _bytes(self, token: int) -> bytes:
        tok = self.tokenizer
        piece = tok.convert_ids_to_tokens(token)
        if not isinstance(piece, str) or token in tok.all_special_ids:
            return tok.decode([token]).encode()
        if self.kind == "BPEStreamingDetokenizer":
            if all(c in _BYTE_LEVEL for c in piece):
                return bytes(_BYTE_LEVEL[c] for c in piece)
        elif self.kind == "SPMStreamingDetokenizer":
            m = _SPM_BYTE.fullmatch(piece)
            return (
                bytes([int(m[1], 16)]) if m else piece.replace("\u2581", " ").encode()
            )
        return tok.decode([token]).encode()

    def text(self, token: int) -> str:
        # Partial UTF-8 shows as escapes, never as U+FFFD.
        return self.bytes(token).decode("utf-8", "backslashreplace")


class ChatLogprobs(TokenText):
    """Chat format: {"content": [{token, logprob, bytes, top_logprobs}], "refusal"}."""

    def entry(self, token: int, logprob: float) -> dict:
        return {
            "token": self.text(token),
            "logprob": logprob,
            "bytes": list(self.bytes(token)),
        }

    def __call__(self, tokens) -> dict:
        content = [
            {**self.entry(t, lp), "top_logprobs": [self.entry(*e) for e in top]}
            for t, lp, top in tokens
        ]
        return {"content": content, "refusal": None}


class CompletionLogprobs(TokenText):
    """Legacy completions format: parallel lists plus each token's text offset."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.offset = 0  # characters of completion text so far (streams span calls)

    def __call__(self, tokens) -> dict:
        out = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for t, lp, top in tokens:
            text = self.text(t)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append({self.text(i): v for i, v in top})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out
