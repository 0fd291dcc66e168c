// The benchmarks' flags: --key=value, a bare --key meaning "1". Each getter
// states the values a flag takes, and the benchmark reads every flag it knows
// before it does any work, then calls reject_unknown(): a number that is not
// wholly a number or out of range, an empty list, a flag no getter asked for
// (a typo would otherwise time the default) or a stray word ends the program
// with exit code 2 and one line on stderr naming the flag and what it takes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wm::bench {

// "a, b or c"
inline std::string flag_join_or(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i)
    absl::StrAppend(&s, i == 0 ? "" : i + 1 == items.size() ? " or " : ", ", items[i]);
  return s;
}

// the values a numeric flag takes: lo..hi, or where `values` is not empty, those alone
struct FlagValues {
  int64_t lo = std::numeric_limits<int64_t>::min();
  int64_t hi = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> values;

  bool contains(int64_t v) const {
    if (values.empty()) return v >= lo && v <= hi;
    for (int64_t x : values)
      if (x == v) return true;
    return false;
  }
  // "an integer from 1 to 20", "integers >= 0" (plural), "0, 3 or 4"
  std::string describe(bool plural) const {
    if (!values.empty()) {
      std::vector<std::string> items;
      for (int64_t x : values) items.push_back(absl::StrCat(x));
      return flag_join_or(items);
    }
    const char* what = plural ? "integers" : "an integer";
    if (hi == std::numeric_limits<int64_t>::max()) return absl::StrCat(what, " >= ", lo);
    return absl::StrCat(what, " from ", lo, " to ", hi);
  }
};

// a whole decimal integer in `allowed`, or false (leading and trailing spaces are absl's to allow)
inline bool parse_flag_int(const std::string& text, const FlagValues& allowed, int64_t* out) {
  return absl::SimpleAtoi(text, out) && allowed.contains(*out);
}

class Flags {
 public:
  Flags(int argc, char** argv) : program_(program_name(argc > 0 ? argv[0] : "bench")) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.rfind("--", 0) != 0) fail(absl::StrCat("stray argument \"", a, "\": flags are --name=value"));
      const size_t eq = a.find('=');
      if (eq == std::string::npos) values_[a.substr(2)] = "1";
      else values_[a.substr(2, eq - 2)] = a.substr(eq + 1);
    }
  }

  // any text (a path, a format the backend checks itself)
  std::string str(const std::string& name, const std::string& def) {
    asked_.insert(name);
    auto it = values_.find(name);
    return it == values_.end() ? def : it->second;
  }

  // one of `allowed`
  std::string choice(const std::string& name, const std::string& def, std::initializer_list<const char*> allowed) {
    const std::string v = str(name, def);
    for (const char* a : allowed)
      if (v == a) return v;
    fail(absl::StrCat("--", name, "=", v, ": expected ",
                      flag_join_or(std::vector<std::string>(allowed.begin(), allowed.end()))));
  }

  // an integer from lo to hi
  int64_t num(const std::string& name, int64_t def, int64_t lo, int64_t hi) {
    return num(name, def, FlagValues{lo, hi, {}});
  }
  // one of a few integers
  int64_t num(const std::string& name, int64_t def, std::initializer_list<int64_t> allowed) {
    return num(name, def, FlagValues{0, 0, allowed});
  }

  // comma-separated integers, at least one, each from lo to hi
  std::vector<int> list(const std::string& name, const std::string& def, int lo, int hi) {
    return list(name, def, FlagValues{lo, hi, {}});
  }
  // the same, each one of a few integers
  std::vector<int> list(const std::string& name, const std::string& def, std::initializer_list<int64_t> allowed) {
    return list(name, def, FlagValues{0, 0, allowed});
  }

  // after every getter: exit 2 on a flag that none asked for
  void reject_unknown() const {
    for (const auto& [name, value] : values_)
      if (asked_.count(name) == 0) {
        std::vector<std::string> known;
        for (const std::string& k : asked_) known.push_back("--" + k);
        fail(absl::StrCat("--", name, ": unknown flag; this benchmark takes ", absl::StrJoin(known, ", ")));
      }
  }

 private:
  int64_t num(const std::string& name, int64_t def, const FlagValues& allowed) {
    asked_.insert(name);
    auto it = values_.find(name);
    if (it == values_.end()) return def;
    int64_t v = 0;
    if (!parse_flag_int(it->second, allowed, &v))
      fail(absl::StrCat("--", name, "=", it->second, ": expected ", allowed.describe(false)));
    return v;
  }

  std::vector<int> list(const std::string& name, const std::string& def, const FlagValues& allowed) {
    const std::string s = str(name, def);
    std::vector<int> out;
    size_t at = 0;
    for (;;) {
      const size_t comma = s.find(',', at);
      const std::string part = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      int64_t v = 0;
      // an empty item ("--sessions=", "1,,2") is a typo, not a shorter list
      if (!parse_flag_int(part, allowed, &v))
        fail(absl::StrCat("--", name, "=", s, ": expected a comma-separated list of one or more ",
                          allowed.values.empty() ? "" : "of ", allowed.describe(true)));
      out.push_back(static_cast<int>(v));
      if (comma == std::string::npos) return out;
      at = comma + 1;
    }
  }

  static std::string program_name(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
  }

  [[noreturn]] void fail(const std::string& line) const {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), line.c_str());
    std::exit(2);
  }

  std::string program_;
  std::map<std::string, std::string> values_;
  std::set<std::string> asked_;
};

}  // namespace wm::bench
