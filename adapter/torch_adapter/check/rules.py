"""The built-in rule table of ``torch-adapter check`` -- data only.

One dict per rule (the schema is in :mod:`.ruleset`, the table rendered in
``docs/check.md``). Order matters: on one piece of code the first matching rule wins,
so specific rules come before general ones and the catch-alls come last. Messages may use
``{target}``, ``{device}``, ``{device_type}``, ``{backend}``, ``{amp}`` and
``{dispatch_key}``; they are filled in for ``--target`` (``any``: generic wording).

This module holds the PyTorch/CUDA API rules; :mod:`.rules_ecosystem` the extensions,
third-party libraries, environment variables, C++/CUDA sources, shell/config files and the
catch-alls. ``RULES`` is both, in that order.
"""

from __future__ import annotations

from .rules_ecosystem import CATCH_ALL, ECOSYSTEM, RUNTIME_RULES

__all__ = ["RULES", "TORCH_RULES", "RUNTIME_RULES", "TARGET_AMP"]

# What autocast("cuda", float16) becomes per target (the adapter's "auto" AMP policy).
TARGET_AMP = {
    "any": "the dtype the code asks for (float16 stays float16 -- AMP policy 'auto', "
           "set with torch_adapter.configure(amp_dtype=...))",
    "cpu": "float16, the dtype the code asks for (AMP policy 'auto'; on a CPU with bf16 units "
           "torch_adapter.configure(amp_dtype='bfloat16') is faster for float32 weights)",
}

_DEV = r"^cuda(:\d+|:\{\})?$"  # "cuda", "cuda:1", f"cuda:{rank}"
_NOT_FALSE = r"^(?!False$|None$|0$)"
_AMP_DOCS = "https://pytorch.org/docs/stable/amp.html"
_CUDA_DOCS = "https://pytorch.org/docs/stable/notes/cuda.html"
_DIST_DOCS = "https://pytorch.org/docs/stable/distributed.html#backends"
_BACKENDS_DOCS = "https://pytorch.org/docs/stable/backends.html"
_MEM = ["empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
        "max_memory_reserved", "memory_cached", "max_memory_cached", "reset_peak_memory_stats",
        "reset_max_memory_allocated", "reset_max_memory_cached", "reset_accumulated_memory_stats",
        "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "memory_snapshot",
        "mem_get_info", "list_gpu_processes", "memory_usage", "utilization", "temperature",
        "power_draw", "clock_rate", "set_per_process_memory_fraction",
        "get_per_process_memory_fraction", "memory.*"]
_TENSORS = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor",
            "CharTensor", "ShortTensor", "IntTensor", "LongTensor", "BoolTensor"]

TORCH_RULES: tuple[dict, ...] = (
    # --- AMP ----------------------------------------------------------------------------
    dict(id="AMP004", title="import from torch.cuda.amp", severity="handled",
         match={"import": ["torch.cuda.amp", "torch.cuda.amp.*"]},
         message="Redirected: the names imported from torch.cuda.amp work on {target}. "
                 "The module is deprecated.",
         alternative="from torch.amp import autocast, GradScaler", docs=_AMP_DOCS),
    dict(id="AMP001", title="torch.cuda.amp.autocast (deprecated spelling)", severity="handled",
         match={"call": ["torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"]},
         message="Redirected: runs as autocast on {target} with {amp}. This spelling is "
                 "deprecated in PyTorch.",
         alternative='torch.autocast("cuda", ...) -- also redirected, and not deprecated.',
         docs=_AMP_DOCS,
         rewrite={"builtin": "rename_call", "to": "torch.autocast", "prepend": ['"cuda"']}),
    dict(id="AMP002", title="torch.cuda.amp.GradScaler (deprecated spelling)", severity="handled",
         match={"call": ["torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"]},
         message="Redirected: becomes {target}'s GradScaler (it scales float16 "
                 "gradients there as on CUDA). This spelling is deprecated.",
         alternative='torch.amp.GradScaler("cuda", ...)', docs=_AMP_DOCS,
         rewrite={"builtin": "rename_call", "to": "torch.amp.GradScaler", "prepend": ['"cuda"']}),
    dict(id="AMP003", title="torch.cuda.amp.custom_fwd / custom_bwd", severity="handled",
         match={"call": ["torch.cuda.amp.custom_fwd", "torch.cuda.amp.custom_bwd"]},
         message="Redirected: the custom autograd function casts for {target}'s autocast. "
                 "This spelling is deprecated.",
         alternative='torch.amp.custom_fwd(device_type="cuda", ...) / torch.amp.custom_bwd(device_type="cuda")',
         docs=_AMP_DOCS,
         rewrite={"builtin": "rename_call", "to": {"custom_fwd": "torch.amp.custom_fwd",
                                                   "custom_bwd": "torch.amp.custom_bwd"},
                  "add": {"device_type": '"cuda"'}}),
    dict(id="AMP005", title='torch.autocast("cuda")', severity="handled",
         match={"call": ["torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"],
                "where": [{"arg": 0, "kw": "device_type", "regex": "^cuda"}]},
         message='Redirected: autocast("cuda") becomes autocast("{device_type}") with {amp}.',
         alternative="Nothing to change; check the AMP dtype policy if you need bit-exact results.",
         docs=_AMP_DOCS),
    dict(id="AMP008", title="torch.autocast (device from a variable)", severity="handled",
         match={"call": ["torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"]},
         message="Autocast for the device given at run time: on {target} it uses {target}'s autocast "
                 "and the dtypes it supports ({amp} for CUDA-written float16).",
         alternative="Nothing to change.", docs=_AMP_DOCS),
    dict(id="AMP006", title="torch.amp.GradScaler", severity="handled",
         match={"call": ["torch.amp.GradScaler", "torch.GradScaler", "torch.amp.grad_scaler.GradScaler"]},
         message='Redirected: GradScaler (device "cuda" by default) becomes {target}\'s scaler.',
         alternative="Nothing to change.", docs=_AMP_DOCS),
    dict(id="AMP007", title="GradScaler use (scale/step/update)", severity="handled",
         match={"instance": {"classes": ["torch.cuda.amp.GradScaler", "torch.amp.GradScaler",
                                         "torch.GradScaler", "torch.amp.grad_scaler.GradScaler",
                                         "torch.cuda.amp.grad_scaler.GradScaler"],
                             "methods": ["scale", "step", "update", "unscale_", "get_scale",
                                         "is_enabled", "state_dict", "load_state_dict"]}},
         message="A GradScaler step: runs on {target} unchanged.",
         alternative="Nothing to change.", docs=_AMP_DOCS),
    # --- torch.cuda, answered for the target -------------------------------------------
    dict(id="API001", title="torch.cuda.is_available()", severity="handled",
         match={"call": ["torch.cuda.is_available"]},
         message="Answered for {target}: True while the adapter is installed, so CUDA "
                 "branches run there.",
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="API002", title="torch.cuda.device_count()", severity="handled",
         match={"call": ["torch.cuda.device_count"]},
         message="Answered for {target}: the number of {device_type} devices (on the CPU: 1, or one "
                 "per local rank under a launcher, LOCAL_WORLD_SIZE).",
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="API003", title="torch.cuda device selection and properties", severity="handled",
         match={"call": ["torch.cuda.set_device", "torch.cuda.current_device", "torch.cuda.device",
                         "torch.cuda.device_of", "torch.cuda.get_device_name",
                         "torch.cuda.get_device_properties", "torch.cuda.is_initialized",
                         "torch.cuda.init", "torch.cuda.is_bf16_supported",
                         "torch.cuda.is_tf32_supported"]},
         message="Answered for {target}: device i is {device_type} device i; names and "
                 "properties describe {target}.",
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="API004", title="torch.cuda.synchronize()", severity="handled",
         match={"call": ["torch.cuda.synchronize"]},
         message="Redirected: waits for {target}'s queued work.",
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="API005", title="torch.cuda RNG (manual_seed, rng state)", severity="handled",
         match={"call": ["torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.cuda.seed",
                         "torch.cuda.seed_all", "torch.cuda.initial_seed", "torch.cuda.get_rng_state",
                         "torch.cuda.get_rng_state_all", "torch.cuda.set_rng_state",
                         "torch.cuda.set_rng_state_all", "torch.cuda.default_generators",
                         "torch.cuda.random.*"]},
         message="Redirected: seeds or reads {target}'s generator (random streams differ "
                 "from CUDA's, so numbers differ).",
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="API013", title="CUDA-only torch.cuda features", severity="unsupported",
         match={"call": ["torch.cuda.cudart", "torch.cuda.jiterator.*", "torch.cuda._sleep",
                         "torch.cuda.nccl.*", "torch.cuda.comm.*", "torch.cuda.memory._record_memory_history",
                         "torch.cuda.memory._dump_snapshot", "torch.cuda.memory._snapshot",
                         "torch.cuda.CUDAPluggableAllocator", "torch.cuda.memory.CUDAPluggableAllocator",
                         "torch.cuda.change_current_allocator", "torch.cuda.caching_allocator_alloc",
                         "torch.cuda.caching_allocator_delete", "torch.cuda.tunable.*",
                         "torch.cuda.set_sync_debug_mode", "torch.cuda.gds.*"]},
         message="No equivalent on {target}: the adapter raises UnsupportedCudaFeature here.",
         alternative="Remove it, or run it only on real CUDA (e.g. behind a check of "
                     "torch_adapter.current().target).", docs=_CUDA_DOCS),
    dict(id="API006", title="torch.cuda memory queries and caching", severity="handled",
         match={"call": [f"torch.cuda.{n}" for n in _MEM]},
         message="Answered for {target}: figures come from {target}'s allocator (on the CPU "
                 "from the process heap and RSS -- the table in docs/redirect.md).",
         alternative="Nothing to change; do not compare these numbers with CUDA runs.",
         docs="https://pytorch.org/docs/stable/torch_cuda_memory.html"),
    dict(id="API007", title="torch.cuda streams and events", severity="handled",
         match={"call": ["torch.cuda.Stream", "torch.cuda.Event", "torch.cuda.stream",
                         "torch.cuda.current_stream", "torch.cuda.default_stream",
                         "torch.cuda.ExternalStream", "torch.cuda.set_stream", "torch.cuda.StreamContext",
                         "torch.cuda.streams.*"]},
         message="Redirected to {target}'s streams and events; Event.elapsed_time gives real times.",
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="API008", title="Event/Stream use (record, elapsed_time, wait)", severity="handled",
         match={"instance": {"classes": ["torch.cuda.Event", "torch.cuda.Stream", "torch.cuda.streams.*",
                                         "torch.cuda.current_stream", "torch.cuda.default_stream"],
                             "methods": ["record", "elapsed_time", "synchronize", "query", "wait",
                                         "wait_event", "wait_stream", "record_event"]},
                "method": ["wait_stream", "record_stream"]},
         message="Event/stream timing or ordering: runs on {target}'s events and streams.",
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="API009", title="torch.cuda.nvtx ranges", severity="handled",
         match={"call": ["torch.cuda.nvtx", "torch.cuda.nvtx.*"],
                "import": ["torch.cuda.nvtx", "torch.cuda.nvtx.*"]},
         message="NVTX ranges become no-ops on {target} (Nsight is NVIDIA's).",
         alternative="torch.profiler.record_function(name) shows ranges in traces on every target.",
         docs="https://pytorch.org/docs/stable/cuda.html#nvidia-tools-extension-nvtx"),
    dict(id="API010", title="CUDA graphs", severity="review",
         match={"call": ["torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.graphs.*",
                         "torch.cuda.make_graphed_callables", "torch.cuda.graph_pool_handle",
                         "torch.cuda.is_current_stream_capturing"],
                "instance": {"classes": ["torch.cuda.CUDAGraph", "torch.cuda.graphs.CUDAGraph"],
                             "methods": ["replay", "capture_begin", "capture_end", "reset", "pool"]}},
         message="CUDA graph capture has no equivalent on {target}: capture raises "
                 "UnsupportedCudaFeature (make_graphed_callables runs eagerly). The speed-up of "
                 "graphs is lost.",
         alternative="Guard capture so the eager path runs on other targets; on the target "
                     "use torch.compile (where supported) for launch overhead.",
         docs=_CUDA_DOCS + "#cuda-graphs"),
    dict(id="API011", title="CUDA/cuDNN version and compute capability", severity="review",
         match={"call": ["torch.cuda.get_device_capability", "torch.cuda.get_arch_list",
                         "torch.cuda.get_gencode_flags", "torch.backends.cudnn.version",
                         "torch.backends.cudnn.is_available", "torch.backends.cuda.is_built",
                         "torch._C._cuda_getCompiledVersion", "torch.cuda.is_tf32_supported"],
                "attr": ["torch.version.cuda", "torch.version.hip"],
                "triggers": ["cuda", "cudnn", "version.hip", "import hip"]},
         message="Asks about the CUDA build or the GPU generation: on {target} the answer does "
                 "not describe real hardware, so branches on it (bf16 or flash attention "
                 "only on sm80+, version checks) may take another path.",
         alternative="Branch on features instead: torch.cuda.is_bf16_supported() (answered "
                     "for the target) or a try/except around the feature.", docs=_CUDA_DOCS),
    dict(id="API012", title="torch.cuda.*Tensor legacy types", severity="handled",
         match={"attr": [f"torch.cuda.{t}" for t in _TENSORS],
                "string": r"^torch\.cuda\.\w*Tensor$", "triggers": ["cuda"]},
         message="Redirected: a legacy CUDA tensor type becomes the same dtype on {device}.",
         alternative="torch.tensor(data, dtype=torch.float32, device=device)", docs=_CUDA_DOCS),
    dict(id="API014", title="cuDNN flags (torch.backends.cudnn)", severity="handled",
         match={"attr": ["torch.backends.cudnn.*"], "import": ["torch.backends.cudnn"]},
         message="Accepted: {target} has no cuDNN, so the flag changes nothing there "
                 "(benchmark/deterministic/allow_tf32 only steer cuDNN).",
         alternative="For portable determinism: torch.use_deterministic_algorithms(True).",
         docs=_BACKENDS_DOCS + "#torch-backends-cudnn"),
    dict(id="API015", title="SDPA backend toggles (torch.backends.cuda)", severity="handled",
         match={"call": [f"torch.backends.cuda.{n}" for n in (
             "enable_flash_sdp", "enable_mem_efficient_sdp", "enable_math_sdp", "enable_cudnn_sdp",
             "flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled",
             "can_use_flash_attention", "can_use_efficient_attention", "can_use_cudnn_attention")]},
         message="These pick CUDA kernels for scaled_dot_product_attention; on {target} SDPA "
                 "uses {target}'s own kernel and the toggle has no effect.",
         alternative="Nothing to change.", docs=_BACKENDS_DOCS + "#torch-backends-cuda"),
    dict(id="API016", title="torch.backends.cuda.sdp_kernel (deprecated)", severity="review",
         match={"call": ["torch.backends.cuda.sdp_kernel"]},
         message="Deprecated context manager that restricts SDPA to CUDA kernels; on {target} "
                 "a restriction to flash/mem-efficient only leaves no kernel to run.",
         alternative="torch.nn.attention.sdpa_kernel([...]) and include SDPBackend.MATH.",
         docs="https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html"),
    dict(id="API017", title="torch.backends.cuda settings (TF32, linalg, cuFFT)", severity="handled",
         match={"attr": ["torch.backends.cuda", "torch.backends.cuda.*"],
                "import": ["torch.backends.cuda"]},
         message="Accepted: a CUDA library setting that changes nothing on {target}.",
         alternative="Nothing to change.", docs=_BACKENDS_DOCS + "#torch-backends-cuda"),
    dict(id="API018", title="CUDA-only SDPA backends", severity="handled",
         match={"attr": [f"torch.nn.attention.SDPBackend.{b}" for b in (
             "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")]},
         message="These SDPA backends exist only on CUDA: under the adapter sdpa_kernel keeps "
                 "MATH enabled, so {target} runs the math kernel (slower than flash attention).",
         alternative="Nothing to change; without the adapter add SDPBackend.MATH to the list.",
         docs="https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html"),
    dict(id="API019", title="TF32 matmul precision", severity="handled",
         match={"call": ["torch.set_float32_matmul_precision"]},
         message="TF32 is an NVIDIA feature: the setting is kept, and on {target} it may "
                 "change nothing (or select bf16-based kernels on the CPU).",
         alternative="Nothing to change.",
         docs="https://pytorch.org/docs/stable/generated/torch.set_float32_matmul_precision.html"),
    dict(id="API020", title="Profiler CUDA activity", severity="handled",
         match={"attr": ["torch.profiler.ProfilerActivity.CUDA", "torch.autograd.ProfilerActivity.CUDA",
                         "torch._C._profiler.ProfilerActivity.CUDA"],
                "keyword": {"use_cuda": _NOT_FALSE}},
         message="Redirected: profiles {target}'s device activity instead of CUDA's.",
         alternative="ProfilerActivity matching the device, e.g. via torch_adapter.profiler.",
         docs="https://pytorch.org/docs/stable/profiler.html"),
    dict(id="API021", title="Profiler CUDA time columns", severity="review",
         match={"string": r"\b(self_)?cuda_(time|memory_usage)(_total)?\b",
                "attr_name": ["cuda_time", "cuda_time_total", "self_cuda_time_total",
                              "cuda_memory_usage", "self_cuda_memory_usage"],
                "triggers": ["cuda_"]},
         message="There are no CUDA timings on {target}: this column is empty or missing there.",
         alternative='Use "device_time_total" / "self_device_time_total" (any device) or the CPU columns.',
         docs="https://pytorch.org/docs/stable/profiler.html"),
    # --- device moves ------------------------------------------------------------------
    dict(id="DEV001", title=".cuda()", severity="handled",
         match={"method": ["cuda"]},
         message='Redirected: .cuda() becomes .to("{device}") (.cuda(i): {device_type} device i).',
         alternative="Portable without the adapter: .to(device) with one device chosen at start-up.",
         docs=_CUDA_DOCS),
    dict(id="DEV002", title='.to("cuda")', severity="handled",
         match={"triggers": ["cuda"], "method": ["to", "to_empty"], "where": [{"arg": 0, "kw": "device", "regex": _DEV}]},
         message='Redirected: .to("cuda") becomes .to("{device}").',
         alternative="Portable without the adapter: .to(device).", docs=_CUDA_DOCS),
    dict(id="DEV003", title='torch.device("cuda")', severity="handled",
         match={"triggers": ["cuda"], "call": ["torch.device"], "where": [{"arg": 0, "kw": "type", "regex": "^cuda"}]},
         message='Redirected: torch calls that receive this device use "{device}".',
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="DEV004", title='device="cuda" arguments', severity="handled", secondary=True,
         match={"triggers": ["cuda"], "keyword": {"device": _DEV, "map_location": _DEV, "pin_memory_device": _DEV,
                            "device_type": "^cuda$", "location": _DEV}},
         message='Redirected: device="cuda" becomes device="{device}" in torch factories, '
                 "torch.load(map_location=...) and DataLoader.",
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="DEV005", title="pin_memory", severity="handled",
         match={"keyword": {"pin_memory": _NOT_FALSE}, "method": ["pin_memory"]},
         message="Pinned host memory is a CUDA transfer feature: redirected to {target} "
                 "(a no-op on the CPU).",
         alternative="Nothing to change.",
         docs="https://pytorch.org/docs/stable/data.html#memory-pinning"),
    dict(id="DEV006", title="non_blocking copies", severity="handled",
         match={"keyword": {"non_blocking": _NOT_FALSE}},
         message="Asynchronous host-device copies: kept where {target} supports them, "
                 "synchronous otherwise; results are the same.",
         alternative="Nothing to change.", docs=_CUDA_DOCS),
    dict(id="DEV007", title="nn.DataParallel", severity="handled",
         match={"call": ["torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                         "torch.nn.parallel.data_parallel.DataParallel", "torch.nn.parallel.data_parallel"]},
         message="Redirected: replicas go to {target} devices (with one device the module "
                 "runs directly).",
         alternative="DistributedDataParallel scales better on every target.",
         docs="https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html"),
    dict(id="DEV008", title="device_ids / output_device", severity="handled",
         match={"keyword": {"device_ids": "", "output_device": ""}},
         message="Redirected: device indices name {device_type} devices (DDP, DataParallel, "
                 "barrier).",
         alternative="Nothing to change.",
         docs="https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"),
    dict(id="DEV009", title="x.is_cuda branch", severity="review",
         match={"attr_name": ["is_cuda"]},
         message="A branch on is_cuda: is_cuda stays truthful under the adapter, so a tensor "
                 "on {target} says False and the non-CUDA branch runs.",
         alternative='Test x.device.type != "cpu", or compare with the device you selected.',
         docs=_CUDA_DOCS),
    dict(id="DEV010", title='comparison with "cuda"', severity="review",
         match={"compare": r"(?i)^cuda(:\d+)?$", "method": ["startswith", "endswith"],
                "where": [{"arg": 0, "regex": "^cuda"}], "triggers": ["cuda"]},
         message='A test against "cuda": tensors live on {device_type} under the adapter, so '
                 'x.device.type == "cuda" is False there and the other branch runs; a '
                 'config value still reads "cuda".',
         alternative='Compare with the device you selected (x.device == device) or test '
                     'x.device.type != "cpu".', docs=_CUDA_DOCS),
    dict(id="DEV011", title='a "cuda" device string', severity="handled", secondary=True,
         match={"string": _DEV, "triggers": ["cuda"]},
         message='Where it reaches torch as a device it becomes "{device}"; compared, '
                 'printed or stored it stays "cuda".',
         alternative="Nothing to change; look at comparisons of it (rule DEV010).", docs=_CUDA_DOCS),
    # --- distributed ---------------------------------------------------------------------
    dict(id="DIST001", title='init_process_group("nccl")', severity="handled",
         match={"triggers": ["nccl"], "call": ["torch.distributed.init_process_group", "torch.distributed.new_group",
                         "torch.distributed.new_subgroups", "torch.distributed.new_subgroups_by_enumeration",
                         "torch.distributed.distributed_c10d.init_process_group"],
                "where": [{"arg": 0, "kw": "backend", "regex": "(?i)nccl"}]},
         message='Redirected: "nccl" becomes "{backend}".',
         alternative="Nothing to change.", docs=_DIST_DOCS),
    dict(id="DIST002", title='backend="nccl"', severity="handled", secondary=True,
         match={"triggers": ["nccl"], "keyword": {"backend": "(?i)nccl", "dist_backend": "(?i)nccl",
                            "ddp_backend": "(?i)nccl"}},
         message='Redirected where it reaches torch.distributed: "nccl" becomes "{backend}".',
         alternative="Nothing to change.", docs=_DIST_DOCS),
    dict(id="DIST003", title='comparison with "nccl"', severity="review",
         match={"compare": r"(?i)^(cuda:)?nccl$", "triggers": ["nccl"]},
         message='A test against "nccl": dist.get_backend() answers "{backend}" on {target}, '
                 "so this branch changes.",
         alternative="Branch on what you need (e.g. device type), not on the backend name.",
         docs=_DIST_DOCS),
    dict(id="DIST004", title="NCCL availability / ProcessGroupNCCL", severity="review",
         match={"call": ["torch.distributed.is_nccl_available", "torch.distributed.Backend.NCCL",
                         "torch.distributed.ProcessGroupNCCL", "torch._C._distributed_c10d.ProcessGroupNCCL"]},
         message="Asks about NCCL itself: on {target} the collective backend is {backend}.",
         alternative="torch.distributed.is_backend_available(...) for the backend you use.",
         docs=_DIST_DOCS),
    dict(id="DIST005", title='"nccl" string', severity="handled", secondary=True,
         match={"string": r"(?i)^(cuda:)?nccl(,.*)?$", "triggers": ["nccl"]},
         message='Where it reaches torch.distributed, "nccl" becomes "{backend}".',
         alternative="Nothing to change.", docs=_DIST_DOCS),
    dict(id="DIST006", title="SyncBatchNorm", severity="review",
         severity_by_target={"cpu": "unsupported", "mps": "unsupported", "cuda": "handled",
                             "npu": "handled", "xpu": "handled"},
         match={"call": ["torch.nn.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm"]},
         message="SyncBatchNorm synchronises only on cuda, xpu, hpu and the PrivateUse1 backend "
                 "(npu): in distributed training on {target} other devices raise ValueError.",
         alternative="Plain BatchNorm on cpu/mps (convert only when the device supports it).",
         docs="https://pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html"),
    # --- numerics, compilers -----------------------------------------------------------
    dict(id="NUM001", title="float64 on mps", severity="review", targets=["mps"],
         severity_by_target={"mps": "unsupported"},
         match={"attr": ["torch.float64", "torch.double", "torch.complex128", "torch.cdouble"],
                "method": ["double"]},
         message="float64 on mps: Apple's MPS has no 64-bit floats, so creating or computing "
                 "this on mps fails (other targets are fine).",
         alternative="float32 (.float(), dtype=torch.float32); keep float64 work on the CPU explicitly.",
         docs="https://pytorch.org/docs/stable/notes/mps.html"),
    dict(id="JIT001", title="torch.jit.script", severity="review",
         match={"triggers": ["jit"], "call": ["torch.jit.script", "torch.jit.script_method", "torch.jit.script_if_tracing"]},
         message="TorchScript runs on {target} under the adapter: scripted and traced code calls torch's "
                 "factories as builtins, and device=\"cuda\", .to(\"cuda\") and .cuda() inside graphs are "
                 "rewritten to {target} when the code is compiled, loaded or moved while installed; a function "
                 "that already ran before install keeps CUDA. Its CUDA fusers (nvFuser) do not run on {target}, "
                 "and TorchScript is deprecated (maintenance mode): test the scripted path on {target}.",
         alternative="Eager mode, or torch.compile where the target supports it.",
         docs="https://pytorch.org/docs/stable/jit.html"),
    dict(id="JIT002", title="TorchScript GPU fuser switches", severity="review",
         match={"triggers": ["jit"], "call": ["torch.jit.fuser", "torch._C._jit_set_nvfuser_enabled",
                         "torch._C._jit_override_can_fuse_on_gpu", "torch._C._jit_set_texpr_fuser_enabled",
                         "torch._C._jit_set_profiling_executor"]},
         message="A TorchScript GPU fuser switch: no effect (or an error) on {target}.",
         alternative="Remove it.", docs="https://pytorch.org/docs/stable/jit.html"),
    dict(id="JIT003", title="torch.compile with CUDA-graph modes", severity="review",
         match={"call": ["torch.compile"],
                "where": [{"kw": "mode", "regex": "reduce-overhead|max-autotune"}],
                "triggers": ["torch.compile"]},
         message="mode=reduce-overhead/max-autotune relies on CUDA graphs and Triton "
                 "autotuning; on {target} they are skipped or unsupported: no gain, possibly errors.",
         alternative='The default mode, or backend="aot_eager" where inductor lacks the target.',
         docs="https://pytorch.org/docs/stable/generated/torch.compile.html"),
    dict(id="JIT004", title="torch.compile", severity="review",
         severity_by_target={"cpu": "handled", "cuda": "handled"},
         match={"call": ["torch.compile"], "triggers": ["torch.compile"]},
         message="Inductor generates Triton kernels for CUDA; on {target} it needs that "
                 "target's inductor backend -- check that it compiles there.",
         alternative='backend="aot_eager" (no codegen) where inductor does not support the target.',
         docs="https://pytorch.org/docs/stable/generated/torch.compile.html"),
    dict(id="JIT005", title="torch.jit.load", severity="handled",
         match={"triggers": ["jit"], "call": ["torch.jit.load"]},
         message="torch.jit.load is redirected: map_location=\"cuda\" / \"cuda:N\" / torch.device(\"cuda\") / "
                 "an int, and an archive saved on CUDA loaded without map_location, land on {target}; CUDA "
                 "device constants in the archive's code are rewritten to {target}.",
         alternative='Nothing to change under the adapter; without it, torch.jit.load(path, map_location="cpu") '
                     "(or the target device), or torch.export / state_dict checkpoints.",
         docs="https://pytorch.org/docs/stable/generated/torch.jit.load.html"),
    dict(id="EIN001", title="torch.einsum", severity="review",
         match={"call": ["torch.einsum", "torch.functional.einsum"]},
         message="einsum is lowered to permute/reshape/bmm; some targets lack or slowly run "
                 "some forms (Ascend NPU in particular), and a form is hard to review. When "
                 "an explicit equivalent exists it is given as a rewrite.",
         alternative="The explicit tensor expression (product+sum, matmul, outer, transpose).",
         docs="https://pytorch.org/docs/stable/generated/torch.einsum.html",
         rewrite={"builtin": "einsum"}),
)

RULES: tuple[dict, ...] = TORCH_RULES + ECOSYSTEM + CATCH_ALL
