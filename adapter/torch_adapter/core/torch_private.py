"""Every use of a private PyTorch API (``torch._C.*``, ``torch._decomp``, dispatcher
internals) lives here, behind small functions with version checks and clear errors,
so that a torch upgrade has one place to look.

Sections are grouped by the layer that needs them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cuda_device_count"]


# --- redirect -----------------------------------------------------------------------
def cuda_device_count() -> int:
    """Real CUDA devices, bypassing any patched ``torch.cuda.device_count``."""
    import torch

    if not torch.backends.cuda.is_built():
        return 0
    return int(torch._C._cuda_getDeviceCount())


__all__ += ["device_context_class", "device_constructors", "reset_device_constructors", "attribute_caches"]


def device_context_class() -> type:
    """``torch.utils._device.DeviceContext``: what ``with torch.device(d):`` and
    ``torch.set_default_device(d)`` push (a TorchFunctionMode that fills in ``device=``)."""
    from torch.utils import _device

    return _device.DeviceContext


def device_constructors() -> set[Any]:
    """The factories DeviceContext fills in ``device=`` for: torch's lru-cached
    ``torch.utils._device._device_constructors()``, built at its first call from the torch
    attributes of that moment (so it must be built while they are torch's own)."""
    from torch.utils import _device

    return _device._device_constructors()


def reset_device_constructors() -> None:
    """Forget the cached factory set; the next use rebuilds it from the current attributes."""
    from torch.utils import _device

    _device._device_constructors.cache_clear()


def attribute_caches() -> list[Any]:
    """torch's ``functools`` caches that are built, at their first call, from torch's public
    attributes of that moment (so a wrapper installed then would stay in them): the factory
    set above and ``torch.overrides``' tables of overridable functions. Each has
    ``cache_info()`` and ``cache_clear()``."""
    import torch.overrides as overrides
    from torch.utils import _device

    names = ("get_ignored_functions", "get_testing_overrides", "_get_overridable_functions", "_get_tensor_methods")
    caches = [_device._device_constructors, *(getattr(overrides, n, None) for n in names)]
    return [c for c in caches if hasattr(c, "cache_clear") and hasattr(c, "cache_info")]


__all__ += ["torch_function_mode_check"]


def torch_function_mode_check() -> Any:
    """``torch._C._is_torch_function_mode_enabled`` (the C function itself: the factory wrappers
    call it on every call, so no Python frame in between): is a TorchFunctionMode active?"""
    import torch

    return torch._C._is_torch_function_mode_enabled


# --- routing ------------------------------------------------------------------------
# The routing engine (torch_adapter.routing) reads the dispatcher, the decomposition table
# and registers Python kernels below autograd. torch >= 2.9 has everything used here
# (torch.library.get_kernel is the newest); check_routing_support() says so clearly.
__all__ += ["check_routing_support", "all_op_names", "has_kernel_for_key", "dispatch_key_for_device",
            "host_kernel", "decompositions", "resolve_op", "call_composite_explicit",
            "kernel_library", "register_python_kernel", "dispatch_mode_base", "DispatchKeySet",
            "backend_dispatch_keys"]


def check_routing_support() -> None:
    """Raise a clear error when this torch lacks what the routing engine needs."""
    import torch

    from ..errors import TargetError, format_error

    missing = [n for n in ("get_kernel", "Library") if not hasattr(torch.library, n)]
    missing += [n for n in ("_dispatch_has_kernel_for_dispatch_key", "_dispatch_get_all_op_names",
                            "_dispatch_key_for_device") if not hasattr(torch._C, n)]
    if missing:
        raise TargetError(format_error(
            "torch_adapter routing engine", "torch >= 2.9 (torch.library.get_kernel and the dispatcher API)",
            f"torch {torch.__version__} without {', '.join(missing)}",
            why="simulated targets and fallback policies execute ops through the dispatcher",
            fix="upgrade torch, or install without simulate=/fallback policies"))


def all_op_names() -> tuple[str, ...]:
    """Every operator the dispatcher knows, as ``"ns::name.overload"`` (``"aten::nonzero"``)."""
    import torch

    return tuple(torch._C._dispatch_get_all_op_names())


def has_kernel_for_key(name: str, key: str) -> bool:
    """Has ``name`` a kernel registered directly for dispatch key ``key``? False if unknown."""
    import torch

    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, key))
    except RuntimeError:  # "operator ... does not exist"
        return False


def dispatch_key_for_device(device_type: str) -> str:
    """``"cpu"`` -> ``"CPU"``; out-of-tree backends (``npu``) are ``PrivateUse1``."""
    import torch

    try:
        key = torch._C._dispatch_key_for_device(device_type)
    except RuntimeError:
        key = torch._C._dispatch_key_for_device("privateuseone")
    return str(key)


def host_kernel(name: str, key: str) -> Any:
    """The kernel the dispatcher would run for ``name`` at ``key`` now (callable with
    ``.call_boxed(keyset, *args, **kwargs)``), or None when there is none."""
    import torch

    if not torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, key):
        return None
    return torch.library.get_kernel(name, key)


_DECOMPOSITIONS: dict[str, Any] | None = None


def decompositions() -> dict[str, Any]:
    """``torch._decomp.decomposition_table`` keyed by op name (``"aten::nonzero"``)."""
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:
        import torch
        import torch._decomp

        _DECOMPOSITIONS = {op.name(): fn for op, fn in torch._decomp.decomposition_table.items()
                           if isinstance(op, torch._ops.OpOverload)}
    return _DECOMPOSITIONS


def resolve_op(name: str) -> Any:
    """``"aten::add.Tensor"`` -> ``torch.ops.aten.add.Tensor`` (AttributeError if unknown)."""
    import torch

    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


def call_composite_explicit(op: Any, key: str, args: tuple, kwargs: dict) -> Any:
    """Run ``op``'s own kernel for the composite alias ``key`` (CompositeExplicitAutograd or
    ...NonFunctional); its pieces dispatch again. The caller has checked the kernel exists
    (calling a missing alias kernel crashes the process)."""
    import torch

    return op._op_dk(getattr(torch._C.DispatchKey, key), *args, **kwargs)


def kernel_library(namespace: str) -> Any:
    """A ``torch.library.Library`` for overriding kernels of ``namespace``'s ops.
    ``lib._destroy()`` removes every kernel it registered and restores the previous ones."""
    import torch

    return torch.library.Library(namespace, "IMPL")


def register_python_kernel(lib: Any, name: str, fn: Any, key: str) -> None:
    """Register ``fn(keyset, *args, **kwargs)`` for ``name`` at ``key``, silencing torch's
    "overriding a previously registered kernel" warning (overriding is the point)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl(name.partition("::")[2], fn, key, with_keyset=True)


def op_classes() -> tuple[type, type]:
    """``(torch._ops.OpOverload, torch._ops.HigherOrderOperator)``: what a dispatch mode is handed (an
    aten op, or a higher-order operator such as flex_attention)."""
    from torch._ops import HigherOrderOperator, OpOverload

    return OpOverload, HigherOrderOperator


def dispatch_mode_base() -> type:
    """``torch.utils._python_dispatch.TorchDispatchMode`` (the base of op recorders)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def backend_dispatch_keys() -> tuple[str, ...]:
    """The dense backend dispatch keys (``CPU``, ``CUDA``, ..., ``PrivateUse1``, ``Meta``):
    the keys a capability profile may name (``torch._C.DispatchKey``'s members between
    ``StartOfDenseBackends`` and ``EndOfDenseBackends``)."""
    import torch

    names = list(torch._C.DispatchKey.__members__)
    try:
        return tuple(names[names.index("StartOfDenseBackends") + 1:names.index("EndOfDenseBackends")])
    except ValueError:  # an enum laid out differently: every key but the markers
        return tuple(n for n in names if not n.startswith(("StartOf", "EndOf")))


def DispatchKeySet(key: str) -> Any:  # noqa: N802 - mirrors the torch type
    """A ``torch._C.DispatchKeySet`` holding one key."""
    import torch

    return torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))


# --- AMP ----------------------------------------------------------------------------
# torch_adapter.redirect.amp registers autocast kernels for a few aten norm ops; they run
# the op below autocast exactly as torch's C++ autocast wrappers (and
# torch.library.register_autocast) do: with the autocast key excluded.
__all__ += ["autocast_key", "below_autocast"]


def autocast_key(device_type: str) -> str:
    """The dispatch key of ``device_type``'s autocast: ``"cpu"`` -> ``"AutocastCPU"``."""
    return "Autocast" + dispatch_key_for_device(device_type)


def below_autocast(key: str) -> Any:
    """A context manager that runs ops with autocast dispatch key ``key`` excluded."""
    import torch

    return torch._C._ExcludeDispatchKeyGuard(DispatchKeySet(key))


# --- observe ------------------------------------------------------------------------
# torch_adapter.routing.observe builds a small C++ RecordFunction observer with
# torch.utils.cpp_extension (public, but the build folder is a private helper), and falls
# back to the autograd profiler's C++ entry points and event tree (private, "experimental").
__all__ += ["extension_build_dir", "extension_name", "is_extension_built", "import_built_extension", "packaged_dir", "PACKAGED_ENV",
            "can_build_extensions", "load_extension", "op_profiler_start",
            "op_profiler_stop", "profiler_function_events"]


def extension_build_dir(name: str) -> Any:
    """Where ``torch.utils.cpp_extension.load(name=...)`` builds and caches ``name``
    (``$TORCH_EXTENSIONS_DIR`` or the user cache, per Python and accelerator), computed as
    ``cpp_extension._get_build_directory`` does without importing cpp_extension (0.16 s, at every
    start-up that loads a built extension; tests/test_half_gate.py compares the two). Not created."""
    import os
    import sys
    from pathlib import Path

    import torch
    from torch import _appdirs

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        if torch.version.hip is not None:
            accelerator = f"rocm{torch.version.hip.replace('.', '')}"
        elif torch.version.cuda is not None:
            accelerator = f"cu{torch.version.cuda.replace('.', '')}"
        else:
            accelerator = "cpu"
        python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(os.path.realpath(_appdirs.user_cache_dir(appname="torch_extensions")),
                            f"{python}_{accelerator}")
    return Path(root) / name


def can_build_extensions() -> bool:
    """A C++ compiler (``$CXX`` or ``c++``) and ninja are on this machine."""
    import os
    import shutil

    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    return shutil.which(compiler) is not None and cpp_extension.is_ninja_available()


def load_extension(name: str, source: Any, *, verbose: bool = False) -> Any:
    """Build (once, cached) and import a one-file C++ extension; raises on failure.

    A finished build (its ``.so`` there, no build holding the folder's lock) is imported directly:
    ``cpp_extension.load`` would re-check it with ninja first (~0.17 s per extension, at start-up).
    ``name`` carries a digest of the source and the torch version, so the file found is this source's.
    """
    from torch.utils import cpp_extension

    built = import_built_extension(name)
    if built is not None:
        return built
    return cpp_extension.load(name=name, sources=[str(source)], extra_cflags=["-O2"],
                              verbose=verbose, is_python_module=True)


def extension_name(prefix: str, source: Any) -> str:
    """``prefix`` + a digest of the C++ ``source`` file and the torch version: a changed source or
    another torch gets its own build."""
    import hashlib
    from pathlib import Path

    import torch

    digest = hashlib.sha256(Path(source).read_bytes() + torch.__version__.encode()).hexdigest()[:12]
    return f"{prefix}_{digest}"


def is_extension_built(name: str) -> bool:
    """Is extension ``name`` compiled — shipped with the package (``torch_adapter/_built``, filled at
    install) or in its build folder of torch's extension cache? Never compiles."""
    return _built_file(name) is not None


PACKAGED_ENV = "TORCH_ADAPTER_PACKAGED_BUILDS"  # "off": ignore torch_adapter/_built (tests, benchmarks)


def packaged_dir() -> Any:
    """``torch_adapter/_built`` (the C++ parts the install compiled: hatch_build.py), or None when
    ``TORCH_ADAPTER_PACKAGED_BUILDS=off``."""
    import os
    from pathlib import Path

    if os.environ.get(PACKAGED_ENV, "").lower() in ("off", "0", "no", "false"):
        return None
    return Path(__file__).resolve().parent.parent / "_built"


def _built_file(name: str) -> Any:
    """The finished module file of extension ``name``: the package's own build first, then the cache's
    (None while a build of it holds the cache folder's lock, or when there is none)."""
    import importlib.machinery

    file_name = f"{name}{importlib.machinery.EXTENSION_SUFFIXES[-1]}"
    shipped = packaged_dir()
    if shipped is not None and (shipped / file_name).is_file():
        return shipped / file_name
    directory = extension_build_dir(name)
    path = directory / file_name
    if not path.is_file() or (directory / "lock").exists():
        return None
    return path


def import_built_extension(name: str) -> Any:
    """The module of a finished build of extension ``name``, imported; None when there is none (or a
    build of it is under way: torch's lock file is in its folder)."""
    import importlib.machinery
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name]
    path = _built_file(name)
    if path is None:
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError:  # a partial or foreign file: the full load rebuilds it
        return None
    sys.modules[name] = module
    return module


def op_profiler_start() -> None:
    """Start the autograd profiler (CPU activity, all threads, overload names recorded),
    through its C++ entry points so that stopping does not build FunctionEvents.
    RuntimeError when a profiler is already running (it would be taken over otherwise)."""
    from torch._C._autograd import _enable_profiler, _prepare_profiler, _profiler_enabled
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig

    if _profiler_enabled():
        raise RuntimeError("a torch profiler is already running (only one can run at a time)")
    experimental = _ExperimentalConfig(capture_overload_names=True, profile_all_threads=True)
    config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, experimental)
    activities = {ProfilerActivity.CPU}
    _prepare_profiler(config, activities)
    _enable_profiler(config, activities)


def op_profiler_stop() -> list[Any]:
    """Stop the profiler started by :func:`op_profiler_start`; the roots of its event tree."""
    from torch._C._autograd import _disable_profiler

    return list(_disable_profiler().experimental_event_tree())


def profiler_function_events(event: Any) -> tuple[str, str, int] | None:
    """``(name, overload, duration_ns)`` for a FUNCTION-scope op event of the tree, else None
    (autograd nodes, user ranges, Python frames: the caller looks through them)."""
    from torch._C._profiler import RecordScope, _EventType

    if event.tag != _EventType.TorchOp or event.extra_fields.scope != RecordScope.FUNCTION:
        return None
    return event.name, event.overload_name, int(event.duration_time_ns)



__all__ += ["record_range_enter", "record_range_exit"]


def record_range_enter(name: str) -> Any:
    """Open a RecordFunction range (user scope) called ``name`` on this thread, without the
    dispatcher op ``torch.profiler.record_function`` calls; returns the handle to close."""
    from torch._C._autograd import _record_function_with_args_enter

    return _record_function_with_args_enter(name)


def record_range_exit(handle: Any) -> None:
    """Close a range opened by :func:`record_range_enter`."""
    from torch._C._autograd import _record_function_with_args_exit

    _record_function_with_args_exit(handle)

# --- tools ---------------------------------------------------------------------------
# torch_adapter.profiler, .debug and .memory: the profiler's experimental config (overload
# names in op events, all threads, no Python event objects at exit), the Python dispatch
# mode stack (a debug mode stays pushed between notebook cells and must come off from the
# middle of the stack), and the autograd node running a backward op.
__all__ += ["profiler_config", "profiler_running", "dispatch_mode_stack", "remove_dispatch_mode",
            "current_autograd_node", "is_op_overload"]


def profiler_config(**wanted: bool) -> Any:
    """A ``torch._C._profiler._ExperimentalConfig`` with those of ``wanted`` (keyword flags such
    as ``capture_overload_names=True``) that this torch knows; None if it has none of them."""
    try:
        from torch._C._profiler import _ExperimentalConfig
    except ImportError:
        return None
    flags = {}
    for name, value in wanted.items():  # an older torch lacks some: keep those it takes
        try:
            _ExperimentalConfig(**{name: value})
        except TypeError:
            continue
        flags[name] = value
    return _ExperimentalConfig(**flags) if flags else None


def profiler_running() -> bool:
    """Is a torch (autograd/kineto) profiler running in this process now?"""
    from torch._C._autograd import _profiler_enabled

    return bool(_profiler_enabled())


def dispatch_mode_stack() -> list[Any]:
    """The TorchDispatchModes pushed on this thread, outermost first."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())


def remove_dispatch_mode(mode: Any) -> bool:
    """Take ``mode`` (entered with ``mode.__enter__()``) off this thread's stack, wherever it is:
    modes pushed after it are popped, ``mode.__exit__`` runs, and they are pushed back in order.
    False when ``mode`` is not on this thread's stack (entered on another thread)."""
    from torch.utils._python_dispatch import _pop_mode, _push_mode

    stack = dispatch_mode_stack()
    if not any(m is mode for m in stack):
        return False
    above: list[Any] = []
    while dispatch_mode_stack()[-1] is not mode:
        above.append(_pop_mode())
    try:
        mode.__exit__(None, None, None)
    finally:
        for m in reversed(above):
            _push_mode(m)
    return True


def current_autograd_node() -> Any:
    """The autograd Node whose backward is running on this thread (``.name()``:
    ``"LogBackward0"``), or None outside backward."""
    import torch

    fn = getattr(torch._C, "_current_autograd_node", None)
    return fn() if fn is not None else None


def is_op_overload(obj: Any) -> bool:
    """Is ``obj`` an operator overload (``torch.ops.aten.add.Tensor``), e.g. an FX node's target?"""
    import torch

    return isinstance(obj, torch._ops.OpOverload)


def no_dispatch_modes() -> Any:
    """A context manager: the TorchDispatchModes of this thread are off inside it (put back after)."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


# --- torch._dynamo's tables of torch's functions ------------------------------------------
__all__ += ["dynamo_tables_loaded", "dynamo_tables", "dynamo_tables_ready", "build_dynamo_tables",
            "forget_dynamo_tables"]

# The caches dynamo builds at its first use of them (after its import) by looking torch's objects
# up by name: (module, attribute path). Each is a zero-argument functools cache.
_DYNAMO_CACHES = (
    ("torch._dynamo.trace_rules", "get_torch_obj_rule_map"),  # torch function -> how it is traced
    ("torch._dynamo.trace_rules", "get_tensor_method"),  # Tensor methods
    ("torch._dynamo.variables.torch", "get_overridable_functions"),  # torch.overrides' functions
    ("torch._dynamo.variables.torch", "tracing_state_functions"),
    ("torch._dynamo.variables.torch", "TorchInGraphFunctionVariable._get_handlers"),  # per-function handlers
    ("torch._dynamo.variables.user_defined", "UserDefinedClassVariable._constant_fold_classes"),  # torch.device
    ("torch._dynamo.variables.user_defined", "UserDefinedClassVariable._in_graph_classes"),
)


class _Table:
    """One of dynamo's lazily built tables, behind one protocol: built? build, content, forget."""

    def __init__(self, obj: Any, kind: str, module: Any = None) -> None:
        self.obj, self.kind, self.module = obj, kind, module

    def built(self) -> bool:
        if self.kind == "cache":
            return self.obj.cache_info().currsize > 0
        if self.kind == "ids":
            return self.obj.function_ids is not None
        return getattr(self.module, "_CLOSURE_VARS", None) is not None

    def build(self) -> None:
        self.obj()

    def content_ids(self) -> set[int]:
        if self.kind == "ids":
            return set(self.obj.function_ids)
        content = self.obj() if self.kind == "cache" else self.module._CLOSURE_VARS
        items = list(content.items()) if isinstance(content, dict) else [(k, None) for k in content]
        return {id(x) for kv in items for x in kv}

    def forget(self) -> None:
        if self.kind == "cache":
            self.obj.cache_clear()
        elif self.kind == "ids":
            self.obj.function_ids, self.obj.function_names = None, None
        else:
            self.module._CLOSURE_VARS = None


def dynamo_tables_loaded() -> bool:
    """Whether torch._dynamo is imported (importing it takes seconds: never done for this)."""
    import sys

    return "torch._dynamo.trace_rules" in sys.modules


def dynamo_tables() -> list[_Table]:
    """The tables torch._dynamo builds once, at their first use, by looking torch's objects up by
    name (``torch.arange`` → the object of that moment): trace_rules' rule map of torch functions,
    its set of Tensor methods and its ``FunctionIdSet`` id sets, the handler and constant-fold
    tables of its torch-function and class variables (``torch.device``), its guards' globals. A
    table built while a wrapper stands in for ``torch.arange`` holds the wrapper, not torch's
    function; dynamo then refuses to trace the real one ("marked as skipped": a graph break at
    every factory call of compiled code, also after uninstall). Tables of another torch: skipped."""
    import sys

    if not dynamo_tables_loaded():
        return []
    import torch._dynamo.trace_rules as tr

    tables: list[_Table] = []
    for module_name, path in _DYNAMO_CACHES:
        obj: Any = sys.modules.get(module_name)
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, "cache_clear"):
            tables.append(_Table(obj, "cache"))
    tables += [_Table(v, "ids") for v in vars(tr).values() if isinstance(v, tr.FunctionIdSet)]
    guards = sys.modules.get("torch._dynamo.guards")
    if guards is not None and hasattr(guards, "_get_closure_vars") and hasattr(guards, "_CLOSURE_VARS"):
        tables.append(_Table(guards._get_closure_vars, "global", guards))  # ``device`` in guard code
    return tables


def dynamo_tables_ready() -> bool:
    """Whether torch._dynamo is imported and every table of :func:`dynamo_tables` is built."""
    tables = dynamo_tables()
    return bool(tables) and all(t.built() for t in tables)


def build_dynamo_tables() -> bool:
    """Build every table not built yet, from the attributes of this moment; True if any was built."""
    built = False
    for table in dynamo_tables():
        if not table.built():
            table.build()
            built = True
    return built


def forget_dynamo_tables(holding: set[int]) -> None:
    """Forget the built tables that hold one of the object ids in ``holding`` (they are rebuilt
    at their next use from the attributes of then)."""
    for table in dynamo_tables():
        if table.built() and table.content_ids() & holding:
            table.forget()


# --- nn.Module's global forward pre-hooks under a stable key (optimization/layer.py) ----------------
__all__ += ["add_global_forward_pre_hook", "remove_global_forward_pre_hook"]


def add_global_forward_pre_hook(fn: Any, key: Any = None) -> Any:
    """Register ``fn`` as a global forward pre-hook; under ``key`` (a key an earlier call
    returned) when given, so that compiled code guarded on the hooks stays valid. Returns the key."""
    from torch.nn.modules import module

    if key is None:
        return module.register_module_forward_pre_hook(fn).id
    module._global_forward_pre_hooks[key] = fn
    return key


def remove_global_forward_pre_hook(key: Any) -> None:
    from torch.nn.modules import module

    module._global_forward_pre_hooks.pop(key, None)

__all__ += ["dtensor_register_strategy"]


def dtensor_register_strategy(op: Any, placements: Any, input_index: int, static_argnum: int) -> Any:
    """Give DTensor a sharding strategy for ``op`` (an OpOverload it has none for).

    ``placements(args)`` lists, for one mesh dimension, the acceptable placements of
    ``[outputs…, tensor inputs…]`` (``None`` for a non-tensor output); ``input_index`` is
    where the inputs start in each list; ``static_argnum`` the first non-tensor argument that
    takes part in the propagation cache key. DTensor's ``expand_to_full_mesh_op_strategy``
    turns that into an ``OpStrategy`` over the whole mesh. Returns an undo callable, or None
    when torch already has a strategy (torch's own is kept)."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    prop = DTensor._op_dispatcher.sharding_propagator
    if op in prop.op_strategy_funcs or op in getattr(prop, "op_single_dim_strategy_funcs", {}):
        return None

    def strategy(op_schema: Any) -> Any:
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema,
                                               placements(op_schema.args_schema), input_index=input_index)

    def clear_caches() -> None:  # the Python propagation cache and the C++ fast path's
        prop.propagate_op_sharding.cache_clear()
        clear_fast_path = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
        if clear_fast_path is not None:
            clear_fast_path()

    prop.op_strategy_funcs[op] = strategy
    prop.op_to_schema_info[op] = RuntimeSchemaInfo(static_argnum)
    clear_caches()

    def undo() -> None:
        if prop.op_strategy_funcs.get(op) is strategy:
            del prop.op_strategy_funcs[op]
            prop.op_to_schema_info.pop(op, None)
        clear_caches()

    return undo


__all__ += ["cuda_binding_module"]


def cuda_binding_module() -> Any:
    """``torch._C``, where a CUDA build defines the private ``_cuda_*`` bindings that
    ``torch.cuda``'s Python code and PyTorch's CUDA test base call (``_cuda_setStream``…)."""
    import torch

    return torch._C


__all__ += ["device_factory_names"]


def device_factory_names() -> list[str]:
    """Every ``torch.<name>`` function whose aten schema takes ``Device? device`` (torch's own
    registry of operator schemas: factories, ``*_like``, windows, the private quantized
    constructors…), sorted; classes (``torch.Generator``) are left to their own patch."""
    import inspect

    import torch

    from . import disk_cache  # the schema scan is pure data of torch's build: kept in the start-up cache

    key = {"torch": str(torch.__version__), "git": str(getattr(torch.version, "git_version", "")), "v": 1}
    stored = disk_cache.load("factories", key)
    if isinstance(stored, list) and all(isinstance(n, str) for n in stored):
        names = set(stored)
    else:
        names = {s.name.split("::", 1)[1] for s in torch._C._jit_get_all_schemas()
                 if s.name.startswith("aten::")
                 and any(a.name == "device" and str(a.type) == "Optional[Device]" for a in s.arguments)}
        disk_cache.store("factories", key, sorted(names))
    return sorted(n for n in names if callable(getattr(torch, n, None)) and not inspect.isclass(getattr(torch, n)))
# --- TorchScript (redirect/torchscript.py) ----------------------------------------------------
__all__ += ["jit_builtin_table", "jit_global_functions", "jit_importers", "script_module_graphs",
            "jit_dead_code_elimination"]


def jit_builtin_table() -> dict[int, str] | None:
    """TorchScript's table ``id(python function) -> "aten::name"`` (``torch.jit._builtins``), built
    from torch's attributes when torch is imported: the compiler emits a builtin op for a Python
    object whose id is in it and compiles the source of any other function. None when this torch
    lacks it (checked torch 2.9–2.13)."""
    from torch.jit import _builtins

    get = getattr(_builtins, "_get_builtin_table", None)
    table = get() if callable(get) else None
    return table if isinstance(table, dict) else None


def jit_global_functions() -> list[Any]:
    """Every function (and scripted class's method) compiled into TorchScript's global compilation
    unit (``torch.jit._state._python_cu``): what ``torch.jit.script`` made so far in this process."""
    from torch.jit import _state

    cu = getattr(_state, "_python_cu", None)
    return list(cu.get_functions()) if cu is not None and hasattr(cu, "get_functions") else []


def jit_importers() -> tuple[Any, tuple[str, ...]]:
    """``torch._C.import_ir_module`` and ``import_ir_module_from_buffer``: what ``torch.jit.load``
    calls with the compilation unit it creates for the archive's code (its owner and the names
    present on this torch)."""
    import torch

    names = tuple(n for n in ("import_ir_module", "import_ir_module_from_buffer") if hasattr(torch._C, n))
    return torch._C, names


def script_module_graphs(module: Any) -> list[tuple[str, Any]]:
    """``(qualified method name, graph)`` of every method of a ScriptModule and its submodules
    (the C++ module behind ``module._c``)."""
    import torch

    out = []
    for sub in module.modules():
        c = getattr(sub, "_c", None)
        if isinstance(c, torch._C.ScriptModule):
            owner = c._type().qualified_name()
            out += [(f"{owner}.{name}", c._get_method(name).graph) for name in c._method_names()]
    return out


def jit_dead_code_elimination(graph: Any) -> None:
    """TorchScript's dead-code pass on ``graph``, in place."""
    import torch

    torch._C._jit_pass_dce(graph)


# --- CUDA graph emulation (torch_adapter.redirect.cuda_graphs) -----------------------------
__all__ += ["function_mode_base", "mutated_tensors", "below_autograd_and_autocast"]


def function_mode_base() -> type:
    """``torch.overrides.TorchFunctionMode`` (public, but listed here beside its dispatch twin)."""
    from torch.overrides import TorchFunctionMode

    return TorchFunctionMode


def mutated_tensors(op: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The tensors ``op`` writes to (its schema's ``Tensor(a!)`` arguments, lists included)."""
    import torch

    schema = op._schema
    if not schema.is_mutable:
        return []
    out: list[Any] = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        values = value if isinstance(value, (list, tuple)) else [value]
        out.extend(v for v in values if isinstance(v, torch.Tensor))
    return out


def below_autograd_and_autocast(device_types: tuple[str, ...]) -> Any:
    """A context manager that runs aten ops as a TorchDispatchMode's ``func(*args)`` runs them:
    below autograd and ADInplaceOrView (no graph recorded, no version bump, as a kernel replayed
    by a CUDA graph) and below the autocast keys of ``device_types`` (the recorded ops are the
    casts autocast already chose)."""
    import contextlib

    import torch

    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    for device_type in device_types:
        try:
            keys = keys | DispatchKeySet(autocast_key(device_type))
        except (AttributeError, RuntimeError):
            pass
    stack = contextlib.ExitStack()
    stack.enter_context(torch._C._AutoDispatchBelowADInplaceOrView())
    stack.enter_context(torch._C._ExcludeDispatchKeyGuard(keys))
    return stack


# --- "cuda"-keyed custom ops (torch_adapter.redirect.custom_ops) ---------------------------
__all__ += ["python_kernel", "has_computed_kernel_for_key"]


def python_kernel(name: str, key: str) -> Any:
    """The kernel registered from Python for ``name`` at ``key`` (``torch.library``:
    custom_op, ``Library.impl``), or None (none, or a C++ kernel: its ``debug`` text names the
    ``.cpp``/``.cu`` file that registered it, a Python one the ``.py`` file or ``<stdin>``)."""
    import re

    import torch

    if not has_kernel_for_key(name, key):
        return None
    kernel = torch.library.get_kernel(name, key)
    debug = repr(kernel)
    return None if re.search(r"\.(cpp|cu|cc|h|mm)(:\d+)?'", debug) else kernel


def has_computed_kernel_for_key(name: str, key: str) -> bool:
    """Would the dispatcher find a kernel for ``name`` at ``key`` (its own, or a composite one)?"""
    import torch

    try:
        return bool(torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, key))
    except RuntimeError:
        return False


# --- what torch._dynamo compiled (torch_adapter.routing.compiled) ----------------------------
# Read only, and only once torch._dynamo is imported (importing it takes seconds: never done for
# this). Checked on torch 2.13: ``torch._dynamo.utils.counters`` (a defaultdict of Counters since
# 1.13: "frames" total/ok, "stats" unique_graphs, "graph_break" reason -> count),
# ``torch._dynamo.utils.get_compilation_metrics()`` (the last 64 CompilationMetrics dataclasses,
# 2.1+; ``restart_reasons`` and ``recompile_reason`` 2.5+ — a missing field reads as None) and
# ``torch._dynamo.callback.callback_handler`` (register/remove start and end callbacks, 2.5+;
# ``torch._dynamo.reset()`` clears it). A torch without one of them: the readers return None.
__all__ += ["dynamo_counters", "dynamo_compile_records", "dynamo_compile_callbacks"]

_COUNTER_GROUPS = ("frames", "stats", "graph_break")


def dynamo_counters() -> dict[str, dict[str, int]] | None:
    """A copy of dynamo's counters of frames, graphs and graph breaks (``{"frames": {"total", "ok"},
    "stats": {"unique_graphs", ...}, "graph_break": {reason: n}}``), or None when torch._dynamo is not
    imported. Read with ``get``: no group is created in the program's counters."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return None
    return {group: dict(counters.get(group) or {}) for group in _COUNTER_GROUPS}


def dynamo_compile_records() -> tuple[list[Any], int] | None:
    """dynamo's records of its last compiles (CompilationMetrics objects, oldest first; the same
    objects from one call to the next) and how many it keeps, or None when torch._dynamo is not
    imported or has none."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    get = getattr(utils, "get_compilation_metrics", None)
    if get is None:
        return None
    kept = getattr(getattr(utils, "_compilation_metrics", None), "maxlen", None)
    return list(get()), int(kept or getattr(utils, "DEFAULT_COMPILATION_METRICS_LIMIT", 64))


def dynamo_compile_callbacks() -> Any:
    """dynamo's compile start/end callback handler (``register_start_callback`` & co.), or None when
    torch._dynamo is not imported or has none. Its start callbacks run when the first of the
    compiles in flight starts, its end callbacks when the last one ends, on that compile's thread
    (dynamo compiles frames one at a time, under its compile lock)."""
    import sys

    module = sys.modules.get("torch._dynamo.callback")
    handler = getattr(module, "callback_handler", None)
    needed = ("register_start_callback", "register_end_callback", "remove_start_callback", "remove_end_callback")
    if handler is None or not all(hasattr(handler, n) for n in needed):
        return None
    return handler
