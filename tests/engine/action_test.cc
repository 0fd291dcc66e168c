#include "engine/action.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"

namespace wm {
namespace {

TEST(ActionScript, ParsesKeysMouseAndRepeats) {
  const ActionSpace s = default_action_space();
  auto a = parse_action_script("# walk\nW 0 0 *3\n- 15\nad -5 2\n\n", s);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 5u);
  EXPECT_EQ((*a)[0].keys, 1u);
  EXPECT_EQ((*a)[3].keys, 0u);
  EXPECT_EQ((*a)[3].mouse[0], 15.0f);
  EXPECT_EQ((*a)[4].keys, 2u | 8u);
  EXPECT_EQ((*a)[4].mouse[1], 2.0f);
  auto again = parse_action_script(format_action_script(*a, s), s);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);
}

// key names are case-sensitive (a model may have both 'a' and 'A'): a letter
// that names a key is that key alone; its upper case stands in only for a
// letter that names none
TEST(ActionScript, KeysThatDifferInCaseAreDistinct) {
  ActionSpace s;
  s.keys = {"a", "A", "W"};
  auto a = parse_action_script("a\nA\naA\nw\n", s);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 4u);
  EXPECT_EQ((*a)[0].keys, 1u);
  EXPECT_EQ((*a)[1].keys, 2u);
  EXPECT_EQ((*a)[2].keys, 3u);
  EXPECT_EQ((*a)[3].keys, 4u);
  for (uint32_t keys = 0; keys < 8; ++keys) {
    std::vector<Action> one(1);
    one[0].keys = keys;
    auto again = parse_action_script(format_action_script(one, s), s);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ((*again)[0].keys, keys) << format_action_script(one, s);
  }
}

TEST(ActionScript, RejectsBadLinesWithLineNumber) {
  const ActionSpace s = default_action_space();
  for (const char* bad : {"Q", "W x", "W 1 2 3", "W 99", "W *0", "W *abc", "W nan", "W 0 0 *2 *3", "W *3 0 0"}) {
    auto a = parse_action_script(std::string("W\n") + bad, s);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_NE(std::string(a.status().message()).find("line 2"), std::string::npos) << a.status();
  }
  // beyond float's range: the message quotes what was written, not "inf"
  auto huge = parse_action_script("W 1e40 0", s);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(std::string(huge.status().message()).find("'1e40'"), std::string::npos) << huge.status();
  // bytes a terminal cannot show are escaped, and the message goes on past a
  // NUL (it used to end there); a UTF-8 byte is an unknown key, not a crash
  for (const auto& [text, quoted] : std::vector<std::pair<std::string, std::string>>{
           {std::string("W\0X 0 0", 7), "unknown key '\\x00'"},
           {"W 1\x1b[2J", "not a number: '1\\x1b[2J'"},
           {"\xc3\xa9", "unknown key '\\xc3'"}}) {
    auto a = parse_action_script(text, s);
    ASSERT_FALSE(a.ok()) << absl::CHexEscape(text);
    const std::string message(a.status().message());
    EXPECT_EQ(message.find('\0'), std::string::npos) << absl::CHexEscape(message);
    EXPECT_NE(message.find(quoted), std::string::npos) << absl::CHexEscape(message) << " lacks " << quoted;
  }
}

// a directory opens like a file and reads as nothing: not an empty script
TEST(ActionScript, ADirectoryIsNotAScript) {
  auto a = load_action_script(::testing::TempDir(), default_action_space());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_EQ(load_action_script("/no/such/script.txt", default_action_space()).status().code(),
            absl::StatusCode::kNotFound);
}

// an endless or huge file stops at the bound instead of filling memory; a
// pipe still reads
TEST(ActionScript, ReadsAtMostTheBound) {
  auto z = load_action_script("/dev/zero", default_action_space());
  ASSERT_EQ(z.status().code(), absl::StatusCode::kInvalidArgument) << z.status();
  EXPECT_NE(std::string(z.status().message()).find("larger than 64 MiB"), std::string::npos) << z.status();
  const std::string fifo = ::testing::TempDir() + "/script_fifo_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    std::ofstream(fifo) << "W 0 0 *2\n- 5 0\n";
  });
  auto p = load_action_script(fifo, default_action_space());
  writer.join();
  ::unlink(fifo.c_str());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size(), 3u);
}

TEST(ActionSpace, ValidatesAndEmbeds) {
  const ActionSpace s = default_action_space();
  Action a;
  a.keys = 0b1010;
  a.mouse[0] = 20;
  EXPECT_TRUE(s.validate(a).ok());
  float in[6];
  s.embed_input(a, in);
  EXPECT_EQ(in[0], 0.0f);
  EXPECT_EQ(in[1], 1.0f);
  EXPECT_EQ(in[3], 1.0f);
  EXPECT_FLOAT_EQ(in[4], 2.0f);
  Action bad = a;
  bad.keys = 1u << 4;
  EXPECT_FALSE(s.validate(bad).ok());
  bad = a;
  bad.mouse[1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(s.validate(bad).ok());
  bad = a;
  bad.mouse[2] = 1;
  EXPECT_FALSE(s.validate(bad).ok());
  bad = a;
  bad.mouse[0] = -45.5f;
  EXPECT_FALSE(s.validate(bad).ok());
  // a value one float step past the limit is quoted as itself, not as the limit
  bad = a;
  bad.mouse[0] = std::nextafter(45.0f, 100.0f);
  const absl::Status st = s.validate(bad);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(absl::StrContains(st.message(), "= 45.000004 is outside [-45, 45]")) << st;
}

}  // namespace
}  // namespace wm
