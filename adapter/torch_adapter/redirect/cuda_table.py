"""The decision for every name in ``torch.cuda.__all__`` (data; :mod:`.cuda_ns` is the mechanism).

Each row: how the name is answered on a target without CUDA, and what it does on the CPU
target. ``docs/cuda-namespace.md`` embeds :func:`table_markdown` (a test keeps it in sync):
regenerate with ``python -m torch_adapter.redirect.cuda_table > docs/cuda-namespace.md``.
"""

from __future__ import annotations

__all__ = ["TABLE", "table_markdown", "A", "E", "U", "K"]

A, E, U, K = "answered", "eager fallback", "unsupported (clear error)", "unchanged"
# name -> (how, what it does on the CPU target)
TABLE: dict[str, tuple[str, str]] = {
    **{n: (A, "a tensor of that dtype on the target (legacy constructor)")
       for n in ("BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor",
                 "HalfTensor", "IntTensor", "LongTensor", "ShortTensor")},
    **{n: (A, "the target's typed storage of that dtype")
       for n in ("BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage", "ComplexDoubleStorage",
                 "ComplexFloatStorage", "DoubleStorage", "FloatStorage", "HalfStorage", "IntStorage",
                 "LongStorage", "ShortStorage")},
    "CUDAGraph": (A, "emulated: capture records the aten ops, replay() re-runs them on the same (static) "
                     "tensors; host syncs and data-dependent shapes in a capture raise as on CUDA; "
                     "torch.<target>'s own graph class where the target has one"),
    "graph": (A, "context manager capturing into the emulated CUDAGraph (pool, stream, capture_error_mode)"),
    "graph_pool_handle": (A, "an opaque pool token"),
    "make_graphed_callables": (A, "torch's own, over the emulated CUDAGraph: forward and backward replayed"),
    "is_current_stream_capturing": (A, "True inside an emulated capture on this thread, else False"),
    "graphs": (K, "module; its names as above"),
    "CudaError": (K, "exception class"), "DeferredCudaCallError": (K, "exception class"),
    "Event": (A, "an event with real elapsed_time() (host clock; the CPU runs ops synchronously)"),
    "Stream": (A, "a synchronous stream: wait/record/query/synchronize work, nothing is queued"),
    "StreamContext": (A, "context manager selecting a Stream"),
    "ExternalStream": (U, "wraps a cudaStream_t pointer"), "GreenContext": (U, "CUDA green contexts"),
    "get_stream_from_external": (U, "wraps a cudaStream_t pointer"),
    "amp": (A, "autocast/GradScaler/custom_fwd/custom_bwd map 'cuda' to the target (AMP dtype policy)"),
    "caching_allocator_alloc": (U, "raw CUDA caching-allocator blocks"),
    "caching_allocator_delete": (U, "raw CUDA caching-allocator blocks"),
    "caching_allocator_enable": (A, "accepted; no caching allocator on the CPU"),
    "caching_allocator_disabled": (A, "accepted; no caching allocator on the CPU"),
    "CUDAPluggableAllocator": (U, "loads a CUDA allocator .so"),
    "change_current_allocator": (U, "installs a CUDA allocator"),
    "MemPool": (U, "CUDA memory pools"), "use_mem_pool": (U, "CUDA memory pools"),
    "get_allocator_backend": (A, "'native'"),
    "can_device_access_peer": (A, "False"), "check_error": (A, "no-op for 0, error otherwise"),
    "cudaStatus": (K, "constants"), "cudart": (U, "the CUDA runtime library"),
    "current_blas_handle": (U, "cuBLAS handle"), "current_solver_handle": (U, "cuSOLVER handle"),
    "current_device": (A, "the logical index last set (0)"),
    "set_device": (A, "records the logical index; all indices are the one CPU"),
    "device": (A, "context manager over the logical index"), "device_of": (A, "context manager"),
    "device_count": (A, "1 on the CPU target (under a launcher: one per local rank, LOCAL_WORLD_SIZE; `device_count=N` / `run --device-count N` sets it); the target's count elsewhere"),
    "current_stream": (A, "the target's current stream"), "default_stream": (A, "the default stream"),
    "set_stream": (A, "sets the current stream"), "stream": (A, "context manager"),
    "synchronize": (A, "the target's synchronize (no-op on the CPU)"),
    "streams": (K, "module"),
    "device_memory_used": (A, "resident set size of this process"),
    "empty_cache": (A, "malloc_trim: freed heap pages go back to the OS"),
    "get_arch_list": (A, "[] (no CUDA architectures)"), "get_gencode_flags": (A, "''"),
    "get_device_capability": (A, "(0, 0): not a CUDA device; code gated on >= (7, 0) takes its safe path"),
    "get_device_name": (A, "'CPU (<processor>) via torch_adapter'"),
    "get_device_properties": (A, "name, total_memory (RAM), multi_processor_count (cores), major/minor 0"),
    "get_per_process_memory_fraction": (A, "the value last set (1.0)"),
    "set_per_process_memory_fraction": (A, "recorded; not enforced on the CPU"),
    "get_rng_state": (A, "the CPU generator's state"), "get_rng_state_all": (A, "[that state]"),
    "set_rng_state": (A, "sets the CPU generator's state"), "set_rng_state_all": (A, "as set_rng_state"),
    "manual_seed": (A, "seeds the CPU generator (the one 'cuda' randomness now uses)"),
    "manual_seed_all": (A, "as manual_seed"), "seed": (A, "random seed for the CPU generator"),
    "seed_all": (A, "as seed"), "initial_seed": (A, "the CPU generator's initial seed"),
    "default_generators": (A, "(torch.default_generator,)"), "random": (K, "module"),
    "get_sync_debug_mode": (A, "0"), "set_sync_debug_mode": (A, "accepted"),
    "has_half": (A, "True"), "has_magma": (A, "False"),
    "host_memory_stats": (A, "{} (no pinned-host allocator)"),
    "host_memory_stats_as_nested_dict": (A, "{}"),
    "reset_accumulated_host_memory_stats": (A, "no-op"), "reset_peak_host_memory_stats": (A, "no-op"),
    "init": (A, "the target's torch.<device>.init (the CPU: no-op)"),
    "is_initialized": (A, "the target's torch.<device>.is_initialized (the CPU: True)"), "ipc_collect": (A, "no-op"),
    "is_available": (A, "True: CUDA-written code takes its CUDA path, redirected"),
    "is_bf16_supported": (A, "True"), "is_tf32_supported": (A, "False"),
    "jiterator": (U, "module kept whole; _create_jit_fn builds as on CUDA, calling what it builds raises (it compiles CUDA C++ at run time)"),
    "list_gpu_processes": (A, "a text naming the CPU target and this process"),
    "memory": (K, "module; its functions answered as below"),
    "memory_allocated": (A, "bytes in use on the heap (mallinfo2)"),
    "max_memory_allocated": (A, "peak since the last reset, from the kernel's high-water mark (VmHWM); "
                                "raises 'not tracked' where there is none"),
    "memory_reserved": (A, "resident set size"), "max_memory_reserved": (A, "peak RSS (VmHWM)"),
    "memory_cached": (A, "as memory_reserved"), "max_memory_cached": (A, "as max_memory_reserved"),
    "reset_peak_memory_stats": (A, "resets both peaks (clear_refs)"),
    "reset_max_memory_allocated": (A, "as reset_peak_memory_stats"),
    "reset_max_memory_cached": (A, "as reset_peak_memory_stats"),
    "reset_accumulated_memory_stats": (A, "no-op"),
    "mem_get_info": (A, "(MemAvailable, MemTotal)"),
    "memory_stats": (A, "CUDA's keys for current/peak allocated/reserved, from the process"),
    "memory_stats_as_nested_dict": (A, "as memory_stats, nested"),
    "memory_summary": (A, "a text table of the above"), "memory_snapshot": (A, "[] (no segments)"),
    "memory_usage": (A, "0 (no device utilisation counter)"),
    "utilization": (A, "0"), "temperature": (U, "NVML sensor"), "power_draw": (U, "NVML sensor"),
    "clock_rate": (U, "NVML sensor"),
    "nccl": (K, "module; use torch.distributed, whose 'nccl' is redirected"),
    "nvtx": (A, "range/range_push/range_pop/mark become torch.profiler.record_function ranges"),
    "profiler": (A, "start/stop/profile: no-ops (use torch.profiler)"),
    "sparse": (K, "module"), "tunable": (K, "module (TunableOp is CUDA/ROCm-only; calls are inert)"),
}



_FIXES = {
    "temperature": "read sensors with the vendor's tool (npu-smi, xpu-smi), or skip monitoring",
    "power_draw": "read sensors with the vendor's tool, or skip monitoring",
    "clock_rate": "read sensors with the vendor's tool, or skip monitoring",
    "jiterator": "write the op in PyTorch, or register a kernel with torch.library.custom_op",
}


def table_markdown() -> str:
    """The TABLE as a Markdown table (docs/cuda-namespace.md embeds it verbatim)."""
    lines = ["| name | on a target without CUDA | what it does (CPU target) |", "|---|---|---|"]
    for name in sorted(TABLE, key=str.lower):
        how, what = TABLE[name]
        lines.append(f"| `torch.cuda.{name}` | {how} | {what} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m torch_adapter.redirect.cuda_table > docs/cuda-namespace.md
    print("# `torch.cuda` on other targets\n")
    print("Every name in `torch.cuda.__all__` (torch 2.13) and how torch_adapter answers it while installed on a")
    print("target without CUDA. On npu/xpu/mps a stand-in delegates to `torch.<target>` when that module has the")
    print("same function; the right-hand column describes the CPU target. *unsupported* names raise")
    print("`torch_adapter.errors.UnsupportedCudaFeature` with the reason and what to use instead. *unchanged* names")
    print("are modules or exception classes that need no stand-in. Every stand-in takes the parameters of the")
    print("function it stands for, by the same names, kinds and defaults (`torch.cuda.stream(stream=s)`,")
    print("`Event(external=...)`; an unsupported name raises its reason for any call and shows the original's")
    print("signature): `tests/test_signatures.py` calls each one with all its parameters by keyword.")
    print("A test keeps this page in sync.\n")
    print(table_markdown())
    from .cuda_bindings import bindings_markdown

    print(bindings_markdown())
    from .accelerator import accelerator_markdown
    from .cuda_graphs import DOC_MARKDOWN

    print(DOC_MARKDOWN)

    print(accelerator_markdown(), end="")
