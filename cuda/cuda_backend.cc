#include "cuda/cuda_backend.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/half.h"
#include "cuda/add_rows.cuh"
#include "cuda/attention.cuh"
#include "cuda/attention_combine.cuh"
#include "cuda/attention_inputs.cuh"
#include "cuda/convert.cuh"
#include "cuda/cuda_check.h"
#include "cuda/euler_step.cuh"
#include "cuda/gated_residual.cuh"
#include "cuda/gelu.cuh"
#include "cuda/kv_append.cuh"
#include "cuda/kv_probe.cuh"
#include "cuda/layer_norm_modulate.cuh"
#include "cuda/noise.cuh"
#include "cuda/patchify.cuh"
#include "cuda/query_gram.cuh"
#include "cuda/rms_norm_rope.cuh"
#include "cuda/span_encode.cuh"
#include "engine/plugin_kv_geometry.h"
#include "quant/kmeans.h"
#include "quant/kv_span.h"
#include "quant/q2_ops.h"
#include "quant/span_codec.h"

namespace wm::cuda {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr size_t kGemmWorkspace = 32 * kMiB;
// device memory the backend's own workspaces may take beyond pool and reserve
constexpr int64_t kHeadroom = 512 * kMiB;

int32_t round_up8(int32_t x) { return (x + 7) / 8 * 8; }

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

absl::Status need(const void* p, const char* what) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  return absl::OkStatus();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

FrameGeom frame_geom(const WmFrameShape& s) { return FrameGeom{s.height, s.width, s.channels, s.patch}; }

absl::Status check_frame_shape(const WmFrameShape& s) {
  if (s.patch <= 0 || s.height <= 0 || s.width <= 0 || s.channels <= 0 || s.height % s.patch != 0 ||
      s.width % s.patch != 0)
    return absl::InvalidArgumentError("patchify: bad frame shape");
  return absl::OkStatus();
}

}  // namespace

absl::Status cuda_probe(int32_t device, WmPluginDeviceInfo* info) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky, but leave no trace
    return absl::UnavailableError(
        absl::StrCat("no usable CUDA device: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device");
  if (device < 0 || device >= count)
    return absl::NotFoundError(absl::StrCat("CUDA device ", device, " does not exist (", count, " present)"));
  cudaDeviceProp p{};
  WM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, device));
  WmPluginDeviceInfo i{};
  // device names are short; keep the first 127 bytes
  const size_t name_len = std::min(std::strlen(p.name), sizeof(i.name) - 1);
  std::memcpy(i.name, p.name, name_len);
  i.name[name_len] = '\0';
  i.ordinal = device;
  i.sm_major = p.major;
  i.sm_minor = p.minor;
  i.multiprocessors = p.multiProcessorCount;
  i.total_bytes = static_cast<int64_t>(p.totalGlobalMem);
  cudaDriverGetVersion(&i.driver_version);
  cudaRuntimeGetVersion(&i.runtime_version);
  if (p.major < 9)
    return absl::UnavailableError(absl::StrCat("CUDA device ", device, " (", p.name, ") is sm_", p.major, p.minor,
                                               "; this plugin is built for sm_90 (Hopper) and newer"));
  WM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  WM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  i.free_bytes = static_cast<int64_t>(free_b);
  if (info != nullptr) *info = i;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::create(const WmPluginOptions& options) {
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  absl::Status s = b->init(options);
  if (!s.ok()) return s;
  return b;
}

absl::Status CudaBackend::init(const WmPluginOptions& o) {
  if (o.struct_size != sizeof(WmPluginOptions))
    return absl::InvalidArgumentError(absl::StrCat("plugin options are ", o.struct_size, " bytes, the plugin expects ",
                                                   sizeof(WmPluginOptions)));
  device_ = o.device;
  absl::Status s = cuda_probe(device_, &info_);
  if (!s.ok()) return s;
  WM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (o.kv_page_bytes <= 0 || o.kv_page_bytes % (32 * 1024) != 0)
    return absl::InvalidArgumentError(absl::StrCat("kv page size ", o.kv_page_bytes, " is not a multiple of 32 KiB"));
  if (o.kv_pool_bytes < 0 || o.reserve_bytes < 0) return absl::InvalidArgumentError("negative memory budget");
  page_bytes_ = o.kv_page_bytes;
  const int64_t pages = o.kv_pool_bytes / page_bytes_;
  if (pages > INT32_MAX) return absl::InvalidArgumentError("kv pool has more than 2^31 pages: use larger pages");
  size_t free_b = 0, total_b = 0;
  WM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  const int64_t want = pages * page_bytes_ + o.reserve_bytes + kHeadroom;
  if (want > static_cast<int64_t>(free_b))
    return absl::ResourceExhaustedError(absl::StrCat(
        "GPU memory: the KV pool (", pages * page_bytes_, " bytes) + the model (", o.reserve_bytes,
        " bytes) + ", kHeadroom, " bytes of workspace need more than the ", free_b, " bytes free on ", info_.name));
  WM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  WM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timer_begin_));
  WM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timer_end_));
  if (cudaHostAlloc(&staging_host_, kStagingBytes, cudaHostAllocDefault) == cudaSuccess) {
    staging_events_.assign(kStagingEvents, nullptr);
    for (cudaEvent_t& e : staging_events_)
      WM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    staging_ = std::make_unique<StagingRing>(kStagingBytes, kStagingEvents);
  } else {
    staging_host_ = nullptr;
    cudaGetLastError();  // not sticky: uploads copy from pageable memory instead
  }
  if (pages > 0) {
    s = pool_memory_.reserve(static_cast<size_t>(pages * page_bytes_));
    if (!s.ok()) return s;
  }
  pool_ = PagePool(static_cast<int32_t>(pages));
  auto g = Gemm::create(stream_, kGemmWorkspace);
  if (!g.ok()) return g.status();
  gemm_ = std::move(*g);
  WM_CUDA_RETURN_IF_ERROR(attention_prepare());
  // the span formats' kernels: without them those formats are refused, nothing else changes
  span_ready_ = attention_span_prepare() == cudaSuccess;
  if (!span_ready_) cudaGetLastError();
  // the wgmma kernels are sm_90a code: they load on compute capability 9.0 only
  if (info_.sm_major == 9 && info_.sm_minor == 0) {
    sm90_ready_ = attention_sm90_prepare() == cudaSuccess;
    if (!sm90_ready_) cudaGetLastError();
    span_sm90_ready_ = sm90_ready_ && attention_sm90_span_prepare() == cudaSuccess;
    if (!span_sm90_ready_) cudaGetLastError();
    // a kernel whose registers or shared memory do not fit an SM would fail every launch
    encode_tensor_maps();
    ws_ready_ = sm90_ready_;
    ws_tma_ready_ = sm90_ready_ && tensor_maps_ready_;
    for (int32_t hd : {64, 128})
      for (int32_t bq : {64, 128})
        for (int32_t st : {3, 4})
          for (int32_t keys : {64, 128}) {
            ws_ready_ = ws_ready_ && attention_sm90_ws_ctas_per_sm(hd, bq, st, keys) > 0;
            ws_tma_ready_ = ws_tma_ready_ && attention_sm90_ws_ctas_per_sm(hd, bq, st, keys, true) > 0;
          }
    ws_tma_ready_ = ws_tma_ready_ && ws_ready_;
    // the TMA build's deeper rings, as far as every head size and query tile fits (6 stages of 64 keys
    // take 224 KiB at head_dim 128): a deeper request runs the deepest that does
    ws_tma_max_stages_ = 4;
    for (int32_t st = 5; st <= 6 && ws_tma_ready_; ++st) {
      bool fits = true;
      for (int32_t hd : {64, 128})
        for (int32_t bq : {64, 128}) fits = fits && attention_sm90_ws_ctas_per_sm(hd, bq, st, 64, true) > 0;
      if (!fits) break;
      ws_tma_max_stages_ = st;
    }
    cudaGetLastError();
  }
  if (const char* e = std::getenv("WM_CUDA_ATTENTION"); e != nullptr && *e != '\0') {
    const absl::string_view v(e);
    const int64_t kind = v == "auto"      ? 0
                         : v == "mma"     ? kMma
                         : v == "wgmma"   ? kWgmma
                         : v == "overlap" ? kOverlap
                         : v == "ws"      ? kWs
                                          : -1;
    if (kind < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("WM_CUDA_ATTENTION='", v, "': use auto, mma, wgmma, overlap or ws"));
    s = set_tuning("attention.kernel", kind);
    if (!s.ok()) return s;
    default_attention_kernel_ = attention_kernel_;
  }
  if (const char* e = std::getenv("WM_CUDA_ATTENTION_STAGES"); e != nullptr && *e != '\0') {
    int32_t stages = 0;
    if (!absl::SimpleAtoi(e, &stages) || (stages != 0 && !attention_sm90_stages_valid(stages)))
      return absl::InvalidArgumentError(
          absl::StrCat("WM_CUDA_ATTENTION_STAGES='", e, "': use 0 (the default), 3, 4, 5 or 6"));
    default_attention_stages_ = stages;
  }
  if (const char* e = std::getenv("WM_CUDA_ATTENTION_WS_KEYS"); e != nullptr && *e != '\0') {
    int32_t keys = 0;
    if (!absl::SimpleAtoi(e, &keys) || (keys != 0 && !attention_sm90_ws_keys_valid(keys)))
      return absl::InvalidArgumentError(
          absl::StrCat("WM_CUDA_ATTENTION_WS_KEYS='", e, "': use 0 (the default), 64 or 128"));
    default_attention_ws_keys_ = keys;
  }
  if (const char* e = std::getenv("WM_CUDA_ATTENTION_WS_TMA"); e != nullptr && *e != '\0') {
    const absl::string_view v(e);
    if (v != "0" && v != "1")
      return absl::InvalidArgumentError(absl::StrCat("WM_CUDA_ATTENTION_WS_TMA='", v, "': use 0 or 1"));
    default_attention_ws_tma_ = v == "1" ? 1 : 0;
  }
  if (const char* e = std::getenv("WM_CUDA_ATTENTION_PINGPONG"); e != nullptr && *e != '\0') {
    const absl::string_view v(e);
    if (v != "0" && v != "1")
      return absl::InvalidArgumentError(absl::StrCat("WM_CUDA_ATTENTION_PINGPONG='", v, "': use 0 or 1"));
    default_attention_pingpong_ = v == "1" ? 1 : 0;
  }
  if (const char* e = std::getenv("WM_CUDA_SPAN_CODER"); e != nullptr && *e != '\0') {
    const absl::string_view v(e);
    const int32_t coder = v == "auto"          ? 0
                          : v == "device"      ? kSpanCoderDevice
                          : v == "host-kmeans" ? kSpanCoderHostKmeans
                          : v == "host"        ? kSpanCoderHost
                                               : -1;
    if (coder < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("WM_CUDA_SPAN_CODER='", v, "': use auto (the default), device, host-kmeans or host"));
    span_coder_pinned_ = coder;
  }
  if (const char* e = std::getenv("WM_CUDA_SPAN_CHECKS"); e != nullptr && *e != '\0') {
    int32_t checks = 0;
    if (!absl::SimpleAtoi(e, &checks) || checks < 0 || checks > 1000000)
      return absl::InvalidArgumentError(absl::StrCat("WM_CUDA_SPAN_CHECKS='", e,
                                                     "': the appends to check per coder, 0 (none) to 1000000"));
    default_span_checks_ = checks;
  }
  restart_span_choice(0);
  plan_tuning_.num_sms = std::max(1, info_.multiprocessors);
  measure_ctas_per_sm();
  return absl::OkStatus();
}

void CudaBackend::restart_span_choice(int32_t checks) {
  if (span_coder_pinned_ != 0) {
    span_choice_.pin(span_coder_pinned_);
    return;
  }
  span_choice_.restart(checks > 0 ? checks : default_span_checks_);
}

int32_t CudaBackend::overlap_stages() const {
  const int32_t s = attention_stages_ != 0 ? attention_stages_ : default_attention_stages_;
  return attention_sm90_overlap_stages(s != 0 ? s : kDefaultStages);
}

int32_t CudaBackend::ws_stages() const {
  const int32_t s = attention_stages_ != 0 ? attention_stages_ : default_attention_stages_;
  const int32_t asked = s != 0 ? s : kDefaultWsStages;
  return ws_tma() ? std::min(asked, ws_tma_max_stages_) : asked;
}

int32_t CudaBackend::ws_keys(int32_t /*block_q*/) const {
  const int32_t k = attention_ws_keys_ != 0 ? attention_ws_keys_ : default_attention_ws_keys_;
  return k != 0 ? k : 64;
}

bool CudaBackend::ws_tma() const {
  return ws_tma_ready_ && (attention_ws_tma_ >= 0 ? attention_ws_tma_ : default_attention_ws_tma_) != 0;
}

// the driver's cuTensorMapEncodeTiled, looked up at run time (the plugin
// links the runtime only); the pool's maps then live in device memory, where
// the tensor copies read them
void CudaBackend::encode_tensor_maps() {
  tensor_maps_ready_ = false;
  if (pool_.capacity() == 0) return;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();
    return;
  }
  const auto encode = reinterpret_cast<TensorMapEncodeTiled>(fn);
  CUtensorMap maps[2];
  for (int i = 0; i < 2; ++i) {
    const int32_t hd = i == 0 ? 64 : 128;
    const auto page_tokens = static_cast<int32_t>(page_bytes_ / (4 * hd));
    if (encode_fp16_pool_map(encode, &maps[i], pool_memory_.get(), pool_.capacity(), page_bytes_, hd, page_tokens,
                             kTileKeys) != CUDA_SUCCESS)
      return;
  }
  // the pool's two maps, then the block maps' two (encode_block_maps)
  if (!tensor_maps_.reserve(2 * sizeof(maps)).ok() ||
      cudaMemcpy(tensor_maps_.get(), maps, sizeof(maps), cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  tensor_map_encoder_ = encode;
  tensor_maps_ready_ = true;
}

// qkv16_ as rows of 64 and of 128 channels, for the own keys' tiles; after
// it grew (a growth has waited for the device: no launch reads the old maps)
void CudaBackend::encode_block_maps() {
  if (!tensor_maps_ready_ || t_recording_graph) return;
  const std::pair<const void*, size_t> now{qkv16_.get(), qkv16_.size()};
  if (now == block_maps_of_) return;
  block_maps_ready_ = false;
  block_maps_of_ = now;
  CUtensorMap maps[2];
  for (int i = 0; i < 2; ++i) {
    const int32_t hd = i == 0 ? 64 : 128;
    if (encode_rows_map(tensor_map_encoder_, &maps[i], qkv16_.get(), static_cast<int64_t>(qkv16_.size()) / (2 * hd),
                        hd, kTileKeys) != CUDA_SUCCESS)
      return;
  }
  if (cudaMemcpyAsync(tensor_maps_.as<uint8_t>() + sizeof(maps), maps, sizeof(maps), cudaMemcpyHostToDevice,
                      stream_) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  block_maps_ready_ = true;
}

// what the occupancy calculator says of each kernel at this device, for the planner
void CudaBackend::measure_ctas_per_sm() {
  for (size_t i = 0; i < kHeadDims.size(); ++i)
    for (int32_t j = 0; j < 2; ++j) {
      const int32_t hd = kHeadDims[i], bq = j == 0 ? 64 : 128, fallback = j == 0 ? 2 : 1;
      const int32_t stages = overlap_stages();  // 3..5
      const bool sm90 = sm90_ready_ && attention_sm90_supports(hd, stages);
      const std::array<int32_t, 4> n = {
          attention_ctas_per_sm(hd, bq),
          sm90_ready_ && attention_sm90_supports(hd, 0) ? attention_sm90_ctas_per_sm(hd, bq, 0) : 0,
          sm90 ? attention_sm90_ctas_per_sm(hd, bq, stages) : 0,
          sm90 ? attention_sm90_ws_ctas_per_sm(hd, bq, ws_stages(), ws_keys(bq), ws_tma()) : 0};
      for (size_t k = 0; k < n.size(); ++k) ctas_per_sm_[k][i][static_cast<size_t>(j)] = n[k] > 0 ? n[k] : fallback;
    }
}

CudaBackend::~CudaBackend() {
  if (recording_) {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g != nullptr) cudaGraphDestroy(g);
    recording_ = false;
    t_recording_graph = false;
    for (void* p : std::exchange(frees_after_recording_, {})) cudaFree(p);
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (const GraphSlot& g : graph_slots_) cudaGraphExecDestroy(g.exec);
  for (auto& w : weights_) cudaFree(w->data);
  gemm_.reset();
  if (timer_begin_ != nullptr) cudaEventDestroy(timer_begin_);
  if (timer_end_ != nullptr) cudaEventDestroy(timer_end_);
  for (cudaEvent_t e : staging_events_)
    if (e != nullptr) cudaEventDestroy(e);
  if (staging_host_ != nullptr) cudaFreeHost(staging_host_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<WmMemoryStats> CudaBackend::memory_stats() const {
  size_t free_b = 0, total_b = 0;
  WM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  WmMemoryStats m{};
  m.device_total = static_cast<int64_t>(total_b);
  m.device_free = static_cast<int64_t>(free_b);
  m.kv_pool_capacity = static_cast<int64_t>(pool_.capacity()) * page_bytes_;
  m.kv_pool_reserved = static_cast<int64_t>(pool_.reserved()) * page_bytes_;
  m.kv_pool_used = static_cast<int64_t>(pool_.used()) * page_bytes_;
  m.kv_page_bytes = page_bytes_;
  return m;
}

absl::Status CudaBackend::set_tuning(absl::string_view key, int64_t value) {
  invalidate_shadow();
  invalidate_half_inputs();
  if (key == "attention.block_q") {
    if (value != 0 && value != 64 && value != 128) return absl::InvalidArgumentError("attention.block_q: 0, 64 or 128");
    plan_tuning_.block_q = static_cast<int32_t>(value);
  } else if (key == "attention.split") {
    if (value < -1 || value == 0 || value > 4096) return absl::InvalidArgumentError("attention.split: -1 or 1..4096");
    plan_tuning_.split = static_cast<int32_t>(value);
  } else if (key == "attention.sms") {
    // plans as for a GPU of this many SMs (0: this one's); tests show with it
    // how a plan follows the batch without filling a real GPU's SMs
    if (value < 0 || value > 4096) return absl::InvalidArgumentError("attention.sms: 0 (this GPU's) or 1..4096");
    plan_tuning_.num_sms = value == 0 ? std::max(1, info_.multiprocessors) : static_cast<int32_t>(value);
  } else if (key == "attention.min_tiles_per_split") {
    if (value < 1 || value > 1 << 20) return absl::InvalidArgumentError("attention.min_tiles_per_split: >= 1");
    plan_tuning_.min_tiles_per_split = static_cast<int32_t>(value);
  } else if (key == "attention.kernel") {
    if (value < 0 || value > kWs)
      return absl::InvalidArgumentError(
          "attention.kernel: 0 (default), 1 (mma), 2 (wgmma), 3 (wgmma, overlapped) or 4 (warp-specialised)");
    if (value >= kWgmma && !sm90_ready_)
      return absl::FailedPreconditionError(absl::StrCat("attention.kernel: the wgmma kernels run on compute "
                                                        "capability 9.0 only; this GPU is ",
                                                        info_.sm_major, ".", info_.sm_minor));
    if (value == kWs && !ws_ready_)
      return absl::FailedPreconditionError("attention.kernel: the warp-specialised kernel does not fit this GPU");
    attention_kernel_ = static_cast<int32_t>(value);
  } else if (key == "attention.stages") {
    if (value != 0 && (value < 3 || value > 6))
      return absl::InvalidArgumentError("attention.stages: 0 (default), 3, 4, 5 or 6");
    attention_stages_ = static_cast<int32_t>(value);
    measure_ctas_per_sm();
  } else if (key == "attention.ws_keys") {
    if (value != 0 && value != 64 && value != 128)
      return absl::InvalidArgumentError("attention.ws_keys: 0 (default), 64 or 128");
    attention_ws_keys_ = static_cast<int32_t>(value);
    measure_ctas_per_sm();
  } else if (key == "attention.ws_tma") {
    if (value < -1 || value > 1) return absl::InvalidArgumentError("attention.ws_tma: -1 (default), 0 or 1");
    if (value == 1 && !ws_tma_ready_)
      return absl::FailedPreconditionError(
          "attention.ws_tma: no tensor maps of the KV pool on this device (or the TMA kernels do not fit it)");
    attention_ws_tma_ = static_cast<int32_t>(value);
    measure_ctas_per_sm();
  } else if (key == "attention.pingpong") {
    if (value < -1 || value > 1) return absl::InvalidArgumentError("attention.pingpong: -1 (default), 0 or 1");
    attention_pingpong_ = static_cast<int32_t>(value);
  } else if (key == "attention.ws_ablate") {
    if (value < 0 || value > kWsComputeOnly)
      return absl::InvalidArgumentError(
          "attention.ws_ablate: 0 (none), 1 (the loads alone) or 2 (the consumers alone); a benchmark's diagnosis "
          "whose outputs are wrong");
    attention_ws_ablate_ = static_cast<int32_t>(value);
  } else if (key == "linear.fallback") {
    gemm_->set_force_fallback(value != 0);
  } else if (key == "gemm.autotune") {
    if (value != 0 && value != 1) return absl::InvalidArgumentError("gemm.autotune: 0 or 1");
    gemm_->set_autotune(value != 0);
  } else if (key == "shadow") {
    use_shadow_ = value != 0;
  } else if (key == "ffn.fused") {
    fused_ffn_ = value != 0;
  } else if (key == "attention.fused_inputs") {
    if (value != 0 && value != 1) return absl::InvalidArgumentError("attention.fused_inputs: 0 or 1");
    fused_inputs_ = value != 0;
  } else if (key == "attention.bf16_output") {
    if (value != 0 && value != 1) return absl::InvalidArgumentError("attention.bf16_output: 0 or 1");
    attention_bf16_output_ = value != 0;
  } else if (key == "span.scratch_bytes") {
    if (value < 0) return absl::InvalidArgumentError("span.scratch_bytes: 0 (default) or a budget in bytes");
    span_scratch_bytes_ = value == 0 ? kSpanScratchBytes : value;
  } else if (key == "span.coder") {
    if (value < 0 || value > kSpanCoderHost)
      return absl::InvalidArgumentError(
          "span.coder: 0 (the default: WM_CUDA_SPAN_CODER's, else auto), 1 (the device), 2 (k-means on the host, "
          "the tokens' codes on the device) or 3 (the host)");
    span_coder_tuning_ = static_cast<int32_t>(value);
  } else if (key == "span.checks") {
    // the auto choice starts again from the device, checking this many appends per coder
    if (value < 0 || value > 1000000)
      return absl::InvalidArgumentError("span.checks: 0 (the default, WM_CUDA_SPAN_CHECKS's or 16) up to 1000000");
    restart_span_choice(static_cast<int32_t>(value));
  } else if (key == "span.check_fault") {
    // a drill: every checked append finds the device's image different
    span_check_fault_ = value != 0;
  } else if (key == "span.threads") {
    // the coder's kernels with blocks of this many threads, one CTA per job
    // (span_encode.cuh), 1 a thread per job: the codes must not depend on it
    if (value < 0 || value > 512 || (value % 32 != 0 && value != 1))
      return absl::InvalidArgumentError("span.threads: 0 (default), 1 (one thread per job) or whole warps up to 512");
    span_threads_ = static_cast<int32_t>(value);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown tuning key '", key, "'"));
  }
  ++tuning_generation_;
  return absl::OkStatus();
}

int32_t CudaBackend::kernel_for(int32_t head_dim, int32_t block_q) const {
  if (head_dim != 32 && head_dim != 64 && head_dim != 128) return 0;
  if (!sm90_ready_ || !attention_sm90_supports(head_dim, kDefaultStages)) return kMma;
  const int32_t k = attention_kernel_ != 0 ? attention_kernel_ : default_attention_kernel_;
  if (k == kWgmma && !attention_sm90_supports(head_dim, 0)) return kOverlap;
  if (k == kWs && !ws_ready_) return kOverlap;
  if (k != 0) return k;
  // measured on the H200 (docs/PERFORMANCE.md, 2026-12-04): the
  // warp-specialised kernel runs Matrix-Game-2's 2640-query blocks (128-query
  // tiles at head_dim 128) at 410 TFLOP/s against the overlapped kernel's
  // 381, and 64-query blocks at less than half the overlapped kernel's rate
  return head_dim == 128 && block_q == 128 && ws_ready_ ? kWs : kOverlap;
}

absl::StatusOr<int64_t> CudaBackend::counter(absl::string_view name) const {
  if (name == "gemm.cublaslt_calls") return gemm_ != nullptr ? gemm_->cublaslt_calls() : 0;
  if (name == "gemm.fallback_calls") return gemm_ != nullptr ? gemm_->fallback_calls() : 0;
  if (name == "gemm.gelu_epilogue_calls") return gemm_ != nullptr ? gemm_->gelu_epilogue_calls() : 0;
  if (name == "gemm.realigned_outputs") return gemm_ != nullptr ? gemm_->realigned_outputs() : 0;
  if (name == "gemm.autotuned_plans") return gemm_ != nullptr ? gemm_->autotuned_plans() : 0;
  if (name == "gemm.autotune_changes") return gemm_ != nullptr ? gemm_->autotune_changes() : 0;
  if (name == "ffn.fused_calls") return ffn_fused_calls_;
  if (name == "attention.fused_input_calls") return fused_input_calls_;
  if (name == "attention.bf16_output_calls") return bf16_output_calls_;
  if (name == "linear.operand_conversions") return operand_conversions_;
  if (name == "kv.append_launches") return append_launches_;
  if (name == "kv.probe_launches") return probe_launches_;
  if (name == "attention.kivi_launches") return kivi_attention_launches_;
  if (name == "attention.span_launches") return span_attention_launches_;
  if (name == "kv.span_frames_coded") return span_appends_;
  if (name == "kv.span_append_host_us") return span_append_ns_ / 1000;
  if (name == "kv.span_append_wait_us") return span_append_wait_ns_ / 1000;
  if (name == "kv.span_encode_launches") return span_encode_launches_;
  if (name == "kv.span_jobs_host_coded") return span_jobs_host_coded_;
  // not a count: where the span formats are coded now (1 device, 2 host k-means, 3 host)
  if (name == "kv.span_coder") return span_coder();
  if (name == "kv.span_checks_same") return span_choice_.passed();
  if (name == "kv.span_checks_different") return span_choice_.mismatches();
  if (name == "query.gram_launches") return gram_launches_;
  if (name == "query.gram_downloads") return gram_downloads_;
  if (name == "query.qsac_weight_launches") return qsac_weight_launches_;
  if (name == "query.gram_sets_kept") return static_cast<int64_t>(gram_sets_.size());
  if (name == "graph.recorded") return graphs_recorded_;
  if (name == "graph.recordings_failed") return graph_recordings_failed_;
  if (name == "graph.launches") return graph_launches_;
  if (name == "graph.instantiated") return graphs_instantiated_;
  if (name == "upload.staged") return staged_uploads_;
  if (name == "upload.pageable") return pageable_uploads_;
  if (name == "attention.plans") return plans_made_;
  if (name == "attention.plans_kept") return static_cast<int64_t>(plan_slots_.size());
  if (name == "attention.launches") return attention_launches_;
  if (name == "attention.sm90_launches") return sm90_launches_;
  if (name == "attention.overlap_launches") return overlap_launches_;
  if (name == "attention.ws_launches") return ws_launches_;
  if (name == "attention.ws_tma_launches") return ws_tma_launches_;
  // not a count: whether kernel 4 copies whole key tiles by TMA now
  if (name == "attention.ws_tma") return int64_t{ws_tma() ? 1 : 0};
  // not a count: the K/V stages of the overlapped kernel now
  if (name == "attention.stages") return int64_t{overlap_stages()};
  if (name == "attention.pingpong") return int64_t{pingpong()};
  if (name == "attention.ws_ablate") return int64_t{attention_ws_ablate_};
  // not a count: the warp-specialised kernel's keys per step now, for 128- and 64-query tiles
  if (name == "attention.ws_keys.block_q_128") return int64_t{ws_keys(128)};
  if (name == "attention.ws_keys.block_q_64") return int64_t{ws_keys(64)};
  // and its K/V stages (3 with 128 keys a step, whatever attention.stages says)
  if (name == "attention.ws_stages.block_q_128")
    return int64_t{attention_sm90_ws_stages(ws_stages(), ws_keys(128), ws_tma())};
  if (name == "attention.ws_stages.block_q_64")
    return int64_t{attention_sm90_ws_stages(ws_stages(), ws_keys(64), ws_tma())};
  // not a count: the kernel that attends a head size now (1 mma.sync, 2 wgmma, 3 overlapped, 4 warp-specialised),
  // 0 if none: attention.kernel.head_dim_N for 64-query tiles, attention.kernel.head_dim_N.block_q_128 for 128
  if (absl::ConsumePrefix(&name, "attention.kernel.head_dim_")) {
    const int32_t block_q = absl::ConsumeSuffix(&name, ".block_q_128") ? 128 : 64;
    int32_t hd = 0;
    if (!absl::SimpleAtoi(name, &hd)) return absl::NotFoundError("attention.kernel.head_dim_N: N is a number");
    return int64_t{kernel_for(hd, block_q)};
  }
  return absl::NotFoundError(absl::StrCat("unknown counter '", name, "'"));
}

absl::StatusOr<void*> CudaBackend::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of ", bytes, " bytes failed (", cudaGetErrorName(e),
                                                     "), ", free_b, " bytes free"));
  }
  return p;
}

void CudaBackend::free(void* p) {
  if (p == nullptr) return;
  if (recording_) {
    // a recorded op may use it: freed once the recording ends, which fails
    frees_after_recording_.push_back(p);
    recording_broken_ = true;
    return;
  }
  // queued kernels may still read it (rare: buffers grow or die)
  cudaStreamSynchronize(stream_);
  cudaFree(p);
}

absl::Status CudaBackend::upload(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  absl::Status s = need(dst, "upload destination");
  if (s.ok()) s = need(host, "upload source");
  if (!s.ok()) return s;
  return copy_to_device(dst, host, bytes);
}

absl::Status CudaBackend::copy_to_device(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  // a recorded copy would read the staging memory when the graph runs, long after it was reused
  if (recording_) return absl::FailedPreconditionError("an upload while a graph is recorded");
  if (staging_ == nullptr || bytes > staging_->capacity()) {
    // pageable source: the call returns once the driver has staged the bytes
    WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    ++pageable_uploads_;
    return absl::OkStatus();
  }
  // at most kStagingEvents regions are in flight and fences are consecutive,
  // so fence % kStagingEvents names an event no busy region still uses
  cudaError_t waited = cudaSuccess;
  const StagingRing::Placement p = staging_->place(bytes, [&](uint64_t fence) {
    const cudaError_t e = cudaEventSynchronize(staging_events_[fence % staging_events_.size()]);
    if (waited == cudaSuccess) waited = e;
  });
  WM_CUDA_RETURN_IF_ERROR(waited);
  uint8_t* at = static_cast<uint8_t*>(staging_host_) + p.offset;
  std::memcpy(at, host, bytes);
  WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, at, bytes, cudaMemcpyHostToDevice, stream_));
  if (const cudaError_t re = cudaEventRecord(staging_events_[p.fence % staging_events_.size()], stream_);
      re != cudaSuccess) {
    // the region would look free while its copy runs: wait for the copy instead
    cudaStreamSynchronize(stream_);
    WM_CUDA_RETURN_IF_ERROR(re);
  }
  ++staged_uploads_;
  return absl::OkStatus();
}

absl::Status CudaBackend::download(void* host, const void* src, size_t bytes) {
  if (recording_) return absl::FailedPreconditionError("a download while a graph is recorded");
  if (bytes == 0) return synchronize();
  absl::Status s = need(host, "download destination");
  if (s.ok()) s = need(src, "download source");
  if (!s.ok()) return s;
  WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
  return synchronize();
}

absl::Status CudaBackend::graph_begin() {
  if (recording_) return absl::FailedPreconditionError("a graph is being recorded already");
  // relaxed: a kernel's first launch may load its module while recording
  WM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  recording_ = true;
  recording_broken_ = false;
  recorded_attention_.clear();
  t_recording_graph = true;
  return absl::OkStatus();
}

absl::Status CudaBackend::graph_end(bool keep) {
  if (!recording_) return absl::FailedPreconditionError("no graph is being recorded");
  recording_ = false;
  t_recording_graph = false;
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &g);
  for (void* p : std::exchange(frees_after_recording_, {})) free(p);
  const auto failed = [&](absl::string_view why) {
    if (g != nullptr) cudaGraphDestroy(g);
    // graph_launch runs the last recording that succeeded in this pass's
    // place, and there is none now (an older one may read buffers since grown)
    graph_exec_ = nullptr;
    cudaGetLastError();  // not sticky: the ops run again without a graph
    ++graph_recordings_failed_;
    return absl::FailedPreconditionError(absl::StrCat("recording a graph failed (", why, "): nothing ran"));
  };
  if (e != cudaSuccess) return failed(cudaGetErrorName(e));
  if (!keep) return failed("the caller's pass failed");
  if (recording_broken_ || g == nullptr) return failed("an op could not be recorded");
  // one executable graph per shape of work (each attention call's rows,
  // split or not and tile, and the tuning):
  // a batch of that shape again updates its parameters in place, which is
  // cheaper than instantiating; the least recently used of kGraphSlots goes
  const GraphKey key{std::move(recorded_attention_), tuning_generation_};
  recorded_attention_.clear();
  auto slot = std::find_if(graph_slots_.begin(), graph_slots_.end(), [&](const GraphSlot& x) { return x.key == key; });
  if (slot != graph_slots_.end()) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(slot->exec, g, &info) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(slot->exec);
      graph_slots_.erase(slot);
      slot = graph_slots_.end();
    }
  }
  if (slot == graph_slots_.end()) {
    if (graph_slots_.size() >= kGraphSlots) {
      auto lru = std::min_element(graph_slots_.begin(), graph_slots_.end(),
                                  [](const GraphSlot& a, const GraphSlot& b) { return a.used < b.used; });
      cudaGraphExecDestroy(lru->exec);
      graph_slots_.erase(lru);
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ie = cudaGraphInstantiate(&exec, g, 0);
    if (ie != cudaSuccess) return failed(cudaGetErrorName(ie));
    graph_slots_.push_back({key, exec, 0});
    slot = graph_slots_.end() - 1;
    ++graphs_instantiated_;
  }
  slot->used = ++graph_clock_;
  graph_exec_ = slot->exec;
  cudaGraphDestroy(g);
  ++graphs_recorded_;
  return graph_launch();
}

absl::Status CudaBackend::graph_launch() {
  if (recording_) return absl::FailedPreconditionError("a graph cannot run while one is recorded");
  if (graph_exec_ == nullptr) return absl::FailedPreconditionError("no graph recorded");
  WM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph_exec_, stream_));
  ++graph_launches_;
  return absl::OkStatus();
}

absl::Status CudaBackend::synchronize() {
  if (recording_) return absl::FailedPreconditionError("a synchronization while a graph is recorded");
  // (timed only inside span appends: kv.span_append_wait_us)
  const auto t0 = in_span_append_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (in_span_append_) span_append_wait_ns_ += nanoseconds_since(t0);
  WM_CUDA_RETURN_IF_ERROR(e);
  WM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status CudaBackend::timer_start() {
  if (recording_) return absl::FailedPreconditionError("a timer while a graph is recorded");
  WM_CUDA_RETURN_IF_ERROR(cudaEventRecord(timer_begin_, stream_));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaBackend::timer_stop() {
  if (recording_) return absl::FailedPreconditionError("a timer while a graph is recorded");
  WM_CUDA_RETURN_IF_ERROR(cudaEventRecord(timer_end_, stream_));
  WM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(timer_end_));
  float ms = 0;
  WM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, timer_begin_, timer_end_));
  return static_cast<double>(ms);
}

absl::StatusOr<const DeviceWeight*> CudaBackend::upload_weight(const float* host, int32_t out, int32_t in) {
  if (out <= 0 || in <= 0) return absl::InvalidArgumentError("weight with an empty shape");
  absl::Status s = need(host, "weight");
  if (!s.ok()) return s;
  auto w = std::make_unique<DeviceWeight>();
  w->out = out;
  w->in = in;
  w->ld = round_up8(in);
  const size_t bytes = static_cast<size_t>(out) * w->ld * sizeof(uint16_t);
  auto p = alloc(bytes);
  if (!p.ok()) return p.status();
  w->data = static_cast<uint16_t*>(*p);
  const size_t host_bytes = static_cast<size_t>(out) * in * sizeof(float);
  s = weight_staging_.reserve(host_bytes);
  if (s.ok()) s = WM_CUDA_STATUS(cudaMemcpyAsync(weight_staging_.get(), host, host_bytes, cudaMemcpyHostToDevice, stream_));
  if (s.ok()) s = WM_CUDA_STATUS(launch_f32_to_bf16(weight_staging_.as<float>(), out, in, w->ld, w->data, stream_));
  if (!s.ok()) {
    cudaFree(w->data);
    return s;
  }
  weights_.push_back(std::move(w));
  return weights_.back().get();
}

absl::Status CudaBackend::linear(const DeviceWeight* w, const float* bias, int32_t out, int32_t in, const float* x,
                                 int32_t n, float* y) {
  absl::Status s = need(w, "weight");
  if (!s.ok()) return s;
  if (w->out != out || w->in != in)
    return absl::InvalidArgumentError(absl::StrCat("linear: weight is ", w->out, "x", w->in, ", call says ", out, "x", in));
  if (n < 0) return absl::InvalidArgumentError("linear: negative rows");
  if (n == 0) return absl::OkStatus();
  s = need(x, "linear input");
  if (s.ok()) s = need(y, "linear output");
  if (!s.ok()) return s;
  const int32_t ld = w->ld;
  auto xb = bf16_operand(x, n, in, ld);
  if (!xb.ok()) return xb.status();
  s = gemm_->run(w->data, ld, *xb, ld, bias, n, in, out, y);
  if (!s.ok()) return s;
  if (overlaps(y, static_cast<size_t>(n) * out * sizeof(float), x, static_cast<size_t>(n) * in * sizeof(float)))
    invalidate_shadow();
  return absl::OkStatus();
}

absl::StatusOr<const uint16_t*> CudaBackend::bf16_operand(const float* x, int32_t n, int32_t in, int32_t ld) {
  if (use_shadow_ && shadow_.valid && shadow_.src == x) {
    const bool rows_match = shadow_.ld == ld && shadow_.rows == n && shadow_.cols == in;
    const bool flat_match = shadow_.ld == 0 && in == ld && shadow_.cols == static_cast<int64_t>(n) * in;
    if (rows_match || flat_match) return shadow_memory_.as<uint16_t>();
  }
  invalidate_shadow();
  absl::Status s = reserve_rows(shadow_memory_, shadow_row_bytes_, n, static_cast<size_t>(ld) * sizeof(uint16_t));
  if (!s.ok()) return s;
  WM_CUDA_RETURN_IF_ERROR(launch_f32_to_bf16(x, n, in, ld, shadow_memory_.as<uint16_t>(), stream_));
  ++operand_conversions_;
  // the next linear on the same input (q, k, v of one LN output) reuses it
  shadow_ = Shadow{use_shadow_, x, n, in, ld};
  return shadow_memory_.as<uint16_t>();
}

absl::Status CudaBackend::ffn(const DeviceWeight* w0, const float* b0, const DeviceWeight* w2, const float* b2,
                              int32_t in, int32_t hidden_dim, int32_t out, const float* x, int32_t n, float* hidden,
                              float* y) {
  absl::Status s = need(w0, "ffn first weight");
  if (s.ok()) s = need(w2, "ffn second weight");
  if (!s.ok()) return s;
  if (w0->out != hidden_dim || w0->in != in || w2->out != out || w2->in != hidden_dim)
    return absl::InvalidArgumentError(absl::StrCat("ffn: weights are ", w0->out, "x", w0->in, " and ", w2->out, "x",
                                                   w2->in, ", call says ", hidden_dim, "x", in, " and ", out, "x",
                                                   hidden_dim));
  if (n < 0) return absl::InvalidArgumentError("ffn: negative rows");
  if (n == 0) return absl::OkStatus();
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(hidden), static_cast<const void*>(y)}) {
    s = need(p, "ffn argument");
    if (!s.ok()) return s;
  }
  if (fused_ffn_) {
    // the hidden layer never exists in fp32: bf16(GELU(x W0^T + b0)) straight
    // from the first GEMM's epilogue is the second GEMM's operand (the bytes
    // the unfused path's GELU writes as its bf16 copy)
    auto xb = bf16_operand(x, n, in, w0->ld);
    if (!xb.ok()) return xb.status();
    const int32_t ld_h = w2->ld;
    s = reserve_rows(ffn_hidden_, ffn_hidden_row_bytes_, n, static_cast<size_t>(ld_h) * sizeof(uint16_t));
    if (!s.ok()) return s;
    auto fused = gemm_->run_gelu_bf16(w0->data, w0->ld, *xb, w0->ld, b0, n, in, hidden_dim,
                                      ffn_hidden_.as<uint16_t>(), ld_h);
    if (!fused.ok()) return fused.status();
    if (*fused) {
      ++ffn_fused_calls_;
      s = gemm_->run(w2->data, ld_h, ffn_hidden_.as<uint16_t>(), ld_h, b2, n, hidden_dim, out, y);
      if (!s.ok()) return s;
      if (overlaps(y, static_cast<size_t>(n) * out * sizeof(float), x, static_cast<size_t>(n) * in * sizeof(float)))
        invalidate_shadow();
      return absl::OkStatus();
    }
  }
  // unfused: the engine's default sequence (GELU's bf16 copy is the widest
  // operand then: prepare_recording sizes the copies by it too)
  shadow_row_bytes_ = std::max(shadow_row_bytes_, static_cast<size_t>(hidden_dim) * sizeof(uint16_t));
  s = linear(w0, b0, hidden_dim, in, x, n, hidden);
  if (s.ok()) s = gelu(hidden, static_cast<int64_t>(n) * hidden_dim);
  if (s.ok()) s = linear(w2, b2, out, hidden_dim, hidden, n, y);
  return s;
}

absl::Status CudaBackend::layer_norm_modulate(const float* x, int32_t n, int32_t d, const float* shift,
                                              const float* scale, int32_t mod_stride, int32_t tokens_per_frame,
                                              float eps, float* y) {
  // without a residual the kernel only reads x
  return norm_modulate(const_cast<float*>(x), nullptr, nullptr, 0, n, d, tokens_per_frame, shift, scale, mod_stride,
                       eps, y);
}

absl::Status CudaBackend::add_rows(const float* rows, const float* per_block, int32_t n_rows, int32_t blocks,
                                   int32_t width, float* out) {
  if (n_rows < 0 || blocks < 0 || width < 0) return absl::InvalidArgumentError("add_rows: bad shape");
  if (n_rows == 0 || blocks == 0 || width == 0) return absl::OkStatus();
  if (blocks > 65535) return absl::InvalidArgumentError("add_rows: more than 65535 blocks");
  for (const void* p : {static_cast<const void*>(rows), static_cast<const void*>(per_block),
                        static_cast<const void*>(out)}) {
    absl::Status s = need(p, "add_rows argument");
    if (!s.ok()) return s;
  }
  WM_CUDA_RETURN_IF_ERROR(launch_add_rows(rows, per_block, n_rows, blocks, width, out, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::noise_frames(const uint64_t* seeds, const int64_t* frames, int32_t count,
                                       int64_t values_per_frame, float* out) {
  if (count < 0 || values_per_frame < 0) return absl::InvalidArgumentError("noise_frames: bad shape");
  if (count == 0 || values_per_frame == 0) return absl::OkStatus();
  if (count > 65535) return absl::InvalidArgumentError("noise_frames: more than 65535 frames in one call");
  absl::Status s = need(out, "noise_frames output");
  if (!s.ok()) return s;
  // one upload: the seeds, then the frame indices
  std::vector<uint64_t> host(2 * static_cast<size_t>(count));
  std::copy(seeds, seeds + count, host.begin());
  for (int32_t i = 0; i < count; ++i) host[static_cast<size_t>(count + i)] = static_cast<uint64_t>(frames[i]);
  s = noise_scratch_.reserve(host.size() * sizeof(uint64_t));
  if (s.ok()) s = copy_to_device(noise_scratch_.get(), host.data(), host.size() * sizeof(uint64_t));
  if (!s.ok()) return s;
  const uint64_t* d = noise_scratch_.as<uint64_t>();
  WM_CUDA_RETURN_IF_ERROR(
      launch_noise_frames(d, reinterpret_cast<const int64_t*>(d + count), count, values_per_frame, out, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::gated_residual_norm(float* h, const float* y, const float* gate, int32_t gate_stride,
                                              int32_t n, int32_t d, int32_t tokens_per_frame, const float* shift,
                                              const float* scale, int32_t mod_stride, float eps, float* u) {
  if (n > 0) {
    absl::Status s = need(y, "gated_residual_norm argument");
    if (s.ok()) s = need(gate, "gated_residual_norm argument");
    if (!s.ok()) return s;
    if (u == h || y == h) return absl::InvalidArgumentError("gated_residual_norm: h aliases y or the output");
  }
  return norm_modulate(h, y, gate, gate_stride, n, d, tokens_per_frame, shift, scale, mod_stride, eps, u);
}

absl::Status CudaBackend::norm_modulate(float* x, const float* ry, const float* gate, int32_t gate_stride, int32_t n,
                                        int32_t d, int32_t tokens_per_frame, const float* shift, const float* scale,
                                        int32_t mod_stride, float eps, float* y) {
  if (n < 0 || d <= 0 || tokens_per_frame <= 0) return absl::InvalidArgumentError("layer_norm_modulate: bad shape");
  if (n == 0) return absl::OkStatus();
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(shift), static_cast<const void*>(scale),
                        static_cast<const void*>(y)}) {
    absl::Status s = need(p, "layer_norm_modulate argument");
    if (!s.ok()) return s;
  }
  uint16_t* shadow = nullptr;
  const int32_t ld = round_up8(d);
  if (use_shadow_) {
    absl::Status s = reserve_rows(shadow_memory_, shadow_row_bytes_, n, static_cast<size_t>(ld) * sizeof(uint16_t));
    if (!s.ok()) return s;
    shadow = shadow_memory_.as<uint16_t>();
  }
  if (ry == nullptr) {
    WM_CUDA_RETURN_IF_ERROR(launch_layer_norm_modulate(x, n, d, shift, scale, mod_stride, tokens_per_frame, eps, y,
                                                       shadow, ld, stream_));
  } else {
    WM_CUDA_RETURN_IF_ERROR(launch_gated_residual_norm(x, ry, gate, gate_stride, n, d, shift, scale, mod_stride,
                                                       tokens_per_frame, eps, y, shadow, ld, stream_));
  }
  if (shadow != nullptr) shadow_ = Shadow{true, y, n, d, ld};
  return absl::OkStatus();
}

absl::StatusOr<const RopeFreqTable*> CudaBackend::rope_table(const WmRopeParams& rope, int32_t head_dim) {
  const auto key = std::make_tuple(std::bit_cast<uint32_t>(rope.theta), rope.t_pairs, rope.h_pairs, rope.w_pairs,
                                   head_dim);
  auto it = rope_tables_.find(key);
  if (it != rope_tables_.end()) return it->second.get();
  // the same frequencies as engine/rope.h's RopeTable, computed the same way
  std::vector<RopeFreq> host(static_cast<size_t>(head_dim / 2));
  const int32_t counts[3] = {rope.t_pairs, rope.h_pairs, rope.w_pairs};
  size_t j = 0;
  for (int32_t a = 0; a < 3; ++a)
    for (int32_t i = 0; i < counts[a] && j < host.size(); ++i, ++j) {
      host[j].freq = std::pow(static_cast<double>(rope.theta), -static_cast<double>(i) / counts[a]);
      host[j].axis = a;
    }
  auto t = std::make_unique<RopeFreqTable>();
  absl::Status s = t->freqs.reserve(std::max<size_t>(16, host.size() * sizeof(RopeFreq)));
  if (!s.ok()) return s;
  if (!host.empty()) {
    s = copy_to_device(t->freqs.get(), host.data(), host.size() * sizeof(RopeFreq));
    if (!s.ok()) return s;
  }
  return rope_tables_.emplace(key, std::move(t)).first->second.get();
}

absl::Status CudaBackend::rms_norm_rope(float* x, int32_t n, int32_t heads, int32_t head_dim, int32_t row_stride,
                                        const float* norm_w, const int32_t* pos, const WmRopeParams& rope, float eps) {
  return rms_norm_rope_qk(x, norm_w, nullptr, nullptr, n, heads, head_dim, row_stride, pos, rope, eps);
}

absl::Status CudaBackend::rms_norm_rope_qk(float* q, const float* q_norm, float* k, const float* k_norm, int32_t n,
                                           int32_t heads, int32_t head_dim, int32_t row_stride, const int32_t* pos,
                                           const WmRopeParams& rope, float eps) {
  if (n < 0 || heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 || row_stride < heads * head_dim)
    return absl::InvalidArgumentError("rms_norm_rope: bad shape");
  if (n == 0) return absl::OkStatus();
  for (const void* p : {static_cast<const void*>(q), static_cast<const void*>(q_norm), static_cast<const void*>(pos)}) {
    absl::Status s = need(p, "rms_norm_rope argument");
    if (!s.ok()) return s;
  }
  if (k != nullptr) {
    absl::Status s = need(k, "rms_norm_rope argument");
    if (s.ok()) s = need(k_norm, "rms_norm_rope argument");
    if (!s.ok()) return s;
    if (k == q) return absl::InvalidArgumentError("rms_norm_rope: q and k are one tensor");
  }
  auto table = rope_table(rope, head_dim);
  if (!table.ok()) return table.status();
  // q and k for the attention call that follows, fp16 in its layout, written
  // with the rotated values: that call then reads and converts v alone
  // (rows of q, k, v back to back, as the attention reads them)
  uint16_t *q16 = nullptr, *k16 = nullptr;
  const size_t one = static_cast<size_t>(heads) * n * head_dim;
  if (fused_inputs_ && k != nullptr && row_stride == heads * head_dim && head_dim % 8 == 0) {
    const size_t bytes = 3 * one * sizeof(uint16_t);
    bool fits = bytes <= qkv16_.size();
    if (!fits && !recording_) {  // (growing it while a graph is recorded would fail the recording)
      fits = qkv16_.reserve(bytes).ok();
      graph_exec_ = nullptr;  // a kept graph reads the buffer it was recorded with
    }
    if (fits) {
      q16 = qkv16_.as<uint16_t>();
      k16 = q16 + one;
    }
  }
  WM_CUDA_RETURN_IF_ERROR(launch_rms_norm_rope(q, q_norm, k, k_norm, n, heads, head_dim, row_stride, pos,
                                               (*table)->freqs.as<RopeFreq>(), eps, stream_, q16, k16));
  if (q16 != nullptr) half_inputs_ = HalfInputs{true, q, k, qkv16_.get(), qkv16_.size(), n, heads, head_dim};
  return absl::OkStatus();
}

absl::Status CudaBackend::gelu(float* x, int64_t count) {
  if (count < 0) return absl::InvalidArgumentError("gelu: negative count");
  if (count == 0) return absl::OkStatus();
  absl::Status s = need(x, "gelu input");
  if (!s.ok()) return s;
  uint16_t* shadow = nullptr;
  if (use_shadow_) {
    s = shadow_memory_.reserve(static_cast<size_t>(count) * sizeof(uint16_t));
    if (!s.ok()) return s;
    shadow = shadow_memory_.as<uint16_t>();
  }
  WM_CUDA_RETURN_IF_ERROR(launch_gelu(x, count, shadow, stream_));
  if (shadow != nullptr) shadow_ = Shadow{true, x, 1, count, 0};
  return absl::OkStatus();
}

absl::Status CudaBackend::gated_residual(float* h, const float* y, const float* gate, int32_t mod_stride, int32_t n,
                                         int32_t d, int32_t tokens_per_frame) {
  if (n < 0 || d <= 0 || tokens_per_frame <= 0) return absl::InvalidArgumentError("gated_residual: bad shape");
  if (n == 0) return absl::OkStatus();
  for (const void* p : {static_cast<const void*>(h), static_cast<const void*>(y), static_cast<const void*>(gate)}) {
    absl::Status s = need(p, "gated_residual argument");
    if (!s.ok()) return s;
  }
  WM_CUDA_RETURN_IF_ERROR(launch_gated_residual(h, y, gate, mod_stride, n, d, tokens_per_frame, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::patchify(const float* frames, int32_t frames_count, const WmFrameShape& shape,
                                   float* tokens) {
  absl::Status s = check_frame_shape(shape);
  if (!s.ok() || frames_count <= 0) return s;
  if (s = need(frames, "patchify input"); s.ok()) s = need(tokens, "patchify output");
  if (!s.ok()) return s;
  WM_CUDA_RETURN_IF_ERROR(launch_patchify(frames, frames_count, frame_geom(shape), tokens, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::unpatchify(const float* tokens, int32_t frames_count, const WmFrameShape& shape,
                                     float* frames) {
  absl::Status s = check_frame_shape(shape);
  if (!s.ok() || frames_count <= 0) return s;
  if (s = need(frames, "unpatchify output"); s.ok()) s = need(tokens, "unpatchify input");
  if (!s.ok()) return s;
  WM_CUDA_RETURN_IF_ERROR(launch_unpatchify(tokens, frames_count, frame_geom(shape), frames, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::euler_step(float* x, const float* v, const float* dt_per_frame, int32_t frames_count,
                                     int64_t values_per_frame, bool clamp) {
  if (frames_count < 0 || values_per_frame < 0) return absl::InvalidArgumentError("euler_step: bad shape");
  if (frames_count == 0 || values_per_frame == 0) return absl::OkStatus();
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(v),
                        static_cast<const void*>(dt_per_frame)}) {
    absl::Status s = need(p, "euler_step argument");
    if (!s.ok()) return s;
  }
  WM_CUDA_RETURN_IF_ERROR(launch_euler_step(x, v, dt_per_frame, frames_count, values_per_frame, clamp, stream_));
  return absl::OkStatus();
}

// ---- KV caches ------------------------------------------------------------

absl::StatusOr<PagedGeometry> CudaBackend::paged_geometry(absl::string_view format, const WmKvGeometry& g) const {
  PagedGeometry p;
  p.layers = g.layers;
  p.heads = g.heads;
  p.head_dim = g.head_dim;
  p.tokens_per_frame = g.tokens_per_frame;
  p.window_frames = g.window_frames;
  p.sink_frames = g.sink_frames;
  const int32_t fp16_page_tokens = g.head_dim > 0 ? static_cast<int32_t>(page_bytes_ / (4 * g.head_dim)) : 0;
  if (format == "fp16") {
    p.page_tokens = fp16_page_tokens;
  } else if (format == "kivi2") {
    // the CPU's KIVI-2 (quant/kv_kivi.cc) when every frame ends on a chunk
    // boundary with its fp16 buffer empty: a frame is then T / G whole chunks
    // and leaves the window with its slot
    const int32_t G = g.kivi_group, R = g.kivi_residual;
    if (G != 32 && G != 64 && G != 128)
      return absl::InvalidArgumentError(absl::StrCat("kivi2: group ", G, " is not 32, 64 or 128"));
    if (g.head_dim <= 0 || g.head_dim % G != 0)
      return absl::InvalidArgumentError(absl::StrCat("kivi2: group ", G, " does not divide head_dim ", g.head_dim));
    if (R <= 0 || R % G != 0)
      return absl::InvalidArgumentError(absl::StrCat("kivi2: residual ", R, " is not a multiple of the group ", G));
    if (g.tokens_per_frame <= 0 || g.tokens_per_frame % R != 0)
      return absl::UnimplementedError(absl::StrCat(
          "kivi2 on the GPU needs the tokens of a frame (", g.tokens_per_frame, ") to be a multiple of the residual (",
          R, "), so that no frame leaves tokens in the fp16 buffer; the CPU backend serves this geometry"));
    const int32_t front = g.sink_frames * g.tokens_per_frame;
    p.kivi = kivi_row_layout(page_bytes_, g.head_dim, G, front);
    if (p.kivi.group == 0)
      return absl::InvalidArgumentError(absl::StrCat("kivi2: a page of ", page_bytes_, " bytes holds no unit of keys"));
    if (front % p.kivi.unit_tokens != 0)
      return absl::UnimplementedError(absl::StrCat("kivi2 on the GPU needs the sink frames' tokens (", front,
                                                   ") to be a multiple of ", p.kivi.unit_tokens,
                                                   "; the CPU backend serves this geometry"));
    p.page_tokens = p.kivi.q_per_page * p.kivi.unit_tokens;
  } else if (format == "qvg2" || format == "quantwm2") {
    // the CPU's span formats (quant/kv_span.cc) where each append is a span
    // and the sinks stay fp16: per-token codes in the frame slots, each
    // slot with its span's centroids (kv_layout.h: SpanRowLayout)
    const bool quantwm = format == "quantwm2";
    if (!span_ready_) return absl::UnimplementedError(absl::StrCat(format, ": the span kernels did not load on this device"));
    const KvGeometry hg = kv_geometry_of(g);
    const KvFormatOptions o = kv_format_options_of(g);
    if (absl::Status s = device_span_support(hg, o, quantwm); !s.ok()) return s;
    const SpanPlan plan = span_plan(hg, o, quantwm);
    const int32_t front = g.sink_frames * g.tokens_per_frame;
    if (front % kTileKeys != 0)
      return absl::UnimplementedError(absl::StrCat(format, " on the GPU needs the sink frames' tokens (", front,
                                                   ") to be a multiple of ", kTileKeys,
                                                   "; the CPU backend serves this geometry"));
    // an append codes at most a block: its centroids fill each slot's table
    const int32_t max_k = plan.centroids_for(static_cast<int64_t>(std::max(1, g.frames_per_block)) * g.tokens_per_frame);
    // a table per span the window can hold at once: whole blocks, one of them
    // partly evicted, and a prompt's shorter last chunk (the engine's appends)
    const int32_t fpb = std::max(1, g.frames_per_block);
    const int32_t n_tables = std::min(g.window_frames, (g.window_frames + fpb - 1) / fpb + 2);
    p.span = span_row_layout(page_bytes_, g.head_dim, plan.block, plan.psac ? span_coeff_bytes(plan.coeff_bits) : 0,
                             max_k, g.tokens_per_frame, g.sink_frames, g.window_frames, n_tables);
    if (p.span.block == 0)
      return absl::InvalidArgumentError(absl::StrCat(format, ": a page of ", page_bytes_, " bytes cannot hold a slot's ",
                                                     max_k, " centroids (", 4 * max_k * g.head_dim,
                                                     " bytes); use larger pages or fewer centroids"));
    p.page_tokens = kTileKeys;
    // QuantWM-2's running query statistics, every layer and head (query_gram.cuh)
    if (quantwm && (o.qsac || plan.psac))
      p.stats_pages = static_cast<int32_t>(query_gram_pages(g.layers, g.heads, g.head_dim, page_bytes_));
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "cache format '", format, "' has no CUDA kernels yet; the CUDA backend serves 'fp16', 'kivi2', 'qvg2' and 'quantwm2'"));
  }
  absl::Status s = validate_paged_geometry(p);
  if (!s.ok()) return s;
  return p;
}

absl::StatusOr<int64_t> CudaBackend::kv_reservation_bytes(absl::string_view format, const WmKvGeometry& g) const {
  auto pg = paged_geometry(format, g);
  if (!pg.ok()) return pg.status();
  return pg->reservation_pages() * page_bytes_;
}

absl::StatusOr<std::unique_ptr<DeviceKvCache>> CudaBackend::kv_create(absl::string_view format,
                                                                      const WmKvGeometry& g) {
  auto pg = paged_geometry(format, g);
  if (!pg.ok()) return pg.status();
  auto owner = pool_.open(pg->reservation_pages());
  if (!owner.ok()) return owner.status();
  auto kv = std::make_unique<DeviceKvCache>(next_cache_id_++, std::string(format), g, *pg, *owner);
  if (pg->span.block > 0)
    kv->span = std::make_unique<SpanHostCoder>(kv_geometry_of(g), kv_format_options_of(g), format == "quantwm2");
  // the query statistics' pages, from zero: taken now, for the session's life
  absl::Status st = recording_ && pg->stats_pages > 0
                        ? absl::FailedPreconditionError("a cache cannot be made while a graph is recorded")
                        : absl::OkStatus();
  for (int32_t i = 0; st.ok() && i < pg->stats_pages; ++i) {
    auto page = pool_.take(kv->owner);
    if (!page.ok()) {
      st = page.status();
      break;
    }
    kv->stats_pages.push_back(*page);
    st = WM_CUDA_STATUS(cudaMemsetAsync(pool_memory_.as<uint8_t>() + static_cast<int64_t>(*page) * page_bytes_, 0,
                                        static_cast<size_t>(page_bytes_), stream_));
  }
  if (!st.ok()) {
    pool_.close(kv->owner);
    return st;
  }
  return kv;
}

void CudaBackend::kv_destroy(std::unique_ptr<DeviceKvCache> kv) {
  // queued kernels that still read these pages run before any later writer
  // (one stream), so the pages can be handed out again at once
  if (kv != nullptr) pool_.close(kv->owner);
}

absl::Status CudaBackend::kv_append(DeviceKvCache& kv, int32_t layer, const float* k, const float* v,
                                    int64_t first_frame, int32_t frames) {
  const KvWriteRequest w{&kv, first_frame, 0, frames};
  return kv_append(layer, std::span<const KvWriteRequest>(&w, 1), k, v);
}

absl::Status CudaBackend::kv_append(int32_t layer, std::span<const KvWriteRequest> writes, const float* k,
                                    const float* v) {
  if (writes.empty()) return absl::OkStatus();
  const size_t n = writes.size();
  for (size_t i = 0; i < n; ++i) {
    const KvWriteRequest& w = writes[i];
    if (w.kv == nullptr) return absl::InvalidArgumentError("kv append: null cache");
    if (w.batch_frame < 0) return absl::InvalidArgumentError("kv append: negative batch frame");
    const PagedGeometry &a = writes[0].kv->pages.geometry(), &b = w.kv->pages.geometry();
    if (!a.same_layout(b))
      return absl::InvalidArgumentError("kv append: the caches of one batch differ in geometry or format");
    for (size_t j = 0; j < i; ++j)
      if (writes[j].kv == w.kv) return absl::InvalidArgumentError("kv append: a cache appears twice in one batch");
  }
  std::vector<KvAppendPlan> plans;
  plans.reserve(n);
  bool any_write = false;
  for (const KvWriteRequest& w : writes) {
    auto plan = w.kv->pages.plan_append(layer, w.first_frame, w.frames);
    if (!plan.ok()) return plan.status();
    any_write = any_write || !plan->slot.empty();
    plans.push_back(*std::move(plan));
  }
  if (any_write) {
    absl::Status s = need(k, "kv append keys");
    if (s.ok()) s = need(v, "kv append values");
    if (!s.ok()) return s;
    if (!aligned16(k) || !aligned16(v)) return absl::InvalidArgumentError("kv append: k, v must be 16-byte aligned");
  }
  const PagedGeometry& g = writes[0].kv->pages.geometry();
  std::vector<std::vector<int32_t>> new_pages(n);
  const auto hand_back = [&] {
    for (size_t i = 0; i < n; ++i) pool_.put_back(writes[i].kv->owner, new_pages[i]).IgnoreError();
  };
  for (size_t i = 0; i < n; ++i) {
    new_pages[i].reserve(static_cast<size_t>(g.heads) * plans[i].new_pages_per_head);
    for (int64_t j = 0; j < static_cast<int64_t>(g.heads) * plans[i].new_pages_per_head; ++j) {
      auto page = pool_.take(writes[i].kv->owner);
      if (!page.ok()) {  // cannot happen: the reservation covers the worst case
        hand_back();
        return page.status();
      }
      new_pages[i].push_back(*page);
    }
  }
  // the pages count only once the device write is under way: a failure hands them back
  const absl::Status launched = [&]() -> absl::Status {
    if (g.span.block > 0) return kv_append_span(layer, writes, plans, new_pages, k, v);
    if (!any_write) return absl::OkStatus();
    // one upload: the frame writes (a KIVI-2 batch's: its sink frames, then
    // its window frames), then each written cache's page table after the
    // append [heads][pph]
    std::vector<KvFrameWrite> frame_writes, window_writes;
    std::vector<int32_t> tables;
    for (size_t i = 0; i < n; ++i) {
      const KvAppendPlan& p = plans[i];
      if (p.slot.empty()) continue;
      const DeviceKvCache& kv = *writes[i].kv;
      const int32_t pph = kv.pages.pages_per_head(layer) + p.new_pages_per_head;
      const int32_t table = static_cast<int32_t>(tables.size());
      for (int32_t h = 0; h < g.heads; ++h) {
        const auto& old = kv.pages.pages(layer, h);
        tables.insert(tables.end(), old.begin(), old.end());
        for (int32_t j = 0; j < p.new_pages_per_head; ++j)
          tables.push_back(new_pages[i][static_cast<size_t>(h) * p.new_pages_per_head + j]);
      }
      for (size_t w = 0; w < p.slot.size(); ++w) {
        const KvFrameWrite fw{writes[i].batch_frame + p.src_frame[w], p.slot[w], table, pph};
        (g.kivi.group > 0 && p.slot[w] >= g.sink_frames ? window_writes : frame_writes).push_back(fw);
      }
    }
    const size_t n_first = frame_writes.size();
    frame_writes.insert(frame_writes.end(), window_writes.begin(), window_writes.end());
    const size_t write_bytes = frame_writes.size() * sizeof(KvFrameWrite);
    std::vector<uint8_t> host(write_bytes + tables.size() * sizeof(int32_t));
    std::memcpy(host.data(), frame_writes.data(), write_bytes);
    std::memcpy(host.data() + write_bytes, tables.data(), tables.size() * sizeof(int32_t));
    absl::Status s = append_scratch_.reserve(host.size());
    if (!s.ok()) return s;
    s = copy_to_device(append_scratch_.get(), host.data(), host.size());
    if (!s.ok()) return s;
    const auto* device_writes = reinterpret_cast<const KvFrameWrite*>(append_scratch_.get());
    const auto* device_tables =
        reinterpret_cast<const int32_t*>(static_cast<const uint8_t*>(append_scratch_.get()) + write_bytes);
    if (g.kivi.group == 0) {
      KvAppendArgs a;
      a.k = k;
      a.v = v;
      a.pool = pool_memory_.as<uint16_t>();
      a.page_elems = page_bytes_ / 2;
      a.page_tokens = g.page_tokens;
      a.head_dim = g.head_dim;
      a.heads = g.heads;
      a.tokens_per_frame = g.tokens_per_frame;
      a.writes = device_writes;
      a.n_writes = static_cast<int32_t>(frame_writes.size());
      a.page_tables = device_tables;
      WM_CUDA_RETURN_IF_ERROR(launch_kv_append(a, stream_));
      ++append_launches_;
      return absl::OkStatus();
    }
    for (const bool sinks : {true, false}) {
      KvKiviAppendArgs a;
      a.k = k;
      a.v = v;
      a.pool = pool_memory_.as<uint8_t>();
      a.page_bytes = page_bytes_;
      a.row = g.kivi;
      a.heads = g.heads;
      a.tokens_per_frame = g.tokens_per_frame;
      a.writes = device_writes + (sinks ? 0 : n_first);
      a.n_writes = static_cast<int32_t>(sinks ? n_first : window_writes.size());
      a.page_tables = device_tables;
      a.sinks = sinks;
      if (a.n_writes == 0) continue;
      WM_CUDA_RETURN_IF_ERROR(launch_kv_append_kivi(a, stream_));
      ++append_launches_;
    }
    return absl::OkStatus();
  }();
  if (!launched.ok()) {
    hand_back();
    return launched;
  }
  for (size_t i = 0; i < n; ++i) writes[i].kv->pages.commit_append(plans[i], new_pages[i]);
  return absl::OkStatus();
}

absl::Status CudaBackend::kv_append_span(int32_t layer, std::span<const KvWriteRequest> writes,
                                         const std::vector<KvAppendPlan>& plans,
                                         const std::vector<std::vector<int32_t>>& new_pages, const float* k,
                                         const float* v) {
  if (recording_)
    return absl::FailedPreconditionError("kv append: span caches are booked on the host, which a graph cannot record");
  // the host's time in here, and (synchronize) its waits for the device
  struct Timed {
    CudaBackend* b;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    explicit Timed(CudaBackend* backend) : b(backend) { b->in_span_append_ = true; }
    ~Timed() {
      b->in_span_append_ = false;
      b->span_append_ns_ += nanoseconds_since(t0);
    }
  } timed(this);
  const PagedGeometry& g = writes[0].kv->pages.geometry();
  const SpanRowLayout& L = g.span;
  const int32_t T = g.tokens_per_frame, H = g.heads, D = g.head_dim, S = g.sink_frames;
  const int32_t coder = span_coder();
  // the auto choice's checked appends: coded on the host as well, and compared
  const bool check = span_coder_tuning_ == 0 && span_choice_.checking();
  // every write checked before any coder's books move
  bool any = false;
  for (const KvWriteRequest& w : writes) {
    if (w.frames <= 0) continue;
    if (w.frames > std::max(1, w.kv->geometry.frames_per_block))
      return absl::InvalidArgumentError(absl::StrCat("kv append: ", w.kv->format, " on the GPU takes at most a block (",
                                                     w.kv->geometry.frames_per_block, " frames) per append, not ",
                                                     w.frames));
    any = true;
  }
  if (!any) return absl::OkStatus();
  absl::Status st = need(k, "kv append keys");
  if (st.ok()) st = need(v, "kv append values");
  if (st.ok()) st = download_statistics(layer, writes);  // where the bookkeeping reads the query statistics
  if (!st.ok()) return st;
  for (const KvWriteRequest& w : writes)
    if (w.frames > 0)
      if (absl::Status c = w.kv->span->append(layer, w.first_frame, w.frames); !c.ok()) return c;
  // the writes, their frames' staging images, and the coder's jobs: one
  // per (span, head, side), reading the batch's K/V where they are
  std::vector<KvSpanWrite> out;
  std::vector<int32_t> tables;
  std::vector<SpanEncodeJob> jobs;
  std::vector<int64_t> frame_images;
  std::vector<float> params;
  std::vector<QsacWeightsJob> weight_jobs;  // the keys' QSAC weights, made on the device into params
  std::vector<int32_t> stats_pages;         // the statistics pages of the sessions they read
  std::vector<std::tuple<SpanHostCoder*, int32_t, bool>> bases;  // (coder, window slot, has a basis)
  int64_t image_bytes = 0, scratch_bytes = 0, round_bytes = 0, given_floats = 0;
  std::vector<int32_t> rounds{0};  // each round's first job
  const int64_t frame_values = static_cast<int64_t>(T) * H * D;
  for (size_t i = 0; i < writes.size(); ++i) {
    const KvWriteRequest& w = writes[i];
    const KvAppendPlan& p = plans[i];
    DeviceKvCache& kv = *w.kv;
    if (w.frames <= 0) continue;
    if (kv.span->live_spans(layer) > L.n_tables)
      return absl::FailedPreconditionError(absl::StrCat(
          "kv append: ", kv.format, " on the GPU holds ", L.n_tables, " spans per layer at once (blocks of ",
          kv.geometry.frames_per_block, " frames); appends this short would need more: the session is broken"));
    if (p.slot.empty()) continue;
    const int32_t pph = kv.pages.pages_per_head(layer) + p.new_pages_per_head;
    const int32_t table = static_cast<int32_t>(tables.size());
    for (int32_t h = 0; h < H; ++h) {
      const auto& old = kv.pages.pages(layer, h);
      tables.insert(tables.end(), old.begin(), old.end());
      for (int32_t j = 0; j < p.new_pages_per_head; ++j)
        tables.push_back(new_pages[i][static_cast<size_t>(h) * p.new_pages_per_head + j]);
    }
    // each stored frame's image (window frames) or source frame (sinks); a
    // span's tables go in the image of its first stored frame only
    std::map<int64_t, int64_t> image_of;  // frame -> its image's offset
    std::map<int64_t, std::pair<int64_t, size_t>> first_of;  // span -> (its first stored frame, that write)
    const size_t first_write = out.size();
    for (size_t f = 0; f < p.slot.size(); ++f) {
      const int64_t frame = w.first_frame + p.src_frame[f];
      KvSpanWrite x;
      x.slot = p.slot[f];
      x.table = table;
      x.pages_per_head = pph;
      x.src_frame = w.batch_frame + p.src_frame[f];
      if (p.slot[f] < S) {
        x.sink = 1;
        out.push_back(x);
        continue;
      }
      const SpanCoding* c = kv.span->span_of(layer, frame);
      if (c == nullptr) return absl::InternalError(absl::StrCat("kv append: frame ", frame, " was not coded"));
      if (c->centroids > L.max_centroids)
        return absl::InternalError("kv append: a span with more centroids than its table holds");
      x.table_index = static_cast<int32_t>(c->index % L.n_tables);
      x.staging = frame;  // its image is placed below, once the spans' first frames are known
      if (auto [it, fresh] = first_of.try_emplace(c->index, frame, out.size()); !fresh && frame < it->second.first)
        it->second = {frame, out.size()};
      bases.emplace_back(kv.span.get(), p.slot[f] - S, c->basis != nullptr);
      out.push_back(x);
      ++span_appends_;
    }
    for (const auto& [span, first] : first_of) out[first.second].tables = 1;
    for (size_t o = first_write; o < out.size(); ++o) {
      if (out[o].sink) continue;
      image_of[out[o].staging] = image_bytes;
      out[o].staging = image_bytes;
      image_bytes += (span_image_bytes(L, H, out[o].tables != 0) + 15) / 16 * 16;
    }
    int64_t pages_at = -1;  // this session's statistics pages in stats_pages
    for (const SpanCoding& c : kv.span->coded(layer)) {
      const int32_t first_image = static_cast<int32_t>(frame_images.size());
      bool stored = false;
      for (int32_t f = 0; f < c.frames; ++f) {
        const auto it = image_of.find(c.first_frame + f);
        frame_images.push_back(it == image_of.end() ? -1 : it->second);
        stored = stored || it != image_of.end();
      }
      if (!stored) continue;
      const int32_t n = c.frames * T;
      const size_t scratch = (span_encode_scratch_bytes(n, D) + 15) / 16 * 16;
      const float* x0 = nullptr;
      for (int32_t h = 0; h < H; ++h)
        for (int32_t side = 0; side < 2; ++side) {
          SpanEncodeJob j;
          x0 = (side == 0 ? k : v) + (w.batch_frame + (c.first_frame - w.first_frame)) * frame_values;
          j.x = x0 + static_cast<int64_t>(h) * D;
          j.n = n;
          j.centroids = c.centroids;
          j.iters = c.iters;
          j.side = side;
          j.head = h;
          j.first_image = first_image;
          j.seed = c.seeds[static_cast<size_t>(h) * 2 + side];
          if (side == 0) {
            j.candidates = c.candidates;
            if (c.qsac) {
              if (pages_at < 0) {
                pages_at = static_cast<int64_t>(stats_pages.size());
                stats_pages.insert(stats_pages.end(), kv.stats_pages.begin(), kv.stats_pages.end());
              }
              j.weights = static_cast<int64_t>(params.size());
              params.resize(params.size() + static_cast<size_t>(D) + 1);  // the weights, then their flag
              weight_jobs.push_back({j.weights, pages_at, (static_cast<int64_t>(layer) * H + h) * query_gram_doubles(D),
                                     kv.span->qsac_weight_floor()});
            }
            if (L.coeff_bytes > 0 && c.basis != nullptr) {
              j.basis = static_cast<int64_t>(params.size());
              for (uint16_t b : (*c.basis)[static_cast<size_t>(h)]) params.push_back(f16_to_f32(b));
            }
          }
          // the coder runs in rounds whose scratch fits the budget (a round has a job at
          // least) and whose jobs fit a grid's second dimension
          if (round_bytes > 0 && (round_bytes + static_cast<int64_t>(scratch) > span_scratch_bytes_ ||
                                  static_cast<int32_t>(jobs.size()) - rounds.back() >= 65535)) {
            rounds.push_back(static_cast<int32_t>(jobs.size()));
            round_bytes = 0;
          }
          j.scratch = round_bytes;
          round_bytes += static_cast<int64_t>(scratch);
          scratch_bytes = std::max(scratch_bytes, round_bytes);
          if (coder == kSpanCoderHostKmeans) {  // room for the host's centroids (as job_centroids clamps k)
            j.given = given_floats;
            given_floats += static_cast<int64_t>(std::max(1, std::min({c.centroids, kSpanMaxCentroids, n}))) * D;
          }
          jobs.push_back(j);
        }
    }
  }
  if (out.empty()) return absl::OkStatus();
  // one upload (the writes, the page tables, the jobs, the frames' images,
  // the bases and room for the weights, the weights' jobs and the pages
  // they read), then the images (zeroed) and the coder's scratch
  auto at16 = [](size_t x) { return (x + 15) / 16 * 16; };
  const size_t tables_at = out.size() * sizeof(KvSpanWrite);
  const size_t jobs_at = at16(tables_at + tables.size() * sizeof(int32_t));
  const size_t images_at = at16(jobs_at + jobs.size() * sizeof(SpanEncodeJob));
  const size_t params_at = at16(images_at + frame_images.size() * sizeof(int64_t));
  const size_t weight_jobs_at = at16(params_at + params.size() * sizeof(float));
  const size_t stats_pages_at = at16(weight_jobs_at + weight_jobs.size() * sizeof(QsacWeightsJob));
  const size_t upload = at16(stats_pages_at + stats_pages.size() * sizeof(int32_t));
  const size_t staging_at = upload, scratch_at = at16(staging_at + static_cast<size_t>(image_bytes));
  const size_t given_at = at16(scratch_at + static_cast<size_t>(scratch_bytes));
  std::vector<uint8_t>& host = span_upload_;
  host.assign(upload, 0);
  std::memcpy(host.data(), out.data(), tables_at);
  std::memcpy(host.data() + tables_at, tables.data(), tables.size() * sizeof(int32_t));
  if (!jobs.empty()) std::memcpy(host.data() + jobs_at, jobs.data(), jobs.size() * sizeof(SpanEncodeJob));
  if (!frame_images.empty())
    std::memcpy(host.data() + images_at, frame_images.data(), frame_images.size() * sizeof(int64_t));
  if (!params.empty()) std::memcpy(host.data() + params_at, params.data(), params.size() * sizeof(float));
  if (!weight_jobs.empty()) {
    std::memcpy(host.data() + weight_jobs_at, weight_jobs.data(), weight_jobs.size() * sizeof(QsacWeightsJob));
    std::memcpy(host.data() + stats_pages_at, stats_pages.data(), stats_pages.size() * sizeof(int32_t));
  }
  st = append_scratch_.reserve(given_at + static_cast<size_t>(given_floats) * sizeof(float));
  if (!st.ok()) return st;
  auto* dev = append_scratch_.as<uint8_t>();
  st = copy_to_device(dev, host.data(), host.size());
  if (!st.ok()) return st;
  if (image_bytes > 0 && coder != kSpanCoderHost)
    WM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dev + staging_at, 0, static_cast<size_t>(image_bytes), stream_));
  if (!weight_jobs.empty()) {  // after the write pass's queries were added to the sums, before the coder reads them
    QsacWeightsArgs wa;
    wa.jobs = reinterpret_cast<const QsacWeightsJob*>(dev + weight_jobs_at);
    wa.n_jobs = static_cast<int32_t>(weight_jobs.size());
    wa.head_dim = D;
    wa.pages = reinterpret_cast<const int32_t*>(dev + stats_pages_at);
    wa.pool = pool_memory_.as<uint8_t>();
    wa.page_bytes = page_bytes_;
    wa.out = reinterpret_cast<float*>(dev + params_at);
    WM_CUDA_RETURN_IF_ERROR(launch_qsac_weights(wa, stream_));
    ++qsac_weight_launches_;
  }
  const int32_t coeff_bits = writes[0].kv->span->plan().coeff_bits;
  if (coder != kSpanCoderDevice) {
    // the coder on the host: the batch's rows and the QSAC weights come
    // down, the CPU's coder runs every job, and what it made goes up: the
    // centroids (the device codes the tokens against them) or the image
    if (!weight_jobs.empty())
      WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(params.data(), dev + params_at, params.size() * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
    std::vector<float> given(static_cast<size_t>(given_floats));
    std::vector<uint8_t> image(coder == kSpanCoderHost ? static_cast<size_t>(image_bytes) : 0, 0);
    st = code_spans_on_host(L, H, coeff_bits, jobs, frame_images, params, given.data(), image.data());
    if (!st.ok()) return st;
    span_jobs_host_coded_ += static_cast<int64_t>(jobs.size());
    st = copy_to_device(dev + given_at, given.data(), given.size() * sizeof(float));
    if (st.ok()) st = copy_to_device(dev + staging_at, image.data(), image.size());
    if (!st.ok()) return st;
  }
  rounds.push_back(static_cast<int32_t>(jobs.size()));
  for (size_t r = 0; r + 1 < rounds.size() && coder != kSpanCoderHost; ++r) {
    if (rounds[r + 1] == rounds[r]) continue;
    SpanEncodeArgs e;
    e.jobs = reinterpret_cast<const SpanEncodeJob*>(dev + jobs_at) + rounds[r];
    e.host_jobs = jobs.data() + rounds[r];
    e.n_jobs = rounds[r + 1] - rounds[r];
    e.frame_images = reinterpret_cast<const int64_t*>(dev + images_at);
    e.params = reinterpret_cast<const float*>(dev + params_at);
    e.given = given_floats > 0 ? reinterpret_cast<const float*>(dev + given_at) : nullptr;
    e.image = dev + staging_at;
    e.scratch = dev + scratch_at;
    e.row_stride = H * D;
    e.head_dim = D;
    e.block = L.block;
    e.coeff_bits = coeff_bits;
    e.tokens_per_frame = T;
    e.heads = H;
    e.token_bytes = span_token_bytes(L);
    e.rec_bytes = L.rec_bytes;
    e.tables_at = span_tables_at(L, H);
    e.table_bytes = L.table_bytes();
    e.v_table = L.v_table();
    e.basis_table = L.basis_table();
    e.threads = span_threads_;
    WM_CUDA_RETURN_IF_ERROR(launch_span_encode(e, stream_));
    ++span_encode_launches_;
  }
  if (check && image_bytes > 0 && !jobs.empty()) {
    if (coder == kSpanCoderDevice && !weight_jobs.empty())  // the weights the device made, for the host's coder
      WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(params.data(), dev + params_at, params.size() * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
    st = check_span_image(L, H, coeff_bits, jobs, frame_images, params, dev + staging_at, image_bytes);
    if (!st.ok()) return st;
  }
  KvSpanAppendArgs a;
  a.k = k;
  a.v = v;
  a.pool = pool_memory_.as<uint8_t>();
  a.page_bytes = page_bytes_;
  a.row = L;
  a.heads = H;
  a.writes = reinterpret_cast<const KvSpanWrite*>(dev);
  a.n_writes = static_cast<int32_t>(out.size());
  a.page_tables = reinterpret_cast<const int32_t*>(dev + tables_at);
  a.staging = dev + staging_at;
  WM_CUDA_RETURN_IF_ERROR(launch_kv_append_span(a, stream_));
  ++append_launches_;
  for (const auto& [coder, slot, has] : bases) coder->set_slot_has_basis(layer, slot, has);
  return absl::OkStatus();
}

absl::Status CudaBackend::code_spans_on_host(const SpanRowLayout& L, int32_t heads, int32_t coeff_bits,
                                             const std::vector<SpanEncodeJob>& jobs,
                                             const std::vector<int64_t>& frame_images, const std::vector<float>& params,
                                             float* given, uint8_t* image) {
  const int32_t D = L.head_dim, T = L.tokens_per_frame, row = heads * D;
  // each (span, side)'s rows [n][heads * D], one download each (a job's are its head's columns)
  std::map<const float*, std::vector<float>> rows;
  for (const SpanEncodeJob& j : jobs) {
    const float* base = j.x - static_cast<ptrdiff_t>(j.head) * D;
    auto [it, fresh] = rows.try_emplace(base);
    if (!fresh) continue;
    it->second.resize(static_cast<size_t>(j.n) * row);
    WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(it->second.data(), base, it->second.size() * sizeof(float),
                                            cudaMemcpyDeviceToHost, stream_));
  }
  if (absl::Status s = synchronize(); !s.ok()) return s;
  const int32_t tb = span_token_bytes(L), rb = L.rec_bytes;
  const int64_t tables_at = span_tables_at(L, heads);
  const int n_jobs = static_cast<int>(jobs.size());
#pragma omp parallel for schedule(dynamic)
  for (int ji = 0; ji < n_jobs; ++ji) {
    const SpanEncodeJob& j = jobs[static_cast<size_t>(ji)];
    const int32_t n = j.n;
    const std::vector<float>& src = rows.at(j.x - static_cast<ptrdiff_t>(j.head) * D);
    // the rows as the CPU's cache codes them: sanitized and held in fp16
    std::vector<float> x(static_cast<size_t>(n) * D);
    for (int32_t i = 0; i < n; ++i)
      for (int32_t c = 0; c < D; ++c)
        x[static_cast<size_t>(i) * D + c] =
            f16_to_f32(f32_to_f16(kv_sanitize(src[static_cast<size_t>(i) * row + j.head * D + c])));
    const float* w = j.weights >= 0 && params[static_cast<size_t>(j.weights + D)] != 0.0f
                         ? params.data() + j.weights
                         : nullptr;
    const float* basis = j.basis >= 0 ? params.data() + j.basis : nullptr;
    if (j.given >= 0 && given != nullptr) {  // k-means only: the device codes the tokens
      std::vector<float> cen;
      kmeans(x.data(), n, D, D, w, std::min(j.centroids, kSpanMaxCentroids), j.iters, j.seed, &cen, nullptr);
      std::copy(cen.begin(), cen.end(), given + j.given);
      continue;
    }
    SpanCodecParams p;
    p.block = L.block;
    p.centroids = j.centroids;
    p.iters = j.iters;
    p.seed = j.seed;
    p.weights = w;
    p.candidates = j.candidates;
    p.basis = basis;
    p.coeff_bits = coeff_bits;
    SpanHeadCodes codes;
    span_encode(x.data(), n, D, D, p, &codes);
    // where span_code_kernel and finish_centroids put them: each token's
    // record in its frame's image, the tables in the first stored frame's
    int64_t first = -1;
    for (int32_t f = 0; f < (n + T - 1) / T && first < 0; ++f) first = frame_images[static_cast<size_t>(j.first_image + f)];
    if (first >= 0) {
      uint8_t* table = image + first + tables_at + static_cast<int64_t>(j.head) * L.table_bytes();
      std::memcpy(table + (j.side == 0 ? 0 : L.v_table()), codes.centroids.data(), codes.centroids.size() * 2);
      if (j.side == 0 && basis != nullptr)
        for (int32_t e = 0; e < 8 * D; ++e) {
          const uint16_t h = f32_to_f16(basis[e]);
          std::memcpy(table + L.basis_table() + 2 * e, &h, 2);
        }
    }
    const size_t cb = codes.coeffs.empty() ? 0 : codes.coeffs.size() / static_cast<size_t>(n);
    for (int32_t i = 0; i < n; ++i) {
      const int64_t img = frame_images[static_cast<size_t>(j.first_image + i / T)];
      if (img < 0) continue;
      uint8_t* rec = image + img + (static_cast<int64_t>(j.head) * T + i % T) * tb;
      std::memcpy(rec + j.side * rb, codes.blocks.data() + static_cast<size_t>(i) * rb, static_cast<size_t>(rb));
      rec[2 * rb + j.side] = codes.ids[static_cast<size_t>(i)];
      if (j.side == 0 && cb > 0) std::memcpy(rec + 2 * rb + 2, codes.coeffs.data() + i * cb, cb);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::check_span_image(const SpanRowLayout& L, int32_t heads, int32_t coeff_bits,
                                           const std::vector<SpanEncodeJob>& jobs,
                                           const std::vector<int64_t>& frame_images, const std::vector<float>& params,
                                           uint8_t* device_image, int64_t image_bytes) {
  const size_t n = static_cast<size_t>(image_bytes);
  std::vector<uint8_t> host(n, 0), device(n);
  // the rows' downloads wait for the device's coder, queued before them
  absl::Status st = code_spans_on_host(L, heads, coeff_bits, jobs, frame_images, params, nullptr, host.data());
  if (!st.ok()) return st;
  WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device.data(), device_image, n, cudaMemcpyDeviceToHost, stream_));
  st = synchronize();
  if (!st.ok()) return st;
  if (span_check_fault_) device[n / 2] ^= 0x10;
  const bool same = device == host;
  if (!same) {
    // the CPU's codes for this append, whatever the coder does from now on
    st = copy_to_device(device_image, host.data(), n);
    if (!st.ok()) return st;
  }
  span_choice_.record(same);
  return absl::OkStatus();
}

absl::StatusOr<const CudaBackend::GramJobSet*> CudaBackend::gram_jobs(std::span<DeviceKvCache* const> caches,
                                                                       std::span<const WmSessionRows> rows) {
  std::vector<std::tuple<uint64_t, int32_t, int32_t>> key;
  int32_t D = 0, H = 0;
  for (size_t i = 0; i < caches.size(); ++i) {
    const DeviceKvCache& kv = *caches[i];
    if (kv.span == nullptr || !kv.span->observes_queries() || rows[i].rows <= 0) continue;
    if (D != 0 && (kv.geometry.head_dim != D || kv.geometry.heads != H))
      return absl::InvalidArgumentError("attention: sessions of one call with different heads");
    D = kv.geometry.head_dim;
    H = kv.geometry.heads;
    for (const auto& [id, row0, n] : key)  // one launch adds to each session's sums: once each
      if (id == kv.id) return absl::InvalidArgumentError("attention: a cache appears twice in one call");
    key.emplace_back(kv.id, rows[i].row0, rows[i].rows);
  }
  if (key.empty()) return nullptr;
  for (const std::unique_ptr<GramJobSet>& set : gram_sets_)
    if (set->key == key) {
      set->used = ++gram_clock_;
      return set.get();
    }
  if (recording_)
    return absl::FailedPreconditionError("attention: the query statistics' jobs of this batch were not prepared");
  // jobs [n], then each session's page list, then each job's row flags
  std::vector<QueryGramJob> jobs;
  std::vector<int32_t> page_lists;
  std::vector<size_t> list_of;  // each job's session's list, in int32s from page_lists' start
  int64_t flag_bytes = 0;
  for (size_t i = 0; i < caches.size(); ++i) {
    const DeviceKvCache& kv = *caches[i];
    if (kv.span == nullptr || !kv.span->observes_queries() || rows[i].rows <= 0) continue;
    if (kv.stats_pages.empty()) return absl::InternalError("attention: a QuantWM-2 cache without statistics pages");
    const size_t list = page_lists.size();
    page_lists.insert(page_lists.end(), kv.stats_pages.begin(), kv.stats_pages.end());
    for (int32_t h = 0; h < H; ++h) {
      QueryGramJob j;
      j.q = static_cast<int64_t>(rows[i].row0) * H * D + static_cast<int64_t>(h) * D;
      j.rows = rows[i].rows;
      j.row_stride = H * D;
      j.sums = static_cast<int64_t>(h) * query_gram_doubles(D);
      j.flags = flag_bytes;
      flag_bytes += (rows[i].rows + 15) / 16 * 16;
      jobs.push_back(j);
      list_of.push_back(list);
    }
  }
  const size_t job_bytes = (jobs.size() * sizeof(QueryGramJob) + 15) / 16 * 16;
  const size_t list_bytes = (page_lists.size() * sizeof(int32_t) + 15) / 16 * 16;
  // the least recently used set goes (a kept graph may read its jobs: none runs after they move)
  GramJobSet* set = nullptr;
  if (gram_sets_.size() >= kGramJobSets) {
    set = std::min_element(gram_sets_.begin(), gram_sets_.end(), [](const auto& a, const auto& b) {
            return a->used < b->used;
          })->get();
    graph_exec_ = nullptr;
  } else {
    gram_sets_.push_back(std::make_unique<GramJobSet>());
    set = gram_sets_.back().get();
  }
  set->key.clear();  // matches nothing unless its new jobs are in place
  absl::Status st = set->memory.reserve(job_bytes + list_bytes + static_cast<size_t>(flag_bytes));
  if (!st.ok()) return st;
  auto* dev = set->memory.as<uint8_t>();
  const auto* lists = reinterpret_cast<const int32_t*>(dev + job_bytes);
  for (size_t j = 0; j < jobs.size(); ++j) jobs[j].pages = lists + list_of[j];
  std::vector<uint8_t> image(job_bytes + list_bytes, 0);
  std::memcpy(image.data(), jobs.data(), jobs.size() * sizeof(QueryGramJob));
  std::memcpy(image.data() + job_bytes, page_lists.data(), page_lists.size() * sizeof(int32_t));
  st = copy_to_device(dev, image.data(), image.size());
  if (!st.ok()) return st;
  set->key = std::move(key);
  set->n_jobs = static_cast<int32_t>(jobs.size());
  set->head_dim = D;
  set->layer_doubles = static_cast<int64_t>(H) * query_gram_doubles(D);
  set->flags_at = job_bytes + list_bytes;
  set->used = ++gram_clock_;
  return set;
}

absl::Status CudaBackend::observe_queries(int32_t layer, std::span<DeviceKvCache* const> caches,
                                          std::span<const WmSessionRows> rows, const float* q) {
  // every observing session's heads in one launch: their running sums in
  // their own pages grow by this call's Gram matrices (query_gram.cuh)
  auto set = gram_jobs(caches, rows);
  if (!set.ok()) return set.status();
  if (*set == nullptr) return absl::OkStatus();
  const GramJobSet& j = **set;
  QueryGramArgs a;
  a.jobs = j.memory.as<const QueryGramJob>();
  a.n_jobs = j.n_jobs;
  a.head_dim = j.head_dim;
  a.layer = layer;
  a.layer_doubles = j.layer_doubles;
  a.q = q;
  a.pool = pool_memory_.as<uint8_t>();
  a.page_bytes = page_bytes_;
  a.flags = j.memory.as<uint8_t>() + j.flags_at;
  WM_CUDA_RETURN_IF_ERROR(launch_query_gram(a, stream_));
  ++gram_launches_;
  return absl::OkStatus();
}

absl::Status CudaBackend::download_statistics(int32_t layer, std::span<const KvWriteRequest> writes) {
  // each observing cache's sums of this layer: heads x query_gram_doubles
  // doubles from its (layer, head 0), wherever its pages put them
  std::vector<const KvWriteRequest*> who;
  for (const KvWriteRequest& w : writes)
    if (w.frames > 0 && w.kv->span != nullptr && w.kv->span->needs_statistics(layer, w.first_frame, w.frames))
      who.push_back(&w);
  if (who.empty()) return absl::OkStatus();
  if (recording_) return absl::FailedPreconditionError("a download while a graph is recorded");
  const int32_t H = who[0]->kv->geometry.heads, D = who[0]->kv->geometry.head_dim;
  const int64_t per = query_gram_doubles(D), n = static_cast<int64_t>(H) * per, per_page = page_bytes_ / 8;
  gram_host_.resize(static_cast<size_t>(n) * who.size());
  for (size_t i = 0; i < who.size(); ++i) {
    const std::vector<int32_t>& pages = who[i]->kv->stats_pages;
    for (int64_t at = static_cast<int64_t>(layer) * n, done = 0; done < n;) {
      const int64_t page = at / per_page, in = at % per_page, len = std::min(n - done, per_page - in);
      if (page >= static_cast<int64_t>(pages.size()))
        return absl::InternalError("kv append: the query statistics run past their pages");
      const uint8_t* src = pool_memory_.as<uint8_t>() + static_cast<int64_t>(pages[static_cast<size_t>(page)]) *
                                                            page_bytes_ + in * 8;
      WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(gram_host_.data() + static_cast<int64_t>(i) * n + done, src,
                                              static_cast<size_t>(len) * 8, cudaMemcpyDeviceToHost, stream_));
      at += len;
      done += len;
    }
  }
  if (absl::Status st = synchronize(); !st.ok()) return st;
  ++gram_downloads_;
  for (size_t i = 0; i < who.size(); ++i)
    for (int32_t h = 0; h < H; ++h) {
      const double* lower = gram_host_.data() + static_cast<int64_t>(i) * n + static_cast<int64_t>(h) * per;
      who[i]->kv->span->set_statistics(layer, h, lower, static_cast<int64_t>(lower[per - 1]));
    }
  return absl::OkStatus();
}

namespace {

// value i of a KIVI-2 block: fp16 scale, fp16 zero, 2-bit codes four to a
// byte (quant/kv_layouts.h: BlockQ2Asym, q2asym_dequantize_ref's arithmetic)
float kivi_value(const uint8_t* block, int i) {
  uint16_t scale, zero;
  std::memcpy(&scale, block, 2);
  std::memcpy(&zero, block + 2, 2);
  const float z = f16_to_f32(zero), s = f16_to_f32(scale);
  return z + static_cast<float>((block[4 + (i >> 2)] >> ((i & 3) * 2)) & 3) * s;
}

}  // namespace

absl::Status CudaBackend::kv_reconstruct(const DeviceKvCache& kv, int32_t layer, std::vector<float>* k,
                                         std::vector<float>* v) {
  const PagedGeometry& g = kv.pages.geometry();
  if (layer < 0 || layer >= g.layers) return absl::InvalidArgumentError("kv reconstruct: bad layer");
  const int32_t pph = kv.pages.pages_per_head(layer);
  const int64_t P = page_bytes_;
  std::vector<uint8_t> pages(static_cast<size_t>(g.heads) * pph * P);
  for (int32_t h = 0; h < g.heads; ++h)
    for (int32_t i = 0; i < pph; ++i) {
      const int32_t page = kv.pages.pages(layer, h)[static_cast<size_t>(i)];
      WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pages.data() + (static_cast<size_t>(h) * pph + i) * P,
                                              pool_memory_.as<uint8_t>() + page * P, static_cast<size_t>(P),
                                              cudaMemcpyDeviceToHost, stream_));
    }
  absl::Status s = synchronize();
  if (!s.ok()) return s;
  // frames ascending, each from its slot
  const std::vector<int64_t> by_slot = kv.pages.slot_frames(layer);
  std::vector<int32_t> order(by_slot.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return by_slot[a] < by_slot[b]; });
  const int32_t T = g.tokens_per_frame, H = g.heads, Dh = g.head_dim;
  k->assign(order.size() * T * H * Dh, 0.0f);
  v->assign(k->size(), 0.0f);
  const auto f16_at = [&](const uint8_t* page, int64_t elem) {
    uint16_t x;
    std::memcpy(&x, page + elem * 2, 2);
    return f16_to_f32(x);
  };
  if (g.span.block > 0) {
    // span rows: each window frame decoded by the CPU's reference decoder
    // from its slot's codes and table (quant/span_codec.h)
    const SpanRowLayout& L = g.span;
    const int32_t S = g.sink_frames, rb = L.rec_bytes, cb = L.coeff_bytes;
    std::vector<float> basis(static_cast<size_t>(8) * Dh);
    for (size_t f = 0; f < order.size(); ++f)
      for (int32_t h = 0; h < H; ++h) {
        const uint8_t* row = pages.data() + static_cast<size_t>(h) * pph * P;
        const int32_t slot = order[f];
        float* kd = k->data() + (f * T * H + h) * Dh;
        float* vd = v->data() + (f * T * H + h) * Dh;
        const int64_t stride = static_cast<int64_t>(H) * Dh;
        if (slot < S) {
          for (int32_t t = 0; t < T; ++t) {
            const int32_t logical = slot * T + t;
            int32_t entry = 0, offset = 0;
            L.front.at(logical / kTileKeys, &entry, &offset);
            const uint8_t* unit = row + static_cast<int64_t>(entry) * P + offset;
            for (int32_t d = 0; d < Dh; ++d) {
              kd[t * stride + d] = f16_at(unit, static_cast<int64_t>(logical % kTileKeys) * Dh + d);
              vd[t * stride + d] = f16_at(unit, static_cast<int64_t>(kTileKeys + logical % kTileKeys) * Dh + d);
            }
          }
          continue;
        }
        int32_t entry = 0, offset = 0;
        L.map.at(0, &entry, &offset);
        int32_t table_index = 0;
        std::memcpy(&table_index, row + static_cast<int64_t>(entry) * P + offset + 4 * (slot - S), 4);
        if (table_index < 0 || table_index >= L.n_tables) return absl::InternalError("kv reconstruct: a bad table index");
        L.tables.at(table_index, &entry, &offset);
        const uint8_t* table = row + static_cast<int64_t>(entry) * P + offset;
        const bool psac = cb > 0 && kv.span != nullptr && kv.span->slot_has_basis(layer, slot - S);
        SpanHeadCodes ck, cv;
        for (SpanHeadCodes* c : {&ck, &cv}) {
          c->k = L.max_centroids;
          c->centroids.resize(static_cast<size_t>(L.max_centroids) * Dh);
          std::memcpy(c->centroids.data(), table + (c == &ck ? 0 : L.v_table()), c->centroids.size() * 2);
          c->ids.resize(static_cast<size_t>(T));
          c->blocks.resize(static_cast<size_t>(T) * rb);
        }
        if (psac) ck.coeffs.resize(static_cast<size_t>(T) * cb);
        for (int32_t t = 0; t < T; ++t) {
          const int32_t wl = (slot - S) * T + t;
          L.units.at(wl / kTileKeys, &entry, &offset);
          const uint8_t* unit = row + static_cast<int64_t>(entry) * P + offset;
          const int32_t r = wl % kTileKeys;
          std::memcpy(ck.blocks.data() + static_cast<size_t>(t) * rb, unit + r * rb, static_cast<size_t>(rb));
          std::memcpy(cv.blocks.data() + static_cast<size_t>(t) * rb, unit + L.v_recs() + r * rb, static_cast<size_t>(rb));
          ck.ids[static_cast<size_t>(t)] = unit[L.k_ids() + r];
          cv.ids[static_cast<size_t>(t)] = unit[L.v_ids() + r];
          if (psac)
            std::memcpy(ck.coeffs.data() + static_cast<size_t>(t) * cb, unit + L.k_coeffs() + r * cb,
                        static_cast<size_t>(cb));
        }
        if (psac)
          for (size_t i = 0; i < basis.size(); ++i) basis[i] = f16_at(table + L.basis_table(), static_cast<int64_t>(i));
        const int coeff_bits = cb == 6 ? 4 : 8;
        span_decode_ref(ck, T, Dh, L.block, coeff_bits, psac ? basis.data() : nullptr, kd, static_cast<int>(stride));
        span_decode_ref(cv, T, Dh, L.block, coeff_bits, nullptr, vd, static_cast<int>(stride));
      }
    return absl::OkStatus();
  }
  const KiviRowLayout& q = g.kivi;
  const int32_t G = q.group, bb = q.block_bytes();
  for (size_t f = 0; f < order.size(); ++f)
    for (int32_t t = 0; t < T; ++t)
      for (int32_t h = 0; h < H; ++h) {
        const int64_t logical = static_cast<int64_t>(order[f]) * T + t;
        const uint8_t* row = pages.data() + static_cast<size_t>(h) * pph * P;
        float* kd = k->data() + ((f * T + t) * H + h) * Dh;
        float* vd = v->data() + ((f * T + t) * H + h) * Dh;
        if (G == 0) {  // fp16 pages
          const uint8_t* page = row + logical / g.page_tokens * P;
          const int64_t at = logical % g.page_tokens * Dh;
          for (int32_t d = 0; d < Dh; ++d) {
            kd[d] = f16_at(page, at + d);
            vd[d] = f16_at(page, at + static_cast<int64_t>(g.page_tokens) * Dh + d);
          }
          continue;
        }
        int32_t entry = 0, offset = 0;
        q.unit_at(static_cast<int32_t>(logical / q.unit_tokens), &entry, &offset);
        const uint8_t* unit = row + static_cast<int64_t>(entry) * P + offset;
        const int32_t r = static_cast<int32_t>(logical % q.unit_tokens);
        if (logical < q.front_tokens()) {  // a sink frame: fp16
          for (int32_t d = 0; d < Dh; ++d) {
            kd[d] = f16_at(unit, static_cast<int64_t>(r) * Dh + d);
            vd[d] = f16_at(unit, static_cast<int64_t>(q.unit_tokens + r) * Dh + d);
          }
          continue;
        }
        const uint8_t* chunk = unit + r / G * q.chunk_bytes();
        const int tok = r % G;
        for (int32_t d = 0; d < Dh; ++d) {
          kd[d] = kivi_value(chunk + d * bb, tok);
          vd[d] = kivi_value(chunk + (Dh + tok * (Dh / G) + d / G) * bb, d % G);
        }
      }
  return absl::OkStatus();
}

// ---- attention ------------------------------------------------------------

PagedKvFp16View CudaBackend::fp16_view(const int32_t* page_table, const PagedGeometry& g) const {
  PagedKvFp16View v;
  v.pool = pool_memory_.as<uint16_t>();
  v.page_table = page_table;
  v.page_elems = page_bytes_ / 2;
  v.page_tokens = g.page_tokens;
  v.head_dim = g.head_dim;
  // the tensor map encodes this geometry: an fp16 cache of head_dim 64 or 128
  if (tensor_maps_ready_ && (g.head_dim == 64 || g.head_dim == 128) && g.kivi.group == 0 && g.span.block == 0 &&
      static_cast<int64_t>(g.page_tokens) * 4 * g.head_dim == page_bytes_)
    v.tensor_map = tensor_maps_.as<uint8_t>() + (g.head_dim == 128 ? sizeof(CUtensorMap) : 0);
  return v;
}

PagedKvKiviView CudaBackend::kivi_view(const int32_t* page_table, const PagedGeometry& g) const {
  PagedKvKiviView v;
  v.pool = pool_memory_.as<uint8_t>();
  v.page_table = page_table;
  v.page_bytes = page_bytes_;
  v.row = g.kivi;
  return v;
}

PagedKvSpanView CudaBackend::span_view(const int32_t* page_table, const PagedGeometry& g) const {
  PagedKvSpanView v;
  v.pool = pool_memory_.as<uint8_t>();
  v.page_table = page_table;
  v.page_bytes = page_bytes_;
  v.row = g.span;
  return v;
}

absl::Status CudaBackend::kv_probe(const DeviceKvCache& ref, const DeviceKvCache& cand, int32_t layer, const float* q,
                                   const float* k_cur, const float* v_cur, int32_t n, std::span<const int32_t> samples,
                                   int32_t topk, ProbeOutcome* out) {
  const PagedGeometry& g = cand.pages.geometry();
  const PagedGeometry& rg = ref.pages.geometry();
  if (layer < 0 || layer >= g.layers) return absl::InvalidArgumentError("kv probe: bad layer");
  if (rg.layers != g.layers || rg.heads != g.heads || rg.head_dim != g.head_dim ||
      rg.tokens_per_frame != g.tokens_per_frame)
    return absl::InvalidArgumentError("kv probe: the caches differ in geometry");
  if (recording_) return absl::FailedPreconditionError("kv probe: a download while a graph is recorded");
  if (n <= 0 || samples.size() % 2 != 0) return absl::InvalidArgumentError("kv probe: no rows, or a half sample");
  if (topk < 1 || topk > kProbeMaxTopK)
    return absl::InvalidArgumentError(absl::StrCat("kv probe: top-k ", topk, " outside 1..", kProbeMaxTopK));
  for (const void* p : {static_cast<const void*>(q), static_cast<const void*>(k_cur), static_cast<const void*>(v_cur)})
    if (absl::Status s = need(p, "kv probe argument"); !s.ok()) return s;
  const int32_t count = static_cast<int32_t>(samples.size() / 2), H = g.heads, Dh = g.head_dim;
  if (count > 4096) return absl::InvalidArgumentError("kv probe: more than 4096 samples");
  for (int32_t i = 0; i < count; ++i)
    if (samples[2 * i] < 0 || samples[2 * i] >= H || samples[2 * i + 1] < 0 || samples[2 * i + 1] >= n)
      return absl::InvalidArgumentError(absl::StrCat("kv probe: sample ", i, " is (head ", samples[2 * i], ", query ",
                                                     samples[2 * i + 1], ") of ", H, " heads and ", n, " queries"));
  if (Dh != 32 && Dh != 64 && Dh != 128) return absl::UnimplementedError("kv probe: head_dim other than 32, 64, 128");
  if (ref.pages.frames(layer) != cand.pages.frames(layer))
    return absl::FailedPreconditionError("kv probe: the caches hold different frames");
  *out = ProbeOutcome{};
  const int32_t cached = cand.pages.used_tokens(layer), T = g.tokens_per_frame;
  if (count == 0 || cached == 0) return absl::OkStatus();
  const int32_t k = std::min(topk, cached);

  // on the device: the samples, then per cache its page-table rows and its
  // slots' frame ranks; then per cache the logits, the tiles' partials and
  // the outputs; then the ranks
  std::vector<int32_t> inputs(samples.begin(), samples.end());
  size_t rows_at[2], ranks_at[2];
  const DeviceKvCache* caches[2] = {&ref, &cand};
  for (int c = 0; c < 2; ++c) {
    const KvPages& pages = caches[c]->pages;
    rows_at[c] = inputs.size();
    const int32_t pph = pages.pages_per_head(layer);
    for (int32_t h = 0; h < H; ++h) {
      inputs.insert(inputs.end(), pages.pages(layer, h).begin(), pages.pages(layer, h).end());
      inputs.insert(inputs.end(), static_cast<size_t>(pph) - pages.pages(layer, h).size(), -1);
    }
    ranks_at[c] = inputs.size();
    const std::vector<int64_t> frame_of = pages.slot_frames(layer);
    std::vector<int32_t> order(frame_of.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return frame_of[x] < frame_of[y]; });
    std::vector<int32_t> rank(order.size());
    for (size_t r = 0; r < order.size(); ++r) rank[static_cast<size_t>(order[r])] = static_cast<int32_t>(r);
    inputs.insert(inputs.end(), rank.begin(), rank.end());
  }
  const auto round16 = [](size_t bytes) { return (bytes + 15) / 16 * 16; };
  const size_t input_bytes = round16(inputs.size() * sizeof(int32_t));
  const size_t logit_bytes = round16(static_cast<size_t>(count) * cached * 4);
  const size_t partial_bytes = round16(static_cast<size_t>(count) * probe_tiles(cached, n) * (Dh + 2) * 4);
  const size_t out_bytes = round16(static_cast<size_t>(count) * Dh * 4);
  // the results, one block to download: sq_err [count], ref_top, cand_top [count][k], ref_nonfinite [count]
  const size_t result_bytes = static_cast<size_t>(count) * (8 + 4 * (2 * k + 1));
  const size_t per_cache = logit_bytes + out_bytes;
  absl::Status s = probe_memory_.reserve(input_bytes + 2 * per_cache + partial_bytes + result_bytes);
  if (!s.ok()) return s;
  auto* base = probe_memory_.as<uint8_t>();
  s = copy_to_device(base, inputs.data(), inputs.size() * sizeof(int32_t));
  if (!s.ok()) return s;
  const auto* dev_inputs = reinterpret_cast<const int32_t*>(base);
  uint8_t* cache_memory = base + input_bytes;
  float* partial = reinterpret_cast<float*>(cache_memory + 2 * per_cache);
  uint8_t* results = cache_memory + 2 * per_cache + partial_bytes;
  for (int c = 0; c < 2; ++c) {
    const PagedGeometry& cg = caches[c]->pages.geometry();
    ProbeArgs a;
    a.q = q;
    a.k_cur = k_cur;
    a.v_cur = v_cur;
    a.n = n;
    a.heads = H;
    a.samples = dev_inputs;
    a.n_samples = count;
    a.page_rows = dev_inputs + rows_at[c];
    a.pages_per_head = caches[c]->pages.pages_per_head(layer);
    a.slot_rank = dev_inputs + ranks_at[c];
    a.tokens_per_frame = T;
    a.cached = cached;
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
    a.logits = reinterpret_cast<float*>(cache_memory + c * per_cache);
    a.partial = partial;  // combined into out before the next cache's tiles run (one stream)
    a.out = reinterpret_cast<float*>(cache_memory + c * per_cache + logit_bytes);
    if (cg.span.block > 0) {
      WM_CUDA_RETURN_IF_ERROR(launch_kv_probe(a, span_view(a.page_rows, cg), Dh, stream_));
    } else if (cg.kivi.group > 0) {
      WM_CUDA_RETURN_IF_ERROR(launch_kv_probe(a, kivi_view(a.page_rows, cg), Dh, stream_));
    } else {
      WM_CUDA_RETURN_IF_ERROR(launch_kv_probe(a, fp16_view(a.page_rows, cg), Dh, stream_));
    }
  }
  RankArgs r;
  r.ref = reinterpret_cast<const float*>(cache_memory);
  r.cand = reinterpret_cast<const float*>(cache_memory + per_cache);
  r.n_samples = count;
  r.tokens = cached;
  r.k = k;
  r.sq_err = reinterpret_cast<double*>(results);
  r.ref_top = reinterpret_cast<int32_t*>(results + static_cast<size_t>(count) * 8);
  r.cand_top = r.ref_top + static_cast<size_t>(count) * k;
  r.ref_nonfinite = r.cand_top + static_cast<size_t>(count) * k;
  WM_CUDA_RETURN_IF_ERROR(launch_probe_rank(r, stream_));
  ++probe_launches_;

  std::vector<uint8_t> host(result_bytes);
  out->ref_out.resize(static_cast<size_t>(count) * Dh);
  out->cand_out.resize(out->ref_out.size());
  WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.data(), results, result_bytes, cudaMemcpyDeviceToHost, stream_));
  for (int c = 0; c < 2; ++c)
    WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync((c == 0 ? out->ref_out : out->cand_out).data(),
                                            cache_memory + c * per_cache + logit_bytes,
                                            out->ref_out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  s = synchronize();
  if (!s.ok()) return s;
  out->tokens = cached;
  out->k = k;
  out->sq_err.resize(static_cast<size_t>(count));
  out->ref_top.resize(static_cast<size_t>(count) * k);
  out->cand_top.resize(out->ref_top.size());
  out->ref_nonfinite.resize(static_cast<size_t>(count));
  std::memcpy(out->sq_err.data(), host.data(), out->sq_err.size() * 8);
  const uint8_t* tops = host.data() + static_cast<size_t>(count) * 8;
  std::memcpy(out->ref_top.data(), tops, out->ref_top.size() * 4);
  std::memcpy(out->cand_top.data(), tops + out->ref_top.size() * 4, out->cand_top.size() * 4);
  std::memcpy(out->ref_nonfinite.data(), tops + 2 * out->ref_top.size() * 4, out->ref_nonfinite.size() * 4);
  return absl::OkStatus();
}

const AttentionPlan& CudaBackend::last_plan() const {
  static const AttentionPlan kNone;
  return last_plan_ != nullptr ? last_plan_->plan : kNone;
}

CudaBackend::PlanSlot* CudaBackend::fitting_plan(int32_t layer, std::span<DeviceKvCache* const> caches,
                                                 std::span<const WmSessionRows> rows) const {
  for (const std::unique_ptr<PlanSlot>& slot : plan_slots_) {
    const PlanKey& key = slot->key;
    if (key.tuning != tuning_generation_ || key.sessions.size() != caches.size()) continue;
    const size_t L = static_cast<size_t>(slot->plan.layers);
    bool fits = true;
    for (size_t s = 0; s < caches.size() && fits; ++s)
      fits = key.sessions[s] == std::make_tuple(caches[s]->id, rows[s].row0, rows[s].rows) &&
             caches[s]->pages.version(layer) == key.versions[s * L + static_cast<size_t>(layer)];
    if (fits) return slot.get();
  }
  return nullptr;
}

absl::StatusOr<CudaBackend::PlanSlot*> CudaBackend::plan_for(int32_t layer, std::span<DeviceKvCache* const> caches,
                                                             std::span<const WmSessionRows> rows) {
  // a pass starts where the layers come round again: a lower layer than the
  // last call's (not after a recording's prepares, which start the pass), or
  // a plan this pass used at this layer already (a one-layer model)
  if (!last_use_was_prepare_ && layer < last_use_layer_) pass_start_ = plan_clock_ + 1;
  PlanSlot* slot = fitting_plan(layer, caches, rows);
  if (slot != nullptr && slot->used >= pass_start_ && slot->layer == layer) pass_start_ = plan_clock_ + 1;
  last_use_was_prepare_ = false;
  last_use_layer_ = layer;
  if (slot == nullptr) {
    auto made = make_plan(caches, rows);
    if (!made.ok()) return made.status();
    slot = *made;
  }
  slot->used = ++plan_clock_;
  slot->layer = layer;
  return slot;
}

absl::StatusOr<CudaBackend::PlanSlot*> CudaBackend::make_plan(std::span<DeviceKvCache* const> caches,
                                                              std::span<const WmSessionRows> rows) {
  std::vector<PlanInput> in;
  std::vector<std::tuple<uint64_t, int32_t, int32_t>> sessions;
  for (size_t s = 0; s < caches.size(); ++s) {
    in.push_back({&caches[s]->pages, rows[s].row0, rows[s].rows});
    sessions.emplace_back(caches[s]->id, rows[s].row0, rows[s].rows);
  }
  // the slot of an older plan of these same rows (its caches have changed
  // since); else, with kPlanSlots kept, the least recently used one that
  // this pass has not used (a pass may have more calls than that: every
  // batch-invariant session is one); else a new one
  auto same = std::find_if(plan_slots_.begin(), plan_slots_.end(),
                           [&](const std::unique_ptr<PlanSlot>& x) { return x->key.sessions == sessions; });
  PlanSlot* slot = nullptr;
  if (same != plan_slots_.end()) {
    slot = same->get();
  } else if (plan_slots_.size() >= kPlanSlots) {
    auto lru = std::min_element(plan_slots_.begin(), plan_slots_.end(),
                                [](const std::unique_ptr<PlanSlot>& a, const std::unique_ptr<PlanSlot>& b) {
                                  return a->used < b->used;
                                });
    if ((*lru)->used < pass_start_) slot = lru->get();
  }
  if (slot == nullptr) {
    plan_slots_.push_back(std::make_unique<PlanSlot>());
    slot = plan_slots_.back().get();
  }
  // whatever fails below leaves no plan that a later batch could match
  slot->key = PlanKey{};
  if (last_plan_ == slot) last_plan_ = nullptr;
  ++plans_made_;
  PlanTuning t = plan_tuning_;
  const int32_t hd = caches.empty() ? 0 : caches[0]->pages.geometry().head_dim;
  for (size_t i = 0; i < kHeadDims.size(); ++i)
    if (kHeadDims[i] == hd) {
      // each tile size as the kernel that would run it fills an SM
      t.ctas_per_sm_64 = ctas_per_sm_[static_cast<size_t>(std::max(kMma, kernel_for(hd, 64)) - 1)][i][0];
      t.ctas_per_sm_128 = ctas_per_sm_[static_cast<size_t>(std::max(kMma, kernel_for(hd, 128)) - 1)][i][1];
    }
  auto plan = make_attention_plan(in, t);
  if (!plan.ok()) return plan.status();
  slot->plan = std::move(*plan);
  slot->layout = slot->plan.layout();
  const std::vector<uint8_t> blob = slot->plan.blob();
  absl::Status s = slot->memory.reserve(blob.size());
  if (!s.ok()) return s;
  s = copy_to_device(slot->memory.get(), blob.data(), blob.size());
  if (!s.ok()) return s;
  PlanKey key;
  key.tuning = tuning_generation_;
  key.sessions = std::move(sessions);
  for (size_t i = 0; i < caches.size(); ++i)
    for (int32_t l = 0; l < slot->plan.layers; ++l) key.versions.push_back(caches[i]->pages.version(l));
  slot->key = std::move(key);
  return slot;
}

absl::Status CudaBackend::reserve_attention_workspaces(const AttentionPlan& p) {
  const size_t one = static_cast<size_t>(p.heads) * p.rows_total * p.head_dim;
  absl::Status s = qkv16_.reserve(3 * one * sizeof(uint16_t));
  if (s.ok()) encode_block_maps();
  if (!s.ok() || p.partials <= 0) return s;
  const size_t partial_rows = static_cast<size_t>(p.partials) * p.heads * p.block_q;
  return partials_.reserve(partial_rows * (p.head_dim + 2) * sizeof(float));
}

absl::Status CudaBackend::prepare_attention(std::span<DeviceKvCache* const> caches,
                                            std::span<const WmSessionRows> rows) {
  if (caches.empty()) return absl::OkStatus();
  if (caches.size() != rows.size()) return absl::InvalidArgumentError("attention: caches and rows differ in count");
  for (DeviceKvCache* c : caches)
    if (c == nullptr) return absl::InvalidArgumentError("attention: a session has no device cache");
  const int32_t layers = caches[0]->pages.geometry().layers;
  // a recording's prepares (one per attention call) start its pass
  if (!last_use_was_prepare_) pass_start_ = plan_clock_ + 1;
  last_use_was_prepare_ = true;
  PlanSlot* slot = nullptr;
  for (int32_t l = 0; l < layers && slot == nullptr; ++l)
    if (fitting_plan(l, caches, rows) == nullptr) {
      auto made = make_plan(caches, rows);
      if (!made.ok()) return made.status();
      slot = *made;
    }
  if (slot == nullptr) slot = fitting_plan(0, caches, rows);
  if (slot == nullptr) return absl::InternalError("attention: no plan after planning");
  slot->used = ++plan_clock_;
  slot->layer = -1;
  return slot->plan.items.empty() ? absl::OkStatus() : reserve_attention_workspaces(slot->plan);
}

absl::Status CudaBackend::reserve_rows(DeviceBuffer& buffer, size_t& widest, int64_t rows, size_t row_bytes) {
  widest = std::max(widest, row_bytes);
  return buffer.reserve(static_cast<size_t>(rows) * row_bytes);
}

absl::Status CudaBackend::prepare_recording(std::span<DeviceKvCache* const> caches,
                                            std::span<const WmSessionRows> rows) {
  // (span caches are booked on the host at their appends, which no recorded
  // pass makes; their attention runs from the prepared plan as fp16's does,
  // and QuantWM-2's query statistics from jobs uploaded now)
  absl::Status s = prepare_attention(caches, rows);
  if (!s.ok()) return s;
  if (auto set = gram_jobs(caches, rows); !set.ok()) return set.status();
  // the batch's rows end at the last call's last row (a step may attend in
  // several calls, each prepared: they cover the batch's rows between them)
  int64_t n = 0;
  for (const WmSessionRows& r : rows) n = std::max<int64_t>(n, static_cast<int64_t>(r.row0) + r.rows);
  // a pass's widest operands are [n, widest row]: made now, a recording of
  // the pass finds them big enough (growing drops the contents: and the copy)
  const size_t shadow_bytes = static_cast<size_t>(n) * shadow_row_bytes_;
  const size_t hidden_bytes = static_cast<size_t>(n) * ffn_hidden_row_bytes_;
  // a kept graph reads the buffers it was recorded with: none runs after they move
  if (shadow_bytes > shadow_memory_.size() || hidden_bytes > ffn_hidden_.size()) graph_exec_ = nullptr;
  if (shadow_bytes > shadow_memory_.size()) {
    invalidate_shadow();
    s = shadow_memory_.reserve(shadow_bytes);
    if (!s.ok()) return s;
  }
  // and the buffer of GEMMs whose output rows are off cuBLASLt's alignment
  auto grew = gemm_->reserve_realigned(n);
  if (!grew.ok()) return grew.status();
  if (*grew) graph_exec_ = nullptr;
  return ffn_hidden_.reserve(hidden_bytes);
}

absl::Status CudaBackend::attention(int32_t layer, std::span<DeviceKvCache* const> caches,
                                    std::span<const WmSessionRows> rows, const float* q, const float* k,
                                    const float* v, float* out) {
  if (caches.empty()) return absl::OkStatus();
  if (caches.size() != rows.size()) return absl::InvalidArgumentError("attention: caches and rows differ in count");
  for (DeviceKvCache* c : caches)
    if (c == nullptr) return absl::InvalidArgumentError("attention: a session has no device cache");
  const PagedGeometry& g = caches[0]->pages.geometry();
  if (layer < 0 || layer >= g.layers) return absl::InvalidArgumentError(absl::StrCat("attention: layer ", layer));
  for (const DeviceKvCache* c : caches) {
    const PagedGeometry& o = c->pages.geometry();
    if (!o.same_layout(g))
      return absl::InvalidArgumentError("attention: the caches of one call differ in format; attend each format alone");
  }
  for (const void* p : {static_cast<const void*>(q), static_cast<const void*>(k), static_cast<const void*>(v),
                        static_cast<const void*>(out)}) {
    absl::Status s = need(p, "attention argument");
    if (!s.ok()) return s;
    if (!aligned16(p)) return absl::InvalidArgumentError("attention: q, k, v, out must be 16-byte aligned");
  }
  if (absl::Status st = observe_queries(layer, caches, rows, q); !st.ok()) return st;
  auto slot = plan_for(layer, caches, rows);
  if (!slot.ok()) return slot.status();
  last_plan_ = *slot;
  const AttentionPlan& p = (*slot)->plan;
  if (p.items.empty()) return absl::OkStatus();
  ++attention_launches_;
  absl::Status s = reserve_attention_workspaces(p);
  if (!s.ok()) return s;
  if (recording_) recorded_attention_.emplace_back(p.rows_total, p.partials > 0, p.block_q, g.kivi.group);
  const int64_t H = p.heads, Dh = p.head_dim, R = p.rows_total;
  const size_t one = static_cast<size_t>(H * R * Dh);
  uint16_t* q16 = qkv16_.as<uint16_t>();
  // the rows this call reads start at its first session's (a batch-invariant
  // session's call reads its own rows only)
  int32_t first_row = static_cast<int32_t>(R);
  for (const PlanSession& ps : p.sessions)
    if (ps.rows > 0) first_row = std::min(first_row, ps.row0);
  // q and k made by the RoPE before this call, in this call's layout: v alone
  const HalfInputs& hi = half_inputs_;
  const bool made = hi.valid && hi.q == q && hi.k == k && hi.buffer == qkv16_.get() &&
                    hi.buffer_bytes == qkv16_.size() && hi.rows == R && hi.heads == H && hi.head_dim == Dh;
  // (converting all three writes this call's layout, which a later call's may not share)
  if (!made) invalidate_half_inputs();
  WM_CUDA_RETURN_IF_ERROR(launch_attention_inputs(q, k, v, first_row, static_cast<int32_t>(R), static_cast<int32_t>(H),
                                                  static_cast<int32_t>(Dh), q16, q16 + one, q16 + 2 * one, stream_,
                                                  made));
  if (made) ++fused_input_calls_;
  // an output over q or k changes what the copies are of
  const size_t qkv_bytes = static_cast<size_t>(R) * H * Dh * sizeof(float);
  if (overlaps(out, qkv_bytes, q, qkv_bytes) || overlaps(out, qkv_bytes, k, qkv_bytes)) invalidate_half_inputs();
  // the output in bf16 too, for the output projection (bf16_operand finds
  // it as the copy of out), where this call writes every row of out: one
  // session's call of several (batch-invariant ones) leaves rows to others
  int64_t rows_written = 0;
  for (const PlanSession& ps : p.sessions) rows_written += ps.rows;
  const int64_t out_cols = H * Dh;
  uint16_t* out16 = nullptr;
  if (attention_bf16_output_ && use_shadow_ && first_row == 0 && rows_written == R) {
    s = reserve_rows(shadow_memory_, shadow_row_bytes_, R, static_cast<size_t>(out_cols) * sizeof(uint16_t));
    if (!s.ok()) return s;
    out16 = shadow_memory_.as<uint16_t>();
  }
  auto* base = (*slot)->memory.as<uint8_t>();
  const AttentionPlan::Layout& plan_layout = (*slot)->layout;
  AttentionArgs a;
  a.q16 = q16;
  a.k16 = q16 + one;
  a.v16 = q16 + 2 * one;
  a.out = out;
  a.out16 = out16;
  a.partial_o = p.partials > 0 ? partials_.as<float>() : nullptr;
  const size_t partial_rows = static_cast<size_t>(p.partials) * H * p.block_q;
  a.partial_ml = p.partials > 0 ? partials_.as<float>() + partial_rows * Dh : nullptr;
  a.sessions = reinterpret_cast<const PlanSession*>(base + plan_layout.sessions);
  a.cached = reinterpret_cast<const int32_t*>(base + plan_layout.cached) + static_cast<size_t>(layer) * caches.size();
  a.items = reinterpret_cast<const WorkItem*>(base + plan_layout.items);
  a.groups = reinterpret_cast<const CombineGroup*>(base + plan_layout.groups);
  a.rows_total = static_cast<int32_t>(R);
  a.heads = static_cast<int32_t>(H);
  a.layer = layer;
  a.block_q = p.block_q;
  a.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(Dh)));
  a.pingpong = pingpong();
  a.ws_ablate = attention_ws_ablate_;
  const PagedKvFp16View view = fp16_view(reinterpret_cast<const int32_t*>(base + plan_layout.page_tables), g);
  const auto items = static_cast<int32_t>(p.items.size());
  if (g.span.block > 0) {
    // QVG-2 / QuantWM-2: the kernels decode their tiles (kv_format_span.cuh);
    // as for KIVI-2, the overlapped kernel where fp16 would run the warp-specialised one
    const PagedKvSpanView span = span_view(view.page_table, g);
    ++span_attention_launches_;
    const int32_t kernel = span_sm90_ready_ ? kernel_for(p.head_dim, p.block_q) : kMma;
    if (kernel == kMma) {
      WM_CUDA_RETURN_IF_ERROR(launch_attention_span(a, span, p.head_dim, items, stream_));
    } else {
      ++sm90_launches_;
      if (kernel != kWgmma) ++overlap_launches_;
      WM_CUDA_RETURN_IF_ERROR(
          launch_attention_sm90_span(a, span, p.head_dim, items, kernel == kWgmma ? 0 : overlap_stages(), stream_));
    }
  } else if (g.kivi.group > 0) {
    // KIVI-2: the mma.sync kernel decodes its tiles (kv_format_kivi.cuh)
    const PagedKvKiviView kivi = kivi_view(view.page_table, g);
    ++kivi_attention_launches_;
    // the kernel the fp16 cache would run, but the warp-specialised one: its
    // producer warps hold too few registers to decode, so the overlapped one
    const int32_t kernel = kernel_for(p.head_dim, p.block_q);
    if (kernel == kMma) {
      WM_CUDA_RETURN_IF_ERROR(launch_attention_kivi(a, kivi, p.head_dim, items, stream_));
    } else {
      ++sm90_launches_;
      if (kernel != kWgmma) ++overlap_launches_;
      WM_CUDA_RETURN_IF_ERROR(
          launch_attention_sm90_kivi(a, kivi, p.head_dim, items, kernel == kWgmma ? 0 : overlap_stages(), stream_));
    }
  } else if (const int32_t kernel = kernel_for(p.head_dim, p.block_q); kernel == kWs) {
    ++sm90_launches_;
    ++ws_launches_;
    const bool tma = ws_tma() && view.tensor_map != nullptr;
    if (tma) ++ws_tma_launches_;
    if (tma && block_maps_ready_) {  // the block's own keys by TMA too
      a.block_map = tensor_maps_.as<uint8_t>() + (Dh == 128 ? 3 : 2) * sizeof(CUtensorMap);
      a.k_map_row = H * R;
      a.v_map_row = 2 * H * R;
    }
    WM_CUDA_RETURN_IF_ERROR(
        launch_attention_sm90_ws(a, view, p.head_dim, items, ws_stages(), ws_keys(p.block_q), tma, stream_));
  } else if (kernel == kWgmma || kernel == kOverlap) {
    ++sm90_launches_;
    if (kernel == kOverlap) ++overlap_launches_;
    WM_CUDA_RETURN_IF_ERROR(
        launch_attention_sm90(a, view, p.head_dim, items, kernel == kOverlap ? overlap_stages() : 0, stream_));
  } else {
    WM_CUDA_RETURN_IF_ERROR(launch_attention(a, view, p.head_dim, items, stream_));
  }
  if (!p.groups.empty())
    WM_CUDA_RETURN_IF_ERROR(
        launch_attention_combine(a, p.head_dim, static_cast<int32_t>(p.groups.size()), stream_));
  if (out16 != nullptr) {
    // rows of out_cols bf16, as bf16_operand's conversion lays out a linear's input of that width (ld = in)
    shadow_ = Shadow{true, out, R, out_cols, out_cols};
    ++bf16_output_calls_;
  }
  return absl::OkStatus();
}

}  // namespace wm::cuda
