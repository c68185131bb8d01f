// The running binary's GNU build ID (the linker's --build-id note, a hash of the linked
// program): two fdtrain binaries built from different sources or with different settings have
// different IDs. A multi-host run compares them at start (engine/rank_agreement.h), so that a
// host with another build is named before it computes anything.
#pragma once

#include <string>

namespace fd {

// Lower-case hex of the main program's NT_GNU_BUILD_ID note, read from its loaded program
// headers (no file access); "" when the binary has none (linked without --build-id).
std::string build_id();

}  // namespace fd
