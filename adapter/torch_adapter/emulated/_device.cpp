// torch_adapter's emulated accelerator: a real out-of-tree PrivateUse1 device (renamed to the
// target's name, e.g. "npu"), built the way torch_npu is: an allocator, a device guard, the
// PrivateUse1 hooks (generators, pinned memory, storage resize), the metadata kernels every
// backend needs, a device kernel for each op of the vendor's table, and torch's boxed CPU
// fallback for every other op.
//
// The device's memory is host memory, but to torch it is another device: tensors have their own
// device type, mixing them with CPU tensors raises torch's own error, and an op the vendor's table
// lacks really copies its inputs to the host and its results back (counted and timed here).
// A "device kernel" runs the CPU's kernel on the same memory (no copy): inputs are viewed as CPU
// tensors, outputs that the kernel allocated are adopted by the device (their memory changes
// owner, not place), outputs that alias an input become views of the input's device storage.
//
// Python side: torch_adapter/emulated/__init__.py (build, rename, device module, hccl).

#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/MapAllocator.h>
#include <ATen/StorageUtils.h>
#include <ATen/autocast_mode.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/record_function.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <unistd.h>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace emu {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;

constexpr int kMaxDevices = 16;
constexpr DeviceType kDev = DeviceType::PrivateUse1;

std::atomic<int> g_device_count{1};
thread_local DeviceIndex t_device = 0;

// ---------------------------------------------------------------------------------------------
// Memory: per-device statistics of the device's allocator (torch.npu.memory_allocated & co.)
struct Stats {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> frees{0};
};
std::array<Stats, kMaxDevices> g_stats;

inline int clamp_index(DeviceIndex d) {
  return (d < 0 || d >= kMaxDevices) ? 0 : static_cast<int>(d);
}

void account(DeviceIndex device, int64_t delta) {
  auto& s = g_stats[clamp_index(device)];
  int64_t now = s.allocated.fetch_add(delta) + delta;
  if (delta > 0) {
    s.allocations.fetch_add(1);
    int64_t peak = s.peak.load();
    while (now > peak && !s.peak.compare_exchange_weak(peak, now)) {
    }
  } else if (delta < 0) {
    s.frees.fetch_add(1);
  }
}

// A block of the device's own memory. Its DataPtr is a simple one (context == data, as the CPU
// allocator's): torch's copy-on-write (Tensor._lazy_clone, COW materialisation) wraps only such a
// pointer ("Expected storage != nullptr" otherwise: test_torch's test_lazy_clone*). The size and the
// device for the statistics are kept beside it, by address.
struct BlockInfo {
  size_t nbytes;
  DeviceIndex device;
  c10::DeleterFnPtr deleter;  // how the memory is freed: c10::free_cpu, or the adopted allocation's own
};
std::mutex g_blocks_mutex;
std::unordered_map<void*, BlockInfo> g_blocks;

void free_block(void* ptr) {
  BlockInfo info{0, 0, &c10::free_cpu};
  {
    std::lock_guard<std::mutex> lock(g_blocks_mutex);
    auto it = g_blocks.find(ptr);
    if (it != g_blocks.end()) {
      info = it->second;
      g_blocks.erase(it);
    }
  }
  account(info.device, -static_cast<int64_t>(info.nbytes));
  info.deleter(ptr);
}

// Memory a CPU kernel allocated for an output, adopted by the device (same place, new owner).
struct Adopted {
  c10::DataPtr inner;
  size_t nbytes;
  DeviceIndex device;
};

void free_adopted(void* ctx) {
  auto* a = static_cast<Adopted*>(ctx);
  account(a->device, -static_cast<int64_t>(a->nbytes));
  delete a;  // frees the memory through its original deleter
}

// The device's capacity (bytes; 0: none): a real device has a fixed memory, and a program that asks for
// more gets torch.OutOfMemoryError, which it can catch (accelerate's find_executable_batch_size), not the
// host's OOM killer. Its memory is host memory, so a program using the host as well must fit both:
// test_nn's test_cross_entropy_64bit asks for 20 GB on "cuda" and 20 GB on the CPU, and on a 24 GB host
// whose whole memory the device claimed, both checks passed and the kernel killed the run.
std::atomic<int64_t> g_capacity{0};

void check_capacity(size_t nbytes, DeviceIndex device) {
  const int64_t cap = g_capacity.load(std::memory_order_relaxed);
  if (cap <= 0 || nbytes == 0) {
    return;
  }
  const int64_t used = g_stats[clamp_index(device)].allocated.load();
  if (used + static_cast<int64_t>(nbytes) <= cap) {
    return;
  }
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  char msg[512];
  std::snprintf(msg, sizeof(msg),
                "%s out of memory. Tried to allocate %.2f GiB (%s %d; %.2f GiB total capacity; %.2f GiB already "
                "allocated; %.2f GiB free). The emulated device's memory is TORCH_ADAPTER_EMULATED_MEMORY "
                "(bytes or e.g. 8GB; default half of the host's memory).",
                c10::get_privateuse1_backend(false).c_str(), nbytes / GiB, c10::get_privateuse1_backend().c_str(),
                static_cast<int>(device), cap / GiB, used / GiB, std::max<int64_t>(cap - used, 0) / GiB);
  TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
}

c10::DataPtr device_block(size_t nbytes, DeviceIndex device, DeviceType tag) {
  if (tag == kDev) {
    check_capacity(nbytes, device);
  }
  void* ptr = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
  if (ptr != nullptr) {
    std::lock_guard<std::mutex> lock(g_blocks_mutex);
    g_blocks[ptr] = BlockInfo{nbytes, device, &c10::free_cpu};
  }
  account(device, static_cast<int64_t>(nbytes));
  return {ptr, ptr, &free_block, Device(tag, tag == kDev ? device : -1)};
}

// A device allocator in torch's sense (c10::DeviceAllocator), as torch_npu's is:
// torch.accelerator.empty_cache()/memory_stats()/reset_peak_memory_stats() require one ("Allocator for
// npu is not a DeviceAllocator"). It caches nothing: freed blocks go back to the host at once.
struct DeviceAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    return device_block(nbytes, t_device, kDev);
  }
  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {}
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}  // one synchronous stream
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const auto& st = g_stats[clamp_index(device)];
    c10::CachingDeviceAllocator::DeviceStats out;
    const int64_t bytes = st.allocated.load();
    const int64_t peak = st.peak.load();
    for (auto* arr : {&out.allocated_bytes, &out.reserved_bytes, &out.active_bytes, &out.requested_bytes}) {
      (*arr)[0].current = bytes;
      (*arr)[0].peak = peak;
    }
    const int64_t made = st.allocations.load();
    const int64_t freed = st.frees.load();
    for (auto* arr : {&out.allocation, &out.segment, &out.active}) {
      (*arr)[0].current = made - freed;
      (*arr)[0].allocated = made;
      (*arr)[0].freed = freed;
    }
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    auto& st = g_stats[clamp_index(device)];
    st.allocations.store(0);
    st.frees.store(0);
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    auto& st = g_stats[clamp_index(device)];
    st.peak.store(st.allocated.load());
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
DeviceAllocator g_allocator;
REGISTER_ALLOCATOR(kDev, &g_allocator);

// What a host view of device memory allocates when a CPU kernel resizes it (an out= argument):
// device memory, accounted to the device, tagged CPU while the kernel runs; handed back after.
struct HostViewAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    return device_block(nbytes, t_device, DeviceType::CPU);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
HostViewAllocator g_host_view_allocator;

// Pinned host memory (tensor.pin_memory(), DataLoader(pin_memory=True)): host memory whose
// pointers the hooks recognise.
std::mutex g_pinned_mutex;
std::unordered_set<const void*> g_pinned;

void free_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(ptr);
  }
  c10::free_cpu(ptr);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (ptr) {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned.insert(ptr);
    }
    return {ptr, ptr, &free_pinned, Device(DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
PinnedAllocator g_pinned_allocator;

// ---------------------------------------------------------------------------------------------
// Device guard: device index per thread, streams and events synchronous (the device computes
// when the op is called), events time with the host's steady clock.
struct EventRecord {
  std::chrono::steady_clock::time_point when;
};

std::atomic<int64_t> g_next_stream{1};
thread_local std::array<c10::StreamId, kMaxDevices> t_stream{};

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr DeviceType static_type = kDev;
  DeviceType type() const override {
    return kDev;
  }
  Device exchangeDevice(Device d) const override {
    Device old = getDevice();
    if (d.index() != old.index()) {
      setDevice(d);
    }
    return old;
  }
  Device getDevice() const override {
    return Device(kDev, t_device);
  }
  void setDevice(Device d) const override {
    TORCH_CHECK(d.type() == kDev, "emulated device guard: expected a ", c10::get_privateuse1_backend(),
                " device, got ", d);
    DeviceIndex i = d.has_index() ? d.index() : 0;
    TORCH_CHECK(i >= 0 && i < g_device_count.load(), "Invalid device ", d, ": the emulated ",
                c10::get_privateuse1_backend(), " has ", g_device_count.load(),
                " device(s) (torch_adapter.install(..., device_count=N) sets how many)");
    t_device = i;
  }
  void uncheckedSetDevice(Device d) const noexcept override {
    t_device = d.has_index() ? d.index() : 0;
  }
  c10::Stream getStream(Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, Device(kDev, d.index()), t_stream[clamp_index(d.index())]);
  }
  c10::Stream getDefaultStream(Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, Device(kDev, d.index()));
  }
  c10::Stream getNewStream(Device d, int priority = 0) const override {
    (void)priority;
    return c10::Stream(c10::Stream::UNSAFE, Device(kDev, d.index()), g_next_stream.fetch_add(1));
  }
  c10::Stream getStreamFromGlobalPool(Device d, bool isHighPriority = false) const override {
    (void)isHighPriority;
    return getNewStream(d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto& slot = t_stream[clamp_index(s.device_index())];
    c10::Stream old(c10::Stream::UNSAFE, s.device(), slot);
    slot = s.id();
    return old;
  }
  DeviceIndex deviceCount() const noexcept override {
    return static_cast<DeviceIndex>(g_device_count.load());
  }
  void record(void** event, const c10::Stream& stream, const DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    (void)stream; (void)device_index; (void)flag;
    if (*event == nullptr) {
      *event = new EventRecord();
    }
    static_cast<EventRecord*>(*event)->when = std::chrono::steady_clock::now();
  }
  void block(void* event, const c10::Stream& stream) const override {
    (void)event; (void)stream;
  }
  bool queryEvent(void* event) const override {
    (void)event;
    return true;
  }
  void destroyEvent(void* event, const DeviceIndex device_index) const noexcept override {
    (void)device_index;
    delete static_cast<EventRecord*>(event);
  }
  bool queryStream(const c10::Stream& stream) const override {
    (void)stream;
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    (void)stream;
  }
  void synchronizeEvent(void* event) const override {
    (void)event;
  }
  void synchronizeDevice(const DeviceIndex device_index) const override {
    (void)device_index;
  }
  double elapsedTime(void* event1, void* event2, const DeviceIndex device_index) const override {
    (void)device_index;
    TORCH_CHECK(event1 && event2, "Both events must be recorded before calculating elapsed time.");
    auto a = static_cast<EventRecord*>(event1)->when;
    auto b = static_cast<EventRecord*>(event2)->when;
    return std::chrono::duration<double, std::milli>(b - a).count();
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    (void)data_ptr; (void)stream;
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// ---------------------------------------------------------------------------------------------
// Generators: the device's RNG is the CPU's algorithm (so a device kernel, which is the CPU's
// kernel, draws from it), held by a generator whose device is the emulated one. The devices'
// default generators draw from the host's default generator, as the CPU target's "cuda" does:
// a program seeded once draws the same numbers on the emulated device as on the CPU target, so
// the two runs compare loss for loss. torch.Generator("npu") objects have their own state.
struct Generator final : c10::GeneratorImpl {
  at::Generator host;  // a CPUGeneratorImpl: what the CPU kernels are handed

  explicit Generator(DeviceIndex index)
      : c10::GeneratorImpl{Device(kDev, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)},
        host(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

  void set_current_seed(uint64_t seed) override {
    host.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    host.set_offset(offset);
  }
  uint64_t get_offset() const override {
    return host.get_offset();
  }
  uint64_t current_seed() const override {
    return host.current_seed();
  }
  uint64_t seed() override {
    return host.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    host.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return host.unsafeGetGeneratorImpl()->get_state();
  }
  Generator* clone_impl() const override {
    auto* g = new Generator(device_.index());
    g->host = host.clone();
    return g;
  }
};

std::array<at::Generator, kMaxDevices> g_default_generators;
std::once_flag g_generators_once;

const at::Generator& default_generator(DeviceIndex index) {
  std::call_once(g_generators_once, [] {
    for (int i = 0; i < kMaxDevices; ++i) {
      g_default_generators[i] = at::make_generator<Generator>(static_cast<DeviceIndex>(i));
      static_cast<Generator*>(g_default_generators[i].unsafeGetGeneratorImpl())->host =
          at::detail::getDefaultCPUGenerator();
    }
  });
  DeviceIndex i = index < 0 ? t_device : index;
  TORCH_CHECK(i < g_device_count.load(), "no emulated device ", static_cast<int>(i));
  return g_default_generators[i];
}

// ---------------------------------------------------------------------------------------------
// PrivateUse1 hooks.
void resize_device_bytes(c10::StorageImpl* storage, size_t newsize) {
  DeviceIndex device = storage->device().index();
  c10::DeviceGuard guard(Device(kDev, device));
  c10::DataPtr fresh = g_allocator.allocate(newsize);
  size_t keep = std::min(newsize, storage->nbytes());
  if (keep && storage->data() && fresh.get()) {
    std::memcpy(fresh.get(), storage->data(), keep);
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(newsize);
}

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  const at::Generator& getDefaultGenerator(DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(DeviceIndex device_index = -1) const override {
    return at::make_generator<Generator>(device_index < 0 ? t_device : device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    (void)data;
    return Device(kDev, t_device);
  }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    return g_pinned.count(data) > 0;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  bool hasPrimaryContext(DeviceIndex device_index) const override {
    (void)device_index;
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<DeviceIndex>(g_device_count.load());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    t_device = device;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return t_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = t_device;
    t_device = device;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_device_bytes(storage.unsafeGetStorageImpl(), newsize);
  }
};

// ---------------------------------------------------------------------------------------------
// Routing counters, read by torch_adapter's routing log: per op, calls and time of device kernels
// and of fallbacks, and the bytes each fallback copied between the host and the device.
struct OpCounter {
  int64_t calls = 0;
  int64_t ns = 0;
  int64_t bytes_to_host = 0;    // inputs copied to the host
  int64_t bytes_from_host = 0;  // results and mutated arguments copied back
};
std::mutex g_count_mutex;
std::unordered_map<std::string, OpCounter> g_fallback_counts;
std::atomic<bool> g_count_native{false};
std::unordered_map<std::string, OpCounter> g_native_counts;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string op_key(const c10::OperatorHandle& op) {
  const auto& n = op.schema().operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

// ---------------------------------------------------------------------------------------------
// Cross-device checks, as the backends' generated wrappers do (torch's own error text): every
// defined tensor argument on one device, CPU zero-dim tensors allowed (TensorIterator's rule).
std::unordered_set<std::string> g_mixed_ok;  // ops whose CUDA kernels take host tensors (indices)

void check_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first,
                   std::optional<Device>& common) {
  const auto& args = op.schema().arguments();
  static thread_local std::string method;
  bool host_ok = false;
  bool named = false;
  auto consider = [&](const at::Tensor& t, size_t i) {
    if (!t.defined()) {
      return;
    }
    if (t.device().type() == DeviceType::CPU) {
      // A host scalar as an input, never as a written argument (out=, in-place self): TensorIterator
      // allows CPU scalars for inputs only, and CUDA's wrappers check out= exactly.
      const auto* alias = args[i].alias_info();
      if (t.dim() == 0 && !(alias && alias->isWrite())) {
        return;
      }
      if (!named) {
        host_ok = g_mixed_ok.count(op.schema().operator_name().name) > 0;
        named = true;
      }
      if (host_ok) {
        return;
      }
    }
    if (!common.has_value()) {
      common = t.device();
    } else if (*common != t.device()) {
      method = "wrapper_" + c10::get_privateuse1_backend(true) + "_" + op_key(op);
      c10::impl::common_device_check_failure(*common, t, method.c_str(), args[i].name().c_str());
    }
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      consider(v.toTensor(), i);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        consider(t, i);
      }
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) {
          consider(e.toTensor(), i);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Device kernels: the CPU kernel on the device's memory.

// The lazy math bits (conj, neg) of ``from`` on ``to``: a host view or a result stands for the same
// values only with them (t.conj() is a view with the conjugate bit; kernels that take such views
// as they are - copy_, mm, clone - read the bit).
void copy_math_bits(const at::Tensor& to, const at::Tensor& from) {
  c10::TensorImpl* impl = to.unsafeGetTensorImpl();
  if (impl->is_conj() != from.is_conj()) {
    impl->_set_conj(from.is_conj());
  }
  if (impl->is_neg() != from.is_neg()) {
    impl->_set_neg(from.is_neg());
  }
}

struct HostView {
  at::Tensor held;                       // the CPU tensor handed to the kernel (kept alive: the
                                         // kernel pops its arguments off the stack)
  c10::TensorImpl* view;                 // held's impl
  c10::StorageImpl* view_storage;        // its storage
  at::Tensor original;                   // the device tensor it stands for
  void* data;                            // the storage's data pointer when handed over
};

at::Tensor host_view(const at::Tensor& t, std::vector<HostView>& views) {
  for (auto& hv : views) {  // one view per device tensor (an argument given twice stays one tensor)
    if (hv.original.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      return hv.held;
    }
  }
  const c10::Storage& s = t.storage();
  // Arguments on one device storage get views on one host storage, so the CPU kernel's own overlap
  // checks (get_overlap_status compares storages) see what the device tensors share:
  // y.index_add_(0, i, y[:3]) raises "unsupported operation" as on CUDA.
  c10::Storage host;
  for (const auto& hv : views) {
    if (hv.original.storage().unsafeGetStorageImpl() == s.unsafeGetStorageImpl()) {
      host = hv.held.storage();
      break;
    }
  }
  if (!host) {
    // s.data(), not mutable_data(): a copy-on-write storage that is only read stays shared
    // (device_kernel materializes the written arguments first).
    host = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), s.nbytes(),
        c10::DataPtr(const_cast<void*>(s.data()), Device(DeviceType::CPU)), &g_host_view_allocator,
        /*resizable=*/true));
  }
  auto view = at::detail::make_tensor<c10::TensorImpl>(std::move(host),
                                                       c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  copy_math_bits(view, t);
  views.push_back({view, view.unsafeGetTensorImpl(), view.storage().unsafeGetStorageImpl(), t,
                   const_cast<void*>(s.data())});
  return view;
}

at::Tensor device_alias(const at::Tensor& out, const at::Tensor& base) {
  auto r = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                    base.key_set(), out.dtype());
  r.unsafeGetTensorImpl()->set_sizes_and_strides(out.sizes(), out.strides(), out.storage_offset());
  copy_math_bits(r, out);
  return r;
}

struct Adoption {
  c10::StorageImpl* host;
  c10::Storage device;
};

at::Tensor adopt(const at::Tensor& out, DeviceIndex device, std::vector<Adoption>& adopted) {
  c10::StorageImpl* hs = out.storage().unsafeGetStorageImpl();
  c10::Storage ds;
  for (auto& a : adopted) {
    if (a.host == hs) {
      ds = a.device;
    }
  }
  if (!ds) {
    size_t nbytes = hs->nbytes();
    c10::DataPtr inner = hs->set_data_ptr(c10::DataPtr(nullptr, Device(DeviceType::CPU)));
    void* ptr = inner.get();
    account(device, static_cast<int64_t>(nbytes));
    c10::DataPtr owned;
    if (ptr != nullptr && ptr == inner.get_context()) {
      // a simple allocation (the CPU allocator's): kept simple, so that copy-on-write can wrap it
      c10::DeleterFnPtr deleter = inner.get_deleter();
      inner.release_context();
      {
        std::lock_guard<std::mutex> lock(g_blocks_mutex);
        g_blocks[ptr] = BlockInfo{nbytes, device, deleter};
      }
      owned = c10::DataPtr(ptr, ptr, &free_block, Device(kDev, device));
    } else {
      owned = c10::DataPtr(ptr, new Adopted{std::move(inner), nbytes, device}, &free_adopted, Device(kDev, device));
    }
    ds = c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(owned), &g_allocator, /*resizable=*/true));
    adopted.push_back({hs, ds});
  }
  auto r = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(ds), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    out.dtype());
  r.unsafeGetTensorImpl()->set_sizes_and_strides(out.sizes(), out.strides(), out.storage_offset());
  copy_math_bits(r, out);
  return r;
}

// A device tensor handed to the kernel as a host view, which the kernel resized or restrided
// (an out= argument, resize_, as_strided_): the device tensor takes the view's memory and shape.
void write_back(const HostView& hv) {
  c10::TensorImpl* dst = hv.original.unsafeGetTensorImpl();
  c10::StorageImpl* vs = hv.view_storage;
  // (a host storage several arguments share moves to the device storage once)
  if (vs->data() != hv.data && hv.original.storage().unsafeGetStorageImpl()->data() == hv.data) {
    c10::DataPtr moved = vs->set_data_ptr(c10::DataPtr(nullptr, Device(DeviceType::CPU)));
    moved.unsafe_set_device(Device(kDev, hv.original.device().index()));
    c10::StorageImpl* ds = hv.original.storage().unsafeGetStorageImpl();
    ds->set_data_ptr_noswap(std::move(moved));
    ds->set_nbytes(vs->nbytes());
  } else if (vs->nbytes() != hv.original.storage().nbytes()) {
    hv.original.storage().unsafeGetStorageImpl()->set_nbytes(vs->nbytes());
  }
  if (dst->sizes() != hv.view->sizes() || dst->strides() != hv.view->strides() ||
      dst->storage_offset() != hv.view->storage_offset()) {
    dst->set_sizes_and_strides(hv.view->sizes(), hv.view->strides(), hv.view->storage_offset());
  }
}

c10::IValue to_device(const c10::IValue& v, DeviceIndex device, const std::vector<HostView>& views,
                      std::vector<Adoption>& adopted, const std::vector<c10::TensorImpl*>& host_inputs);

at::Tensor tensor_to_device(const at::Tensor& out, DeviceIndex device, const std::vector<HostView>& views,
                            std::vector<Adoption>& adopted, const std::vector<c10::TensorImpl*>& host_inputs) {
  if (!out.defined()) {
    return out;
  }
  c10::TensorImpl* impl = out.unsafeGetTensorImpl();
  for (const auto& hv : views) {
    if (hv.view == impl) {
      return hv.original;  // in-place / out=: the argument itself
    }
  }
  for (c10::TensorImpl* h : host_inputs) {
    if (h == impl) {
      return out;  // a host tensor the caller passed (zero-dim scalars): returned as given
    }
  }
  if (out.is_sparse() && out.device().type() == DeviceType::CPU) {
    // a sparse result (dense.to_sparse() as the device's kernel): its indices and values become the
    // device's (adopted, not copied), the sparse tensor one of the device
    at::Tensor i = tensor_to_device(out._indices(), device, views, adopted, host_inputs);
    at::Tensor v = tensor_to_device(out._values(), device, views, adopted, host_inputs);
    return at::_sparse_coo_tensor_with_dims_and_tensors(out.sparse_dim(), out.dense_dim(), out.sizes(), i, v,
                                                        out.options().device(v.device()), out.is_coalesced());
  }
  if (out.device().type() != DeviceType::CPU || !out.has_storage()) {
    return out;
  }
  c10::StorageImpl* s = out.storage().unsafeGetStorageImpl();
  for (const auto& hv : views) {
    if (hv.view_storage == s) {
      return device_alias(out, hv.original);  // a view of an argument
    }
  }
  return adopt(out, device, adopted);
}

c10::IValue to_device(const c10::IValue& v, DeviceIndex device, const std::vector<HostView>& views,
                      std::vector<Adoption>& adopted, const std::vector<c10::TensorImpl*>& host_inputs) {
  if (v.isTensor()) {
    return tensor_to_device(v.toTensor(), device, views, adopted, host_inputs);
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(tensor_to_device(t, device, views, adopted, host_inputs));
    }
    return out;
  }
  return v;
}

bool is_generator_arg(const c10::Argument& a) {
  const auto& t = a.type();
  if (t->kind() == c10::TypeKind::GeneratorType) {
    return true;
  }
  if (t->kind() == c10::TypeKind::OptionalType) {
    return t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

bool is_device_arg(const c10::Argument& a) {
  const auto& t = a.type();
  if (t->kind() == c10::TypeKind::DeviceObjType) {
    return true;
  }
  if (t->kind() == c10::TypeKind::OptionalType) {
    return t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::DeviceObjType;
  }
  return false;
}

// Generators handed to a CPU kernel: the device generator's host generator (None: the current
// device's default generator, so torch.npu.manual_seed governs the device's random ops).
void host_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first, DeviceIndex device) {
  const auto& args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (!is_generator_arg(args[i])) {
      continue;
    }
    c10::IValue& v = (*stack)[first + i];
    if (v.isNone()) {
      v = static_cast<Generator*>(default_generator(device).unsafeGetGeneratorImpl())->host;
    } else if (v.isGenerator()) {
      at::Generator g = v.toGenerator();
      if (g.device().type() == kDev) {
        v = static_cast<Generator*>(g.unsafeGetGeneratorImpl())->host;
      }
    }
  }
}

void materialize_device(const c10::IValue& v) {
  auto one = [](const at::Tensor& t) {
    if (t.defined() && t.device().type() == kDev && t.has_storage()) {
      (void)t.storage().mutable_data();
    }
  };
  if (v.isTensor()) {
    one(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      one(t);
    }
  }
}

// A device kernel for a float16/bfloat16 op whose CPU kernel has no such dtype (multilabel_margin_loss,
// ...: the CPU's AT_DISPATCH lacks Half where the device's kernel, the vendor's, has it): the device
// computes it in float32 and rounds the results to the argument's dtype, as a device kernel that
// accumulates in float32 does. Only for ops that write no argument (their results are new tensors);
// a fallback (an op the vendor lacks) keeps the host's refusal, as on the real device.
bool is_low_precision(c10::ScalarType t) {
  return t == c10::ScalarType::Half || t == c10::ScalarType::BFloat16;
}

bool lacks_dtype(const char* what, c10::ScalarType t) {
  const std::string needle = std::string("not implemented for '") + c10::toString(t) + "'";
  return std::strstr(what, needle.c_str()) != nullptr;
}

c10::IValue widen(const c10::IValue& v, c10::ScalarType t) {
  if (v.isTensor()) {
    const at::Tensor& x = v.toTensor();
    return x.defined() && x.scalar_type() == t ? c10::IValue(x.to(at::kFloat)) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& x : v.toTensorList()) {
      out.push_back(x.defined() && x.scalar_type() == t ? x.to(at::kFloat) : x);
    }
    return out;
  }
  return v;
}

c10::IValue narrow_result(const c10::IValue& v, c10::ScalarType t) {
  if (v.isTensor()) {
    const at::Tensor& x = v.toTensor();
    return x.defined() && x.scalar_type() == at::kFloat ? c10::IValue(x.to(t)) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& x : v.toTensorList()) {
      out.push_back(x.defined() && x.scalar_type() == at::kFloat ? x.to(t) : x);
    }
    return out;
  }
  return v;
}

void widened_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first,
                    std::vector<c10::IValue> saved, c10::ScalarType t) {
  stack->resize(first);
  for (const c10::IValue& v : saved) {
    stack->push_back(widen(v, t));
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  const size_t nret = op.schema().returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    (*stack)[i] = narrow_result((*stack)[i], t);
  }
}

void device_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const int64_t start = g_count_native.load(std::memory_order_relaxed) ? now_ns() : 0;
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t n = args.size();
  const size_t first = stack->size() - n;

  std::optional<Device> common;
  check_devices(op, *stack, first, common);
  DeviceIndex device = t_device;
  bool adopt_outputs = true;
  if (common.has_value() && common->type() == kDev) {
    device = common->index();
  }
  // Written arguments' copy-on-write storages are materialized before any view is made (a view of a
  // read argument on the same storage then sees the materialized memory).
  bool writes = false;
  for (size_t i = 0; i < n; ++i) {
    const auto* alias = args[i].alias_info();
    if (alias && alias->isWrite()) {
      writes = true;
      materialize_device((*stack)[first + i]);
    }
  }
  std::vector<HostView> views;
  views.reserve(4);
  std::vector<c10::TensorImpl*> host_inputs;
  bool any_generator = false;
  std::optional<c10::ScalarType> lowp;  // the first float16/bfloat16 device tensor argument's dtype
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && t.device().type() == kDev) {
        if (!lowp.has_value() && is_low_precision(t.scalar_type())) {
          lowp = t.scalar_type();
        }
        v = host_view(t, views);
      } else if (t.defined()) {
        host_inputs.push_back(t.unsafeGetTensorImpl());
      }
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list = v.toTensorList();
      c10::List<at::Tensor> mapped;
      mapped.reserve(list.size());
      for (const at::Tensor& t : list) {
        mapped.push_back(t.defined() && t.device().type() == kDev ? host_view(t, views) : t);
      }
      v = mapped;
    } else if (v.isList() && args[i].type()->kind() == c10::TypeKind::ListType) {
      // List[Optional[Tensor]] (index, index_put_)
      auto elem = args[i].type()->castRaw<c10::ListType>()->getElementType();
      if (elem->kind() == c10::TypeKind::OptionalType) {
        c10::List<std::optional<at::Tensor>> list = v.to<c10::List<std::optional<at::Tensor>>>();
        c10::List<std::optional<at::Tensor>> mapped;
        mapped.reserve(list.size());
        for (std::optional<at::Tensor> t : list) {
          if (t.has_value() && t->defined() && t->device().type() == kDev) {
            mapped.push_back(host_view(*t, views));
          } else {
            mapped.push_back(t);
          }
        }
        v = mapped;
      }
    } else if (v.isDevice() && is_device_arg(args[i])) {
      Device d = v.toDevice();
      if (d.type() == kDev) {
        device = d.has_index() ? d.index() : t_device;
        v = Device(DeviceType::CPU);
      } else {
        adopt_outputs = false;  // the op was asked for a host result
      }
    } else if (!any_generator && is_generator_arg(args[i])) {
      any_generator = true;
    }
  }
  if (any_generator) {
    host_generators(op, stack, first, device);
  }
  c10::DeviceGuard guard(Device(kDev, device));
  {
    // The kernel is the device's: what the CPU kernel calls inside it on host views is not seen
    // (observers, profilers), as a real device kernel's insides are not.
    at::DisableRecordFunctionGuard hidden;
    if (lowp.has_value() && !writes) {
      std::vector<c10::IValue> saved(stack->begin() + first, stack->end());
      try {
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
      } catch (const c10::NotImplementedError& e) {
        if (!lacks_dtype(e.what_without_backtrace(), *lowp)) {
          throw;
        }
        widened_kernel(op, stack, first, std::move(saved), *lowp);
      }
    } else {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    }
  }

  // Mutated arguments the kernel resized or restrided.
  for (const auto& hv : views) {
    if (hv.view_storage->data() != hv.data || hv.view->sizes() != hv.original.sizes() ||
        hv.view->strides() != hv.original.strides() || hv.view->storage_offset() != hv.original.storage_offset()) {
      write_back(hv);
    }
  }
  const size_t nret = schema.returns().size();
  if (adopt_outputs) {
    // A quantized result (quantize_per_tensor's QTensorImpl) cannot become a device tensor: the device
    // has no quantized tensors (torch's Quantized<name> key has no kernels), as _empty_affine_quantized
    // on it says; adopting it as a plain tensor of a quantized dtype would lose its quantizer.
    for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
      const c10::IValue& r = (*stack)[i];
      TORCH_CHECK_NOT_IMPLEMENTED(!(r.isTensor() && r.toTensor().defined() && r.toTensor().is_quantized()),
                                  op_key(op), " on the emulated ", c10::get_privateuse1_backend(),
                                  ": its result is a quantized tensor, and the device has none (torch's 'Quantized",
                                  c10::get_privateuse1_backend(), "' backend has no kernels)");
    }
    std::vector<Adoption> adopted;
    for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
      (*stack)[i] = to_device((*stack)[i], device, views, adopted, host_inputs);
    }
  }
  if (start) {
    std::lock_guard<std::mutex> lock(g_count_mutex);
    auto& c = g_native_counts[op_key(op)];
    c.calls += 1;
    c.ns += now_ns() - start;
  }
}

// Composite kernels the vendor lists as the device's own: the op's CompositeExplicitAutograd /
// CompositeImplicitAutograd kernel (what the dispatcher keeps in the CPU slot when the CPU has no
// kernel of its own) run as the device's kernel on the device's tensors — its pieces dispatch on
// the device. A CompositeImplicitAutograd op gets the same kernel for autograd (AutogradCPU's slot
// holds it): a device kernel there would otherwise hide the decomposition autograd needs.
void composite_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

void composite_autograd_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::AutogradCPU), stack);
}

// ---------------------------------------------------------------------------------------------
// The boxed fallback: torch's own CPU fallback (inputs copied to the host, the CPU kernel, results
// and mutated arguments copied back), with the device check, the device's generators, and the
// copies counted.
int64_t device_bytes(const torch::jit::Stack& stack, size_t first, size_t count) {
  int64_t bytes = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && t.device().type() == kDev) {
      if (t.is_sparse()) {  // what moves: its indices and values
        const at::Tensor i = t._indices(), v = t._values();
        bytes += static_cast<int64_t>(i.numel()) * static_cast<int64_t>(i.element_size()) +
                 static_cast<int64_t>(v.numel()) * static_cast<int64_t>(v.element_size());
      } else {
        bytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
      }
    }
  };
  for (size_t i = first; i < first + count && i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        add(t);
      }
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) {
          add(e.toTensor());
        }
      }
    }
  }
  return bytes;
}

void fallback_on(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKey host_key) {
  const int64_t start = now_ns();
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t first = stack->size() - n;
  std::optional<Device> common;
  check_devices(op, *stack, first, common);
  DeviceIndex device = (common.has_value() && common->type() == kDev) ? common->index() : t_device;
  const int64_t to_host = device_bytes(*stack, first, n);
  int64_t from_host = 0;
  // Mutated arguments are copied back as well.
  for (size_t i = 0; i < n; ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias && alias->isWrite()) {
      from_host += device_bytes(*stack, first + i, 1);
    }
  }
  host_generators(op, stack, first, device);
  c10::DeviceGuard guard(Device(kDev, device));
  {
    at::DisableRecordFunctionGuard hidden;  // its copies are counted here, as bytes, not as ops
    at::native::cpu_fallback(op, stack, /*error_on_views=*/false, host_key);
  }
  const size_t nret = schema.returns().size();
  for (size_t i = 0; i < nret; ++i) {
    const auto* alias = schema.returns()[i].alias_info();
    if (!(alias && alias->isWrite())) {
      from_host += device_bytes(*stack, stack->size() - nret + i, 1);
    }
  }
  std::lock_guard<std::mutex> lock(g_count_mutex);
  auto& c = g_fallback_counts[op_key(op)];
  c.calls += 1;
  c.ns += now_ns() - start;
  c.bytes_to_host += to_host;
  c.bytes_from_host += from_host;
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fallback_on(op, stack, c10::DispatchKey::CPU);
}

// A sparse argument's op: the host's sparse kernel (SparseCPU) on the host copies.
void sparse_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fallback_on(op, stack, c10::DispatchKey::SparseCPU);
}

// ---------------------------------------------------------------------------------------------
// Metadata kernels every backend registers (views, storage, copies, scalars).

// torch.use_deterministic_algorithms(True) with fill_uninitialized_memory: new memory holds NaN (or the
// integer maximum), as the CPU's and CUDA's empty give it (test_torch's test_deterministic_empty).
at::Tensor& fill_if_deterministic(at::Tensor& t) {
  if (C10_UNLIKELY(at::globalContext().deterministicAlgorithms() &&
                   at::globalContext().deterministicFillUninitializedMemory())) {
    at::native::fill_empty_deterministic_(t);
  }
  return t;
}
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  const Device d = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "the emulated ", c10::get_privateuse1_backend(), " has strided tensors only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(d);
  at::Tensor t = at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype), memory_format);
  return fill_if_deterministic(t);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<Device> device,
                         std::optional<bool> pin_memory) {
  const Device d = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "the emulated ", c10::get_privateuse1_backend(), " has strided tensors only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(d);
  at::Tensor t = at::detail::empty_strided_generic(size, stride, &g_allocator,
                                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                   c10::dtype_or_default(dtype));
  return fill_if_deterministic(t);
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor as_host(const at::Tensor& t, bool written) {
  // a source is read through const_data_ptr: copying from a copy-on-write tensor leaves it shared
  void* data = written ? t.data_ptr() : const_cast<void*>(t.const_data_ptr());
  at::Tensor h = at::from_blob(data, t.sizes(), t.strides(), t.options().device(at::kCPU));
  copy_math_bits(h, t);  // copy_ conjugates / negates where the bits differ
  return h;
}

int64_t g_copy_bytes_h2d = 0, g_copy_bytes_d2h = 0, g_copy_bytes_d2d = 0;

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "_copy_from: undefined tensor");
  const int64_t nbytes = static_cast<int64_t>(self.numel()) * static_cast<int64_t>(self.element_size());
  // copy_ reaches _copy_from before the TensorIterator that checks overlap on the CPU and CUDA
  // (copy_impl re-dispatches for a device it does not know): the same checks here.
  at::assert_no_internal_overlap(dst);
  if (self.device().type() == kDev && dst.device().type() == kDev) {
    at::assert_no_partial_overlap(dst, self);
    at::Tensor d = as_host(dst, true);
    at::native::copy_(d, as_host(self, false), non_blocking);
    g_copy_bytes_d2d += nbytes;
  } else if (self.device().type() == kDev) {
    TORCH_CHECK(dst.device().type() == DeviceType::CPU, "the emulated ", c10::get_privateuse1_backend(),
                " copies to and from the CPU only, not to ", dst.device());
    at::Tensor d = dst;
    at::native::copy_(d, as_host(self, false), non_blocking);
    g_copy_bytes_d2h += nbytes;
  } else {
    TORCH_CHECK(self.device().type() == DeviceType::CPU, "the emulated ", c10::get_privateuse1_backend(),
                " copies to and from the CPU only, not from ", self.device());
    at::Tensor d = as_host(dst, true);
    at::native::copy_(d, self, non_blocking);
    g_copy_bytes_h2d += nbytes;
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(as_host(self, false));
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, source);
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage storage, int64_t offset, c10::IntArrayRef size,
                                      c10::IntArrayRef stride) {
  return at::cpu::set_(self, storage, offset, size, stride);
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, g_allocator.allocate(0), &g_allocator, /*resizable=*/true);
  return at::cpu::set_(self, empty, 0, {0}, {});
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor alias(const at::Tensor& self) {
  return at::native::alias(self);
}

at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

at::Tensor view_as_real(const at::Tensor& self) {
  return at::native::view_as_real(self);
}

at::Tensor view_as_complex(const at::Tensor& self) {
  return at::native::view_as_complex(self);
}

// `param.data = param.to(device)` across the host and the device: torch's own rule knows the in-tree
// dense backends only (TensorImpl::has_compatible_shallow_copy_type) and leaves PrivateUse1 to its
// backend (OpenReg registers this op, as a device must): without it, Module.to("npu") gave every
// parameter a new Parameter object (Module._apply's set-data path is refused), and an optimizer built
// before the move (diffusers' scripts, accelerate.prepare) held the host copies: no gradient reached
// them ("No inf checks were recorded for this optimizer").
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto plain = [](const at::Tensor& t) {
    const auto type = t.device().type();
    return t.layout() == c10::Layout::Strided && !t.is_quantized() && (type == DeviceType::CPU || type == kDev);
  };
  return (plain(self) && plain(from)) ||
         self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize_);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_", set_empty);
  // is_set_to compares storages and geometry: through the fallback it compared the host copies (never set)
  m.impl("is_set_to", TORCH_FN(at::native::is_set_to));
  m.impl("view", view);
  m.impl("alias", alias);
  m.impl("unfold", unfold);
  m.impl("view_as_real", view_as_real);
  m.impl("view_as_complex", view_as_complex);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

// ---------------------------------------------------------------------------------------------
// Sparse COO tensors on the device (torch_npu registers SparsePrivateUse1 kernels; Ascend's table marks
// add.out, mul.out, _coalesce, max "sparse"): a sparse device tensor is torch's SparseTensorImpl whose
// indices and values are device tensors. Its construction and metadata are torch's generic sparse kernels;
// every sparse computation runs through the same boxed fallback as the dense ops (indices and values
// copied to the host, the CPU's sparse kernel, the results copied back), counted as fallbacks.
// Copies into a sparse device tensor (the fallback's write-back, copy_) are torch's copy_sparse_, which
// moves indices and values to the destination's device.
at::Tensor sparse_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.is_sparse() && dst.is_sparse(), "the emulated ", c10::get_privateuse1_backend(),
              " copies a sparse tensor into a sparse tensor only (", self.layout(), " into ", dst.layout(), ")");
  at::Tensor d = dst;
  at::native::copy_sparse_(d, self, non_blocking);
  return dst;
}

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse_symint));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("copy_sparse_to_sparse_", TORCH_FN(at::native::copy_sparse_));
  m.impl("_copy_from", sparse_copy_from);
  m.impl("_copy_from_and_resize",
         [](const at::Tensor& self, const at::Tensor& dst) { return sparse_copy_from(self, dst, false); });
}

// Nested tensors on the device: torch's TransformerEncoder fast path accepts PrivateUse1 devices and packs a
// padded batch into a nested tensor there (test_nn's TransformerEncoder tests: "Could not run
// '_transformer_encoder_layer_fwd' with arguments from the 'NestedTensornpu' backend"). A nested device
// tensor is torch's NestedTensorImpl over a device buffer. torch registers its device-generic nested
// kernels for NestedTensorHPU, an accelerator outside its tree; the structural ones (allocation, copies,
// metadata: over the buffer's own ops) run here, their pieces on the device. Its computing kernels call the
// CPU's DispatchStubs (nested_layer_norm: "DispatchStub: missing kernel for npu"), so every other nested op
// is the host's nested kernel (NestedTensorCPU) through the fallback, counted. Ascend's table lists no
// nested op.
const std::unordered_set<std::string> g_nested_structural = {
    "aten::_to_copy", "aten::empty_like", "aten::copy_", "aten::clone", "aten::detach", "aten::alias",
    "aten::_nested_tensor_size", "aten::_nested_tensor_strides", "aten::_nested_tensor_storage_offsets",
    "aten::is_same_size", "aten::_nested_get_values", "aten::values", "aten::unbind", "aten::select",
    "aten::size", "aten::dim", "aten::numel", "aten::is_contiguous"};

void nested_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (g_nested_structural.count(op.schema().name()) > 0 &&
      op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorHPU)) {
    op.callBoxedForDispatchKey(c10::DispatchKey::NestedTensorHPU, *stack);
    return;
  }
  fallback_on(op, stack, c10::DispatchKey::NestedTensorCPU);
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nested_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
}

// copy_ into or out of the device reaches _copy_from (copy_impl's path for a device it does not know),
// whose schema does not mark dst as written: the conjugate / negative bit fallback would hand
// copy_from a resolved clone of a conj destination (x.conj().copy_(y) writing nothing) and resolve
// the source twice. copy_from reads both bits itself (as_host keeps them; the CPU's copy_ applies
// them), as copy_ does for the CPU and CUDA.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

// ---------------------------------------------------------------------------------------------
// Python entry points.
std::unique_ptr<torch::Library> g_native_lib;
std::unique_ptr<torch::Library> g_autograd_lib;
std::vector<std::string> g_native_ops;
std::once_flag g_hooks_once;

void register_hooks() {
  std::call_once(g_hooks_once, [] { at::RegisterPrivateUse1HooksInterface(new Hooks()); });
}

// ---------------------------------------------------------------------------------------------
// Attention: torch's scaled_dot_product_attention asks the device's ``_fused_sdp_choice_stub`` which
// kernel to run (aten's attention.cpp); a device without one gets the math decomposition. torch_npu
// registers the stub (Ascend's table lists ``_fused_sdp_choice`` and ``scaled_dot_product_attention``:
// one fused kernel). Where the table lists the choice, the device answers what its ``_fused_sdp_choice``
// kernel computes (the host's choice on the same arguments): flash, then
// ``_scaled_dot_product_flash_attention_for_cpu`` runs as the device's kernel — the fused attention
// DTensor can shard, where the math decomposition's causal mask, a plain tensor, cannot mix with DTensor
// inputs (pytorch/examples' fsdp_tp_example: "aten.add.Tensor got mixed torch.Tensor and DTensor").
std::atomic<bool> g_sdp_choice{false};

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  if (!g_sdp_choice.load()) {
    return static_cast<int64_t>(at::SDPBackend::math);
  }
  // the host's choice function, called directly: the arguments may be DTensors (torch's attention runs
  // above their dispatch), and DTensor has no sharding rule for the _fused_sdp_choice op
  return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

// Registers the device kernels: ``host`` ops run the CPU's kernel on the device's memory, ``composite``
// ops their composite kernel on the device, ``implicit`` ops that and the same for autograd
// ("add.Tensor" spelling); returns how many ops were registered.
int64_t register_native(const std::vector<std::string>& names, const std::vector<std::string>& composite,
                        const std::vector<std::string>& implicit, const std::vector<std::string>& mixed_ok) {
  TORCH_CHECK(!g_native_lib, "the emulated device's kernels are registered once per process");
  for (const auto& n : mixed_ok) {
    g_mixed_ok.insert(n);
  }
  g_native_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                  std::optional<c10::DispatchKey>(c10::DispatchKey::PrivateUse1),
                                                  __FILE__, __LINE__);
  g_autograd_lib = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", std::optional<c10::DispatchKey>(c10::DispatchKey::AutogradPrivateUse1),
      __FILE__, __LINE__);
  for (const auto& name : names) {
    g_native_lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&device_kernel>());
    g_native_ops.push_back(name);
  }
  for (const auto& name : composite) {
    g_native_lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&composite_kernel>());
    g_native_ops.push_back(name);
  }
  for (const auto& name : names) {
    if (name == "_fused_sdp_choice") {
      g_sdp_choice.store(true);  // the table lists the choice: the device picks its attention kernel
    }
  }
  for (const auto& name : implicit) {
    g_native_lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&composite_kernel>());
    g_autograd_lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&composite_autograd_kernel>());
    g_native_ops.push_back(name);
  }
  return static_cast<int64_t>(g_native_ops.size());
}

void set_device_count(int64_t n) {
  TORCH_CHECK(n >= 1 && n <= kMaxDevices, "the emulated device count must be 1..", kMaxDevices, ", got ", n);
  g_device_count.store(static_cast<int>(n));
}

py::dict memory_stats(int64_t device) {
  const auto& s = g_stats[clamp_index(static_cast<DeviceIndex>(device))];
  py::dict d;
  d["allocated_bytes.all.current"] = s.allocated.load();
  d["allocated_bytes.all.peak"] = s.peak.load();
  d["reserved_bytes.all.current"] = s.allocated.load();
  d["reserved_bytes.all.peak"] = s.peak.load();
  d["allocation.all.allocated"] = s.allocations.load();
  d["allocation.all.freed"] = s.frees.load();
  d["allocation.all.current"] = s.allocations.load() - s.frees.load();
  return d;
}

void reset_peak(int64_t device) {
  auto& s = g_stats[clamp_index(static_cast<DeviceIndex>(device))];
  s.peak.store(s.allocated.load());
}

py::dict take_counts(std::unordered_map<std::string, OpCounter>& table, bool reset) {
  py::dict d;
  std::lock_guard<std::mutex> lock(g_count_mutex);
  for (const auto& kv : table) {
    d[py::str(kv.first)] = py::make_tuple(kv.second.calls, kv.second.ns, kv.second.bytes_to_host,
                                          kv.second.bytes_from_host);
  }
  if (reset) {
    table.clear();
  }
  return d;
}

}  // namespace emu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &emu::fused_sdp_choice)
}  // namespace at::native

namespace at::autocast {
namespace {
// Autocast on the device (torch.autocast("npu")): torch registers no AutocastPrivateUse1 kernels, a
// backend brings them (torch_npu does); these are the op lists torch uses for CUDA and XPU.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

Tensor bce_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false, "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define EMU_LOW_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(EMU_LOW_PRECISION_FP)
#define EMU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(EMU_FP32)
#define EMU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(EMU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define EMU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(EMU_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN((&bce_banned)));
}

}  // namespace
}  // namespace at::autocast

namespace emu {

// Sharing device memory between processes (torch.multiprocessing), as torch_npu's IPC does: the
// storage moves once into POSIX shared memory (the CPU's mechanism: ATen's shm-fd storage) and
// stays a device storage, accounted to its device; another process maps the same memory from the
// file descriptor into a device storage of its own. Both then read and write the same bytes.
at::MapAllocator* shared_context(const c10::DataPtr& dptr) {
  if (auto* a = dptr.cast_context<Adopted>(&free_adopted)) {
    return at::MapAllocator::fromDataPtr(a->inner);
  }
  return nullptr;
}

c10::DataPtr adopt(c10::DataPtr inner, size_t nbytes, DeviceIndex device) {
  void* ptr = inner.get();
  account(device, static_cast<int64_t>(nbytes));
  auto* a = new Adopted{std::move(inner), nbytes, device};
  return {ptr, a, &free_adopted, Device(kDev, device)};
}

py::tuple share_fd(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kDev, "share_fd: expected a tensor of the emulated device, got ", t.device());
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  at::MapAllocator* ctx = shared_context(storage->data_ptr());
  if (ctx == nullptr) {
    const size_t n = storage->nbytes();
    auto shm = at::new_shm_fd_storage(n);
    if (n) std::memcpy(shm->mutable_data(), storage->data(), n);
    const DeviceIndex device = storage->device().index();
    storage->set_data_ptr_noswap(adopt(shm->set_data_ptr(c10::DataPtr()), n, device));
    ctx = shared_context(storage->data_ptr());
    TORCH_INTERNAL_ASSERT(ctx != nullptr);
  }
  return py::make_tuple(ctx->fd(), static_cast<int64_t>(ctx->size()));
}

at::Tensor from_shared_fd(int64_t fd, int64_t nbytes, int64_t device) {
  TORCH_CHECK(device >= 0 && device < g_device_count.load(), "from_shared_fd: no emulated device ", device);
  const int flags = at::ALLOCATOR_MAPPED_SHAREDMEM | at::ALLOCATOR_MAPPED_NOCREATE | at::ALLOCATOR_MAPPED_KEEPFD |
                    at::ALLOCATOR_MAPPED_FROMFD;
  const int own_fd = ::dup(static_cast<int>(fd));
  TORCH_CHECK(own_fd >= 0, "from_shared_fd: could not duplicate file descriptor ", fd);
  auto mapped = at::MapAllocator::makeDataPtr(at::WITH_FD, "", own_fd, flags, static_cast<size_t>(nbytes), nullptr);
  auto storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes,
      adopt(std::move(mapped), static_cast<size_t>(nbytes), static_cast<DeviceIndex>(device)), nullptr, false);
  auto out = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(Device(kDev, static_cast<DeviceIndex>(device))));
  out.set_(c10::Storage(std::move(storage)), 0, {nbytes}, {1});
  return out;
}

}  // namespace emu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_adapter's emulated PrivateUse1 device";
  m.def("register_hooks", &emu::register_hooks);
  m.def("register_native", &emu::register_native, py::arg("names"), py::arg("composite"), py::arg("implicit"),
        py::arg("mixed_ok"));
  m.def("native_ops", [] { return emu::g_native_ops; });
  m.def("set_device_count", &emu::set_device_count);
  m.def("device_count", [] { return emu::g_device_count.load(); });
  m.def("current_device", [] { return static_cast<int64_t>(emu::t_device); });
  m.def("set_device", [](int64_t i) {
    TORCH_CHECK(i >= 0 && i < emu::g_device_count.load(), "Invalid device index ", i, ": the emulated ",
                c10::get_privateuse1_backend(), " has ", emu::g_device_count.load(), " device(s)");
    emu::t_device = static_cast<c10::DeviceIndex>(i);
  });
  m.def("memory_stats", &emu::memory_stats);
  m.def("set_capacity", [](int64_t bytes) { emu::g_capacity.store(bytes); });
  m.def("capacity", []() { return emu::g_capacity.load(); });
  m.def("reset_peak", &emu::reset_peak);
  m.def("default_generator", [](int64_t i) { return emu::default_generator(static_cast<c10::DeviceIndex>(i)); });
  m.def("fallback_counts", [](bool reset) { return emu::take_counts(emu::g_fallback_counts, reset); },
        py::arg("reset") = false);
  m.def("native_counts", [](bool reset) { return emu::take_counts(emu::g_native_counts, reset); },
        py::arg("reset") = false);
  m.def("count_native", [](bool on) { emu::g_count_native.store(on); });
  m.def("share_fd", &emu::share_fd);
  m.def("from_shared_fd", &emu::from_shared_fd, py::arg("fd"), py::arg("nbytes"), py::arg("device"));
  m.def("is_shared", [](const at::Tensor& t) { return emu::shared_context(t.storage().data_ptr()) != nullptr; });
  // torch.npu._lazy_init runs again at the next device tensor (the start-up probe's does not count)
  m.def("rearm_lazy_init", [] { torch::utils::set_requires_device_init(emu::kDev, true); });
  m.def("copy_bytes", [] {
    return py::make_tuple(emu::g_copy_bytes_h2d, emu::g_copy_bytes_d2h, emu::g_copy_bytes_d2d);
  });
}
