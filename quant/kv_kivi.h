// KIVI-2 (docs/QUANT.md): keys per channel over groups of G tokens, values
// per token over groups of G channels, 2-bit asymmetric min-max with fp16
// scale and zero; the newest tokens stay fp16 until R of them gathered.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "quant/kv_cache.h"
#include "quant/kv_ledger.h"

namespace wm {

absl::Status kivi_validate(const KvGeometry& g, const KvFormatOptions& o);
KiviPlan kivi_plan(const KvGeometry& g, const KvFormatOptions& o);
// `name` is what format() reports; options must have passed kivi_validate
std::unique_ptr<KvCache> make_kivi_cache(std::string name, const KvGeometry& g, const KvFormatOptions& o);

}  // namespace wm
