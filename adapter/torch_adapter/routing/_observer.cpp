// torch_adapter op observer: a global RecordFunction callback that counts dispatcher ops.
//
// Built at first use by torch_adapter/routing/observe.py (torch.utils.cpp_extension.load),
// never at import. It includes only ATen/record_function.h and pybind11, which keeps the
// compile short.
//
// What it records, per thread, cumulatively while registered (FUNCTION scope only, i.e.
// dispatcher op calls; no inputs, no outputs, no ids):
//   calls[id]               how many times op `id` ran
//   self_ns[id]             wall time inside op `id` minus time inside the ops it called
//   children[(parent,id)]   how many times op `id` ran directly under op `parent`
// Ops get small integer ids the first time they are seen ("aten::add.Tensor"). The hot path
// is: a thread-local open-addressing cache from the (name, overload) pointers of the op's
// schema to its id, a thread-local stack of open calls, and counter updates under a
// per-thread spin lock that only snapshot() ever contends for.
//
// Python takes a snapshot at start and at stop and subtracts, so observers can nest.
// Nothing here may throw into the dispatcher: every callback body is wrapped, and a
// failure only increments an error counter that Python reports.

#include <ATen/record_function.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) {
      }
    }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

struct Frame {
  const at::RecordFunction* rf;
  int32_t id;
  uint64_t t0;
  uint64_t child_ns;
};

struct CacheEntry {
  const char* name = nullptr;
  const char* overload = nullptr;
  int32_t id = -1;
};

struct ThreadData {
  SpinLock lock;  // guards calls, self_ns, children, events
  std::vector<uint64_t> calls;
  std::vector<uint64_t> self_ns;
  std::unordered_map<uint64_t, uint64_t> children;
  uint64_t events = 0;
  // owner thread only
  std::vector<Frame> stack;
  std::vector<CacheEntry> cache = std::vector<CacheEntry>(1024);
  size_t cache_used = 0;
  std::atomic<bool> alive{true};
};

std::mutex g_mu;  // guards everything below
std::vector<std::string> g_names;
std::unordered_map<std::string, int32_t> g_ids;
std::vector<std::shared_ptr<ThreadData>> g_threads;
// totals of threads that have exited, folded in by snapshot()
std::vector<uint64_t> g_retired_calls, g_retired_self;
std::unordered_map<uint64_t, uint64_t> g_retired_children;
uint64_t g_retired_events = 0;
at::CallbackHandle g_handle = 0;
int g_refs = 0;
std::atomic<uint64_t> g_errors{0};
constexpr size_t kMaxDepth = 1024;

struct Holder {
  std::shared_ptr<ThreadData> td;
  ~Holder() {
    if (td) td->alive.store(false);
  }
};

ThreadData* thread_data() {
  thread_local Holder holder;
  if (!holder.td) {
    auto td = std::make_shared<ThreadData>();
    std::lock_guard<std::mutex> guard(g_mu);
    g_threads.push_back(td);
    holder.td = std::move(td);
  }
  return holder.td.get();
}

int32_t intern(const at::RecordFunction& fn) {
  std::string key;
  auto op = fn.operator_name();
  if (op.has_value()) {
    key = op->name;
    if (!op->overload_name.empty()) key += "." + op->overload_name;
  } else {
    key = fn.name();
  }
  std::lock_guard<std::mutex> guard(g_mu);
  auto it = g_ids.find(key);
  if (it != g_ids.end()) return it->second;
  auto id = static_cast<int32_t>(g_names.size());
  g_names.push_back(key);
  g_ids.emplace(std::move(key), id);
  return id;
}

inline size_t slot_of(const char* a, const char* b, size_t mask) {
  auto h = reinterpret_cast<uintptr_t>(a) * 0x9E3779B97F4A7C15ull ^ reinterpret_cast<uintptr_t>(b);
  return (h ^ (h >> 29)) & mask;
}

void cache_insert(ThreadData* td, const char* name, const char* overload, int32_t id) {
  if ((td->cache_used + 1) * 2 > td->cache.size()) {
    std::vector<CacheEntry> old(td->cache.size() * 2);
    old.swap(td->cache);
    td->cache_used = 0;
    for (const auto& e : old)
      if (e.name) cache_insert(td, e.name, e.overload, e.id);
  }
  size_t mask = td->cache.size() - 1;
  for (size_t i = slot_of(name, overload, mask);; i = (i + 1) & mask) {
    auto& e = td->cache[i];
    if (!e.name || (e.name == name && e.overload == overload)) {
      if (!e.name) td->cache_used++;
      e = CacheEntry{name, overload, id};
      return;
    }
  }
}

// Schema-backed names are stable pointers; a name built per event (a string scope) may reuse
// an address with other text, so a hit is confirmed by comparing the text too.
inline int32_t op_id(ThreadData* td, const at::RecordFunction& fn) {
  const char* name = fn.name();
  const char* overload = fn.overload_name();
  size_t mask = td->cache.size() - 1;
  for (size_t i = slot_of(name, overload, mask);; i = (i + 1) & mask) {
    const auto& e = td->cache[i];
    if (!e.name) break;
    if (e.name == name && e.overload == overload) {
      if (std::strcmp(e.name, name) == 0) return e.id;
      break;
    }
  }
  int32_t id = intern(fn);
  cache_insert(td, name, overload, id);
  return id;
}

template <typename T>
inline void bump(std::vector<T>& v, int32_t id, T by) {
  if (static_cast<size_t>(id) >= v.size()) v.resize(static_cast<size_t>(id) + 64, 0);
  v[id] += by;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  try {
    ThreadData* td = thread_data();
    int32_t id = op_id(td, fn);
    int32_t parent = td->stack.empty() ? -1 : td->stack.back().id;
    {
      std::lock_guard<SpinLock> guard(td->lock);
      bump<uint64_t>(td->calls, id, 1);
      td->events++;
      if (parent >= 0) td->children[(static_cast<uint64_t>(parent) << 32) | static_cast<uint32_t>(id)]++;
    }
    if (td->stack.size() < kMaxDepth) td->stack.push_back(Frame{&fn, id, now_ns(), 0});
  } catch (...) {
    g_errors.fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  try {
    uint64_t t1 = now_ns();
    ThreadData* td = thread_data();
    auto& stack = td->stack;
    // Normally the top frame; frames above it belong to calls whose end we never saw.
    size_t i = stack.size();
    while (i > 0 && stack[i - 1].rf != &fn) --i;
    if (i == 0) return;  // started before we were registered, or beyond kMaxDepth
    Frame frame = stack[i - 1];
    stack.resize(i - 1);
    uint64_t total = t1 > frame.t0 ? t1 - frame.t0 : 0;
    uint64_t self = total > frame.child_ns ? total - frame.child_ns : 0;
    if (!stack.empty()) stack.back().child_ns += total;
    std::lock_guard<SpinLock> guard(td->lock);
    bump<uint64_t>(td->self_ns, frame.id, self);
  } catch (...) {
    g_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

void acquire() {
  std::lock_guard<std::mutex> guard(g_mu);
  if (g_refs++ == 0) {
    g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                          .scopes({at::RecordScope::FUNCTION})
                                          .needsInputs(false)
                                          .needsOutputs(false)
                                          .needsIds(false));
  }
}

void release() {
  std::lock_guard<std::mutex> guard(g_mu);
  if (g_refs == 0) return;
  if (--g_refs == 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
}

bool registered() {
  std::lock_guard<std::mutex> guard(g_mu);
  return g_handle != 0;
}

template <typename T>
void add_into(std::vector<T>& dst, const std::vector<T>& src) {
  if (dst.size() < src.size()) dst.resize(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i) dst[i] += src[i];
}

// (calls, self_ns, children, events, errors) as cumulative totals since the module loaded.
py::tuple snapshot() {
  std::vector<uint64_t> calls, self_ns;
  std::unordered_map<uint64_t, uint64_t> children;
  uint64_t events = 0;
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> guard(g_mu);
    std::vector<std::shared_ptr<ThreadData>> live;
    for (auto& td : g_threads) {
      std::lock_guard<SpinLock> tguard(td->lock);
      bool dead = !td->alive.load();
      auto& c = dead ? g_retired_calls : calls;
      auto& s = dead ? g_retired_self : self_ns;
      auto& ch = dead ? g_retired_children : children;
      add_into(c, td->calls);
      add_into(s, td->self_ns);
      for (const auto& kv : td->children) ch[kv.first] += kv.second;
      (dead ? g_retired_events : events) += td->events;
      if (!dead) live.push_back(td);
    }
    g_threads.swap(live);
    add_into(calls, g_retired_calls);
    add_into(self_ns, g_retired_self);
    for (const auto& kv : g_retired_children) children[kv.first] += kv.second;
    events += g_retired_events;
    names = g_names;
  }
  py::dict pcalls, pself, pchildren;
  for (size_t i = 0; i < calls.size(); ++i)
    if (calls[i]) pcalls[py::str(names[i])] = calls[i];
  for (size_t i = 0; i < self_ns.size(); ++i)
    if (self_ns[i]) pself[py::str(names[i])] = self_ns[i];
  for (const auto& kv : children) {
    py::str parent(names[kv.first >> 32]), child(names[kv.first & 0xffffffffu]);
    if (!pchildren.contains(parent)) pchildren[parent] = py::dict();
    py::dict(pchildren[parent])[child] = kv.second;
  }
  return py::make_tuple(pcalls, pself, pchildren, events, g_errors.load());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_adapter op observer (RecordFunction callback); see routing/observe.py";
  m.def("acquire", &acquire, "register the global callback (reference counted)");
  m.def("release", &release, "drop one reference; the last one removes the callback");
  m.def("registered", &registered, "whether our callback is registered now");
  m.def("has_global_callbacks", &at::hasGlobalCallbacks, "whether any global RecordFunction callback exists");
  m.def("snapshot", &snapshot, "cumulative (calls, self_ns, children, events, errors)");
}
