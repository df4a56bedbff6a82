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
// is: one thread-local record (a single TLS lookup per callback), a thread-local
// open-addressing cache from the (name, overload) pointers of the op's schema to its id, a
// thread-local stack of open calls, the TSC as the clock where it is invariant, and counters
// that only their owner thread writes — relaxed atomic stores, no lock: snapshot() takes the
// thread's lock to read them, and the owner takes it only to grow a table or add a key.
// calls[id] is not kept apart: it is the sum of pairs[(*, id)], summed by snapshot().
//
// Python takes a snapshot at start and at stop and subtracts, so observers can nest.
// Nothing here may throw into the dispatcher: every callback body is wrapped, and a
// failure only increments an error counter that Python reports.

#include <ATen/record_function.h>
#include <pybind11/pybind11.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
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

// The clock of the hot path: the time-stamp counter where the CPU says it is invariant (constant
// rate, runs in every power state: cpuid 0x80000007 EDX bit 8), read in ~1/3 of a vDSO
// steady_clock call; else steady_clock in ns. Chosen and calibrated once, at the first acquire(),
// before the callback is registered (2 ms against steady_clock), and fixed after: self times are
// kept in ticks and scaled to ns by snapshot(), so every snapshot scales by the same factor.
bool g_use_tsc = false;
double g_ns_per_tick = 1.0;
bool g_clock_chosen = false;

inline uint64_t now_ticks() {
#if defined(__x86_64__)
  if (g_use_tsc) return __rdtsc();
#endif
  return now_ns();
}

void choose_clock() {  // under g_mu, callback not yet registered
  if (g_clock_chosen) return;
  g_clock_chosen = true;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (std::getenv("TORCH_ADAPTER_OBSERVER_CLOCK") != nullptr &&
      std::strcmp(std::getenv("TORCH_ADAPTER_OBSERVER_CLOCK"), "steady") == 0)
    return;
  if (!__get_cpuid(0x80000000, &a, &b, &c, &d) || a < 0x80000007) return;
  __get_cpuid(0x80000007, &a, &b, &c, &d);
  if (!(d & (1u << 8))) return;
  uint64_t s0 = now_ns(), c0 = __rdtsc(), s1 = s0, c1 = c0;
  while (s1 - s0 < 2000000) {
    s1 = now_ns();
    c1 = __rdtsc();
  }
  if (c1 <= c0) return;
  g_ns_per_tick = static_cast<double>(s1 - s0) / static_cast<double>(c1 - c0);
  g_use_tsc = true;
#endif
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
  uint64_t child_ns;  // (in now_ticks() units, as t0)
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

inline void bump_relaxed(std::atomic<uint64_t>& c, uint64_t by) {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);  // one writer
}

// Counters by op id. Written by the owner thread without a lock (bump); read by snapshot()
// under the thread's lock; grown by the owner under that lock (the old values are copied first:
// nobody else writes them).
class Counters {
 public:
  void bump(int32_t id, uint64_t by, SpinLock& lock) {
    if (static_cast<size_t>(id) >= size_) grow(static_cast<size_t>(id), lock);
    bump_relaxed(data_[id], by);
  }
  void add_into(std::vector<uint64_t>& dst) const {  // under the lock
    if (dst.size() < size_) dst.resize(size_, 0);
    for (size_t i = 0; i < size_; ++i) dst[i] += data_[i].load(std::memory_order_relaxed);
  }

 private:
  void grow(size_t id, SpinLock& lock) {
    size_t n = std::max(size_ * 2, id + 64);
    std::unique_ptr<std::atomic<uint64_t>[]> fresh(new std::atomic<uint64_t>[n]());
    for (size_t i = 0; i < size_; ++i) fresh[i].store(data_[i].load(std::memory_order_relaxed));
    std::lock_guard<SpinLock> guard(lock);
    data_.swap(fresh);
    size_ = n;
  }
  std::unique_ptr<std::atomic<uint64_t>[]> data_;
  size_t size_ = 0;
};

// Open-addressing counter table keyed by (parent id << 32 | child id). A thread's own table:
// its owner bumps an existing key without a lock and adds a key (or grows) under the thread's
// lock; snapshot() reads it under that lock. Private tables (snapshot's, the retired totals) use add().
class PairCounts {
 public:
  static constexpr uint64_t kEmpty = ~0ull;
  PairCounts() { reset(256); }
  void bump(uint64_t key, uint64_t by, SpinLock& lock) {
    size_t mask = cap_ - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key) {
        bump_relaxed(vals_[i], by);
        return;
      }
      if (keys_[i] == kEmpty) break;
    }
    std::lock_guard<SpinLock> guard(lock);
    add(key, by);
  }
  void add(uint64_t key, uint64_t by) {
    if ((used_ + 1) * 2 > cap_) grow();
    size_t mask = cap_ - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key) {
        bump_relaxed(vals_[i], by);
        return;
      }
      if (keys_[i] == kEmpty) {
        vals_[i].store(by, std::memory_order_relaxed);
        keys_[i] = key;
        used_++;
        return;
      }
    }
  }
  template <typename F>
  void for_each(F f) const {
    for (size_t i = 0; i < cap_; ++i)
      if (keys_[i] != kEmpty) f(keys_[i], vals_[i].load(std::memory_order_relaxed));
  }

 private:
  static size_t mix(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(k ^ (k >> 32));
  }
  void reset(size_t cap) {
    cap_ = cap;
    used_ = 0;
    keys_.assign(cap, kEmpty);
    vals_.reset(new std::atomic<uint64_t>[cap]());
  }
  void grow() {
    std::vector<uint64_t> keys(std::move(keys_));
    std::unique_ptr<std::atomic<uint64_t>[]> vals(std::move(vals_));
    size_t old = cap_;
    reset(cap_ * 2);
    for (size_t i = 0; i < old; ++i)
      if (keys[i] != kEmpty) add(keys[i], vals[i].load(std::memory_order_relaxed));
  }
  std::vector<uint64_t> keys_;
  std::unique_ptr<std::atomic<uint64_t>[]> vals_;
  size_t cap_ = 0, used_ = 0;
};

constexpr uint32_t kTop = 0xFFFFFFFFu;  // "parent" of a call made outside any observed op

struct ThreadData {
  SpinLock lock;    // snapshot() holds it to read; the owner holds it to grow or add a key
  Counters self_ticks;  // by op id, in now_ticks() units
  PairCounts pairs;     // (parent or kTop, child) -> calls
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
std::vector<uint64_t> g_retired_self;
PairCounts g_retired_pairs;
at::CallbackHandle g_handle = 0;
int g_refs = 0;
std::atomic<uint64_t> g_errors{0};
constexpr size_t kMaxDepth = 1024;

// Everything the callbacks read per thread, in one trivially destructible record: one TLS
// lookup per callback, and valid during thread teardown.
struct ThreadState {
  ThreadData* td;
  // > 0 while this thread runs torch_adapter's own work (routing/internal.py): its ops are not
  // the user's, so they are not counted (no frame opened either: their time stays in the self
  // time of the user's op around them, if any).
  int internal;
  // Set just before a dispatch mode of torch_adapter re-dispatches the op it is handling
  // (`func(*args)` in __torch_dispatch__): that next call is the same op call again, one level
  // down, which was counted when it entered the dispatcher. Cleared by the next call.
  bool redispatch;
  bool exited;  // the thread's Holder is gone: count nothing more
};
thread_local ThreadState t_state{nullptr, 0, false, false};

struct Holder {
  std::shared_ptr<ThreadData> td;
  ~Holder() {
    t_state.exited = true;
    t_state.td = nullptr;
    if (td) td->alive.store(false);
  }
};

ThreadData* new_thread_data(ThreadState& ts) {
  if (ts.exited) return nullptr;
  thread_local Holder holder;  // its destructor marks this thread's data retired
  auto td = std::make_shared<ThreadData>();
  {
    std::lock_guard<std::mutex> guard(g_mu);
    g_threads.push_back(td);
  }
  holder.td = td;
  ts.td = td.get();
  return ts.td;
}

inline ThreadData* thread_data(ThreadState& ts) { return ts.td != nullptr ? ts.td : new_thread_data(ts); }

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

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadState& ts = t_state;
  if (ts.internal > 0) return nullptr;
  try {
    ThreadData* td = thread_data(ts);
    if (td == nullptr) return nullptr;
    int32_t id = op_id(td, fn);
    bool named = fn.overload_name() == td->string_overload;  // (op_id has seen this range's kind)
    auto& stack = td->stack;
    // A mode's re-dispatch is the op on top of the stack, or under the range the Python dispatch
    // key opens: not counted again; its frame stays so that its pieces are the op's.
    bool again = false;
    if (ts.redispatch) {
      ts.redispatch = false;
      size_t n = stack.size();
      again = n > 0 && (stack[n - 1].id == id || (n > 1 && stack[n - 1].named && stack[n - 2].id == id));
    }
    if (!again) {
      uint32_t parent = stack.empty() ? kTop : static_cast<uint32_t>(stack.back().id);
      td->pairs.bump((static_cast<uint64_t>(parent) << 32) | static_cast<uint32_t>(id), 1, td->lock);
    }
    // An async range may end on another thread: it is counted, but opens no frame here.
    if (stack.size() < kMaxDepth && !fn.isAsync()) stack.push_back(Frame{&fn, id, now_ticks(), 0, named});
  } catch (...) {
    g_errors.fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  try {
    uint64_t t1 = now_ticks();
    ThreadState& ts = t_state;
    ThreadData* td = ts.td;  // no frame was opened on a thread without data
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
    td->self_ticks.bump(frame.id, self, td->lock);
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
  choose_clock();
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

void enter_internal() { ++t_state.internal; }
void exit_internal() {
  if (t_state.internal > 0) --t_state.internal;
}
int internal_depth() { return t_state.internal; }
void expect_redispatch() { t_state.redispatch = true; }
void clear_redispatch() { t_state.redispatch = false; }
py::dict clock_info() {
  std::lock_guard<std::mutex> guard(g_mu);
  py::dict out;
  out["chosen"] = g_clock_chosen;
  out["source"] = g_use_tsc ? "tsc" : "steady_clock";
  out["ns_per_tick"] = g_ns_per_tick;
  return out;
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

// (calls, self_ns, children, top_level, events, errors): cumulative totals since the module
// loaded, over all threads, including threads that have exited. calls[id] and events are sums
// of the pair counts; self times are scaled from ticks to ns with the one fixed factor.
py::tuple snapshot() {
  std::vector<uint64_t> self_ticks;
  PairCounts pairs;
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> guard(g_mu);
    std::vector<std::shared_ptr<ThreadData>> live;
    for (auto& td : g_threads) {
      std::lock_guard<SpinLock> tguard(td->lock);
      bool dead = !td->alive.load();
      td->self_ticks.add_into(dead ? g_retired_self : self_ticks);
      PairCounts& dst = dead ? g_retired_pairs : pairs;
      td->pairs.for_each([&](uint64_t k, uint64_t v) { dst.add(k, v); });
      if (!dead) live.push_back(td);
    }
    g_threads.swap(live);
    add_into(self_ticks, g_retired_self);
    g_retired_pairs.for_each([&](uint64_t k, uint64_t v) { pairs.add(k, v); });
    names.assign(g_names.begin(), g_names.end());
  }
  std::vector<uint64_t> calls(names.size(), 0);
  uint64_t events = 0;
  pairs.for_each([&](uint64_t k, uint64_t v) {
    calls[k & 0xFFFFFFFFu] += v;
    events += v;
  });
  py::dict pcalls, pself, pchildren, ptop;
  for (size_t i = 0; i < calls.size(); ++i)
    if (calls[i]) pcalls[py::str(names[i])] = calls[i];
  for (size_t i = 0; i < self_ticks.size(); ++i)
    if (self_ticks[i])
      pself[py::str(names[i])] = static_cast<uint64_t>(static_cast<double>(self_ticks[i]) * g_ns_per_tick + 0.5);
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
  m.def("clock", &clock_info, "the hot path's clock: {chosen, source ('tsc' or 'steady_clock'), ns_per_tick}");
  m.def("snapshot", &snapshot, "cumulative (calls, self_ns, children, top_level, events, errors)");
}
