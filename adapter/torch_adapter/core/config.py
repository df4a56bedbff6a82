"""The session's options: :class:`Config` and the checks ``install()``/``configure()`` run.

Every option is type-checked here before anything is installed or changed: a wrong name,
type or value is a :class:`~torch_adapter.errors.UsageError` naming the option, the value,
what is allowed and why (docs/tools.md lists them per target). Nothing in this module
installs anything; the session applies a checked Config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import UsageError, did_you_mean, format_error

__all__ = ["CHILD_SETTINGS_ENV", "encode_child_settings", "Config", "make_config", "AMP_POLICIES", "FLOAT16_COMPUTE", "DTYPE_POLICIES", "float16_tensors",
           "OPTIMIZATION_LEVELS", "MEMORY_STRATEGIES", "DEBUG_MODES",
           "MIXED_PRECISION", "FUSION_PATTERNS", "COLLECTIVE_BACKENDS", "collective_backends"]

# the settings a parent hands its adapted child processes (JSON; read at their start-up by
# launch/autoinstall.py through the .pth hook)
CHILD_SETTINGS_ENV = "TORCH_ADAPTER_AUTOINSTALL"


def encode_child_settings(settings: dict) -> str:
    return json.dumps(settings, sort_keys=True)

AMP_POLICIES = ("auto", "float16", "bfloat16", "float32")
# What the float16 matmul/convolution/attention calls compute in on the CPU (routing/low_precision.py):
# "auto" the CPU's fast dtype (core/cpu_features.py), "float16" = off (computed as asked).
FLOAT16_COMPUTE = ("auto", "bfloat16", "float32", "float16")
# What a float16 request (.half(), dtype=torch.float16, autocast float16) gives on a CPU target
# (redirect/dtype_policy.py): "auto" float32 where float16 is computed in float32, else float16.
DTYPE_POLICIES = ("auto", "float16", "float32")


def float16_tensors(policy: str, compute: str | None) -> str:
    """What a float16 request on a real CPU target gives under dtype ``policy`` when float16 heavy ops
    compute in ``compute`` ("bfloat16", "float32"; None: as float16): "float32" or "float16"."""
    if policy == "auto":
        return "float32" if compute == "float32" else "float16"
    return policy
OPTIMIZATION_LEVELS = ("conservative", "balanced", "aggressive")
# "low" is the older spelling of gradient checkpointing (kept: prepare() and profiles use it).
MEMORY_STRATEGIES = ("default", "reuse", "aggressive", "low")
DEBUG_MODES = (False, True, "raise", "warn", "compare")
MIXED_PRECISION = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", None: "auto"}
FUSION_PATTERNS = ("attention_blocks",)
# Collective backends torch_adapter knows, with where each comes from (for the error message).
COLLECTIVE_BACKENDS = {"gloo": "torch (CPU)", "nccl": "CUDA builds of torch", "mpi": "torch built with MPI",
                       "ucc": "torch built with UCC", "hccl": "torch_npu (Ascend NPUs)",
                       "xccl": "XPU builds of torch (Intel GPUs)", "cncl": "torch_mlu"}


@dataclass
class Config:
    """Everything `install()`/`configure()` can set. Each field is documented in docs/."""

    # AMP: what autocast("cuda", dtype) becomes. "auto" keeps the program's dtype on every
    # target (float16 stays float16, on the CPU too: redirect/amp.py says why).
    amp_dtype: str = "auto"
    # float16 heavy ops (matmul family, convolution, attention) on the CPU computed in the CPU's
    # fast dtype, tensors staying float16: auto | bfloat16 | float32 | float16 (off).
    float16_compute: str = "auto"
    # What float16 requests give on a CPU target: auto (the default: float32 tensors where float16
    # is computed in float32, float16 elsewhere) | float16 (as asked) | float32.
    dtype_policy: str = "auto"
    # Fallback policy for ops the target lacks (routing engine): allow | warn | error.
    fallback: str = "allow"
    force_cpu: tuple[str, ...] = ()
    # Ops (aten names) or reason codes (TA-F001: docs/reasons.md): deny refuses their CPU fallback
    # (FallbackError); allow lets them fall back silently whatever the fallback policy says.
    deny: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    # A budget of distinct ops that may fall back to the CPU: the first call of one more raises
    # FallbackError listing them (None: no budget). `run --max-fallbacks` judges the whole run.
    max_fallbacks: int | None = None
    # Simulated targets: a dtype the real backend refuses raises its error | is recorded | off.
    dtype_check: str = "raise"
    # Child processes (mp.spawn, DataLoader spawn workers, subprocesses) adapted too.
    propagate: bool = False
    # Record call sites of redirections (cheap: once per distinct call site).
    log_redirects: bool = True
    # The collective backend that "nccl" becomes; None = the target's own.
    communication_backend: str | None = None
    # The optimization layer (optimization/layer.py): conservative | balanced | aggressive.
    optimization_level: str = "conservative"
    # default | reuse | aggressive ("low": prepare(model) turns on gradient checkpointing).
    memory_strategy: str = "default"
    # NaN/Inf check (True/"raise", "warn") and CPU compare ("compare"), torch_adapter.debug.
    debug_mode: bool | str = False
    # Serve memory figures to `torch-adapter memory --pid` (or TORCH_ADAPTER_MEMORY_SERVER=1).
    memory_server: bool = False
    # Hand-written patterns run as the target's fused kernels: ("attention_blocks",).
    fusion_patterns: tuple[str, ...] = ()
    # The script's models recompute activations in backward (their own switch, else per block).
    gradient_checkpointing: bool = False
    # Module classes (qualified names) whose forward runs under torch.utils.checkpoint.
    activation_checkpointing: tuple[str, ...] = ()
    # DDP bucket_cap_mb for the DistributedDataParallel wrappers the script creates.
    communication_bucket_size: float | None = None
    # How many CUDA devices torch.cuda.device_count() shows where every CUDA index names the CPU
    # (target cpu, simulated targets); None: 1, or one per local rank under a launcher.
    device_count: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}

    @property
    def mixed_precision(self) -> str | None:
        """``amp_dtype`` as ``configure(mixed_precision=...)`` spells it: "fp16", "bf16", "fp32" or None (auto)."""
        return {v: k for k, v in MIXED_PRECISION.items()}[self.amp_dtype]


_NAMES = frozenset(f.name for f in fields(Config)) - {"extra"}
_CHOICES: dict[str, tuple[Any, ...]] = {"amp_dtype": AMP_POLICIES, "float16_compute": FLOAT16_COMPUTE,
                                        "dtype_policy": DTYPE_POLICIES,
                                        "fallback": ("allow", "warn", "error"),
                                        "dtype_check": ("raise", "record", "off"),
                                        "optimization_level": OPTIMIZATION_LEVELS,
                                        "memory_strategy": MEMORY_STRATEGIES, "debug_mode": DEBUG_MODES,
                                        "memory_server": (False, True), "propagate": (False, True),
                                        "log_redirects": (False, True), "gradient_checkpointing": (False, True)}
_WHY = {"amp_dtype": "it decides what autocast('cuda', float16) becomes on the target",
        "propagate": "it decides whether child processes are adapted too",
        "float16_compute": "it decides what the CPU computes float16 matmuls, convolutions and attention in",
        "dtype_policy": "it decides what dtype a float16 request (.half(), dtype=torch.float16) gives on the CPU",
        "fallback": "it decides what happens when the target lacks an op",
        "dtype_check": "it decides what a simulated target does with a dtype its real backend refuses"}


def _call(key: str) -> str:
    return f"torch_adapter.configure({key}=...)"


def make_config(kwargs: dict[str, Any], base: Config | None = None) -> Config:
    """A checked Config: ``base``'s values (or the defaults) updated with ``kwargs``."""
    cfg = Config(**(base.as_dict() if base else {}))
    for key, value in kwargs.items():
        if key == "mixed_precision":
            _set_mixed_precision(cfg, value, kwargs)
            continue
        if key not in _NAMES:
            raise UsageError(format_error(
                "torch_adapter.install()/configure()", f"keyword arguments among {sorted(_NAMES | {'mixed_precision'})}",
                repr(key) + did_you_mean(key, _NAMES | {"mixed_precision"}),
                fix="check the spelling; see help(torch_adapter.install) and docs/tools.md"))
        if key in ("force_cpu", "deny", "allow", "fusion_patterns"):
            value = _names(key, value)
        elif key == "activation_checkpointing":
            value = _module_names(value)
        setattr(cfg, key, value)
    _check(cfg)
    return cfg


def _names(key: str, value: Any) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else value
    try:
        out = tuple(items or ())
    except TypeError:
        out = (value,)
    bad = next((v for v in out if not isinstance(v, str)), None)
    if bad is not None or not (value is None or isinstance(value, (str, list, tuple, set, frozenset))):
        what = "op names such as \"aten::nonzero\"" if key != "fusion_patterns" else "a name or a list of names (str)"
        shown = bad if bad is not None else value
        raise UsageError(format_error(_call(key), what, f"{shown!r} ({type(shown).__name__})",
                                      fix=f'e.g. configure({key}=["{"attention_blocks" if key == "fusion_patterns" else "aten::nonzero"}"])'))
    return out


def _module_names(value: Any) -> tuple[str, ...]:
    """``activation_checkpointing``: False/None, True (every block of the model's own switch),
    or module classes / their qualified names."""
    if value is None or value is False:
        return ()
    if value is True:
        return ("*",)
    items = value if isinstance(value, (list, tuple, set, frozenset)) else (value,)
    out = []
    for item in items:
        if isinstance(item, type):
            out.append(f"{item.__module__}.{item.__qualname__}")
        elif isinstance(item, str) and item:
            out.append(item)
        else:
            raise UsageError(format_error(
                _call("activation_checkpointing"), "True, False, or nn.Module classes (or their qualified names)",
                f"{item!r} ({type(item).__name__})", why="each listed block's forward is recomputed in backward",
                fix="e.g. configure(activation_checkpointing=[diffusers.models.attention.BasicTransformerBlock])"))
    return tuple(out)


def _set_mixed_precision(cfg: Config, value: Any, kwargs: dict[str, Any]) -> None:
    call = "torch_adapter.configure(mixed_precision=...)"
    if not isinstance(value, (str, type(None))) or value not in MIXED_PRECISION:
        raise UsageError(format_error(call, "one of 'fp16', 'bf16', 'fp32' or None", f"{value!r}",
                                      why="it sets the AMP dtype policy (amp_dtype) that autocast('cuda') follows",
                                      fix='e.g. configure(mixed_precision="bf16")'))
    dtype = MIXED_PRECISION[value]
    if "amp_dtype" in kwargs and kwargs["amp_dtype"] != dtype:
        raise UsageError(format_error(call, f"amp_dtype={dtype!r} or no amp_dtype beside mixed_precision={value!r}",
                                      f"amp_dtype={kwargs['amp_dtype']!r}", why="both set the one AMP policy",
                                      fix="pass only one of them"))
    cfg.amp_dtype = dtype


def _check(cfg: Config) -> None:
    for key, valid in _CHOICES.items():
        value = getattr(cfg, key)
        if not any(type(value) is type(v) and value == v for v in valid):  # True is not 1, "no" is not True
            example = next((v for v in valid if v != getattr(Config, key, None)), valid[0])
            if key == "amp_dtype":  # the spelling the redirect docs and tests show
                raise UsageError(format_error("torch_adapter.install(amp_dtype=...)", f"one of {AMP_POLICIES}",
                                              repr(value), why=_WHY[key], fix='e.g. amp_dtype="bfloat16"'))
            raise UsageError(format_error(
                _call(key), f"one of {', '.join(map(repr, valid))}", f"{value!r} ({type(value).__name__})",
                why=_WHY.get(key, ""), fix=f"e.g. configure({key}={example!r}); see docs/tools.md"))
    unknown = [p for p in cfg.fusion_patterns if p not in FUSION_PATTERNS]
    if unknown:
        raise UsageError(format_error(_call("fusion_patterns"), f"names among {list(FUSION_PATTERNS)}",
                                      repr(unknown[0]), why="only these hand-written patterns are recognised",
                                      fix='e.g. configure(fusion_patterns=["attention_blocks"])'))
    size = cfg.communication_bucket_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0):
        raise UsageError(format_error(_call("communication_bucket_size"), "None or a number of megabytes > 0",
                                      f"{size!r} ({type(size).__name__})",
                                      why="it is the bucket_cap_mb of the DistributedDataParallel wrappers",
                                      fix="e.g. configure(communication_bucket_size=50)"))
    count = cfg.device_count
    if count is not None and (type(count) is not int or count < 1):
        raise UsageError(format_error(_call("device_count"), "None or a whole number of devices >= 1",
                                      f"{count!r} ({type(count).__name__})",
                                      why="it is what torch.cuda.device_count() answers where every CUDA index "
                                          "names the CPU",
                                      fix="e.g. configure(device_count=2) for a program that asks for 2 GPUs"))
    budget = cfg.max_fallbacks
    if budget is not None and (type(budget) is not int or budget < 0):
        raise UsageError(format_error(_call("max_fallbacks"), "None or a whole number of ops >= 0",
                                      f"{budget!r} ({type(budget).__name__})",
                                      why="it is how many distinct ops may run on the CPU before one more raises",
                                      fix="e.g. configure(max_fallbacks=0): no CPU fallback at all"))
    _check_backend(cfg)


def _check_backend(cfg: Config) -> None:
    backend = cfg.communication_backend
    if backend is None:
        return
    here = collective_backends()
    if isinstance(backend, str) and backend.lower() in here:
        cfg.communication_backend = backend.lower()
        return
    name = backend.lower() if isinstance(backend, str) else None
    why = 'it replaces "nccl" in init_process_group / new_group'
    if name in COLLECTIVE_BACKENDS:
        why = (f"{name!r} comes with {COLLECTIVE_BACKENDS[name]}, which this process does not have, so "
               f"init_process_group({name!r}) would fail")
    raise UsageError(format_error(
        _call("communication_backend"), f"None or a backend available here: {', '.join(here)}",
        f"{backend!r}", why=why, fix=f"e.g. configure(communication_backend={here[0]!r}), or None for the target's own"))


def collective_backends() -> list[str]:
    """The collective backends this process can start (registered third-party ones included)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - a torch built without distributed
        return []
    if not dist.is_available():  # pragma: no cover
        return []
    names = {n for n in ("gloo", "nccl", "mpi", "ucc", "xccl")
             if getattr(dist, f"is_{n}_available", lambda: False)()}
    names |= {str(b).lower() for b in getattr(dist.Backend, "backend_list", [])} - set(COLLECTIVE_BACKENDS)
    names |= {n for n in ("hccl", "cncl") if n in {str(b).lower() for b in getattr(dist.Backend, "backend_list", [])}}
    names -= {"undefined", "fake"}  # "fake" is torch's test-only backend
    return sorted(names)
