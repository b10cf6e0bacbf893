// File: server/jinja_interpreter.h
//
// Walks a parsed template (server/jinja_ast.h) and renders it. Scoping follows jinja2:
// `set` binds in the innermost scope; each for-loop iteration and each macro call is a
// fresh scope whose parent is where the loop / macro was written (so a `set` inside a loop
// body never leaks out, and only namespace() objects carry state across iterations);
// `if` opens no scope; macros see their defining scope as it is at call time.
//
// Internal to the jinja engine; the public API is server/jinja.h.
#ifndef RINGSERVE_SERVER_JINJA_INTERPRETER_H_
#define RINGSERVE_SERVER_JINJA_INTERPRETER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/jinja_ast.h"
#include "server/jinja_value.h"

namespace ring::jinja {

struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;

  Value* Find(absl::string_view name);
  void Set(const std::string& name, Value v);
};

class Interpreter {
 public:
  // `context`: the render variables (a dict value), looked up after template scopes.
  explicit Interpreter(Value context) : context_(std::move(context)) {}

  absl::Status Render(const Body& body, std::string* out);

  // Calls a callable value (macro, builtin, bound method). Used by filters too.
  absl::StatusOr<Value> CallValue(const Value& callee, CallArgs& args);

  // Set by raise_exception(): the error then carries the template's message verbatim.
  void set_raised() { raised_ = true; }
  bool raised() const { return raised_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::StatusOr<Flow> Exec(const Body& body, const std::shared_ptr<Frame>& frame,
                            std::string* out);
  absl::StatusOr<Flow> ExecStmt(const Stmt& s, const std::shared_ptr<Frame>& frame,
                                std::string* out);
  absl::StatusOr<Flow> ExecFor(const Stmt& s, const std::shared_ptr<Frame>& frame,
                               std::string* out);
  absl::Status Assign(const std::vector<std::string>& targets, const Value& v, Frame* frame);
  Value MakeMacro(const Stmt& s, const std::shared_ptr<Frame>& frame, std::string name);

  absl::StatusOr<Value> Eval(const Expr& e, const std::shared_ptr<Frame>& frame);
  absl::StatusOr<Value> EvalInner(const Expr& e, const std::shared_ptr<Frame>& frame);
  absl::Status EvalCallArgs(const Expr& e, size_t first_arg, const std::shared_ptr<Frame>& frame,
                            CallArgs* args);
  Value Lookup(absl::string_view name, Frame* frame);
  // Every frame is made here so Render can break macro <-> frame reference cycles.
  std::shared_ptr<Frame> NewFrame(std::shared_ptr<Frame> parent);
  absl::Status Annotate(absl::Status s, SourcePos pos) const;

  Value context_;
  std::vector<std::weak_ptr<Frame>> frames_;
  size_t frames_pruned_at_ = 64;
  bool raised_ = false;
  int depth_ = 0;
};

}  // namespace ring::jinja

#endif  // RINGSERVE_SERVER_JINJA_INTERPRETER_H_
