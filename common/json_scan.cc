#include "common/json_scan.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace wm {
namespace {

// counts and checks as the SAX parser goes, keeping only the keys of the
// objects still open; the first refusal stops the parse
class Scan final : public nlohmann::json_sax<nlohmann::json> {
 public:
  Scan(const JsonLimits& limits, absl::string_view what) : limits_(limits), what_(what) {}
  const std::string& error() const { return error_; }

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return value() && nest();
  }
  bool key(string_t& k) override {
    if (keys_.back().insert(k).second) return true;
    return refuse(absl::StrCat(what_, " lists ", quote_text(k), " twice"));
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return value() && nest(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    return refuse(absl::StrCat(what_, " is not valid JSON (at byte ", position, ")"));
  }

 private:
  bool refuse(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    return false;
  }
  bool value() {
    if (++values_ <= limits_.max_values) return true;
    return refuse(absl::StrCat(what_, " holds more than ", limits_.max_values, " JSON values"));
  }
  bool nest() {
    if (++depth_ <= limits_.max_depth) return true;
    return refuse(absl::StrCat(what_, " JSON nested too deeply (more than ", limits_.max_depth, " levels)"));
  }

  const JsonLimits limits_;
  const absl::string_view what_;
  std::vector<std::set<std::string>> keys_;  // the keys of every open object, innermost last
  int depth_ = 0;
  int64_t values_ = 0;
  std::string error_;
};

}  // namespace

absl::Status scan_json(absl::string_view text, const JsonLimits& limits, absl::string_view what) {
  Scan scan(limits, what);
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &scan) || !scan.error().empty())
    return absl::InvalidArgumentError(scan.error().empty() ? absl::StrCat(what, " is not valid JSON") : scan.error());
  return absl::OkStatus();
}

std::string quote_text(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return absl::StrCat("'", absl::CHexEscape(text), "'");
  return absl::StrCat("'", absl::CHexEscape(text.substr(0, max_bytes)), "...' (", text.size(), " bytes)");
}

}  // namespace wm
