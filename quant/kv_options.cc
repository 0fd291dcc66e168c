#include "quant/kv_options.h"

#include <cstdint>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace wm {
namespace {

// one integer knob: its name, its field and the values it may take
struct IntKnob {
  const char* name;
  int KvFormatOptions::*field;
  int lo, hi;
  std::vector<int> one_of;  // if set, the only values allowed
};

const std::vector<IntKnob>& int_knobs() {
  static const std::vector<IntKnob> knobs = {
      {"span_frames", &KvFormatOptions::span_frames, 0, kMaxPsacRefreshFrames, {}},
      {"centroids", &KvFormatOptions::centroids, 1, 256, {}},
      {"tokens_per_centroid", &KvFormatOptions::tokens_per_centroid, 1, 1 << 20, {}},
      {"block", &KvFormatOptions::block, 16, 128, {16, 32, 64, 128}},
      {"kmeans_iters", &KvFormatOptions::kmeans_iters, 0, kMaxKmeansIters, {}},
      {"psac_bits", &KvFormatOptions::psac_bits, 4, 8, {4, 8}},
      {"psac_refresh_frames", &KvFormatOptions::psac_refresh_frames, 1, kMaxPsacRefreshFrames, {}},
      {"kivi_group", &KvFormatOptions::kivi_group, 32, 128, {32, 64, 128}},
      {"kivi_residual", &KvFormatOptions::kivi_residual, 32, kMaxKiviResidual, {}},
  };
  return knobs;
}

absl::Status bad(absl::string_view item, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("'", item, "': ", why));
}

}  // namespace

absl::StatusOr<KvFormatOptions> parse_kv_format_options(absl::string_view text, const KvFormatOptions& base) {
  KvFormatOptions o = base;
  std::vector<std::string> seen;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) {
      if (absl::StripAsciiWhitespace(text).empty()) break;
      return bad(item, "an empty item (a stray comma)");
    }
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) return bad(item, "expected name=value");
    const std::string name(absl::StripAsciiWhitespace(item.substr(0, eq)));
    const absl::string_view value = absl::StripAsciiWhitespace(item.substr(eq + 1));
    for (const auto& s : seen)
      if (s == name) return bad(item, "set twice");
    seen.push_back(name);
    if (name == "quantize_sinks") {
      if (value == "true" || value == "1") {
        o.quantize_sinks = true;
      } else if (value == "false" || value == "0") {
        o.quantize_sinks = false;
      } else {
        return bad(item, "quantize_sinks is true or false");
      }
      continue;
    }
    const IntKnob* knob = nullptr;
    for (const auto& k : int_knobs())
      if (name == k.name) knob = &k;
    if (knob == nullptr) {
      std::vector<std::string> names;
      for (const auto& k : int_knobs()) names.emplace_back(k.name);
      names.emplace_back("quantize_sinks");
      return bad(item, absl::StrCat("unknown option; known: ", absl::StrJoin(names, ", ")));
    }
    int64_t v = 0;
    if (!absl::SimpleAtoi(value, &v)) return bad(item, absl::StrCat(name, " is an integer"));
    if (!knob->one_of.empty()) {
      bool allowed = false;
      for (int a : knob->one_of) allowed = allowed || v == a;
      if (!allowed) return bad(item, absl::StrCat(name, " is one of ", absl::StrJoin(knob->one_of, ", ")));
    } else if (v < knob->lo || v > knob->hi) {
      return bad(item, absl::StrCat(name, " is within ", knob->lo, "..", knob->hi));
    }
    o.*(knob->field) = static_cast<int>(v);
  }
  return o;
}

std::string kv_format_options_text(const KvFormatOptions& o) {
  const KvFormatOptions d;
  std::vector<std::string> items;
  for (const auto& k : int_knobs())
    if (o.*(k.field) != d.*(k.field)) items.push_back(absl::StrCat(k.name, "=", o.*(k.field)));
  if (o.quantize_sinks != d.quantize_sinks) items.push_back(absl::StrCat("quantize_sinks=", o.quantize_sinks ? "true" : "false"));
  return absl::StrJoin(items, ",");
}

}  // namespace wm
