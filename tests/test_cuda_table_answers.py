"""Each answered ``torch.cuda`` name gives the answer its row in redirect/cuda_table.py promises
for the CPU target — compared with the value it must have, not merely "is not None".

``EXPECT`` holds one check per answered name (a test fails when a name is answered without
one), and ``test_the_checks_fail_without_the_adapter`` runs them on plain torch: each must
fail there, except the few names whose CPU answer plain CPU torch already gives (``SAME``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest
import torch

import torch_adapter
from torch_adapter.redirect import cuda_table

MiB = 1 << 20
Check = Callable[[Any], None]


def _proc(key: str, path: str = "/proc/self/status") -> int:
    with open(path) as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key + ":"))


def _legacy_tensor(name: str, dtype: torch.dtype) -> Check:
    def check(c: Any) -> None:
        t = getattr(c, name)([1, 0])
        assert (t.dtype, t.device.type, t.tolist()) == (dtype, "cpu", [1, 0] if dtype != torch.bool else [True, False])
    return check


def _typed_storage(name: str, dtype: torch.dtype) -> Check:
    def check(c: Any) -> None:
        s = getattr(c, name)(4)
        assert (s.dtype, s.device.type, s.size()) == (dtype, "cpu", 4)
    return check


def _event(c: Any) -> None:
    start, end = c.Event(enable_timing=True), c.Event(enable_timing=True)
    start.record()
    torch.ones(64, 64, device="cuda").sum()
    end.record()
    end.synchronize()
    assert end.query() is True and start.elapsed_time(end) >= 0.0


def _stream(c: Any) -> None:
    s = c.Stream()
    s.synchronize()
    assert s.query() is True and s.device.type == "cpu"
    s.wait_stream(c.current_stream())


def _stream_context(c: Any) -> None:
    s = c.Stream()
    with c.StreamContext(s) as got:  # one synchronous stream on the CPU: every stream equals it
        assert got is s and c.current_stream() == s and s.query() is True


def _amp(c: Any) -> None:
    a = torch.randn(4, 4, device="cuda")
    with c.amp.autocast():  # float16, CUDA autocast's default, on the CPU (the AMP dtype policy)
        assert torch.is_autocast_enabled("cpu") and torch.mm(a, a).dtype == torch.float16
    scaler = c.amp.GradScaler()
    assert scaler.scale(torch.ones((), device="cuda", requires_grad=True)).device.type == "cpu"


def _check_error(c: Any) -> None:
    assert c.check_error(0) is None
    with pytest.raises(Exception):
        c.check_error(2)


def _caching_allocator_disabled(c: Any) -> None:
    with c.caching_allocator_disabled() as got:  # accepted: allocations go on as before
        t = torch.ones(4, device="cuda")
    assert got is None and t.device.type == "cpu" and t.sum().item() == 4.0


def _device(c: Any) -> None:
    with c.device(0):
        assert c.current_device() == 0
    with c.device_of(torch.ones(1, device="cuda")):
        assert c.current_device() == 0


def _memory_allocated(c: Any) -> None:
    before = c.memory_allocated()
    x = torch.ones(64 * MiB // 4, device="cuda")
    assert c.memory_allocated() - before >= 63 * MiB
    del x


def _max_allocated(c: Any) -> None:
    c.reset_peak_memory_stats()
    x = torch.ones(64 * MiB // 4, device="cuda")
    del x
    assert c.max_memory_allocated() - c.memory_allocated() >= 60 * MiB


def _reset(name: str) -> Check:
    def check(c: Any) -> None:
        x = torch.ones(64 * MiB // 4, device="cuda")
        del x
        high = c.max_memory_allocated()
        getattr(c, name)()
        assert c.max_memory_allocated() < high - 48 * MiB
    return check


def _near(value: int, expected: int, slack: int = 64 * MiB) -> None:
    assert abs(value - expected) < slack, (value, expected)


def _rss_like(name: str) -> Check:
    return lambda c: _near(getattr(c, name)(), _proc("VmRSS"))


def _hwm_like(name: str) -> Check:
    return lambda c: _near(getattr(c, name)(), _proc("VmHWM"))


def _mem_get_info(c: Any) -> None:
    free, total = c.mem_get_info()
    assert total == _proc("MemTotal", "/proc/meminfo")
    _near(free, _proc("MemAvailable", "/proc/meminfo"), 512 * MiB)


def _memory_stats(c: Any) -> None:
    s = c.memory_stats()
    _near(s["allocated_bytes.all.current"], c.memory_allocated(), 8 * MiB)
    _near(s["reserved_bytes.all.current"], _proc("VmRSS"))


def _nested(c: Any) -> None:
    n = c.memory_stats_as_nested_dict()
    _near(n["allocated_bytes"]["all"]["current"], c.memory_allocated(), 8 * MiB)


def _per_process_fraction(c: Any) -> None:
    c.set_per_process_memory_fraction(0.5)
    try:
        assert c.get_per_process_memory_fraction() == 0.5
    finally:
        c.set_per_process_memory_fraction(1.0)


def _rng(c: Any) -> None:
    state = c.get_rng_state()
    assert torch.equal(state, torch.get_rng_state()) and torch.equal(c.get_rng_state_all()[0], state)
    a = torch.randn(3, device="cuda")
    c.set_rng_state(state)
    assert torch.equal(torch.randn(3, device="cuda"), a)
    c.set_rng_state_all([state])
    assert torch.equal(torch.randn(3, device="cuda"), a)


def _manual_seed(name: str) -> Check:
    def check(c: Any) -> None:
        getattr(c, name)(1234)
        a = torch.randn(3, device="cuda")
        torch.manual_seed(1234)
        assert torch.equal(torch.randn(3), a) and c.initial_seed() == 1234
    return check


def _seed(name: str) -> Check:
    def check(c: Any) -> None:
        getattr(c, name)()
        assert c.initial_seed() == torch.initial_seed()
        torch.manual_seed(0)
    return check


def _nvtx(c: Any) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        c.nvtx.range_push("ta_nvtx_range")
        torch.ones(2) + 1
        c.nvtx.range_pop()
        with c.nvtx.range("ta_nvtx_with"):
            torch.ones(2) + 1
    names = {e.name for e in prof.events()}
    assert {"ta_nvtx_range", "ta_nvtx_with"} <= names, sorted(names)[:20]


def _profiler(c: Any) -> None:
    c.profiler.start()
    c.profiler.stop()
    with c.profiler.profile():
        torch.ones(1, device="cuda")


def _set_stream(c: Any) -> None:
    s, before = c.Stream(), c.current_stream()
    c.set_stream(s)
    try:
        assert c.current_stream() == s
    finally:
        c.set_stream(before)
    with c.stream(s):
        assert c.current_stream() == s


def _properties(c: Any) -> None:
    p = c.get_device_properties(0)
    assert (p.major, p.minor) == (0, 0) and p.multi_processor_count == os.cpu_count()
    assert p.total_memory == _proc("MemTotal", "/proc/meminfo") and "CPU" in p.name


def _list_processes(c: Any) -> None:
    text = c.list_gpu_processes()
    assert str(os.getpid()) in text and "cpu" in text.lower()


def _graphed(c: Any) -> None:
    fn = torch.nn.Linear(2, 2)
    plain = fn.forward
    assert c.make_graphed_callables(fn, (torch.randn(1, 2),)) is fn and fn.forward != plain  # graphed forward
    x = torch.randn(1, 2)
    assert torch.equal(fn(x), torch.nn.functional.linear(x, fn.weight, fn.bias))


def _cuda_graph(c: Any) -> None:
    x = torch.zeros(2)
    g = c.CUDAGraph()
    with c.graph(g):
        y = x * 2 + 1
    x.copy_(torch.tensor([1.0, 2.0]))
    g.replay()
    assert y.tolist() == [3.0, 5.0]


def _capturing(c: Any) -> None:
    assert c.is_current_stream_capturing() is False and c.is_available()
    g = c.CUDAGraph()
    with c.graph(g):
        inside = c.is_current_stream_capturing()
    assert inside is True and c.is_current_stream_capturing() is False


def _pool_handle(c: Any) -> None:
    a, b = c.graph_pool_handle(), c.graph_pool_handle()
    assert a != b and hash(a) != hash(b)


def _is(name: str, value: Any, *args: Any) -> Check:
    def check(c: Any) -> None:
        got = getattr(c, name)(*args)
        assert got == value and type(got) is type(value), (name, got)
    return check


def _none(name: str, *args: Any) -> Check:
    def check(c: Any) -> None:
        assert getattr(c, name)(*args) is None
        assert c.is_available()  # (a no-op that is the adapter's, not plain torch's raising or lazy one)
    return check


EXPECT: dict[str, Check] = {
    **{n: _legacy_tensor(n, d) for n, d in {
        "BFloat16Tensor": torch.bfloat16, "BoolTensor": torch.bool, "ByteTensor": torch.uint8,
        "CharTensor": torch.int8, "DoubleTensor": torch.float64, "FloatTensor": torch.float32,
        "HalfTensor": torch.float16, "IntTensor": torch.int32, "LongTensor": torch.int64,
        "ShortTensor": torch.int16}.items()},
    **{n: _typed_storage(n, d) for n, d in {
        "BFloat16Storage": torch.bfloat16, "BoolStorage": torch.bool, "ByteStorage": torch.uint8,
        "CharStorage": torch.int8, "ComplexDoubleStorage": torch.complex128, "ComplexFloatStorage": torch.complex64,
        "DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
        "IntStorage": torch.int32, "LongStorage": torch.int64, "ShortStorage": torch.int16}.items()},
    "Event": _event, "Stream": _stream, "StreamContext": _stream_context, "amp": _amp,
    "caching_allocator_enable": _none("caching_allocator_enable", True),
    "caching_allocator_disabled": _caching_allocator_disabled,
    "can_device_access_peer": _is("can_device_access_peer", False, 0, 0),
    "check_error": _check_error,
    "current_device": lambda c: (c.set_device(0), _is("current_device", 0)(c)),
    "set_device": lambda c: (c.set_device(0), _is("current_device", 0)(c)),
    "current_stream": lambda c: c.current_stream().synchronize() or _is("is_current_stream_capturing", False)(c),
    "default_stream": lambda c: (c.default_stream().synchronize(), _is("device_count", 1)(c)),
    "default_generators": lambda c: _is_tuple(c.default_generators, (torch.default_generator,)),
    "device": _device, "device_of": _device,
    "device_count": _is("device_count", 1),
    "device_memory_used": _rss_like("device_memory_used"),
    "empty_cache": _none("empty_cache"),
    "get_allocator_backend": _is("get_allocator_backend", "native"),
    "get_arch_list": _is("get_arch_list", []),
    "get_device_capability": _is("get_device_capability", (0, 0)),
    "get_device_name": lambda c: _suffix(c.get_device_name(), "via torch_adapter"),
    "get_device_properties": _properties,
    "get_gencode_flags": _is("get_gencode_flags", ""),
    "get_per_process_memory_fraction": _per_process_fraction,
    "set_per_process_memory_fraction": _per_process_fraction,
    "get_rng_state": _rng, "get_rng_state_all": _rng, "set_rng_state": _rng, "set_rng_state_all": _rng,
    "get_sync_debug_mode": _is("get_sync_debug_mode", 0),
    "set_sync_debug_mode": lambda c: (c.set_sync_debug_mode(1), c.set_sync_debug_mode(0),
                                      _is("get_sync_debug_mode", 0)(c)),
    "has_half": lambda c: _is_value(c.has_half, True),
    "has_magma": lambda c: _is_value(c.has_magma, False),
    "host_memory_stats": _is("host_memory_stats", {}),
    "host_memory_stats_as_nested_dict": _is("host_memory_stats_as_nested_dict", {}),
    "reset_accumulated_host_memory_stats": _none("reset_accumulated_host_memory_stats"),
    "reset_peak_host_memory_stats": _none("reset_peak_host_memory_stats"),
    "reset_accumulated_memory_stats": _none("reset_accumulated_memory_stats"),
    "init": _none("init"), "ipc_collect": _none("ipc_collect"), "synchronize": _none("synchronize"),
    "initial_seed": lambda c: _is_value(c.initial_seed(), torch.initial_seed()),
    "is_available": _is("is_available", True),
    "is_bf16_supported": _is("is_bf16_supported", True),
    "is_current_stream_capturing": _capturing,
    "CUDAGraph": _cuda_graph, "graph": _cuda_graph, "graph_pool_handle": _pool_handle,
    "is_initialized": _is("is_initialized", True),
    "is_tf32_supported": _is("is_tf32_supported", False),
    "list_gpu_processes": _list_processes,
    "make_graphed_callables": _graphed,
    "manual_seed": _manual_seed("manual_seed"), "manual_seed_all": _manual_seed("manual_seed_all"),
    "seed": _seed("seed"), "seed_all": _seed("seed_all"),
    "max_memory_allocated": _max_allocated,
    "max_memory_reserved": _hwm_like("max_memory_reserved"), "max_memory_cached": _hwm_like("max_memory_cached"),
    "memory_allocated": _memory_allocated,
    "memory_reserved": _rss_like("memory_reserved"), "memory_cached": _rss_like("memory_cached"),
    "mem_get_info": _mem_get_info,
    "memory_snapshot": _is("memory_snapshot", []),
    "memory_stats": _memory_stats, "memory_stats_as_nested_dict": _nested,
    "memory_summary": lambda c: _contains(c.memory_summary(), "CPU target"),
    "memory_usage": _is("memory_usage", 0), "utilization": _is("utilization", 0),
    "nvtx": _nvtx, "profiler": _profiler,
    "reset_max_memory_allocated": _reset("reset_max_memory_allocated"),
    "reset_max_memory_cached": _reset("reset_max_memory_cached"),
    "reset_peak_memory_stats": _reset("reset_peak_memory_stats"),
    "set_stream": _set_stream, "stream": _set_stream,
}

# Names whose promised CPU answer plain CPU torch gives too (so their check cannot tell the two apart).
SAME = {"get_arch_list", "get_gencode_flags", "has_magma", "has_half", "is_tf32_supported",
        "initial_seed", "check_error", "host_memory_stats_as_nested_dict"}


def _is_tuple(got: Any, want: tuple) -> None:
    assert isinstance(got, tuple) and len(got) == len(want) and all(a is b for a, b in zip(got, want)), got


def _is_value(got: Any, want: Any) -> None:
    assert got == want and type(got) is type(want), got


def _suffix(text: str, end: str) -> None:
    assert text.startswith("CPU") and text.endswith(end), text


def _contains(text: str, part: str) -> None:
    assert part in text, text


ANSWERED = sorted(n for n, (how, _) in cuda_table.TABLE.items() if how in (cuda_table.A, cuda_table.E))


def test_every_answered_name_has_a_check():
    assert sorted(set(ANSWERED) - set(EXPECT)) == []
    assert sorted(set(EXPECT) - set(ANSWERED)) == []


@pytest.mark.parametrize("name", ANSWERED)
def test_answered_name_gives_the_promised_answer_on_the_cpu_target(name):
    # dtype_policy="float16": the answers as asked on every CPU kind (the default, auto, answers a
    # float16 request with float32 on a CPU without bf16 units: tests/test_dtype_policy.py)
    torch_adapter.install("cpu", dtype_policy="float16")
    EXPECT[name](torch.cuda)


def test_the_checks_fail_without_the_adapter():
    """Plain CPU torch fails every check but those in SAME: the checks test the adapter."""
    passing = set()
    for name in ANSWERED:
        try:
            EXPECT[name](torch.cuda)
        except Exception:  # noqa: BLE001 - AssertionError, or plain torch raising (no CUDA)
            continue
        passing.add(name)
    assert passing <= SAME, sorted(passing - SAME)


# CI runs this file a second time as a CPU without bf16 units (TORCH_ADAPTER_CPU_FEATURES=avx2): .ci/run
pytestmark = pytest.mark.cpu_kind
