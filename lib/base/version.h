// fdtrain's version: CMake's project(VERSION), the one place it is written.
// The binary prints it (--version) and the run directory and checkpoints
// record it (summary.json, run.json, shard attributes).
#pragma once

namespace fd {

// "0.1.0"
const char* version();

}  // namespace fd
