#include "engine/model_config.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/image_io.h"
#include "common/json_scan.h"
#include "common/status_macros.h"

namespace wm {
namespace {

using json = nlohmann::json;

class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  absl::Status error(absl::string_view field, absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": field '", field, "' ", why));
  }
  const json* find(absl::string_view path) const {
    const json* cur = &j_;
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string key(path.substr(start, dot == absl::string_view::npos ? absl::string_view::npos : dot - start));
      if (!cur->is_object() || !cur->contains(key)) return nullptr;
      cur = &(*cur)[key];
      if (dot == absl::string_view::npos) return cur;
      start = dot + 1;
    }
  }
  absl::Status get_int(absl::string_view path, int lo, int hi, int* out) const {
    const json* v = find(path);
    if (v == nullptr) return error(path, "is missing");
    if (!v->is_number_integer()) return error(path, "must be an integer");
    // a uint64 above INT64_MAX reads negative here and fails the range, so
    // the message quotes the value as written, not as read
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return error(path, absl::StrCat("= ", v->dump(), " is outside [", lo, ", ", hi, "]"));
    *out = static_cast<int>(x);
    return absl::OkStatus();
  }
  absl::Status get_float(absl::string_view path, double lo, double hi, float* out) const {
    const json* v = find(path);
    if (v == nullptr) return error(path, "is missing");
    if (!v->is_number()) return error(path, "must be a number");
    const double x = v->get<double>();
    // quoted as written: six digits would print 9.9999e-13 as the bound 1e-12
    if (!std::isfinite(x) || x < lo || x > hi)
      return error(path, absl::StrCat("= ", v->dump(), " is outside [", lo, ", ", hi, "]"));
    *out = static_cast<float>(x);
    return absl::OkStatus();
  }
  absl::Status get_string(absl::string_view path, std::string* out) const {
    const json* v = find(path);
    if (v == nullptr) return error(path, "is missing");
    if (!v->is_string()) return error(path, "must be a string");
    *out = v->get<std::string>();
    return absl::OkStatus();
  }
  absl::Status get_strings(absl::string_view path, size_t lo, size_t hi, std::vector<std::string>* out) const {
    const json* v = find(path);
    if (v == nullptr) return error(path, "is missing");
    if (!v->is_array() || v->size() < lo || v->size() > hi)
      return error(path, absl::StrCat("must be an array of ", lo, "..", hi, " strings"));
    out->clear();
    for (const auto& e : *v) {
      if (!e.is_string() || e.get<std::string>().empty() || e.get<std::string>().size() > 32)
        return error(path, "holds something that is not a short non-empty string");
      out->push_back(e.get<std::string>());
    }
    return absl::OkStatus();
  }

 private:
  const json& j_;
  std::string source_;
};

// a float as the shortest decimal that reads back as the same float: written
// as its exact double, 1e-6f would read 9.99999997e-07 and fall below the
// range the config was checked against
double shortest_decimal(float f) {
  char text[32];
  for (int digits = 1; digits < 9; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(text, nullptr) == f) return std::strtod(text, nullptr);
  }
  return static_cast<double>(f);
}

}  // namespace

int64_t ModelConfig::parameter_count() const {
  const int64_t D = dim, P = patch_dim(), A = actions.input_width(), Q = qkv_dim(), F = ffn;
  int64_t n = D * P + D + D * freq_dim + D + D * D + D + D * A + D + D * D + D + 6 * D * D + 6 * D;
  const int64_t per_layer = 6 * D + 3 * (Q * D + Q) + 2 * head_dim + D * Q + D + F * D + F + D * F + D;
  n += layers * per_layer;
  n += 2 * D + P * D + P;
  return n;
}

absl::StatusOr<ModelConfig> parse_model_config(absl::string_view json_text, const std::string& source) {
  if (json_text.size() > (1u << 20)) return absl::InvalidArgumentError(absl::StrCat(source, ": config larger than 1 MiB"));
  // the parser takes a NUL for the end of its input: what follows would go unread
  if (const size_t nul = json_text.find('\0'); nul != absl::string_view::npos)
    return absl::InvalidArgumentError(absl::StrCat(source, ": holds a NUL byte at offset ", nul, " (damaged?)"));
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    // e.what() names the byte and what was expected there
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  // nlohmann keeps the last of a key given twice: "dim" twice would load
  // the second and blame a tensor's shape for it
  WM_RETURN_IF_ERROR(scan_json(json_text, {int64_t{1} << 20, 64}, source));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  Reader r(j, source);
  ModelConfig c;
  std::string format;
  WM_RETURN_IF_ERROR(r.get_string("format", &format));
  if (format != "wmserve-cldit")
    return r.error("format", absl::StrCat("is ", quote_text(format), ", expected 'wmserve-cldit'"));
  int version = 0;
  WM_RETURN_IF_ERROR(r.get_int("version", 1, 1, &version));
  WM_RETURN_IF_ERROR(r.get_string("name", &c.name));
  if (c.name.empty() || c.name.size() > 64) return r.error("name", "must have 1..64 bytes of UTF-8");
  // it goes into logs, metric labels, status messages and terminals: no
  // C0 or C1 control, and no bidirectional control that reorders the text
  // around it (the parser has checked the UTF-8)
  for (size_t i = 0; i < c.name.size();) {
    const auto b = static_cast<unsigned char>(c.name[i]);
    const int len = b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
    uint32_t cp = len == 1 ? b : b & (0x7f >> len);
    for (int k = 1; k < len && i + k < c.name.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(c.name[i + k]) & 0x3f);
    i += static_cast<size_t>(len);
    if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) return r.error("name", "holds a control character");
    if (cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069))
      return r.error("name", "holds a bidirectional control character");
  }
  WM_RETURN_IF_ERROR(r.get_int("frame.channels", 1, 64, &c.channels));
  WM_RETURN_IF_ERROR(r.get_int("frame.patch", 1, 32, &c.patch));
  WM_RETURN_IF_ERROR(r.get_int("frame.height", 1, 2048, &c.height));
  WM_RETURN_IF_ERROR(r.get_int("frame.width", 1, 2048, &c.width));
  if (c.height % c.patch != 0) return r.error("frame.height", "must be a multiple of frame.patch");
  if (c.width % c.patch != 0) return r.error("frame.width", "must be a multiple of frame.patch");
  WM_RETURN_IF_ERROR(r.get_string("frame.decoder", &c.decoder));
  if (c.decoder == "pixels") {
    if (c.channels != 3) return r.error("frame.decoder", "'pixels' needs frame.channels = 3");
  } else if (c.decoder == "latent_preview") {
    if (c.channels < 3) return r.error("frame.decoder", "'latent_preview' needs frame.channels >= 3");
  } else {
    return r.error("frame.decoder", "must be 'pixels' or 'latent_preview'");
  }
  WM_RETURN_IF_ERROR(r.get_int("dim", 1, 16384, &c.dim));
  WM_RETURN_IF_ERROR(r.get_int("layers", 1, 256, &c.layers));
  WM_RETURN_IF_ERROR(r.get_int("heads", 1, 256, &c.heads));
  WM_RETURN_IF_ERROR(r.get_int("head_dim", 2, 256, &c.head_dim));
  if (c.head_dim % 2 != 0) return r.error("head_dim", "must be even");
  WM_RETURN_IF_ERROR(r.get_int("ffn", 1, 65536, &c.ffn));
  WM_RETURN_IF_ERROR(r.get_int("freq_dim", 2, 4096, &c.freq_dim));
  if (c.freq_dim % 2 != 0) return r.error("freq_dim", "must be even");
  WM_RETURN_IF_ERROR(r.get_float("norm_eps", 1e-12, 1.0, &c.norm_eps));
  if (c.norm_eps <= 0) return r.error("norm_eps", "must be positive");
  WM_RETURN_IF_ERROR(r.get_float("rope.theta", 1.0001, 1e9, &c.rope_theta));
  WM_RETURN_IF_ERROR(r.get_int("rope.t_pairs", 0, 128, &c.t_pairs));
  WM_RETURN_IF_ERROR(r.get_int("rope.h_pairs", 0, 128, &c.h_pairs));
  WM_RETURN_IF_ERROR(r.get_int("rope.w_pairs", 0, 128, &c.w_pairs));
  if (c.t_pairs + c.h_pairs + c.w_pairs != c.head_dim / 2)
    return r.error("rope", absl::StrCat("pairs sum to ", c.t_pairs + c.h_pairs + c.w_pairs, ", need head_dim / 2 = ", c.head_dim / 2));
  WM_RETURN_IF_ERROR(r.get_strings("actions.keys", 1, 32, &c.actions.keys));
  for (size_t i = 0; i < c.actions.keys.size(); ++i) {
    if (c.actions.keys[i].size() != 1) return r.error("actions.keys", "names must be single characters");
    // an action script line is KEYS MOUSE... *N # comment, and '-' means no key
    const unsigned char k = static_cast<unsigned char>(c.actions.keys[i][0]);
    if (k <= 0x20 || k >= 0x7f || std::strchr("#-*", k) != nullptr)
      return r.error("actions.keys", absl::StrCat("'", absl::CHexEscape(c.actions.keys[i]),
                                                  "' cannot be written in an action script (printable ASCII but # - * and space)"));
    for (size_t j = 0; j < i; ++j)
      if (c.actions.keys[j] == c.actions.keys[i])
        return r.error("actions.keys", absl::StrCat("'", c.actions.keys[i], "' is named twice"));
  }
  WM_RETURN_IF_ERROR(r.get_strings("actions.mouse", 0, kMaxMouseAxes, &c.actions.mouse));
  WM_RETURN_IF_ERROR(r.get_float("actions.mouse_scale", 1e-6, 1e6, &c.actions.mouse_scale));
  WM_RETURN_IF_ERROR(r.get_float("actions.mouse_limit", 1e-6, 1e6, &c.actions.mouse_limit));
  WM_RETURN_IF_ERROR(r.get_int("sampling.frames_per_block", 1, 16, &c.frames_per_block));
  const json* sig = r.find("sampling.sigmas");
  if (sig == nullptr || !sig->is_array() || sig->empty() || sig->size() > 16)
    return r.error("sampling.sigmas", "must be an array of 1..16 numbers");
  for (const auto& s : *sig) {
    if (!s.is_number()) return r.error("sampling.sigmas", "holds a non-number");
    c.sigmas.push_back(s.get<float>());
  }
  if (c.sigmas[0] != 1.0f) return r.error("sampling.sigmas", "must start at 1");
  for (size_t i = 0; i < c.sigmas.size(); ++i) {
    if (!(c.sigmas[i] > 0.0f && c.sigmas[i] <= 1.0f)) return r.error("sampling.sigmas", "values must be in (0, 1]");
    if (i > 0 && !(c.sigmas[i] < c.sigmas[i - 1])) return r.error("sampling.sigmas", "must be strictly decreasing");
  }
  WM_RETURN_IF_ERROR(r.get_int("cache.window_frames", 1, 1024, &c.window_frames));
  WM_RETURN_IF_ERROR(r.get_int("cache.sink_frames", 0, 1000, &c.sink_frames));
  if (c.window_frames < c.frames_per_block) return r.error("cache.window_frames", "must be >= sampling.frames_per_block");
  return c;
}

absl::StatusOr<ModelConfig> load_model_config(const std::string& path) {
  WM_ASSIGN_OR_RETURN(std::string text, read_file(path, 1u << 20));
  return parse_model_config(text, path);
}

std::string model_config_to_json(const ModelConfig& c) {
  json j;
  j["format"] = "wmserve-cldit";
  j["version"] = 1;
  j["name"] = c.name;
  j["frame"] = {{"channels", c.channels}, {"height", c.height}, {"width", c.width}, {"patch", c.patch}, {"decoder", c.decoder}};
  j["dim"] = c.dim;
  j["layers"] = c.layers;
  j["heads"] = c.heads;
  j["head_dim"] = c.head_dim;
  j["ffn"] = c.ffn;
  j["freq_dim"] = c.freq_dim;
  j["norm_eps"] = shortest_decimal(c.norm_eps);
  j["rope"] = {{"theta", shortest_decimal(c.rope_theta)}, {"t_pairs", c.t_pairs}, {"h_pairs", c.h_pairs}, {"w_pairs", c.w_pairs}};
  j["actions"] = {{"keys", c.actions.keys}, {"mouse", c.actions.mouse}, {"mouse_scale", shortest_decimal(c.actions.mouse_scale)},
                  {"mouse_limit", shortest_decimal(c.actions.mouse_limit)}};
  std::vector<double> sigmas;
  for (float s : c.sigmas) sigmas.push_back(shortest_decimal(s));
  j["sampling"] = {{"frames_per_block", c.frames_per_block}, {"sigmas", sigmas}};
  j["cache"] = {{"window_frames", c.window_frames}, {"sink_frames", c.sink_frames}};
  return j.dump(2) + "\n";
}

}  // namespace wm
