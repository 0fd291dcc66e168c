// The engine against the PyTorch trainer's golden fixture (tests/golden/parity,
// produced by train/wmtrain/golden.py): every intermediate the fixture holds
// must match within the tolerance MODEL_FORMAT.md states (2e-4 absolute).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/noise.h"
#include "engine/safetensors.h"

namespace wm {
namespace {

constexpr float kTolerance = 2e-4f;
const std::string kDir = std::string(WM_SOURCE_DIR) + "/tests/golden/parity";

std::vector<float> tensor(const SafetensorsFile& f, const std::string& name) {
  const TensorView* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<float> v(static_cast<size_t>(t->numel()));
  const absl::Status st = f.read_f32(name, t->shape, v.data());
  EXPECT_TRUE(st.ok()) << st;
  return v;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(GoldenParity, EngineMatchesTheTrainerStepByStep) {
  auto expected = SafetensorsFile::open(kDir + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const SafetensorsFile& ex = **expected;
  EngineOptions o;
  o.model_dir = kDir;
  o.threads = 1;
  auto engine = Engine::create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  const ModelConfig& c = e.config();
  const int B = c.frames_per_block, T = c.tokens_per_frame(), P = c.patch_dim();
  auto id = e.open_session({1234, "fp32", {}});
  ASSERT_TRUE(id.ok());
  const std::vector<float> actions = tensor(ex, "actions");
  const std::vector<float> frames = tensor(ex, "frames");
  const int blocks = static_cast<int>(actions.size() / 6) / B;
  ASSERT_EQ(blocks, 6);
  int compared = 0;
  for (int b = 0; b < blocks; ++b) {
    // the initial noise: the fixture's patchified noise equals ours
    std::vector<float> noise(static_cast<size_t>(B) * c.frame_values()), tok(noise.size());
    for (int f = 0; f < B; ++f) noise_fill_frame(1234, b * B + f, noise.data() + static_cast<size_t>(f) * c.frame_values(), c.frame_values());
    auto be = make_cpu_backend(1);
    be->patchify(noise.data(), B, FrameShape{c.height, c.width, c.channels, c.patch}, tok.data());
    EXPECT_LT(max_abs_diff(tok, tensor(ex, absl::StrCat("block", b, ".noise"))), 1e-6f) << "noise of block " << b;

    StepRequest r;
    r.session = *id;
    for (int f = 0; f < B; ++f) {
      const float* row = actions.data() + static_cast<size_t>(b * B + f) * 6;
      Action a;
      for (int k = 0; k < 4; ++k)
        if (row[k] != 0.0f) a.keys |= 1u << k;
      a.mouse[0] = row[4];
      a.mouse[1] = row[5];
      r.actions.push_back(a);
    }
    // the trace arrives forward by forward: steps 0..n-1, then the write pass
    int forward = 0;
    std::map<std::string, std::vector<float>> got;
    TraceFn trace = [&](absl::string_view name, const float* d, int64_t n) {
      const bool write = forward == static_cast<int>(c.sigmas.size());
      const std::string prefix = write ? absl::StrCat("block", b, ".write.") : absl::StrCat("block", b, ".step", forward, ".");
      got[prefix + std::string(name)] = std::vector<float>(d, d + n);
      if (name == "velocity") ++forward;
      if (write && name == absl::StrCat("layer", c.layers - 2)) ++forward;
    };
    auto res = e.step(std::span<const StepRequest>(&r, 1), nullptr, /*keep_values=*/true, &trace);
    ASSERT_TRUE(res.ok()) << res.status();
    for (const auto& [name, values] : got) {
      std::string key = name;
      if (name == absl::StrCat("block", b, ".step0.cond")) key = absl::StrCat("block", b, ".cond");
      if (ex.find(key) == nullptr) continue;
      const float d = max_abs_diff(values, tensor(ex, key));
      EXPECT_LT(d, kTolerance) << key;
      ++compared;
    }
    for (int f = 0; f < B; ++f) {
      const auto& v = (*res)[0].frames[static_cast<size_t>(f)].values;
      std::vector<float> want(frames.begin() + static_cast<ptrdiff_t>(b * B + f) * c.frame_values(),
                              frames.begin() + static_cast<ptrdiff_t>(b * B + f + 1) * c.frame_values());
      EXPECT_LT(max_abs_diff(v, want), kTolerance) << "frame " << b * B + f;
      ++compared;
    }
    (void)T;
    (void)P;
  }
  // velocities of every step, conds, the traced layers and every frame
  EXPECT_GE(compared, 6 * 3 + 6 + 12 + 8);
}

}  // namespace
}  // namespace wm
