// torch_adapter dtype guard: the allocation ops of a simulated target, checked for a refused
// dtype in C++ so that supported dtypes never cross into Python.
//
// Built at first use by torch_adapter/routing/dtype_guard.py (torch.utils.cpp_extension.load),
// never at import. install(ops, key, refused, callback) registers one boxed kernel per op at
// `key` on top of the kernel there now (kept as a SafeKernelFunction and called after the
// check); uninstall() destroys the registration, so the dispatcher is as before. The kernel
// reads the op's `dtype` argument (None: the default dtype); only when that dtype's bit is set
// in the refused mask does it take the GIL and call callback(op_name, dtype), which raises the
// real backend's error or records the call and returns.

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

struct Original {
  c10::OperatorHandle op;
  c10::SafeKernelFunction kernel;
  std::string name;
};

std::atomic<uint64_t> g_mask{0};
std::vector<Original>* g_originals = nullptr;  // set under g_mutex before the kernels exist
py::object* g_callback = nullptr;
std::unique_ptr<torch::Library> g_lib;
std::mutex g_mutex;

class QuietWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

void check(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto idx = schema.argumentIndexWithName("dtype");
  c10::ScalarType dtype = c10::typeMetaToScalarType(c10::get_default_dtype());
  if (idx) {
    const auto& value = (*stack)[stack->size() - schema.arguments().size() + *idx];
    if (!value.isNone()) {
      dtype = static_cast<c10::ScalarType>(value.toInt());
    }
  }
  const auto bit = static_cast<uint64_t>(dtype);
  const Original* original = nullptr;
  for (const auto& o : *g_originals) {
    if (o.op == op) {
      original = &o;
      break;
    }
  }
  TORCH_CHECK(original != nullptr, "torch_adapter dtype guard: no kernel kept for ", schema.operator_name());
  if (bit < 64 && ((g_mask.load(std::memory_order_relaxed) >> bit) & 1)) {
    py::gil_scoped_acquire gil;
    try {
      auto py_dtype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype)));
      (*g_callback)(original->name, py_dtype);
    } catch (py::error_already_set& e) {
      e.restore();  // the Python exception travels back to the caller as itself
      python_error err;
      err.persist();
      throw std::move(err);
    }
  }
  original->kernel.callBoxed(op, ks, stack);
}

void install(const std::vector<std::string>& ops, const std::string& key, const py::list& refused,
             py::object callback) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(!g_lib, "torch_adapter dtype guard: already installed");
  const auto dispatch_key = c10::parseDispatchKey(key);
  uint64_t mask = 0;
  for (const auto& item : refused) {
    TORCH_CHECK(THPDtype_Check(item.ptr()), "torch_adapter dtype guard: refused must hold torch.dtype objects");
    mask |= uint64_t{1} << static_cast<uint64_t>(reinterpret_cast<THPDtype*>(item.ptr())->scalar_type);
  }
  auto originals = std::make_unique<std::vector<Original>>();
  for (const auto& name : ops) {
    const auto dot = name.find('.');
    const auto base = name.substr(0, dot);
    const auto overload = dot == std::string::npos ? std::string() : name.substr(dot + 1);
    auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(base.c_str(), overload.c_str());
    originals->push_back({handle, handle.getComputedKernelForDispatchKey(dispatch_key), name});
  }
  delete g_originals;  // the previous install's (its kernels are gone)
  g_originals = originals.release();
  delete g_callback;
  g_callback = new py::object(std::move(callback));
  g_mask.store(mask);
  QuietWarnings quiet;  // "overriding a previously registered kernel" is the point
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", dispatch_key, __FILE__, __LINE__);
  for (const auto& o : *g_originals) {
    const auto op_name = o.name.substr(std::string("aten::").size());
    g_lib->impl(op_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&check>());
  }
}

void uninstall() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_lib.reset();  // the kernels are deregistered; the kept originals stay valid for late callers
  g_mask.store(0);
}

bool installed() {
  return static_cast<bool>(g_lib);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, "register the dtype check on the allocation ops");
  m.def("uninstall", &uninstall, "remove it");
  m.def("installed", &installed);
}
