"""``apply_all(session)``: every redirect surface installed on the session's Patcher, in order."""

from __future__ import annotations

from typing import Any

__all__ = ["apply_all"]


def apply_all(session: Any) -> None:
    from . import (accelerator, amp, compiling, cuda_bindings, cuda_ns, custom_ops, devices, distributed,
                   dtensor_rules, env, host_limits, probes, torch_tables, torchscript)
    from .log import remember

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
    host_limits.apply(session)
    torchscript.apply(session)  # registers every wrapper patched in above as TorchScript's builtin
    torch_tables.register(session)  # after every patch: the stand-ins beside torch's functions
