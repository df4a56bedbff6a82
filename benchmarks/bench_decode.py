"""Op-bound work: a tiny GPT-2 decoding tokens at batch 1 — what redirecting, observing and
simulating cost per op when ops take a few microseconds.

The model is transformers' ``GPT2LMHeadModel`` from a ``GPT2Config`` with random weights (no
download): 2 layers, 64 wide, 2 heads, vocabulary 512; one step greedily decodes 32 tokens after
an 8-token prompt with the KV cache, under ``torch.no_grad()``, written the CUDA way
(``.cuda()``, ``device="cuda"``). Configurations, interleaved (harness.py):

- ``plain``       torch on the CPU
- ``redirect``    ``adapted(target="cpu")`` (goal >= 99.5 %)
- ``observe``     redirect + ``trace()`` around each block on the real target (goal >= 95 %)
- ``simulated``   ``adapted(target="mps", simulate=True)`` (goal >= 90 %)
- ``redirect_nogate`` redirect with ``float16_compute="float16"`` (no float16 gate on the CPU's heavy
  ops): ``redirect`` against it is what the gate's pass-through of float32 calls costs
- ``rf_floor``    redirect + a RecordFunction callback that does nothing: the floor under ``observe``
  (RecordFunction's own cost per dispatcher call, which any exact counter built on it pays)

Besides throughput kept, each configuration's cost per op in nanoseconds:
(its median step - plain's median step) / aten ops per step (counted once, by a TorchDispatchMode).
And, in one process and interleaved, observation split into its layers on the step itself
(``in_process_split``: RecordFunction's floor, the observer's counting, trace()'s log), which
step times between fresh interpreters cannot resolve.

    python benchmarks/bench_decode.py --quick
    python benchmarks/bench_decode.py --repeats 9 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness, workloads  # noqa: E402

__all__ = ["decode", "main", "GOALS"]

GOALS = {"redirect": 0.995, "observe": 0.95, "simulated": 0.90}
TOKENS, PROMPT = 32, 8


def _build_decode(device: str = "cuda") -> Callable[[], None]:
    import warnings

    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()  # the tiny config's token ids lie outside its vocabulary
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=64)
    model = GPT2LMHeadModel(config).eval()
    model = model.cuda() if device == "cuda" else model.to(device)
    prompt = torch.randint(0, 512, (1, PROMPT), device=device)

    def step() -> None:
        with torch.no_grad():
            out = model(prompt, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(TOKENS - 1):
                out = model(token, past_key_values=past, use_cache=True)
                past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        int(token)  # the host reads the last token, as generate() does each step

    return step


decode = workloads.Workload("gpt2_decode", _build_decode,
                            f"tiny GPT-2 (2 layers, 64 wide) greedy decoding {TOKENS} tokens at batch 1, KV cache")


def _observing() -> Callable[[], Any]:
    """The op observer alone around each block: counts and self times, no routing log."""
    @contextlib.contextmanager
    def context() -> Iterator[None]:
        from torch_adapter.routing import observe

        obs = observe.OpObserver()
        obs.start()
        try:
            yield
        finally:
            obs.stop()

    return context


def _tracing() -> Callable[[], Any]:
    @contextlib.contextmanager
    def context() -> Iterator[None]:
        import torch_adapter

        with torch_adapter.trace():
            yield

    return context


def _record_function_floor() -> Callable[[], Any]:
    """A RecordFunction callback that does nothing, around each block (the observer extension's
    ``null_acquire``): the cost floor of any exact op counter built on RecordFunction, as ``trace()`` is."""
    @contextlib.contextmanager
    def context() -> Iterator[None]:
        from torch_adapter.routing import observe

        ext = observe._load()
        if ext is None:
            raise SystemExit("rf_floor needs the C++ observer (a C++ compiler and ninja)")
        ext.null_acquire()
        try:
            yield
        finally:
            ext.null_release()

    return context


def per_call_costs(rounds: int = 6, calls: int = 20000) -> dict[str, float] | None:
    """ns per dispatcher call over plain, of RecordFunction with a callback that does nothing
    (``rf_floor``) and of the op observer (``observer``), on a loop of tiny ``torch.add`` calls,
    interleaved in one process (medians over ``rounds``): the figure a noisy machine's step times
    cannot give. None without the C++ observer."""
    import statistics
    import time

    import torch

    from torch_adapter.routing import observe

    ext = observe._load()
    if ext is None:
        return None
    a, b = torch.randn(4), torch.randn(4)

    def loop() -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(calls):
                torch.add(a, b)
            best = min(best, time.perf_counter() - t0)
        return best / calls * 1e9

    loop()
    got: dict[str, list[float]] = {"plain": [], "rf_floor": [], "observer": []}
    for _ in range(rounds):
        got["plain"].append(loop())
        ext.null_acquire()
        try:
            got["rf_floor"].append(loop())
        finally:
            ext.null_release()
        obs = observe.OpObserver()
        obs.start()
        try:
            got["observer"].append(loop())
        finally:
            obs.stop()
    plain = statistics.median(got["plain"])
    return {"plain_ns": round(plain, 1), **{f"{k}_ns_per_call": round(statistics.median(v) - plain, 1)
                                            for k, v in got.items() if k != "plain"}}


def in_process_split(rounds: int = 60) -> dict[str, Any] | None:
    """Observation's cost split into its layers on the decode step itself, in one process, interleaved
    (step times between fresh interpreters cannot resolve these): the same adapted model stepped
    as is (``redirect``), under a RecordFunction callback that does nothing (``rf_floor``), under the
    op observer alone (``observer``: counts and self times, no log) and under ``trace()``
    (``trace``: the observer plus the routing log filled at the block's end). ``kept`` is each
    against ``redirect`` in the same round (the median over ``rounds`` of those ratios);
    ``ns_per_call`` divides the median of the rounds' step differences by the dispatcher calls of a
    step. None without the C++ observer."""
    import statistics
    import time

    import torch_adapter
    from torch_adapter.routing import observe

    if observe._load() is None:
        return None
    with torch_adapter.adapted(target="cpu"):
        step = _build_decode("cuda")
        step()
        layers = {"redirect": contextlib.nullcontext, "rf_floor": _record_function_floor(),
                  "observer": _observing(), "trace": _tracing()}
        times: dict[str, list[float]] = {name: [] for name in layers}
        for _ in range(rounds):
            for name, layer in layers.items():
                t0 = time.perf_counter()
                with layer():
                    step()
                times[name].append(time.perf_counter() - t0)
        obs = observe.OpObserver()
        obs.start()
        step()
        calls = sum(obs.stop().calls.values())
    base = times["redirect"]
    return {"rounds": rounds, "dispatcher_calls": calls,
            "median_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()},
            # paired: each round's redirected step against the same round's step under the layer, so a
            # slow stretch of the machine hits both sides of every ratio alike
            "kept": {k: round(statistics.median(b / t for b, t in zip(base, v)), 4) for k, v in times.items()},
            "ns_per_call": {k: round(statistics.median(t - b for b, t in zip(base, v)) / calls * 1e9, 1)
                            for k, v in times.items() if k != "redirect"}}


def ops_per_step() -> int:
    """aten calls in one plain step (below autograd, as a TorchDispatchMode sees them)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.n += 1
            return func(*args, **(kwargs or {}))

    step = _build_decode("cpu")
    step()
    with Count():
        step()
    return Count.n


def dispatcher_calls_per_step() -> int | None:
    """Dispatcher calls in one plain step at every depth (what RecordFunction fires for), by the observer."""
    from torch_adapter.routing.observe import OpObserver

    step = _build_decode("cpu")
    step()
    observer = OpObserver()
    observer.start()
    step()
    result = observer.stop()
    return sum(result.calls.values()) or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_arguments(parser, workloads=["gpt2_decode"], default_workload="gpt2_decode")
    args = parser.parse_args(argv)
    redirect = harness.adapted("cpu", name="redirect", goal=GOALS["redirect"])
    observe = harness.Configuration("observe", redirect.context, "cuda", "adapted(target='cpu') + trace() per block",
                                    GOALS["observe"], timed=_tracing())
    configs = [harness.plain(), redirect, observe,
               harness.adapted("mps", simulate=True, name="simulated", goal=GOALS["simulated"]),
               harness.Configuration("rf_floor", redirect.context, "cuda",
                                     "adapted(target='cpu') + a RecordFunction callback that does nothing (observe's floor)",
                                     None, timed=_record_function_floor()),
               harness.adapted("cpu", name="redirect_nogate", float16_compute="float16"),
               harness.plain(name="plain_again")]
    args.configs = args.configs or "plain,redirect,observe,simulated"
    out_dir = Path(__file__).parent / "results"
    args.json = args.json or str(out_dir / "decode")  # docs/figures/ only when asked (--json NAME)
    ops, calls = ops_per_step(), dispatcher_calls_per_step()
    costs = per_call_costs()
    split = in_process_split()
    results = harness.run_from_args(args, [decode], configs, default_name="decode",
                                    quick={"repeats": 5, "steps": 3, "warmup": 2, "min_block": 0.5})
    for result in results:
        plain = result.by_name("plain").median_s
        print(f"{ops} aten ops per step ({calls} dispatcher calls at every depth); cost over plain "
              "(median step difference / aten ops, / dispatcher calls):")
        for cfg in result.configs[1:]:
            per_call = f"{(cfg.median_s - plain) / calls * 1e9:6.0f} ns/call" if calls else ""
            print(f"  {cfg.name:<12} {(cfg.median_s - plain) / ops * 1e9:8.0f} ns/op {per_call}  kept {cfg.kept:.2%}"
                  f"   best {cfg.best_kept:.2%}   cpu {cfg.cpu_kept:.2%}")
        result.meta["ops_per_step"] = ops
        result.meta["dispatcher_calls_per_step"] = calls
        if costs is not None and calls:
            result.meta["per_call"] = costs
            print(f"per dispatcher call (tiny torch.add loop, interleaved): RecordFunction with an empty callback "
                  f"+{costs['rf_floor_ns_per_call']:.0f} ns, the observer +{costs['observer_ns_per_call']:.0f} ns; "
                  f"x {calls} calls per step = {costs['rf_floor_ns_per_call'] * calls / 1e6:.2f} ms and "
                  f"{costs['observer_ns_per_call'] * calls / 1e6:.2f} ms of a {plain * 1e3:.1f} ms plain step "
                  f"(observe can keep at most {plain / (plain + costs['observer_ns_per_call'] * calls / 1e9):.1%}; "
                  f"any RecordFunction counter at most {plain / (plain + costs['rf_floor_ns_per_call'] * calls / 1e9):.1%})")
        if split is not None:
            result.meta["in_process"] = split
            print(f"in one process, interleaved ({split['rounds']} rounds, {split['dispatcher_calls']} dispatcher calls "
                  "a step), kept against the redirected step: " + ", ".join(
                      f"{k} {split['kept'][k]:.1%} (+{split['ns_per_call'][k]:.0f} ns/call)"
                      for k in ("rf_floor", "observer", "trace")))
        result.meta["ns_per_op"] = {c.name: round((c.median_s - plain) / ops * 1e9, 1) for c in result.configs[1:]}
        target = Path(args.json)
        print(f"wrote {harness.write_json(result, harness.json_folder(target))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
