"""Harness-only ``tiktoken.load``: reads a local BPE file (one ``BASE64TOKEN RANK`` a line)."""

import base64


def load_tiktoken_bpe(path: str, expected_hash=None) -> dict:
    with open(path, "rb") as fh:
        return {base64.b64decode(tok): int(rank) for tok, rank in (ln.split() for ln in fh.read().splitlines() if ln)}
