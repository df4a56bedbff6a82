"""Suggested rewrites: the replacement text for a matched call, as a unified diff.

A rule's ``rewrite`` names a builtin (``einsum``, ``rename_call``, ``sdpa``,
``fused_optimizer``) with its parameters, or ``sub = [PATTERN, REPLACEMENT]`` -- a regex
substitution on the matched source. A rewriter returns None when it cannot produce a
faithful equivalent (an unusual einsum form, an argument it does not understand); the
finding then has no rewrite rather than a wrong one. Nothing here writes files.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable, Mapping

__all__ = ["rewrite_text", "einsum_expression", "unified_diff", "BUILTINS"]

_SIMPLE = (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)


def _segment(source_lines: list[str], node: ast.AST) -> str:
    """The exact source text of ``node`` (ast columns are UTF-8 byte offsets)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        b = source_lines[first].encode()
        return b[node.col_offset:node.end_col_offset].decode()
    parts = [source_lines[first].encode()[node.col_offset:].decode()]
    parts.extend(source_lines[first + 1:last])
    parts.append(source_lines[last].encode()[:node.end_col_offset].decode())
    return "\n".join(parts)


def _operand(src: Callable[[ast.AST], str], node: ast.AST) -> str:
    text = src(node)
    return text if isinstance(node, _SIMPLE) else f"({text})"


# --- einsum ---------------------------------------------------------------------------
def _dims(letters: list[str], keep: str, ellipsis: bool, positive: bool = True) -> list[int]:
    n = len(letters)
    return [(i if positive and not ellipsis else i - n) for i, c in enumerate(letters) if c not in keep]


def _reduce_permute(expr: str, letters: str, out: str, ellipsis: bool) -> str | None:
    """``expr`` indexed by ``letters`` -> summed/permuted to ``out``."""
    if len(set(letters)) != len(letters) or not set(out) <= set(letters) or len(set(out)) != len(out):
        return None
    summed = _dims(list(letters), out, ellipsis)
    if summed:
        dim = summed[0] if len(summed) == 1 else tuple(summed)
        expr = f"{expr}.sum()" if not out and not ellipsis else f"{expr}.sum(dim={dim})"
    rest = [c for c in letters if c in out]
    if rest != list(out):
        perm = [rest.index(c) for c in out]
        if len(perm) == 2 and not ellipsis:
            expr = f"{expr}.t()"
        elif perm[:-2] == list(range(len(perm) - 2)) and perm[-2:] == [len(perm) - 1, len(perm) - 2]:
            expr = f"{expr}.transpose(-2, -1)"
        elif ellipsis:
            return None
        else:
            expr = f"{expr}.permute({', '.join(map(str, perm))})"
    return expr


def einsum_expression(equation: str, operands: list[str]) -> str | None:
    """An explicit PyTorch expression equal to ``torch.einsum(equation, *operands)``, or
    None for forms without a simple equivalent. ``...`` is allowed as a leading batch."""
    eq = equation.replace(" ", "")
    if "->" not in eq:
        return None
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != len(operands) or len(terms) > 2:
        return None
    ell = "..." in eq
    if ell:
        if not all(t.startswith("...") and t.count("...") == 1 for t in terms + [out]):
            return None
        terms, out = [t[3:] for t in terms], out[3:]
    if not all(re.fullmatch(r"[a-zA-Z]*", t) for t in terms + [out]):
        return None
    if len(terms) == 1:
        (a,), (x,) = terms, operands
        if len(a) == 2 and a[0] == a[1] and not ell:
            return {"": f"torch.trace({x})", a[0]: f"torch.diagonal({x})"}.get(out)
        return _reduce_permute(x, a, out, ell)
    (a, b), (x, y) = terms, operands
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    if a == b:  # elementwise product, then reduce
        return _reduce_permute(f"({x} * {y})", a, out, ell)
    if len(b) < len(a) and a.endswith(b) and out == a:  # broadcasting product
        return f"{x} * {y}"
    if not ell and len(a) == 1 and len(b) == 1 and a != b and out == a + b:
        return f"torch.outer({x}, {y})"
    return _matmul(a, b, out, x, y, ell)


def _matmul(a: str, b: str, out: str, x: str, y: str, ell: bool) -> str | None:
    """(batch..., i, k) x (batch..., k, j) patterns, transposed operands and outputs."""
    if len(a) < 2 or len(b) < 1:
        return None
    if len(b) == 1 and len(a) == 2 and not ell:  # matrix-vector
        i, k = a
        if b == k and out == i:
            return f"{x} @ {y}"
        if b == i and out == k:
            return f"{y} @ {x}"
        return None
    if len(a) != len(b) or len(out) != len(a) or a[:-2] != b[:-2] or out[:-2] != a[:-2]:
        return None
    a2, b2, o2 = a[-2:], b[-2:], out[-2:]
    shared = set(a2) & set(b2)
    if len(shared) != 1:
        return None
    (k,) = shared
    i = (set(a2) - {k}).pop()
    j = (set(b2) - {k}).pop()
    if set(o2) != {i, j}:
        return None
    tr = ".transpose(-2, -1)"
    left = x if a2 == i + k else f"{x}{tr}"
    right = y if b2 == k + j else f"{y}{tr}"
    if o2 == i + j:
        return f"{left} @ {right}"
    return f"({left} @ {right}){tr}"


def _einsum(node: ast.Call, src: Callable[[ast.AST], str], params: Mapping[str, Any], qual: str | None) -> str | None:
    args = node.args
    if node.keywords or not args or not isinstance(args[0], ast.Constant) or not isinstance(args[0].value, str):
        return None
    ops = args[1:]
    if len(ops) == 1 and isinstance(ops[0], (ast.List, ast.Tuple)):
        ops = ops[0].elts
    if any(isinstance(o, ast.Starred) for o in ops):
        return None
    return einsum_expression(args[0].value, [_operand(src, o) for o in ops])


# --- renames ----------------------------------------------------------------------------
def _rename_call(node: ast.AST, src: Callable[[ast.AST], str], params: Mapping[str, Any],
                 qual: str | None) -> str | None:
    to = params.get("to")
    if isinstance(to, Mapping):
        to = to.get((qual or "").rsplit(".", 1)[-1])
    if not to:
        return None
    call = node if isinstance(node, ast.Call) else None
    if call is not None and any(isinstance(a, ast.Starred) for a in call.args):
        return None
    drop = set(params.get("drop", ()))
    parts = list(params.get("prepend", ()))
    parts += [src(a) for a in (call.args if call else ())]
    given = set()
    for kw in (call.keywords if call else ()):
        if kw.arg is None:
            parts.append(f"**{src(kw.value)}")
        elif kw.arg not in drop:
            parts.append(f"{kw.arg}={src(kw.value)}")
            given.add(kw.arg)
    parts += [f"{k}={v}" for k, v in params.get("add", {}).items() if k not in given]
    return f"{to}({', '.join(parts)})"


def _fused_optimizer(node: ast.AST, src: Callable[[ast.AST], str], params: Mapping[str, Any],
                     qual: str | None) -> str | None:
    name = (qual or "").rsplit(".", 1)[-1]
    if not isinstance(node, ast.Call):
        return None
    kws = {k.arg: k.value for k in node.keywords}
    if name == "FusedAdam":
        adamw = not (isinstance(kws.get("adam_w_mode"), ast.Constant) and kws["adam_w_mode"].value is False)
        to = "torch.optim.AdamW" if adamw else "torch.optim.Adam"
    elif name == "FusedSGD":
        to = "torch.optim.SGD"
    else:
        return None
    return _rename_call(node, src, {"to": to, "add": {"fused": "True"},
                                    "drop": ["adam_w_mode", "set_grad_none", "capturable", "master_weights",
                                             "bias_correction", "wd_after_momentum", "materialize_master_grads"]},
                        qual)


def _sdpa(node: ast.AST, src: Callable[[ast.AST], str], params: Mapping[str, Any], qual: str | None) -> str | None:
    """flash_attn_func / xformers memory_efficient_attention -> SDPA (layouts transposed)."""
    name = (qual or "").rsplit(".", 1)[-1]
    if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
        return None
    if name == "flash_attn_func":
        order = ["q", "k", "v", "dropout_p", "softmax_scale", "causal"]
        rename = {"dropout_p": "dropout_p", "softmax_scale": "scale", "causal": "is_causal"}
    elif name == "memory_efficient_attention":
        order = ["query", "key", "value", "attn_bias", "p", "scale"]
        rename = {"p": "dropout_p", "scale": "scale", "attn_bias": "attn_mask"}
    else:
        return None
    got: dict[str, ast.AST] = dict(zip(order, node.args))
    for kw in node.keywords:
        if kw.arg not in order or kw.arg in got:
            return None  # window_size, alibi_slopes, return_attn_probs, ...: no faithful equivalent
        got[kw.arg] = kw.value
    if len(node.args) > len(order) or not all(n in got for n in order[:3]):
        return None
    t = ".transpose(1, 2)"
    parts = [f"{_operand(src, got[n])}{t}" for n in order[:3]]
    for n in order[3:]:
        if n not in got or (isinstance(got[n], ast.Constant) and got[n].value in (None, False)):
            continue
        text = src(got[n])
        if n == "attn_bias" and "LowerTriangularMask" in text:
            parts.append("is_causal=True")
        else:
            parts.append(f"{rename[n]}={text}")
    return f"torch.nn.functional.scaled_dot_product_attention({', '.join(parts)}){t}"


def _sub(node: ast.AST, src: Callable[[ast.AST], str], params: Mapping[str, Any], qual: str | None) -> str | None:
    pattern, replacement = params["sub"]
    text = src(node)
    new = re.sub(pattern, replacement, text)
    return new if new != text else None


BUILTINS: dict[str, Callable[..., str | None]] = {
    "einsum": _einsum, "rename_call": _rename_call, "sdpa": _sdpa, "fused_optimizer": _fused_optimizer,
}


def rewrite_text(spec: Mapping[str, Any], node: Any, source_lines: list[str], qual: str | None) -> tuple[int, int, list[str]] | None:
    """``(first line, last line, new lines)`` replacing ``node`` in ``source_lines``
    (1-based line numbers of ``source_lines``), or None when there is no rewrite."""
    if node is None or not hasattr(node, "end_col_offset"):
        return None

    def src(n: ast.AST) -> str:
        return _segment(source_lines, n)

    fn = _sub if "sub" in spec else BUILTINS.get(str(spec.get("builtin")))
    if fn is None:
        return None
    new = fn(node, src, spec, qual)
    if new is None:
        return None
    first, last = node.lineno, node.end_lineno
    head = source_lines[first - 1].encode()[:node.col_offset].decode()
    tail = source_lines[last - 1].encode()[node.end_col_offset:].decode()
    return first, last, (head + new + tail).split("\n")


def unified_diff(label: str, first: int, old: list[str], new: list[str]) -> str:
    """A one-hunk unified diff (``--- a/label`` / ``+++ b/label``) at line ``first``."""
    hunk = [f"--- a/{label}", f"+++ b/{label}", f"@@ -{first},{len(old)} +{first},{len(new)} @@"]
    hunk += [f"-{line}" for line in old] + [f"+{line}" for line in new]
    return "\n".join(hunk) + "\n"
