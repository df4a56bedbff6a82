"""Stable reason codes: one table for every route reason, dtype finding and policy refusal.

A reason is a sentence for a person; its **code** (``TA-F001``) is what a user greps, suppresses,
links and counts across runs — as dynamo's graph-break registry gives each break a code and a page.
Codes never change meaning and are never reused; a reason that changes wording keeps its code.
``docs/reasons.md`` is generated from this table (``python -m torch_adapter.core.codes > docs/reasons.md``;
tests/test_reason_codes.py keeps it current), one section per code: what it means, why, what to do,
an example. Check findings keep their rule ids (``API010``, ``LIB011``: docs/check.md) — those are the
codes of static findings.

Families: ``TA-N`` native, ``TA-C`` composite, ``TA-Y`` yours, ``TA-F`` CPU fallback, ``TA-P`` refused by
the policy, ``TA-D`` dtype findings, ``TA-X`` redirects (the migration log: each code's class says whether
the rewritten call behaves the **same**, was **changed** to stay compatible, or is a **dummy** that does
nothing on this target). :func:`route_code` gives a routed op's code from its route, the
mechanism that ran it (``via``) and its reason; it is pure string logic, so every view — the log's rows,
the JSON, the notebook, the terminal — computes the same code from the same row.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Code", "CODES", "route_code", "dtype_code", "redirect_code", "page", "markdown", "UNCLASSIFIED"]

DOCS = "docs/reasons.md"


@dataclass(frozen=True)
class Code:
    code: str
    route: str  # native | composite | yours | fallback | refused | dtype
    title: str
    means: str
    why: str
    todo: str
    example: str


UNCLASSIFIED = "TA-U000"

_TABLE = [
    Code("TA-N001", "native", "the target has its own kernel",
         "The target's dispatch key has a kernel for the op (its vendor op table lists it, or torch registers one).",
         "Nothing is copied or decomposed: this is the fast path.", "Nothing.",
         "aten::addmm on npu: the Ascend table lists it"),
    Code("TA-N002", "native", "your register_accelerated kernel",
         "You registered a kernel for the op on this target with torch_adapter.register_accelerated().",
         "Your kernel runs on the device in place of a fallback.", "Nothing; remove the registration to undo it.",
         "demo::bias_gelu with register_accelerated(..., device='mps')"),
    Code("TA-N003", "native", "a metadata op",
         "The op only reads or sets tensor metadata (sizes, strides, dtype), so no device kernel is involved.",
         "Every backend answers these without a kernel.", "Nothing.", "aten::sym_size"),
    Code("TA-N004", "native", "a view op",
         "The op aliases its input's storage (a view); it runs no kernel on the target.",
         "Views are metadata over the same memory on every backend.", "Nothing.", "aten::view, aten::transpose.int"),
    Code("TA-N005", "native", "a device-essential op",
         "Allocation, copy or reading a scalar: every backend implements it although its table may not list it.",
         "A backend without these could hold no tensor at all.", "Nothing.", "aten::empty.memory_format, aten::_local_scalar_dense"),
    Code("TA-N006", "native", "module forward replaced (optimize.register)",
         "A module's forward was replaced by an expression you registered with torch_adapter.optimize.register().",
         "Its pieces are routed one by one under it.", "Nothing; the handle's remove() undoes it.",
         "nn.LayerNorm replaced by a var_mean expression"),
    Code("TA-N007", "native", "a hand-written pattern fused",
         "A hand-written pattern (softmax(QK^T)V) was recognised and run as the target's fused kernel.",
         "The fused kernel is faster and uses less memory than its pieces.", "Nothing.",
         "q @ k.transpose(-2, -1) -> softmax -> @ v as scaled_dot_product_attention"),
    Code("TA-C001", "composite", "runs its CompositeExplicitAutograd kernel",
         "No kernel on the target; torch has a kernel for the op written with other aten ops, which the target has.",
         "The pieces run natively: a few more, smaller kernels.", "Nothing, unless the op is hot: then a native kernel helps.",
         "aten::addcmul on a target without it"),
    Code("TA-C002", "composite", "CompositeImplicitAutograd: decomposes above autograd",
         "The op is defined in other aten ops above autograd (torch never dispatches it to a device kernel).",
         "Its pieces are what reaches the device; each has its own route.", "Nothing.", "aten::linear, aten::einsum"),
    Code("TA-C003", "composite", "decomposed via torch._decomp",
         "No kernel on the target; torch._decomp has a decomposition into ops the target has, and the adapter runs it.",
         "The decomposition keeps the op on the device instead of copying to the CPU.",
         "Nothing; if the op is hot, a native kernel (register_accelerated) is faster.",
         "aten::_pdist_forward is not decomposable; aten::huber_loss is"),
    Code("TA-C004", "composite", "runs torch's generated out= kernel",
         "The op's functional variant has a generated kernel that calls its out= variant, which the target has.",
         "A structured op's functional form runs through its out= kernel on the device.", "Nothing.",
         "aten::argmax on a table that lists argmax.out"),
    Code("TA-C005", "composite", "float16 computed in another dtype",
         "A float16 op on a CPU target is computed in bfloat16 (where the CPU has bf16 units) or float32, with "
         "casts in and out: float16 in, float16 out.",
         "The CPU's float16 kernels are slow or emulated; the dtype policy picks the fastest exact-enough compute.",
         "Nothing; dtype_policy/float16_compute in configure() choose otherwise (docs/redirect.md).",
         "aten::mm(float16) computed in bfloat16"),
    Code("TA-Y001", "yours", "your register_fallback implementation",
         "The target has no kernel; your register_fallback() implementation runs the op on the device.",
         "Nothing is copied to the CPU.", "Nothing; the handle's remove() undoes it.",
         "aten::_pdist_forward via a cdist expression"),
    Code("TA-F001", "fallback", "no kernel and no decomposition: runs on the CPU",
         "The target has no kernel for the op and torch has no decomposition of it, so its inputs are copied to the "
         "CPU, the op runs there, and the results are copied back.",
         "A kernel is missing on the target; the copies cost time and, on a real device, a host sync.",
         "Rewrite the call into ops the target has (`torch-adapter check` suggests some), register a device "
         "implementation (register_fallback), or accept it; `configure(deny=[...])` makes it an error.",
         "aten::_linalg_eigh on mps"),
    Code("TA-F002", "fallback", "forced to the CPU",
         "configure(force_cpu=...) or the target's profile sends the op to the CPU although a route exists.",
         "You or the profile asked for it (a known-bad kernel, a precision need).", "Remove it from force_cpu.",
         "configure(force_cpu=['aten::nonzero'])"),
    Code("TA-F003", "fallback", "its composite kernel refuses this device",
         "torch's composite kernel for the op checks the device type and refuses this one, so it runs on the CPU.",
         "The composite is written for specific devices only.", "As TA-F001.", "a composite kernel that asserts is_cuda"),
    Code("TA-F004", "fallback", "its decomposition calls the op itself",
         "torch._decomp's decomposition re-enters the op it decomposes (found once, on sample inputs), so it "
         "cannot keep the op on the device.",
         "Following it would recurse forever.", "As TA-F001.", "a decomposition that calls itself for some dtypes"),
    Code("TA-F005", "fallback", "its decomposition is training-unsafe",
         "The op has a torch._decomp decomposition on the adapter's training-unsafe deny-list (its gradients or "
         "numerics differ from the kernel's), so the CPU kernel runs instead.",
         "Training must get the kernel's numerics.", "As TA-F001.", "a decomposition whose backward differs"),
    Code("TA-F006", "fallback", "this call's decomposition declined",
         "The op is composite on the target, but for these arguments its decomposition raised, returned "
         "NotImplemented or would call itself, so this call runs on the CPU (others stay composite).",
         "Decompositions cover some argument combinations only.", "As TA-F001, for the arguments the site passes.",
         "a decomposition without support for a keyword this call uses"),
    Code("TA-F007", "fallback", "the device's own fallback ran it",
         "The real device's own CPU fallback (torch_npu's, the emulated npu's) ran the op: the device has no kernel.",
         "The vendor's fallback copies to the CPU and back, as the adapter's does.", "As TA-F001.",
         "an op missing from the vendor table on the emulated npu"),
    Code("TA-P001", "refused", "refused: the fallback policy is \"error\"",
         "The op would fall back to the CPU, and configure(fallback='error') refuses every fallback: the call "
         "raises FallbackError.",
         "You asked that nothing silently runs on the CPU.", "See the fallback's own code; or `%adapter policy warn`.",
         "torch.pdist under policy 'error'"),
    Code("TA-P002", "refused", "refused: the op is in configure(deny=...)",
         "The op would fall back, and configure(deny=[...]) names it (or its code): the call raises FallbackError.",
         "You asked that this op never runs on the CPU.", "Remove it from deny, or make it run on the target.",
         "configure(deny=['aten::nonzero'])"),
    Code("TA-D001", "dtype", "the target's real backend refuses this dtype",
         "On the real target this op would fail for its dtype (MPS has no float64; an Arc GPU without fp64 "
         "refuses double). A simulated target records it (`%adapter dtypes record`) or raises (`raise`).",
         "The simulated target computes here, where the dtype works, so only this finding tells you.",
         "Use float32 where the program allows it (`.float()`, `torch.set_default_dtype(torch.float32)`), or keep "
         "that part on the CPU explicitly.",
         "aten::mm(float64) on mps"),
    # -- redirects: the migration log's classes (same / changed / dummy), one code per kind of rewrite
    Code("TA-X001", "changed", "a CUDA device request mapped to the target",
         "`.cuda()`, `to('cuda')`, `device='cuda'`, `torch.device(0)`, a CUDA map_location or tensor type named "
         "CUDA; the adapter gave the target's device instead.",
         "The program was written for an NVIDIA GPU; the target is another device.", "Nothing: this is the redirect.",
         "Tensor.cuda() -> cpu"),
    Code("TA-X002", "same", "autocast / GradScaler on the target's device type",
         "autocast('cuda', dtype) and GradScaler('cuda') became the target's, in the dtype the code asked for.",
         "Mixed precision is the target's own; its behaviour is what the code was written for.", "Nothing.",
         "autocast('cuda', float16) -> autocast('cpu', float16)"),
    Code("TA-X003", "changed", "a dtype request changed for this target",
         "autocast's or a factory's float16 became another dtype where this target computes float16 slowly "
         "(docs/redirect.md, the dtype policy).",
         "Emulated float16 on a CPU without fp16/bf16 units is slower than float32 and changes nothing numerically "
         "the program needs.", "dtype_policy='float16' keeps float16.", "autocast('cuda', float16) -> float32 on AVX2"),
    Code("TA-X004", "changed", "a CUDA-only library probe answered False",
         "A library asked whether a CUDA-only package (flash-attn, xformers, bitsandbytes...) is usable; the adapter "
         "answered False so the library takes its portable path (torch SDPA).",
         "The package's kernels cannot run on the target.", "Nothing.", "diffusers.is_xformers_available() -> False"),
    Code("TA-X005", "changed", "torch.cuda / torch.accelerator answered for the target",
         "A query of the CUDA runtime (is_available, device_count, current_accelerator...) was answered for the "
         "target, as CUDA-written code expects (the answer is mapped back to CUDA's terms).",
         "The program branches on these answers to take its GPU path.", "Nothing.",
         "torch.accelerator.current_accelerator() -> device('cuda')"),
    Code("TA-X006", "changed", "a CUDA-only compile option turned off",
         "torch.compile's CUDA graphs (mode='reduce-overhead'), or inductor's Triton cudagraphs option, were turned "
         "off on a target without CUDA graphs.",
         "The option has no meaning on the target; the compiled code runs without it.", "Nothing.",
         "torch.compile(mode='reduce-overhead') -> mode='default'"),
    Code("TA-X007", "changed", "CUDA graphs emulated",
         "A CUDA graph capture records the ops and a replay re-runs them on the same static tensors.",
         "Results match; the launch-overhead saving of a real graph is lost.", "Nothing; torch.compile where supported.",
         "torch.cuda.graph(g) capture and g.replay()"),
    Code("TA-X008", "dummy", "pinned memory: nothing to pin on this target",
         "pin_memory=True, Tensor.pin_memory() or pin_memory_device do nothing where host memory is the device's.",
         "Pinning speeds up host-to-GPU copies; a CPU target has none.", "Nothing.",
         "DataLoader(pin_memory=True) -> pin_memory=False"),
    Code("TA-X009", "changed", "the profiler's CUDA activity on the target",
         "ProfilerActivity.CUDA or profile(use_cuda=True) became the target's activity (or the CPU's).",
         "There is no CUDA activity to record on the target.", "Nothing.", "ProfilerActivity.CUDA -> CPU"),
    Code("TA-X010", "changed", "an SDPA backend choice widened",
         "sdpa_kernel([...]) naming CUDA-only backends (flash, memory-efficient) gets the math backend added so the "
         "target has one it can run.",
         "The CUDA-only kernels do not exist on the target.", "Nothing.", "sdpa_kernel([FLASH_ATTENTION]) + MATH"),
    Code("TA-X011", "changed", "a CUDA environment variable translated",
         "CUDA_VISIBLE_DEVICES and similar were given the target's own variable (or ignored where it has none).",
         "The target reads its own variables.", "Nothing.", "CUDA_VISIBLE_DEVICES=0,1 -> ASCEND_RT_VISIBLE_DEVICES=0,1"),
    Code("TA-X012", "changed", "a distributed call rewritten for the target's backend",
         "init_process_group('nccl') got the target's collective backend (gloo, hccl), and NCCL-only arguments "
         "(barrier(device_ids=...), DDP device_ids) were dropped or mapped.",
         "NCCL runs only on NVIDIA GPUs.", "Nothing; nccl semantics are kept (docs/launchers.md).",
         "init_process_group(backend='nccl') -> 'gloo'"),
    Code("TA-X013", "dummy", "a CUDA setting with no equivalent on this target",
         "An environment variable or option that only CUDA reads; it is ignored here.", "The target has nothing "
         "to set.", "Nothing.", "CUDA_LAUNCH_BLOCKING=1 on the CPU"),
    Code("TA-X014", "dummy", "a torch.cuda call that does nothing on this target",
         "torch.cuda.synchronize(), empty_cache(), a caching-allocator switch or a similar runtime call was "
         "accepted and does nothing here (the CPU runs ops synchronously and has no CUDA caching allocator).",
         "The call manages a CUDA runtime the target does not have; nothing the program computes depends on it.",
         "Nothing; remove the call if the port no longer targets CUDA.", "torch.cuda.synchronize() on the CPU"),
    Code("TA-X015", "changed", "an op torch refuses on the CPU, run by torch's exact reference implementation",
         "flex_attention with inputs that require grad: torch refuses its backward on the CPU (where the target's "
         "tensors live); torch's own dense forward and backward (sdpa_dense, sdpa_dense_backward) ran instead.",
         "The program was written for a GPU, where FlexAttention has a backward kernel.",
         "Nothing for correctness; for long sequences mind the memory of a full L×S score matrix per head. Under "
         "torch.compile call the attention outside the compiled region (@torch.compiler.disable).",
         "flex_attention(q, k, v) with q.requires_grad on the CPU"),
    Code(UNCLASSIFIED, "", "unclassified",
         "A reason the table does not name yet: a defect of torch_adapter (tests/test_reason_codes.py walks every "
         "reason so none should reach you).",
         "Every reason should carry its own code.", "Report it with the op and the reason text.", "—"),
]

CODES: dict[str, Code] = {c.code: c for c in _TABLE}


def route_code(route: str, via: str | None, reason: str = "") -> str:
    """The code of a routed op from its route, mechanism and reason (a log row, a RouteDecision)."""
    route = getattr(route, "value", route)
    via = via or ""
    if route == "refused":
        return "TA-P002" if "configure(deny" in reason else "TA-P001"
    if via == "low_precision":
        return "TA-C005"
    if via == "device-selected":  # the target's own member of a kernel family: the member's reason leads
        first = reason.split(". Device-selected kernel:")[0]
        via = ("torch._decomp" if "via torch._decomp" in first else
               "CompositeImplicitAutograd" if "CompositeImplicitAutograd" in first else
               "CompositeExplicitAutogradNonFunctional" if "NonFunctional" in first else
               "CompositeExplicitAutograd" if "runs its Composite" in first else "cpu")
    if route == "native":
        return {"register_accelerated": "TA-N002", "metadata": "TA-N003", "view": "TA-N004",
                "device-essential": "TA-N005", "optimize.register": "TA-N006",
                "fusion_patterns": "TA-N007"}.get(via, "TA-N001")
    if route == "composite":
        if via == "torch._decomp":
            return "TA-C003"
        if via == "CompositeImplicitAutograd":
            return "TA-C002"
        if via == "CompositeExplicitAutogradNonFunctional":
            return "TA-C004"
        if via.startswith("Composite"):
            return "TA-C001"
        return UNCLASSIFIED
    if route == "yours":
        return "TA-Y001"
    if route == "fallback":
        if via == "device":
            return "TA-F007"
        if "so this call runs on the CPU" in reason:
            return "TA-F006"
        if reason.startswith("forced to the CPU"):
            return "TA-F002"
        if "calls the op itself" in reason:
            return "TA-F004"
        if "training-unsafe" in reason:
            return "TA-F005"
        if "and no decomposition" in reason:
            return "TA-F001"
        if via == "cpu":  # the one other fallback decide() makes: a composite that refuses the device
            return "TA-F003"
        return "TA-F001"
    return UNCLASSIFIED


def redirect_code(kind: str, asked: str, became: str) -> str:
    """The code of a redirect log row (its class is the code's ``route``: same / changed / dummy)."""
    if kind == "low_precision":
        return "TA-C005"
    if kind == "dataloader" or (kind == "device" and "pin_memory" in asked):
        return "TA-X008"
    if kind == "amp":
        return "TA-X002"
    if kind == "dtype":
        return "TA-X003"
    if kind == "namespace" and ("no-op" in became or became.startswith(("accepted", "nothing"))):
        return "TA-X014"
    if kind == "env":
        return "TA-X013" if became.startswith(("ignored", "no equivalent")) else "TA-X011"
    return {"device": "TA-X001", "jit": "TA-X001", "probe": "TA-X004", "namespace": "TA-X005",
            "compile": "TA-X006", "graph": "TA-X007", "profiler": "TA-X009", "sdpa": "TA-X010",
            "distributed": "TA-X012", "host_limit": "TA-X015"}.get(kind, UNCLASSIFIED)


def redirect_class(code: str) -> str:
    """``same`` | ``changed`` | ``dummy`` — what a redirect with ``code`` does to the call."""
    route = CODES[code].route if code in CODES else ""
    return route if route in ("same", "changed", "dummy") else "changed"


def dtype_code(finding: object = None) -> str:
    """The code of a dtype finding (one kind today)."""
    return "TA-D001"


def page(code: str) -> str:
    """Where a code is explained: ``docs/reasons.md#ta-f001``."""
    return f"{DOCS}#{code.lower()}"


def markdown() -> str:
    """docs/reasons.md: every code, grouped by route, from this table."""
    lines = ["# Reason codes", "",
             "Every route reason, dtype finding and policy refusal carries a stable code: in `%%adapter_trace`, the "
             "inspector, the per-cell report, `torch-adapter run --report` and every JSON row (`\"code\"`). A code "
             "never changes meaning. Policies take codes: `configure(deny=[\"TA-F001\"])` refuses every CPU "
             "fallback of that kind, `torch-adapter run --deny TA-F001` fails the run on one. Check findings keep "
             "their rule ids (docs/check.md). Redirects (`TA-X…`) are the migration log's rows: the class says whether "
             "the rewritten call behaves the **same**, was **changed** to stay compatible, or is a **dummy** that does "
             "nothing on this target (docs/redirect.md).", "",
             "Generated from `adapter/torch_adapter/core/codes.py` (`python -m torch_adapter.core.codes`).", "",
             "| code | route or class | reason |", "|---|---|---|"]
    lines += [f"| [{c.code}](#{c.code.lower()}) | {c.route or '—'} | {c.title} |" for c in _TABLE]
    for c in _TABLE:
        lines += ["", f"## {c.code}", "", f"**{c.title}** ({c.route or 'none'})", "",
                  f"- What it means: {c.means}", f"- Why: {c.why}", f"- What to do: {c.todo}", f"- Example: {c.example}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m torch_adapter.core.codes > docs/reasons.md
    print(markdown(), end="")
