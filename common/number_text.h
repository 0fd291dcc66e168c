// Numbers quoted in error messages: the shortest text that reads back as
// the same value, so a value just past a limit never prints as the limit
// ("fps 240.0001", not "fps 240"; a float one step above 45 as 45.000004).
#pragma once

#include <charconv>
#include <string>

namespace wm {

template <class T>
std::string exact_text(T v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace wm
