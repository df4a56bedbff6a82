// torch_adapter float16 gate: the low-precision kernels' dtype test in C++, so that a float32 (or any
// non-float16) call of the heavy ops never crosses into Python.
//
// Built by torch_adapter/routing/half_gate.py (torch.utils.cpp_extension), never at import.
// Sequence (routing/low_precision.py): capture(ops, key) keeps the kernels at `key` now (the CPU's
// own); Python registers its float16 kernels there; install(specs) keeps those and registers one
// boxed gate per op on top. The gate reads the op's arguments on the stack: when every floating
// tensor argument (but the one a spec exempts) is float16, at least one, and the spec's flag argument
// is not true, it calls the Python kernel (boxed: torch converts the stack); otherwise the CPU's
// own kernel. uninstall() removes the gates, so the Python kernels are current again.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>  // at::Tensor <-> torch.Tensor
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
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
  c10::SafeKernelFunction plain;                 // the CPU's own kernel
  std::optional<c10::SafeKernelFunction> half;   // the Python float16 kernel (set by install)
  std::string name;
  int64_t exempt = -1;  // an argument that stays float32 whatever the activations' dtype
  int64_t flag = -1;    // a bool argument: true -> the CPU's own kernel answers
};

// Owned here; never freed while the process may still dispatch to a gate (a late caller on another
// thread keeps valid pointers); replaced whole by the next capture.
std::vector<Gate>* g_gates = nullptr;
std::unique_ptr<torch::Library> g_lib;
std::mutex g_mutex;

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

void gate(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const Gate* found = nullptr;
  for (const auto& g : *g_gates) {
    if (g.op == op) {
      found = &g;
      break;
    }
  }
  TORCH_CHECK(found != nullptr, "torch_adapter float16 gate: no kernel kept for ", op.schema().operator_name());
  const auto count = op.schema().arguments().size();
  if (found->half && all_half(*found, *stack, stack->size() - count, count)) {
    found->half->callBoxed(op, ks, stack);
  } else {
    found->plain.callBoxed(op, ks, stack);
  }
}

c10::OperatorHandle find(const std::string& name) {
  const auto bare = name.rfind("aten::", 0) == 0 ? name.substr(6) : name;
  const auto dot = bare.find('.');
  const auto base = "aten::" + bare.substr(0, dot);
  const auto overload = dot == std::string::npos ? std::string() : bare.substr(dot + 1);
  return c10::Dispatcher::singleton().findSchemaOrThrow(base.c_str(), overload.c_str());
}

// (name, exempt argument or -1, flag argument or -1) per op
void capture(const std::vector<std::tuple<std::string, int64_t, int64_t>>& specs, const std::string& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(!g_lib, "torch_adapter float16 gate: capture() while installed");
  const auto dispatch_key = c10::parseDispatchKey(key);
  auto gates = std::make_unique<std::vector<Gate>>();
  for (const auto& [name, exempt, flag] : specs) {
    auto handle = find(name);
    gates->push_back({handle, handle.getComputedKernelForDispatchKey(dispatch_key), std::nullopt, name, exempt, flag});
  }
  g_gates = gates.release();  // the previous capture's stays allocated: see g_gates
}

void install(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(g_gates != nullptr, "torch_adapter float16 gate: install() before capture()");
  TORCH_CHECK(!g_lib, "torch_adapter float16 gate: already installed");
  const auto dispatch_key = c10::parseDispatchKey(key);
  for (auto& g : *g_gates) {
    g.half = g.op.getComputedKernelForDispatchKey(dispatch_key);
  }
  QuietWarnings quiet;  // "overriding a previously registered kernel" is the point
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", dispatch_key, __FILE__, __LINE__);
  for (const auto& g : *g_gates) {
    const auto& op_name = g.op.schema().operator_name();
    const auto full = op_name.overload_name.empty() ? op_name.name : op_name.name + "." + op_name.overload_name;
    g_lib->impl(full.substr(6).c_str(), torch::CppFunction::makeFromBoxedFunction<&gate>());
  }
}

void uninstall() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_lib.reset();  // the gates are deregistered: the Python kernels are current again
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
#endif

bool fused_casts() {
#ifdef TA_X86_CASTS
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

// `src` (float16 or bfloat16, dense and non-overlapping: its elements fill one span of memory) in the
// other dtype with the same sizes and strides; None when this CPU or this tensor is not for us.
py::object convert(const at::Tensor& src) {
  if (!fused_casts() || !src.defined() || src.device().type() != c10::DeviceType::CPU ||
      !src.is_non_overlapping_and_dense() || src.is_conj() || src.is_neg()) {
    return py::none();
  }
  const auto from = src.scalar_type();
  if (from != at::kHalf && from != at::kBFloat16) {
    return py::none();
  }
  at::Tensor out;
  {
    py::gil_scoped_release nogil;
    out = at::empty_strided(src.sizes(), src.strides(), src.options().dtype(from == at::kHalf ? at::kBFloat16 : at::kHalf));
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
  }
  return py::cast(out);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("capture", &capture, "keep the kernels at KEY now (the CPU's own) for these ops");
  m.def("install", &install, "keep the Python kernels now at KEY and register the gates on top");
  m.def("uninstall", &uninstall, "remove the gates");
  m.def("installed", &installed);
  m.def("fused_casts", &fused_casts, "does this CPU take the one-pass float16 <-> bfloat16 casts?");
  m.def("convert", &convert, "float16 <-> bfloat16 in one pass (same sizes and strides), or None");
}
