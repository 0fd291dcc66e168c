// The format registry: names, the options a name implies, construction and
// the worst-case bytes admission reserves.
#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "quant/kv_cache.h"
#include "quant/kv_fp.h"
#include "quant/kv_kivi.h"
#include "quant/kv_ledger.h"
#include "quant/kv_options.h"
#include "quant/kv_span.h"

namespace wm {

KvBytes& KvBytes::operator+=(const KvBytes& o) {
  fp_values += o.fp_values;
  codes += o.codes;
  scales += o.scales;
  zeros += o.zeros;
  centroids += o.centroids;
  ids += o.ids;
  bases += o.bases;
  coeffs += o.coeffs;
  return *this;
}

namespace {

enum class Family { fp32, fp16, kivi, qvg, quantwm };

struct Parsed {
  Family family;
  KvFormatOptions options;
};

absl::StatusOr<Parsed> parse(absl::string_view name, const KvFormatOptions& base) {
  Parsed p{Family::fp16, base};
  if (name == "fp32") return Parsed{Family::fp32, base};
  if (name == "fp16") return Parsed{Family::fp16, base};
  absl::string_view rest = name;
  // side suffix: -k keys only, -v values only
  if (absl::EndsWith(rest, "-k")) {
    p.options.quantize_values = false;
    rest.remove_suffix(2);
  } else if (absl::EndsWith(rest, "-v")) {
    p.options.quantize_keys = false;
    rest.remove_suffix(2);
  }
  if (rest == "kivi2") {
    p.family = Family::kivi;
  } else if (rest == "qvg2") {
    p.family = Family::qvg;
  } else if (rest == "quantwm2") {
    p.family = Family::quantwm;
  } else if (rest == "quantwm2-qsac") {
    p.family = Family::quantwm;
    p.options.psac = false;
  } else if (rest == "quantwm2-psac") {
    p.family = Family::quantwm;
    p.options.qsac = false;
  } else {
    return absl::NotFoundError(
        absl::StrCat("unknown cache format '", name, "'; known: ", absl::StrJoin(kv_format_variants(), ", ")));
  }
  // what the format does not use is off, so that it is neither validated nor replayed
  if (p.family != Family::quantwm) p.options.qsac = p.options.psac = false;
  if (!p.options.quantize_keys) p.options.psac = false;  // PSAC corrects key logits
  return p;
}

absl::Status validate(const Parsed& p, const KvGeometry& g) {
  if (g.layers <= 0 || g.heads <= 0 || g.head_dim <= 0 || g.tokens_per_frame <= 0 || g.window_frames <= 0 ||
      g.sink_frames < 0 || g.frames_per_block <= 0)
    return absl::InvalidArgumentError("kv cache: bad geometry");
  if (g.head_dim % 8 != 0) return absl::InvalidArgumentError("kv cache: head_dim must be a multiple of 8");
  switch (p.family) {
    case Family::kivi: return kivi_validate(g, p.options);
    case Family::qvg:
    case Family::quantwm: return span_validate(g, p.options);
    default: return absl::OkStatus();
  }
}

// enough frames for the ledger to pass through every state it can reach;
// only the family's own options count (a KIVI cache ignores span_frames, a
// span cache kivi_residual), so an unused option cannot stretch the replay
int64_t horizon_frames(Family family, const KvGeometry& g, const KvFormatOptions& o) {
  const int64_t base = g.sink_frames + 4 * static_cast<int64_t>(g.window_frames) + 64;
  if (family == Family::kivi) return base + 4 * static_cast<int64_t>(g.frames_per_block) + 2 * o.kivi_residual;
  const int64_t span = std::max(o.span_frames, g.frames_per_block);
  const int64_t refresh = o.psac ? o.psac_refresh_frames : 1;
  const int64_t period = std::lcm(std::lcm<int64_t>(span, refresh), g.frames_per_block);
  return base + 4 * period;
}

}  // namespace

std::vector<std::string> kv_formats() { return {"fp32", "fp16", "kivi2", "qvg2", "quantwm2"}; }

std::vector<std::string> kv_format_variants() {
  std::vector<std::string> out = {"fp32", "fp16"};
  for (const char* base : {"kivi2", "qvg2", "quantwm2", "quantwm2-qsac", "quantwm2-psac"})
    for (const char* side : {"", "-k", "-v"}) out.push_back(absl::StrCat(base, side));
  return out;
}

bool kv_format_known(absl::string_view format) { return parse(format, {}).ok(); }

absl::Status check_append_order(absl::string_view name, int layer, int64_t first_frame, int64_t frames_appended) {
  if (first_frame == frames_appended) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(name, ": frame ", first_frame, " appended to layer ", layer,
                                                    " after ", frames_appended, " frames"));
}

absl::StatusOr<KvFormatOptions> kv_format_options(absl::string_view format, const KvFormatOptions& base) {
  auto p = parse(format, base);
  if (!p.ok()) return p.status();
  return p->options;
}

absl::Status kv_format_check(absl::string_view format, const KvGeometry& g, const KvFormatOptions& options) {
  auto p = parse(format, options);
  if (!p.ok()) return p.status();
  if (auto st = validate(*p, g); !st.ok()) return absl::InvalidArgumentError(absl::StrCat(format, ": ", st.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCache>> make_kv_cache(absl::string_view format, const KvGeometry& g,
                                                       const KvFormatOptions& options) {
  WM_RETURN_IF_ERROR(kv_format_check(format, g, options));
  auto p = parse(format, options);
  switch (p->family) {
    case Family::fp32: return make_fp32_cache(g);
    case Family::fp16: return make_fp16_cache(g);
    case Family::kivi: return make_kivi_cache(std::string(format), g, p->options);
    case Family::qvg: return make_span_cache(std::string(format), g, p->options, false);
    case Family::quantwm: return make_span_cache(std::string(format), g, p->options, true);
  }
  return absl::InternalError("unreachable");
}

namespace {

// every field the worst case may depend on; a new option must join it
std::string max_bytes_key(Family family, const KvGeometry& g, const KvFormatOptions& o) {
  static_assert(sizeof(KvFormatOptions) == 72, "a new KvFormatOptions field must join max_bytes_key");
  return absl::StrCat(static_cast<int>(family), " ", g.layers, " ", g.heads, " ", g.head_dim, " ", g.tokens_per_frame,
                      " ", g.window_frames, " ", g.sink_frames, " ", g.frames_per_block, " ", o.kivi_group, " ",
                      o.kivi_residual, " ", o.span_frames, " ", o.centroids, " ", o.tokens_per_centroid, " ", o.block,
                      " ", o.kmeans_iters, " ", o.kmeans_seed, " ", o.quantize_sinks, " ", o.qsac, " ", o.psac, " ",
                      o.psac_rank, " ", o.psac_bits, " ", o.psac_refresh_frames, " ", o.qsac_candidates, " ",
                      o.qsac_weight_floor, " ", o.quantize_keys, " ", o.quantize_values);
}

// the worst case of a parsed, validated low-bit format. Every layer holds
// the same frames: replay one layer's ledger over a session long enough to
// reach every state and read the bytes held between appends (the transient
// inside one append -- a span's fp16 frames while they are coded -- is never
// held between engine calls). The engine appends whole blocks, except that a
// prompt's last chunk may be shorter: every position and length of that one
// short append is replayed too.
std::mutex replay_mutex;
std::map<std::string, int64_t> replayed;  // max_bytes_key -> bytes, under replay_mutex
int64_t replays = 0;                      // under replay_mutex

int64_t replay_max_bytes(const Parsed& p, const KvGeometry& g) {
  const int64_t horizon = horizon_frames(p.family, g, p.options);
  const int B = g.frames_per_block;
  std::vector<std::vector<int>> patterns;
  for (int r = 0; r < B; ++r)
    for (int64_t q = 0; q == 0 || (r > 0 && q * B < horizon / 2); ++q) {
      std::vector<int> calls(static_cast<size_t>(q), B);
      if (r > 0) calls.push_back(r);
      patterns.push_back(std::move(calls));
    }
  int64_t most = 0;
  for (const auto& prefix : patterns) {
    auto call_size = [&](size_t i) { return i < prefix.size() ? prefix[i] : B; };
    if (p.family == Family::kivi) {
      KiviLedger ledger(kivi_plan(g, p.options));
      for (size_t i = 0; ledger.frames_appended() < horizon; ++i) {
        for (int f = 0; f < call_size(i); ++f) ledger.add_frame(ledger.frames_appended());
        most = std::max(most, ledger.bytes().total());
      }
    } else {
      // with PSAC the worst case has a basis from the first span on
      SpanLedger ledger(span_plan(g, p.options, p.family == Family::quantwm));
      for (size_t i = 0; ledger.frames_appended() < horizon; ++i) {
        for (int f = 0; f < call_size(i); ++f) ledger.add_frame(ledger.frames_appended());
        ledger.end_append(/*queries_seen=*/true);
        most = std::max(most, ledger.bytes().total());
      }
    }
  }
  return most * g.layers;
}

}  // namespace

int64_t kv_format_max_bytes(absl::string_view format, const KvGeometry& g, const KvFormatOptions& options) {
  auto p = parse(format, options);
  if (!p.ok() || !validate(*p, g).ok()) return 0;
  const int64_t values = g.values_per_frame() * g.max_frames();
  if (p->family == Family::fp32) return values * 4;
  if (p->family == Family::fp16) return values * 2;
  // a pure function of its arguments whose replay takes seconds on long
  // windows (every short append's position over the whole horizon), and the
  // engine asks at every session's open, on the server's engine thread: each
  // answer is kept (a process sees a few geometries; the table is bounded)
  const std::string key = max_bytes_key(p->family, g, p->options);
  {
    std::lock_guard<std::mutex> lk(replay_mutex);
    if (auto it = replayed.find(key); it != replayed.end()) return it->second;
  }
  // replayed outside the lock: another thread's question waits for nothing
  const int64_t most = replay_max_bytes(*p, g);
  std::lock_guard<std::mutex> lk(replay_mutex);
  ++replays;
  if (replayed.size() >= 1024) replayed.clear();
  replayed.emplace(key, most);
  return most;
}

int64_t kv_format_max_bytes_replays() {
  std::lock_guard<std::mutex> lk(replay_mutex);
  return replays;
}

int64_t kv_format_statistics_bytes(absl::string_view format, const KvGeometry& g, const KvFormatOptions& options) {
  auto p = parse(format, options);
  if (!p.ok() || (p->family != Family::qvg && p->family != Family::quantwm)) return 0;
  // as SpanLayer holds them: a QueryStats per (layer, head)
  const int64_t lower = static_cast<int64_t>(g.head_dim) * (g.head_dim + 1) / 2;
  return int64_t{g.layers} * g.heads * lower * static_cast<int64_t>(sizeof(double));
}

}  // namespace wm
