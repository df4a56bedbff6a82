"""Harness-only stand-in for ``tiktoken`` (its BPE files are downloads, which this machine cannot make).

On ``PYTHONPATH`` only for the acceptance-run cases that import tiktoken (llm.c ``train_gpt2.py``,
gpt-fast ``tokenizer.py``), never part of torch_adapter. ``get_encoding("gpt2")`` answers a
byte-level encoding with GPT-2's vocabulary size and end-of-text id (50256); ``Encoding`` builds one
from ranks and special tokens as the real class does. Text is encoded byte by byte (no merges), and
ids that are neither a known token nor a special one decode to U+FFFD, so text sampled from a random
model decodes.
"""

from __future__ import annotations

__all__ = ["Encoding", "get_encoding"]


class Encoding:
    def __init__(self, name, pat_str=r".", mergeable_ranks=None, special_tokens=None, explicit_n_vocab=None):
        self.name = name
        self._ranks = dict(mergeable_ranks or {bytes([b]): b for b in range(256)})
        self._special = dict(special_tokens or {})
        self._bytes = {rank: tok for tok, rank in self._ranks.items()}
        self._bytes.update({i: s.encode() for s, i in self._special.items()})
        self.n_vocab = explicit_n_vocab or (max(self._bytes) + 1)

    @property
    def eot_token(self) -> int:
        return self._special.get("<|endoftext|>", self.n_vocab - 1)

    @property
    def special_tokens_set(self) -> set:
        return set(self._special)

    def encode_ordinary(self, text: str) -> list[int]:
        return [self._ranks[bytes([b])] for b in text.encode("utf-8")]

    def encode(self, text: str, *, allowed_special=(), disallowed_special="all") -> list[int]:
        if allowed_special == "all":
            allowed_special = self._special
        out: list[int] = []
        rest = text
        while rest:
            hits = [(rest.find(s), s) for s in allowed_special if s in rest]
            if not hits:
                out += self.encode_ordinary(rest)
                break
            at, special = min(hits)
            out += self.encode_ordinary(rest[:at]) + [self._special[special]]
            rest = rest[at + len(special):]
        return out

    def decode_single_token_bytes(self, token: int) -> bytes:
        return self._bytes.get(token, "\ufffd".encode())

    def decode_bytes(self, tokens) -> bytes:
        return b"".join(self.decode_single_token_bytes(t) for t in tokens)

    def decode(self, tokens, errors: str = "replace") -> str:
        return self.decode_bytes(tokens).decode("utf-8", errors=errors)


def get_encoding(name: str) -> Encoding:
    if name != "gpt2":
        raise ValueError(f"tiktoken shim: only 'gpt2' is offered, not {name!r}")
    return Encoding("gpt2", special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
