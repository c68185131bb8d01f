// jinja::Template (jinja.h): parse once (jinja_parser.cc), render many
// (jinja_interpreter.cc), each render with its own interpreter state.
#include "lib/jinja/jinja.h"

#include "lib/jinja/jinja_ast.h"
#include "lib/jinja/jinja_interpreter.h"

namespace fd::jinja {

Template Template::parse(std::string_view source, std::string_view name, TemplateOptions options) {
  Template t;
  t.program_ = parse_program(source, name, options);
  return t;
}

Rendered Template::render(const Value& context, const RenderOptions& options) const {
  Interpreter interpreter(*program_, options);
  return interpreter.run(context);
}

const std::string& Template::name() const { return program_->name; }

bool Template::names_variable(std::string_view variable) const {
  return program_->slot_of.contains(std::string(variable));
}

}  // namespace fd::jinja
