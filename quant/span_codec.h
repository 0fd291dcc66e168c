// Encoding of one (span, kv head, side) of the span formats, QVG-2 and
// QuantWM-2 (docs/QUANT.md): k-means centroids, a per-token centroid id, a
// 2-bit symmetric residual per block of B channels with an fp8 scale, and
// for QuantWM keys the PSAC coefficients of what is left. Pure functions on
// host memory, shared by the caches, their tests and wmquant.
#pragma once

#include <cstdint>
#include <vector>

namespace wm {

struct SpanCodecParams {
  int block = 64;                  // B: channels per residual scale (16, 32, 64 or 128; divides head_dim)
  int centroids = 1;               // k (<= 256; clamped to the token count)
  int iters = 4;                   // Lloyd iterations
  uint64_t seed = 1;
  const float* weights = nullptr;  // [d] QSAC channel weights; null: uniform (QVG)
  int candidates = 1;              // nearest centroids tried per token (QSAC's int2-friendly choice)
  const float* basis = nullptr;    // [kPsacRank, d] PSAC basis, fp16-rounded values; null: no PSAC
  int coeff_bits = 8;              // PSAC coefficient bits: 8 or 4
};

// one (span, head, side); tokens are rows, in frame order
struct SpanHeadCodes {
  int k = 0;                        // centroids
  std::vector<uint16_t> centroids;  // [k, d] fp16
  std::vector<uint8_t> ids;         // [tokens] centroid of each token
  std::vector<uint8_t> blocks;      // [tokens, d / B] BlockQ2Sym<B>
  std::vector<uint8_t> coeffs;      // [tokens] PsacCoeffsI8/I4<kPsacRank>; empty without PSAC
};

// the k-means seed of one (span, head, side) of a layer: every cache that
// codes the span formats (the CPU's, the CUDA backend's) seeds with this
uint64_t span_seed(uint64_t kmeans_seed, int layer, int head, int side, int64_t first_frame);

// bytes of one token's residual blocks and of one PSAC record
int span_block_bytes(int head_dim, int block);
int span_coeff_bytes(int coeff_bits);

// x: [n, d] rows with row stride `stride`
void span_encode(const float* x, int n, int d, int stride, const SpanCodecParams& p, SpanHeadCodes* out);

// one block of residuals (block = 16, 32, 64 or 128 values) as the coder
// quantizes it: the bytes and the error of q2sym_quantize_ref (kv_layouts.h)
// bit for bit, with the candidate scales tried side by side where the CPU
// has AVX2; out: 1 + block / 4 bytes
float span_quantize_residual(const float* x, const float* w, int block, uint8_t* out);

// the scalar reference decoder (PSAC folded into the keys: k = centroid +
// residual + basis^T alpha); out: [n, d] rows with stride `stride`
void span_decode_ref(const SpanHeadCodes& c, int n, int d, int block, int coeff_bits, const float* basis,
                     float* out, int stride);

// frees the per-token data of the first `tokens` tokens (eviction)
void span_drop_front(SpanHeadCodes* c, int tokens, int head_dim, int block, int coeff_bits);

}  // namespace wm
