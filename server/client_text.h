// A string a client sent, as it appears inside a status message: cut short
// (a message travels in gRPC's trailing metadata, which clients cap at a few
// KiB: an echoed megabyte would hide the real error) and with non-printable
// bytes escaped.
#pragma once

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace wm::server {

inline std::string client_text(absl::string_view s, size_t max_bytes = 64) {
  if (s.size() <= max_bytes) return absl::CHexEscape(s);
  return absl::StrCat(absl::CHexEscape(s.substr(0, max_bytes)), "... (", s.size(), " bytes)");
}

}  // namespace wm::server
