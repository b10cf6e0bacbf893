// File: server/http_server.h
//
// A small HTTP/1.1 server on Boost.Asio with Beast's request parser: keep-alive, request
// size limits (413), deadlines on reading a request (slow-loris), on every write (a client
// that stops reading) and on idle keep-alive connections, a connection cap, chunked
// streaming responses (SSE) and disconnect detection while a response is being produced,
// so a handler can cancel work for a client that went away.
//
//   HttpServer::Options o; o.address = "127.0.0.1"; o.port = 8080;
//   RING_ASSIGN_OR_RETURN(auto server, HttpServer::Start(o, [](HttpRequest req,
//                                                             std::shared_ptr<HttpResponder> r) {
//     r->Send(200, "text/plain", "hello\n");
//   }));
//
// Handlers run on the server's I/O threads and must not block: long work goes to another
// thread, which answers through the (thread-safe) HttpResponder.
#ifndef RINGSERVE_SERVER_HTTP_SERVER_H_
#define RINGSERVE_SERVER_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ring::http {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, as sent
  std::string path;    // target without the query
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string peer;  // "ip:port"

  // Header value or "" (name lower-case).
  std::string Header(absl::string_view name) const;
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// How a handler answers. Thread-safe; every call returns at once (writes are queued).
// Exactly one of Send or StartStream(...)+EndStream per request.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void Send(int status, std::string content_type, std::string body,
                    HeaderList headers = {}) = 0;
  // Chunked response; then any number of WriteChunk and one EndStream.
  virtual void StartStream(int status, std::string content_type, HeaderList headers = {}) = 0;
  // false once the client is gone (the data is dropped).
  virtual bool WriteChunk(std::string data) = 0;
  virtual void EndStream() = 0;
  // True once the client closed the connection or a write timed out.
  virtual bool client_gone() const = 0;
  // Runs `fn` once, on an I/O thread, when the client disconnects before the response is
  // complete (immediately if it already has). Used to cancel the work behind a request.
  virtual void OnClientGone(std::function<void()> fn) = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;

class HttpServer {
 public:
  struct Options {
    std::string address = "127.0.0.1";
    int port = 8080;  // 0: any free port
    int threads = 2;
    int64_t max_body_bytes = 4 << 20;   // larger: 413
    int64_t max_header_bytes = 64 << 10;
    absl::Duration read_timeout = absl::Seconds(30);  // whole request, from its first byte
    absl::Duration idle_timeout = absl::Seconds(60);  // keep-alive wait for the next request
    absl::Duration write_timeout = absl::Seconds(30); // each write
    int max_connections = 512;  // more: 503 and close
    // Told (on an I/O thread) why a connection closed while a response was in progress:
    // the client left, a deadline passed, a socket error. Unset: not reported.
    std::function<void(const std::string&)> on_cut;
  };
  virtual ~HttpServer() = default;

  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const Options& options,
                                                           HttpHandler handler);
  virtual int port() const = 0;
  // Stops accepting and closes connections that are between requests; responses in
  // progress continue. Idempotent.
  virtual void StopAccepting() = 0;
  // After StopAccepting: waits up to `timeout` for every connection to close, which a
  // connection does once its response in progress is written out (a handler that has ended
  // its stream may still have bytes queued). False on timeout.
  virtual bool WaitUntilClosed(absl::Duration timeout) = 0;
  // Closes every connection and joins the I/O threads.
  virtual void Shutdown() = 0;
  virtual int64_t open_connections() const = 0;
};

// "200 OK" style reason phrase.
absl::string_view StatusReason(int status);

}  // namespace ring::http

#endif  // RINGSERVE_SERVER_HTTP_SERVER_H_
