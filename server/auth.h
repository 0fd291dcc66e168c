// API tokens (--auth_tokens): a file of named tokens, and who a call is
// from its "authorization: Bearer TOKEN" metadata. Only SHA-256 digests of
// the tokens are kept, and a call's token is looked up by its digest, so the
// time a lookup takes says nothing about the tokens.
//
// Pure code (no gRPC): unit-tested in tests/server/auth_test.cc.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wm::server {

// who a call is from: the token's name, and the SHA-256 of the token itself
// (a session remembers it, so that a reload without that token ends it)
struct Caller {
  std::string name;
  std::string credential;
};

class TokenTable {
 public:
  // lines "NAME TOKEN" (a # at the start of a line or after a space starts
  // a comment; blank lines are skipped): NAME
  // 1..64 of [A-Za-z0-9._-], TOKEN 16..512 printable ASCII characters
  // without spaces; names and tokens unique. Errors name `source` and the line.
  static absl::StatusOr<TokenTable> parse(absl::string_view text, absl::string_view source);

  // the caller, from an authorization metadata value ("Bearer TOKEN"; the
  // scheme in any case); UNAUTHENTICATED when it is missing (empty),
  // malformed or unknown
  absl::StatusOr<Caller> identify(absl::string_view authorization) const;
  // whether a Caller::credential is one of this table's tokens
  bool holds(const std::string& credential) const { return names_.count(credential) != 0; }
  size_t size() const { return names_.size(); }

 private:
  std::map<std::string, std::string> names_;  // SHA-256 of a token -> its name
};

}  // namespace wm::server
