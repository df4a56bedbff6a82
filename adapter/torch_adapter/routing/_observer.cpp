// torch_adapter op observer: a global RecordFunction callback that counts dispatcher ops.
//
// Built at first use by torch_adapter/routing/observe.py (torch.utils.cpp_extension.load),
// never at import. It includes only ATen/record_function.h and pybind11, which keeps the
// compile short.
//
// What it records, per thread, cumulatively while registered (FUNCTION scope only: every
// dispatcher op call at every depth, plus the few ranges C++ code names by a string; no
// inputs, outputs or ids are requested, so the dispatcher boxes nothing for us):
//   calls[id]             how many times op `id` ran
//   self_ns[id]           wall time inside op `id` minus time inside the ops it called
//   pairs[(parent, id)]   how many times op `id` ran directly under op `parent`
//                         (parent kTop: called from outside any observed op)
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
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Taken by its owner thread around each counter update and by snapshot(); contended only
// while a snapshot copies the counters, so the owner rarely spins (and yields if it does).
class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; flag_.load(std::memory_order_relaxed); ++spins) {
        if (spins > 64) std::this_thread::yield();
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
  bool named;  // a range named by a string ("PythonDispatchMode"), not a dispatcher op
};

// (name, overload) pointers of a dispatcher op's schema -> op id. `text` is our own copy of
// the name, compared on every hit so that a schema freed and replaced at the same address
// (a torch.library op deleted and another defined) is not taken for the old one.
struct CacheEntry {
  const char* name = nullptr;
  const char* overload = nullptr;
  const char* text = nullptr;
  int32_t id = -1;
};

// Open-addressing counter table keyed by (parent id << 32 | child id).
class PairCounts {
 public:
  static constexpr uint64_t kEmpty = ~0ull;
  PairCounts() : keys_(256, kEmpty), vals_(256, 0) {}
  void add(uint64_t key, uint64_t by) {
    if ((used_ + 1) * 2 > keys_.size()) grow();
    size_t mask = keys_.size() - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key) {
        vals_[i] += by;
        return;
      }
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        vals_[i] = by;
        used_++;
        return;
      }
    }
  }
  template <typename F>
  void for_each(F f) const {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
  }

 private:
  static size_t mix(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(k ^ (k >> 32));
  }
  void grow() {
    std::vector<uint64_t> keys(keys_.size() * 2, kEmpty), vals(keys_.size() * 2, 0);
    keys.swap(keys_);
    vals.swap(vals_);
    used_ = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != kEmpty) add(keys[i], vals[i]);
  }
  std::vector<uint64_t> keys_, vals_;
  size_t used_ = 0;
};

constexpr uint32_t kTop = 0xFFFFFFFFu;  // "parent" of a call made outside any observed op

struct ThreadData {
  SpinLock lock;  // guards calls, self_ns, pairs, events (snapshot() reads them)
  std::vector<uint64_t> calls;
  std::vector<uint64_t> self_ns;
  PairCounts pairs;  // (parent or kTop, child) -> calls
  uint64_t events = 0;
  // owner thread only
  std::vector<Frame> stack;
  std::vector<CacheEntry> cache = std::vector<CacheEntry>(256);
  size_t cache_used = 0;
  const char* string_overload = nullptr;  // overload_name() of ranges named by a string
  std::unordered_map<std::string, int32_t> text_ids;
  std::atomic<bool> alive{true};
};

std::mutex g_mu;  // guards everything below
std::deque<std::string> g_names;  // id -> "aten::add.Tensor"; a deque never moves its strings
std::deque<std::string> g_texts;  // copies of schema names that cache entries point to
std::unordered_map<std::string, int32_t> g_ids;
std::vector<std::shared_ptr<ThreadData>> g_threads;
// totals of threads that have exited, folded in by snapshot()
std::vector<uint64_t> g_retired_calls, g_retired_self;
PairCounts g_retired_pairs;
uint64_t g_retired_events = 0;
at::CallbackHandle g_handle = 0;
int g_refs = 0;
std::atomic<uint64_t> g_errors{0};
constexpr size_t kMaxDepth = 1024;

thread_local bool t_exited = false;  // trivially destructible: valid during thread teardown
// > 0 while this thread runs torch_adapter's own work (routing/internal.py): its ops are
// not the user's, so they are not counted (no frame opened either: their time stays in the
// self time of the user's op around them, if any).
thread_local int t_internal = 0;
// Set just before a dispatch mode of torch_adapter re-dispatches the op it is handling
// (`func(*args)` in __torch_dispatch__): that next call is the same op call again, one
// level down, which was counted when it entered the dispatcher. Cleared by the next call.
thread_local bool t_redispatch = false;

struct Holder {
  std::shared_ptr<ThreadData> td;
  ~Holder() {
    t_exited = true;
    if (td) td->alive.store(false);
  }
};

ThreadData* thread_data() {
  if (t_exited) return nullptr;
  thread_local Holder holder;
  if (!holder.td) {
    auto td = std::make_shared<ThreadData>();
    std::lock_guard<std::mutex> guard(g_mu);
    g_threads.push_back(td);
    holder.td = std::move(td);
  }
  return holder.td.get();
}

int32_t intern_locked(const std::string& key) {
  auto it = g_ids.find(key);
  if (it != g_ids.end()) return it->second;
  auto id = static_cast<int32_t>(g_names.size());
  g_names.push_back(key);
  g_ids.emplace(key, id);
  return id;
}

inline size_t slot_of(const char* a, const char* b, size_t mask) {
  auto h = reinterpret_cast<uintptr_t>(a) * 0x9E3779B97F4A7C15ull ^ reinterpret_cast<uintptr_t>(b);
  return (h ^ (h >> 29)) & mask;
}

void cache_insert(ThreadData* td, const CacheEntry& entry) {
  if ((td->cache_used + 1) * 2 > td->cache.size()) {
    std::vector<CacheEntry> old(td->cache.size() * 2);
    old.swap(td->cache);
    td->cache_used = 0;
    for (const auto& e : old)
      if (e.name) cache_insert(td, e);
  }
  size_t mask = td->cache.size() - 1;
  for (size_t i = slot_of(entry.name, entry.overload, mask);; i = (i + 1) & mask) {
    auto& e = td->cache[i];
    if (!e.name || (e.name == entry.name && e.overload == entry.overload)) {
      if (!e.name) td->cache_used++;
      e = entry;
      return;
    }
  }
}

// A range named by a string (the autograd engine's "autograd::engine::evaluate_function:
// ...", "detach") keeps its text inside the RecordFunction: its address says nothing, so
// it is looked up by text, in a per-thread map.
int32_t text_id(ThreadData* td, const char* name) {
  std::string text(name);
  auto it = td->text_ids.find(text);
  if (it != td->text_ids.end()) return it->second;
  int32_t id;
  {
    std::lock_guard<std::mutex> guard(g_mu);
    id = intern_locked(text);
  }
  td->text_ids.emplace(std::move(text), id);
  return id;
}

// Slow path, once per op overload per thread: name the op "aten::name.overload".
int32_t first_sight(ThreadData* td, const at::RecordFunction& fn, const char* name, const char* overload) {
  auto op = fn.operator_name();
  if (!op.has_value()) {
    td->string_overload = overload;
    return text_id(td, name);
  }
  std::string key = op->name;
  if (!op->overload_name.empty()) key += "." + op->overload_name;
  CacheEntry entry{name, overload, nullptr, -1};
  {
    std::lock_guard<std::mutex> guard(g_mu);
    entry.id = intern_locked(key);
    g_texts.emplace_back(name);
    entry.text = g_texts.back().c_str();
  }
  cache_insert(td, entry);
  return entry.id;
}

inline int32_t op_id(ThreadData* td, const at::RecordFunction& fn) {
  const char* name = fn.name();
  const char* overload = fn.overload_name();
  if (overload == td->string_overload) return text_id(td, name);
  size_t mask = td->cache.size() - 1;
  for (size_t i = slot_of(name, overload, mask);; i = (i + 1) & mask) {
    const auto& e = td->cache[i];
    if (!e.name) break;
    if (e.name == name && e.overload == overload) {
      if (std::strcmp(e.text, name) == 0) return e.id;
      break;
    }
  }
  return first_sight(td, fn, name, overload);
}

template <typename T>
inline void bump(std::vector<T>& v, int32_t id, T by) {
  if (static_cast<size_t>(id) >= v.size()) v.resize(static_cast<size_t>(id) + 64, 0);
  v[id] += by;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (t_internal > 0) return nullptr;
  try {
    ThreadData* td = thread_data();
    if (td == nullptr) return nullptr;
    int32_t id = op_id(td, fn);
    bool named = fn.overload_name() == td->string_overload;  // (op_id has seen this range's kind)
    // A mode's re-dispatch is the op on top of the stack, or under the range the Python dispatch
    // key opens: not counted again; its frame stays so that its pieces are the op's.
    bool again = false;
    if (t_redispatch) {
      t_redispatch = false;
      const auto& stack = td->stack;
      size_t n = stack.size();
      again = n > 0 && (stack[n - 1].id == id || (n > 1 && stack[n - 1].named && stack[n - 2].id == id));
    }
    if (!again) {
      uint32_t parent = td->stack.empty() ? kTop : static_cast<uint32_t>(td->stack.back().id);
      std::lock_guard<SpinLock> guard(td->lock);
      bump<uint64_t>(td->calls, id, 1);
      td->events++;
      td->pairs.add((static_cast<uint64_t>(parent) << 32) | static_cast<uint32_t>(id), 1);
    }
    // An async range may end on another thread: it is counted, but opens no frame here.
    if (td->stack.size() < kMaxDepth && !fn.isAsync()) td->stack.push_back(Frame{&fn, id, now_ns(), 0, named});
  } catch (...) {
    g_errors.fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  try {
    uint64_t t1 = now_ns();
    ThreadData* td = thread_data();
    if (td == nullptr) return;
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

// A global callback on every dispatcher op call (FUNCTION scope), asking for no inputs, outputs or ids.
at::CallbackHandle add_op_callback(at::RecordFunctionCallback::StartCallback start,
                                   at::RecordFunctionCallback::EndCallback end) {
  return at::addGlobalCallback(at::RecordFunctionCallback(start, end)
                                   .scopes({at::RecordScope::FUNCTION})
                                   .needsInputs(false)
                                   .needsOutputs(false)
                                   .needsIds(false));
}

void acquire() {
  std::lock_guard<std::mutex> guard(g_mu);
  if (g_refs++ == 0) g_handle = add_op_callback(on_start, on_end);
}

void release() {
  std::lock_guard<std::mutex> guard(g_mu);
  if (g_refs == 0) return;
  if (--g_refs == 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
}

// The cost floor of any RecordFunction-based observer, for benchmarks/bench_decode.py: a callback
// that does nothing, registered as ours is (FUNCTION scope, no inputs, outputs or ids). What it
// costs per dispatcher call is RecordFunction's own machinery, which no counting callback avoids.
std::unique_ptr<at::ObserverContext> null_start(const at::RecordFunction&) { return nullptr; }
void null_end(const at::RecordFunction&, at::ObserverContext*) {}
at::CallbackHandle g_null_handle = 0;

void null_acquire() {
  std::lock_guard<std::mutex> guard(g_mu);
  if (g_null_handle == 0) g_null_handle = add_op_callback(null_start, null_end);
}

void null_release() {
  std::lock_guard<std::mutex> guard(g_mu);
  if (g_null_handle != 0) {
    at::removeCallback(g_null_handle);
    g_null_handle = 0;
  }
}

void enter_internal() { ++t_internal; }
void exit_internal() {
  if (t_internal > 0) --t_internal;
}
int internal_depth() { return t_internal; }
void expect_redispatch() { t_redispatch = true; }
void clear_redispatch() { t_redispatch = false; }

bool registered() {
  std::lock_guard<std::mutex> guard(g_mu);
  return g_handle != 0;
}

template <typename T>
void add_into(std::vector<T>& dst, const std::vector<T>& src) {
  if (dst.size() < src.size()) dst.resize(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i) dst[i] += src[i];
}

// (calls, self_ns, children, top_level, events, errors): cumulative totals since the module
// loaded, over all threads, including threads that have exited.
py::tuple snapshot() {
  std::vector<uint64_t> calls, self_ns;
  PairCounts pairs;
  uint64_t events = 0;
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> guard(g_mu);
    std::vector<std::shared_ptr<ThreadData>> live;
    for (auto& td : g_threads) {
      std::lock_guard<SpinLock> tguard(td->lock);
      bool dead = !td->alive.load();
      add_into(dead ? g_retired_calls : calls, td->calls);
      add_into(dead ? g_retired_self : self_ns, td->self_ns);
      PairCounts& dst = dead ? g_retired_pairs : pairs;
      td->pairs.for_each([&](uint64_t k, uint64_t v) { dst.add(k, v); });
      (dead ? g_retired_events : events) += td->events;
      if (!dead) live.push_back(td);
    }
    g_threads.swap(live);
    add_into(calls, g_retired_calls);
    add_into(self_ns, g_retired_self);
    g_retired_pairs.for_each([&](uint64_t k, uint64_t v) { pairs.add(k, v); });
    events += g_retired_events;
    names.assign(g_names.begin(), g_names.end());
  }
  py::dict pcalls, pself, pchildren, ptop;
  for (size_t i = 0; i < calls.size(); ++i)
    if (calls[i]) pcalls[py::str(names[i])] = calls[i];
  for (size_t i = 0; i < self_ns.size(); ++i)
    if (self_ns[i]) pself[py::str(names[i])] = self_ns[i];
  pairs.for_each([&](uint64_t k, uint64_t v) {
    auto parent = static_cast<uint32_t>(k >> 32);
    py::str child(names[k & 0xFFFFFFFFu]);
    if (parent == kTop) {
      ptop[child] = v;
      return;
    }
    py::str pname(names[parent]);
    if (!pchildren.contains(pname)) pchildren[pname] = py::dict();
    py::dict under = pchildren[pname];
    under[child] = v;
  });
  return py::make_tuple(pcalls, pself, pchildren, ptop, events, g_errors.load());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_adapter op observer (RecordFunction callback); see routing/observe.py";
  m.def("acquire", &acquire, "register the global callback (reference counted)");
  m.def("release", &release, "drop one reference; the last one removes the callback");
  m.def("registered", &registered, "whether our callback is registered now");
  m.def("null_acquire", &null_acquire, "register a callback that does nothing (the cost floor; benchmarks only)");
  m.def("null_release", &null_release, "remove it");
  m.def("has_global_callbacks", &at::hasGlobalCallbacks, "whether any global RecordFunction callback exists");
  m.def("enter_internal", &enter_internal, "this thread runs torch_adapter's own work: ops uncounted (nests)");
  m.def("exit_internal", &exit_internal, "end one enter_internal() on this thread");
  m.def("internal_depth", &internal_depth, "this thread's enter_internal() depth");
  m.def("expect_redispatch", &expect_redispatch, "the next call on this thread re-dispatches the running op");
  m.def("clear_redispatch", &clear_redispatch, "forget expect_redispatch() (the call did not happen)");
  m.def("snapshot", &snapshot, "cumulative (calls, self_ns, children, top_level, events, errors)");
}
