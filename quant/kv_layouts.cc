#include "quant/kv_layouts.h"

namespace wm {
namespace {

template <class Block, void (*Q)(const float*, Block*), void (*D)(const Block&, float*)>
constexpr KvBlockTraits traits(const char* name, int values) {
  return KvBlockTraits{name,
                       values,
                       static_cast<int>(sizeof(Block)),
                       8.0 * sizeof(Block) / values,
                       [](const float* x, void* b) { Q(x, static_cast<Block*>(b)); },
                       [](const void* b, float* x) { D(*static_cast<const Block*>(b), x); }};
}

template <int B>
void q2sym_quantize_uniform(const float* x, BlockQ2Sym<B>* b) {
  q2sym_quantize_ref<B>(x, nullptr, b);
}

const KvBlockTraits kTraits[] = {
    traits<BlockQ2Asym<32>, q2asym_quantize_ref<32>, q2asym_dequantize_ref<32>>("q2asym32", 32),
    traits<BlockQ2Asym<64>, q2asym_quantize_ref<64>, q2asym_dequantize_ref<64>>("q2asym64", 64),
    traits<BlockQ2Asym<128>, q2asym_quantize_ref<128>, q2asym_dequantize_ref<128>>("q2asym128", 128),
    traits<BlockQ2Sym<16>, q2sym_quantize_uniform<16>, q2sym_dequantize_ref<16>>("q2sym16", 16),
    traits<BlockQ2Sym<32>, q2sym_quantize_uniform<32>, q2sym_dequantize_ref<32>>("q2sym32", 32),
    traits<BlockQ2Sym<64>, q2sym_quantize_uniform<64>, q2sym_dequantize_ref<64>>("q2sym64", 64),
    traits<BlockQ2Sym<128>, q2sym_quantize_uniform<128>, q2sym_dequantize_ref<128>>("q2sym128", 128),
    traits<PsacCoeffsI8<kPsacRank>, psac_quantize_ref<PsacCoeffsI8<kPsacRank>>,
           psac_dequantize_ref<PsacCoeffsI8<kPsacRank>>>("psac8i8", kPsacRank),
    traits<PsacCoeffsI4<kPsacRank>, psac_quantize_ref<PsacCoeffsI4<kPsacRank>>,
           psac_dequantize_ref<PsacCoeffsI4<kPsacRank>>>("psac8i4", kPsacRank),
};

}  // namespace

std::span<const KvBlockTraits> kv_block_traits() { return kTraits; }

const KvBlockTraits* kv_block_traits(absl::string_view name) {
  for (const auto& t : kTraits)
    if (name == t.name) return &t;
  return nullptr;
}

}  // namespace wm
