"""Loading model factories: built-in names, user ``module:factory`` references, and
checking what a factory returns.

A **factory** is a function without arguments returning ``(model, example_inputs)`` or
``(model, example_inputs, loss_fn)``:

- ``model``: a ``torch.nn.Module`` (it is put in training mode);
- ``example_inputs``: a tuple (``model(*inputs)``), a dict (``model(**inputs)``) or one
  tensor (``model(tensor)``);
- ``loss_fn(output) -> scalar tensor``; without one, the loss is the sum of the means of
  every floating-point tensor that requires grad in the output (tensors, tuples, lists,
  dicts and ``ModelOutput`` objects are searched).

Every mistake is a :class:`~torch_adapter.errors.UsageError` naming the reference, what was
expected, what was found, why and the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UsageError, format_error
from .models import FAMILIES, Family, builtin_names, family

__all__ = ["Workload", "load_factory", "resolve_models", "build"]


@dataclass
class Workload:
    """What a factory built, checked: ``loss_fn(model(inputs))`` is one training loss."""

    family: Family
    model: Any
    inputs: Any
    loss_fn: Callable[[Any], Any]

    def forward(self) -> Any:
        inputs = self.inputs
        if isinstance(inputs, dict):
            return self.model(**inputs)
        if isinstance(inputs, tuple):
            return self.model(*inputs)
        return self.model(inputs)


# -- user factories -------------------------------------------------------------------------
def _usage(spec: str, expected: str, got: str, why: str, fix: str) -> UsageError:
    return UsageError(format_error(f"model factory {spec!r}", expected, got, why=why, fix=fix))


def _import(spec: str, module_name: str) -> Any:
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise _usage(spec, "an existing Python file before ':'", f"{module_name!r} (no such file)",
                         "the factory's file must exist", "check the path (relative to the working directory)")
        name = f"_torch_adapter_coverage_{os.path.splitext(os.path.basename(path))[0]}"
        loader = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader)  # type: ignore[arg-type]
        sys.modules[name] = module
        try:
            loader.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as exc:
            del sys.modules[name]
            raise _import_failed(spec, module_name, exc) from exc
        return module
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise _import_failed(spec, module_name, exc) from exc
        raise _usage(spec, "an importable module before ':'", f"{module_name!r} (module not found)",
                     f"Python cannot import {exc.name!r} from sys.path",
                     "run from the folder that holds it, add that folder to PYTHONPATH, "
                     "or name the file: path/to/models.py:factory") from exc
    except Exception as exc:
        raise _import_failed(spec, module_name, exc) from exc


def _import_failed(spec: str, module_name: str, exc: BaseException) -> UsageError:
    return _usage(spec, f"a module {module_name!r} that imports cleanly", f"{type(exc).__name__}: {exc}",
                  "the module was found, but running it raised (the traceback above shows where)",
                  "fix the error in the module, or the dependency it imports")


def load_factory(spec: str) -> Family:
    """A user family from ``"module:factory"`` (or ``"path/to/file.py:factory"``; dotted
    attributes allowed). Imports the module and checks the attribute is callable; the
    factory itself runs later (:func:`build`)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise _usage(spec, "MODULE:FACTORY, e.g. my_models:build_model", repr(spec),
                     "a user family names a module and a function in it", "write it as module:function")
    module = _import(spec, module_name)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise _usage(spec, f"a function {attr!r} in module {module_name!r}", f"no attribute {part!r}",
                         f"{module_name} ({getattr(module, '__file__', '?')}) does not define it",
                         f"use one of its callables: {', '.join(public[:8])}" if public else
                         f"define def {attr}(): return model, example_inputs")
        obj = getattr(obj, part)
    if not callable(obj):
        raise _usage(spec, "a callable factory", f"{obj!r} ({type(obj).__name__})",
                     "coverage calls the factory to build the model and its example inputs",
                     f"make {attr} a function returning (model, example_inputs[, loss_fn])")
    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    return Family(name=f"{os.path.basename(module_name)}:{attr}" if module_name.endswith(".py") else spec,
                  description=doc[0] if doc else f"user factory {spec}", kind="User", factory=obj, source=spec)


def resolve_models(models: Any = None) -> list[Family]:
    """Families from ``models``: None (every built-in), a comma-separated string, or a list
    of built-in names, ``module:factory`` strings, Family objects or factories."""
    if models is None:
        return list(FAMILIES)
    items = [m.strip() for m in models.split(",") if m.strip()] if isinstance(models, str) else list(models)
    if not items:
        raise _usage(repr(models), "at least one model family", "none", "there is nothing to measure",
                     f"e.g. --models resnet,bert (built-in: {', '.join(builtin_names())})")
    out: list[Family] = []
    for item in items:
        if isinstance(item, Family):
            out.append(item)
        elif isinstance(item, str):
            out.append(load_factory(item) if ":" in item else family(item))
        elif callable(item):
            name = getattr(item, "__name__", type(item).__name__)
            out.append(Family(name, f"user factory {name}", "User", item, source=f"{item!r}"))
        else:
            raise _usage(repr(item), "a family name, 'module:factory', a Family or a factory function",
                         f"{item!r} ({type(item).__name__})", "coverage needs a way to build the model",
                         "pass e.g. models=['resnet', 'my_models:build']")
    names = [f.name for f in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _usage(",".join(names), "each family once", f"{dup[0]!r} twice", "rows are keyed by family name",
                     "remove the duplicate")
    return out


def _default_loss(output: Any) -> Any:
    parts: list[Any] = []

    def walk(obj: Any) -> None:
        if hasattr(obj, "is_floating_point") and hasattr(obj, "mean"):
            if obj.is_floating_point() and obj.requires_grad:
                parts.append(obj.float().mean())
        elif isinstance(obj, dict) or hasattr(obj, "to_tuple"):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(output)
    if not parts:
        raise UsageError(format_error(
            "coverage: the default loss of a user factory",
            "a model output containing a floating-point tensor that requires grad",
            f"{type(output).__name__} with none", why="the training step needs a loss to run backward",
            fix="return (model, example_inputs, loss_fn) with loss_fn(output) -> scalar tensor"))
    return sum(parts[1:], parts[0])


def build(fam: Family) -> Workload:
    """Call the family's factory and check what it returned (UsageError naming the factory)."""
    import torch

    where = f"the factory {fam.source if fam.source != 'built-in' else fam.name}"
    try:
        result = fam.factory()
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(format_error(f"coverage: {where}()", "a factory that builds the model",
                                      f"{type(exc).__name__}: {exc}", why="calling it raised (see the traceback above)",
                                      fix="call the factory on its own and fix the error")) from exc
    shape = "(model, example_inputs) or (model, example_inputs, loss_fn)"
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else f"{type(result).__name__}"
        raise UsageError(format_error(f"coverage: {where}()", f"a tuple {shape}", got,
                                      why="coverage runs one training step: it needs the model and its inputs",
                                      fix=f"end the factory with: return {shape}"))
    model, inputs = result[0], result[1]
    loss_fn = result[2] if len(result) == 3 else _default_loss
    if not isinstance(model, torch.nn.Module):
        raise UsageError(format_error(f"coverage: {where}()", f"a torch.nn.Module first in {shape}",
                                      f"{model!r:.80} ({type(model).__name__})",
                                      why="coverage trains the model's parameters for one step",
                                      fix="return the nn.Module itself first"))
    if not isinstance(inputs, (tuple, dict, torch.Tensor)):
        raise UsageError(format_error(f"coverage: {where}()", "example_inputs as a tuple, a dict or a tensor",
                                      f"{type(inputs).__name__}", why="model(*tuple), model(**dict) or model(tensor)",
                                      fix="wrap the inputs: return model, (x,)"))
    if not callable(loss_fn):
        raise UsageError(format_error(f"coverage: {where}()", "a callable loss_fn(output) -> scalar tensor third",
                                      f"{loss_fn!r} ({type(loss_fn).__name__})",
                                      why="the loss is what backward() starts from",
                                      fix="return model, inputs, lambda out: out.sum() (or leave loss_fn out)"))
    model.train()
    return Workload(fam, model, inputs, loss_fn)
