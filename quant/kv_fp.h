// fp32 and fp16 KV caches (the references every 2-bit format is measured against).
#pragma once

#include <memory>

#include "quant/kv_cache.h"

namespace wm {

std::unique_ptr<KvCache> make_fp32_cache(const KvGeometry& g);
std::unique_ptr<KvCache> make_fp16_cache(const KvGeometry& g);

}  // namespace wm
