#include "server/play_protocol.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/number_text.h"
#include "server/client_text.h"

namespace wm::server {

namespace v1 = ::wmserve::v1;

absl::StatusOr<StartParams> parse_start(const v1::Start& start, const ServedModel& model,
                                        const ProtocolLimits& limits, int* prompts_decoded) {
  int decoded_scratch = 0;
  int& decoded = prompts_decoded != nullptr ? *prompts_decoded : decoded_scratch;
  decoded = 0;
  StartParams p;
  if (!start.model().empty() && start.model() != model.config.name)
    return absl::NotFoundError(absl::StrCat("unknown model '", client_text(start.model()), "'; this server serves '",
                                            model.config.name, "' (ListModels)"));
  p.cache_format = start.cache_format().empty() ? model.default_format : start.cache_format();
  if (model.reservation_bytes.count(p.cache_format) == 0)
    return absl::NotFoundError(absl::StrCat("unknown cache format '", client_text(p.cache_format), "'; the model has ",
                                            absl::StrJoin(model.cache_formats, ", ")));
  p.seed = start.seed();
  switch (start.pacing()) {
    case v1::PACING_UNSPECIFIED:
    case v1::PACING_PER_ACTION:
      p.pacing = PacingMode::kPerAction;
      if (start.fps() != 0)
        return absl::InvalidArgumentError("fps is for PACING_FIXED_RATE only; leave it 0 with per-action pacing");
      break;
    case v1::PACING_FIXED_RATE:
      p.pacing = PacingMode::kFixedRate;
      if (!(start.fps() >= kMinFixedRateFps && start.fps() <= limits.max_fps))
        return absl::InvalidArgumentError(absl::StrCat("fps ", exact_text(start.fps()), " is outside [",
                                                       exact_text(kMinFixedRateFps), ", ", exact_text(limits.max_fps),
                                                       "] for PACING_FIXED_RATE"));
      p.fps = start.fps();
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown pacing ", static_cast<int>(start.pacing())));
  }
  if (start.jpeg_quality() < 0 || start.jpeg_quality() > 100)
    return absl::InvalidArgumentError(
        absl::StrCat("jpeg_quality ", start.jpeg_quality(), " is outside 1..100 (0: the server's default)"));
  p.jpeg_quality = start.jpeg_quality() == 0 ? limits.default_jpeg_quality : start.jpeg_quality();
  p.audit = start.audit();
  if (p.audit && !model.audit_supported)
    return absl::UnimplementedError(absl::StrCat("audit mode (a full-precision shadow cache) is not available on this "
                                                 "server, which runs on ", model.device));
  p.batch_invariant = start.batch_invariant() || model.all_batch_invariant;

  const ModelConfig& c = model.config;
  if (start.prompt_jpeg_size() > 0) {
    if (c.decoder != "pixels")
      return absl::InvalidArgumentError(absl::StrCat("model '", c.name, "' takes no image prompts (latent model)"));
    if (start.prompt_jpeg_size() > limits.max_prompt_frames)
      return absl::InvalidArgumentError(absl::StrCat(start.prompt_jpeg_size(), " prompt frames, at most ",
                                                     limits.max_prompt_frames, " are accepted"));
    for (int i = 0; i < start.prompt_jpeg_size(); ++i) {
      const std::string& bytes = start.prompt_jpeg(i);
      ++decoded;
      // refuse anything larger than the model's frame before decoding it
      auto img = jpeg_decode(bytes.data(), bytes.size(), int64_t{c.width} * c.height);
      if (!img.ok())
        return absl::InvalidArgumentError(absl::StrCat("prompt_jpeg[", i, "] is not a ", c.width, "x", c.height,
                                                       " JPEG: ", img.status().message()));
      if (img->width != c.width || img->height != c.height)
        return absl::InvalidArgumentError(absl::StrCat("prompt_jpeg[", i, "] is ", img->width, "x", img->height,
                                                       ", the model needs ", c.width, "x", c.height));
      p.prompt.push_back(std::move(*img));
    }
  } else if (!model.prompts.empty()) {
    p.prompt.push_back(model.prompts[p.seed % model.prompts.size()]);
  }
  return p;
}

absl::StatusOr<Action> parse_action(const v1::Action& action, const ActionSpace& space) {
  Action a;
  a.seq = action.seq();
  a.keys = action.keys();
  const float mouse[2] = {action.mouse_dx(), action.mouse_dy()};
  for (size_t i = 0; i < 2; ++i) {
    if (i < space.mouse.size()) {
      a.mouse[i] = mouse[i];
    } else if (mouse[i] != 0.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model has ", space.mouse.size(), " mouse axes; mouse_", i == 0 ? "dx" : "dy",
                       " must be 0"));
    }
  }
  if (auto st = space.validate(a); !st.ok()) return st;
  return a;
}

void fill_action_space(const ActionSpace& space, v1::ActionSpace* out) {
  for (const auto& k : space.keys) out->add_keys(k);
  for (const auto& m : space.mouse) out->add_mouse_axes(m);
  out->set_mouse_limit(space.mouse_limit);
  out->set_mouse_scale(space.mouse_scale);
}

void fill_model_info(const ServedModel& model, v1::ModelInfo* out) {
  const ModelConfig& c = model.config;
  out->set_name(c.name);
  out->set_parameters(model.parameters);
  out->set_width(c.width);
  out->set_height(c.height);
  out->set_frames_per_block(c.frames_per_block);
  for (const auto& f : model.cache_formats) {
    out->add_cache_formats(f);
    auto* info = out->add_cache_format_info();
    info->set_name(f);
    info->set_session_bytes(model.reservation_bytes.at(f));
    info->set_compression_ratio(model.compression_ratio.at(f));
  }
  out->set_audit_bytes(model.audit_supported ? model.audit_bytes : 0);
  out->set_kv_options(model.kv_options);
  fill_action_space(c.actions, out->mutable_action_space());
  out->set_window_frames(c.window_frames);
  out->set_sink_frames(c.sink_frames);
  out->set_denoising_steps(static_cast<int32_t>(c.sigmas.size()));
  out->set_default_cache_format(model.default_format);
  out->set_prompt_images(static_cast<int32_t>(model.prompts.size()));
}

}  // namespace wm::server
