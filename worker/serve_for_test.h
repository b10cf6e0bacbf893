// File: worker/serve_for_test.h  (tests only)
//
// Serves a gRPC service on a free loopback port, for tests that talk to a real server.
#ifndef RINGSERVE_WORKER_SERVE_FOR_TEST_H_
#define RINGSERVE_WORKER_SERVE_FOR_TEST_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

namespace ring::worker {

// Starts `service` (insecure) on 127.0.0.1 and a port the OS picks; sets *address to
// "127.0.0.1:PORT". Null when the server did not start.
inline std::unique_ptr<grpc::Server> ServeOnLoopbackForTest(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_SERVE_FOR_TEST_H_
