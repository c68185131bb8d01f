// Text documents to token ids: what `fdtrain tokenize` writes and what a
// recipe's `data: {format: text, tokenizer: DIR}` trains on, the same ids both
// ways.
//
// Documents: each input file is one document, except .jsonl files, where each
// non-blank line is a JSON object whose text field ("text" by default) is one.
// Each document is encoded with encode(text, add_special=false) and wrapped in
// the DocumentWrap's BOS / EOS ids (document_wrap(): tokenizer_config.json's
// bos_token / eos_token).
//
// encode_documents() reads the documents in order, encodes batches of ~1 MB
// on `threads` threads and hands the ids to `sink` in document order, with at
// most threads + 1 batches in flight. A plain-text document longer than 1 MB
// is encoded in pieces of ~1 MB, cut at line starts where encoding 16 kB on
// either side with and without the cut gives the same ids (the cut is
// invisible to the tokenizer; Tokenizer::encode_piece). The workers find the
// cuts and read the pieces themselves (each cut searched once, near its 1 MB
// boundary, by the first worker that needs it), so one large file keeps every
// thread busy, and memory stays a few batches however large the input. An
// error (bad UTF-8, a bad .jsonl line) is the first in the inputs' order,
// whatever the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lib/text/tokenizer.h"

namespace fd::data {

struct DocumentWrap {
  std::optional<int32_t> bos;  // put before each document
  std::optional<int32_t> eos;  // put after each document
};

// The tokenizer's BOS and EOS (either may be absent); raw: neither.
DocumentWrap document_wrap(const text::Tokenizer& tok, bool raw = false, bool no_bos = false,
                           bool no_eos = false);

struct DocumentStats {
  int64_t documents = 0;
  int64_t blank_lines = 0;  // blank .jsonl lines skipped
  int64_t bytes = 0;        // input bytes read
  int64_t tokens = 0;       // ids handed to the sink
};

// Encodes the documents of `files` (see above). sink(ids, bytes) receives each
// batch's ids and the input bytes they came from, in order, on the calling
// thread. Throws fd::Error (kUsage) naming file:line for a bad .jsonl line (not
// JSON, nested too deeply, longer than kMaxJsonLineBytes: line_reader.h), a
// text file that is not valid UTF-8 (naming the byte offset: the text is never
// silently replaced), a file that is not a regular file or cannot be read;
// whatever sink throws is rethrown after the workers stop.
DocumentStats encode_documents(const std::vector<std::string>& files, const text::Tokenizer& tok,
                               const DocumentWrap& wrap, const std::string& text_field, int threads,
                               const std::function<void(std::span<const int32_t>, size_t)>& sink);

}  // namespace fd::data
