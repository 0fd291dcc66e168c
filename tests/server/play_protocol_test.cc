// Start and Action messages checked against the served model: every
// refusal has its status code and a message that names the problem.
#include "server/play_protocol.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "server/client_text.h"

namespace wm::server {
namespace {

namespace v1 = ::wmserve::v1;

ServedModel model() {
  ServedModel m;
  m.config.name = "tiny";
  m.config.width = 16;
  m.config.height = 8;
  m.config.actions = default_action_space();
  m.cache_formats = {"fp16", "kivi2"};
  m.default_format = "fp16";
  m.reservation_bytes = {{"fp16", 100}, {"kivi2", 50}};
  m.compression_ratio = {{"fp16", 1.0}, {"kivi2", 2.0}};
  m.device = "cpu";
  m.audit_supported = true;
  m.audit_bytes = 200;
  return m;
}

std::string jpeg(int w, int h, uint8_t v) {
  std::vector<uint8_t> px(static_cast<size_t>(w * h * 3), v);
  return *jpeg_encode(px.data(), w, h, 90);
}

TEST(PlayProtocol, StartDefaultsAndChoices) {
  const ServedModel m = model();
  v1::Start s;
  auto p = parse_start(s, m, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->cache_format, "fp16");
  EXPECT_EQ(p->pacing, PacingMode::kPerAction);
  EXPECT_EQ(p->jpeg_quality, 90);
  EXPECT_TRUE(p->prompt.empty());
  s.set_model("tiny");
  s.set_cache_format("kivi2");
  s.set_pacing(v1::PACING_FIXED_RATE);
  s.set_fps(30);
  s.set_jpeg_quality(75);
  s.set_seed(9);
  s.set_audit(true);
  p = parse_start(s, m, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->cache_format, "kivi2");
  EXPECT_EQ(p->pacing, PacingMode::kFixedRate);
  EXPECT_EQ(p->fps, 30);
  EXPECT_EQ(p->jpeg_quality, 75);
  EXPECT_EQ(p->seed, 9u);
  EXPECT_TRUE(p->audit);
  // a server that cannot audit says so instead of failing the session later
  ServedModel gpu = m;
  gpu.device = "cuda";
  gpu.audit_supported = false;
  p = parse_start(s, gpu, {});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(p.status().message(), "runs on cuda")) << p.status();
}

TEST(PlayProtocol, BatchInvarianceIsAskedOrTheServers) {
  ServedModel m = model();
  v1::Start s;
  auto p = parse_start(s, m, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->batch_invariant);
  s.set_batch_invariant(true);
  p = parse_start(s, m, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->batch_invariant);
  // the server's --batch_invariant: every session, asked or not
  m.all_batch_invariant = true;
  p = parse_start(v1::Start{}, m, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->batch_invariant);
  // a GPU server too (its attention runs such a session in a call of its own)
  ServedModel gpu = model();
  gpu.device = "cuda";
  p = parse_start(s, gpu, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->batch_invariant);
}

TEST(PlayProtocol, BadStartsGetTheirStatus) {
  const ServedModel m = model();
  struct Case {
    const char* what;
    std::function<void(v1::Start*)> edit;
    absl::StatusCode code;
    const char* says;
  };
  const Case cases[] = {
      {"unknown model", [](v1::Start* s) { s->set_model("other"); }, absl::StatusCode::kNotFound, "unknown model"},
      {"unknown format", [](v1::Start* s) { s->set_cache_format("fp7"); }, absl::StatusCode::kNotFound, "fp16, kivi2"},
      {"fixed rate without fps", [](v1::Start* s) { s->set_pacing(v1::PACING_FIXED_RATE); },
       absl::StatusCode::kInvalidArgument, "fps"},
      {"fps too high",
       [](v1::Start* s) {
         s->set_pacing(v1::PACING_FIXED_RATE);
         s->set_fps(1000);
       },
       absl::StatusCode::kInvalidArgument, "[0.001, 240]"},
      {"fps just above the limit reads as such",
       [](v1::Start* s) {
         s->set_pacing(v1::PACING_FIXED_RATE);
         s->set_fps(240.00000001);
       },
       absl::StatusCode::kInvalidArgument, "fps 240.00000001 is outside [0.001, 240]"},
      {"fps just below the floor reads as such",
       [](v1::Start* s) {
         s->set_pacing(v1::PACING_FIXED_RATE);
         s->set_fps(0.00099999999999);
       },
       absl::StatusCode::kInvalidArgument, "fps 0.00099999999999 is outside [0.001, 240]"},
      {"fps too low (its period would overflow the clock)",
       [](v1::Start* s) {
         s->set_pacing(v1::PACING_FIXED_RATE);
         s->set_fps(1e-10);
       },
       absl::StatusCode::kInvalidArgument, "[0.001, 240]"},
      {"fps not a number",
       [](v1::Start* s) {
         s->set_pacing(v1::PACING_FIXED_RATE);
         s->set_fps(std::nan(""));
       },
       absl::StatusCode::kInvalidArgument, "fps"},
      {"fps with per-action pacing", [](v1::Start* s) { s->set_fps(10); }, absl::StatusCode::kInvalidArgument,
       "PACING_FIXED_RATE only"},
      {"unknown pacing", [](v1::Start* s) { s->set_pacing(static_cast<v1::Pacing>(7)); },
       absl::StatusCode::kInvalidArgument, "pacing"},
      {"quality", [](v1::Start* s) { s->set_jpeg_quality(101); }, absl::StatusCode::kInvalidArgument, "1..100"},
      {"negative quality", [](v1::Start* s) { s->set_jpeg_quality(-1); }, absl::StatusCode::kInvalidArgument,
       "1..100"},
      {"prompt not a jpeg", [](v1::Start* s) { s->add_prompt_jpeg("not a jpeg"); },
       absl::StatusCode::kInvalidArgument, "prompt_jpeg[0]"},
      {"prompt cut short (libjpeg would decode it with a warning)",
       [](v1::Start* s) {
         const std::string j = jpeg(16, 8, 1);
         s->add_prompt_jpeg(j.substr(0, j.size() / 2));
       },
       absl::StatusCode::kInvalidArgument, "prompt_jpeg[0]"},
      {"prompt of the wrong size", [](v1::Start* s) { s->add_prompt_jpeg(jpeg(8, 16, 1)); },
       absl::StatusCode::kInvalidArgument, "prompt_jpeg[0]"},
      {"prompt larger than the model's frame", [](v1::Start* s) { s->add_prompt_jpeg(jpeg(64, 64, 1)); },
       absl::StatusCode::kInvalidArgument, "prompt_jpeg[0]"},
      {"too many prompt frames",
       [](v1::Start* s) {
         for (int i = 0; i < 17; ++i) s->add_prompt_jpeg(jpeg(16, 8, 1));
       },
       absl::StatusCode::kInvalidArgument, "at most 16"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::Start s;
    c.edit(&s);
    auto p = parse_start(s, m, {});
    EXPECT_EQ(p.status().code(), c.code) << p.status();
    EXPECT_TRUE(absl::StrContains(p.status().message(), c.says)) << p.status();
  }
  // a name the client sent comes back cut short and escaped: a long one
  // would not fit a client's metadata limit and hide the error
  for (auto edit : {+[](v1::Start* s) { s->set_model(std::string(100000, 'm') + "\n"); },
                    +[](v1::Start* s) { s->set_cache_format(std::string(100000, 'f')); }}) {
    v1::Start s;
    edit(&s);
    auto p = parse_start(s, m, {});
    EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
    EXPECT_LT(p.status().message().size(), 300u);
    EXPECT_TRUE(absl::StrContains(p.status().message(), "(100001 bytes)") ||
                absl::StrContains(p.status().message(), "(100000 bytes)"))
        << p.status();
  }
  EXPECT_EQ(client_text("a\x01 z"), "a\\x01 z");
}

TEST(PlayProtocol, PromptsFromTheClientOrTheModel) {
  ServedModel m = model();
  v1::Start s;
  s.add_prompt_jpeg(jpeg(16, 8, 50));
  s.add_prompt_jpeg(jpeg(16, 8, 200));
  int decoded = -1;
  auto p = parse_start(s, m, {}, &decoded);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->prompt.size(), 2u);
  EXPECT_NEAR(p->prompt[1].pixels[0], 200, 3);
  EXPECT_EQ(decoded, 2);
  // a refused Start says how many JPEGs it decoded: up to the bad one, or
  // none when it was refused before them
  v1::Start bad = s;
  bad.add_prompt_jpeg("not a jpeg");
  bad.add_prompt_jpeg(jpeg(16, 8, 50));
  EXPECT_FALSE(parse_start(bad, m, {}, &decoded).ok());
  EXPECT_EQ(decoded, 3);
  bad.set_model("another");
  EXPECT_EQ(parse_start(bad, m, {}, &decoded).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(decoded, 0);
  // none sent: the model's prompt number seed % count
  for (uint8_t v : {10, 20, 30}) {
    Rgb8Image img{16, 8, std::vector<uint8_t>(16 * 8 * 3, v)};
    m.prompts.push_back(img);
  }
  v1::Start none;
  none.set_seed(7);
  p = parse_start(none, m, {});
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->prompt.size(), 1u);
  EXPECT_EQ(p->prompt[0].pixels[0], 20);
}

TEST(PlayProtocol, ActionsInAndOutOfTheActionSpace) {
  const ActionSpace space = default_action_space();
  v1::Action a;
  a.set_seq(3);
  a.set_keys(0b1001);
  a.set_mouse_dx(-45);
  a.set_mouse_dy(12.5f);
  auto ok = parse_action(a, space);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->seq, 3u);
  EXPECT_EQ(ok->keys, 0b1001u);
  EXPECT_EQ(ok->mouse[0], -45.0f);
  EXPECT_EQ(ok->mouse[1], 12.5f);
  struct Case {
    uint32_t keys;
    float dx, dy;
    const char* says;
  };
  const Case bad[] = {
      {0b10000, 0, 0, "bits beyond the 4 keys"},
      {0, 46, 0, "outside [-45, 45]"},
      {0, 0, -1000, "outside"},
      {0, std::nanf(""), 0, "not finite"},
      {0, 0, std::numeric_limits<float>::infinity(), "not finite"},
  };
  for (const Case& c : bad) {
    v1::Action x;
    x.set_seq(1);
    x.set_keys(c.keys);
    x.set_mouse_dx(c.dx);
    x.set_mouse_dy(c.dy);
    auto r = parse_action(x, space);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.says)) << r.status();
  }
  // a model with one mouse axis refuses a second one
  ActionSpace one = space;
  one.mouse = {"yaw"};
  v1::Action y;
  y.set_mouse_dy(1);
  EXPECT_EQ(parse_action(y, one).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlayProtocol, ModelInfoListsFormatsWithTheirBytes) {
  v1::ModelInfo info;
  fill_model_info(model(), &info);
  EXPECT_EQ(info.name(), "tiny");
  ASSERT_EQ(info.cache_format_info_size(), 2);
  EXPECT_EQ(info.cache_format_info(1).name(), "kivi2");
  EXPECT_EQ(info.cache_format_info(1).session_bytes(), 50);
  EXPECT_EQ(info.cache_format_info(1).compression_ratio(), 2.0);
  EXPECT_EQ(info.action_space().keys_size(), 4);
  EXPECT_EQ(info.action_space().mouse_limit(), 45.0f);
}

}  // namespace
}  // namespace wm::server
