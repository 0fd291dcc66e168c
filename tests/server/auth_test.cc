// API tokens: the file's rules line by line, and who a call is.
#include "server/auth.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace wm::server {
namespace {

TEST(TokenTable, IdentifiesEachTokensName) {
  auto t = TokenTable::parse("# who may play\n\nalice 0123456789abcdef0123\n  bob\tfedcba9876543210fedc  # ops\n",
                             "tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 2u);
  EXPECT_EQ(t->identify("Bearer 0123456789abcdef0123")->name, "alice");
  EXPECT_EQ(t->identify("bearer fedcba9876543210fedc")->name, "bob");  // the scheme in any case
  EXPECT_EQ(t->identify("BEARER  fedcba9876543210fedc ")->name, "bob");
  // a '#' inside a token is part of it, not a comment that cuts it short
  auto hashed = TokenTable::parse("carol cccccccccccccccc#secretsuffix # a comment\n", "tokens");
  ASSERT_TRUE(hashed.ok()) << hashed.status();
  EXPECT_EQ(hashed->identify("Bearer cccccccccccccccc#secretsuffix")->name, "carol");
  EXPECT_FALSE(hashed->identify("Bearer cccccccccccccccc").ok());
  struct Case {
    const char* authorization;
    const char* says;
  };
  for (const Case& c : {Case{"", "needs a token"}, Case{"0123456789abcdef0123", "must be 'Bearer TOKEN'"},
                        Case{"Basic 0123456789abcdef0123", "must be 'Bearer TOKEN'"},
                        Case{"Bearer 0123456789abcdef012", "unknown token"},   // a prefix
                        Case{"Bearer 0123456789abcdef01234", "unknown token"},  // longer
                        Case{"Bearer ", "unknown token"}, Case{"Bearer alice", "unknown token"}}) {
    auto who = t->identify(c.authorization);
    EXPECT_EQ(who.status().code(), absl::StatusCode::kUnauthenticated) << c.authorization;
    EXPECT_TRUE(absl::StrContains(who.status().message(), c.says)) << c.authorization << ": " << who.status();
  }
}

// a session remembers its token's credential; a reloaded table holds it
// only while the same token is in the file, whatever the name
TEST(TokenTable, CredentialsFollowTheTokenNotTheName) {
  auto before = TokenTable::parse("alice 0123456789abcdef0123\nbob fedcba9876543210fedc\n", "tokens");
  auto after = TokenTable::parse("alice 00000000000000000000\ncarol fedcba9876543210fedc\n", "tokens");
  ASSERT_TRUE(before.ok() && after.ok());
  const auto alice = before->identify("Bearer 0123456789abcdef0123");
  const auto bob = before->identify("Bearer fedcba9876543210fedc");
  ASSERT_TRUE(alice.ok() && bob.ok());
  EXPECT_NE(alice->credential, bob->credential);
  EXPECT_TRUE(before->holds(alice->credential));
  EXPECT_FALSE(after->holds(alice->credential));  // a new token for the same name
  EXPECT_TRUE(after->holds(bob->credential));     // the same token under another name
  EXPECT_EQ(after->identify("Bearer fedcba9876543210fedc")->credential, bob->credential);
  EXPECT_FALSE(after->holds(""));
  // the credential is a digest, not the token
  EXPECT_EQ(alice->credential.find("0123456789abcdef0123"), std::string::npos);
}

TEST(TokenTable, RefusesABadFileNamingTheLine) {
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"", "tokens: no tokens"},
      {"# only a comment\n", "tokens: no tokens"},
      {"alice\n", "line 1: expected NAME TOKEN"},
      {"alice 0123456789abcdef0123 extra\n", "line 1: expected NAME TOKEN"},
      {"\nal/ice 0123456789abcdef0123\n", "line 2: a name is 1..64"},
      {"alice 0123456789abcde\n", "line 1: a token is 16..512"},  // 15 characters
      {"alice 0123456789abcdef\x01\x02\n", "line 1: a token is 16..512 printable"},
      {"alice 0123456789abcdef\xc3\xa9\n", "line 1: a token is 16..512 printable"},
      {"alice 0123456789abcdef0123\nalice fedcba9876543210fedc\n", "line 2: the name 'alice' is given twice"},
      {"alice 0123456789abcdef0123\nbob 0123456789abcdef0123\n", "line 2: this token is given twice"},
  };
  for (const Case& c : cases) {
    auto t = TokenTable::parse(c.text, "tokens");
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.says)) << c.text << ": " << t.status();
  }
  const std::string long_name(65, 'a');
  EXPECT_FALSE(TokenTable::parse(long_name + " 0123456789abcdef0123", "tokens").ok());
  EXPECT_TRUE(TokenTable::parse(std::string(64, 'a') + " 0123456789abcdef0123", "tokens").ok());
  EXPECT_FALSE(TokenTable::parse("alice " + std::string(513, 'x'), "tokens").ok());
  EXPECT_TRUE(TokenTable::parse("alice " + std::string(512, 'x'), "tokens").ok());
}

}  // namespace
}  // namespace wm::server
