// The recipe reference: every key a recipe may hold, with its type, default,
// allowed values and meaning. It is the schema's list of keys (the loader
// accepts exactly these), and `fdtrain schema` prints it; docs/RECIPES.md is
// generated from it (scripts/gen_recipes_doc.sh), so the documentation cannot
// drift from what the loader accepts.
#pragma once

#include <string>
#include <vector>

namespace fd::config {

// One recipe key.
struct KeyDoc {
  std::string path;           // "model.n_layer", "precision": section.key, or a top-level key
  std::string type;           // "int", "number", "bool", "string", "path or list", ...
  std::string default_value;  // as YAML ("4", "[0.9, 0.999]", "\"\""); "" = required
  std::string allowed;        // range or values (">= 1", "fp32, bf16, fp16"); "" = any
  std::string description;    // one or two sentences
  bool required() const { return default_value.empty(); }
};

// A section: a top-level key whose value is a map of keys (or a fragment file).
struct SectionDoc {
  std::string name;         // "model"
  std::string description;  // what the section configures
};

// Every key, top-level keys and section keys in the order the resolved recipe
// prints them (to_yaml()): a section's keys follow one another.
const std::vector<KeyDoc>& key_reference();

// Every section, in the same order.
const std::vector<SectionDoc>& section_reference();

// The reference as plain text (`fdtrain schema`): per section its
// description, then per key "path  type  default  allowed" and the meaning.
std::string format_reference_text();

// The same as Markdown (`fdtrain schema --markdown`, docs/RECIPES.md): a table
// per section, then one for the top-level keys.
std::string format_reference_markdown();

}  // namespace fd::config
