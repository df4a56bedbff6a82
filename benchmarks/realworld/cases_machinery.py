"""Acceptance-run cases for torch's own machinery under the adapter (issue 20): TorchScript,
``torch.compile`` (fullgraph, ``mode="reduce-overhead"``: inductor's CUDA graphs), ``torch.library``
custom ops with "cuda" tests, and ZeroRedundancyOptimizer, in public programs run unchanged.

Checkouts: karpathy/llm.c, pytorch-labs/gpt-fast, pytorch/extension-cpp, and timm
(huggingface/pytorch-image-models, shared with run.py's cases). See README.md for what each exercises.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import fixtures
from common import PY, RUN, TORCHRUN2, Case, expect, floats, texts

REPOS = {  # key -> a file that identifies the checkout
    "llm.c": "dev/data/data_common.py",
    "gpt-fast": "GPTQ.py",
    "extension-cpp": "extension_cpp/csrc/muladd.cpp",
}
TIKTOKEN = ("tiktoken_shim",)  # tiktoken's BPE files are downloads: a byte-level stand-in (tiktoken_shim/)
FRESH_INDUCTOR = {"TORCHINDUCTOR_CACHE_DIR": "{work}/inductor_cache"}  # compile every run, from nothing


# -- karpathy/llm.c train_gpt2.py --------------------------------------------------------------------------------
def _llmc(*extra: str, ranks: int = 1):
    def build(repo: Path, work: Path):
        shard = fixtures.llmc_shard(work.parent / "_llmc" / "tiny_train.bin")
        # d12 is the smallest from-scratch preset (random weights, GPT-2 124M shape); the others load HF weights
        args = ["--input_bin", str(shard), "--model", "d12", "--batch_size", "1", "--sequence_length", "64",
                "--total_batch_size", str(64 * ranks), "--num_iterations", "2", "--val_loss_every", "0",
                "--sample_every", "0", "--write_tensors", "0", "--output_dir", str(work / "out"), *extra]
        script = str(repo / "train_gpt2.py")
        if ranks == 1:
            return [*RUN, script, *args], work
        return [*TORCHRUN2, "-m", "torch_adapter", "run", script, *args], work
    return build


_LLMC_DONE = expect(r"step\s+2/2 \| train loss", "out/main.log")


# -- pytorch-labs/gpt-fast generate.py ------------------------------------------------------------------------------
def _gpt_fast(*extra: str):
    def build(repo: Path, work: Path):
        # the folder's name picks the config (stories15M: 6 layers, dim 288); "llama-3" in the path picks
        # tokenizer.py's tiktoken reader (a sentencepiece model cannot decode a random model's ids past its vocab)
        ckpt = fixtures.gpt_fast_checkpoint(work.parent / "_gpt_fast" / "llama-3-style-tokenizer", repo)
        return [*RUN, str(repo / "generate.py"), "--checkpoint_path", str(ckpt), "--num_samples", "1",
                "--max_new_tokens", "8", "--prompt", "Hello, my name is", *extra], work
    return build


# -- timm train.py --torchscript / --torchcompile --------------------------------------------------------------------
def _timm(*extra: str):
    def build(repo: Path, work: Path):
        data = fixtures.image_folder(work.parent / "_imagenet", size=40)
        return [*RUN, str(repo / "train.py"), "--data-dir", str(data), "--val-split", "val", "--model", "resnet18",
                "--num-classes", "2", "--img-size", "32", "-b", "4", "--epochs", "1", "--warmup-epochs", "0",
                "--sched", "step", "--workers", "1", "--log-interval", "1", "--output", str(work / "out"),
                "--experiment", "e", "--checkpoint-hist", "1", *extra], work
    return build


# -- pytorch/extension-cpp: its test suite, "cuda" tests included -------------------------------------------------
def _extension_cpp(repo: Path, work: Path):
    src = work / "src"  # built in a copy: the checkout stays untouched
    shutil.copytree(repo, src)
    res = subprocess.run([PY, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-compile", "-q",
                          "--target", str(work / "site"), str(src)], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:  # the build is the project's own (no adapter): CPU kernels only, no nvcc here
        raise RuntimeError("building extension_cpp failed: " + res.stderr.strip()[-400:])
    return [*RUN, str(src / "test" / "test_extension.py"), "-v"], work


def _extension_check(work: Path, out: str) -> str | None:
    if "skipped" in out:  # the "cuda" tests are skipped unless torch.cuda.is_available()
        return "some tests were skipped"
    return expect(r"(?s)test_compile_custom_only.*\nOK")(work, out)


CASES = [
    Case("llm.c train_gpt2.py d12 --dtype bfloat16 --flash 1 (eager)", "llm.c",
         _llmc("--dtype", "bfloat16", "--flash", "1"), _LLMC_DONE, paths=TIKTOKEN),
    Case("llm.c train_gpt2.py d12 --compile 1", "llm.c", _llmc("--compile", "1"), _LLMC_DONE, timeout=1200,
         paths=TIKTOKEN, env=FRESH_INDUCTOR),
    Case("llm.c train_gpt2.py d12 torchrun 2 ranks --zero_stage 1 (ZeroRedundancyOptimizer)", "llm.c",
         _llmc("--zero_stage", "1", ranks=2), _LLMC_DONE, paths=TIKTOKEN),
    Case("gpt-fast generate.py stories15M eager", "gpt-fast", _gpt_fast(), expect(r"Average tokens/sec"),
         paths=TIKTOKEN),
    Case("gpt-fast generate.py stories15M --compile (fullgraph, reduce-overhead)", "gpt-fast",
         _gpt_fast("--compile"), expect(r"(?s)Compilation time.*Average tokens/sec"), timeout=1200,
         paths=TIKTOKEN, env=FRESH_INDUCTOR),
    Case("timm train.py resnet18 --torchscript (torch.jit.script)", "timm", _timm("--torchscript"),
         expect(r"Train: 0 .*100%", "out/e"), extra_path=True),
    Case("extension-cpp test/test_extension.py (custom ops, opcheck, compile reduce-overhead)", "extension-cpp",
         _extension_cpp, _extension_check, timeout=1200, paths=("{work}/site",)),
]


# What each case's runs on two targets are compared by (run.py's --compare-cpu): name substring -> spec.
COMPARE = {
    "llm.c train_gpt2.py d12 --dtype": dict(metric=floats(r"train loss ([\d.]+)"), note="train loss per step"),
    "llm.c train_gpt2.py d12 --compile": dict(metric=floats(r"train loss ([\d.]+)"), note="train loss per step"),
    "llm.c train_gpt2.py d12 torchrun": dict(metric=floats(r"train loss ([\d.]+)"),
                                             note="train loss per step (rank 0)"),
    "gpt-fast": dict(metric=texts(r"(?s)(Hello, my name is.*?)\n(?:Time for inference|Compilation time)"),
                     note="the generated text (greedy from random weights)"),
    "timm train.py resnet18 --torchscript": dict(metric=floats(r"Loss:\s+([\d.]+)"), note="Loss per batch",
                                                 artifacts=("out/e/last.pth.tar",)),
    "extension-cpp": dict(note="its own test suite (no loss): pass/fail only"),
}
