// File: server/jinja.cc
//
// Template: the parsed tree plus the glue from JSON render contexts to the interpreter.
#include "server/jinja.h"

#include "absl/status/status.h"
#include "server/jinja_ast.h"
#include "server/jinja_interpreter.h"

namespace ring::jinja {

struct Template::Impl {
  Body body;
};

absl::StatusOr<Template> Template::Parse(absl::string_view source) {
  absl::StatusOr<Body> body = ParseTemplateSource(source);
  if (!body.ok()) return body.status();
  auto impl = std::make_shared<Impl>();
  impl->body = std::move(*body);
  return Template(std::move(impl));
}

namespace {

template <typename Json>
absl::StatusOr<std::string> RenderWith(const Body& body, const Json& context) {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("render context must be a JSON object");
  }
  if (JsonNestingExceeds(context, kMaxValueDepth)) {
    return absl::InvalidArgumentError("render context nests deeper than 256 levels");
  }
  Interpreter interp(FromJson(context));
  std::string out;
  absl::Status s = interp.Render(body, &out);
  if (!s.ok()) return absl::InvalidArgumentError(s.message());
  return out;
}

}  // namespace

absl::StatusOr<std::string> Template::Render(const nlohmann::json& context) const {
  return RenderWith(impl_->body, context);
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context) const {
  return RenderWith(impl_->body, context);
}

}  // namespace ring::jinja
