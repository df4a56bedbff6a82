"""The acceptance run's llm.c token shard and tiktoken stand-in (benchmarks/realworld/) are what the
programs read: llm.c's header (magic, version, count) and tiktoken's calls that llm.c and gpt-fast make."""

import base64
import importlib
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent / "benchmarks" / "realworld"


def _import(folder: Path, name: str):
    sys.path.insert(0, str(folder))
    try:
        sys.modules.pop(name, None)
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


def test_llmc_shard_has_llmc_header_and_uint16_tokens(tmp_path):
    fixtures = _import(HERE, "fixtures")
    path = fixtures.llmc_shard(tmp_path / "t.bin", n=300)
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype=np.int32)
    tokens = np.frombuffer(raw[1024:], dtype=np.uint16)
    assert (header[0], header[1], header[2]) == (20240520, 1, 300)
    assert len(tokens) == 300 and int(tokens.max()) < 50257 and len(set(tokens.tolist())) > 1


def test_tiktoken_shim_gpt2_and_bpe_file(tmp_path):
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "tiktoken" or k.startswith("tiktoken.")}
    try:
        tiktoken = _import(HERE / "tiktoken_shim", "tiktoken")
        load = importlib.import_module("tiktoken.load")
        enc = tiktoken.get_encoding("gpt2")
        assert (enc.eot_token, enc.n_vocab) == (50256, 50257)
        ids = enc.encode("hé<|endoftext|>", allowed_special={"<|endoftext|>"})
        assert ids[-1] == 50256 and enc.decode(ids) == "hé<|endoftext|>"
        assert enc.decode([104, 31999]) == "h\ufffd"  # a random model's id past the vocabulary still decodes
        bpe = tmp_path / "tokenizer.model"
        bpe.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
        ranks = load.load_tiktoken_bpe(str(bpe))
        own = tiktoken.Encoding("t", pat_str="", mergeable_ranks=ranks, special_tokens={"<|begin_of_text|>": 256})
        assert own.encode("ab") == [97, 98] and own.decode([256, 97]) == "<|begin_of_text|>a"
    finally:
        for k in [k for k in sys.modules if k == "tiktoken" or k.startswith("tiktoken.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_target_flags_reach_every_adapter_run_and_losses_compare_as_printed():
    """--target npu --emulate goes after each `torch_adapter run` a case starts (torchrun ranks included);
    losses compare as printed: same, close within one unit of the last printed digit, or different."""
    common = _import(HERE, "common")
    flags = ["--target", "npu", "--emulate"]
    cmd = ["torchrun", "--nproc-per-node", "2", "-m", "torch_adapter", "run", "train.py", "--run", "x"]
    assert common.with_target_flags(cmd, flags) == [*cmd[:6], *flags, *cmd[6:]]
    assert common.with_target_flags(common.with_target_flags(cmd, flags), flags) == common.with_target_flags(cmd, flags)
    keyed = common.keyed(r"(?P<step>\d+)/2 \[[^\]\n]*loss=(?P<value>[\d.]+)")
    out = "1/2 [00:00, loss=2.29]\r1/2 [00:01, loss=2.28]\r2/2 [00:01, loss=2.27]\r2/2 [00:02, loss=2.27]"
    assert keyed(None, out) == [2.28, 2.27]
    sys.path.insert(0, str(HERE))
    try:
        run = _import(HERE, "run")
    finally:
        sys.path.remove(str(HERE))
    P = common.Printed
    ok = {"ok": True}
    assert run._compare({**ok, "metric": [P("2.28")]}, {**ok, "metric": [P("2.28")]})["verdict"] == "same"
    assert run._compare({**ok, "metric": [P("2.28")]}, {**ok, "metric": [P("2.29")]})["verdict"] == "close"
    assert run._compare({**ok, "metric": [P("2.28")]}, {**ok, "metric": [P("2.30")]})["verdict"] == "different"
    assert run._compare({**ok, "metric": [P("2.28")]}, {"ok": False, "metric": []})["verdict"] == "failed"
