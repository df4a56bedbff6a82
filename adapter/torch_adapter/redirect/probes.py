"""Third-party availability probes answered for the target (the table in docs/launchers.md).

Libraries choose their code path with probes such as transformers'
``is_flash_attn_2_available()`` or diffusers' ``is_xformers_available()``. Where a probe
would lead to CUDA-only kernels (flash-attn, xformers, bitsandbytes, apex, Triton
kernels…) on a target that is not a real CUDA device, it answers ``False`` while the
adapter is installed, so the library takes its portable path (SDPA, the eager kernels).
Probes whose answer already follows ``torch.cuda`` (accelerate's NVML-based
``is_cuda_available``) are kept and listed as such.

:data:`PROBES` is the data: one row per (defining module, function). The mechanism below
patches the function where it is defined and every binding of it that other modules made
before install (``from .import_utils import is_xformers_available``); modules imported
later are patched right after they execute (the adapter's one import hook,
:mod:`torch_adapter.core.after_import`, taken off while the session is suspended), so import-time checks (``if is_xformers_available(): import xformers``) see the answer
too. Every patch goes through the session's Patcher and is undone by ``uninstall()``.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..core.after_import import after_import
from ..core.patching import bindings, mark_stand_in, original_of

__all__ = ["Probe", "PROBES", "KEEP", "apply", "patched_probes", "owner_of"]

KEEP: Any = "keep"  # the row documents a probe that needs no patch


@dataclass(frozen=True)
class Probe:
    module: str  # import path of the module that defines the function
    name: str
    answer: Any  # what it returns under the adapter on a non-CUDA target, or KEEP
    why: str
    gone_in: str | None = None  # the library's version that no longer has it (older ones still patched)
    emulated: str | None = None  # answered only on this emulated target (torch_adapter/emulated), not elsewhere


_FA = "flash-attn's kernels are CUDA-only; the model uses torch SDPA"
_XF = "xformers' memory-efficient attention is CUDA-only; the library uses torch SDPA"
_BNB = "bitsandbytes quantisation kernels target CUDA; 8/4-bit loading is refused with the library's own message"
_TRITON = "Triton kernels compile for CUDA/ROCm GPUs only; the eager kernels run"
_CUDA_EXT = "a CUDA extension package; the library's pure-torch path runs"
_TF, _DF, _ACC = "transformers.utils.import_utils", "diffusers.utils.import_utils", "accelerate.utils.imports"

PROBES: tuple[Probe, ...] = (
    # transformers
    *(Probe(_TF, n, False, _FA) for n in ("is_flash_attn_2_available", "is_flash_attn_3_available",
                                          "is_flash_attn_4_available", "is_flash_attn_greater_or_equal",
                                          "is_flash_attn_greater_or_equal_2_10")),
    Probe(_TF, "is_bitsandbytes_available", False, _BNB),
    Probe(_TF, "is_apex_available", False, "apex fused optimizers/layernorm are CUDA extensions; torch's run"),
    # The Hub kernels are kept out by transformers' own off switch (USE_HUB_KERNELS=0), not by
    # is_kernels_available(): transformers 5.x (which requires kernels) decides at import of
    # integrations.hub_kernels from that probe whether to define its kernel functions or stubs that
    # raise, so a False answer while installed outlived uninstall ("requires `kernels` to be
    # installed"), and from_pretrained, defaulting to use_kernels=True, refused to load under it.
    Probe(_TF, "is_kernels_available", KEEP,
          "kept: transformers defines its kernel layer at import from it (a False answer would outlive uninstall)"),
    Probe("transformers.integrations.hub_kernels", "_kernels_enabled", False,
          "Hub kernels off, as USE_HUB_KERNELS=0 (the Hub kernels are CUDA builds; the model's own layers run)"),
    Probe(_TF, "is_liger_kernel_available", False, _TRITON),
    Probe(_TF, "is_flash_linear_attention_available", False, _TRITON),
    Probe(_TF, "is_triton_available", False, _TRITON),
    Probe(_TF, "is_fbgemm_gpu_available", False, _CUDA_EXT),
    *(Probe(_TF, n, False, _CUDA_EXT) for n in ("is_mamba_ssm_available", "is_mamba_2_ssm_available",
                                                "is_causal_conv1d_available")),
    Probe(_TF, "is_torch_cuda_available", KEEP, "True through the torch.cuda stand-in: the CUDA path, redirected"),
    # the emulated npu's torch_npu (emulated/vendor_package.py) is the device without the vendor's kernels:
    # transformers, told yes, imports torch_npu.npu_fusion_attention at import (integrations.npu_flash_attention)
    Probe(_TF, "is_torch_npu_available", False, "the emulated npu's torch_npu has the device, not torch_npu's "
          "kernels (npu_fusion_attention): transformers keeps its portable path, on the npu through accelerate",
          emulated="npu"),
    # diffusers
    Probe(_DF, "is_xformers_available", False, _XF),
    Probe(_DF, "is_xformers_version", False, _XF),
    Probe(_DF, "is_flash_attn_available", False, _FA),
    Probe(_DF, "is_flash_attn_3_available", False, _FA),
    Probe(_DF, "is_flash_attn_version", False, _FA),
    Probe(_DF, "is_sageattention_available", False, "SageAttention's kernels are CUDA-only; torch SDPA runs"),
    Probe(_DF, "is_sageattention_version", False, "SageAttention's kernels are CUDA-only; torch SDPA runs"),
    Probe(_DF, "is_flashinfer_available", False, "FlashInfer's kernels are CUDA-only"),
    Probe(_DF, "is_bitsandbytes_available", False, _BNB),
    Probe(_DF, "is_bitsandbytes_version", False, _BNB),
    Probe(_DF, "is_kernels_available", False, "the Hub kernels are CUDA builds; the model's own layers run"),
    Probe(_DF, "is_nvidia_modelopt_available", False, "NVIDIA ModelOpt quantisation targets CUDA"),
    # accelerate
    Probe(_ACC, "is_bnb_available", False, _BNB),
    Probe(_ACC, "is_4bit_bnb_available", False, _BNB),
    Probe(_ACC, "is_8bit_bnb_available", False, _BNB),
    Probe(_ACC, "is_bitsandbytes_multi_backend_available", False, _BNB),
    Probe(_ACC, "is_transformer_engine_available", False, "Transformer Engine FP8 kernels are CUDA-only"),
    Probe(_ACC, "is_transformer_engine_mxfp8_available", False, "Transformer Engine FP8 kernels are CUDA-only"),
    Probe(_ACC, "is_msamp_available", False, "MS-AMP FP8 is CUDA-only", gone_in="1.16.0"),
    Probe(_ACC, "is_fp8_available", False, "FP8 training backends (TE, MS-AMP, torchao float8) need CUDA GPUs"),
    Probe(_ACC, "is_triton_available", False, _TRITON),
    Probe(_ACC, "is_cuda_available", KEEP,
          "its NVML-based check calls torch.cuda.is_available(), which the stand-in answers True"),
    # deepspeed: the CUDA accelerator it picks where torch.cuda is available (a method; "Class.method")
    Probe("deepspeed.accelerator.cuda_accelerator", "CUDA_Accelerator.is_fp16_supported", True,
          "DeepSpeed refuses an fp16 config below compute capability 7.0 ('Type fp16 is not supported on your "
          "device'), and the CPU target answers (0, 0); float16 runs on the target (docs/redirect.md, Low precision)"),
)


def owner_of(module: Any, name: str) -> tuple[Any, str]:
    """Where the probe ``name`` lives: the module, or for ``Class.method`` the class (None if absent)."""
    *path, attr = name.split(".")
    owner = module
    for part in path:
        owner = vars(owner).get(part) if owner is not None else None
    return owner, attr


def _stand_in(original: Callable[..., Any], probe: Probe, state: "_State") -> Callable[..., Any]:
    answer, asked, log = probe.answer, f"{probe.module.split('.')[0]}.{probe.name}()", state.session.redirect_log

    def probe_answer(*args: Any, **kwargs: Any) -> Any:
        if not state.live:  # a binding that outlived uninstall(): the library's own answer
            return original(*args, **kwargs)
        try:
            log.record("probe", asked, f"{answer!r}: {probe.why}")
        except Exception:  # the log must never break the library asking
            pass
        return answer

    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(probe_answer, attr, getattr(original, attr, None))
    mark_stand_in(probe_answer, original)
    try:
        probe_answer.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    probe_answer._torch_adapter_probe = probe  # type: ignore[attr-defined]
    return probe_answer


class _State:
    def __init__(self, session: Any, table: dict[str, list[Probe]]) -> None:
        self.session, self.table = session, table
        self.stand_ins: dict[int, Callable[..., Any]] = {}  # id(original) -> stand-in
        self.live = True

    def patch_module(self, module: Any) -> list[tuple[Any, Callable[..., Any]]]:
        done = []
        for probe in self.table.get(module.__name__, ()):
            owner, attr = owner_of(module, probe.name)
            original = vars(owner).get(attr) if owner is not None else None
            if original is None or not callable(original) or hasattr(original, "_torch_adapter_probe"):
                continue
            stand_in = self.stand_ins.get(id(original))
            if stand_in is None:
                stand_in = self.stand_ins[id(original)] = _stand_in(original, probe, self)
            self.session.patcher.set(owner, attr, stand_in)
            done.append((original, stand_in))
        return done

    def rebind_everywhere(self, pairs: list[tuple[Any, Callable[..., Any]]]) -> None:
        """Bindings other modules made before install (``from x import is_..._available``)."""
        by_id = {id(o): (o, s) for o, s in pairs}
        for module, name, value in bindings([o for o, _ in pairs]):
            self.session.patcher.set(module, name, by_id[id(value)][1])

    def close(self) -> None:
        """Bindings made while installed (modules imported after install) get the originals back."""
        self.live = False
        for name in self.table:
            if name in sys.modules:
                _clear_caches(sys.modules[name])
        for module, name, value in bindings(list(self.stand_ins.values())):
            setattr(module, name, original_of(value))


def _clear_caches(module: Any) -> None:
    """Forget answers a probe cached (``@lru_cache``) before the adapter changed what torch.cuda says."""
    for value in list(vars(module).values()):
        for fn in (value, original_of(value), getattr(value, "__wrapped__", None)):
            clear = getattr(fn, "cache_clear", None)
            if callable(clear) and getattr(fn, "__module__", None) == module.__name__:
                clear()


def _patch_later(state: "_State") -> Callable[[Any], None]:
    def patch(module: Any) -> None:
        if state.live:
            state.patch_module(module)
    return patch


def patched_probes(session: Any) -> bool:
    """Does this session answer the third-party probes (not on a real CUDA target)?"""
    return not (session.target.device_type == "cuda" and not session.target.simulated)


def _applies(probe: Probe, target: Any) -> bool:
    """A row for an emulated target answers there only; the others wherever apply() patches."""
    if probe.emulated is None:
        return True
    return bool(getattr(target, "emulated", False)) and getattr(target, "name", None) == probe.emulated


def apply(session: Any) -> None:
    if not patched_probes(session):
        return  # on real CUDA every probe's own answer is the right one
    table: dict[str, list[Probe]] = {}
    for probe in PROBES:
        if probe.answer is not KEEP and _applies(probe, session.target):
            table.setdefault(probe.module, []).append(probe)
    state = _State(session, table)
    pairs = []
    for name in table:
        module = sys.modules.get(name)
        if module is not None:
            _clear_caches(module)
            pairs += state.patch_module(module)
    if pairs:
        state.rebind_everywhere(pairs)
    for name in table:
        if name not in sys.modules:  # patched right after it first executes (imports after install)
            after_import(session.patcher, name, _patch_later(state))
    session.patcher.after_restore(state.close)  # suspend and close: bindings made meanwhile get the originals
