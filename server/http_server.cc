#include "server/http_server.h"

#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ring::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(absl::ToChronoNanoseconds(d));
}

std::string Head(int status, absl::string_view content_type, const HeaderList& headers,
                 bool keep_alive) {
  std::string h = absl::StrCat("HTTP/1.1 ", status, " ", StatusReason(status), "\r\n");
  if (!content_type.empty()) absl::StrAppend(&h, "Content-Type: ", content_type, "\r\n");
  for (const auto& [k, v] : headers) absl::StrAppend(&h, k, ": ", v, "\r\n");
  absl::StrAppend(&h, "Connection: ", keep_alive ? "keep-alive" : "close", "\r\n");
  return h;
}

class ServerImpl;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, ServerImpl* server);
  void Start();
  // Closes the connection if it is between requests (graceful stop).
  void CloseIfIdle();
  // `why` (with `ec` when set) is reported through Options::on_cut if a response is cut.
  void Close(const char* why = "server shutdown", beast::error_code ec = {});

  // Responder entry points (any thread); `request_id` guards against stale responders.
  void Queue(uint64_t request_id, std::string data, bool last);
  void AddGoneCallback(uint64_t request_id, std::function<void()> fn);
  bool gone() const { return gone_.load(); }
  bool keep_alive() const { return keep_alive_.load(); }

 private:
  enum class Phase { kIdle, kReading, kHandling, kClosed };

  void SetDeadline(absl::Duration d);
  void SetDeadlineAt(std::chrono::steady_clock::time_point at);
  void ClearDeadline() { timer_.cancel(); }
  void StartReadSome();
  void OnReadSome(beast::error_code ec, size_t n);
  void Feed();
  void Reject(int status, absl::string_view message);
  void Dispatch(bhttp::request<bhttp::string_body> msg);
  void DoWrite();
  void OnResponseDone();
  void MarkGone();

  tcp::socket socket_;
  ServerImpl* server_;
  asio::strand<asio::any_io_executor> strand_;
  asio::steady_timer timer_;
  std::array<char, 16384> read_buf_;
  beast::flat_buffer buffer_;  // read, not yet parsed
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Phase phase_ = Phase::kIdle;
  bool reading_some_ = false;
  bool writing_ = false;
  bool response_complete_ = false;
  bool expect_checked_ = false;  // this request's Expect: 100-continue looked at (once)
  std::chrono::steady_clock::time_point read_deadline_;  // of the request being read
  std::deque<std::string> out_;
  uint64_t request_id_ = 0;
  std::atomic<bool> gone_{false};
  std::atomic<bool> keep_alive_{true};
  std::vector<std::function<void()>> on_gone_;
  std::string peer_;
};

class Responder final : public HttpResponder {
 public:
  Responder(std::shared_ptr<Session> s, uint64_t id) : session_(std::move(s)), id_(id) {}
  void Send(int status, std::string content_type, std::string body, HeaderList headers) override {
    if (started_.exchange(true)) return;
    std::string msg = Head(status, content_type, headers, session_->keep_alive());
    absl::StrAppend(&msg, "Content-Length: ", body.size(), "\r\n\r\n", body);
    session_->Queue(id_, std::move(msg), /*last=*/true);
  }
  void StartStream(int status, std::string content_type, HeaderList headers) override {
    if (started_.exchange(true)) return;
    std::string msg = Head(status, content_type, headers, session_->keep_alive());
    absl::StrAppend(&msg, "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n"
                          "X-Accel-Buffering: no\r\n\r\n");
    session_->Queue(id_, std::move(msg), false);
  }
  bool WriteChunk(std::string data) override {
    if (session_->gone()) return false;
    if (data.empty()) return true;  // an empty chunk would end the stream
    session_->Queue(id_, absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"), false);
    return !session_->gone();
  }
  void EndStream() override {
    if (ended_.exchange(true)) return;
    session_->Queue(id_, "0\r\n\r\n", true);
  }
  bool client_gone() const override { return session_->gone(); }
  void OnClientGone(std::function<void()> fn) override {
    session_->AddGoneCallback(id_, std::move(fn));
  }

 private:
  std::shared_ptr<Session> session_;
  const uint64_t id_;
  std::atomic<bool> started_{false};
  std::atomic<bool> ended_{false};
};

class ServerImpl final : public HttpServer {
 public:
  ServerImpl(const Options& o, HttpHandler h)
      : options_(o), handler_(std::move(h)), acceptor_(asio::make_strand(ioc_)) {}
  ~ServerImpl() override { Shutdown(); }

  absl::Status Listen() {
    beast::error_code ec;
    auto addr = asio::ip::make_address(options_.address, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("listen address '", options_.address, "': ", ec.message()));
    tcp::endpoint ep(addr, static_cast<unsigned short>(options_.port));
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.address, ":",
                                                 options_.port, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < std::max(1, options_.threads); ++i) {
      threads_.emplace_back([this] { ioc_.run(); });
    }
    return absl::OkStatus();
  }

  int port() const override { return port_; }

  void StopAccepting() override {
    if (stopping_.exchange(true)) return;
    asio::post(acceptor_.get_executor(), [this] {
      beast::error_code ec;
      acceptor_.close(ec);
    });
    for (auto& s : Sessions()) s->CloseIfIdle();
  }

  bool WaitUntilClosed(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (open_connections() > 0) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  void Shutdown() override {
    std::call_once(shutdown_once_, [this] {
      StopAccepting();
      for (auto& s : Sessions()) s->Close();
      work_.reset();
      ioc_.stop();
      for (auto& t : threads_) t.join();
    });
  }

  // The session set itself, not a counter beside it, so the drain cannot disagree with it.
  int64_t open_connections() const override {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<int64_t>(sessions_.size());
  }

  const Options& options() const { return options_; }
  const HttpHandler& handler() const { return handler_; }
  bool stopping() const { return stopping_.load(); }
  void Forget(Session* s) {
    std::lock_guard<std::mutex> l(mu_);
    sessions_.erase(s);
  }

 private:
  std::vector<std::shared_ptr<Session>> Sessions() {
    std::vector<std::shared_ptr<Session>> out;
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [p, w] : weak_) {
      if (sessions_.count(p)) {
        if (auto s = w.lock()) out.push_back(std::move(s));
      }
    }
    return out;
  }

  void Accept() {
    acceptor_.async_accept(asio::make_strand(ioc_), [this](beast::error_code ec, tcp::socket sock) {
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      } else if (open_connections() >= options_.max_connections) {
        // Over the cap: a short 503 rather than a silent reset, so clients know to back off.
        static const std::string kBusy =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Retry-After: 1\r\nConnection: close\r\nContent-Length: 105\r\n\r\n"
            "{\"error\":{\"message\":\"too many connections\",\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}\n";
        beast::error_code wec;
        asio::write(sock, asio::buffer(kBusy), wec);
        sock.shutdown(tcp::socket::shutdown_both, wec);
        sock.close(wec);
      } else {
        auto s = std::make_shared<Session>(std::move(sock), this);
        {
          std::lock_guard<std::mutex> l(mu_);
          sessions_.insert(s.get());
          weak_[s.get()] = s;
          // Drop expired weak pointers now and then so the map stays small.
          if (weak_.size() > 2 * sessions_.size() + 64) {
            for (auto it = weak_.begin(); it != weak_.end();) {
              it = sessions_.count(it->first) ? std::next(it) : weak_.erase(it);
            }
          }
        }
        s->Start();
      }
      if (!stopping_.load()) Accept();
    });
  }

  const Options options_;
  const HttpHandler handler_;
  asio::io_context ioc_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{ioc_.get_executor()};
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::once_flag shutdown_once_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::set<Session*> sessions_;
  std::map<Session*, std::weak_ptr<Session>> weak_;
};

Session::Session(tcp::socket socket, ServerImpl* server)
    : socket_(std::move(socket)),
      server_(server),
      strand_(socket_.get_executor()),
      timer_(strand_) {
  beast::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (!ec) peer_ = absl::StrCat(ep.address().to_string(), ":", ep.port());
}

void Session::Start() {
  asio::dispatch(strand_, [self = shared_from_this()] {
    self->SetDeadline(self->server_->options().idle_timeout);
    self->StartReadSome();
  });
}

void Session::SetDeadline(absl::Duration d) { SetDeadlineAt(std::chrono::steady_clock::now() + ToChrono(d)); }

void Session::SetDeadlineAt(std::chrono::steady_clock::time_point at) {
  timer_.expires_at(at);
  timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (!ec) self->Close("deadline passed");  // slow or dead peer
  });
}

void Session::StartReadSome() {
  if (reading_some_ || phase_ == Phase::kClosed) return;
  // Bound what a client can pipeline while its previous request is being answered.
  const int64_t cap = server_->options().max_header_bytes + server_->options().max_body_bytes;
  if (static_cast<int64_t>(buffer_.size()) > cap) return;
  reading_some_ = true;
  socket_.async_read_some(asio::buffer(read_buf_),
                          asio::bind_executor(strand_, [self = shared_from_this()](
                                                           beast::error_code ec, size_t n) {
                            self->OnReadSome(ec, n);
                          }));
}

// The one read on the socket, in every phase: a second reader (a parser's own read next to
// the disconnect watch) would split a request's bytes between two buffers.
void Session::OnReadSome(beast::error_code ec, size_t n) {
  reading_some_ = false;
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    // EOF or reset: while a response is being produced this is the client going away.
    Close(phase_ == Phase::kReading ? "request read" : "read", ec);
    return;
  }
  // Copied rather than read into buffer_.prepare(): parsing may consume (and so move) the
  // buffered bytes while this read is outstanding.
  auto dst = buffer_.prepare(n);
  std::memcpy(dst.data(), read_buf_.data(), n);
  buffer_.commit(n);
  Feed();
  StartReadSome();  // the rest of a request, the next one, or a disconnect while handling
}

// Parses what is buffered while between or inside requests; bytes that arrive while a
// response is in progress wait in `buffer_` (pipelining, bounded in StartReadSome).
void Session::Feed() {
  while ((phase_ == Phase::kIdle || phase_ == Phase::kReading) && buffer_.size() > 0) {
    if (phase_ == Phase::kIdle) {
      if (server_->stopping()) {
        Close("stopping");
        return;
      }
      phase_ = Phase::kReading;
      read_deadline_ = std::chrono::steady_clock::now() + ToChrono(server_->options().read_timeout);
      SetDeadlineAt(read_deadline_);  // the whole request, from its first byte
      expect_checked_ = false;
      parser_.emplace();
      parser_->body_limit(static_cast<uint64_t>(server_->options().max_body_bytes));
      parser_->header_limit(static_cast<uint32_t>(server_->options().max_header_bytes));
    }
    beast::error_code ec;
    const size_t used = parser_->put(buffer_.data(), ec);
    buffer_.consume(used);
    if (ec == bhttp::error::need_more) {
      if (used == 0) return;
      continue;
    }
    if (ec == bhttp::error::body_limit) {
      Reject(413, absl::StrCat("request body over the limit of ", server_->options().max_body_bytes, " bytes"));
      return;
    }
    if (ec == bhttp::error::header_limit) {
      Reject(431, "request headers too large");
      return;
    }
    if (ec) {
      Reject(400, absl::StrCat("malformed HTTP request: ", ec.message()));
      return;
    }
    if (parser_->is_done()) {
      Dispatch(parser_->release());
      return;
    }
    // A client that asked to be told before it sends the body (curl does above 1 MB) would
    // otherwise wait a second for this. The limits were checked with the header: a body
    // over them was refused above instead.
    // Decided once, as the header completes; not when the body has already begun.
    if (parser_->is_header_done() && !expect_checked_) {
      expect_checked_ = true;
      const auto& head = parser_->get();
      if (buffer_.size() == 0 && head.version() >= 11 &&
          beast::iequals(head[bhttp::field::expect], "100-continue")) {
        out_.push_back("HTTP/1.1 100 Continue\r\n\r\n");
        if (!writing_) DoWrite();
      }
    }
    if (used == 0) return;
  }
}

void Session::Reject(int status, absl::string_view message) {
  phase_ = Phase::kHandling;
  ClearDeadline();
  keep_alive_ = false;  // the stream position is unknown after a bad request
  nlohmann::json err = {{"error", {{"message", std::string(message)},
                                   {"type", "invalid_request_error"},
                                   {"param", nullptr},
                                   {"code", nullptr}}}};
  const std::string body = err.dump() + "\n";
  ++request_id_;
  response_complete_ = false;
  std::string msg = Head(status, "application/json", {}, false);
  absl::StrAppend(&msg, "Content-Length: ", body.size(), "\r\n\r\n", body);
  out_.push_back(std::move(msg));
  response_complete_ = true;
  if (!writing_) DoWrite();  // after an interim "100 Continue" still being written
}

void Session::Dispatch(bhttp::request<bhttp::string_body> msg) {
  phase_ = Phase::kHandling;
  ClearDeadline();
  keep_alive_ = msg.keep_alive() && !server_->stopping();
  response_complete_ = false;
  on_gone_.clear();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& f : msg) {
    req.headers[absl::AsciiStrToLower(std::string(f.name_string()))] = std::string(f.value());
  }
  req.body = std::move(msg.body());
  req.peer = peer_;
  const uint64_t id = ++request_id_;
  auto responder = std::make_shared<Responder>(shared_from_this(), id);
  server_->handler()(std::move(req), std::move(responder));
}

void Session::Queue(uint64_t request_id, std::string data, bool last) {
  asio::post(strand_, [self = shared_from_this(), request_id, data = std::move(data), last]() mutable {
    if (request_id != self->request_id_ || self->phase_ == Phase::kClosed ||
        self->response_complete_) {
      return;
    }
    self->out_.push_back(std::move(data));
    if (last) self->response_complete_ = true;
    if (!self->writing_) self->DoWrite();
  });
}

void Session::DoWrite() {
  if (out_.empty() || phase_ == Phase::kClosed) return;
  writing_ = true;
  SetDeadline(server_->options().write_timeout);
  asio::async_write(socket_, asio::buffer(out_.front()),
                    asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec,
                                                                             size_t) {
                      self->writing_ = false;
                      if (ec) {
                        self->Close("write", ec);
                        return;
                      }
                      self->out_.pop_front();
                      if (!self->out_.empty()) {
                        self->DoWrite();
                      } else if (self->phase_ == Phase::kReading) {
                        self->SetDeadlineAt(self->read_deadline_);  // an interim response went out
                      } else {
                        self->ClearDeadline();
                        if (self->response_complete_ && self->phase_ == Phase::kHandling) self->OnResponseDone();
                      }
                    }));
}

void Session::OnResponseDone() {
  on_gone_.clear();
  if (!keep_alive_ || server_->stopping()) {
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    Close("response done");
    return;
  }
  phase_ = Phase::kIdle;
  SetDeadline(server_->options().idle_timeout);
  Feed();           // a pipelined request already buffered
  StartReadSome();  // no-op while the read is outstanding
}

void Session::CloseIfIdle() {
  asio::post(strand_, [self = shared_from_this()] {
    if (self->phase_ == Phase::kIdle) self->Close();
  });
}

void Session::Close(const char* why, beast::error_code ec) {
  asio::dispatch(strand_, [self = shared_from_this(), why, ec] {
    if (self->phase_ == Phase::kClosed) return;
    const bool mid_response = self->phase_ == Phase::kHandling && !self->response_complete_;
    const auto& on_cut = self->server_->options().on_cut;
    if ((mid_response || !self->out_.empty()) && on_cut) {
      on_cut(absl::StrCat("connection ", self->peer_, " closed with its response ",
                          mid_response ? "in progress" : "not fully written", " (", self->out_.size(),
                          " write(s) queued): ", why, ec ? absl::StrCat(": ", ec.message()) : ""));
    }
    self->phase_ = Phase::kClosed;
    beast::error_code ec;
    self->timer_.cancel();
    self->socket_.close(ec);
    if (mid_response) self->MarkGone();
    self->gone_ = true;
    self->server_->Forget(self.get());
  });
}

void Session::MarkGone() {
  gone_ = true;
  auto fns = std::move(on_gone_);
  on_gone_.clear();
  for (auto& fn : fns) fn();
}

void Session::AddGoneCallback(uint64_t request_id, std::function<void()> fn) {
  asio::post(strand_, [self = shared_from_this(), request_id, fn = std::move(fn)]() mutable {
    if (request_id != self->request_id_) return;
    if (self->phase_ == Phase::kClosed) {
      fn();
      return;
    }
    if (self->response_complete_) return;
    self->on_gone_.push_back(std::move(fn));
  });
}

}  // namespace

std::string HttpRequest::Header(absl::string_view name) const {
  auto it = headers.find(std::string(name));
  return it == headers.end() ? "" : it->second;
}

absl::string_view StatusReason(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
  }
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const Options& options,
                                                              HttpHandler handler) {
  auto s = std::make_unique<ServerImpl>(options, std::move(handler));
  if (auto st = s->Listen(); !st.ok()) return st;
  return s;
}

}  // namespace ring::http
