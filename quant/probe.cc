#include "quant/probe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/image_metrics.h"

namespace wm {
namespace {

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// indices of the k largest, descending, smaller index first on ties, NaN
// last (the device probe's rule, cuda/kv_probe.cu): one pass that keeps
// the k best so far in order (k is a handful, s up to some 10^5 logits)
std::vector<int32_t> top_indices(const std::vector<double>& s, int k) {
  const auto at_ = [&](size_t j) { return std::isnan(s[j]) ? -INFINITY : s[j]; };
  std::vector<int32_t> idx;
  idx.reserve(static_cast<size_t>(k) + 1);
  for (size_t j = 0; j < s.size(); ++j) {
    const double x = at_(j);
    if (idx.size() == static_cast<size_t>(k) && !(x > at_(static_cast<size_t>(idx.back())))) continue;
    // behind every kept one at least as large: an equal one came first
    size_t at = idx.size();
    while (at > 0 && x > at_(static_cast<size_t>(idx[at - 1]))) --at;
    idx.insert(idx.begin() + static_cast<std::ptrdiff_t>(at), static_cast<int32_t>(j));
    if (idx.size() > static_cast<size_t>(k)) idx.pop_back();
  }
  return idx;
}

// softmax over history logits s [m] and the current block's logits, times V
void attention_output(const std::vector<double>& s, const std::vector<double>& s_cur, const float* v, const float* v_cur,
                      int stride, int d, std::vector<double>* out) {
  double mx = -INFINITY;
  for (double x : s) mx = std::max(mx, x);
  for (double x : s_cur) mx = std::max(mx, x);
  out->assign(static_cast<size_t>(d), 0.0);
  double z = 0;
  auto add = [&](double logit, const float* row) {
    const double p = std::exp(logit - mx);
    z += p;
    for (int c = 0; c < d; ++c) (*out)[static_cast<size_t>(c)] += p * row[c];
  };
  for (size_t j = 0; j < s.size(); ++j) add(s[j], v + j * stride);
  for (size_t j = 0; j < s_cur.size(); ++j) add(s_cur[j], v_cur + j * stride);
  for (double& x : *out) x /= z;
}

// one sample's statistics: both sides' top k, the squared logit errors
// summed over its m logits, both attention outputs
void add_ranked(const int32_t* tr, const int32_t* tq, int k, double sq_err, int64_t m, const double* orf,
                const double* oq, int d, DriftStats* stats) {
  stats->queries += 1;
  stats->top1_mismatches += tr[0] != tq[0] ? 1 : 0;
  int common = 0;
  for (int a = 0; a < k; ++a) common += std::count(tq, tq + k, tr[a]) > 0 ? 1 : 0;
  stats->topk_overlap_sum += static_cast<double>(common) / k;
  stats->logit_sq_err_sum += sq_err;
  stats->logits += m;
  double num = 0, den = 0;
  for (int c = 0; c < d; ++c) {
    num += (oq[c] - orf[c]) * (oq[c] - orf[c]);
    den += orf[c] * orf[c];
  }
  const double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  stats->output_rel_err_sum += std::isfinite(rel) ? rel : 0.0;
}

}  // namespace

double DriftStats::frame_psnr() const {
  if (frame_values == 0 || frame_sq_err_sum == 0) return kPsnrCapDb;
  const double mse = frame_sq_err_sum / static_cast<double>(frame_values);
  return std::min(kPsnrCapDb, 10.0 * std::log10(255.0 * 255.0 / mse));
}

void DriftStats::add_frame(const uint8_t* served, const uint8_t* shadow, size_t values) {
  if (values == 0) return;
  const double se = squared_error_u8(served, shadow, values);
  const double psnr =
      se == 0 ? kPsnrCapDb
              : std::min(kPsnrCapDb, 10.0 * std::log10(255.0 * 255.0 * static_cast<double>(values) / se));
  ++frames;
  frame_sq_err_sum += se;
  frame_values += static_cast<int64_t>(values);
  frame_psnr_min = std::min(frame_psnr_min, psnr);
}

std::vector<ProbeQuery> probe_sample(int n, int heads, int per_head, uint64_t seed) {
  std::vector<ProbeQuery> out;
  const int take = std::min(n, per_head);
  for (int h = 0; h < heads; ++h) {
    // a seeded partial Fisher-Yates shuffle of the query indices
    std::vector<int> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    for (int i = 0; i < take; ++i) {
      const uint64_t r = mix64(seed ^ mix64(static_cast<uint64_t>(h) * 1315423911ull + static_cast<uint64_t>(i)));
      const int j = i + static_cast<int>(r % static_cast<uint64_t>(n - i));
      std::swap(idx[static_cast<size_t>(i)], idx[static_cast<size_t>(j)]);
      out.push_back({h, idx[static_cast<size_t>(i)]});
    }
  }
  return out;
}

void probe_attention(const float* q, const float* k_cur, const float* v_cur, int n, int heads, int head_dim,
                     const float* ref_k, const float* ref_v, const float* quant_k, const float* quant_v, int m,
                     std::span<const ProbeQuery> samples, int topk, DriftStats* stats) {
  if (m <= 0) return;
  const int stride = heads * head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const int k = std::max(1, std::min(topk, m));
  std::vector<double> sr(static_cast<size_t>(m)), sq(static_cast<size_t>(m)), sc(static_cast<size_t>(n));
  std::vector<double> orf, oq;
  for (const ProbeQuery& p : samples) {
    if (p.head < 0 || p.head >= heads || p.query < 0 || p.query >= n) continue;
    const size_t off = static_cast<size_t>(p.head) * head_dim;
    const float* qi = q + static_cast<size_t>(p.query) * stride + off;
    bool finite = true;
    for (int j = 0; j < m; ++j) {
      sr[static_cast<size_t>(j)] = dot(qi, ref_k + static_cast<size_t>(j) * stride + off, head_dim) * scale;
      sq[static_cast<size_t>(j)] = dot(qi, quant_k + static_cast<size_t>(j) * stride + off, head_dim) * scale;
      finite = finite && std::isfinite(sr[static_cast<size_t>(j)]);
    }
    for (int j = 0; j < n; ++j) {
      sc[static_cast<size_t>(j)] = dot(qi, k_cur + static_cast<size_t>(j) * stride + off, head_dim) * scale;
      finite = finite && std::isfinite(sc[static_cast<size_t>(j)]);
    }
    if (!finite) continue;
    attention_output(sr, sc, ref_v + off, v_cur + off, stride, head_dim, &orf);
    attention_output(sq, sc, quant_v + off, v_cur + off, stride, head_dim, &oq);
    const auto tr = top_indices(sr, k), tq = top_indices(sq, k);
    double sq_err = 0;
    for (int j = 0; j < m; ++j) {
      const double e = sq[static_cast<size_t>(j)] - sr[static_cast<size_t>(j)];
      sq_err += std::isfinite(e) ? e * e : 0.0;
    }
    add_ranked(tr.data(), tq.data(), k, sq_err, m, orf.data(), oq.data(), head_dim, stats);
  }
}

bool probe_ranks_stats(const ProbeRanks& r, size_t samples, int head_dim, DriftStats* stats) {
  if (r.tokens <= 0) return r.tokens == 0;
  const auto k = static_cast<size_t>(r.k), d = static_cast<size_t>(head_dim);
  if (r.k < 1 || r.ref_top.size() != samples * k || r.cand_top.size() != samples * k ||
      r.sq_err.size() != samples || r.ref_nonfinite.size() != samples || r.ref_out.size() != samples * d ||
      r.cand_out.size() != samples * d)
    return false;
  std::vector<double> orf(d), oq(d);
  for (size_t i = 0; i < samples; ++i) {
    bool finite = r.ref_nonfinite[i] == 0;
    for (size_t c = 0; c < d; ++c) {
      orf[c] = r.ref_out[i * d + c];
      oq[c] = r.cand_out[i * d + c];
      finite = finite && std::isfinite(orf[c]);
    }
    if (finite)
      add_ranked(r.ref_top.data() + i * k, r.cand_top.data() + i * k, r.k, r.sq_err[i], r.tokens, orf.data(),
                 oq.data(), head_dim, stats);
  }
  return true;
}

bool probe_caches(const KvCache& reference, const KvCache& candidate, int layer, const float* q, const float* k_cur,
                  const float* v_cur, int n, std::span<const ProbeQuery> samples, int topk, DriftStats* stats) {
  if (reference.frames(layer) != candidate.frames(layer)) return false;
  const KvGeometry& g = reference.geometry();
  std::vector<float> rk, rv, ck, cv;
  reference.reconstruct(layer, &rk, &rv);
  candidate.reconstruct(layer, &ck, &cv);
  if (rk.size() != ck.size()) return false;
  const int m = static_cast<int>(rk.size() / (static_cast<size_t>(g.heads) * g.head_dim));
  probe_attention(q, k_cur, v_cur, n, g.heads, g.head_dim, rk.data(), rv.data(), ck.data(), cv.data(), m, samples,
                  topk, stats);
  return true;
}

}  // namespace wm
