"""The objects ``torch.cuda`` hands out on the CPU target: device properties, a synchronous
stream and an event timed with the host clock (:mod:`.cuda_ns` builds the namespace)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import UnsupportedCudaFeature, format_error

__all__ = ["DeviceProperties"]


@dataclass
class DeviceProperties:
    """What torch.cuda.get_device_properties() returns, for the CPU target."""

    name: str
    total_memory: int
    multi_processor_count: int
    major: int = 0
    minor: int = 0
    is_integrated: bool = True
    is_multi_gpu_board: bool = False
    L2_cache_size: int = 0
    gcnArchName: str = ""
    uuid: str = "torch-adapter-cpu"
    warp_size: int = 1
    max_threads_per_multi_processor: int = 1
    regs_per_multiprocessor: int = 0


class _Stream:
    """A synchronous stream (CPU target): every op has already finished."""

    __torch_adapter_stream__ = True

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cpu")
        self.priority = priority
        self.stream_id = 0
        self.device_index = 0
        self.device_type = 0

    def wait_event(self, event: Any) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Any:
        event = event if event is not None else _Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        from .cuda_graphs import check_not_capturing

        check_not_capturing("torch.cuda.Stream.synchronize()")

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Stream)

    def __hash__(self) -> int:
        return hash("torch_adapter.cpu_stream")

    def __repr__(self) -> str:
        return "<torch_adapter CPU stream (synchronous)>"


class _Event:
    """An event with real timing on the CPU target (host clock at record time)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        self.enable_timing = enable_timing
        self._t: int | None = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter_ns()

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        from .cuda_graphs import check_not_capturing

        check_not_capturing("torch.cuda.Event.synchronize()")

    def elapsed_time(self, end_event: "_Event") -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError(format_error(
                "torch.cuda.Event.elapsed_time()", "both events created with enable_timing=True",
                "an event without timing", fix="torch.cuda.Event(enable_timing=True)"))
        if self._t is None or end_event._t is None:
            raise RuntimeError(format_error(
                "torch.cuda.Event.elapsed_time()", "both events recorded", "an unrecorded event",
                fix="call .record() on both events first"))
        return (end_event._t - self._t) / 1e6

    def ipc_handle(self) -> Any:
        raise UnsupportedCudaFeature("torch.cuda.Event.ipc_handle(): CUDA IPC handles do not exist on the CPU target")
