#include "server/served_model.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/engine.h"
#include "quant/kv_options.h"

namespace wm::server {
namespace {

constexpr int64_t kMaxModelPrompts = 1024;
constexpr int64_t kMaxModelPromptBytes = int64_t{1} << 30;

}  // namespace

absl::StatusOr<ServedModel> describe_served_model(const Engine& engine, const std::string& model_dir,
                                                  const std::string& default_format) {
  ServedModel m;
  m.dir = model_dir;
  m.config = engine.config();
  m.parameters = engine.parameter_count();
  m.device = engine.device();
  m.device_note = engine.device_note();
  m.kv_capacity_bytes = engine.kv_capacity_bytes();
  // options that keep a format from this model's geometry are a mistake, not
  // a way to hide the format: the server does not start
  const KvGeometry geometry = engine.kv_geometry();
  for (const auto& f : kv_formats()) {
    if (!kv_format_check(f, geometry).ok()) continue;
    if (auto st = kv_format_check(f, geometry, engine.kv_options()); !st.ok())
      return absl::InvalidArgumentError(absl::StrCat("--kv_options ", kv_format_options_text(engine.kv_options()),
                                                     ": ", st.message()));
  }
  // the same on a device, by what it can hold (the GPU's KIVI-2 needs whole
  // chunks per frame, which a longer residual takes away)
  if (engine.device() != "cpu")
    for (const auto& f : engine.cache_formats()) {
      if (!engine.kv_format_status(f, KvFormatOptions{}).ok()) continue;
      if (auto st = engine.kv_format_status(f, engine.kv_options()); !st.ok())
        return absl::InvalidArgumentError(absl::StrCat("--kv_options ", kv_format_options_text(engine.kv_options()),
                                                       ": ", st.message()));
    }
  m.kv_options = kv_format_options_text(engine.kv_options());
  // formats whose layout does not fit this model's geometry reserve nothing:
  // they are not offered
  for (const auto& f : engine.cache_formats()) {
    const int64_t bytes = engine.session_reservation(f);
    if (bytes > 0) {
      m.cache_formats.push_back(f);
      m.reservation_bytes[f] = bytes;
    }
  }
  if (m.cache_formats.empty())
    return absl::InvalidArgumentError(
        "no KV-cache format can hold this model on this backend (on the CPU head_dim must be a multiple of 8, on a GPU 32, 64 or 128)");
  if (m.reservation_bytes.count(default_format) == 0)
    return absl::InvalidArgumentError(absl::StrCat("--cache_format '", default_format,
                                                   "' is not available for this model; it has ",
                                                   absl::StrJoin(m.cache_formats, ", ")));
  if (m.reservation_bytes[default_format] > m.kv_capacity_bytes)
    return absl::InvalidArgumentError(absl::StrCat(
        "the KV budget of ", m.kv_capacity_bytes, " bytes (--kv_budget_bytes) holds no '", default_format,
        "' session: one reserves ", m.reservation_bytes[default_format], " bytes"));
  m.default_format = default_format;
  m.audit_supported = engine.audit_supported();
  m.all_batch_invariant = engine.all_batch_invariant();
  if (m.audit_supported)
    m.audit_bytes = engine.session_reservation(default_format, true) - engine.session_reservation(default_format);
  const double fp16 = static_cast<double>(engine.session_reservation("fp16"));
  for (const auto& [f, bytes] : m.reservation_bytes)
    m.compression_ratio[f] = fp16 > 0 ? fp16 / static_cast<double>(bytes) : 0.0;
  // the model's own prompt images, used when a Start brings none. Every
  // *.jpg there is one (a directory, a FIFO or a broken link by that name
  // included, which reading refuses), so that none is left out unnoticed
  const std::filesystem::path dir = std::filesystem::path(model_dir) / "prompts";
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(dir, ec))) {
    // a file, a loop or a broken link by that name is a mistake, not "no prompts"
    if (!std::filesystem::is_directory(std::filesystem::status(dir, ec)))
      return absl::InvalidArgumentError(
          absl::StrCat(dir.string(), ": not a directory", ec ? absl::StrCat(" (", ec.message(), ")") : ""));
    std::vector<std::string> files;
    std::filesystem::directory_iterator it(dir, ec);
    for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
      if (it->path().extension() == ".jpg") files.push_back(it->path().string());
    if (ec) return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": cannot list: ", ec.message()));
    std::sort(files.begin(), files.end());
    // the engine refuses image frames for a latent model: every Start
    // without a prompt of its own would fail at open
    if (!files.empty() && m.config.decoder != "pixels")
      return absl::InvalidArgumentError(absl::StrCat(files.front(), ": model '", m.config.name, "' (decoder ",
                                                     m.config.decoder, ") is a latent model and takes no prompt images"));
    // a larger image is refused from its header, before it is decoded
    const int64_t frame_pixels = static_cast<int64_t>(m.config.width) * m.config.height;
    // every image is kept decoded for the server's life: their count is
    // bounded, and so are the bytes they take
    const int64_t most = std::min<int64_t>(kMaxModelPrompts, std::max<int64_t>(1, kMaxModelPromptBytes / (3 * frame_pixels)));
    if (static_cast<int64_t>(files.size()) > most)
      return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": ", files.size(), " images; at most ", most, " of ",
                                                     m.config.width, "x", m.config.height, " are kept (",
                                                     kMaxModelPrompts, ", and ", kMaxModelPromptBytes >> 20,
                                                     " MiB decoded)"));
    for (const auto& f : files) {
      WM_ASSIGN_OR_RETURN(std::string bytes, read_file(f, 64 << 20));
      auto img = jpeg_decode(bytes.data(), bytes.size(), frame_pixels);
      if (!img.ok())
        return absl::InvalidArgumentError(absl::StrCat(f, ": ", img.status().message(), " (a prompt must be a ",
                                                       m.config.width, "x", m.config.height,
                                                       " JPEG, the model's frame size)"));
      if (img->width != m.config.width || img->height != m.config.height)
        return absl::InvalidArgumentError(absl::StrCat(f, ": prompt is ", img->width, "x", img->height,
                                                       ", the model makes ", m.config.width, "x",
                                                       m.config.height, " frames"));
      m.prompts.push_back(std::move(*img));
    }
  }
  return m;
}

}  // namespace wm::server
