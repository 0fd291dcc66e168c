// wmeval: fidelity of a model against the simulator's ground truth, and of
// each KV-cache format against the fp16 cache (docs/QUALITY.md).
//
//   wmeval --model DIR [--episodes 4] [--frames 129] [--seed 900001]
//          [--formats fp16,kivi2,qvg2,quantwm2] [--json F] [--md F] [--strip F.jpg]
//
// Each episode is a held-out policy run of the simulator (seed not used for
// training). Frame 0 of the ground truth is the prompt; the engine then
// generates frames 1..N-1 from the episode's actions:
//   - rollout: autoregressive, every format (fp16 is the reference);
//   - one-step: teacher forced, the cache always holds ground-truth frames.
// Formats other than fp32 run audited: a full-precision shadow of the same
// history measures top-1 token-selection drift on sampled queries, and the
// PSNR of each generated frame against the frame the shadow gives for the
// same block (--audit_blocks of the blocks; the generated frames are the
// same either way).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/image_metrics.h"
#include "engine/engine.h"
#include "quant/kv_options.h"
#include "sim/episode.h"

ABSL_FLAG(std::string, model, "models/default", "model directory");
ABSL_FLAG(int, episodes, 4, "held-out episodes");
ABSL_FLAG(int, frames, 129, "frames per episode (the first is the prompt)");
ABSL_FLAG(uint64_t, seed, 900001, "held-out dataset seed (training uses others)");
ABSL_FLAG(std::string, formats, "fp16", "comma-separated cache formats; fp16 is always run");
ABSL_FLAG(std::string, kv_options, "", "cache format options, e.g. block=32,psac_bits=4 (as wmserve's; docs/QUANT.md)");
ABSL_FLAG(std::string, json, "", "write the results as JSON");
ABSL_FLAG(std::string, md, "", "write the results as Markdown");
ABSL_FLAG(std::string, strip, "", "write a strip of frames (ground truth / formats) as JPEG");
ABSL_FLAG(int, threads, 0, "CPU threads, 0..1024 (0: all cores)");
ABSL_FLAG(double, audit_blocks, 1.0,
          "fraction (0..1) of the blocks made again with the full-precision shadow as the history, for the "
          "one-block PSNR against the shadow (each costs its denoising passes twice)");

namespace {

constexpr double kPsnrCap = 60.0;  // identical frames count as 60 dB in averages

double capped(double p) { return std::min(p, kPsnrCap); }

struct Mean {
  double sum = 0;
  int n = 0;
  void add(double x) {
    sum += x;
    ++n;
  }
  double get() const { return n > 0 ? sum / n : std::nan(""); }
};

struct FormatResult {
  std::map<int, Mean> psnr_gt_at, ssim_gt_at;   // horizon -> vs ground truth
  Mean psnr_gt_all, psnr_vs_fp16_all;
  std::map<int, Mean> psnr_vs_fp16_at;
  Mean revisit_self, revisit_gt;
  wm::DriftStats drift;
  bool audited = false;
  int64_t kv_bytes = 0, kv_reserved = 0;
};

int fail(const absl::Status& st) {
  std::fprintf(stderr, "wmeval: %s\n", st.ToString().c_str());
  return 1;
}

wm::Rgb8Image image(const uint8_t* px, int w, int h) {
  return wm::Rgb8Image{w, h, std::vector<uint8_t>(px, px + static_cast<size_t>(w) * h * 3)};
}

// pairs (i, j): frame j revisits the pose of an earlier frame i at least 12 frames before
std::vector<std::pair<int, int>> revisits(const wm::sim::Episode& ep) {
  std::vector<std::pair<int, int>> out;
  for (int j = 13; j < ep.frames; ++j) {
    const float* pj = ep.poses.data() + static_cast<size_t>(j) * 4;
    for (int i = 1; i + 12 <= j; ++i) {
      const float* pi = ep.poses.data() + static_cast<size_t>(i) * 4;
      const double dist = std::hypot(pj[0] - pi[0], pj[1] - pi[1]);
      double dyaw = std::fabs(pj[2] - pi[2]);
      dyaw = std::min(dyaw, 360.0 - dyaw);
      // a revisit must come back: the view in between must have changed
      if (dist < 0.35 && dyaw < 12 && std::fabs(pj[3] - pi[3]) < 3) {
        bool moved = false;
        for (int k = i + 1; k < j && !moved; ++k) {
          const float* pk = ep.poses.data() + static_cast<size_t>(k) * 4;
          double dk = std::fabs(pk[2] - pi[2]);
          dk = std::min(dk, 360.0 - dk);
          moved = dk > 60 || std::hypot(pk[0] - pi[0], pk[1] - pi[1]) > 1.5;
        }
        if (moved) {
          out.emplace_back(i, j);
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("wmeval --model DIR [--episodes N] [--frames N] [--formats a,b] [--json F] [--md F]");
  if (auto bad = wm::parse_flags_only(argc, argv)) {
    std::fprintf(stderr, "wmeval: %s\n", bad->c_str());
    return 2;
  }
  const int episodes = absl::GetFlag(FLAGS_episodes), frames = absl::GetFlag(FLAGS_frames);
  if (episodes < 1 || episodes > 1000 || frames < 2 || frames > 100000) {
    std::fprintf(stderr, "wmeval: --episodes must be 1..1000 and --frames 2..100000\n");
    return 2;
  }
  if (!wm::threads_in_range(absl::GetFlag(FLAGS_threads))) {
    std::fprintf(stderr, "wmeval: %s\n", wm::kThreadsRange);
    return 2;
  }
  std::vector<std::string> formats = {"fp16"};
  std::vector<absl::string_view> named;
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_formats), ',', absl::SkipEmpty())) {
    // a format run twice would pool two sessions' counts under one name
    if (std::find(named.begin(), named.end(), f) != named.end()) {
      std::fprintf(stderr, "wmeval: --formats names '%s' twice\n", std::string(f).c_str());
      return 2;
    }
    named.push_back(f);
    if (f != "fp16") formats.emplace_back(f);
  }
  if (named.empty()) {
    std::fprintf(stderr, "wmeval: --formats names no cache format (e.g. --formats=fp16,kivi2)\n");
    return 2;
  }
  for (const auto& [flag, path] : {std::pair{"json", absl::GetFlag(FLAGS_json)},
                                   std::pair{"md", absl::GetFlag(FLAGS_md)},
                                   std::pair{"strip", absl::GetFlag(FLAGS_strip)}})
    if (auto bad = wm::unwritable_output(flag, path)) {
      std::fprintf(stderr, "wmeval: %s\n", bad->c_str());
      return 2;
    }

  wm::EngineOptions eo;
  eo.model_dir = absl::GetFlag(FLAGS_model);
  eo.threads = absl::GetFlag(FLAGS_threads);
  eo.audit_block_fraction = absl::GetFlag(FLAGS_audit_blocks);
  if (auto kv = wm::parse_kv_format_options(absl::GetFlag(FLAGS_kv_options)); kv.ok()) {
    eo.kv_options = *kv;
  } else {
    return fail(absl::InvalidArgumentError(absl::StrCat("--kv_options: ", kv.status().message())));
  }
  eo.kv_budget_bytes = int64_t{64} << 30;
  auto engine = wm::Engine::create(eo);
  if (!engine.ok()) return fail(engine.status());
  wm::Engine& e = **engine;
  const wm::ModelConfig& c = e.config();
  if (c.decoder != "pixels" || c.frame_values() != c.width * c.height * 3)
    return fail(absl::InvalidArgumentError("wmeval needs a pixel model"));
  if (c.frames_per_block != 1) return fail(absl::UnimplementedError("wmeval steps one frame per block"));
  for (const auto& f : formats)
    if (!wm::kv_format_known(f)) return fail(absl::NotFoundError("unknown cache format " + f));
  wm::sim::RenderConfig rc;
  rc.width = c.width;
  rc.height = c.height;
  auto rayc = wm::sim::Raycaster::create(rc);
  if (!rayc.ok()) return fail(rayc.status());

  const std::vector<int> horizons = {1, 8, 32, 128};
  std::map<std::string, FormatResult> res;
  Mean one_step_psnr, one_step_ssim;
  std::map<int, Mean> one_step_at;
  Mean revisit_gt_similarity;
  std::vector<std::vector<std::vector<uint8_t>>> strip_rows;  // episode 0: ground truth + formats
  const size_t fb = static_cast<size_t>(c.width) * c.height * 3;

  for (int ep_i = 0; ep_i < episodes; ++ep_i) {
    const uint64_t seed = wm::sim::episode_seed(absl::GetFlag(FLAGS_seed), static_cast<uint64_t>(ep_i));
    auto ep = wm::sim::run_policy_episode(seed, frames, *rayc);
    if (!ep.ok()) return fail(ep.status());
    const uint8_t* gt = ep->pixels.data();
    std::vector<wm::SessionId> ids;
    for (const auto& f : formats) {
      wm::SessionOptions so;
      so.seed = seed;
      so.cache_format = f;
      so.audit = f != "fp32";
      so.prompt = {image(gt, c.width, c.height)};
      auto id = e.open_session(so);
      if (!id.ok()) return fail(id.status());
      ids.push_back(*id);
    }
    wm::SessionOptions tf;
    tf.seed = seed;
    tf.prompt = {image(gt, c.width, c.height)};
    auto tf_id = e.open_session(tf);
    if (!tf_id.ok()) return fail(tf_id.status());

    std::vector<std::vector<std::vector<uint8_t>>> gen(formats.size());
    for (auto& g : gen) g.push_back(std::vector<uint8_t>(gt, gt + fb));  // frame 0 = prompt
    for (int f = 1; f < frames; ++f) {
      wm::Action a;
      const float* row = ep->actions.data() + static_cast<size_t>(f) * wm::sim::kActionRowWidth;
      for (int k = 0; k < 4; ++k)
        if (row[k] != 0.0f) a.keys |= 1u << k;
      a.mouse[0] = row[4];
      a.mouse[1] = row[5];
      std::vector<wm::StepRequest> reqs;
      for (auto id : ids) reqs.push_back({id, {a}, {}});
      reqs.push_back({*tf_id, {a}, {image(gt + static_cast<size_t>(f) * fb, c.width, c.height)}});
      auto out = e.step(reqs);
      if (!out.ok()) return fail(out.status());
      for (size_t k = 0; k < formats.size(); ++k) gen[k].push_back((*out)[k].frames[0].rgb);
      const auto& t = (*out)[formats.size()].frames[0].rgb;
      const double p = capped(wm::psnr_rgb8(t.data(), gt + static_cast<size_t>(f) * fb, fb));
      one_step_psnr.add(p);
      one_step_ssim.add(wm::ssim_rgb8(t.data(), gt + static_cast<size_t>(f) * fb, c.width, c.height));
      for (int h : horizons)
        if (f == h) one_step_at[h].add(p);
    }
    const auto pairs = revisits(*ep);
    for (auto [i, j] : pairs)
      revisit_gt_similarity.add(capped(wm::psnr_rgb8(gt + static_cast<size_t>(i) * fb, gt + static_cast<size_t>(j) * fb, fb)));
    for (size_t k = 0; k < formats.size(); ++k) {
      FormatResult& r = res[formats[k]];
      for (int f = 1; f < frames; ++f) {
        const uint8_t* g = gen[k][static_cast<size_t>(f)].data();
        const double p = capped(wm::psnr_rgb8(g, gt + static_cast<size_t>(f) * fb, fb));
        r.psnr_gt_all.add(p);
        const double pf = capped(wm::psnr_rgb8(g, gen[0][static_cast<size_t>(f)].data(), fb));
        r.psnr_vs_fp16_all.add(pf);
        for (int h : horizons)
          if (f == h) {
            r.psnr_gt_at[h].add(p);
            r.ssim_gt_at[h].add(wm::ssim_rgb8(g, gt + static_cast<size_t>(f) * fb, c.width, c.height));
            r.psnr_vs_fp16_at[h].add(pf);
          }
      }
      for (auto [i, j] : pairs) {
        r.revisit_self.add(capped(wm::psnr_rgb8(gen[k][static_cast<size_t>(j)].data(), gen[k][static_cast<size_t>(i)].data(), fb)));
        r.revisit_gt.add(capped(wm::psnr_rgb8(gen[k][static_cast<size_t>(j)].data(), gt + static_cast<size_t>(j) * fb, fb)));
      }
      if (const wm::DriftStats* d = e.session_cache(ids[k])->drift(); d != nullptr) {
        r.drift += *d;
        r.audited = true;
      }
      auto info = e.session_info(ids[k]);
      r.kv_bytes = std::max(r.kv_bytes, info->kv.total());
      // the format's own reservation: an audited session's also holds the
      // audit's full-precision shadow, which is measuring equipment
      r.kv_reserved = e.session_reservation(formats[k]);
    }
    if (ep_i == 0) {
      std::vector<std::vector<uint8_t>> gt_row;
      for (int f = 0; f < frames; ++f) gt_row.emplace_back(gt + static_cast<size_t>(f) * fb, gt + static_cast<size_t>(f + 1) * fb);
      strip_rows.push_back(gt_row);
      for (auto& g : gen) strip_rows.push_back(g);
    }
    for (auto id : ids) e.close_session(id).IgnoreError();
    e.close_session(*tf_id).IgnoreError();
    std::fprintf(stderr, "episode %d/%d done (%zu revisits)\n", ep_i + 1, episodes, pairs.size());
  }

  const int64_t fp16_reserved = e.session_reservation("fp16");
  nlohmann::json j;
  j["model"] = c.name;
  j["kv_options"] = wm::kv_format_options_text(eo.kv_options);
  j["episodes"] = episodes;
  j["frames"] = frames;
  j["seed"] = absl::GetFlag(FLAGS_seed);
  j["one_step"] = {{"psnr_mean", one_step_psnr.get()}, {"ssim_mean", one_step_ssim.get()}};
  for (auto& [h, m] : one_step_at) j["one_step"]["psnr_at"][std::to_string(h)] = m.get();
  j["revisit_ground_truth_similarity_psnr"] = revisit_gt_similarity.get();
  for (auto& [f, r] : res) {
    nlohmann::json fj;
    for (auto& [h, m] : r.psnr_gt_at) fj["psnr_vs_ground_truth_at"][std::to_string(h)] = m.get();
    for (auto& [h, m] : r.ssim_gt_at) fj["ssim_vs_ground_truth_at"][std::to_string(h)] = m.get();
    for (auto& [h, m] : r.psnr_vs_fp16_at) fj["psnr_vs_fp16_at"][std::to_string(h)] = m.get();
    fj["psnr_vs_ground_truth_mean"] = r.psnr_gt_all.get();
    fj["psnr_vs_fp16_mean"] = r.psnr_vs_fp16_all.get();
    fj["revisit_self_psnr"] = r.revisit_self.get();
    fj["revisit_vs_ground_truth_psnr"] = r.revisit_gt.get();
    fj["kv_bytes_max"] = r.kv_bytes;
    fj["kv_reserved_bytes"] = r.kv_reserved;
    fj["compression_vs_fp16"] = r.kv_reserved > 0 ? static_cast<double>(fp16_reserved) / r.kv_reserved : 0.0;
    if (r.audited) {
      fj["drift_top1"] = r.drift.drift();
      fj["drift_queries"] = r.drift.queries;
      fj["logit_rmse"] = r.drift.logits > 0 ? std::sqrt(r.drift.logit_sq_err_sum / r.drift.logits) : 0.0;
      fj["output_rel_err"] = r.drift.queries > 0 ? r.drift.output_rel_err_sum / r.drift.queries : 0.0;
      if (r.drift.frames > 0) {
        fj["shadow_frame_psnr"] = r.drift.frame_psnr();
        fj["shadow_frame_psnr_min"] = r.drift.frame_psnr_min;
        fj["shadow_frames"] = r.drift.frames;
      }
    }
    j["formats"][f] = fj;
  }
  const std::string js = j.dump(2) + "\n";
  std::printf("%s", js.c_str());
  if (!absl::GetFlag(FLAGS_json).empty()) {
    if (auto st = wm::write_file(absl::GetFlag(FLAGS_json), js.data(), js.size()); !st.ok()) return fail(st);
  }
  if (!absl::GetFlag(FLAGS_md).empty()) {
    std::string md = absl::StrFormat("Model `%s`, %d held-out episodes x %d frames (seed %d), prompt = ground-truth frame 0.\n\n",
                                     c.name, episodes, frames, absl::GetFlag(FLAGS_seed));
    absl::StrAppendFormat(&md, "One-step (teacher-forced) PSNR vs ground truth: %.2f dB, SSIM %.3f\n\n", one_step_psnr.get(),
                          one_step_ssim.get());
    md += "| format | PSNR vs GT @1 | @8 | @32 | @128 | SSIM @32 | PSNR vs fp16 (mean) | revisit self-PSNR | drift top-1 | "
          "one-block PSNR vs shadow (worst frame) | KV reserved / session | vs fp16 |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    auto at = [](const std::map<int, Mean>& m, int h) {
      auto it = m.find(h);
      return it == m.end() ? std::string("-") : absl::StrFormat("%.2f", it->second.get());
    };
    for (const auto& f : formats) {
      const FormatResult& r = res[f];
      auto ssim = r.ssim_gt_at.find(32);
      const std::string shadow = r.drift.frames > 0 ? absl::StrFormat("%.2f (%.2f)", r.drift.frame_psnr(),
                                                                      r.drift.frame_psnr_min)
                                                    : std::string("-");
      absl::StrAppendFormat(&md, "| %s | %s | %s | %s | %s | %s | %.2f | %.2f | %s | %s | %d | %.2fx |\n", f, at(r.psnr_gt_at, 1),
                            at(r.psnr_gt_at, 8), at(r.psnr_gt_at, 32), at(r.psnr_gt_at, 128),
                            ssim == r.ssim_gt_at.end() ? "-" : absl::StrFormat("%.3f", ssim->second.get()),
                            f == "fp16" ? kPsnrCap : r.psnr_vs_fp16_all.get(), r.revisit_self.get(),
                            r.audited ? absl::StrFormat("%.2f%%", 100 * r.drift.drift()) : std::string("-"), shadow,
                            r.kv_reserved, r.kv_reserved > 0 ? static_cast<double>(fp16_reserved) / r.kv_reserved : 0.0);
    }
    absl::StrAppendFormat(&md, "\nRevisits: ground-truth frame vs its earlier visit, %.2f dB (how alike the two views truly are).\n",
                          revisit_gt_similarity.get());
    if (auto st = wm::write_file(absl::GetFlag(FLAGS_md), md.data(), md.size()); !st.ok()) return fail(st);
  }
  if (!absl::GetFlag(FLAGS_strip).empty() && !strip_rows.empty()) {
    std::vector<int> cols;
    for (int f : {1, 4, 8, 16, 32, 64, 96, 128})
      if (f < frames) cols.push_back(f);
    const int W = c.width, H = c.height, sw = W * static_cast<int>(cols.size()), sh = H * static_cast<int>(strip_rows.size());
    std::vector<uint8_t> strip(static_cast<size_t>(sw) * sh * 3);
    for (size_t r = 0; r < strip_rows.size(); ++r)
      for (size_t k = 0; k < cols.size(); ++k) {
        const auto& fr = strip_rows[r][static_cast<size_t>(cols[k])];
        for (int y = 0; y < H; ++y)
          std::copy(fr.begin() + static_cast<ptrdiff_t>(y) * W * 3, fr.begin() + static_cast<ptrdiff_t>(y + 1) * W * 3,
                    strip.begin() + ((static_cast<ptrdiff_t>(r) * H + y) * sw + static_cast<ptrdiff_t>(k) * W) * 3);
      }
    auto jpg = wm::jpeg_encode(strip.data(), sw, sh, 95);
    if (!jpg.ok()) return fail(jpg.status());
    if (auto st = wm::write_file(absl::GetFlag(FLAGS_strip), jpg->data(), jpg->size()); !st.ok()) return fail(st);
    std::fprintf(stderr, "strip rows: ground truth, %s; columns: frames %s\n", absl::StrJoin(formats, ", ").c_str(),
                 absl::StrJoin(cols, ", ").c_str());
  }
  if (auto st = wm::flush_stdout(); !st.ok()) return fail(st);
  return 0;
}
