// Before a multi-rank run builds anything, its ranks check that they are one program running
// one recipe: every rank's fdtrain version and build ID (lib/base/build_id.h) and its resolved
// recipe (config::to_yaml) are gathered and compared with rank 0's. A host with another build,
// or one that read another recipe file at the same path (no shared filesystem, a stale copy), or
// got other overrides, would otherwise compute a different model or issue other collectives and
// hang or diverge silently (issue 40).
#pragma once

#include "lib/config/recipe.h"
#include "lib/dist/communicator.h"

namespace fd::engine {

// Collective over `world`: two all-gathers (a fixed header, then per-field digests when the
// recipes differ). Throws fd::Error (kUsage) on every rank alike when a rank differs from rank 0:
// the first such rank and its host, what differs (the version and build ID, or the recipe's
// fields that differ, with rank 0's values), and what to do. A world of one: nothing.
void check_ranks_agree(dist::Communicator& world, const config::Recipe& recipe);

}  // namespace fd::engine
