// torch_adapter float16 gate: the low-precision rewrite of the heavy ops in C++, so that neither a
// float32 call nor a float16 one crosses into Python (routing/low_precision.py holds the same rewrite
// in Python for machines where this is not built; both give the same bits).
//
// Built by torch_adapter/routing/half_gate.py (torch.utils.cpp_extension), never at import.
// Sequence (routing/low_precision.py): capture(specs, key) keeps the kernels at `key` now (the CPU's
// own) and each op's rewrite spec; install(key) registers one gate per op on top; uninstall()
// removes them. The gate is boxed, but for the ops most calls reach (mm, addmm, bmm, baddbmm, _softmax,
// the CPU flash attention) whose captured kernel is torch's own: there a typed kernel sends a call that
// is not to be rewritten straight to that kernel (at::cpu::*), unboxed — ~1 us less per float32 call
// than boxing it twice — and boxes only the calls it rewrites. The gate reads the op's arguments on the stack: when every floating tensor argument
// (but the one a spec exempts) is float16, at least one, and the spec's flag argument is not true, it
// rewrites the call: float16 tensor arguments cast to the compute dtype (set_dtype: bfloat16 or
// float32; float32 for the spec's fp32 ops and for products under its multiply-add threshold), the
// CPU's own kernel on them, the listed returns cast back to float16. Otherwise the CPU's own kernel
// answers. Two caches, as routing/lowp_cache.py and the Python kernel's parameter cache: a parameter's
// copy in the compute dtype (until it changes in place or dies) and the compute-dtype originals of
// the last few float16 outputs (a chain of rewritten ops casts each activation once).
// Python hears of a rewritten call only when it must log it (set_noting while a trace() is open, and
// each op's first rewrite): note(index) with the GIL, before the rewrite; its errors are reported as
// unraisable and the call goes on.

#include <ATen/Parallel.h>
#include <algorithm>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/PyObjectSlot.h>
#include <c10/util/intrusive_ptr.h>
#include <ATen/EmptyTensor.h>  // at::detail::empty_strided_cpu: no dispatch for our own buffers
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_cpu_dispatch.h>  // at::cpu::*: torch's own CPU kernels
#include <ATen/ops/_softmax_cpu_dispatch.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/baddbmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>  // ParameterClass
#include <torch/csrc/utils/pybind.h>  // at::Tensor <-> torch.Tensor
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TA_X86_CASTS 1
#endif

namespace py = pybind11;

namespace {

struct Gate {
  c10::OperatorHandle op;
  c10::SafeKernelFunction plain;  // the CPU's own kernel
  std::string name;
  int64_t exempt = -1;  // an argument that stays float32 whatever the activations' dtype
  int64_t flag = -1;    // a bool argument: true -> the CPU's own kernel answers
  std::vector<int64_t> outputs;  // returns cast back to float16
  bool fp32 = false;    // computed in float32 whatever the policy's dtype
  int64_t macs = 0;     // 0: no size rule; 1: a product of args[ia] and args[ib]; 2: a convolution;
                        // 3: attention, by the key tokens of args[ib] (its size(-2))
  int64_t ia = 0, ib = 1;
  int64_t small = 0;    // under this size (multiply-adds; rule 3: key tokens) a bfloat16 call computes in float32
};

// Owned here; never freed while the process may still dispatch to a gate (a late caller on another
// thread keeps valid pointers); replaced whole by the next capture.
std::vector<Gate>* g_gates = nullptr;
std::unique_ptr<torch::Library> g_lib;
std::mutex g_mutex;
std::atomic<int> g_dtype{static_cast<int>(c10::ScalarType::Undefined)};  // the policy's compute dtype
std::atomic<int> g_noting{0};           // trace() blocks open: while > 0 every rewritten call is noted
std::atomic<uint64_t> g_noted{0};       // bit i: op i's first rewrite was noted
PyObject* g_note = nullptr;             // note(index); a strong reference, kept until replaced
std::atomic<uint64_t> g_note_errors{0};

class QuietWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

bool all_half(const Gate& gate, const torch::jit::Stack& stack, size_t first, size_t count) {
  bool seen = false;
  for (size_t i = 0; i < count; ++i) {
    const auto& value = stack[first + i];
    if (static_cast<int64_t>(i) == gate.flag && value.isBool() && value.toBool()) {
      return false;
    }
    if (!value.isTensor() || static_cast<int64_t>(i) == gate.exempt) {
      continue;
    }
    const auto& tensor = value.toTensor();
    if (!tensor.defined() || !c10::isFloatingType(tensor.scalar_type())) {
      continue;
    }
    if (tensor.scalar_type() != c10::ScalarType::Half) {
      return false;
    }
    seen = true;
  }
  return seen;
}

at::Tensor rewrite_cast_down(const at::Tensor& a, c10::ScalarType dtype);
void rewrite(const Gate& gate, size_t index, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
             torch::jit::Stack* stack, size_t first, size_t count);

void gate_call(const Gate& g, size_t index, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto count = g.op.schema().arguments().size();
  const auto first = stack->size() - count;
  if (g_dtype.load(std::memory_order_relaxed) != static_cast<int>(c10::ScalarType::Undefined) &&
      all_half(g, *stack, first, count)) {
    rewrite(g, index, g.op, ks, stack, first, count);
  } else {
    g.plain.callBoxed(g.op, ks, stack);
  }
}

void gate(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const Gate* found = nullptr;
  size_t index = 0;
  for (const auto& g : *g_gates) {
    if (g.op == op) {
      found = &g;
      break;
    }
    ++index;
  }
  TORCH_CHECK(found != nullptr, "torch_adapter float16 gate: no kernel kept for ", op.schema().operator_name());
  gate_call(*found, index, ks, stack);
}

// The typed fast paths (see the top): op -> its gate's index in g_gates, -1 where it has none (not
// captured, or the kernel captured is not torch's own: another override must keep being called).
enum Fast { kMm, kAddmm, kBmm, kBaddbmm, kSoftmax, kFlash, kFastCount };
constexpr const char* kFastNames[kFastCount] = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                                                "aten::_softmax",
                                                "aten::_scaled_dot_product_flash_attention_for_cpu"};
std::atomic<int> g_fast[kFastCount] = {-1, -1, -1, -1, -1, -1};

// True when the boxed gate might rewrite the call: the policy is on and a tensor argument is float16
// (the boxed gate then decides exactly, with the spec's exemptions).
inline bool maybe_half(std::initializer_list<const at::Tensor*> tensors) {
  if (g_dtype.load(std::memory_order_relaxed) == static_cast<int>(c10::ScalarType::Undefined)) {
    return false;
  }
  for (const auto* t : tensors) {
    if (t->defined() && t->scalar_type() == at::kHalf) return true;
  }
  return false;
}

torch::jit::Stack boxed(Fast which, c10::DispatchKeySet ks, torch::jit::Stack stack) {
  const auto index = static_cast<size_t>(g_fast[which].load(std::memory_order_relaxed));
  gate_call((*g_gates)[index], index, ks, &stack);
  return stack;
}

at::Tensor fast_mm(c10::DispatchKeySet ks, const at::Tensor& self, const at::Tensor& mat2) {
  if (!maybe_half({&self, &mat2})) return at::cpu::mm(self, mat2);
  return boxed(kMm, ks, {self, mat2})[0].toTensor();
}

at::Tensor fast_bmm(c10::DispatchKeySet ks, const at::Tensor& self, const at::Tensor& mat2) {
  if (!maybe_half({&self, &mat2})) return at::cpu::bmm(self, mat2);
  return boxed(kBmm, ks, {self, mat2})[0].toTensor();
}

at::Tensor fast_addmm(c10::DispatchKeySet ks, const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                      const at::Scalar& beta, const at::Scalar& alpha) {
  if (!maybe_half({&self, &mat1, &mat2})) return at::cpu::addmm(self, mat1, mat2, beta, alpha);
  return boxed(kAddmm, ks, {self, mat1, mat2, beta, alpha})[0].toTensor();
}

at::Tensor fast_baddbmm(c10::DispatchKeySet ks, const at::Tensor& self, const at::Tensor& batch1,
                        const at::Tensor& batch2, const at::Scalar& beta, const at::Scalar& alpha) {
  if (!maybe_half({&self, &batch1, &batch2})) return at::cpu::baddbmm(self, batch1, batch2, beta, alpha);
  return boxed(kBaddbmm, ks, {self, batch1, batch2, beta, alpha})[0].toTensor();
}

at::Tensor fast_softmax(c10::DispatchKeySet ks, const at::Tensor& self, int64_t dim, bool half_to_float) {
  if (half_to_float || !maybe_half({&self})) return at::cpu::_softmax(self, dim, half_to_float);
  return boxed(kSoftmax, ks, {self, dim, half_to_float})[0].toTensor();
}

std::tuple<at::Tensor, at::Tensor> fast_flash(c10::DispatchKeySet ks, const at::Tensor& query, const at::Tensor& key,
                                              const at::Tensor& value, double dropout_p, bool is_causal,
                                              const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  const at::Tensor none;
  if (!maybe_half({&query, &key, &value, attn_mask ? &*attn_mask : &none})) {
    return at::cpu::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_mask,
                                                                scale);
  }
  auto out = boxed(kFlash, ks, {query, key, value, dropout_p, is_causal, attn_mask, scale});
  return {out[0].toTensor(), out[1].toTensor()};
}

torch::CppFunction fast_kernel(int which) {
  switch (which) {
    case kMm: return torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(fast_mm));
    case kAddmm: return torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(fast_addmm));
    case kBmm: return torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(fast_bmm));
    case kBaddbmm: return torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(fast_baddbmm));
    case kSoftmax: return torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(fast_softmax));
    default: return torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(fast_flash));
  }
}

c10::OperatorHandle find(const std::string& name) {
  const auto bare = name.rfind("aten::", 0) == 0 ? name.substr(6) : name;
  const auto dot = bare.find('.');
  const auto base = "aten::" + bare.substr(0, dot);
  const auto overload = dot == std::string::npos ? std::string() : bare.substr(dot + 1);
  return c10::Dispatcher::singleton().findSchemaOrThrow(base.c_str(), overload.c_str());
}

void clear_caches();

// Per op: (name, exempt argument or -1, flag argument or -1, returns cast back, fp32, size rule, ia, ib,
// small): see Gate.
using Spec = std::tuple<std::string, int64_t, int64_t, std::vector<int64_t>, bool, int64_t, int64_t, int64_t, int64_t>;

void capture(const std::vector<Spec>& specs, const std::string& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(!g_lib, "torch_adapter float16 gate: capture() while installed");
  TORCH_CHECK(specs.size() <= 64, "torch_adapter float16 gate: at most 64 ops");
  const auto dispatch_key = c10::parseDispatchKey(key);
  auto gates = std::make_unique<std::vector<Gate>>();
  for (const auto& [name, exempt, flag, outputs, fp32, macs, ia, ib, small] : specs) {
    auto handle = find(name);
    gates->push_back({handle, handle.getComputedKernelForDispatchKey(dispatch_key), name, exempt, flag, outputs, fp32,
                      macs, ia, ib, small});
  }
  int fast[kFastCount] = {-1, -1, -1, -1, -1, -1};
  if (dispatch_key == c10::DispatchKey::CPU) {
    for (size_t i = 0; i < gates->size(); ++i) {
      const auto& g = (*gates)[i];
      const bool own = g.plain.debug().find("/RegisterCPU") != std::string::npos;  // torch's own CPU kernel
      for (int f = 0; f < kFastCount; ++f)
        if (own && g.name == kFastNames[f]) fast[f] = static_cast<int>(i);
    }
  }
  g_gates = gates.release();  // the previous capture's stays allocated: see g_gates
  for (int f = 0; f < kFastCount; ++f) g_fast[f].store(fast[f]);
  g_noted.store(0);
  clear_caches();
}

void install(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(g_gates != nullptr, "torch_adapter float16 gate: install() before capture()");
  TORCH_CHECK(!g_lib, "torch_adapter float16 gate: already installed");
  const auto dispatch_key = c10::parseDispatchKey(key);
  QuietWarnings quiet;  // "overriding a previously registered kernel" is the point
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", dispatch_key, __FILE__, __LINE__);
  for (size_t i = 0; i < g_gates->size(); ++i) {
    const auto& g = (*g_gates)[i];
    const auto& op_name = g.op.schema().operator_name();
    const auto full = op_name.overload_name.empty() ? op_name.name : op_name.name + "." + op_name.overload_name;
    int which = -1;
    for (int f = 0; f < kFastCount; ++f)
      if (g_fast[f].load() == static_cast<int>(i)) which = f;
    if (which >= 0) {
      g_lib->impl(full.substr(6).c_str(), fast_kernel(which));
    } else {
      g_lib->impl(full.substr(6).c_str(), torch::CppFunction::makeFromBoxedFunction<&gate>());
    }
  }
}

void uninstall() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_lib.reset();  // the gates are deregistered: the CPU's own kernels are current again
  clear_caches();
}

bool installed() {
  return static_cast<bool>(g_lib);
}

// ---- float16 <-> bfloat16 in one pass -------------------------------------------------------
// torch converts float16 to bfloat16 element by element (3x slower than going through float32 in two
// vectorised passes, which is what low_precision.py does without this). Here: one pass, 16 lanes at a
// time with F16C + AVX512-BF16 where the CPU has them (chosen at run time; compiled with target
// attributes, so the extension itself needs no -march), the same rounding as torch's two passes
// (float16 -> float32 is exact; float32 -> bfloat16 and float32 -> float16 round to nearest even).

#ifdef TA_X86_CASTS
__attribute__((target("avx512f,avx512bf16,avx512vl,f16c"))) void half_to_bf16_x86(const uint16_t* in, uint16_t* out,
                                                                                  int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    __m256bh b = _mm512_cvtneps_pbh(f);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), reinterpret_cast<__m256i&>(b));
  }
  for (; i < n; ++i) {
    out[i] = c10::BFloat16(static_cast<float>(c10::Half(in[i], c10::Half::from_bits()))).x;
  }
}

__attribute__((target("avx512f,avx512vl,f16c"))) void bf16_to_half_x86(const uint16_t* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))), 16);
    __m256i h = _mm512_cvtps_ph(_mm512_castsi512_ps(w), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
  }
  for (; i < n; ++i) {
    out[i] = c10::Half(static_cast<float>(c10::BFloat16(in[i], c10::BFloat16::from_bits()))).x;
  }
}

// float16 <-> float32, 8 lanes at a time with F16C (any AVX2 CPU): the conversions torch's own vectorised
// casts make (float16 -> float32 exact; float32 -> float16 round to nearest even), without the
// TensorIterator set-up that dominates the small tensors of overhead-bound models.
__attribute__((target("avx2,f16c"))) void half_to_float_x86(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) {
    out[i] = static_cast<float>(c10::Half(in[i], c10::Half::from_bits()));
  }
}

__attribute__((target("avx2,f16c"))) void float_to_half_x86(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) {
    out[i] = c10::Half(in[i]).x;
  }
}
#endif

bool f16c_casts() {
#ifdef TA_X86_CASTS
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

bool fused_casts() {
#ifdef TA_X86_CASTS
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

bool castable(const at::Tensor& src) {
  return src.defined() && src.device().type() == c10::DeviceType::CPU && src.is_non_overlapping_and_dense() &&
         !src.is_conj() && !src.is_neg();
}

// `src` (float16 or bfloat16, dense and non-overlapping: its elements fill one span of memory) in the
// other dtype with the same sizes and strides; undefined when this CPU or this tensor is not for us.
at::Tensor convert_tensor(const at::Tensor& src) {
  if (!fused_casts() || !castable(src)) {
    return at::Tensor();
  }
  const auto from = src.scalar_type();
  if (from != at::kHalf && from != at::kBFloat16) {
    return at::Tensor();
  }
  at::Tensor out = at::detail::empty_strided_cpu(src.sizes(), src.strides(), from == at::kHalf ? at::kBFloat16 : at::kHalf);
  // a dense tensor's elements sit in numel() consecutive slots from its first element (strides >= 0)
  const auto* in = reinterpret_cast<const uint16_t*>(src.const_data_ptr());
  auto* dst = reinterpret_cast<uint16_t*>(out.mutable_data_ptr());
  at::parallel_for(0, src.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
#ifdef TA_X86_CASTS
    if (from == at::kHalf) {
      half_to_bf16_x86(in + begin, dst + begin, end - begin);
    } else {
      bf16_to_half_x86(in + begin, dst + begin, end - begin);
    }
#endif
  });
  return out;
}

// `src` float16 -> float32 or float32 -> float16 (dense, same sizes and strides) in one F16C pass;
// undefined when this CPU or this tensor is not for us.
at::Tensor convert_float(const at::Tensor& src, c10::ScalarType to) {
  if (!f16c_casts() || !castable(src)) {
    return at::Tensor();
  }
  const auto from = src.scalar_type();
  if (!((from == at::kHalf && to == at::kFloat) || (from == at::kFloat && to == at::kHalf))) {
    return at::Tensor();
  }
  at::Tensor out = at::detail::empty_strided_cpu(src.sizes(), src.strides(), to);
  const void* in = src.const_data_ptr();
  void* dst = out.mutable_data_ptr();
  at::parallel_for(0, src.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
#ifdef TA_X86_CASTS
    if (from == at::kHalf) {
      half_to_float_x86(static_cast<const uint16_t*>(in) + begin, static_cast<float*>(dst) + begin, end - begin);
    } else {
      float_to_half_x86(static_cast<const float*>(in) + begin, static_cast<uint16_t*>(dst) + begin, end - begin);
    }
#endif
  });
  return out;
}

py::object convert(const at::Tensor& src) {
  at::Tensor out;
  {
    py::gil_scoped_release nogil;
    out = convert_tensor(src);
  }
  if (!out.defined()) {
    return py::none();
  }
  return py::cast(out);
}

py::object convert_to(const at::Tensor& src, const std::string& to) {
  TORCH_CHECK(to == "float32" || to == "float16", "torch_adapter float16 gate: convert_to(t, 'float32'|'float16'), got '", to, "'");
  at::Tensor out;
  {
    py::gil_scoped_release nogil;
    out = convert_float(src, to == "float32" ? at::kFloat : at::kHalf);
  }
  if (!out.defined()) {
    return py::none();
  }
  return py::cast(out);
}

// ---- the rewrite --------------------------------------------------------------------------------
// The casts give low_precision.py's _down/_up bits: float16 <-> float32 in one F16C pass where
// convert_float takes it (else torch's `.float()`/`.half()`); float16 <-> bfloat16 in one pass where
// convert_tensor takes it, else through float32 (two vectorised casts).

at::Tensor raw_down(const at::Tensor& a, c10::ScalarType dtype) {
  at::Tensor out = dtype == at::kFloat ? convert_float(a, at::kFloat) : convert_tensor(a);
  if (out.defined()) {
    return out;
  }
  return dtype == at::kFloat ? a.to(at::kFloat) : a.to(at::kFloat).to(dtype);
}

at::Tensor raw_up(const at::Tensor& c, c10::ScalarType dtype) {
  if (!c.defined() || c.scalar_type() != dtype) {
    return c;
  }
  at::Tensor out = dtype == at::kFloat ? convert_float(c, at::kHalf) : convert_tensor(c);
  if (out.defined()) {
    return out;
  }
  return dtype == at::kFloat ? c.to(at::kHalf) : c.to(at::kFloat).to(at::kHalf);
}

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// A parameter's copies in the compute dtype, one per (dtype, view geometry), while its version holds.
struct ParamCopies {
  WeakImpl ref;
  uint32_t version;
  std::vector<std::pair<std::vector<int64_t>, at::Tensor>> copies;  // key: dtype, sizes, strides, offset
};

// A recent float16 output -> the compute-dtype tensor it was made from (routing/lowp_cache.py).
struct Kept {
  WeakImpl ref;
  uint32_t version;
  at::Tensor c;
  uint64_t tick;
};

std::mutex g_cache_mutex;  // guards the caches; nothing under it calls Python or frees a tensor a Python object owns
std::unordered_map<const c10::TensorImpl*, ParamCopies> g_params;
std::unordered_map<const c10::TensorImpl*, Kept> g_outputs;
size_t g_output_size = 16;
uint64_t g_tick = 0, g_hits = 0;
std::atomic<uint64_t> g_calls{0};  // rewritten calls (now and then a sweep of dead parameters)

// Tensors taken out of the caches are released after the lock (a tensor's last reference may free memory).
struct Released {
  std::vector<at::Tensor> tensors;
  void take(at::Tensor t) { tensors.push_back(std::move(t)); }
};

void sweep_params_locked(Released& released) {
  for (auto it = g_params.begin(); it != g_params.end();) {
    if (it->second.ref.expired()) {
      for (auto& kv : it->second.copies) released.take(std::move(kv.second));
      it = g_params.erase(it);
    } else {
      ++it;
    }
  }
}

void clear_caches() {
  Released released;
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    for (auto& kv : g_params)
      for (auto& copy : kv.second.copies) released.take(std::move(copy.second));
    for (auto& kv : g_outputs) released.take(std::move(kv.second.c));
    g_params.clear();
    g_outputs.clear();
  }
}

bool is_parameter(const at::Tensor& base) {
  // The tensor's Python object, if it has one, is alive while the tensor is; its type is read, never changed.
  PyObject* obj = base.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
  if (obj == nullptr || ::ParameterClass == nullptr) {
    return false;
  }
  auto* type = Py_TYPE(obj);
  return type == reinterpret_cast<PyTypeObject*>(::ParameterClass) ||
         PyType_IsSubtype(type, reinterpret_cast<PyTypeObject*>(::ParameterClass));
}

std::vector<int64_t> view_key(const at::Tensor& a, c10::ScalarType dtype) {
  std::vector<int64_t> key{static_cast<int64_t>(dtype), a.dim()};
  key.insert(key.end(), a.sizes().begin(), a.sizes().end());
  key.insert(key.end(), a.strides().begin(), a.strides().end());
  key.push_back(a.storage_offset());
  return key;
}

// `a` (float16) in `dtype`: a parameter's kept copy, a recent output's original, or a fresh cast.
at::Tensor rewrite_cast_down(const at::Tensor& a, c10::ScalarType dtype) {
  if (a.is_inference()) {  // no version counter (made under inference_mode): cast, keep nothing
    return raw_down(a, dtype);
  }
  const at::Tensor base = a.is_view() ? at::Tensor(a._base()) : a;
  const auto* impl = base.unsafeGetTensorImpl();
  const uint32_t version = base._version();
  Released released;
  if (!is_parameter(base)) {
    at::Tensor c;
    {
      std::lock_guard<std::mutex> lock(g_cache_mutex);
      auto it = g_outputs.find(impl);
      if (it == g_outputs.end() || it->second.ref.expired() || it->second.version != version) {
        return raw_down(a, dtype);
      }
      c = it->second.c;
      ++g_hits;
    }
    if (a.unsafeGetTensorImpl() != impl) {
      c = c.as_strided(a.sizes(), a.strides(), a.storage_offset());
    }
    return c.scalar_type() == dtype ? c : c.to(dtype);  // bfloat16 -> float32 exact; float32 -> bfloat16 one rounding
  }
  auto key = view_key(a, dtype);
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    auto it = g_params.find(impl);
    if (it != g_params.end() && !it->second.ref.expired() && it->second.version == version) {
      for (const auto& kv : it->second.copies)
        if (kv.first == key) return kv.second;
    }
  }
  at::Tensor out = raw_down(a, dtype);
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    auto it = g_params.find(impl);
    if (it == g_params.end() || it->second.ref.expired() || it->second.version != version) {  // new, or changed in place
      if (it != g_params.end()) {
        for (auto& kv : it->second.copies) released.take(std::move(kv.second));
        g_params.erase(it);
      } else {
        sweep_params_locked(released);  // a new parameter: drop those that died meanwhile
      }
      it = g_params.emplace(impl, ParamCopies{WeakImpl(base.getIntrusivePtr()), version, {}}).first;
    }
    it->second.copies.emplace_back(std::move(key), out);
  }
  return out;
}

// The float16 result the program gets; `c` kept for the next rewritten call that takes it.
at::Tensor rewrite_cast_up(const at::Tensor& c, c10::ScalarType dtype) {
  at::Tensor y16 = raw_up(c, dtype);
  if (!y16.defined() || y16.unsafeGetTensorImpl() == c.unsafeGetTensorImpl() || c.strides() != y16.strides() ||
      c.storage_offset() != 0 || y16.storage_offset() != 0 || y16.is_view() || y16.is_inference()) {
    return y16;
  }
  Released released;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  if (g_output_size == 0) {
    return y16;
  }
  for (auto it = g_outputs.begin(); it != g_outputs.end();) {  // the dead ones go first
    if (it->second.ref.expired()) {
      released.take(std::move(it->second.c));
      it = g_outputs.erase(it);
    } else {
      ++it;
    }
  }
  g_outputs.insert_or_assign(y16.unsafeGetTensorImpl(), Kept{WeakImpl(y16.getIntrusivePtr()), y16._version(), c, ++g_tick});
  while (g_outputs.size() > g_output_size) {
    auto oldest = g_outputs.begin();
    for (auto it = g_outputs.begin(); it != g_outputs.end(); ++it)
      if (it->second.tick < oldest->second.tick) oldest = it;
    released.take(std::move(oldest->second.c));
    g_outputs.erase(oldest);
  }
  return y16;
}

int64_t numel_of(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() ? v.toTensor().numel() : -1;
}

// float32 for the spec's fp32 ops and for bfloat16 products too small for the bf16 kernels' set-up.
c10::ScalarType compute_dtype(const Gate& gate, const torch::jit::Stack& stack, size_t first) {
  const auto dtype = static_cast<c10::ScalarType>(g_dtype.load(std::memory_order_relaxed));
  if (gate.fp32) {
    return at::kFloat;
  }
  if (dtype != at::kBFloat16 || gate.macs == 0) {
    return dtype;
  }
  const auto& a = stack[first + gate.ia];
  const auto& b = stack[first + gate.ib];
  if (!a.isTensor() || !b.isTensor() || !a.toTensor().defined() || !b.toTensor().defined()) {
    return dtype;  // (low_precision.py: not two tensors -> not small)
  }
  const auto& x = a.toTensor();
  const auto& w = b.toTensor();
  int64_t macs;
  if (gate.macs == 1) {
    macs = x.numel() * (w.dim() > 0 ? w.size(-1) : 1);
  } else if (gate.macs == 3) {
    macs = w.dim() >= 2 ? w.size(-2) : 0;
  } else {  // ~ N*H*W positions x Cout*(Cin/groups)*kh*kw weights (stride 1)
    macs = x.numel() / std::max<int64_t>(x.dim() > 1 ? x.size(1) : 1, 1) * w.numel();
  }
  return macs < gate.small ? at::kFloat : dtype;
}

void note(size_t index) {
  py::gil_scoped_acquire gil;
  if (g_note == nullptr) {
    return;
  }
  try {
    py::reinterpret_borrow<py::object>(g_note)(index);
  } catch (py::error_already_set& e) {  // an observer's failure reports itself; the call goes on
    g_note_errors.fetch_add(1);
    e.discard_as_unraisable("torch_adapter float16 gate: noting a rewritten call");
  } catch (...) {
    g_note_errors.fetch_add(1);
  }
}

void rewrite(const Gate& gate, size_t index, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
             torch::jit::Stack* stack, size_t first, size_t count) {
  const uint64_t bit = 1ull << index;
  if (g_noting.load(std::memory_order_relaxed) > 0 || !(g_noted.load(std::memory_order_relaxed) & bit)) {
    note(index);
    g_noted.fetch_or(bit);
  }
  const auto dtype = compute_dtype(gate, *stack, first);
  for (size_t i = 0; i < count; ++i) {
    auto& value = (*stack)[first + i];
    if (value.isTensor()) {
      const auto& t = value.toTensor();
      if (t.defined() && t.scalar_type() == at::kHalf) {
        value = rewrite_cast_down(t, dtype);
      }
    }
  }
  gate.plain.callBoxed(op, ks, stack);
  const auto returns = op.schema().returns().size();
  const auto out0 = stack->size() - returns;
  for (auto position : gate.outputs) {
    if (position < 0 || static_cast<size_t>(position) >= returns) continue;
    auto& value = (*stack)[out0 + position];
    if (value.isTensor()) {
      value = rewrite_cast_up(value.toTensor(), dtype);
    }
  }
  if (((g_calls.fetch_add(1, std::memory_order_relaxed) + 1) & 4095) == 0) {  // now and then: parameters that died since
    Released released;
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    sweep_params_locked(released);
  }
}

// ---- what Python sets and reads -------------------------------------------------------------------

void set_dtype(const std::string& name) {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  if (name == "bfloat16") {
    dtype = at::kBFloat16;
  } else if (name == "float32") {
    dtype = at::kFloat;
  } else {
    TORCH_CHECK(name.empty() || name == "none", "torch_adapter float16 gate: set_dtype('bfloat16'|'float32'|''), got '",
                name, "'");
  }
  g_dtype.store(static_cast<int>(dtype));
  clear_caches();
}

void set_note(py::object fn) {
  PyObject* old = g_note;
  g_note = fn.is_none() ? nullptr : fn.release().ptr();
  Py_XDECREF(old);
}

void set_noting(int64_t open) { g_noting.store(static_cast<int>(std::max<int64_t>(open, 0))); }

void set_output_cache_size(int64_t size) {
  TORCH_CHECK(size >= 0, "torch_adapter float16 gate: an output cache size >= 0, got ", size);
  Released released;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_output_size = static_cast<size_t>(size);
  while (g_outputs.size() > g_output_size) {
    released.take(std::move(g_outputs.begin()->second.c));
    g_outputs.erase(g_outputs.begin());
  }
}

py::dict cache_info() {
  py::dict out;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  size_t params = 0;
  for (const auto& kv : g_params)
    if (!kv.second.ref.expired()) ++params;
  out["params"] = params;
  out["outputs"] = g_outputs.size();
  out["hits"] = g_hits;
  out["output_size"] = g_output_size;
  out["noting"] = g_noting.load();
  out["note_errors"] = g_note_errors.load();
  return out;
}

void reset_hits() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_hits = 0;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("capture", &capture, "keep the kernels at KEY now (the CPU's own) and the rewrite spec of each op");
  m.def("install", &install, "register the gates on top of the captured kernels at KEY");
  m.def("uninstall", &uninstall, "remove the gates (and empty the caches)");
  m.def("installed", &installed);
  m.def("set_dtype", &set_dtype, "the compute dtype of rewritten calls: 'bfloat16', 'float32', or '' (none)");
  m.def("set_note", &set_note, "note(index) is called with the GIL when a rewritten call must be logged (None: never)");
  m.def("set_noting", &set_noting, "how many trace() blocks are open: while > 0 every rewritten call is noted");
  m.def("set_output_cache_size", &set_output_cache_size, "how many recent float16 outputs keep their originals");
  m.def("cache_info", &cache_info, "{params, outputs, hits, output_size, noting, note_errors}");
  m.def("reset_hits", &reset_hits);
  m.def("clear_caches", &clear_caches);
  m.def("fused_casts", &fused_casts, "does this CPU take the one-pass float16 <-> bfloat16 casts?");
  m.def("convert", &convert, "float16 <-> bfloat16 in one pass (same sizes and strides), or None");
  m.def("f16c_casts", &f16c_casts, "does this CPU take the one-pass float16 <-> float32 casts (AVX2 + F16C)?");
  m.def("convert_to", &convert_to, "float16 -> 'float32' or float32 -> 'float16' in one F16C pass, or None");
}
