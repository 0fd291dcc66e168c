#include "engine/model_config.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "common/image_io.h"

namespace wm {
namespace {

std::string base_text() {
  auto t = read_file(std::string(WM_SOURCE_DIR) + "/configs/default.json");
  EXPECT_TRUE(t.ok());
  return *t;
}

TEST(ModelConfig, ParsesShippedConfigs) {
  for (const char* name : {"default", "tiny-test", "mg2-shape"}) {
    auto c = load_model_config(std::string(WM_SOURCE_DIR) + "/configs/" + name + ".json");
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
  }
  auto mg2 = load_model_config(std::string(WM_SOURCE_DIR) + "/configs/mg2-shape.json");
  EXPECT_EQ(mg2->tokens_per_frame(), 880);
  EXPECT_EQ(mg2->qkv_dim(), 1536);
}

TEST(ModelConfig, RoundTripsThroughJson) {
  auto c = parse_model_config(base_text(), "x");
  ASSERT_TRUE(c.ok());
  auto again = parse_model_config(model_config_to_json(*c), "y");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->parameter_count(), c->parameter_count());
}

// the name is 1..64 bytes of UTF-8 (as the trainer counts it) without C0, C1
// or bidirectional controls
TEST(ModelConfig, NamesAreShortPrintableUtf8) {
  auto doc = nlohmann::json::parse(base_text());
  const std::string e_acute = "\xc3\xa9";
  std::string ok32, bad33;
  for (int i = 0; i < 32; ++i) ok32 += e_acute;
  bad33 = ok32 + e_acute;
  for (const auto& [name, error] : std::vector<std::pair<std::string, std::string>>{
           {ok32, ""}, {"caf" + e_acute + " \xe2\x98\x95", ""}, {bad33, "1..64 bytes"},
           {"a\xc2\x85" "b", "control character"}, {"a\xc2\x9b" "2J", "control character"}, {"a\x7f", "control character"},
           {"evil\xe2\x80\xaegpj.exe", "bidirectional"}, {"x\xe2\x81\xa6y", "bidirectional"}}) {
    doc["name"] = name;
    auto c = parse_model_config(doc.dump(), "n");
    if (error.empty()) {
      EXPECT_TRUE(c.ok()) << c.status();
    } else {
      ASSERT_FALSE(c.ok()) << absl::CHexEscape(name);
      EXPECT_NE(std::string(c.status().message()).find(error), std::string::npos) << c.status();
    }
  }
}

// every float at the edges of its documented range reads back the same and
// stays in range: written as its float's exact double, 1e-6 read back below 1e-6
TEST(ModelConfig, EdgeValuesRoundTripThroughJson) {
  auto doc = nlohmann::json::parse(base_text());
  for (const auto& [norm_eps, theta, mouse] : {std::tuple{1e-12, 1.0001, 1e-6}, std::tuple{1.0, 1e9, 1e6},
                                               std::tuple{0.3, 12345.678, 0.1}}) {
    doc["norm_eps"] = norm_eps;
    doc["rope"]["theta"] = theta;
    doc["actions"]["mouse_scale"] = mouse;
    doc["actions"]["mouse_limit"] = mouse;
    doc["sampling"]["sigmas"] = {1.0, 0.9, 0.1, 1e-6};
    auto c = parse_model_config(doc.dump(), "edges");
    ASSERT_TRUE(c.ok()) << c.status();
    const std::string written = model_config_to_json(*c);
    auto again = parse_model_config(written, "written");
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << written;
    EXPECT_EQ(again->norm_eps, c->norm_eps);
    EXPECT_EQ(again->rope_theta, c->rope_theta);
    EXPECT_EQ(again->actions.mouse_scale, c->actions.mouse_scale);
    EXPECT_EQ(again->actions.mouse_limit, c->actions.mouse_limit);
    EXPECT_EQ(again->sigmas, c->sigmas);
    EXPECT_EQ(model_config_to_json(*again), written);
  }
}

TEST(ModelConfig, RejectsBadFieldsNamingThem) {
  struct Case {
    const char* pointer;
    nlohmann::json value;
    const char* field;
  };
  const Case cases[] = {
      {"/format", "other", "format"},
      {"/frame/patch", 7, "frame.height"},
      {"/head_dim", 63, "head_dim"},
      {"/rope/t_pairs", 13, "rope"},
      {"/sampling/sigmas", nlohmann::json::array({0.5, 0.2}), "sampling.sigmas"},
      {"/sampling/sigmas", nlohmann::json::array({1.0, 0.5, 0.7}), "sampling.sigmas"},
      {"/cache/window_frames", 0, "cache.window_frames"},
      {"/frame/height", 4096, "frame.height"},  // past 2048 its JPEG could outgrow a 16 MiB message
      {"/cache/window_frames", 100000, "cache.window_frames"},  // past 1024: start-up would replay it per format
      {"/dim", "wide", "dim"},
      {"/layers", -1, "layers"},
      {"/frame/decoder", "vae", "frame.decoder"},
      {"/actions/keys", nlohmann::json::array({"WW"}), "actions.keys"},
      {"/actions/keys", nlohmann::json::array({"W", "A", "W"}), "named twice"},
      {"/actions/keys", nlohmann::json::array({"W", "#"}), "action script"},  // a script reads it as a comment
      {"/actions/keys", nlohmann::json::array({"-"}), "action script"},
      {"/actions/keys", nlohmann::json::array({" "}), "action script"},
      {"/name", "a\nb", "control character"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = nlohmann::json::parse(base_text());
    j[nlohmann::json::json_pointer(c.pointer)] = c.value;
    auto r = parse_model_config(j.dump(), "cfg.json");
    ASSERT_FALSE(r.ok()) << c.pointer;
    EXPECT_NE(std::string(r.status().message()).find(c.field), std::string::npos) << r.status();
  }
  // a syntax error says where; valid JSON of another kind says what it is not
  auto syntax = parse_model_config("{\"dim\": 1e400}", "cfg.json");
  ASSERT_FALSE(syntax.ok());
  EXPECT_NE(std::string(syntax.status().message()).find("not valid JSON"), std::string::npos) << syntax.status();
  // a key given twice would load its last value without a word
  std::string twice = base_text();
  twice.insert(twice.find('{') + 1, "\"dim\": 7, ");
  auto dup = parse_model_config(twice, "cfg.json");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(std::string(dup.status().message()), "cfg.json lists 'dim' twice") << dup.status();
  // a wrong format is quoted escaped: it goes to a terminal
  nlohmann::json esc = nlohmann::json::parse(base_text());
  esc["format"] = "\x1b]0;title\x07";
  auto quoted = parse_model_config(esc.dump(), "cfg.json");
  ASSERT_FALSE(quoted.ok());
  EXPECT_TRUE(absl::StrContains(quoted.status().message(), "'\\x1b]0;title\\x07'")) << quoted.status();
  auto array = parse_model_config("[1]", "cfg.json");
  ASSERT_FALSE(array.ok());
  EXPECT_NE(std::string(array.status().message()).find("not a JSON object"), std::string::npos) << array.status();
  EXPECT_FALSE(parse_model_config("{", "cfg.json").ok());
  nlohmann::json j = nlohmann::json::parse(base_text());
  j.erase("ffn");
  EXPECT_FALSE(parse_model_config(j.dump(), "cfg.json").ok());
}

// nlohmann::json keeps an integer above INT64_MAX as unsigned: the message
// quotes it as written, not as the -1 it reads as a signed integer
TEST(ModelConfig, QuotesOutOfRangeIntegersAsWritten) {
  struct Case {
    nlohmann::json value;
    const char* message;
  };
  const Case cases[] = {
      {18446744073709551615ull, "field 'dim' = 18446744073709551615 is outside [1, 16384]"},
      {9223372036854775808ull, "field 'dim' = 9223372036854775808 is outside [1, 16384]"},
      {INT64_MIN, "field 'dim' = -9223372036854775808 is outside [1, 16384]"},
      {16385, "field 'dim' = 16385 is outside [1, 16384]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    nlohmann::json j = nlohmann::json::parse(base_text());
    j["dim"] = c.value;
    auto r = parse_model_config(j.dump(), "cfg.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(std::string(r.status().message()).find(c.message), std::string::npos) << r.status();
  }
}

// the parser stops at a NUL as at the end of its input: a config damaged
// after its closing brace (a NUL, then anything) must not read as whole
TEST(ModelConfig, RefusesNulBytes) {
  const std::string text = base_text();
  for (const std::string& damaged : {text + std::string(1, '\0'), text + std::string("\0{\"dim\": 1}", 11)}) {
    auto r = parse_model_config(damaged, "cfg.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(std::string(r.status().message()).find("cfg.json: holds a NUL byte at offset " + std::to_string(text.size())),
              std::string::npos)
        << r.status();
  }
}

}  // namespace
}  // namespace wm
