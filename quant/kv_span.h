// The span formats (docs/QUANT.md): QVG-2 and QuantWM-2 share one layout --
// per span of completed frames and per (layer, kv head, side): k-means
// centroids, a centroid id per token and a 2-bit residual per block of B
// channels with an fp8 scale. QuantWM-2 adds QSAC (query-weighted
// clustering and the int2-friendly centroid choice) and PSAC (a rank-8
// correction of the keys along the principal subspace of past queries,
// added to the logits in attention).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "quant/kv_cache.h"
#include "quant/kv_ledger.h"

namespace wm {

absl::Status span_validate(const KvGeometry& g, const KvFormatOptions& o);
// quantwm: QSAC/PSAC as the options say; otherwise plain QVG
SpanPlan span_plan(const KvGeometry& g, const KvFormatOptions& o, bool quantwm);
// `name` is what format() reports; options must have passed span_validate
std::unique_ptr<KvCache> make_span_cache(std::string name, const KvGeometry& g, const KvFormatOptions& o,
                                         bool quantwm);

}  // namespace wm
