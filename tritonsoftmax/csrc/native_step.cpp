// The C++ launch path of an eager softmax step (tritonsoftmax/native.py builds and loads it).
//
// A recorded eager call through Python pays for torch.autograd.Function's Python on the way in and for
// the backward's Python on autograd's device thread; this file starts the same compiled Triton kernels
// from C++ instead: a torch::autograd::Function whose forward and backward look up a launch plan (the
// CUfunction, grid, block, shared memory and the kernel's parameters, all fixed by the Python path's
// first call of a signature) and call cuLaunchKernel on the current stream. A signature with no plan
// returns None (forward) or calls back into Python (backward), which runs the Python path and may add a
// plan. Nothing here chooses a kernel: plans come from the Python side only.
//
// With patch_torch() on top, the same plans serve torch's own operators: aten::_softmax, _log_softmax and their
// _backward_data get kernels here for the block's lifetime, so that torch's C++ autograd node calls a C++ launch
// (patch_aten / unpatch_aten); a call no plan serves goes to Python's implementation, which may add one.
//
// No CUDA headers: the driver's entry points come from the libcuda already loaded in the process
// (dlopen RTLD_NOLOAD), the current stream from c10's device-generic Stream::native_handle.

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// ---- the driver entry points (CUDA driver API types, spelled without cuda.h) ----
using CUresult = int;
using CUfunction = void*;
using CUstream = void*;
using CUcontext = void*;
using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void**, void**);
using ParamInfoFn = CUresult (*)(CUfunction, size_t, size_t*, size_t*);
using CtxGetCurrentFn = CUresult (*)(CUcontext*);
using CtxSetCurrentFn = CUresult (*)(CUcontext);
using PrimaryRetainFn = CUresult (*)(CUcontext*, int);

struct Driver {
  LaunchFn launch = nullptr;
  ParamInfoFn param_info = nullptr;
  CtxGetCurrentFn ctx_get = nullptr;
  CtxSetCurrentFn ctx_set = nullptr;
  PrimaryRetainFn primary_retain = nullptr;
  bool ok() const { return launch && param_info && ctx_get && ctx_set && primary_retain; }
};

const Driver& driver() {
  static Driver d = [] {
    Driver r;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return r;
    r.launch = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
    r.param_info = reinterpret_cast<ParamInfoFn>(dlsym(lib, "cuFuncGetParamInfo"));
    r.ctx_get = reinterpret_cast<CtxGetCurrentFn>(dlsym(lib, "cuCtxGetCurrent"));
    r.ctx_set = reinterpret_cast<CtxSetCurrentFn>(dlsym(lib, "cuCtxSetCurrent"));
    r.primary_retain = reinterpret_cast<PrimaryRetainFn>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    return r;
  }();
  return d;
}

// ---- launch plans ----
// What each kernel parameter holds (kinds as native.py numbers them).
enum Kind : int64_t { FIXED_INT = 0, FIXED_F32 = 1, PTR_IN = 2, PTR_OUT = 3, PTR_SAVED = 4, SCALE = 5 };
constexpr size_t MAX_PARAMS = 64;

struct Plan {
  CUfunction fn = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned block = 32;
  unsigned smem = 0;
  bool aligned = false;   // the kernel was compiled for 16-byte-aligned pointers (or for any)
  std::vector<uint64_t> words;  // one 8-byte slot a parameter: the fixed values
  int in_slot = -1, out_slot = -1, saved_slot = -1, scale_slot = -1;  // saved: the backward's third tensor
};

// A signature: forward or backward, the caller's mode (impl, log, zero_masked), dim, dtype, device, sizes,
// strides of the tensor the call is keyed on (x for a forward, the saved output for a backward).
using Key = std::vector<int64_t>;
struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    size_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
    return h;
  }
};

constexpr size_t MAX_PLANS = 4096;  // forget every plan past this many signatures (dynamic shapes)
std::mutex plans_mutex;
std::unordered_map<Key, std::shared_ptr<const Plan>, KeyHash> plans;
std::atomic<int64_t> counters[4] = {0, 0, 0, 0};  // forward launches, backward launches, forward misses, backward misses

Key make_key(const at::Tensor& t, int64_t backward, int64_t dim, int64_t mode) {
  const int64_t nd = t.dim();
  Key k;
  k.reserve(6 + 2 * nd);
  k.push_back(backward);
  k.push_back(mode);
  k.push_back(dim);
  k.push_back(static_cast<int64_t>(t.scalar_type()));
  k.push_back(t.get_device());
  k.push_back(nd);
  for (int64_t s : t.sizes()) k.push_back(s);
  for (int64_t s : t.strides()) k.push_back(s);
  return k;
}

std::shared_ptr<const Plan> find(const Key& k) {
  std::lock_guard<std::mutex> g(plans_mutex);
  auto it = plans.find(k);
  return it == plans.end() ? nullptr : it->second;
}

// A CUDA tensor with storage of its own (not a wrapper subclass or a torch.func wrapper, whose data_ptr raises).
bool usable(const at::Tensor& t) {
  return t.defined() && t.is_cuda() && t.has_storage() && t.dim() > 0 && t.numel() > 0;
}

// Start ``p`` on the current stream of ``dev``: a (x or dy), out (y or dx), saved (the backward's y).
void start(const Plan& p, const at::Tensor& a, const at::Tensor& out, const at::Tensor* saved, double scale) {
  const Driver& d = driver();
  const c10::Device dev = a.device();
  c10::DeviceGuard guard(dev);
  CUcontext ctx = nullptr;
  d.ctx_get(&ctx);
  if (ctx == nullptr) {  // a thread the runtime has not touched: the device's primary context, as Triton does
    TORCH_CHECK(d.primary_retain(&ctx, dev.index()) == 0 && d.ctx_set(ctx) == 0,
                "tritonsoftmax native: no CUDA context for ", dev);
  }
  const size_t n = p.words.size();
  uint64_t buf[MAX_PARAMS];
  void* params[MAX_PARAMS];
  std::memcpy(buf, p.words.data(), n * sizeof(uint64_t));
  buf[p.in_slot] = reinterpret_cast<uint64_t>(a.data_ptr());
  buf[p.out_slot] = reinterpret_cast<uint64_t>(out.data_ptr());
  if (p.saved_slot >= 0) buf[p.saved_slot] = reinterpret_cast<uint64_t>(saved->data_ptr());
  if (p.scale_slot >= 0) {
    const float s = static_cast<float>(scale);
    buf[p.scale_slot] = 0;
    std::memcpy(&buf[p.scale_slot], &s, sizeof(float));
  }
  for (size_t i = 0; i < n; ++i) params[i] = &buf[i];
  c10::impl::VirtualGuardImpl impl(dev.type());
  auto stream = static_cast<CUstream>(impl.getStream(dev).native_handle());
  const CUresult r = d.launch(p.fn, p.grid[0], p.grid[1], p.grid[2], p.block, 1, 1, p.smem, stream, params, nullptr);
  TORCH_CHECK(r == 0, "tritonsoftmax native: cuLaunchKernel failed (CUresult ", r, ")");
}

bool pointers_match(const Plan& p, const at::Tensor& a, const at::Tensor& b, const at::Tensor* c) {
  auto bits = reinterpret_cast<uintptr_t>(a.data_ptr()) | reinterpret_cast<uintptr_t>(b.data_ptr());
  if (c != nullptr) bits |= reinterpret_cast<uintptr_t>(c->data_ptr());
  return ((bits & 15) == 0) == p.aligned;
}

// A forward through plan ``p`` into a new y (counted), or nothing where p does not take the addresses.
std::optional<at::Tensor> planned_forward(const Plan& p, const at::Tensor& x, double scale) {
  at::Tensor y = at::empty_like(x);
  if (!pointers_match(p, x, y, nullptr)) return std::nullopt;
  start(p, x, y, nullptr, scale);
  counters[0]++;
  return y;
}

// A backward through plan ``p`` (none: no plan) into a new dx (counted), or nothing where it cannot run.
std::optional<at::Tensor> planned_backward(const Plan* p, const at::Tensor& dy, const at::Tensor& y, double scale) {
  if (p == nullptr || !pointers_match(*p, dy, y, &y)) return std::nullopt;
  at::Tensor dx = at::empty_like(y);
  start(*p, dy, dx, &y, scale);
  counters[1]++;
  return dx;
}

// The Python side's callbacks (set by native.py): the backward of a signature with no plan, and the recorded
// backward (create_graph=True), whose graph Python's operator records.
py::object* backward_miss = nullptr;
py::object* backward_recorded = nullptr;

at::Tensor call_python(py::object* fn, const at::Tensor& dy, const at::Tensor& y, int64_t dim, double scale,
                       int64_t mode) {
  TORCH_CHECK(fn != nullptr, "tritonsoftmax native: no Python backward set");
  py::gil_scoped_acquire gil;
  return (*fn)(dy, y, dim, scale, mode).cast<at::Tensor>();
}

struct SoftmaxStep : public torch::autograd::Function<SoftmaxStep> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, double scale, int64_t mode,
                            const Plan* plan) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor y = at::empty_like(x);
    start(*plan, x, y, nullptr, scale);
    ctx->save_for_backward({y});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["mode"] = mode;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t mode = ctx->saved_data["mode"].toInt();
    at::Tensor dy = grads[0];
    at::Tensor dx;
    if (!dy.defined()) {
      dx = at::Tensor();
    } else if (at::GradMode::is_enabled()) {  // create_graph: a differentiable backward, recorded by Python
      dx = call_python(backward_recorded, dy, y, dim, scale, mode);
    } else {
      if (dy.scalar_type() != y.scalar_type() || dy.strides() != y.strides()) {
        dy = at::empty_like(y).copy_(dy);  // the kernels read dy and y with one set of strides
      }
      std::shared_ptr<const Plan> p;
      if (dy.strides() == y.strides()) p = find(make_key(y, 1, dim, mode));
      if (auto planned = planned_backward(p.get(), dy, y, scale)) {
        dx = *planned;
      } else {
        counters[3]++;
        dx = call_python(backward_miss, dy, y, dim, scale, mode);
      }
    }
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// softmax/log_softmax of x along dim, recorded where autograd would record it; None where no
// plan matches (the Python path runs it).
std::optional<at::Tensor> softmax(const at::Tensor& x, int64_t dim, double scale, int64_t mode) {
  if (!usable(x)) return std::nullopt;
  const int64_t nd = x.dim();
  if (dim < -nd || dim >= nd) return std::nullopt;  // the Python path raises torch's IndexError
  if (dim < 0) dim += nd;
  std::shared_ptr<const Plan> p = find(make_key(x, 0, dim, mode));
  if (!p) {
    counters[2]++;
    return std::nullopt;
  }
  if (x.requires_grad() && at::GradMode::is_enabled()) {
    if (!pointers_match(*p, x, x, nullptr)) return std::nullopt;  // y from empty_like: allocator-aligned
    counters[0]++;
    return SoftmaxStep::apply(x, dim, scale, mode, p.get());
  }
  return planned_forward(*p, x, scale);
}

// Add the plan of one signature (keyed on ``t`` as make_key does); false where this driver cannot check the
// compiled function's parameters against ``kinds`` (then nothing is added).
bool add_plan(const at::Tensor& t, bool backward, int64_t dim, int64_t mode, int64_t function,
              std::vector<int64_t> grid, int64_t block, int64_t smem, bool aligned, std::vector<int64_t> kinds,
              std::vector<int64_t> values) {
  const Driver& d = driver();
  if (!d.ok() || grid.size() != 3 || kinds.size() != values.size() || function == 0) return false;
  auto fn = reinterpret_cast<CUfunction>(function);
  std::vector<size_t> sizes;
  for (size_t i = 0; i < MAX_PARAMS; ++i) {
    size_t offset = 0, size = 0;
    if (d.param_info(fn, i, &offset, &size) != 0) break;
    sizes.push_back(size);
  }
  // Parameters past the signature's are the launcher's scratch pointers, null for kernels that need none.
  if (sizes.size() < kinds.size() || sizes.size() >= MAX_PARAMS) return false;
  auto plan = std::make_shared<Plan>();
  plan->fn = fn;
  for (int i = 0; i < 3; ++i) plan->grid[i] = static_cast<unsigned>(grid[i]);
  plan->block = static_cast<unsigned>(block);
  plan->smem = static_cast<unsigned>(smem);
  plan->aligned = aligned;
  plan->words.assign(sizes.size(), 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i >= kinds.size()) {
      if (sizes[i] != 8) return false;
      continue;
    }
    const auto slot = static_cast<int>(i);
    switch (kinds[i]) {
      case FIXED_INT:
        if (sizes[i] > 8) return false;
        plan->words[i] = static_cast<uint64_t>(values[i]);
        break;
      case FIXED_F32:
        if (sizes[i] != 4) return false;
        plan->words[i] = static_cast<uint64_t>(static_cast<uint32_t>(values[i]));
        break;
      case PTR_IN: plan->in_slot = slot; if (sizes[i] != 8) return false; break;
      case PTR_OUT: plan->out_slot = slot; if (sizes[i] != 8) return false; break;
      case PTR_SAVED: plan->saved_slot = slot; if (sizes[i] != 8) return false; break;
      case SCALE: plan->scale_slot = slot; if (sizes[i] != 4) return false; break;
      default: return false;
    }
  }
  if (plan->in_slot < 0 || plan->out_slot < 0 || (plan->saved_slot >= 0) != backward) return false;
  Key k = make_key(t, backward ? 1 : 0, dim, mode);
  std::lock_guard<std::mutex> g(plans_mutex);
  if (plans.size() >= MAX_PLANS) plans.clear();
  plans[std::move(k)] = std::move(plan);
  return true;
}

// ---- aten's softmax operators inside patch_torch() ----
// Python's implementations for calls no plan serves (set by patch_aten): forward (x, dim, half_to_float, log) and
// backward (grad, output, dim, input_dtype, log); the mode of the plans they read (auto's, plus 2 for log).
py::object* aten_forward_miss = nullptr;
py::object* aten_backward_miss = nullptr;
int64_t aten_mode = 0;
std::vector<std::unique_ptr<torch::Library>> aten_libraries;  // one a dispatch key while patched

template <bool Log>
at::Tensor aten_forward(const at::Tensor& x, int64_t dim, bool half_to_float) {
  if (!half_to_float && usable(x) && dim >= -x.dim() && dim < x.dim()) {
    const int64_t d = dim < 0 ? dim + x.dim() : dim;
    std::shared_ptr<const Plan> p = find(make_key(x, 0, d, aten_mode + 2 * Log));
    if (p) {
      if (auto y = planned_forward(*p, x, 1.0)) return *y;
    }
  }
  counters[2]++;
  py::gil_scoped_acquire gil;
  return (*aten_forward_miss)(x, dim, half_to_float, Log).cast<at::Tensor>();
}

template <bool Log>
at::Tensor aten_backward(const at::Tensor& grad, const at::Tensor& y, int64_t dim, at::ScalarType input_dtype) {
  if (usable(y) && usable(grad) && input_dtype == y.scalar_type() && grad.scalar_type() == y.scalar_type() &&
      grad.strides() == y.strides() && dim >= -y.dim() && dim < y.dim()) {
    const int64_t d = dim < 0 ? dim + y.dim() : dim;
    std::shared_ptr<const Plan> p = find(make_key(y, 1, d, aten_mode + 2 * Log));
    if (auto dx = planned_backward(p.get(), grad, y, 1.0)) return *dx;
  }
  counters[3]++;
  py::gil_scoped_acquire gil;
  return (*aten_backward_miss)(grad, y, dim, input_dtype, Log).cast<at::Tensor>();
}

// Registering over aten's kernels warns that it overrides them: that is the point.
struct QuietWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

int aten_depth = 0;  // patch_torch() blocks open (nested blocks share one registration)

void unpatch_aten() {
  if (aten_depth > 0 && --aten_depth > 0) return;  // an outer block still wants them
  aten_libraries.clear();  // a Library's destructor removes its kernels: aten's are back
}

void patch_aten(const std::vector<std::string>& keys, int64_t mode, py::object forward_miss,
                py::object backward_miss) {
  if (aten_depth++ > 0) return;
  aten_libraries.clear();
  delete aten_forward_miss;
  delete aten_backward_miss;
  aten_forward_miss = new py::object(std::move(forward_miss));
  aten_backward_miss = new py::object(std::move(backward_miss));
  aten_mode = mode;
  QuietWarnings quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  for (const std::string& key : keys) {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::parseDispatchKey(key),
                                                __FILE__, __LINE__);
    lib->impl("_softmax", &aten_forward<false>);
    lib->impl("_log_softmax", &aten_forward<true>);
    lib->impl("_softmax_backward_data", &aten_backward<false>);
    lib->impl("_log_softmax_backward_data", &aten_backward<true>);
    aten_libraries.push_back(std::move(lib));
  }
}

void clear() {
  std::lock_guard<std::mutex> g(plans_mutex);
  plans.clear();
}

void set_backward(py::object miss, py::object recorded) {
  delete backward_miss;
  delete backward_recorded;
  backward_miss = new py::object(std::move(miss));
  backward_recorded = new py::object(std::move(recorded));
}

py::tuple counts() {
  return py::make_tuple(counters[0].load(), counters[1].load(), counters[2].load(), counters[3].load());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tritonsoftmax's C++ launch path of an eager step (built by tritonsoftmax.native)";
  m.def("softmax", &softmax, "the forward through a known plan, or None");
  m.def("add_plan", &add_plan);
  m.def("clear", &clear);
  m.def("set_backward", &set_backward);
  m.def("patch_aten", &patch_aten, "aten's softmax operators on these dispatch keys: plans, else the given Python");
  m.def("unpatch_aten", &unpatch_aten, "aten's own kernels back");
  m.def("counts", &counts, "(forward launches, backward launches, forward misses, backward misses)");
  m.def("driver_ok", [] { return driver().ok(); }, "whether the loaded libcuda has every entry point used here");
}
