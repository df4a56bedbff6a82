"""The torch.cuda namespace as training scripts call it."""
import torch

assert torch.cuda.is_available() and torch.cuda.is_initialized()
n = torch.cuda.device_count()
assert n >= 1
torch.cuda.set_device(0)
assert torch.cuda.current_device() == 0
print("device:", torch.cuda.get_device_name(0), torch.cuda.get_device_capability())
props = torch.cuda.get_device_properties(0)
assert props.total_memory > 0 and props.name
with torch.cuda.device(0):
    t = torch.ones(3, device="cuda")
with torch.cuda.device_of(t):
    pass

# streams and events, with real elapsed times
s = torch.cuda.Stream()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
with torch.cuda.stream(s):
    start.record()
    w = torch.randn(256, 256, device="cuda")
    for _ in range(5):
        w = w @ w.T / 256
    end.record()
torch.cuda.current_stream().wait_stream(s)
w.record_stream(torch.cuda.current_stream())
torch.cuda.synchronize()
ms = start.elapsed_time(end)
assert ms > 0, ms
assert torch.cuda.default_stream() is not None
ev = torch.cuda.Event()
ev.record()
ev.synchronize()
assert ev.query()

# RNG
torch.cuda.manual_seed(1234)
a = torch.rand(3, device="cuda")
torch.cuda.manual_seed_all(1234)
b = torch.rand(3, device="cuda")
assert torch.equal(a, b)
state = torch.cuda.get_rng_state()
c = torch.rand(3, device="cuda")
torch.cuda.set_rng_state(state)
d = torch.rand(3, device="cuda")
assert torch.equal(c, d)
states = torch.cuda.get_rng_state_all()
torch.cuda.set_rng_state_all(states)
torch.cuda.seed()
torch.cuda.seed_all()
assert isinstance(torch.cuda.initial_seed(), int)
assert len(torch.cuda.default_generators) >= 1

# memory
big = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")
big.fill_(1)
alloc = torch.cuda.memory_allocated()
assert alloc > 0
assert torch.cuda.max_memory_allocated() >= alloc
assert torch.cuda.memory_reserved() > 0 and torch.cuda.max_memory_reserved() > 0
free, total = torch.cuda.mem_get_info()
assert 0 < free <= total
stats = torch.cuda.memory_stats()
assert stats["allocated_bytes.all.current"] > 0
print(torch.cuda.memory_summary())
torch.cuda.reset_peak_memory_stats()
torch.cuda.reset_max_memory_allocated()
torch.cuda.reset_accumulated_memory_stats()
del big
torch.cuda.empty_cache()
torch.cuda.memory_snapshot()
torch.cuda.set_per_process_memory_fraction(0.5)
torch.cuda.ipc_collect()

# misc
assert torch.cuda.is_bf16_supported()
torch.cuda.nvtx.range_push("step")
torch.cuda.nvtx.mark("here")
torch.cuda.nvtx.range_pop()
with torch.cuda.nvtx.range("block"):
    pass
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = False
torch.backends.cudnn.allow_tf32 = True
torch.backends.cuda.matmul.allow_tf32 = True
print(torch.cuda.list_gpu_processes())

# legacy typed tensors
ft = torch.cuda.FloatTensor(2, 3).zero_()
lt = torch.cuda.LongTensor([1, 2, 3])
assert ft.dtype == torch.float32 and lt.dtype == torch.int64
assert isinstance(ft, torch.cuda.FloatTensor)
ht = torch.randn(2).type("torch.cuda.HalfTensor")
assert ht.dtype == torch.float16
ht2 = torch.randn(2).type(torch.cuda.DoubleTensor)
assert ht2.dtype == torch.float64

# CUDA graphs: emulated (capture records, replay re-runs on the static tensors)
lin = torch.nn.Linear(3, 3).cuda()
g_lin = torch.cuda.make_graphed_callables(lin, (torch.randn(2, 3, device="cuda"),))
x_in = torch.randn(2, 3, device="cuda")
assert torch.allclose(g_lin(x_in), torch.nn.functional.linear(x_in, lin.weight, lin.bias))
static_x = torch.zeros(2, 3, device="cuda")
graph_ = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph_):
    static_y = static_x * 2
static_x.copy_(x_in)
graph_.replay()
assert torch.equal(static_y, x_in * 2)
print("cuda namespace OK", ms)
