"""Built-in rules, part two -- data only: custom CUDA extensions, CUDA-only third-party
libraries, environment variables, C++/CUDA sources, shell/config files, and the catch-alls that make sure every
remaining mention of CUDA is reported. See :mod:`.rules` for the format and ordering.
"""

from __future__ import annotations

__all__ = ["ECOSYSTEM", "CATCH_ALL", "RUNTIME_RULES"]

_SDPA = "https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html"
_EXT = "https://pytorch.org/docs/stable/cpp_extension.html"
_CUSTOM_OPS = "https://pytorch.org/tutorials/advanced/custom_ops_landing_page.html"
_AMP = "https://pytorch.org/docs/stable/amp.html"
_NOT_FALSE = r"^(?!False$|None$|0$)"
_CUDA_NOTES = "https://pytorch.org/docs/stable/notes/cuda.html"
_DIST = "https://pytorch.org/docs/stable/distributed.html#backends"
_PORT_KERNEL = ("Port the kernel to the target (Ascend C / torch_npu custom ops on npu, SYCL on "
                "xpu, Metal on mps) or keep a PyTorch reference implementation registered for "
                "{dispatch_key} (torch.library, or torch_adapter.register_fallback).")
_CUDA_LIBS = ["numba.cuda", "pycuda", "cuda.cudart", "cuda.bindings", "cuda.cuda", "cudf", "cuml",
              "tensorrt", "torch_tensorrt", "nvidia.dali", "transformer_engine", "mamba_ssm",
              "causal_conv1d", "liger_kernel", "flashinfer", "cutlass", "apex_C", "amp_C",
              "fused_layer_norm_cuda", "spconv", "pytorch3d._C"]

ECOSYSTEM: tuple[dict, ...] = (
    # --- custom CUDA extensions ----------------------------------------------------------
    dict(id="EXT001", title="CUDAExtension", severity="unsupported",
         match={"call": ["torch.utils.cpp_extension.CUDAExtension"],
                "import": ["torch.utils.cpp_extension.CUDAExtension"]},
         message="A custom CUDA extension: its kernels are compiled with nvcc for NVIDIA GPUs "
                 "and cannot run on {target}.",
         alternative="CppExtension for a CPU build; " + _PORT_KERNEL, docs=_EXT),
    dict(id="EXT002", title="load_inline(cuda_sources=...) / nvcc flags", severity="unsupported",
         match={"keyword": {"cuda_sources": "", "extra_cuda_cflags": "", "with_cuda": _NOT_FALSE}},
         message="Compiles CUDA code at run time with nvcc: there is no nvcc/CUDA on {target}.",
         alternative="load_inline(cpp_sources=...) with a CPU implementation; " + _PORT_KERNEL,
         docs=_EXT),
    dict(id="EXT003", title=".cu source files", severity="unsupported",
         match={"string": r"\.(cu|cuh)$", "triggers": ['.cu"', ".cu'", ".cuh"]},
         message="A CUDA source file is compiled here: it needs nvcc and an NVIDIA GPU, "
                 "neither of which {target} has.",
         alternative=_PORT_KERNEL, docs=_EXT),
    dict(id="EXT004", title="CUDA_HOME (cpp_extension)", severity="review",
         match={"attr": ["torch.utils.cpp_extension.CUDA_HOME"],
                "import": ["torch.utils.cpp_extension.CUDA_HOME"]},
         message="The CUDA toolkit location: None on {target} machines, so builds that need "
                 "it stop.", alternative=_PORT_KERNEL, docs=_EXT),
    dict(id="EXT005", title="op kernels registered for CUDA only", severity="review",
         match={"triggers": ["cuda"], "call": ["torch.library.impl", "torch.library.register_kernel", "torch.library.custom_op"],
                "method": ["impl", "register_kernel"],
                "where": [{"arg": 1, "kw": "device_types", "regex": "(?i)cuda"}],
                "keyword": {"device_types": "(?i)cuda", "dispatch_key": "(?i)cuda"}},
         message="A kernel registered for the CUDA dispatch key is never called on {target} "
                 "({dispatch_key}): the op has no kernel there, or falls back.",
         alternative='Register the implementation for {dispatch_key} too, or for '
                     '"CompositeExplicitAutograd" when it is written in PyTorch ops.',
         docs=_CUSTOM_OPS),
    # --- attention kernels ---------------------------------------------------------------
    dict(id="LIB001", title="flash-attn", severity="unsupported", severity_by_target={"cuda": "handled"},
         match={"import": ["flash_attn", "flash_attn.*", "flash_attn_interface", "flash_attn_2_cuda"],
                "call": ["flash_attn.*", "flash_attn_interface.*"]},
         message="flash-attn is a CUDA-only kernel library: importing it fails on {target}.",
         alternative="torch.nn.functional.scaled_dot_product_attention (SDPA) runs on every "
                     "target; mind the layout -- flash-attn takes (batch, seq, heads, dim), "
                     "SDPA (batch, heads, seq, dim).",
         docs=_SDPA, rewrite={"builtin": "sdpa"}),
    dict(id="LIB002", title="xformers", severity="unsupported", severity_by_target={"cuda": "handled"},
         match={"import": ["xformers", "xformers.*"], "call": ["xformers.*"]},
         message="xFormers' memory-efficient attention is a CUDA kernel: not available on {target}.",
         alternative="torch.nn.functional.scaled_dot_product_attention (SDPA); xFormers takes "
                     "(batch, seq, heads, dim), SDPA (batch, heads, seq, dim).",
         docs=_SDPA, rewrite={"builtin": "sdpa"}),
    # --- NVIDIA apex ---------------------------------------------------------------------
    dict(id="LIB003", title="apex.amp", severity="unsupported", severity_by_target={"cuda": "review"},
         match={"import": ["apex.amp", "apex.amp.*"], "call": ["apex.amp.*"]},
         message="apex.amp (NVIDIA's old AMP) is CUDA-only and deprecated: it does not "
                 "import on {target}.",
         alternative="torch.autocast(\"cuda\") + torch.amp.GradScaler(\"cuda\") -- both redirected: "
                     "drop amp.initialize(...); replace `with amp.scale_loss(loss, opt) as s: "
                     "s.backward()` by scaler.scale(loss).backward(); scaler.step(opt); scaler.update().",
         docs=_AMP),
    dict(id="LIB004", title="apex fused optimizers", severity="unsupported",
         severity_by_target={"cuda": "review"},
         match={"call": ["apex.optimizers.*"], "import": ["apex.optimizers", "apex.optimizers.*"]},
         message="apex's fused optimizers are CUDA kernels: not available on {target}.",
         alternative="torch.optim.AdamW(..., fused=True) (fused on cuda/cpu/mps/xpu; drop "
                     "fused= elsewhere); torch.optim.SGD / Adam for the others.",
         docs="https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html",
         rewrite={"builtin": "fused_optimizer"}),
    dict(id="LIB005", title="apex fused normalization / parallel", severity="unsupported",
         severity_by_target={"cuda": "review"},
         match={"call": ["apex.normalization.*", "apex.parallel.*", "apex.contrib.*", "apex.transformer.*"],
                "import": ["apex.normalization", "apex.normalization.*", "apex.parallel",
                           "apex.parallel.*", "apex.contrib.*", "apex.transformer.*"]},
         message="apex's fused layers and parallel helpers are CUDA-only: not available on {target}.",
         alternative="torch.nn.LayerNorm / torch.nn.RMSNorm, torch.nn.SyncBatchNorm, "
                     "torch.nn.parallel.DistributedDataParallel.",
         docs="https://pytorch.org/docs/stable/generated/torch.nn.RMSNorm.html",
         rewrite={"builtin": "rename_call", "to": {
             "FusedLayerNorm": "torch.nn.LayerNorm", "MixedFusedLayerNorm": "torch.nn.LayerNorm",
             "FusedRMSNorm": "torch.nn.RMSNorm", "MixedFusedRMSNorm": "torch.nn.RMSNorm",
             "DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
             "SyncBatchNorm": "torch.nn.SyncBatchNorm",
             "convert_syncbn_model": "torch.nn.SyncBatchNorm.convert_sync_batchnorm"},
             "drop": ["delay_allreduce", "memory_efficient"]}),
    dict(id="LIB006", title="apex", severity="unsupported", severity_by_target={"cuda": "review"},
         match={"import": ["apex", "apex.*"], "call": ["apex.*"]},
         message="NVIDIA apex is built for CUDA only: it does not import on {target}.",
         alternative="Its features are in PyTorch now: torch.amp, torch.optim(fused=True), "
                     "torch.nn.LayerNorm/RMSNorm, DistributedDataParallel.", docs=_AMP),
    # --- quantization, array libraries, NVML, Triton ---------------------------------------
    dict(id="LIB007", title="bitsandbytes", severity="unsupported", severity_by_target={"cuda": "handled"},
         match={"import": ["bitsandbytes", "bitsandbytes.*"], "call": ["bitsandbytes.*"]},
         message="bitsandbytes' 8-bit/4-bit kernels are CUDA-first: missing or partial on {target}.",
         alternative="8-bit optimizers: torch.optim.AdamW; quantized layers: load in "
                     "bfloat16/float16, or a quantization backend the target supports (torchao).",
         docs="https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html",
         rewrite={"builtin": "rename_call", "to": {
             "Adam8bit": "torch.optim.Adam", "AdamW8bit": "torch.optim.AdamW",
             "PagedAdamW8bit": "torch.optim.AdamW", "PagedAdamW": "torch.optim.AdamW",
             "PagedAdamW32bit": "torch.optim.AdamW", "AdamW32bit": "torch.optim.AdamW",
             "SGD8bit": "torch.optim.SGD"},
             "drop": ["optim_bits", "min_8bit_size", "percentile_clipping", "block_wise", "is_paged", "args"]}),
    dict(id="LIB008", title="bitsandbytes quantized loading", severity="unsupported",
         severity_by_target={"cuda": "handled"},
         match={"triggers": ["load_in_8bit", "load_in_4bit", "bnb_4bit", "bitsandbytesconfig"],
                "keyword": {"load_in_8bit": _NOT_FALSE, "load_in_4bit": _NOT_FALSE,
                            "bnb_4bit_compute_dtype": "", "bnb_4bit_quant_type": "",
                            "bnb_4bit_use_double_quant": ""},
                "call": ["transformers.BitsAndBytesConfig", "transformers.utils.quantization_config.BitsAndBytesConfig"],
                "import": ["transformers.BitsAndBytesConfig"]},
         message="8-bit/4-bit loading goes through bitsandbytes' CUDA kernels: not on {target}.",
         alternative="torch_dtype=torch.bfloat16 (or float16), or a quantization backend the "
                     "target supports.", docs="https://huggingface.co/docs/transformers/quantization/overview"),
    dict(id="LIB009", title="CuPy", severity="unsupported", severity_by_target={"cuda": "handled"},
         match={"import": ["cupy", "cupy.*", "cupyx", "cupyx.*"], "call": ["cupy.*", "cupyx.*"]},
         message="CuPy arrays live on NVIDIA GPUs: nothing of it runs on {target}.",
         alternative="torch tensors (most of NumPy's API) on the device, or NumPy on the host; "
                     "exchange with DLPack (torch.from_dlpack).",
         docs="https://pytorch.org/docs/stable/dlpack.html"),
    dict(id="LIB010", title="NVML (pynvml, GPUtil, gpustat)", severity="unsupported",
         severity_by_target={"cuda": "handled"},
         match={"import": ["pynvml", "pynvml.*", "nvidia_smi", "py3nvml", "py3nvml.*", "GPUtil",
                           "gpustat", "gpustat.*", "nvitop", "nvitop.*"],
                "call": ["pynvml.*", "nvidia_smi.*", "py3nvml.*", "GPUtil.*", "gpustat.*", "nvitop.*"]},
         message="NVML, NVIDIA's management library, is absent on {target} machines: "
                 "nvmlInit() raises.",
         alternative="torch.cuda.mem_get_info()/memory_allocated() (answered for the target by "
                     "the adapter); psutil for host memory.",
         docs="https://pytorch.org/docs/stable/generated/torch.cuda.mem_get_info.html"),
    dict(id="LIB011", title="Triton kernels", severity="unsupported",
         severity_by_target={"cuda": "handled", "xpu": "review"},
         match={"decorator": ["triton.jit", "triton.autotune", "triton.heuristics"], "launch": True,
                "import": ["triton", "triton.*"], "call": ["triton.*"]},
         message="A Triton kernel: Triton compiles for NVIDIA and AMD GPUs (and Intel XPU); "
                 "on {target} it cannot run.",
         alternative="Keep an eager PyTorch reference implementation and use it off CUDA "
                     "(e.g. torch.library: the Triton kernel for cuda, the reference for "
                     "{dispatch_key}).", docs=_CUSTOM_OPS),
    dict(id="LIB012", title="other CUDA-only libraries", severity="unsupported",
         severity_by_target={"cuda": "handled"},
         match={"import": _CUDA_LIBS + [f"{m}.*" for m in _CUDA_LIBS] + ["cuda"],
                "call": [f"{m}.*" for m in _CUDA_LIBS] + _CUDA_LIBS},
         message="A CUDA-only library (Numba CUDA, PyCUDA, cuda-python, RAPIDS, TensorRT, "
                 "Transformer Engine, DALI, CUDA kernel packages): not available on {target}.",
         alternative="PyTorch ops on the device, or the target's own toolkit.", docs=_CUSTOM_OPS),
    dict(id="LIB014", title='Lightning accelerator="gpu" / gpus=', severity="review",
         severity_by_target={"cuda": "handled"},
         match={"keyword": {"accelerator": "(?i)^(gpu|cuda)$", "gpus": ""},
                "triggers": ['"gpu"', "'gpu'", "gpus="]},
         message='PyTorch Lightning picks its own accelerator: "gpu" means CUDA (or MPS), and the '
                 "adapter does not change Lightning's choice, so on {target} it fails or runs elsewhere.",
         alternative='accelerator="auto" (or the target\'s accelerator plugin), devices=N instead of gpus=N.',
         docs="https://lightning.ai/docs/pytorch/stable/extensions/accelerator.html"),
    dict(id="LIB015", title="xFormers attention switch (diffusers)", severity="unsupported",
         severity_by_target={"cuda": "handled"},
         match={"method": ["enable_xformers_memory_efficient_attention",
                           "set_use_memory_efficient_attention_xformers"]},
         message="Switches the model to xFormers attention, a CUDA kernel: on {target} it raises.",
         alternative="Remove the call: with torch >= 2 diffusers uses scaled_dot_product_attention "
                     "(AttnProcessor2_0) by default.", docs=_SDPA),
    dict(id="LIB016", title='attn_implementation="flash_attention_2"', severity="unsupported",
         severity_by_target={"cuda": "handled"},
         match={"keyword": {"attn_implementation": "flash_attention", "use_flash_attention_2": _NOT_FALSE},
                "string": r"^flash_attention_[23]$", "triggers": ["flash_attention"]},
         message="Loads the model with flash-attn kernels (transformers): they exist only for "
                 "CUDA, so loading fails on {target}.",
         alternative='attn_implementation="sdpa" (scaled_dot_product_attention, every target).',
         docs="https://huggingface.co/docs/transformers/perf_infer_gpu_one#flashattention",
         rewrite={"sub": ["flash_attention_[23]", "sdpa"]}),
    dict(id="LIB013", title="nvtx package", severity="review",
         match={"import": ["nvtx"], "call": ["nvtx.*"], "decorator": ["nvtx.annotate"]},
         message="NVTX annotations are for NVIDIA Nsight: on {target} the ranges are lost "
                 "(the package may be a no-op or fail to load).",
         alternative="torch.profiler.record_function(name) works on every target.",
         docs="https://pytorch.org/docs/stable/profiler.html"),
    # --- environment ---------------------------------------------------------------------
    dict(id="ENV001", title="CUDA_VISIBLE_DEVICES", severity="review",
         match={"string": r"CUDA_VISIBLE_DEVICES", "triggers": ["cuda_visible_devices"]},
         message="Device visibility: the adapter maps CUDA_VISIBLE_DEVICES to {target}'s "
                 "equivalent where one exists; code that parses it, sets it for child "
                 "processes or counts devices from it needs a look.",
         alternative="The target's own variable (ASCEND_RT_VISIBLE_DEVICES on npu, "
                     "ZE_AFFINITY_MASK on xpu) or torch.cuda.device_count() (answered for the target).",
         docs=_CUDA_NOTES + "#cuda-environment-variables"),
    dict(id="ENV002", title="CUDA runtime environment variables", severity="handled",
         match={"string": r"\b(CUDA_LAUNCH_BLOCKING|PYTORCH_CUDA_ALLOC_CONF|PYTORCH_NO_CUDA_MEMORY_CACHING"
                          r"|CUDA_DEVICE_ORDER|CUDA_MODULE_LOADING|CUBLAS_WORKSPACE_CONFIG)\b",
                "triggers": ["cuda_", "cublas_"]},
         message="Mapped to {target}'s equivalent where one exists (e.g. ASCEND_LAUNCH_BLOCKING, "
                 "PYTORCH_NPU_ALLOC_CONF on npu), ignored with a warning otherwise.",
         alternative="Nothing to change.", docs=_CUDA_NOTES + "#cuda-environment-variables"),
    dict(id="ENV003", title="NCCL_* environment variables", severity="handled",
         match={"string": r"\bNCCL_[A-Z0-9_]+", "triggers": ["nccl_"]},
         message="Mapped to {backend}'s equivalents where they exist (HCCL_* on npu), warned "
                 "about otherwise.",
         alternative="Nothing to change; tune the target's collective library separately.",
         docs=_DIST),
    dict(id="ENV004", title="CUDA toolkit environment variables", severity="review",
         match={"string": r"\b(CUDA_HOME|CUDA_PATH|CUDNN_[A-Z_]+|TORCH_CUDA_ARCH_LIST|CUDA_[A-Z_]+)\b",
                "triggers": ["cuda_", "cudnn_"]},
         message="A CUDA toolkit/runtime setting: it has no effect on {target}.",
         alternative="Remove it, or set the target's toolkit variables instead.",
         docs=_CUDA_NOTES + "#cuda-environment-variables"),
    dict(id="ENV005", title="nvidia-smi", severity="unsupported",
         match={"string": r"\bnvidia-smi\b", "triggers": ["nvidia-smi"],
                "regex": r"\bnvidia-smi\b", "languages": ["shell", "config", "python-text"]},
         message="nvidia-smi does not exist on {target} machines: the command fails.",
         alternative="torch_adapter.targets(), torch.cuda.mem_get_info() (answered for the "
                     "target), or the vendor tool (npu-smi, xpu-smi).",
         docs="https://pytorch.org/docs/stable/generated/torch.cuda.mem_get_info.html"),
    # --- C++ / CUDA sources ----------------------------------------------------------------
    dict(id="SRC001", title=".cu / .cuh file", severity="unsupported",
         match={"file": [".cu", ".cuh"], "languages": ["cuda"]},
         message="A CUDA source file: compiled by nvcc for NVIDIA GPUs; none of it runs on {target}.",
         alternative=_PORT_KERNEL, docs=_EXT),
    dict(id="SRC002", title="CUDA kernel code", severity="unsupported",
         match={"regex": r"__global__|__device__|__shared__|__host__|<<<|\b(threadIdx|blockIdx|blockDim|gridDim)\b"
                         r"|__syncthreads|__shfl\w*|\batomicAdd\b|__ldg\b",
                "string": r"__global__|__device__|__shared__|<<<|\b(threadIdx|blockIdx|blockDim)\b|__syncthreads",
                "languages": ["cuda", "cxx"],
                "triggers": ["__global__", "__device__", "__shared__", "<<<", "threadidx", "blockidx",
                             "blockdim", "griddim", "__syncthreads", "__shfl", "atomicadd", "__ldg"]},
         message="CUDA kernel code (device functions, launches, thread indices): only nvcc "
                 "compiles it, only NVIDIA GPUs run it -- not {target}.",
         alternative=_PORT_KERNEL, docs=_CUSTOM_OPS),
    dict(id="SRC003", title="TORCH_LIBRARY_IMPL(…, CUDA, …)", severity="unsupported",
         match={"regex": r"TORCH_LIBRARY_IMPL\s*\(\s*\w+\s*,\s*(CUDA|AutogradCUDA|SparseCUDA)\b",
                "languages": ["cuda", "cxx"], "triggers": ["torch_library_impl"]},
         message="Registers kernels for the CUDA dispatch key: on {target} ({dispatch_key}) the "
                 "op has no kernel from this file.",
         alternative="TORCH_LIBRARY_IMPL(ns, {dispatch_key}, m) with a target kernel, or "
                     "CompositeExplicitAutograd for an implementation in ATen ops.",
         docs=_CUSTOM_OPS),
    dict(id="SRC004", title="CUDA runtime / library API in C++", severity="unsupported",
         match={"regex": r"#\s*include\s*[<\"](cuda|cublas|cudnn|curand|cusparse|cufft|cusolver|nccl|"
                         r"nvToolsExt|nvtx3|thrust/|cub/|ATen/cuda/|c10/cuda/|ATen/native/cuda/)"
                         r"|\bcuda[A-Z]\w*\s*\(|\bcuda\w*_t\b|\b(at|c10)::cuda::|\bCUDAGuard\b"
                         r"|getCurrentCUDAStream|\bC10_CUDA_\w+|\bAT_CUDA_\w+|\bcublas\w*|\bcudnn\w*|\bnccl\w*",
                "languages": ["cuda", "cxx"], "triggers": ["cuda", "cublas", "cudnn", "nccl", "thrust", "cub/", "nvtx"]},
         message="Calls the CUDA runtime or a CUDA library: it does not compile or run for {target}.",
         alternative=_PORT_KERNEL, docs=_EXT),
    dict(id="SRC005", title="CUDA device checks in C++", severity="review",
         match={"regex": r"\.is_cuda\(\)|\bkCUDA\b|DeviceType::CUDA|DispatchKey::CUDA|\.cuda\(\)",
                "languages": ["cuda", "cxx"], "triggers": ["cuda"]},
         message="A CUDA device check or move in C++: the adapter does not reach C++ code; on "
                 "{target} tensors are {device_type} tensors, so this check is False there.",
         alternative="Check tensor.device().type() against the device you run on, or dispatch by key.",
         docs=_CUSTOM_OPS),
    # --- shell scripts, requirements, configs ------------------------------------------------
    dict(id="TXT001", title="CUDA_VISIBLE_DEVICES (shell/config)", severity="review",
         match={"regex": r"\bCUDA_VISIBLE_DEVICES\b", "languages": ["shell", "config"],
                "triggers": ["cuda_visible_devices"]},
         message="Device visibility set for CUDA: the adapter maps it to {target}'s "
                 "equivalent where one exists; check scripts that count devices from it.",
         alternative="The target's own variable (ASCEND_RT_VISIBLE_DEVICES on npu, ZE_AFFINITY_MASK on xpu).",
         docs="https://pytorch.org/docs/stable/notes/cuda.html#cuda-environment-variables"),
    dict(id="TXT002", title="CUDA-only dependency", severity="unsupported",
         match={"regex": r"(?i)(?<![\w./-])(flash[-_]attn|xformers|bitsandbytes|apex|cupy(-cuda\w+)?|pynvml"
                         r"|nvidia-ml-py3?|pycuda|cuda-python|transformer[-_]engine|mamba[-_]ssm"
                         r"|causal[-_]conv1d|triton|gpustat|gputil|nvidia-[\w-]*cu1\d)(?![\w/-])",
                "languages": ["shell", "config"],
                "triggers": ["flash", "xformers", "bitsandbytes", "apex", "cupy", "nvml", "pycuda",
                             "cuda-python", "transformer", "mamba", "causal", "triton", "gpustat",
                             "gputil", "nvidia-"]},
         message="A CUDA-only package: it does not install, import or run on {target} machines.",
         alternative="Drop it for {target}: SDPA for flash-attn/xformers, torch.amp/torch.optim for "
                     "apex, torch.optim.AdamW for bitsandbytes optimizers.", docs=_SDPA),
    dict(id="TXT003", title="CUDA builds of PyTorch / CUDA images", severity="review",
         match={"regex": r"(?i)\+cu\d{2,3}\b|/whl/cu\d{2,3}\b|pytorch-cuda|cudatoolkit|nvidia/cuda:|--gpus\b",
                "languages": ["shell", "config"], "triggers": ["cu", "cudatoolkit", "--gpus"]},
         message="Installs or starts a CUDA build of PyTorch: use {target}'s build instead.",
         alternative="The target's PyTorch wheel (cpu, xpu, torch_npu) or base image.",
         docs="https://pytorch.org/get-started/locally/"),
    dict(id="TXT004", title="CUDA/NCCL runtime variables (shell/config)", severity="handled",
         match={"regex": r"\b(NCCL_\w+|CUDA_LAUNCH_BLOCKING|PYTORCH_CUDA_ALLOC_CONF|CUDA_DEVICE_ORDER)\b",
                "languages": ["shell", "config"], "triggers": ["nccl_", "cuda_"]},
         message="Mapped to {target}'s equivalents (and {backend}'s for NCCL_*) where they "
                 "exist when run under the adapter; ignored with a warning otherwise.",
         alternative="Nothing to change.", docs="https://pytorch.org/docs/stable/notes/cuda.html"),
)

_MENTION = r"(?i)cuda|nccl|cudnn|cublas|cufft|curand|cusparse|nvtx|nvml|nvfuser|nvcc"
_MENTION_TRIGGERS = ["cuda", "nccl", "cudnn", "cublas", "cufft", "curand", "cusparse", "nvtx",
                     "nvml", "nvfuser", "nvcc"]

_LIBS = r"(?i)xformers|flash_?attn|bitsandbytes|triton|cupy|nvml|tf32|8bit_adam|liger_kernel|apex"
_LIB_TRIGGERS = ["xformers", "flash_attn", "flashattn", "bitsandbytes", "triton", "cupy", "nvml", "tf32",
                 "8bit_adam", "liger_kernel", "apex"]

CATCH_ALL: tuple[dict, ...] = (
    dict(id="ANY001", title="other torch.cuda API", severity="review",
         match={"call": ["torch.cuda", "torch.cuda.*"],
                "import": ["torch.cuda", "torch.cuda.*"]},
         message="Part of torch.cuda: the adapter answers each name of torch.cuda.__all__ for "
                 "{target} or raises an error saying why; check what this one does there.",
         alternative="See the adapter's torch.cuda table (docs) for this name.",
         docs="https://pytorch.org/docs/stable/cuda.html"),
    dict(id="ANY002", title="CUDA-named identifier", severity="review", secondary=True,
         match={"name": _MENTION, "triggers": _MENTION_TRIGGERS},
         message="A name that refers to CUDA (a variable, flag, parameter or helper): check "
                 "what it selects on {target}.",
         alternative="Name it for the device (use_accelerator, device) and derive it from the "
                     "device you selected.", docs="https://pytorch.org/docs/stable/notes/cuda.html"),
    dict(id="ANY003", title="string mentioning CUDA", severity="review", secondary=True,
         match={"string": _MENTION, "triggers": _MENTION_TRIGGERS},
         message="A string that mentions CUDA: where it reaches torch it is redirected; as a "
                 "config value, log text, key or command it stays as written on {target}.",
         alternative="Check what the string is used for.",
         docs="https://pytorch.org/docs/stable/notes/cuda.html"),
    dict(id="ANY006", title="name or string of a CUDA-only library", severity="review", secondary=True,
         match={"name": _LIBS, "string": _LIBS, "triggers": _LIB_TRIGGERS},
         message="Refers to a CUDA-only library or feature (xFormers, flash-attn, bitsandbytes, "
                 "Triton, CuPy, NVML, apex, TF32): check what it does on {target}.",
         alternative="SDPA for attention kernels, torch.optim for 8-bit optimizers, PyTorch ops "
                     "for Triton/CuPy code.", docs=_SDPA),
    dict(id="ANY004", title="CUDA mention (C/C++/CUDA, shell, config)", severity="review", secondary=True,
         match={"regex": _MENTION + r"|nvidia", "languages": ["cuda", "cxx", "shell", "config"],
                "triggers": _MENTION_TRIGGERS + ["nvidia"]},
         message="A line that mentions CUDA in a file the adapter does not run: check it for {target}.",
         alternative="Check what the line does on {target}.",
         docs="https://pytorch.org/docs/stable/notes/cuda.html"),
    dict(id="ANY005", title="CUDA mention in unparsable Python", severity="review",
         match={"regex": _MENTION + r"|nvidia|flash_attn|xformers|bitsandbytes|cupy|triton|apex|autocast"
                         r"|GradScaler|einsum",
                "languages": ["python-text"],
                "triggers": _MENTION_TRIGGERS + ["nvidia", "flash_attn", "xformers", "bitsandbytes",
                                                 "cupy", "triton", "apex", "autocast", "gradscaler", "einsum"]},
         message="A CUDA-related line in a file Python cannot parse (see the note): matched "
                 "as text, so check it by hand for {target}.",
         alternative="Fix the syntax error and run check again for precise findings.",
         docs="https://docs.python.org/3/library/ast.html"),
)

# Findings the runtime part (--run) adds; documented with the static rules.
RUNTIME_RULES: tuple[dict, ...] = (
    dict(id="RT001", title="op falls back to the CPU", severity="review",
         message="At run time on {target} this line's ops fall back to the CPU (inputs copied "
                 "to the host and back), which costs throughput.",
         alternative="Use an op the target runs natively, or register an accelerated kernel "
                     "(torch_adapter.register_accelerated)."),
    dict(id="RT002", title="command failed under the adapter", severity="unsupported",
         message="The command exited with an error when run under the adapter on {target}; "
                 "this is the last line of the project in its traceback.",
         alternative="Read the traceback (terminal output) and the findings on this line."),
    dict(id="RT003", title="dtype the target refuses", severity="unsupported",
         message="At run time this line created or moved a tensor of a dtype {target} does not have; the real "
                 "backend refuses it (a simulated run lists each such call: torch-adapter run --dtype-check record).",
         alternative="Use float32 for what runs on the target (dtype=torch.float32, .float()); keep float64 "
                     "math on the CPU."),
)
