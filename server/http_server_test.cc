#include "server/http_server.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "gtest/gtest.h"

namespace ring::http {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServer::Options o;
    o.address = "127.0.0.1";
    o.port = 0;
    o.max_body_bytes = 1024;
    o.read_timeout = absl::Milliseconds(300);
    o.idle_timeout = absl::Milliseconds(600);
    o.on_cut = [this](const std::string& why) {
      std::lock_guard<std::mutex> l(cut_mu_);
      cuts_.push_back(why);
    };
    auto s = HttpServer::Start(o, [this](HttpRequest req, std::shared_ptr<HttpResponder> r) {
      if (req.path == "/echo") {
        r->Send(200, "text/plain", req.method + " " + req.body);
      } else if (req.path == "/stream") {
        std::thread([r] {
          r->StartStream(200, "text/event-stream");
          for (int i = 0; i < 3; ++i) r->WriteChunk("data: " + std::to_string(i) + "\n\n");
          r->EndStream();
        }).detach();
      } else if (req.path == "/big") {
        std::thread([this, r] {
          r->StartStream(200, "application/octet-stream");
          const std::string chunk(kBigChunk, 'x');
          for (int i = 0; i < kBigChunks; ++i) r->WriteChunk(chunk);
          r->EndStream();
          big_done_ = true;
        }).detach();
      } else if (req.path == "/slow") {
        std::thread([r] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          r->Send(200, "text/plain", "slow done");
        }).detach();
      } else if (req.path == "/wait") {
        r->OnClientGone([this] { gone_ = true; });
        held_ = r;  // never answered: only the disconnect ends it
        waiting_ = true;
      } else {
        r->Send(404, "text/plain", "no");
      }
    });
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  void TearDown() override {
    held_.reset();
    server_->Shutdown();
  }

  tcp::socket Connect() {
    tcp::socket s(ioc_);
    s.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(server_->port())});
    return s;
  }
  // Reads until the peer closes or `until` appears; returns what was read.
  static std::string ReadUntil(tcp::socket& s, const std::string& until, int timeout_ms = 3000) {
    std::string out;
    char buf[4096];
    s.non_blocking(true);
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
      boost::system::error_code ec;
      size_t n = s.read_some(asio::buffer(buf), ec);
      if (ec == asio::error::would_block) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      if (ec) break;
      out.append(buf, n);
      if (!until.empty() && out.find(until) != std::string::npos) break;
    }
    return out;
  }

  std::vector<std::string> Cuts() {
    std::lock_guard<std::mutex> l(cut_mu_);
    return cuts_;
  }

  static constexpr int kBigChunk = 64 << 10, kBigChunks = 64;
  std::mutex cut_mu_;
  std::vector<std::string> cuts_;  // Options::on_cut reports
  asio::io_context ioc_;
  std::unique_ptr<HttpServer> server_;
  std::atomic<bool> gone_{false};
  std::atomic<bool> big_done_{false};
  std::atomic<bool> waiting_{false};
  std::shared_ptr<HttpResponder> held_;
};

TEST_F(HttpServerTest, KeepAliveServesTwoRequests) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")));
  std::string a = ReadUntil(s, "POST hi");
  EXPECT_NE(a.find("HTTP/1.1 200 OK"), std::string::npos) << a;
  asio::write(s, asio::buffer(std::string("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")));
  std::string b = ReadUntil(s, "GET ");
  EXPECT_NE(b.find("200 OK"), std::string::npos) << b;
}

// The next request's head arrives while the previous response is still being produced and
// its body only after that response is out: one reader owns the socket, so the body is
// neither lost between two reads nor waited for until the read deadline.
TEST_F(HttpServerTest, NextRequestSplitAcrossTheEndOfAResponse) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  asio::write(s, asio::buffer(std::string("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")));
  EXPECT_NE(ReadUntil(s, "slow done").find("slow done"), std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  asio::write(s, asio::buffer(std::string("hello")));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string second = ReadUntil(s, "POST hello", 2000);
  EXPECT_NE(second.find("POST hello"), std::string::npos) << second;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
  EXPECT_TRUE(Cuts().empty()) << Cuts()[0];
}

// Pipelined requests in one write are answered in order.
TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                                          "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab"
                                          "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")));
  const std::string got = ReadUntil(s, "GET ");
  const size_t a = got.find("slow done"), b = got.find("POST ab"), c = got.find("GET ");
  ASSERT_NE(a, std::string::npos) << got;
  ASSERT_NE(b, std::string::npos) << got;
  ASSERT_NE(c, std::string::npos) << got;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
}

// The same requests, pipelined, cut into random pieces sent with pauses (as a slow or
// fragmenting client would): every byte reaches the parser once, in order, whatever the
// phase it arrives in.
TEST_F(HttpServerTest, PipelinedRequestsCutAnywhereAreAnsweredInOrder) {
  const std::string requests =
      "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n1\r\nf\r\n0\r\n\r\n"
      "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\ngh";
  const std::vector<std::string> want = {"GET ", "POST abc", "POST def", "slow done", "POST gh"};
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    tcp::socket s = Connect();
    std::mt19937 rng(seed);
    for (size_t at = 0; at < requests.size();) {
      const size_t n = std::min<size_t>(requests.size() - at, 1 + rng() % 40);
      asio::write(s, asio::buffer(requests.data() + at, n));
      at += n;
      if (rng() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    }
    const std::string got = ReadUntil(s, "POST gh");
    size_t from = 0;
    for (const std::string& w : want) {
      const size_t found = got.find(w, from);
      ASSERT_NE(found, std::string::npos) << "seed " << seed << ": '" << w << "' missing or out of order in " << got;
      from = found + w.size();
    }
  }
  EXPECT_TRUE(Cuts().empty()) << Cuts()[0];
}

// Expect: 100-continue (curl sends it with bodies over 1 MB and waits a second for the
// interim response before sending the body).
TEST_F(HttpServerTest, ExpectContinueGetsAnInterimResponseBeforeTheBody) {
  tcp::socket s = Connect();
  const auto t0 = std::chrono::steady_clock::now();
  asio::write(s, asio::buffer(std::string(
                     "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")));
  const std::string interim = ReadUntil(s, "\r\n\r\n", 2000);
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  asio::write(s, asio::buffer(std::string("hello")));
  EXPECT_NE(ReadUntil(s, "POST hello").find("HTTP/1.1 200 OK"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
  // The connection goes on to the next request as usual.
  asio::write(s, asio::buffer(std::string("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")));
  const std::string next = ReadUntil(s, "GET ");
  EXPECT_NE(next.find("GET "), std::string::npos) << next;
  EXPECT_EQ(next.find("100 Continue"), std::string::npos) << next;
}

// A body the server would refuse is refused before the client sends it: no interim
// response, a 413.
TEST_F(HttpServerTest, ExpectContinueOverTheLimitIs413WithoutContinue) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string(
                     "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")));
  const std::string got = ReadUntil(s, "");
  EXPECT_EQ(got.find("100 Continue"), std::string::npos) << got;
  EXPECT_NE(got.find("413"), std::string::npos) << got;
}

// The read deadline still covers the whole request after the interim response: a client
// that never sends the body is cut off.
TEST_F(HttpServerTest, ExpectContinueWithoutTheBodyIsCutAtTheReadDeadline) {
  tcp::socket s = Connect();
  const auto t0 = std::chrono::steady_clock::now();
  asio::write(s, asio::buffer(std::string(
                     "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")));
  const std::string got = ReadUntil(s, "", 3000);  // until the server closes
  EXPECT_EQ(got, "HTTP/1.1 100 Continue\r\n\r\n");
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(250));  // read_timeout 300 ms in this fixture
  EXPECT_LT(took, std::chrono::milliseconds(2500));
}

TEST_F(HttpServerTest, BodyOverLimitIs413) {
  tcp::socket s = Connect();
  const std::string body(5000, 'x');
  asio::write(s, asio::buffer("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + body));
  std::string a = ReadUntil(s, "}\n");
  EXPECT_NE(a.find("413 Payload Too Large"), std::string::npos) << a;
}

TEST_F(HttpServerTest, MalformedRequestIs400) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string("GARBAGE\x01 / HTTP/9\r\n\r\n")));
  std::string a = ReadUntil(s, "}\n");
  EXPECT_NE(a.find("400 Bad Request"), std::string::npos) << a;
}

TEST_F(HttpServerTest, SlowLorisIsCutOff) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string("GET /echo HTTP/1.1\r\nHost: x\r\n")));  // never finished
  const auto t0 = std::chrono::steady_clock::now();
  std::string a = ReadUntil(s, "", 3000);  // returns when the server closes
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(a.empty()) << a;
  EXPECT_LT(waited, std::chrono::milliseconds(2500));
}

TEST_F(HttpServerTest, ChunkedStream) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")));
  std::string a = ReadUntil(s, "0\r\n\r\n");
  EXPECT_NE(a.find("Transfer-Encoding: chunked"), std::string::npos) << a;
  EXPECT_NE(a.find("data: 0"), std::string::npos);
  EXPECT_NE(a.find("data: 2"), std::string::npos);
  EXPECT_NE(a.find("0\r\n\r\n"), std::string::npos);
  EXPECT_TRUE(Cuts().empty());  // a whole response is no cut
}

TEST_F(HttpServerTest, DisconnectRunsGoneCallback) {
  {
    tcp::socket s = Connect();
    asio::write(s, asio::buffer(std::string("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(gone_.load());
  }  // closes
  for (int i = 0; i < 200 && !gone_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(gone_.load());
  // The cut is reported with its reason: the client's end of file.
  const std::vector<std::string> cuts = Cuts();
  ASSERT_EQ(cuts.size(), 1u);
  EXPECT_NE(cuts[0].find("closed with its response in progress"), std::string::npos) << cuts[0];
  EXPECT_NE(cuts[0].find("read: End of file"), std::string::npos) << cuts[0];
}

// Graceful stop: a handler that has ended its stream while the client is still reading
// (4 MiB, more than the socket buffers) leaves bytes queued; WaitUntilClosed returns once
// they are written and the connection closed, so Shutdown then cuts nothing.
TEST_F(HttpServerTest, GracefulStopDeliversAQueuedStream) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string("GET /big HTTP/1.1\r\nHost: x\r\n\r\n")));
  std::string got;
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the queue build up
    got = ReadUntil(s, "", 10000);
  });
  for (int i = 0; i < 500 && !big_done_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(big_done_.load()) << "the handler did not queue its stream within 5 s";
  server_->StopAccepting();
  EXPECT_TRUE(server_->WaitUntilClosed(absl::Seconds(10)));
  server_->Shutdown();
  reader.join();
  EXPECT_GE(got.size(), static_cast<size_t>(kBigChunk) * kBigChunks);
  EXPECT_EQ(got.substr(got.size() - 5), "0\r\n\r\n") << "stream cut before its last chunk";
}

TEST_F(HttpServerTest, WaitUntilClosedTimesOutOnAHeldResponse) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")));
  for (int i = 0; i < 200 && !waiting_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server_->StopAccepting();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(server_->WaitUntilClosed(absl::Milliseconds(200)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2000));
}

// Over Options::max_connections a client gets a 503 it can act on; a slot freed is reused.
TEST_F(HttpServerTest, ConnectionCapAnswers503) {
  HttpServer::Options o;
  o.address = "127.0.0.1";
  o.port = 0;
  o.max_connections = 2;
  auto capped = HttpServer::Start(o, [](HttpRequest req, std::shared_ptr<HttpResponder> r) {
    r->Send(200, "text/plain", "ok " + req.path);
  });
  ASSERT_TRUE(capped.ok()) << capped.status();
  auto connect = [&] {
    tcp::socket s(ioc_);
    s.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>((*capped)->port())});
    return s;
  };
  auto wait_open = [&](int64_t n) {
    for (int i = 0; i < 200 && (*capped)->open_connections() != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return (*capped)->open_connections();
  };
  tcp::socket a = connect();
  tcp::socket b = connect();
  ASSERT_EQ(wait_open(2), 2);
  tcp::socket c = connect();
  const std::string refused = ReadUntil(c, "");
  EXPECT_NE(refused.find("503 Service Unavailable"), std::string::npos) << refused;
  EXPECT_NE(refused.find("too many connections"), std::string::npos) << refused;
  a.close();
  ASSERT_EQ(wait_open(1), 1);
  tcp::socket d = connect();
  asio::write(d, asio::buffer(std::string("GET /d HTTP/1.1\r\nHost: x\r\n\r\n")));
  EXPECT_NE(ReadUntil(d, "ok /d").find("ok /d"), std::string::npos);
  (*capped)->Shutdown();
}

TEST_F(HttpServerTest, IdleKeepAliveIsClosed) {
  tcp::socket s = Connect();
  asio::write(s, asio::buffer(std::string("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")));
  ReadUntil(s, "GET ");
  const auto t0 = std::chrono::steady_clock::now();
  std::string rest = ReadUntil(s, "", 3000);
  EXPECT_TRUE(rest.empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2500));
  for (int i = 0; i < 100 && server_->open_connections() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->open_connections(), 0);
}

}  // namespace
}  // namespace ring::http
