#include "lib/pipe/layout.h"

#include "lib/base/check.h"
#include "lib/base/error.h"

namespace fd::pipe {

Layout::Layout(int world, int stages) {
  if (world < 1) usage_error("a pipeline layout needs at least one rank, got {}", world);
  if (stages < 1) usage_error("a pipeline needs at least one stage, got {}", stages);
  if (world % stages != 0)
    usage_error(
        "{} pipeline stages do not divide {} rank(s): the ranks are stages x data-parallel "
        "replicas; start a multiple of {} ranks or use a divisor of {} stages",
        stages, world, stages, world);
  stages_ = stages;
  replicas_ = world / stages;
}

void Layout::check_rank(int rank) const {
  FD_CHECK(0 <= rank && rank < world(), "rank {} outside a world of {}", rank, world());
}

int Layout::stage_of(int rank) const {
  check_rank(rank);
  return rank / replicas_;
}

int Layout::replica_of(int rank) const {
  check_rank(rank);
  return rank % replicas_;
}

int Layout::rank_of(int stage, int replica) const {
  FD_CHECK(0 <= stage && stage < stages_, "stage {} of {}", stage, stages_);
  FD_CHECK(0 <= replica && replica < replicas_, "replica {} of {}", replica, replicas_);
  return stage * replicas_ + replica;
}

int Layout::prev_rank(int rank) const {
  const int s = stage_of(rank);
  return s == 0 ? -1 : rank_of(s - 1, replica_of(rank));
}

int Layout::next_rank(int rank) const {
  const int s = stage_of(rank);
  return s == stages_ - 1 ? -1 : rank_of(s + 1, replica_of(rank));
}

SplitKey Layout::data_parallel_split(int rank) const { return {stage_of(rank), replica_of(rank)}; }

SplitKey Layout::pipeline_split(int rank) const { return {replica_of(rank), stage_of(rank)}; }

}  // namespace fd::pipe
