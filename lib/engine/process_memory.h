// A rank's process memory beyond its tensors: what `fdtrain estimate` adds to the tensors to
// predict a rank's peak resident set size (RSS), and what summary.json measures beside it.
//
//   predicted peak RSS = runtime + tensors + data + saves + sample
//
//   runtime  the process without the run's tensors and data: the binary and its libraries, MPI
//            (its shared-memory segments grow with the ranks on a host), OpenBLAS's buffers, the
//            allocator's arenas and slack, HDF5, the log. Measured on this host for this build by
//            `fdtrain calibrate` (which `make` runs at 1, 2 and 4 ranks): a small run trained for
//            real, its peak RSS less its tensors and data; kept beside the binary in
//            fdtrain.memory.json with the host, the CPU and the build's version and ID, and used
//            only where all of them match.
//   tensors  the CPU caching allocator's peak: blocks in use plus blocks freed and kept for
//            reuse (cpu_allocator::peak_reserved_bytes), simulated on the counting device through
//            the run's own sequence of allocations (cpu_allocator::simulated).
//   data     the training data held in memory (mapped files, encoded tokens and examples, the
//            tokenizer), measured as the growth of this process's RSS while the data is opened
//            as training opens it.
//   saves    what writing a checkpoint shard holds beyond the state (ckpt::write_buffer_bytes:
//            HDF5's chunk buffers, a streamed state's staging), for the rank's largest range.
//   sample   the end-of-run sample's KvDecoder (nn::KvDecoder::host_bytes: fp32 copies of
//            weights it cannot read in place, the cache, the scratch), on the whole model.
//
// docs/ZERO.md ("Process memory") explains the parts and how close the prediction comes.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "lib/config/recipe.h"
#include "lib/engine/assemble.h"
#include "lib/nn/decoder.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// This process's resident set size now, and its highest value so far (VmRSS, VmHWM of
// /proc/self/status), bytes; -1 where /proc is not readable.
int64_t current_rss_bytes();
int64_t peak_rss_bytes_now();

// The runtime part, as calibrated for this build on this host.
struct RuntimeCalibration {
  std::string path;                       // the calibration file (beside the binary)
  std::map<int, int64_t> bytes_by_ranks;  // ranks on the host -> runtime bytes
  std::string problem;  // why there is none to use ("" when bytes_by_ranks is usable)
  // The runtime bytes of a process among `ranks_per_host` ranks on its host: measured, or
  // interpolated (linearly between the nearest measured counts, extrapolated from the two
  // largest beyond them). nullopt without a calibration.
  std::optional<int64_t> at(int ranks_per_host) const;
};
// The calibration file beside the running binary: /proc/self/exe's directory /
// fdtrain.memory.json (FDTRAIN_MEMORY_CALIBRATION overrides the path).
std::string calibration_path();
// Reads it; a missing file, another host, CPU or build, or a malformed file: `problem` says
// which, and how to calibrate.
RuntimeCalibration read_calibration();
// Records `bytes` for `ranks_per_host` (replacing an earlier figure; other entries of this host
// and build kept, any other build's dropped), through a temporary file and rename. Throws
// fd::Error (runtime) when it cannot be written.
void write_calibration(int ranks_per_host, int64_t bytes);

// The data part: the growth of this process's RSS while `r`'s training data is opened (and
// closed again), bytes (0 when it shrank or /proc is unreadable). Throws what open_dataset
// throws.
int64_t measure_data_bytes(const config::Recipe& r);

// The saves part for `engine`'s saved state (0 when `a` saves no checkpoint), and the sample
// part for `full_model` (0 when `a` has no sample). `engine` and `full_model` may live on the
// counting device.
int64_t save_buffer_bytes(const Assembly& a, const zero::ZeroEngine& engine);
int64_t sample_bytes(const Assembly& a, const nn::Decoder& full_model);

// The recipe `fdtrain calibrate` trains: a small GPT on a generated text file at `data_path`,
// two checkpoints saved behind the step, one evaluation; written into `dir` (data_path beside).
std::string calibration_recipe_yaml(const std::string& data_path);

}  // namespace fd::engine
