import subprocess
import time

import cupy as cp  # expect: LIB009
import pynvml  # expect: LIB010
import torch
import torch.cuda.nvtx as nvtx  # expect: API009
from torch.profiler import ProfilerActivity, profile


@torch.jit.script  # expect: JIT001
def gelu(x):
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * (x + 0.044715 * x * x * x)))


def timed(fn, x, iters=10):
    start = torch.cuda.Event(enable_timing=True)  # expect: API007
    end = torch.cuda.Event(enable_timing=True)  # expect: API007
    start.record()  # expect: API008
    for _ in range(iters):
        nvtx.range_push("step")  # expect: API009
        fn(x)
        nvtx.range_pop()  # expect: API009
    end.record()  # expect: API008
    torch.cuda.synchronize()  # expect: API004
    return start.elapsed_time(end) / iters  # expect: API008


def graphs(model, x):
    g = torch.cuda.CUDAGraph()  # expect: API010
    s = torch.cuda.Stream()  # expect: API007
    s.wait_stream(torch.cuda.current_stream())  # expect: API008,API007
    with torch.cuda.stream(s):  # expect: API007
        model(x)
    with torch.cuda.graph(g):  # expect: API010
        y = model(x)
    g.replay()  # expect: API010
    compiled = torch.compile(model, mode="reduce-overhead")  # expect: JIT003
    return y, compiled


def memory():
    pynvml.nvmlInit()  # expect: LIB010
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)  # expect: LIB010
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)  # expect: LIB010
    free, total = torch.cuda.mem_get_info()  # expect: API006
    peak = torch.cuda.max_memory_allocated() / 2**30  # expect: API006
    torch.cuda.reset_peak_memory_stats()  # expect: API006
    print(torch.cuda.memory_summary())  # expect: API006
    print(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)  # expect: API003
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv"], capture_output=True)  # expect: ENV005
    arr = cp.asarray([1, 2, 3])  # expect: LIB009
    return info, free, total, peak, out, arr


def prof(model, x):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:  # expect: API020
        model(x)
    print(p.key_averages().table(sort_by="cuda_time_total"))  # expect: API021
    x64 = torch.zeros(3, dtype=torch.float64)  # expect: NUM001
    return x64.double(), time.time()  # expect: NUM001
