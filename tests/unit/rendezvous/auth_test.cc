// Token rules: parsing, token files (permissions, newline), the environment,
// constant-time comparison and the refusal log's rate limiter.

#include "rendezvous/security/auth.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "rendezvous/security/security.h"
#include "tests/support/temp_dir.h"

namespace meshrun::rdzv {
namespace {

namespace fs = std::filesystem;
const std::string kToken = "0123456789abcdef0123456789ABCDEF";

// Every directory of this file's tests is named after it.
class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("meshrun-auth-test") {}
};

GetEnv FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(ParseTokenTest, DropsOneTrailingNewline) {
  EXPECT_EQ(*ParseToken(kToken + "\n", "test"), kToken);
  EXPECT_EQ(*ParseToken(kToken + "\r\n", "test"), kToken);
  EXPECT_EQ(*ParseToken(kToken, "test"), kToken);
  // A second newline is not trailing whitespace to forgive but a bad byte.
  EXPECT_FALSE(ParseToken(kToken + "\n\n", "test").ok());
}

TEST(ParseTokenTest, RefusesShortLongAndUnprintableTokens) {
  auto empty = ParseToken("", "file x");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(),
            "token from file x has 0 bytes; at least 16 are required");
  EXPECT_FALSE(ParseToken("short", "x").ok());
  EXPECT_FALSE(ParseToken(std::string(kMaxTokenBytes + 1, 'a'), "x").ok());
  EXPECT_TRUE(ParseToken(std::string(kMaxTokenBytes, 'a'), "x").ok());
  auto space = ParseToken("0123456789 abcdef", "x");
  ASSERT_FALSE(space.ok());
  EXPECT_NE(space.status().message().find("byte 0x20 at offset 10"), std::string::npos)
      << space.status();
  EXPECT_FALSE(ParseToken(kToken + "\t", "x").ok());
  EXPECT_FALSE(ParseToken(kToken + "\xc3\xa9", "x").ok());
  EXPECT_FALSE(ParseToken(std::string("0123456789abcdef\0x", 18), "x").ok());
}

TEST(ReadTokenFileTest, ReadsAPrivateFileWithItsNewline) {
  TempDir dir;
  EXPECT_EQ(*ReadTokenFile(dir.Write("t", kToken + "\n", 0600)), kToken);
  EXPECT_EQ(*ReadTokenFile(dir.Write("r", kToken, 0400)), kToken);
}

TEST(ReadTokenFileTest, RefusesFilesOthersCanReadLikeSsh) {
  TempDir dir;
  for (mode_t mode : {0640, 0604, 0644, 0660, 0602, 0610}) {
    auto token = ReadTokenFile(dir.Write("t" + std::to_string(mode), kToken, mode));
    ASSERT_FALSE(token.ok()) << std::oct << mode;
    EXPECT_NE(token.status().message().find("too open"), std::string::npos)
        << token.status();
    EXPECT_NE(token.status().message().find("chmod 600"), std::string::npos);
  }
}

TEST(ReadTokenFileTest, RefusesMissingFilesDirectoriesAndBadContents) {
  TempDir dir;
  auto missing = ReadTokenFile(dir.path() + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot open token file"), std::string::npos);
  chmod(dir.path().c_str(), 0700);
  auto directory = ReadTokenFile(dir.path());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos)
      << directory.status();
  EXPECT_FALSE(ReadTokenFile(dir.Write("e", "", 0600)).ok());
  EXPECT_FALSE(ReadTokenFile(dir.Write("big", std::string(1 << 20, 'a'), 0600)).ok());
}

TEST(TokenFromEnvironmentTest, TokenVariableThenFileThenNone) {
  TempDir dir;
  std::string file = dir.Write("t", "file-token-0123456789\n", 0600);
  EXPECT_EQ(*TokenFromEnvironment(FakeEnv({})), "");
  EXPECT_EQ(*TokenFromEnvironment(FakeEnv({{kTokenFileEnv, file}})),
            "file-token-0123456789");
  EXPECT_EQ(*TokenFromEnvironment(FakeEnv({{kTokenEnv, kToken}, {kTokenFileEnv, file}})),
            kToken);
  EXPECT_FALSE(TokenFromEnvironment(FakeEnv({{kTokenEnv, "short"}})).ok());
  EXPECT_FALSE(TokenFromEnvironment(FakeEnv({{kTokenFileEnv, dir.path() + "/x"}})).ok());
}

TEST(TokensEqualTest, EqualOnlyWhenIdentical) {
  EXPECT_TRUE(TokensEqual(kToken, kToken));
  EXPECT_TRUE(TokensEqual("", ""));
  std::string last = kToken;
  last.back() = 'G';
  EXPECT_FALSE(TokensEqual(kToken, last));
  std::string first = kToken;
  first.front() = 'x';
  EXPECT_FALSE(TokensEqual(kToken, first));
  EXPECT_FALSE(TokensEqual(kToken, kToken + "0"));
  EXPECT_FALSE(TokensEqual(kToken, kToken.substr(0, 31)));
  EXPECT_FALSE(TokensEqual("", "a"));
  // Bytes that XOR to zero only in part (prefix of zeros) still differ.
  EXPECT_FALSE(TokensEqual(std::string("a\0", 2), "a"));
}

TEST(LogRateLimiterTest, BurstPerWindowThenCountsWhatItDropped) {
  using Clock = LogRateLimiter::Clock;
  LogRateLimiter limiter(3, std::chrono::seconds(10));
  const Clock::time_point t0{};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(limiter.Allow(t0 + std::chrono::seconds(i)), 0u);
  for (int i = 0; i < 1000; ++i)
    EXPECT_FALSE(limiter.Allow(t0 + std::chrono::seconds(5)));
  auto next = limiter.Allow(t0 + std::chrono::seconds(10));
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, 1000u);
  EXPECT_EQ(limiter.Allow(t0 + std::chrono::seconds(11)), 0u);
}

TEST(LoadSecurityTest, RefusesHalfConfiguredTls) {
  TempDir dir;
  std::string cert = dir.Write("c.pem", "-----BEGIN CERTIFICATE-----\n", 0644);
  std::string key = dir.Write("k.pem", "-----BEGIN PRIVATE KEY-----\n", 0600);
  auto no_env = FakeEnv({});
  auto lone_cert = LoadClientSecurity({"", cert, cert, ""}, no_env);
  ASSERT_FALSE(lone_cert.ok());
  EXPECT_EQ(lone_cert.status().message(),
            "--tls-cert and --tls-key must be given together");
  auto no_ca = LoadClientSecurity({"", "", cert, key}, no_env);
  ASSERT_FALSE(no_ca.ok());
  EXPECT_EQ(no_ca.status().message(), "--tls-cert needs --tls-ca (the daemon's CA)");
  auto not_pem = LoadClientSecurity({"", key, "", ""}, no_env);
  ASSERT_FALSE(not_pem.ok());
  EXPECT_NE(not_pem.status().message().find("is not PEM"), std::string::npos);
  auto ok = LoadClientSecurity({"", cert, cert, key}, no_env);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->tls());
  auto client_ca_alone = LoadServerSecurity({"", "", "", cert}, no_env);
  ASSERT_FALSE(client_ca_alone.ok());
  EXPECT_EQ(client_ca_alone.status().message(),
            "--tls-client-ca needs --tls-cert and --tls-key");
  auto server = LoadServerSecurity({"", cert, key, cert}, FakeEnv({{kTokenEnv, kToken}}));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->token, kToken);
  EXPECT_FALSE(server->tls_client_ca_pem.empty());
}

TEST(LoadSecurityTest, FingerprintsTellSettingsApart) {
  ClientSecurity a, b;
  a.token = "ab";
  b.token = "a";
  b.tls_ca_pem = "b";
  EXPECT_NE(a.Fingerprint(), b.Fingerprint());
  EXPECT_EQ(a.Fingerprint(), ClientSecurity(a).Fingerprint());
  EXPECT_NE(ClientSecurity().Fingerprint(), a.Fingerprint());
}

}  // namespace
}  // namespace meshrun::rdzv
