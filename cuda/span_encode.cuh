// The QVG-2 / QuantWM-2 coder on the device: what quant/span_codec.cc's
// span_encode does on the host (weighted k-means++ seeding, trimmed Lloyd
// iterations, the QSAC candidate choice, 2-bit residual blocks with fp8
// scales, PSAC coefficients): the seeding and each Lloyd update one CTA per
// (span, head, side), the Lloyd assignments and the tokens' codes a thread
// per token over as many CTAs as they fill; the same operations in the same
// order, so that the codes are the CPU's bit for bit.
// Both sides are built without contracting a multiply and an add into one
// FMA (the CPU coder with -ffp-contract=off, this unit with --fmad=false),
// since the host compiler and nvcc would fuse different pairs.
//
// What it writes is the write pass's staging image (kv_append.cuh,
// KvSpanWrite): each token's record (residual blocks, centroid id, PSAC
// record) into the image of the frame that holds it, and the span's table
// (fp16 centroids; the fp16 basis for keys with PSAC) into the image of
// its first stored frame. The host still runs the bookkeeping that decides
// spans, seeds and bases (kv_span_host.h); the QSAC weights are made on
// the device from the query statistics (query_gram.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace wm::cuda {

// the coder's limits: local arrays per thread are this large
inline constexpr int kSpanMaxHeadDim = 128;
inline constexpr int kSpanMaxCandidates = 16;
inline constexpr int kSpanMaxCentroids = 256;

// one (span, head, side)
struct SpanEncodeJob {
  const float* x = nullptr;  // device: the span's first token of this head; rows `row_stride` floats apart
  int32_t n = 0;             // tokens (frames * tokens_per_frame)
  int32_t centroids = 1;     // asked (clamped to [1, min(256, n)] as the CPU's kmeans does)
  int32_t candidates = 1;    // QSAC: nearest centroids tried per token (<= kSpanMaxCandidates)
  int32_t iters = 0;         // Lloyd iterations
  int32_t side = 0;          // 0 keys, 1 values
  int32_t head = 0;
  int32_t first_image = 0;   // index in frame_images of the span's first frame
  uint64_t seed = 0;
  int64_t weights = -1;      // offset in params of [head_dim] QSAC weights and their flag (query_gram.cuh:
                             // QsacWeightsJob); -1, or a flag of 0: uniform
  int64_t basis = -1;        // offset in params of [8][head_dim] fp16-valued PSAC basis; -1: none
  int64_t scratch = 0;       // byte offset of this job's scratch (span_encode_scratch_bytes, 16-aligned)
  int64_t given = -1;        // offset in SpanEncodeArgs::given of [k][head_dim] centroids that k-means made
                             // elsewhere (the host: tuning "span.coder" 1): the tokens are coded against
                             // them and no k-means runs here; -1: k-means here
};

struct SpanEncodeArgs {
  const SpanEncodeJob* jobs = nullptr;  // device [n_jobs]
  const SpanEncodeJob* host_jobs = nullptr;  // the same on the host (the launch sizes its grid by them)
  int32_t n_jobs = 0;
  const int64_t* frame_images = nullptr;  // device: byte offset in `image` of a frame's image; -1: not stored
  const float* params = nullptr;          // device: weights and bases
  const float* given = nullptr;           // device: the jobs' given centroids (SpanEncodeJob::given)
  uint8_t* image = nullptr;               // device: the write pass's staging image
  uint8_t* scratch = nullptr;             // device
  int32_t row_stride = 0;                 // floats between a head's consecutive tokens (heads * head_dim)
  int32_t head_dim = 0, block = 0, coeff_bits = 8;
  int32_t tokens_per_frame = 0, heads = 0;
  // the image's geometry (kv_append.cuh: span_token_bytes, span_tables_at; SpanRowLayout)
  int32_t token_bytes = 0, rec_bytes = 0;
  int64_t tables_at = 0, table_bytes = 0, v_table = 0, basis_table = 0;
  // 0: each kernel's own block size and grid; whole warps up to 512: every
  // kernel with blocks of this many threads and one CTA per job; 1: one
  // thread per job, every loop of the coder in order in it (tuning
  // "span.threads": a diagnostic, the codes are the same either way)
  int32_t threads = 0;
};

// scratch bytes of one job of n tokens (a multiple of 16)
size_t span_encode_scratch_bytes(int32_t n, int32_t head_dim);

cudaError_t launch_span_encode(const SpanEncodeArgs& a, cudaStream_t stream);

}  // namespace wm::cuda
