// File: server/jinja_interpreter.cc
//
// Statement execution and expression evaluation; operators follow Python (true division,
// floor `//` and `%`, str/list `+` and `*`, chained comparisons, `and`/`or` returning an
// operand). Filters, tests and attribute lookup live in server/jinja_builtins.cc.
#include "server/jinja_interpreter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/jinja_builtins.h"

namespace ring::jinja {
namespace {

// Bounds that keep a hostile template from exhausting the server.
constexpr int kMaxCallDepth = 200;
constexpr size_t kMaxOutputBytes = size_t{64} << 20;

absl::Status TypeError(absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat("TypeError: ", msg));
}

absl::StatusOr<Value> Arith(absl::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  auto unsupported = [&]() {
    return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", PyTypeName(a),
                                  "' and '", PyTypeName(b), "'"));
  };
  if (a.is_number() && b.is_number()) {
    const bool ints = a.is_integral() && b.is_integral();
    const int64_t x = a.int_value(), y = b.int_value();
    const double fx = a.number_value(), fy = b.number_value();
    int64_t r;
    if (op == "+") {
      if (!ints) return Value::Float(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) return absl::InvalidArgumentError("integer overflow");
      return Value::Int(r);
    }
    if (op == "-") {
      if (!ints) return Value::Float(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) return absl::InvalidArgumentError("integer overflow");
      return Value::Int(r);
    }
    if (op == "*") {
      if (!ints) return Value::Float(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) return absl::InvalidArgumentError("integer overflow");
      return Value::Int(r);
    }
    if (op == "/") {
      if (fy == 0) return absl::InvalidArgumentError("ZeroDivisionError: division by zero");
      return Value::Float(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (fy == 0) {
        return absl::InvalidArgumentError(op == "//" ? "ZeroDivisionError: integer division by zero"
                                                     : "ZeroDivisionError: integer modulo by zero");
      }
      if (ints) {
        if (x == INT64_MIN && y == -1) return absl::InvalidArgumentError("integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::Int(op == "//" ? q : m);
      }
      // CPython _float_div_mod, signed zeros included.
      double mod = std::fmod(fx, fy);
      double div = (fx - mod) / fy;
      if (mod != 0) {
        if ((fy < 0) != (mod < 0)) {
          mod += fy;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, fy);
      }
      if (op == "%") return Value::Float(mod);
      double floordiv;
      if (div != 0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
      } else {
        floordiv = std::copysign(0.0, fx / fy);
      }
      return Value::Float(floordiv);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t result = 1, base = x;
        for (int64_t e = y; e > 0; e >>= 1) {
          if (e & 1) {
            if (__builtin_mul_overflow(result, base, &result)) {
              return absl::InvalidArgumentError("integer overflow");
            }
          }
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) {
            return absl::InvalidArgumentError("integer overflow");
          }
        }
        return Value::Int(result);
      }
      return Value::Float(std::pow(fx, fy));
    }
    return unsupported();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::String(a.str() + b.str());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value::MakeList(std::move(out), a.is_tuple());
    }
    if (a.is_string() && !b.is_string()) {
      return TypeError(
          absl::StrCat("can only concatenate str (not \"", PyTypeName(b), "\") to str"));
    }
    return unsupported();
  }
  if (op == "*") {
    const Value* seq = a.is_integral() ? &b : &a;
    const Value* count = a.is_integral() ? &a : &b;
    if (count->is_integral() && (seq->is_string() || seq->is_list())) {
      int64_t n = std::max<int64_t>(0, count->int_value());
      size_t unit = seq->is_string() ? seq->str().size() : seq->list().size();
      if (unit != 0 && static_cast<uint64_t>(n) * unit > kMaxOutputBytes) {
        return absl::InvalidArgumentError("repetition result too large");
      }
      if (seq->is_string()) {
        std::string out;
        for (int64_t k = 0; k < n; ++k) out += seq->str();
        return Value::String(std::move(out));
      }
      List out;
      for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq->list().begin(), seq->list().end());
      return Value::MakeList(std::move(out), seq->is_tuple());
    }
  }
  return unsupported();
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (!item.is_string()) {
        return TypeError(
            absl::StrCat("'in <string>' requires string as left operand, not ", PyTypeName(item)));
      }
      return absl::StrContains(container.str(), item.str());
    case Kind::kList:
      for (const Value& v : container.list()) {
        if (PyEquals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      if (!PyHashable(item)) return absl::InvalidArgumentError(UnhashableMessage(item));
      return container.dict().Find(item) != nullptr;
    case Kind::kUndefined:
      return false;
    default:
      return TypeError(
          absl::StrCat("argument of type '", PyTypeName(container), "' is not iterable"));
  }
}

}  // namespace

// --- frames ------------------------------------------------------------------------------

Value* Frame::Find(absl::string_view name) {
  for (auto& [k, v] : vars) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Frame::Set(const std::string& name, Value v) {
  if (Value* existing = Find(name)) {
    *existing = std::move(v);
    return;
  }
  vars.emplace_back(name, std::move(v));
}

Value Interpreter::Lookup(absl::string_view name, Frame* frame) {
  for (Frame* f = frame; f != nullptr; f = f->parent.get()) {
    if (Value* v = f->Find(name)) return *v;
  }
  if (context_.is_dict()) {
    if (const Value* v = context_.dict().Find(name)) return *v;
  }
  Value g = LookupGlobal(name);
  if (!g.is_undefined()) return g;
  return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
}

absl::Status Interpreter::Annotate(absl::Status s, SourcePos pos) const {
  if (s.ok() || raised_ || absl::StartsWith(s.message(), "line ")) return s;
  return absl::Status(s.code(),
                      absl::StrCat("line ", pos.line, ":", pos.column, ": ", s.message()));
}

std::shared_ptr<Frame> Interpreter::NewFrame(std::shared_ptr<Frame> parent) {
  auto f = std::make_shared<Frame>();
  f->parent = std::move(parent);
  if (frames_.size() >= frames_pruned_at_ * 2) {  // amortized pruning of dead frames
    frames_.erase(std::remove_if(frames_.begin(), frames_.end(),
                                 [](const std::weak_ptr<Frame>& w) { return w.expired(); }),
                  frames_.end());
    frames_pruned_at_ = std::max<size_t>(frames_.size(), 64);
  }
  frames_.push_back(f);
  return f;
}

// --- statements --------------------------------------------------------------------------

absl::Status Interpreter::Render(const Body& body, std::string* out) {
  absl::StatusOr<Flow> flow = Exec(body, NewFrame(nullptr), out);
  // Macros capture the frame they were defined in, and frames hold the macros: cycles.
  // No value outlives the render (the output is a string), so sever every frame now.
  for (const std::weak_ptr<Frame>& weak : frames_) {
    if (std::shared_ptr<Frame> f = weak.lock()) {
      f->vars.clear();
      f->parent.reset();
    }
  }
  frames_.clear();
  return flow.status();
}

absl::StatusOr<Interpreter::Flow> Interpreter::Exec(const Body& body,
                                                    const std::shared_ptr<Frame>& frame,
                                                    std::string* out) {
  for (const StmtPtr& s : body) {
    absl::StatusOr<Flow> flow = ExecStmt(*s, frame, out);
    if (!flow.ok()) return Annotate(flow.status(), s->pos);
    if (*flow != Flow::kNormal) return flow;
    if (out->size() > kMaxOutputBytes) {
      return absl::InvalidArgumentError("rendered output exceeds 64 MiB");
    }
  }
  return Flow::kNormal;
}

absl::Status Interpreter::Assign(const std::vector<std::string>& targets, const Value& v,
                                 Frame* frame) {
  if (targets.size() == 1) {
    frame->Set(targets[0], v);
    return absl::OkStatus();
  }
  absl::StatusOr<List> items = v.is_string() || v.is_list() || v.is_dict()
                                   ? Iterate(v)
                                   : absl::StatusOr<List>(TypeError(absl::StrCat(
                                         "cannot unpack non-iterable ", PyTypeName(v), " object")));
  if (!items.ok()) return items.status();
  if (items->size() != targets.size()) {
    return absl::InvalidArgumentError(
        items->size() > targets.size()
            ? absl::StrCat("ValueError: too many values to unpack (expected ", targets.size(), ")")
            : absl::StrCat("ValueError: not enough values to unpack (expected ", targets.size(),
                           ", got ", items->size(), ")"));
  }
  for (size_t k = 0; k < targets.size(); ++k) frame->Set(targets[k], (*items)[k]);
  return absl::OkStatus();
}

Value Interpreter::MakeMacro(const Stmt& s, const std::shared_ptr<Frame>& frame, std::string name) {
  const Stmt* macro = &s;
  std::shared_ptr<Frame> defining = frame;
  return Value::MakeCallable(
      "macro '" + name + "'",
      [macro, defining, name](Interpreter& interp, CallArgs& call) -> absl::StatusOr<Value> {
        std::shared_ptr<Frame> f = interp.NewFrame(defining);
        const size_t nparams = macro->params.size();
        List extra_args;
        for (size_t k = 0; k < call.args.size(); ++k) {
          if (k < nparams) {
            f->Set(macro->params[k], call.args[k]);
          } else {
            extra_args.push_back(call.args[k]);
          }
        }
        if (!extra_args.empty() && !macro->uses_varargs) {
          return TypeError(
              absl::StrCat("macro '", name, "' takes not more than ", nparams, " argument(s)"));
        }
        Dict extra_kwargs;
        Value caller;
        for (auto& [key, value] : call.kwargs) {
          if (key == "caller") {
            caller = value;
            continue;
          }
          auto it = std::find(macro->params.begin(), macro->params.end(), key);
          if (it == macro->params.end()) {
            if (!macro->uses_kwargs) {
              return TypeError(
                  absl::StrCat("macro '", name, "' takes no keyword argument '", key, "'"));
            }
            extra_kwargs.Set(Value::String(key), value);
            continue;
          }
          if (static_cast<size_t>(it - macro->params.begin()) < call.args.size()) {
            return TypeError(
                absl::StrCat("macro '", name, "' got multiple values for argument '", key, "'"));
          }
          f->Set(key, value);
        }
        for (size_t k = 0; k < nparams; ++k) {
          if (f->Find(macro->params[k])) continue;
          if (macro->defaults[k]) {
            absl::StatusOr<Value> d = interp.Eval(*macro->defaults[k], f);
            if (!d.ok()) return d.status();
            f->Set(macro->params[k], *d);
          } else {
            f->Set(macro->params[k], Value::Undefined(absl::StrCat("parameter '", macro->params[k],
                                                                   "' was not provided")));
          }
        }
        if (macro->uses_varargs) f->Set("varargs", Value::MakeList(std::move(extra_args), true));
        if (macro->uses_kwargs) f->Set("kwargs", Value::MakeDict(std::move(extra_kwargs)));
        if (!caller.is_undefined()) f->Set("caller", caller);
        if (++interp.depth_ > kMaxCallDepth) {
          --interp.depth_;
          return absl::InvalidArgumentError("maximum recursion depth exceeded");
        }
        std::string out;
        absl::StatusOr<Flow> flow = interp.Exec(macro->body, f, &out);
        --interp.depth_;
        if (!flow.ok()) return flow.status();
        return Value::String(std::move(out));
      });
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecStmt(const Stmt& s,
                                                        const std::shared_ptr<Frame>& frame,
                                                        std::string* out) {
  switch (s.kind) {
    case StmtKind::kText:
      out->append(s.text);
      return Flow::kNormal;
    case StmtKind::kOutput: {
      absl::StatusOr<Value> v = Eval(*s.expr, frame);
      if (!v.ok()) return v.status();
      out->append(PyStr(*v));
      return Flow::kNormal;
    }
    case StmtKind::kIf: {
      for (size_t k = 0; k < s.conds.size(); ++k) {
        absl::StatusOr<Value> c = Eval(*s.conds[k], frame);
        if (!c.ok()) return c.status();
        if (c->Truthy()) return Exec(s.bodies[k], frame, out);
      }
      return Exec(s.else_body, frame, out);
    }
    case StmtKind::kFor:
      return ExecFor(s, frame, out);
    case StmtKind::kSet: {
      absl::StatusOr<Value> v = Eval(*s.expr, frame);
      if (!v.ok()) return v.status();
      if (!s.ns_attr.empty()) {
        Value target = Lookup(s.targets[0], frame.get());
        if (!target.is_namespace()) {
          return absl::InvalidArgumentError(
              absl::StrCat("cannot assign attribute on non-namespace object '", s.targets[0], "'"));
        }
        if (absl::StartsWith(s.ns_attr, "_")) {
          return absl::InvalidArgumentError(absl::StrCat(
              "SecurityError: chat templates cannot store underscore-prefixed attributes on a "
              "namespace, but got '",
              s.ns_attr, "'"));
        }
        // The one way state grows across loop iterations: keep it printable and freeable
        // (values are freed recursively).
        if (v->depth() > kMaxValueDepth) {
          return absl::InvalidArgumentError("value nested too deeply");
        }
        target.ns().attrs.Set(Value::String(s.ns_attr), *v);
        return Flow::kNormal;
      }
      absl::Status st = Assign(s.targets, *v, frame.get());
      if (!st.ok()) return st;
      return Flow::kNormal;
    }
    case StmtKind::kSetBlock:
    case StmtKind::kFilterBlock: {
      std::shared_ptr<Frame> inner = NewFrame(frame);
      std::string captured;
      absl::StatusOr<Flow> flow = Exec(s.body, inner, &captured);
      if (!flow.ok()) return flow.status();
      Value v = Value::String(std::move(captured));
      for (const ExprPtr& f : s.filters) {
        CallArgs args;
        absl::Status st = EvalCallArgs(*f, 1, frame, &args);
        if (!st.ok()) return st;
        absl::StatusOr<Value> r = ApplyFilter(*this, f->name, v, args);
        if (!r.ok()) return Annotate(r.status(), f->pos);
        v = std::move(*r);
      }
      if (s.kind == StmtKind::kFilterBlock) {
        out->append(PyStr(v));
      } else {
        frame->Set(s.targets[0], std::move(v));
      }
      return Flow::kNormal;
    }
    case StmtKind::kMacro:
      frame->Set(s.name, MakeMacro(s, frame, s.name));
      return Flow::kNormal;
    case StmtKind::kCallBlock: {
      const Expr& call = *s.expr;
      absl::StatusOr<Value> callee = Eval(*call.args[0], frame);
      if (!callee.ok()) return callee.status();
      CallArgs args;
      absl::Status st = EvalCallArgs(call, 1, frame, &args);
      if (!st.ok()) return st;
      args.kwargs.emplace_back("caller", MakeMacro(s, frame, "caller"));
      absl::StatusOr<Value> r = CallValue(*callee, args);
      if (!r.ok()) return r.status();
      out->append(PyStr(*r));
      return Flow::kNormal;
    }
    case StmtKind::kWith: {
      std::shared_ptr<Frame> inner = NewFrame(frame);
      for (size_t k = 0; k < s.targets.size(); ++k) {
        absl::StatusOr<Value> v = Eval(*s.values[k], frame);
        if (!v.ok()) return v.status();
        inner->Set(s.targets[k], *v);
      }
      return Exec(s.body, inner, out);
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kGeneration:
      return Exec(s.body, frame, out);
  }
  return Flow::kNormal;
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecFor(const Stmt& s,
                                                       const std::shared_ptr<Frame>& frame,
                                                       std::string* out) {
  absl::StatusOr<Value> iterable = Eval(*s.expr, frame);
  if (!iterable.ok()) return iterable.status();
  absl::StatusOr<List> all = Iterate(*iterable);
  if (!all.ok()) return all.status();
  List items;
  if (s.cond) {  // `for x in xs if cond`: filtered before loop.* is computed
    for (Value& item : *all) {
      std::shared_ptr<Frame> probe = NewFrame(frame);
      absl::Status st = Assign(s.targets, item, probe.get());
      if (!st.ok()) return st;
      absl::StatusOr<Value> keep = Eval(*s.cond, probe);
      if (!keep.ok()) return keep.status();
      if (keep->Truthy()) items.push_back(std::move(item));
    }
  } else {
    items = std::move(*all);
  }
  auto state = std::make_shared<LoopState>();
  state->items = std::make_shared<const List>(std::move(items));
  const List& list = *state->items;
  Value loop = Value::MakeLoop(state);
  for (size_t k = 0; k < list.size(); ++k) {
    state->index0 = static_cast<int64_t>(k);
    std::shared_ptr<Frame> iter = NewFrame(frame);
    absl::Status st = Assign(s.targets, list[k], iter.get());
    if (!st.ok()) return st;
    iter->Set("loop", loop);
    absl::StatusOr<Flow> flow = Exec(s.body, iter, out);
    if (!flow.ok()) return flow.status();
    if (*flow == Flow::kBreak) break;
  }
  if (list.empty() && !s.else_body.empty()) {
    std::shared_ptr<Frame> inner = NewFrame(frame);
    absl::StatusOr<Flow> flow = Exec(s.else_body, inner, out);
    if (!flow.ok()) return flow.status();
  }
  return Flow::kNormal;
}

// --- expressions -------------------------------------------------------------------------

absl::StatusOr<Value> Interpreter::CallValue(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (!callee.is_callable()) {
    return TypeError(absl::StrCat("'", PyTypeName(callee), "' object is not callable"));
  }
  return callee.callable().fn(*this, args);
}

absl::Status Interpreter::EvalCallArgs(const Expr& e, size_t first_arg,
                                       const std::shared_ptr<Frame>& frame, CallArgs* args) {
  for (size_t k = first_arg; k < e.args.size(); ++k) {
    absl::StatusOr<Value> v = Eval(*e.args[k], frame);
    if (!v.ok()) return v.status();
    args->args.push_back(std::move(*v));
  }
  for (const auto& [key, expr] : e.kwargs) {
    absl::StatusOr<Value> v = Eval(*expr, frame);
    if (!v.ok()) return v.status();
    args->kwargs.emplace_back(key, std::move(*v));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::Eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
  absl::StatusOr<Value> v = EvalInner(e, frame);
  if (!v.ok()) return Annotate(v.status(), e.pos);
  return v;
}

absl::StatusOr<Value> Interpreter::EvalInner(const Expr& e, const std::shared_ptr<Frame>& frame) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName:
      return Lookup(e.name, frame.get());
    case ExprKind::kList:
    case ExprKind::kTuple: {
      List items;
      items.reserve(e.args.size());
      for (const ExprPtr& a : e.args) {
        absl::StatusOr<Value> v = Eval(*a, frame);
        if (!v.ok()) return v;
        items.push_back(std::move(*v));
      }
      return Value::MakeList(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        absl::StatusOr<Value> key = Eval(*e.args[k], frame);
        if (!key.ok()) return key;
        if (!PyHashable(*key)) return absl::InvalidArgumentError(UnhashableMessage(*key));
        absl::StatusOr<Value> value = Eval(*e.args[k + 1], frame);
        if (!value.ok()) return value;
        d.Set(std::move(*key), std::move(*value));
      }
      return Value::MakeDict(std::move(d));
    }
    case ExprKind::kGetattr: {
      absl::StatusOr<Value> obj = Eval(*e.args[0], frame);
      if (!obj.ok()) return obj;
      if (obj->is_undefined()) return UndefinedError(*obj);
      return GetAttr(*obj, e.name);
    }
    case ExprKind::kGetitem: {
      absl::StatusOr<Value> obj = Eval(*e.args[0], frame);
      if (!obj.ok()) return obj;
      if (obj->is_undefined()) return UndefinedError(*obj);
      const Expr& key = *e.args[1];
      if (key.kind == ExprKind::kSlice) {
        Value parts[3] = {Value::None(), Value::None(), Value::None()};
        for (int k = 0; k < 3; ++k) {
          if (!key.args[k]) continue;
          absl::StatusOr<Value> v = Eval(*key.args[k], frame);
          if (!v.ok()) return v;
          parts[k] = std::move(*v);
        }
        return GetSlice(*obj, parts[0], parts[1], parts[2]);
      }
      absl::StatusOr<Value> k = Eval(key, frame);
      if (!k.ok()) return k;
      return GetItem(*obj, *k);
    }
    case ExprKind::kSlice:
      return absl::InvalidArgumentError("slice outside of a subscript");
    case ExprKind::kCall: {
      absl::StatusOr<Value> callee = Eval(*e.args[0], frame);
      if (!callee.ok()) return callee;
      CallArgs args;
      absl::Status st = EvalCallArgs(e, 1, frame, &args);
      if (!st.ok()) return st;
      return CallValue(*callee, args);
    }
    case ExprKind::kFilter: {
      absl::StatusOr<Value> operand = Eval(*e.args[0], frame);
      if (!operand.ok()) return operand;
      CallArgs args;
      absl::Status st = EvalCallArgs(e, 1, frame, &args);
      if (!st.ok()) return st;
      return ApplyFilter(*this, e.name, *operand, args);
    }
    case ExprKind::kTest: {
      absl::StatusOr<Value> operand = Eval(*e.args[0], frame);
      if (!operand.ok()) return operand;
      CallArgs args;
      absl::Status st = EvalCallArgs(e, 1, frame, &args);
      if (!st.ok()) return st;
      absl::StatusOr<bool> r = ApplyTest(*this, e.name, *operand, args);
      if (!r.ok()) return r.status();
      return Value::Bool(e.negated ? !*r : *r);
    }
    case ExprKind::kUnary: {
      absl::StatusOr<Value> v = Eval(*e.args[0], frame);
      if (!v.ok()) return v;
      if (e.name == "not") return Value::Bool(!v->Truthy());
      if (v->is_undefined()) return UndefinedError(*v);
      if (!v->is_number()) {
        return TypeError(
            absl::StrCat("bad operand type for unary ", e.name, ": '", PyTypeName(*v), "'"));
      }
      if (e.name == "+") return v->is_float() ? *v : Value::Int(v->int_value());
      if (v->is_float()) return Value::Float(-v->number_value());
      if (v->int_value() == INT64_MIN) return absl::InvalidArgumentError("integer overflow");
      return Value::Int(-v->int_value());
    }
    case ExprKind::kBinary: {
      absl::StatusOr<Value> a = Eval(*e.args[0], frame);
      if (!a.ok()) return a;
      if (e.name == "and") {
        if (!a->Truthy()) return a;
        return Eval(*e.args[1], frame);
      }
      if (e.name == "or") {
        if (a->Truthy()) return a;
        return Eval(*e.args[1], frame);
      }
      absl::StatusOr<Value> b = Eval(*e.args[1], frame);
      if (!b.ok()) return b;
      return Arith(e.name, *a, *b);
    }
    case ExprKind::kCompare: {
      absl::StatusOr<Value> left = Eval(*e.args[0], frame);
      if (!left.ok()) return left;
      Value lhs = std::move(*left);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        absl::StatusOr<Value> right = Eval(*e.args[k + 1], frame);
        if (!right.ok()) return right;
        const std::string& op = e.ops[k];
        bool result;
        if (op == "==") {
          result = PyEquals(lhs, *right);
        } else if (op == "!=") {
          result = !PyEquals(lhs, *right);
        } else if (op == "in" || op == "notin") {
          absl::StatusOr<bool> c = Contains(*right, lhs);
          if (!c.ok()) return c.status();
          result = op == "in" ? *c : !*c;
        } else {
          absl::StatusOr<bool> c = PyCompare(op, lhs, *right);
          if (!c.ok()) return c.status();
          result = *c;
        }
        if (!result) return Value::Bool(false);
        lhs = std::move(*right);
      }
      return Value::Bool(true);
    }
    case ExprKind::kConcat: {
      std::string s;
      for (const ExprPtr& a : e.args) {
        absl::StatusOr<Value> v = Eval(*a, frame);
        if (!v.ok()) return v;
        s += PyStr(*v);
      }
      return Value::String(std::move(s));
    }
    case ExprKind::kCondExpr: {
      absl::StatusOr<Value> c = Eval(*e.args[1], frame);
      if (!c.ok()) return c;
      if (c->Truthy()) return Eval(*e.args[0], frame);
      if (e.args[2]) return Eval(*e.args[2], frame);
      return Value::Undefined(
          "the inline if-expression evaluated to false and no else "
          "section was defined");
    }
  }
  return absl::InternalError("unknown expression kind");
}

}  // namespace ring::jinja
