// The format knobs as text: "block=32,psac_bits=4" sets KvFormatOptions
// fields by name (wmserve, wmgen and wmeval's --kv_options), and the
// canonical text of a set of options lists the fields that differ from the
// defaults. Parsing checks each value's type and its range (what the
// worst-case byte replay and k-means can afford); whether a format can use
// the options on a model's geometry is kv_format_check's answer (kv_cache.h).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "quant/kv_cache.h"

namespace wm {

// "" is the defaults; each "name=value" (comma-separated, spaces around
// either allowed) sets one field of `base`: span_frames, centroids,
// tokens_per_centroid, block, kmeans_iters, quantize_sinks (true/false),
// psac_bits, psac_refresh_frames, kivi_group, kivi_residual.
// INVALID_ARGUMENT names the item and what it must be.
absl::StatusOr<KvFormatOptions> parse_kv_format_options(absl::string_view text, const KvFormatOptions& base = {});

// the fields parse_kv_format_options knows that differ from the defaults,
// in a fixed order: parse_kv_format_options(kv_format_options_text(o))
// gives o back for those fields ("" for the defaults)
std::string kv_format_options_text(const KvFormatOptions& options);

}  // namespace wm
