"""``fusion_patterns=["attention_blocks"]``: hand-written attention runs as the fused kernel.

A submodule whose ``forward`` source mentions ``softmax`` is traced with ``torch.fx``;
in its graph the pattern

    softmax(matmul(q, k.transpose(-2, -1)) [* s | / s], dim=-1)  ->  matmul(·, v)

(``matmul``/``bmm``/``@``/``einsum("...id,...jd->...ij")`` and ``einsum("...ij,...jd->...id")``,
``s`` a constant) becomes ``scaled_dot_product_attention(q, k, v, scale=s)`` — one kernel
instead of a materialised score matrix. The rewritten module's ``forward`` is the traced
graph's (same parameters, same submodules); modules fx cannot trace are left as written.
Each rewritten call adds a ``fusion::attention_blocks.<Class>`` row to every open ``trace()`` log,
with the file and line of the hand-written softmax.
"""

from __future__ import annotations

import inspect
import operator
import os
import re
import time
from typing import Any, Callable, Iterator

__all__ = ["rewrite_attention", "OP"]

OP = "fusion::attention_blocks"


def _is(node: Any, fns: tuple[Any, ...], methods: tuple[str, ...]) -> bool:
    if not hasattr(node, "op") or not hasattr(node, "users"):
        return False
    return (node.op == "call_function" and node.target in fns) or (node.op == "call_method" and node.target in methods)


def _fns() -> dict[str, tuple[Any, ...]]:
    import torch
    import torch.nn.functional as F

    return {"softmax": (torch.softmax, F.softmax, torch.Tensor.softmax),
            "matmul": (torch.matmul, operator.matmul, torch.bmm, torch.Tensor.matmul, torch.Tensor.bmm),
            "transpose": (torch.transpose, torch.Tensor.transpose), "einsum": (torch.einsum,)}


def _arg(node: Any, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _einsum(node: Any, scores: bool) -> tuple[Any, Any] | None:
    """``(a, b)`` of an einsum that computes q·kᵀ (``scores``) or p·v, else None."""
    if not node.args or not isinstance(node.args[0], str) or len(node.args) != 3:
        return None
    m = re.fullmatch(r"\s*(\.\.\.|\w*?)(\w)(\w)\s*,\s*(\.\.\.|\w*?)(\w)(\w)\s*->\s*(\.\.\.|\w*?)(\w)(\w)\s*",
                     node.args[0])
    if m is None or not (m.group(1) == m.group(4) == m.group(7)):
        return None
    i, d, j, e, oi, oj = m.group(2), m.group(3), m.group(5), m.group(6), m.group(8), m.group(9)
    ok = (d == e and i != j and (oi, oj) == (i, j)) if scores else (d == j and (oi, oj) == (i, e) and i != e)
    return (node.args[1], node.args[2]) if ok else None


def _transposed(node: Any, f: dict[str, tuple[Any, ...]]) -> Any:
    """``k`` when ``node`` is ``k.transpose(-2, -1)`` (either order), else None."""
    if not _is(node, f["transpose"], ("transpose",)) or len(node.args) != 3:
        return None
    return node.args[0] if set(node.args[1:]) == {-2, -1} else None


def _match(sm: Any, f: dict[str, tuple[Any, ...]]) -> tuple[Any, Any, Any, float | None, Any] | None:
    """For a softmax node: ``(q, k, v, scale, out)`` when it is the attention pattern."""
    import torch

    if _arg(sm, 1, "dim") != -1 or len(sm.users) != 1 or sm.kwargs.get("dtype") is not None:
        return None
    (out,) = sm.users
    scores, scale = sm.args[0], None
    if hasattr(scores, "op") and scores.op == "call_function" and scores.target in (operator.mul, torch.mul, operator.truediv, torch.div) \
            and len(scores.users) == 1:
        a, b = scores.args[0], scores.args[1]
        if isinstance(b, (int, float)) and not isinstance(b, bool):
            scores, scale = a, (1.0 / b if scores.target in (operator.truediv, torch.div) else float(b))
        elif isinstance(a, (int, float)) and scores.target in (operator.mul, torch.mul):
            scores, scale = b, float(a)
        else:
            return None
    if not hasattr(scores, "users") or len(scores.users) != 1:
        return None
    if _is(scores, f["einsum"], ()):
        qk = _einsum(scores, True)
        if qk is None:
            return None
        q, k = qk
    elif _is(scores, f["matmul"], ("matmul", "bmm")) and len(scores.args) == 2:
        q, k = scores.args[0], _transposed(scores.args[1], f)
        if k is None:
            return None
    else:
        return None
    if _is(out, f["einsum"], ()):
        pv = _einsum(out, False)
        if pv is None or pv[0] is not sm:
            return None
        v = pv[1]
    elif _is(out, f["matmul"], ("matmul", "bmm")) and len(out.args) == 2 and out.args[0] is sm:
        v = out.args[1]
    else:
        return None
    return q, k, v, scale, out


def _site(node: Any, module: Any) -> dict[str, Any]:
    trace = node.stack_trace or ""
    found = [f for f in re.findall(r'File "([^"]+)", line (\d+), in (\w+)', trace)
             if f"{os.sep}torch{os.sep}" not in f[0] and f"{os.sep}torch_adapter{os.sep}" not in f[0]]
    if found:
        file, line, fn = found[-1]
        return {"file": file, "line": int(line), "function": fn}
    code = type(module).forward
    return {"file": inspect.getsourcefile(code) or "?", "line": inspect.getsourcelines(code)[1], "function": "forward"}


def _rewrite(module: Any) -> tuple[Any, list[dict[str, Any]]] | None:
    import torch
    import torch.fx as fx

    tracer = fx.Tracer()
    tracer.record_stack_traces = True
    try:
        gm = fx.GraphModule(module, tracer.trace(module))
    except Exception:  # data-dependent control flow and the like: left as written
        return None
    graph = gm.graph
    f = _fns()
    sites = []
    for sm in [n for n in graph.nodes if _is(n, f["softmax"], ("softmax",))]:
        found = _match(sm, f)
        if found is None:
            continue
        q, k, v, scale, out = found
        with graph.inserting_before(out):
            kwargs = {"scale": scale} if scale is not None else {"scale": 1.0}
            fused = graph.call_function(torch.nn.functional.scaled_dot_product_attention, (q, k, v), kwargs)
        sites.append(_site(sm, module))
        out.replace_all_uses_with(fused)
        graph.erase_node(out)
    if not sites:
        return None
    graph.eliminate_dead_code()
    gm.recompile()
    return gm, sites


def rewrite_attention(model: Any, set_forward: Callable[..., None]) -> Iterator[dict[str, Any]]:
    """Rewrite the attention blocks inside ``model``; yields ``{"module", "site"}`` per block."""
    sources: dict[type, str] = {}
    for name, sub in model.named_modules():
        cls = type(sub)
        if cls not in sources:
            try:
                sources[cls] = inspect.getsource(cls.forward)
            except (OSError, TypeError):
                sources[cls] = ""
        if "softmax" not in sources[cls] or "forward" in sub.__dict__:
            continue
        done = _rewrite(sub)
        if done is None:
            continue
        gm, sites = done
        set_forward(sub, _logged(gm.forward, sites[0], f"{OP}.{cls.__name__}"), "fusion:attention_blocks",
                    site=sites[0])
        yield {"module": name or cls.__name__, "site": sites[0]}


def _logged(forward: Callable[..., Any], site: dict[str, Any], op: str) -> Callable[..., Any]:
    from ..routing.decide import Route
    from ..routing.trace import active_logs

    from ..core.callsite import site_text

    reason = (f"hand-written softmax(QK^T)V at {site_text(site)} runs as "
              f"scaled_dot_product_attention (fusion_patterns=['attention_blocks'])")

    def run(*args: Any, **kwargs: Any) -> Any:
        logs = active_logs()
        if not logs:
            return forward(*args, **kwargs)
        t0 = time.perf_counter_ns()
        try:
            return forward(*args, **kwargs)
        finally:
            dt = time.perf_counter_ns() - t0
            for log in logs:
                log.add(op, Route.NATIVE, self_time_ns=dt, reason=reason, via="fusion_patterns", site=dict(site))

    return run
