#include "device_runtime.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "simt_runtime.h"

namespace wm::simt {
namespace {

constexpr size_t kDeviceBytes = size_t{16} << 30;  // what cudaMemGetInfo reports as total

struct Device {
  std::mutex mu;  // the plugin drives one device from one thread; tests may create several backends
  std::map<const uint8_t*, size_t> allocations;
  size_t allocated = 0;
  cudaError_t last = cudaSuccess;    // cleared by cudaGetLastError
  cudaError_t sticky = cudaSuccess;  // a kernel fault: every call fails from then on
  std::map<const void*, size_t> smem_limits;
  // the stream capture in progress, if any
  cudaStream_t recording_stream = nullptr;
  bool recording = false, recording_broken = false;
  std::vector<std::function<cudaError_t()>> recorded;
};

// a captured graph and an instantiated one: the operations in order
struct Graph {
  std::vector<std::function<cudaError_t()>> ops;
};

Device& device() {
  static Device* d = new Device();  // never destroyed: backends may be torn down at exit
  return *d;
}

cudaError_t fail_with(cudaError_t e) {
  device().last = e;
  return e;
}

// [p, p + bytes) inside one allocation
bool inside_allocation(const void* p, size_t bytes) {
  const auto* b = static_cast<const uint8_t*>(p);
  auto& a = device().allocations;
  auto it = a.upper_bound(b);
  if (it == a.begin()) return false;
  --it;
  return b >= it->first && b + bytes <= it->first + it->second;
}

// the dynamic shared memory a kernel may ask for (its attribute, else the default); under d.mu
size_t smem_allowed(const Device& d, const void* kernel) {
  const auto limit = d.smem_limits.find(kernel);
  return limit == d.smem_limits.end() ? kDefaultSharedPerBlock : limit->second;
}

struct Event {
  std::chrono::steady_clock::time_point at;
  bool recorded = false;
};

}  // namespace

namespace {

// runs a kernel now, on one of the three schedules in turn
cudaError_t run_launch(Device& d, LaunchConfig cfg, const std::function<void()>& thread_body) {
  // the launches take turns at the three schedules, so that a suite's many
  // launches of each kernel meet all of them (deterministically)
  static unsigned launches = 0;
  constexpr Schedule kTurns[] = {Schedule::kRoundRobin, Schedule::kWarpsInOrder, Schedule::kWarpsReversed};
  cfg.schedule = kTurns[launches++ % 3];
  const std::string error = launch(cfg, thread_body);
  if (!error.empty()) {
    std::fprintf(stderr, "simt: kernel fault: %s\n", error.c_str());
    d.sticky = cudaErrorLaunchFailure;
    return fail_with(cudaErrorLaunchFailure);
  }
  return cudaSuccess;
}

}  // namespace

bool recording() { return device().recording; }

bool recording_invalidated() { return device().recording && device().recording_broken; }

void record(std::function<cudaError_t()> op) { device().recorded.push_back(std::move(op)); }

cudaError_t launch_on_device(const void* kernel, dim3 grid, dim3 block, size_t smem,
                             std::function<void()> thread_body) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.sticky != cudaSuccess) return d.sticky;
  const unsigned long long threads = static_cast<unsigned long long>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || threads == 0 ||
      threads > kMaxThreadsPerBlock || block.z > 64)
    return fail_with(cudaErrorInvalidConfiguration);
  if (smem > smem_allowed(d, kernel)) return fail_with(cudaErrorInvalidValue);
  LaunchConfig cfg;
  cfg.grid = grid;
  cfg.block = block;
  cfg.dynamic_smem = smem;
  // as on a GPU: once a call broke the capture, every later one in it fails
  if (d.recording && d.recording_broken) return fail_with(cudaErrorStreamCaptureInvalidated);
  if (d.recording) {
    d.recorded.push_back([&d, cfg, body = std::move(thread_body)] { return run_launch(d, cfg, body); });
    return cudaSuccess;
  }
  return run_launch(d, cfg, thread_body);
}

size_t max_shared_per_block() {
  static const size_t limit = [] {
    const char* e = std::getenv("WM_SIMT_MAX_SHARED_PER_BLOCK");
    if (e == nullptr || *e == '\0') return kMaxSharedPerBlock;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(e, &end, 10);
    if (*end != '\0' || v < kDefaultSharedPerBlock || v > kMaxSharedPerBlock) {
      std::fprintf(stderr, "WM_SIMT_MAX_SHARED_PER_BLOCK='%s': bytes from %zu to %zu\n", e, kDefaultSharedPerBlock,
                   kMaxSharedPerBlock);
      std::abort();
    }
    return static_cast<size_t>(v);
  }();
  return limit;
}

cudaError_t set_kernel_smem_limit(const void* kernel, size_t bytes) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (bytes > max_shared_per_block()) return fail_with(cudaErrorInvalidValue);
  d.smem_limits[kernel] = bytes;
  return cudaSuccess;
}

int resident_blocks(const void* kernel, int threads, size_t smem) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (threads <= 0 || threads > static_cast<int>(kMaxThreadsPerBlock) || smem > smem_allowed(d, kernel)) return 0;
  const int by_threads = static_cast<int>(kMaxThreadsPerSm) / threads;
  const int by_smem = smem == 0 ? 32 : static_cast<int>(kSharedPerSm / (smem + 1024));  // 1 KiB reserved per CTA
  return std::min(32, std::min(by_threads, by_smem));
}

}  // namespace wm::simt

// ---- the CUDA runtime API, as far as the plugin uses it ----

using wm::simt::device;
using wm::simt::fail_with;

#define WM_SIMT_STICKY()                                          \
  do {                                                            \
    if (device().sticky != cudaSuccess) return device().sticky;   \
  } while (0)

namespace {

// a call a recording cannot hold: it fails and so does the recording
cudaError_t unsupported_while_recording() {
  device().recording_broken = true;
  return fail_with(cudaErrorStreamCaptureUnsupported);
}

}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : fail_with(cudaErrorInvalidDevice); }

cudaError_t cudaGetDevice(int* dev) {
  *dev = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int dev) {
  if (dev != 0) return fail_with(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof(p->name), "simt emulator (sm_90)");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = wm::simt::kMultiprocessors;
  p->totalGlobalMem = wm::simt::kDeviceBytes;
  p->sharedMemPerBlock = wm::simt::kDefaultSharedPerBlock;
  p->sharedMemPerBlockOptin = wm::simt::max_shared_per_block();
  p->sharedMemPerMultiprocessor = wm::simt::kSharedPerSm;
  p->maxThreadsPerBlock = static_cast<int>(wm::simt::kMaxThreadsPerBlock);
  p->maxThreadsPerMultiProcessor = static_cast<int>(wm::simt::kMaxThreadsPerSm);
  p->warpSize = 32;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

// the driver entry points the plugin looks up: cuTensorMapEncodeTiled, the emulator's
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* found) {
  if (symbol != nullptr && std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0) {
    *fn = reinterpret_cast<void*>(&wm::simt::tensor_map_encode_tiled);
    if (found != nullptr) *found = cudaDriverEntryPointSuccess;
    return cudaSuccess;
  }
  *fn = nullptr;
  if (found != nullptr) *found = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  WM_SIMT_STICKY();
  std::lock_guard<std::mutex> lock(device().mu);
  *total_bytes = wm::simt::kDeviceBytes;
  *free_bytes = wm::simt::kDeviceBytes - device().allocated;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  WM_SIMT_STICKY();
  auto& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  *p = nullptr;
  if (bytes > wm::simt::kDeviceBytes - d.allocated) return fail_with(cudaErrorMemoryAllocation);
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* m = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
  if (m == nullptr) return fail_with(cudaErrorMemoryAllocation);
  std::memset(m, 0xff, rounded == 0 ? 256 : rounded);  // NaN bits: a read of what nobody wrote shows
  d.allocations[static_cast<const uint8_t*>(m)] = bytes;
  d.allocated += bytes;
  wm::simt::register_global(m, bytes);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  auto& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocations.find(static_cast<const uint8_t*>(p));
  if (it == d.allocations.end()) return fail_with(cudaErrorInvalidValue);  // not ours, or freed twice
  d.allocated -= it->second;
  d.allocations.erase(it);
  wm::simt::unregister_global(p);
  std::free(p);
  return cudaSuccess;
}

// page-locked host memory is plain host memory here; refused on request
// (WM_SIMT_HOST_ALLOC_REFUSE=1), as a real runtime may refuse it, so that
// tests reach the plugin's pageable paths
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  WM_SIMT_STICKY();
  *p = nullptr;
  if (const char* refuse = std::getenv("WM_SIMT_HOST_ALLOC_REFUSE"); refuse != nullptr && std::strcmp(refuse, "1") == 0)
    return fail_with(cudaErrorMemoryAllocation);
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  return *p != nullptr ? cudaSuccess : fail_with(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  WM_SIMT_STICKY();
  if (bytes == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(device().mu);
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice ||
                       (kind == cudaMemcpyDefault && wm::simt::inside_allocation(dst, 1));
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice ||
                       (kind == cudaMemcpyDefault && wm::simt::inside_allocation(src, 1));
  if ((dst_dev && !wm::simt::inside_allocation(dst, bytes)) || (src_dev && !wm::simt::inside_allocation(src, bytes))) {
    std::fprintf(stderr, "simt: cudaMemcpyAsync of %zu bytes outside device memory\n", bytes);
    return fail_with(cudaErrorInvalidValue);
  }
  if (device().recording && device().recording_broken) return fail_with(cudaErrorStreamCaptureInvalidated);
  if (device().recording) {
    // a graph copies when it runs, from wherever src points then
    device().recorded.push_back([=] {
      std::memmove(dst, src, bytes);
      return cudaSuccess;
    });
    return cudaSuccess;
  }
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (device().recording) return unsupported_while_recording();
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) {
  WM_SIMT_STICKY();
  std::lock_guard<std::mutex> lock(device().mu);
  if (bytes > 0 && !wm::simt::inside_allocation(dst, bytes)) return fail_with(cudaErrorInvalidValue);
  if (device().recording && device().recording_broken) return fail_with(cudaErrorStreamCaptureInvalidated);
  if (device().recording) {
    device().recorded.push_back([=] {
      std::memset(dst, value, bytes);
      return cudaSuccess;
    });
    return cudaSuccess;
  }
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  WM_SIMT_STICKY();
  *s = reinterpret_cast<cudaStream_t>(new int(0));
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<int*>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) {
  WM_SIMT_STICKY();
  if (device().recording) return unsupported_while_recording();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  WM_SIMT_STICKY();
  if (device().recording) return unsupported_while_recording();
  return cudaSuccess;
}

// ---- stream capture and graphs ----

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode) {
  WM_SIMT_STICKY();
  auto& d = device();
  if (d.recording) return fail_with(cudaErrorIllegalState);
  d.recording = true;
  d.recording_broken = false;
  d.recording_stream = stream;
  d.recorded.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  auto& d = device();
  if (!d.recording || stream != d.recording_stream) return fail_with(cudaErrorIllegalState);
  d.recording = false;
  *graph = nullptr;
  if (d.recording_broken) {
    d.recorded.clear();
    return fail_with(cudaErrorStreamCaptureInvalidated);
  }
  auto* g = new wm::simt::Graph();
  g->ops = std::move(d.recorded);
  d.recorded.clear();
  *graph = reinterpret_cast<cudaGraph_t>(g);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  auto& d = device();
  *status = !d.recording || stream != d.recording_stream ? cudaStreamCaptureStatusNone
            : d.recording_broken                          ? cudaStreamCaptureStatusInvalidated
                                                          : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  WM_SIMT_STICKY();
  if (graph == nullptr) return fail_with(cudaErrorInvalidValue);
  *exec = reinterpret_cast<cudaGraphExec_t>(new wm::simt::Graph(*reinterpret_cast<wm::simt::Graph*>(graph)));
  return cudaSuccess;
}

// the same number of operations updates the parameters; anything else is a
// topology change the caller answers by instantiating anew
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo* info) {
  WM_SIMT_STICKY();
  if (exec == nullptr || graph == nullptr) return fail_with(cudaErrorInvalidValue);
  auto* e = reinterpret_cast<wm::simt::Graph*>(exec);
  const auto* g = reinterpret_cast<wm::simt::Graph*>(graph);
  if (info != nullptr) *info = cudaGraphExecUpdateResultInfo{};
  if (e->ops.size() != g->ops.size()) {
    if (info != nullptr) info->result = cudaGraphExecUpdateErrorTopologyChanged;
    return fail_with(cudaErrorGraphExecUpdateFailure);
  }
  e->ops = g->ops;
  if (info != nullptr) info->result = cudaGraphExecUpdateSuccess;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  WM_SIMT_STICKY();
  if (exec == nullptr) return fail_with(cudaErrorInvalidValue);
  auto& d = device();
  if (d.recording) return unsupported_while_recording();
  for (const auto& op : reinterpret_cast<wm::simt::Graph*>(exec)->ops) {
    std::lock_guard<std::mutex> lock(d.mu);
    const cudaError_t e = op();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<wm::simt::Graph*>(exec);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<wm::simt::Graph*>(graph);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  WM_SIMT_STICKY();
  *e = reinterpret_cast<cudaEvent_t>(new wm::simt::Event());
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<wm::simt::Event*>(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  WM_SIMT_STICKY();
  auto* ev = reinterpret_cast<wm::simt::Event*>(e);
  ev->at = std::chrono::steady_clock::now();
  ev->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t) {
  WM_SIMT_STICKY();
  if (device().recording) return unsupported_while_recording();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t) {  // kernels and copies have run by the time a launch returns
  WM_SIMT_STICKY();
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t begin, cudaEvent_t end) {
  WM_SIMT_STICKY();
  const auto* b = reinterpret_cast<wm::simt::Event*>(begin);
  const auto* e = reinterpret_cast<wm::simt::Event*>(end);
  if (!b->recorded || !e->recorded) return fail_with(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(e->at - b->at).count();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  auto& d = device();
  if (d.sticky != cudaSuccess) return d.sticky;
  const cudaError_t e = d.last;
  d.last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return device().sticky != cudaSuccess ? device().sticky : device().last; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    default:
      return "cudaError (other)";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaErrorLaunchFailure ? "a kernel fault on the emulator (its message is on stderr)"
                                     : cudaGetErrorName(e);
}
