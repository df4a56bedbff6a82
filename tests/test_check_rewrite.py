"""Suggested rewrites are faithful: einsum equivalents and the SDPA form of flash-attn /
xFormers calls are checked numerically against the original semantics."""

from __future__ import annotations

import ast
import math

import pytest
import torch

from torch_adapter.check.rewrite import einsum_expression, rewrite_text

EQUATIONS = ["bn,bn->b", "ij,jk->ik", "bij,bjk->bik", "bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "i,i->",
             "i,j->ij", "ij->ji", "ii->", "ii->i", "ij->i", "ij->", "bij->bji", "bhd,d->bhd",
             "...ij,...jk->...ik", "...ij,...kj->...ik", "ij,j->i", "ij,i->j", "bij,bkj->bik",
             "bij,bjk->bki", "abc->cab", "nchw,nchw->nc", "...d,...d->...", "b i d, b j d -> b i j"]


def _operands(eq: str) -> list[torch.Tensor]:
    sizes = {c: 2 + i % 4 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
    out = []
    for term in eq.replace(" ", "").split("->")[0].split(","):
        shape = [3] if term.startswith("...") else []
        out.append(torch.randn(shape + [sizes[c] for c in term.replace("...", "")], dtype=torch.float64))
    return out


@pytest.mark.parametrize("eq", EQUATIONS)
def test_einsum_rewrites_are_equal(eq):
    torch.manual_seed(0)
    ops = _operands(eq)
    names = ["A", "B"][:len(ops)]
    expr = einsum_expression(eq, names)
    assert expr is not None and "einsum" not in expr
    got = eval(expr, {"torch": torch, **dict(zip(names, ops))})  # noqa: S307 - our own expression
    torch.testing.assert_close(got, torch.einsum(eq, *ops))


@pytest.mark.parametrize("eq, n", [("ijk,jil->kl", 2), ("ij,jk,kl->il", 3), ("bij,bjk", 2), ("i...,i...->...", 2),
                                   ("ab,cd->abcd", 2), ("iij->j", 1)])
def test_forms_without_a_simple_equivalent(eq, n):
    assert einsum_expression(eq, ["A", "B", "C"][:n]) is None


def _rewrite(code: str, spec: dict, qual: str | None = None) -> str | None:
    call = ast.parse(code).body[0].value
    out = rewrite_text(spec, call, code.split("\n"), qual)
    return None if out is None else "\n".join(out[2])


def test_issue_example():
    code = 'torch.einsum("bn,bn->b", [pred, target])'
    assert _rewrite(code, {"builtin": "einsum"}) == "(pred * target).sum(dim=1)"


def test_columns_are_utf8_offsets():
    code = 'y = f("é") + torch.einsum("i,i->", a, b) + g("ü")'
    tree = ast.parse(code)
    call = tree.body[0].value.left.right
    first, last, new = rewrite_text({"builtin": "einsum"}, call, [code], None)
    assert new == ['y = f("é") + (a * b).sum() + g("ü")']


def _attention(q, k, v, causal, scale=None):
    """flash-attn semantics: (batch, seq, heads, dim) in and out."""
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    s = qh @ kh.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ vh).transpose(1, 2)


@pytest.mark.parametrize("code, qual, causal, scale", [
    ("flash_attn_func(q, k, v, dropout_p=0.0, causal=True)", "flash_attn.flash_attn_func", True, None),
    ("flash_attn_func(q, k, v, 0.0, 0.5)", "flash_attn.flash_attn_func", False, 0.5),
    ("xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask())",
     "xformers.ops.memory_efficient_attention", True, None),
    ("xops.memory_efficient_attention(q, k, v, scale=0.25)", "xformers.ops.memory_efficient_attention", False, 0.25),
])
def test_sdpa_rewrite_matches_the_library_layout(code, qual, causal, scale):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 3, 8, dtype=torch.float64) for _ in range(3))
    expr = _rewrite(code, {"builtin": "sdpa"}, qual)
    assert expr.startswith("torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2)")
    got = eval(expr, {"torch": torch, "q": q, "k": k, "v": v})  # noqa: S307
    torch.testing.assert_close(got, _attention(q, k, v, causal, scale))


@pytest.mark.parametrize("code, qual", [
    ("flash_attn_func(q, k, v, window_size=(8, 8))", "flash_attn.flash_attn_func"),
    ("flash_attn_varlen_func(q, k, v, cu, cu, 8, 8)", "flash_attn.flash_attn_varlen_func"),
    ("flash_attn_func(*qkv)", "flash_attn.flash_attn_func"),
])
def test_sdpa_rewrite_declines_what_it_cannot_express(code, qual):
    assert _rewrite(code, {"builtin": "sdpa"}, qual) is None


def test_fused_optimizer_rewrites():
    spec = {"builtin": "fused_optimizer"}
    assert _rewrite("FusedAdam(ps, lr=1e-3, adam_w_mode=False)", spec, "apex.optimizers.FusedAdam") == \
        "torch.optim.Adam(ps, lr=1e-3, fused=True)"
    assert _rewrite("FusedAdam(ps, lr=1e-3, set_grad_none=True)", spec, "apex.optimizers.FusedAdam") == \
        "torch.optim.AdamW(ps, lr=1e-3, fused=True)"
    assert _rewrite("FusedLAMB(ps)", spec, "apex.optimizers.FusedLAMB") is None
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt = eval(_rewrite("FusedAdam(ps, lr=1e-3)", spec, "apex.optimizers.FusedAdam"),  # noqa: S307
               {"torch": torch, "ps": params})
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True


def test_rename_call_and_sub():
    spec = {"builtin": "rename_call", "to": "torch.amp.GradScaler", "prepend": ['"cuda"']}
    assert _rewrite("GradScaler(init_scale=2.0, **kw)", spec) == 'torch.amp.GradScaler("cuda", init_scale=2.0, **kw)'
    assert _rewrite("GradScaler(*a)", spec) is None
    assert _rewrite("x.cuda()", {"sub": [r"\.cuda\(\)", ".to(device)"]}) == "x.to(device)"
    assert _rewrite("x.cpu()", {"sub": [r"\.cuda\(\)", ".to(device)"]}) is None


def test_multiline_call_diff(tmp_path):
    from torch_adapter.check.engine import scan

    (tmp_path / "m.py").write_text("import torch\ny = torch.einsum(\n    'ij,jk->ik',\n    a, b)\nz = 1\n")
    (f,) = scan(tmp_path).findings
    assert f.rule_id == "EIN001" and (f.start_line, f.end_line) == (2, 4)
    assert f.rewrite == ("--- a/m.py\n+++ b/m.py\n@@ -2,3 +2,1 @@\n-y = torch.einsum(\n-    'ij,jk->ik',\n"
                         "-    a, b)\n+y = a @ b\n")
