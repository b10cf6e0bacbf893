// File: server/jinja_ast.h
//
// The syntax tree the jinja parser builds (server/jinja_parser.cc) and the interpreter
// walks (server/jinja_interpreter.cc). One generic node type per layer keeps the tree
// small; each kind documents how it uses `args`, `name` and the other fields.
//
// Internal to the jinja engine; the public API is server/jinja.h.
#ifndef RINGSERVE_SERVER_JINJA_AST_H_
#define RINGSERVE_SERVER_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/jinja_value.h"

namespace ring::jinja {

struct SourcePos {
  int line = 1;
  int column = 1;
};

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kList,      // args: elements
  kTuple,     // args: elements
  kDict,      // args: key0, value0, key1, value1, ...
  kGetattr,   // args[0] object; name: attribute
  kGetitem,   // args[0] object; args[1] key (a kSlice for slicing)
  kSlice,     // args[0..2]: start, stop, step (null when omitted)
  kCall,      // args[0] callee; args[1..] positional; kwargs
  kFilter,    // args[0] operand; name: filter; args[1..] positional; kwargs
  kTest,      // args[0] operand; name: test; args[1..] positional; kwargs; negated
  kUnary,     // name: "-", "+" or "not"; args[0]
  kBinary,    // name: "+", "-", "*", "/", "//", "%", "**", "and", "or"; args[0], args[1]
  kCompare,   // args[0] first operand; ops[k] applies to args[k+1] (chained like Python)
  kConcat,    // args: operands of `~`
  kCondExpr,  // args[0] value if true; args[1] condition; args[2] value if false (or null)
};

struct Expr {
  ExprKind kind;
  SourcePos pos;
  std::string name;
  Value literal;
  bool negated = false;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  std::vector<std::string> ops;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  kText,         // text
  kOutput,       // expr
  kIf,           // conds[k] guards bodies[k] (if / elif...); else_body
  kFor,          // targets; expr: iterable; cond: loop filter (or null); body; else_body
  kSet,          // targets (one name, or several to unpack) or ns_attr; expr
  kSetBlock,     // targets[0]; body; filters: applied to the captured text
  kMacro,        // name; params + defaults (null when none); body; uses_* flags
  kCallBlock,    // expr: the call; params/defaults: caller's parameters; body: caller body
  kFilterBlock,  // filters (kFilter nodes with a null operand); body
  kWith,         // targets + values: assignments; body
  kBreak,
  kContinue,
  kGeneration,  // transformers' {% generation %}: renders its body unchanged
};

struct Stmt {
  StmtKind kind;
  SourcePos pos;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string ns_attr;  // `set ns.attr = ...`: targets[0] is the namespace name
  std::vector<ExprPtr> values;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;
  std::vector<ExprPtr> filters;
  bool uses_caller = false;
  bool uses_varargs = false;
  bool uses_kwargs = false;
};

// Parses template source (any newline convention; must be UTF-8). Errors are
// InvalidArgument "line L:C: ..." naming the construct.
absl::StatusOr<Body> ParseTemplateSource(absl::string_view source);

// Python's ast.literal_eval for the literals tool-call arguments use: strings (adjacent
// ones concatenated), numbers with an optional sign, True/False/None, lists, tuples and
// dicts. Anything else (names, operators, calls, sets) is InvalidArgument.
absl::StatusOr<Value> ParsePythonLiteral(absl::string_view text);

}  // namespace ring::jinja

#endif  // RINGSERVE_SERVER_JINJA_AST_H_
