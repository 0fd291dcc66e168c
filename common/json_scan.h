// A first pass over JSON text that came from a file, in bounded time and
// memory, before nlohmann builds a tree of it: the tree costs up to ~100
// bytes a value (a 100 MB string of '[' became GBs), and nlohmann keeps the
// last of a key given twice without a word. Used for safetensors headers,
// config.json and wmquant dumps' metadata.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace wm {

struct JsonLimits {
  int64_t max_values = 0;  // every value counts: objects, arrays, numbers, strings, ...
  int max_depth = 0;       // objects and arrays nested in one another
};

// OK, or INVALID_ARGUMENT starting with `what`: not valid JSON (with the
// byte), more values than allowed, nested too deeply, or a key listed twice
// in one object (quoted with quote_text)
absl::Status scan_json(absl::string_view text, const JsonLimits& limits, absl::string_view what);

// text from a file for a message: in single quotes, C-escaped, cut after
// `max_bytes` with its length said
std::string quote_text(absl::string_view text, size_t max_bytes = 64);

}  // namespace wm
