#include "engine/action.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/number_text.h"

namespace wm {

absl::Status ActionSpace::validate(const Action& a) const {
  const int k = static_cast<int>(keys.size());
  if (k < 32 && (a.keys >> k) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("key bitmask 0x", absl::Hex(a.keys), " uses bits beyond the ", k,
                                                   " keys of the action space"));
  }
  for (size_t i = 0; i < kMaxMouseAxes; ++i) {
    const float v = a.mouse[i];
    if (i >= mouse.size()) {
      if (v != 0.0f) return absl::InvalidArgumentError(absl::StrCat("mouse axis ", i, " is not in the action space"));
      continue;
    }
    if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat("mouse ", mouse[i], " is not finite"));
    if (std::fabs(v) > mouse_limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("mouse ", mouse[i], " = ", exact_text(v), " is outside [-", mouse_limit, ", ", mouse_limit, "]"));
    }
  }
  return absl::OkStatus();
}

void ActionSpace::embed_input(const Action& a, float* out) const {
  for (size_t k = 0; k < keys.size(); ++k) out[k] = ((a.keys >> k) & 1u) ? 1.0f : 0.0f;
  for (size_t m = 0; m < mouse.size(); ++m) out[keys.size() + m] = a.mouse[m] / mouse_scale;
}

ActionSpace default_action_space() {
  ActionSpace s;
  s.keys = {"W", "A", "S", "D"};
  s.mouse = {"yaw", "pitch"};
  s.mouse_scale = 10.0f;
  s.mouse_limit = 45.0f;
  return s;
}

namespace {

absl::StatusOr<uint32_t> parse_keys(absl::string_view tok, const ActionSpace& space) {
  if (tok == "-") return 0u;
  uint32_t mask = 0;
  const auto key_of = [&](char c) -> int {
    for (size_t k = 0; k < space.keys.size(); ++k)
      if (space.keys[k].size() == 1 && space.keys[k][0] == c) return static_cast<int>(k);
    return -1;
  };
  for (char ch : tok) {
    // names are case-sensitive (a model may have both 'a' and 'A'): the
    // upper case stands in only for a letter that names no key itself.
    // Through unsigned char: a byte above 0x7f (UTF-8) is negative as char
    int k = key_of(ch);
    if (k < 0) k = key_of(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
    // escaped: a NUL or a control byte would cut or garble the message
    if (k < 0)
      return absl::InvalidArgumentError(absl::StrCat("unknown key '", absl::CHexEscape(absl::string_view(&ch, 1)), "'"));
    mask |= 1u << k;
  }
  return mask;
}

}  // namespace

absl::StatusOr<std::vector<Action>> parse_action_script(absl::string_view text, const ActionSpace& space) {
  std::vector<Action> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (auto hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> toks = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (toks.empty()) continue;
    auto fail = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("action script line ", line_no, ": ", why));
    };
    Action a;
    auto keys = parse_keys(toks[0], space);
    if (!keys.ok()) return fail(keys.status().message());
    a.keys = *keys;
    int64_t repeat = 1;
    size_t axis = 0;
    for (size_t i = 1; i < toks.size(); ++i) {
      absl::string_view t = toks[i];
      if (absl::ConsumePrefix(&t, "*")) {
        if (!absl::SimpleAtoi(t, &repeat) || repeat < 1 || repeat > 100000) return fail("bad repeat count");
        if (i + 1 != toks.size()) return fail("the repeat count (*N) comes last, once");
        continue;
      }
      double v = 0;
      if (!absl::SimpleAtod(t, &v)) return fail(absl::StrCat("not a number: '", absl::CHexEscape(t), "'"));
      if (axis >= space.mouse.size()) return fail("more mouse values than the action space has axes");
      // a value beyond float's range would become infinite: say what was written
      if (std::isfinite(v) && std::fabs(v) > 1e30)
        return fail(absl::StrCat("mouse value '", t, "' is far outside the action space's range"));
      a.mouse[axis++] = static_cast<float>(v);
    }
    if (auto st = space.validate(a); !st.ok()) return fail(st.message());
    if (out.size() + static_cast<size_t>(repeat) > 1000000) return fail("script longer than 1,000,000 actions");
    out.insert(out.end(), static_cast<size_t>(repeat), a);
  }
  return out;
}

absl::StatusOr<std::vector<Action>> load_action_script(const std::string& path, const ActionSpace& space) {
  std::error_code ec;  // the overload that cannot throw (a loop of links, a name too long)
  if (std::filesystem::is_directory(path, ec))
    return absl::InvalidArgumentError(absl::StrCat("action script ", path, " is a directory, not a file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open action script ", path));
  // read in pieces up to a bound: a pipe works, /dev/zero or a huge file stops at the bound
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    if (text.size() + static_cast<size_t>(in.gcount()) > kMaxActionScriptBytes)
      return absl::InvalidArgumentError(
          absl::StrCat("action script ", path, " is larger than ", kMaxActionScriptBytes >> 20, " MiB"));
    text.append(buf, static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("action script ", path, " is not a readable file"));
  auto r = parse_action_script(text, space);
  if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat(path, ": ", r.status().message()));
  return r;
}

std::string format_action_script(const std::vector<Action>& actions, const ActionSpace& space) {
  std::string out;
  for (size_t i = 0; i < actions.size();) {
    size_t j = i + 1;
    while (j < actions.size() && actions[j] == actions[i]) ++j;
    std::string keys;
    for (size_t k = 0; k < space.keys.size(); ++k)
      if ((actions[i].keys >> k) & 1u) keys += space.keys[k];
    absl::StrAppend(&out, keys.empty() ? std::string("-") : keys);
    for (size_t m = 0; m < space.mouse.size(); ++m) absl::StrAppend(&out, " ", actions[i].mouse[m]);
    if (j - i > 1) absl::StrAppend(&out, " *", j - i);
    absl::StrAppend(&out, "\n");
    i = j;
  }
  return out;
}

}  // namespace wm
