"""Vendor op tables: which aten overloads Ascend's torch_npu and Intel's torch-xpu-ops implement.

The vendors publish the exact list of aten ops their backend registers a kernel for. This
module turns those files into the compact table shipped beside it, ``vendor_ops.json``
(source repository, commit, path and license of every file named inside it), and reads
that table for the ``npu`` and ``xpu`` simulated profiles. Build time, not run time: the
package ships the derived table; nothing outside the package is read when a profile loads.

Regenerate (and check) it from the vendor files in ``../shared/target-data``::

    python -m torch_adapter.routing.vendor_tables build ../shared/target-data   # rewrite
    python -m torch_adapter.routing.vendor_tables check ../shared/target-data   # exit 1 if stale

Specs are stored as ``all``, ``2.1-newest``, ``2.1-2.12`` or ``2.1,2.2``; an overload listed
twice (``repeat_interleave.self_int``: ``official`` and ``symint``) keeps both, joined by ``|``.

What counts, per target (the same rules as ../shared/FACTS.md's independent counts):

- **npu**: op-plugin's ``op_plugin_functions.yaml`` sections ``official``, ``autograd`` and
  ``symint`` — an overload whose ``op_api`` (aclnn) or ``acl_op`` (older ACL path) version
  spec covers the running torch — plus torch_npu's ``npu_native_functions.yaml``
  ``supported:`` core ops. Specs: ``all_version``, ``[v2.1, newest]`` (a range; ``newest``
  is the last of ``all_version``), ``v2.1, v2.2`` (a list). ``custom`` (``npu_*`` ops of
  torch_npu's own namespace) and ``quant`` are not aten overloads of this torch.
- **xpu**: ``xpu_functions.yaml`` ``supported:`` ∪ entries of torch-xpu-ops'
  ``native_functions.yaml`` with an ``XPU:`` dispatch key. The file has no per-version
  entries; it is the last commit before the folder moved into PyTorch.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["DATA_FILE", "SOURCES", "build", "load", "select", "Selection", "main"]

DATA_FILE = os.path.join(os.path.dirname(__file__), "vendor_ops.json")
SCHEMA, VERSION = "torch-adapter.vendor-ops", 1

# target -> vendor, dispatch key, files (folder/file -> repository, commit, path, license)
SOURCES: dict[str, dict[str, Any]] = {
    "npu": {"vendor": "Huawei Ascend (torch_npu + op-plugin, CANN)", "dispatch_key": "PrivateUse1", "files": {
        "ascend/op_plugin_functions.yaml": {
            "repo": "Ascend/op-plugin", "commit": "517f2e7d0f202f38b76310706cb977ca2388ad21", "date": "2026-08-21",
            "path": "op_plugin/config/op_plugin_functions.yaml", "license": "BSD-3-Clause (LICENSE.op-plugin)"},
        "ascend/npu_native_functions.yaml": {
            "repo": "Ascend/pytorch", "commit": "9e73e708ab9350d203475609f36f8a43f6a0c2ab", "date": "2026-08-21",
            "path": "torch_npu/csrc/aten/npu_native_functions.yaml", "license": "BSD-3-Clause (LICENSE.torch_npu)"}}},
    "xpu": {"vendor": "Intel (torch-xpu-ops)", "dispatch_key": "XPU", "files": {
        "intel-xpu/native_functions.yaml": {
            "repo": "intel/torch-xpu-ops", "commit": "8fbe66e74893454613e531f035415e32e08ea6d8", "date": "2026-06-17",
            "path": "yaml/native/native_functions.yaml", "license": "Apache-2.0 (LICENSE)"},
        "intel-xpu/xpu_functions.yaml": {
            "repo": "intel/torch-xpu-ops", "commit": "8fbe66e74893454613e531f035415e32e08ea6d8", "date": "2026-06-17",
            "path": "yaml/xpu_functions.yaml", "license": "Apache-2.0 (LICENSE)"}}},
}
_NPU_SECTIONS = ("official", "autograd", "symint")
_NAME = re.compile(r"^\s*([A-Za-z0-9_]+)(?:\.([A-Za-z0-9_]+))?\s*(?:\(|$)")


# -- build: vendor YAML -> compact table ------------------------------------------------------
def _op(func: str) -> str | None:
    m = _NAME.match(func)
    if m is None:
        return None
    return f"aten::{m.group(1)}.{m.group(2)}" if m.group(2) else f"aten::{m.group(1)}"


def _spec(value: Any) -> str:
    """A vendor version spec in the table's form: ``all``, ``2.1-newest``, ``2.1-2.12``, ``2.1,2.2``."""
    if value is True:
        return "all"
    if isinstance(value, str):
        text = value.strip()
        if text == "all_version":
            return "all"
        return ",".join(v.strip().lstrip("v") for v in text.split(",") if v.strip())
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return "-".join(v.strip().lstrip("v") for v in value)
    raise ValueError(f"unknown version spec {value!r}")


def _yaml(path: str) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=loader)


def build(source_dir: str) -> dict[str, Any]:
    """The compact table from the vendor files under ``source_dir`` (../shared/target-data)."""
    from . import ops_table

    plugin = _yaml(os.path.join(source_dir, "ascend", "op_plugin_functions.yaml"))
    core = _yaml(os.path.join(source_dir, "ascend", "npu_native_functions.yaml"))
    npu: dict[str, dict[str, str]] = {}
    for section in _NPU_SECTIONS:
        for item in plugin.get(section) or ():
            name = _op(str(item.get("func", "")))
            if name is None:
                continue
            entry = npu.setdefault(name, {})
            for key in ("op_api", "acl_op"):
                if key in item and item[key] not in (None, False):  # an overload listed twice: the union
                    spec = _spec(item[key])
                    parts = entry[key].split("|") if key in entry else []
                    entry[key] = "|".join(parts + [spec] if spec not in parts else parts)
    for item in core.get("supported") or ():
        func = item.get("func") if isinstance(item, dict) else item
        name = _op(str(func))
        if name is not None:
            npu.setdefault(name, {})["core"] = "all"
    versions = [str(v).lstrip("v") for v in plugin.get("all_version") or ()]

    xpu_yaml = os.path.join(source_dir, "intel-xpu", "native_functions.yaml")
    listed = _yaml(os.path.join(source_dir, "intel-xpu", "xpu_functions.yaml")).get("supported") or ()
    xpu: dict[str, str] = {}
    for func in listed:
        name = _op(str(func))
        if name is not None:
            xpu[name] = "xpu_functions.yaml"
    for item in _yaml(xpu_yaml):
        keys: set[str] = set()
        for spec in (item.get("dispatch") or {}):
            keys.update(part.strip() for part in str(spec).split(","))
        name = _op(str(item.get("func", "")))
        if name is not None and "XPU" in keys:
            xpu.setdefault(name, "native_functions.yaml XPU:")
    # structured_delegate: the functional/in-place variant runs its out= delegate's XPU kernel
    for name, entry in ops_table.load_table(xpu_yaml).items():
        if "XPU" in entry.keys and name not in xpu:
            xpu[name] = "native_functions.yaml structured_delegate"
    return {"schema": SCHEMA, "version": VERSION,
            "regenerate": "python -m torch_adapter.routing.vendor_tables build ../shared/target-data",
            "targets": {
                "npu": {**{k: v for k, v in SOURCES["npu"].items()}, "versions": versions,
                        "ops": dict(sorted(npu.items()))},
                "xpu": {**{k: v for k, v in SOURCES["xpu"].items()}, "versions": None,
                        "ops": dict(sorted(xpu.items()))}}}


def dumps(table: Mapping[str, Any]) -> str:
    return json.dumps(table, indent=0, sort_keys=False, separators=(",", ":")) + "\n"


# -- run time: the shipped table -> the entries for this torch --------------------------------
@functools.lru_cache(maxsize=None)
def load(path: str = DATA_FILE) -> dict[str, Any]:
    """The shipped table (cached). OSError / ValueError when it is missing or unreadable."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("targets"), dict):
        raise ValueError(f"not a {SCHEMA} table (schema {data.get('schema') if isinstance(data, dict) else None!r})")
    return data


def _vkey(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def _covers(spec: str, version: tuple[int, ...], newest: tuple[int, ...]) -> bool:
    if "|" in spec:
        return any(_covers(part, version, newest) for part in spec.split("|"))
    if spec == "all":
        return True
    if "-" in spec:
        lo, _, hi = spec.partition("-")
        top = max(newest, version) if hi == "newest" else _vkey(hi)  # open-ended: assumed to still apply
        return _vkey(lo) <= version <= top
    return any(_vkey(v) == version for v in spec.split(","))


@dataclass(frozen=True)
class Selection:
    """The entries of one target's table that apply to one torch version."""

    target: str
    native: dict[str, str]  # op -> reason suffix ("Ascend op-plugin, aclnn (op_api)")
    listed: int  # overloads the vendor lists for this version (FACTS.md's count)
    unknown: tuple[str, ...]  # listed names this torch does not have
    notes: tuple[str, ...]  # version notes
    sources: tuple[dict[str, Any], ...] = field(default=())
    vendor: str = ""


def select(target: str, torch_version: str, known: frozenset[str] | set[str], path: str = DATA_FILE) -> Selection:
    """The ``target`` entries that apply to ``torch_version``; names not in ``known`` are set aside."""
    data = load(path)
    entry = data["targets"].get(target)
    if not isinstance(entry, dict) or not isinstance(entry.get("ops"), dict):
        raise ValueError(f"the table has no {target!r} section")
    running = _vkey(torch_version)
    notes: list[str] = []
    native: dict[str, str] = {}
    versions = entry.get("versions")
    if versions:
        newest = max((_vkey(v) for v in versions), default=running)
        if running > newest:
            notes.append(f"torch {torch_version} is newer than the table knows (newest v{'.'.join(map(str, newest))}): "
                         "entries open to 'newest' are assumed to still apply; ops added since are not listed")
        elif running < min(_vkey(v) for v in versions):
            notes.append(f"torch {torch_version} is older than the table knows (oldest v{versions[0]})")
        for op, specs in entry["ops"].items():
            api = "op_api" in specs and _covers(specs["op_api"], running, newest)
            acl = "acl_op" in specs and _covers(specs["acl_op"], running, newest)
            if "core" in specs:
                native[op] = "torch_npu core kernel (npu_native_functions.yaml)"
            elif api:
                native[op] = "Ascend op-plugin, aclnn kernel (op_api)"
            elif acl:
                native[op] = ("Ascend op-plugin, only through the older acl_op (ACL operator) path for this torch: "
                              "still an NPU kernel, not a CPU fallback")
    else:
        files = entry.get("files") or {}
        date = next((f.get("date") for f in files.values() if isinstance(f, dict)), "?")
        notes.append(f"the table has no per-version entries: torch-xpu-ops as of {date} (the last commit with "
                     "its own yaml/), read as applying to this torch")
        for op, how in entry["ops"].items():
            native[op] = f"torch-xpu-ops, {how}"
    unknown = tuple(sorted(op for op in native if op not in known))
    listed = len(native) if versions else sum(1 for how in entry["ops"].values() if "structured_delegate" not in how)
    for op in unknown:
        del native[op]
    if unknown:
        notes.append(f"{len(unknown)} listed op name(s) this torch does not have (ignored): {', '.join(unknown[:5])}"
                     + (" ..." if len(unknown) > 5 else ""))
    sources = tuple({"file": k, **v} for k, v in (entry.get("files") or {}).items())
    return Selection(target, native, listed, unknown, tuple(notes), sources, str(entry.get("vendor", "")))


# -- command line -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m torch_adapter.routing.vendor_tables",
                                description="rebuild or check the shipped vendor op table from the vendor files")
    p.add_argument("action", choices=("build", "check"))
    p.add_argument("source_dir", help="the folder with ascend/ and intel-xpu/ (../shared/target-data)")
    p.add_argument("-o", "--output", default=DATA_FILE, help=f"the table file (default: {DATA_FILE})")
    args = p.parse_args(argv)
    try:
        text = dumps(build(args.source_dir))
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        print(f"vendor_tables: cannot read the vendor files under {args.source_dir!r}: {exc}", file=sys.stderr)
        return 2
    if args.action == "check":
        try:
            with open(args.output, encoding="utf-8") as fh:
                same = fh.read() == text
        except OSError:
            same = False
        print(f"{args.output}: {'up to date' if same else 'STALE: rebuild it with the build action'}")
        return 0 if same else 1
    with open(args.output, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
