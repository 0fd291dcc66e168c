#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "quant/kv_cache.h"
#include "quant/kv_fp.h"

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

std::vector<std::string> kv_formats() { return {"fp32", "fp16"}; }

bool kv_format_known(absl::string_view format) {
  const auto f = kv_formats();
  return std::find(f.begin(), f.end(), format) != f.end();
}

absl::StatusOr<std::unique_ptr<KvCache>> make_kv_cache(absl::string_view format, const KvGeometry& g,
                                                       const KvFormatOptions& options) {
  if (g.layers <= 0 || g.heads <= 0 || g.head_dim <= 0 || g.tokens_per_frame <= 0 || g.window_frames <= 0)
    return absl::InvalidArgumentError("kv cache: bad geometry");
  if (format == "fp32") return make_fp32_cache(g);
  if (format == "fp16") return make_fp16_cache(g);
  return absl::NotFoundError(
      absl::StrCat("unknown cache format '", format, "'; known: ", absl::StrJoin(kv_formats(), ", ")));
}

int64_t kv_format_max_bytes(absl::string_view format, const KvGeometry& g, const KvFormatOptions& options) {
  const int64_t values = g.values_per_frame() * g.max_frames();
  if (format == "fp32") return values * 4;
  return values * 2;
}

}  // namespace wm
