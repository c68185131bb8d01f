// tokenizer_bench: encode throughput of fdtrain's HfTokenizer, one thread and
// N threads, on text sets cut into documents of about 64 KB. `make bench` runs
// it through bench/tokenizer_bench.sh, next to Hugging Face's JS tokenizers and
// tiktoken's WASM build (bench/tokenizer/js_bench.mjs) on the same documents.
//
//   tokenizer_bench [--threads N] [--runs R] [--doc-bytes B] [--warm-cache]
//                   [--verbose] TEXT_DIR NAME=TOKENIZER_JSON...
//
// TEXT_DIR holds prose.txt, code.txt, multilingual.txt (bench/tokenizer/make_texts.py).
// A document ends at the first "\n" at or after B bytes (default 65536) from
// its start (js_bench.mjs cuts the same way). For each (tokenizer, set): one
// warm-up pass per thread count (1 and N, default all cores), then R timed
// passes of each (default 3), one thread's and N threads' alternating so that
// a slow spell of the machine hits both alike; the best pass of each is kept.
// A pass encodes every document once, threads taking documents from an atomic
// counter, each thread with a fresh EncodeCache (its word cache is filled
// within the pass, not carried over). --warm-cache keeps each thread's cache
// across passes instead (a diagnostic: after the warm-up most words are cache
// hits). --verbose prints every pass on stderr. Every pass's ids must equal
// the first one-thread pass's, document by document, or the program fails.
//
// Output, one line per measurement (MB = 1e6 bytes of UTF-8 input):
//   fdtrain NAME SET THREADS MB/S TOKENS IDS_HASH CPU MEDIAN_MB/S
// IDS_HASH: FNV-1a (32-bit, one step per id) over every id of every document in
// order; js_bench.mjs prints the same hash for the same ids. CPU: the best
// pass's CPU seconds (all threads) over its wall seconds; below THREADS, the
// threads did not all have a core the whole time (a busy machine).
// MEDIAN_MB/S: the median timed pass.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "lib/base/error.h"
#include "lib/text/hf_tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

const char* const kSets[] = {"prose", "code", "multilingual"};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fd::usage_error("tokenizer_bench: cannot read {} (bench/tokenizer/make_texts.py writes it)",
                    path);
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Documents of at least doc_bytes, each ending after a "\n" (the last one
// wherever the text ends).
std::vector<std::string_view> split_documents(std::string_view text, size_t doc_bytes) {
  std::vector<std::string_view> docs;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = pos + doc_bytes;
    if (end >= text.size()) {
      end = text.size();
    } else {
      const size_t nl = text.find('\n', end - 1);
      end = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    docs.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return docs;
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct PassTime {
  double wall = 0;  // seconds
  double cpu = 0;   // CPU seconds of all threads: cpu / wall near `threads` when none waited
};

// Encodes every document once on `threads` threads, thread t with caches[t]
// (caches.size() >= threads).
PassTime encode_pass(const fd::text::HfTokenizer& tok, const std::vector<std::string_view>& docs,
                     int threads, std::vector<fd::text::EncodeCache>& caches,
                     std::vector<std::vector<int32_t>>& ids) {
  std::atomic<size_t> next{0};
  std::vector<double> cpu(size_t(threads), 0.0);
  auto work = [&](int t) {
    const double c0 = thread_cpu_seconds();
    fd::text::EncodeCache& cache = caches[size_t(t)];
    // Each thread appends to its own vector and swaps it into ids[d] when the
    // document is done: appending to ids[d] directly would write its header
    // (the end pointer) on every token, and the headers of documents d and
    // d + 1, which two threads encode at once, share a cache line.
    std::vector<int32_t> out;
    for (size_t d = next.fetch_add(1); d < docs.size(); d = next.fetch_add(1)) {
      out.clear();
      tok.encode(docs[d], /*add_special=*/false, out, cache);
      ids[d].swap(out);
    }
    cpu[size_t(t)] = thread_cpu_seconds() - c0;
  };
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();
  PassTime p;
  p.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const double c : cpu) p.cpu += c;
  return p;
}

uint32_t ids_hash(const std::vector<std::vector<int32_t>>& ids, size_t* tokens) {
  uint32_t h = 2166136261u;
  *tokens = 0;
  for (const std::vector<int32_t>& doc : ids) {
    for (const int32_t id : doc) h = (h ^ uint32_t(id)) * 16777619u;
    *tokens += doc.size();
  }
  return h;
}

struct Options {
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  int runs = 3;
  size_t doc_bytes = 65536;
  bool warm_cache = false;  // keep each thread's EncodeCache across passes (a diagnostic)
  bool verbose = false;     // every pass's MB/s on stderr
  std::string text_dir;
  std::vector<std::pair<std::string, std::string>> tokenizers;  // name, tokenizer.json
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--threads" || a == "--runs" || a == "--doc-bytes") && i + 1 < argc) {
      const long v = std::atol(argv[++i]);
      if (v < 1) fd::usage_error("tokenizer_bench: {} must be a positive integer", a);
      if (a == "--threads") o.threads = int(v);
      if (a == "--runs") o.runs = int(v);
      if (a == "--doc-bytes") o.doc_bytes = size_t(v);
    } else if (a == "--warm-cache") {
      o.warm_cache = true;
    } else if (a == "--verbose") {
      o.verbose = true;
    } else if (a.starts_with("--")) {
      fd::usage_error(
          "tokenizer_bench: unknown option {} (usage: tokenizer_bench [--threads N] "
          "[--runs R] [--doc-bytes B] [--warm-cache] [--verbose] TEXT_DIR "
          "NAME=TOKENIZER_JSON...)",
          a);
    } else if (o.text_dir.empty()) {
      o.text_dir = a;
    } else {
      const size_t eq = a.find('=');
      if (eq == std::string::npos || eq == 0) {
        fd::usage_error("tokenizer_bench: '{}' is not NAME=TOKENIZER_JSON", a);
      }
      o.tokenizers.emplace_back(a.substr(0, eq), a.substr(eq + 1));
    }
  }
  if (o.text_dir.empty() || o.tokenizers.empty()) {
    fd::usage_error(
        "usage: tokenizer_bench [--threads N] [--runs R] [--doc-bytes B] "
        "[--warm-cache] [--verbose] TEXT_DIR NAME=TOKENIZER_JSON...");
  }
  return o;
}

int run(const Options& o) {
  std::vector<std::string> texts;
  for (const char* set : kSets) texts.push_back(read_file(o.text_dir + "/" + set + ".txt"));
  std::printf(
      "# fdtrain tokenizer_bench: %d timed passes after 1 warm-up, best kept; documents "
      "of >= %zu bytes cut at line ends; threads 1 and %d; %s\n",
      o.runs, o.doc_bytes, o.threads,
      o.warm_cache ? "caches kept across passes (--warm-cache)" : "a fresh cache every pass");
  std::printf("# impl tokenizer set threads MB/s tokens ids_hash cpu/wall median_MB/s\n");
  std::fflush(stdout);
  for (const auto& [name, path] : o.tokenizers) {
    const Clock::time_point t0 = Clock::now();
    const std::unique_ptr<fd::text::HfTokenizer> tok = fd::text::HfTokenizer::load(path);
    std::printf("# %s: %s, loaded in %.2f s\n", name.c_str(), tok->describe().c_str(),
                std::chrono::duration<double>(Clock::now() - t0).count());
    for (size_t s = 0; s < texts.size(); ++s) {
      const std::vector<std::string_view> docs = split_documents(texts[s], o.doc_bytes);
      std::vector<std::vector<int32_t>> reference(docs.size()), ids(docs.size());
      std::vector<std::vector<fd::text::EncodeCache>> caches_by_count;
      std::vector<int> thread_counts = {1};
      if (o.threads > 1) thread_counts.push_back(o.threads);
      for (const int threads : thread_counts) caches_by_count.emplace_back(size_t(threads));
      // Pass 0 of each thread count is its warm-up (one thread's gives the
      // reference ids); then the thread counts alternate pass by pass, so that
      // a slow spell of the machine hits both alike.
      std::vector<PassTime> best(thread_counts.size(), PassTime{1e300, 0});
      std::vector<std::vector<double>> walls(thread_counts.size());
      for (int r = 0; r <= o.runs; ++r) {
        for (size_t c = 0; c < thread_counts.size(); ++c) {
          const int threads = thread_counts[c];
          std::vector<fd::text::EncodeCache>& caches = caches_by_count[c];
          if (!o.warm_cache) {
            for (fd::text::EncodeCache& cache : caches) cache = fd::text::EncodeCache();
          }
          const bool first = threads == 1 && r == 0;
          const PassTime p = encode_pass(*tok, docs, threads, caches, first ? reference : ids);
          if (o.verbose) {
            std::fprintf(stderr, "# %s %s %d threads, pass %d: %.2f MB/s, cpu/wall %.2f\n",
                         name.c_str(), kSets[s], threads, r, double(texts[s].size()) / p.wall / 1e6,
                         p.cpu / p.wall);
          }
          if (r > 0) walls[c].push_back(p.wall);
          if (r > 0 && p.wall < best[c].wall) best[c] = p;
          if (!first && ids != reference) {
            for (size_t d = 0; d < docs.size(); ++d) {
              if (ids[d] != reference[d]) {
                std::fprintf(stderr,
                             "tokenizer_bench: %s on %s: document %zu encodes differently on %d "
                             "threads (pass %d) than on one thread\n",
                             name.c_str(), kSets[s], d, threads, r);
              }
            }
            return 1;
          }
        }
      }
      size_t tokens = 0;
      const uint32_t hash = ids_hash(reference, &tokens);
      for (size_t c = 0; c < thread_counts.size(); ++c) {
        std::vector<double>& w = walls[c];
        std::nth_element(w.begin(), w.begin() + w.size() / 2, w.end());
        const double bytes = double(texts[s].size());
        std::printf("fdtrain %s %s %d %.2f %zu %08x %.2f %.2f\n", name.c_str(), kSets[s],
                    thread_counts[c], bytes / best[c].wall / 1e6, tokens, hash,
                    best[c].cpu / best[c].wall, bytes / w[w.size() / 2] / 1e6);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const fd::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return e.exit_code();
  }
}
