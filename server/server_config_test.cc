#include "server/server_config.h"

#include "gtest/gtest.h"

namespace ring {
namespace {

TEST(ServerConfigTest, ParsesAllSections) {
  auto c = ParseServerConfig(R"(
[server]
listen = "127.0.0.1:9000"
api_keys = ["sk-test-123456"]
max_concurrent_requests = 3
[model]
name = "m"
path = "tiny"
local_dir = "/tmp/tiny"
act_dtype = "f32"
[ring]
workers = ["127.0.0.1:7001", "127.0.0.1:7002"]
split = [3, 1]
)", "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->max_concurrent_requests, 3);
  RingOptions o = c->ToRingOptions();
  EXPECT_EQ(o.workers.size(), 2u);
  EXPECT_EQ(o.model, "tiny");
  EXPECT_EQ(o.split, (std::vector<int64_t>{3, 1}));
  ASSERT_TRUE(o.act_dtype.has_value());
  auto hp = c->ListenHostPort();
  EXPECT_EQ(hp->second, 9000);
}

TEST(ServerConfigTest, UnknownKeyIsNamed) {
  auto c = ParseServerConfig("[server]\nlisten_addr = \"x\"\n", "t.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("server.listen_addr"), std::string::npos) << c.status();
}

TEST(ServerConfigTest, WrongTypeIsNamed) {
  auto c = ParseServerConfig("[server]\nmax_concurrent_requests = \"4\"\n", "t.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("server.max_concurrent_requests must be an integer"), std::string::npos);
}

TEST(ServerConfigTest, SyntaxErrorHasLine) {
  auto c = ParseServerConfig("[server]\nlisten = \n", "bad.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("bad.toml:2"), std::string::npos) << c.status();
}

TEST(ServerConfigTest, AuthRequiredUnlessExplicitlyDisabled) {
  auto c = ParseServerConfig("[model]\nlocal_dir = \"/m\"\n", "t.toml");
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->Finalize().message().find("no API key"), std::string::npos);
  c = ParseServerConfig("[server]\nauth = \"disabled\"\n[model]\nlocal_dir = \"/m\"\n", "t.toml");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->model_name, "m");
  EXPECT_TRUE(c->workers.empty());
}

TEST(ServerConfigTest, RemoteRingNeedsLocalDir) {
  auto c = ParseServerConfig(
      "[server]\nauth = \"disabled\"\n[model]\npath = \"tiny\"\n[ring]\nworkers = [\"a:1\"]\n", "t.toml");
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->Finalize().message().find("local_dir"), std::string::npos);
}

TEST(ServerConfigTest, SplitMustMatchWorkers) {
  auto c = ParseServerConfig(
      "[server]\nauth = \"disabled\"\n[model]\nlocal_dir = \"/m\"\n[ring]\nworkers = [\"a:1\"]\nsplit = [1, 2]\n",
      "t.toml");
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->Finalize().message().find("ring.split"), std::string::npos);
}

}  // namespace
}  // namespace ring
