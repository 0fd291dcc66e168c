#include "server/auth.h"

#include <algorithm>
#include <set>

#include <openssl/evp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace wm::server {

namespace {

constexpr size_t kMinTokenChars = 16, kMaxTokenChars = 512, kMaxNameChars = 64;

std::string sha256(absl::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &n, EVP_sha256(), nullptr) != 1) return {};
  return std::string(reinterpret_cast<const char*>(digest), n);
}

bool name_char(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; }
bool token_char(char c) { return c > 0x20 && c < 0x7f; }

}  // namespace

absl::StatusOr<TokenTable> TokenTable::parse(absl::string_view text, absl::string_view source) {
  TokenTable t;
  std::set<std::string> names;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(source, " line ", line_no, ": ", why));
    };
    // a comment starts a line or follows a space: a '#' inside a token is the token's
    for (size_t i = 0; i < line.size(); ++i)
      if (line[i] == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
        line = line.substr(0, i);
        break;
      }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) return bad("expected NAME TOKEN");
    const absl::string_view name = fields[0], token = fields[1];
    if (name.size() > kMaxNameChars || !std::all_of(name.begin(), name.end(), name_char))
      return bad("a name is 1..64 letters, digits, '.', '_' or '-'");
    if (token.size() < kMinTokenChars || token.size() > kMaxTokenChars ||
        !std::all_of(token.begin(), token.end(), token_char))
      return bad("a token is 16..512 printable characters without spaces (e.g. openssl rand -hex 32)");
    if (!names.insert(std::string(name)).second) return bad(absl::StrCat("the name '", name, "' is given twice"));
    const std::string digest = sha256(token);
    if (digest.empty()) return absl::InternalError("SHA-256 is not available");
    if (!t.names_.emplace(digest, std::string(name)).second) return bad("this token is given twice");
  }
  if (t.names_.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens"));
  return t;
}

absl::StatusOr<Caller> TokenTable::identify(absl::string_view authorization) const {
  if (authorization.empty())
    return absl::UnauthenticatedError(
        "this server needs a token: send the metadata 'authorization: Bearer TOKEN' (the clients' --token_file)");
  absl::string_view token = authorization;
  if (token.size() < 7 || !absl::EqualsIgnoreCase(token.substr(0, 7), "bearer "))
    return absl::UnauthenticatedError("the authorization metadata must be 'Bearer TOKEN'");
  token = absl::StripAsciiWhitespace(token.substr(7));
  auto it = names_.find(sha256(token));
  if (it == names_.end()) return absl::UnauthenticatedError("unknown token");
  return Caller{it->second, it->first};
}

}  // namespace wm::server
