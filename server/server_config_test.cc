#include "server/server_config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
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

// The example operators copy (docs/operations.md) must stay a valid config.
TEST(ServerConfigTest, ShippedExampleParses) {
  std::ifstream f(std::string(RING_SOURCE_DIR) + "/deploy/ring.toml.example");
  ASSERT_TRUE(f.good());
  std::stringstream text;
  text << f.rdbuf();
  auto c = ParseServerConfig(text.str(), "ring.toml.example");
  ASSERT_TRUE(c.ok()) << c.status();
  RingOptions o = c->ToRingOptions();
  EXPECT_EQ(o.workers.size(), 3u);
  int64_t layers = 0;
  for (int64_t n : o.split) layers += n;
  EXPECT_EQ(layers, 78);  // GLM-5.2
  EXPECT_EQ(c->admission_prompt_len, 8);
  EXPECT_EQ(c->auth_token_file, "/etc/ringserve/ring.token");
  EXPECT_EQ(o.transport, RingTransport::kAuto);
}

TEST(ServerConfigTest, TransportIsAutoOrGrpc) {
  auto parse = [](const std::string& transport) {
    return ParseServerConfig(absl::StrCat("[server]\nauth = \"disabled\"\n[model]\nlocal_dir = \"/tmp/m\"\n",
                                          "[ring]\nworkers = [\"127.0.0.1:7001\"]\n", transport),
                             "t.toml");
  };
  auto c = parse("");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->ToRingOptions().transport, RingTransport::kAuto);
  c = parse("transport = \"grpc\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->Finalize().ok());
  EXPECT_EQ(c->ToRingOptions().transport, RingTransport::kGrpc);
  c = parse("transport = \"nccl\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Status s = c->Finalize();
  EXPECT_NE(s.message().find("ring.transport"), std::string::npos) << s;
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
