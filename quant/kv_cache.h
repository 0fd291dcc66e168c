// The per-session KV cache: one object per session, one storage format per
// object. The engine talks to every format through this interface; formats
// live in quant/ (fp32/fp16 here, the 2-bit formats beside them).
//
// Threading: a KvCache is used by one thread at a time (the engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace wm {

struct KvGeometry {
  int layers = 0;
  int heads = 0;             // kv heads (= query heads in this model family)
  int head_dim = 0;
  int tokens_per_frame = 0;
  int window_frames = 0;     // most recent frames kept
  int sink_frames = 0;       // first frames kept forever
  int frames_per_block = 1;
  int64_t values_per_frame() const {  // K and V, all layers
    return int64_t{2} * layers * heads * head_dim * tokens_per_frame;
  }
  int max_frames() const { return window_frames + sink_frames; }
};

// exact bytes held, by component (docs/QUANT.md defines each)
struct KvBytes {
  int64_t fp_values = 0;    // K/V kept in fp16/fp32 (recent window, sinks, the fp formats)
  int64_t codes = 0;        // packed low-bit codes
  int64_t scales = 0;       // per-group scales
  int64_t zeros = 0;        // per-group zero points
  int64_t centroids = 0;    // k-means centroids
  int64_t ids = 0;          // centroid ids
  int64_t bases = 0;        // PSAC eigenbases
  int64_t coeffs = 0;       // PSAC coefficients + their scales
  int64_t total() const { return fp_values + codes + scales + zeros + centroids + ids + bases + coeffs; }
  KvBytes& operator+=(const KvBytes& o);
};

// upper bounds of the options whose cost grows with them: the worst-case
// bytes replay a ledger over a multiple of the residual and of the refresh
// period, and k-means runs every iteration
inline constexpr int kMaxKiviResidual = 4096;
inline constexpr int kMaxPsacRefreshFrames = 1024;  // also the most frames before spans, blocks and refreshes line up
inline constexpr int kMaxKmeansIters = 1000;

// format options (docs/QUANT.md explains each choice and its cost)
struct KvFormatOptions {
  // KIVI
  int kivi_group = 32;        // G: tokens per key group / channels per value group (32, 64 or 128)
  int kivi_residual = 32;     // R: recent tokens kept fp16, quantized when R have gathered (a multiple of G)
  // QVG / QuantWM
  int span_frames = 0;        // a span (one k-means) closes once this many frames are pending; 0: every append is a span (one block)
  int centroids = 256;        // at most this many k-means centroids per span ...
  int tokens_per_centroid = 64;  // ... and at most one per this many tokens (fp16 centroids: <= 0.25 bit/value)
  int block = 64;             // B: channels per residual scale (16, 32, 64, 128; capped at head_dim, divides it)
  int kmeans_iters = 4;
  uint64_t kmeans_seed = 1;
  bool quantize_sinks = false;  // sink frames stay fp16 (QVG's policy) unless set
  // QuantWM
  bool qsac = true;           // query-sensitivity-aware clustering
  bool psac = true;           // principal-subspace logit correction
  int psac_rank = 8;          // must be 8: the coefficient layout (quant/kv_layouts.h) is built for r = 8
  int psac_bits = 8;          // 8 or 4
  int psac_refresh_frames = 16;  // a new PSAC basis per this many (absolute) frames; spans in between share it
  int qsac_candidates = 4;    // nearest centroids tried for the int2-friendly choice
  float qsac_weight_floor = 0.01f;  // channel weights (mean 1) never drop below this
  // which of K and V are quantized (ablations); fp16 otherwise
  bool quantize_keys = true;
  bool quantize_values = true;
};

// fidelity of a quantized cache against a full-precision shadow of the same
// history, over sampled (layer, head, query) tuples, and over frames made
// again with the shadow as the history (docs/QUANT.md, "Audit mode")
struct DriftStats {
  // PSNR of identical frames, and the most any frame or pool of frames counts for
  static constexpr double kPsnrCapDb = 60.0;

  int64_t queries = 0;            // sampled tuples
  int64_t top1_mismatches = 0;    // argmax over cached tokens differs
  double topk_overlap_sum = 0;    // sum of |top-k ∩ top-k_ref| / k
  double logit_sq_err_sum = 0;    // sum of squared logit errors
  int64_t logits = 0;             // logits compared
  double output_rel_err_sum = 0;  // sum of ||o - o_ref|| / ||o_ref||
  int64_t frames = 0;             // served frames compared with their shadow frame
  double frame_sq_err_sum = 0;    // sum of squared 8-bit RGB differences over them
  int64_t frame_values = 0;       // 8-bit values compared
  double frame_psnr_min = kPsnrCapDb;  // the lowest PSNR of one frame, dB (capped)
  double drift() const { return queries > 0 ? static_cast<double>(top1_mismatches) / queries : 0.0; }
  // PSNR of the pooled squared error of every frame compared, dB (capped;
  // the cap too when none was compared)
  double frame_psnr() const;
  // adds one served frame and its shadow frame (8-bit RGB, `values` bytes each)
  void add_frame(const uint8_t* served, const uint8_t* shadow, size_t values);
  DriftStats& operator+=(const DriftStats& o) {
    queries += o.queries;
    top1_mismatches += o.top1_mismatches;
    topk_overlap_sum += o.topk_overlap_sum;
    logit_sq_err_sum += o.logit_sq_err_sum;
    logits += o.logits;
    output_rel_err_sum += o.output_rel_err_sum;
    frames += o.frames;
    frame_sq_err_sum += o.frame_sq_err_sum;
    frame_values += o.frame_values;
    frame_psnr_min = frame_psnr_min < o.frame_psnr_min ? frame_psnr_min : o.frame_psnr_min;
    return *this;
  }
};

// one sampled query of an attention call: query row `query` of head `head`
struct ProbeQuery {
  int head = 0;
  int query = 0;
};

// a drift probe's results per sample, computed where the caches live
// (KvCache::probe_against): of the logits q.k / sqrt(head_dim) against the
// layer's `tokens` cached tokens in frame order, the k largest in the
// reference and in the candidate (descending, the earlier token first on
// ties), the sum of squared differences and the reference's non-finite
// count; and both attention outputs over the cache and the block's own keys
struct ProbeRanks {
  int64_t tokens = 0;  // 0: nothing cached, nothing else is set
  int k = 0;           // min(topk, tokens)
  std::vector<int32_t> ref_top, cand_top;  // [samples][k]
  std::vector<double> sq_err;              // [samples]
  std::vector<int32_t> ref_nonfinite;      // [samples]
  std::vector<float> ref_out, cand_out;    // [samples][head_dim]
};

class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual absl::string_view format() const = 0;
  virtual const KvGeometry& geometry() const = 0;

  // attention of the current block for one layer: every query sees every
  // cached token and every token of its own block.
  //   q, k_cur, v_cur, out: [n, heads, head_dim]
  virtual void attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) = 0;

  // the write pass: clean K/V of `frames` consecutive frames starting at the
  // absolute frame index `first_frame`; frames older than the window (and not
  // sinks) are evicted. k, v: [frames * tokens_per_frame, heads, head_dim]
  virtual absl::Status append(int layer, const float* k, const float* v, int64_t first_frame, int frames) = 0;

  // every query the model computed for this session, in order (causal
  // statistics for query-aware formats). q: [n, heads, head_dim]
  virtual void observe_queries(int layer, const float* q, int n) {}

  virtual KvBytes bytes() const = 0;
  // absolute indices of the cached frames of one layer, ascending
  virtual std::vector<int64_t> frames(int layer) const = 0;
  // reconstruction of the cached K/V of one layer, [tokens, heads, head_dim]
  // in frame order: for probes and tests, never on the attention path
  virtual void reconstruct(int layer, std::vector<float>* k, std::vector<float>* v) const = 0;
  // the drift probes of sampled queries of one attention call (arguments
  // as attend's) of this cache against `reference`, a full-precision cache
  // of the same frames, computed where both live: a device pair ranks the
  // logits on the device and only the results come back (docs/CUDA.md).
  // False: not for this pair (host caches are probed from reconstruct()),
  // or it failed (the probe is then skipped)
  virtual bool probe_against(const KvCache& reference, int layer, const float* q, const float* k_cur,
                             const float* v_cur, int n, const std::vector<ProbeQuery>& samples, int topk,
                             ProbeRanks* out) const {
    return false;
  }
  // drift measured so far, for audited caches (others: null)
  virtual const DriftStats* drift() const { return nullptr; }
};

// the formats a client may pick: "fp32", "fp16", "kivi2", "qvg2", "quantwm2"
std::vector<std::string> kv_formats();
// every name make_kv_cache accepts: the formats plus their ablations,
// "<format>-k" (keys quantized, values fp16), "<format>-v" (values only),
// "quantwm2-qsac" (QSAC without PSAC), "quantwm2-psac" (PSAC without QSAC)
// and those two with -k / -v
std::vector<std::string> kv_format_variants();
bool kv_format_known(absl::string_view format);
// the options a format name implies on top of `base` (error: unknown name)
absl::StatusOr<KvFormatOptions> kv_format_options(absl::string_view format, const KvFormatOptions& base = {});
// whether `format` can hold a cache of `geometry` with `options`: the
// format's own checks (e.g. "qvg2: block 128 does not divide head_dim 64");
// NOT_FOUND for an unknown format
absl::Status kv_format_check(absl::string_view format, const KvGeometry& geometry, const KvFormatOptions& options = {});
absl::StatusOr<std::unique_ptr<KvCache>> make_kv_cache(absl::string_view format, const KvGeometry& geometry,
                                                       const KvFormatOptions& options = {});
// the most bytes a session in this format can ever hold (admission reserves
// it); 0 for an unknown name or options the format rejects. The low-bit
// formats' answer comes from a replay of their bookkeeping (seconds on long
// windows), kept for the process: a second question with the same format,
// geometry and options replays nothing
int64_t kv_format_max_bytes(absl::string_view format, const KvGeometry& geometry, const KvFormatOptions& options = {});
// how many replays kv_format_max_bytes has run in this process
int64_t kv_format_max_bytes_replays();
// the fixed bytes a CPU cache of this format allocates beside what bytes()
// and the reservation count: the span formats' query statistics, a lower
// triangle of doubles per (layer, head) (qvg2 holds them too, unused); 0 for
// the others and for an unknown name
int64_t kv_format_statistics_bytes(absl::string_view format, const KvGeometry& geometry,
                                   const KvFormatOptions& options = {});
// OK when an append of `first_frame` continues a layer that holds `frames_appended` frames, else
// FAILED_PRECONDITION naming the cache `name` and the layer
absl::Status check_append_order(absl::string_view name, int layer, int64_t first_frame, int64_t frames_appended);

}  // namespace wm
