"""Layer 1, REDIRECT: CUDA requests → the target. One module per surface:

- :mod:`.devices`      device arguments (and int ordinals), Tensor/Module methods, load, Generator
- :mod:`.device_context` ``with torch.device``, ``set_default_device``, meta init (torch's factory set)
- :mod:`.device_ordinal` ``torch.device(0)`` (a stand-in for the name while installed)
- :mod:`.dataflow`     DataLoader pinning, ``nn.DataParallel`` on the host
- :mod:`.cuda_ns`      the ``torch.cuda`` namespace answered for the target (:mod:`.cuda_graphs`: CUDA graphs
                       emulated where the target has none)
- :mod:`.cuda_bindings` the private ``torch._C._cuda_*`` stream/device bindings CUDA test bases call
- :mod:`.custom_ops`   custom ops with only a "cuda" kernel run on the target (a session-owned kernel)
- :mod:`.accelerator`  ``torch.accelerator`` answered as ``torch.cuda`` on the CPU target (torch's own calls: the truth)
- :mod:`.amp`          autocast / GradScaler / custom_fwd, profiler activities, SDPA backends
- :mod:`.compiling`    ``torch.compile`` CUDA-graph modes → their no-graph equivalents
- :mod:`.distributed`  "nccl" → the target's collective backend, DDP device ids
- :mod:`.dtensor_rules` DTensor sharding strategies for host kernels CUDA has its own for (CPU attention)
- :mod:`.env`          CUDA environment variables → the target's
- :mod:`.probes`       third-party availability probes (flash-attn, xformers…) answered for the target
- :mod:`.torchscript`  TorchScript: the wrappers as its builtins, CUDA device constants in graphs → the target
- :mod:`.torch_tables` torch's tables of its functions and pickle's names: each stand-in beside its original
- :mod:`.log`          the redirect log (call sites)

:func:`apply_all` installs them on a session's Patcher, in that order; the session's
``uninstall()`` restores every attribute to the identical object.
"""

from __future__ import annotations

from typing import Any

__all__ = ["apply_all"]


def apply_all(session: Any) -> None:
    from . import (accelerator, amp, compiling, cuda_bindings, cuda_ns, custom_ops, devices, distributed,
                   dtensor_rules, env, probes, torch_tables, torchscript)
    from .log import remember
    from ..launch.autoinstall import ENV_VAR, encode

    session.redirect_log.enabled = session.config.log_redirects
    remember(session.redirect_log)
    compiling.prepare(session)  # before any patch: torch._dynamo's tables of torch's functions
    torch_tables.prepare(session)  # before any patch: torch's tables of its functions
    devices.apply(session)
    cuda_ns.apply(session)
    cuda_bindings.apply(session)
    custom_ops.apply(session)
    accelerator.apply(session)
    amp.apply(session)
    compiling.apply(session)
    distributed.apply(session)
    dtensor_rules.apply(session)
    env.apply(session)
    probes.apply(session)
    torchscript.apply(session)  # registers every wrapper patched in above as TorchScript's builtin
    torch_tables.register(session)  # after every patch: the stand-ins beside torch's functions
    if session.config.propagate:
        session.patcher.set_env(ENV_VAR, encode(session.settings()))
