// The rank layout of a pipeline-parallel run: P stages x D data-parallel
// replicas, world = P * D, stage-major:
//
//   rank = stage * D + replica        (P = 2, D = 3:  stage 0: ranks 0 1 2
//                                                      stage 1: ranks 3 4 5)
//
// Replica r is one whole model: the pipeline of ranks r, D + r, 2D + r, ...
// (its stages in order); each stage's D ranks form its data-parallel group,
// over which ZeRO shards and reduces that stage's parameters.
//
// Why stage-major: a stage's D replicas are consecutive ranks, and mpirun
// places consecutive ranks on the same host (`mpirun --map-by slot`, or
// `--map-by ppr:N:node`, fills each node's N slots before the next node; Open
// MPI's default mapping does the same for consecutive ranks). So when D divides
// the ranks per node N (or N divides D) a stage's data-parallel group lies
// inside one node (or spans whole nodes): the gradient reductions, the largest
// traffic, stay on the node's fast links, and only the activations and their
// gradients between neighbouring stages (B x T x C values per micro-batch)
// cross nodes. `--map-by node` (round robin over nodes) would do the opposite:
// avoid it.
//
// A Layout is a plain value; nothing here talks to a communicator. The split
// keys are what Communicator::split(color, key) (MPI_Comm_split) takes to build
// the two sub-communicators each rank needs.
#pragma once

namespace fd::pipe {

// Arguments for Communicator::split: ranks with the same color form one group,
// ordered by key.
struct SplitKey {
  int color = 0;  // >= 0
  int key = 0;    // the rank's index in its group
  bool operator==(const SplitKey&) const = default;
};

class Layout {
 public:
  // `world` ranks in `stages` pipeline stages. Throws fd::Error (kUsage) when
  // world < 1, stages < 1 or stages does not divide world
  // (config::check_world_size reports this for a recipe, with its location).
  Layout(int world, int stages);

  int world() const { return stages_ * replicas_; }
  int stages() const { return stages_; }      // P
  int replicas() const { return replicas_; }  // D = world / P

  // rank in [0, world()), stage in [0, P), replica in [0, D); FD_CHECKed.
  int stage_of(int rank) const;               // rank / D
  int replica_of(int rank) const;             // rank % D
  int rank_of(int stage, int replica) const;  // stage * D + replica

  bool is_first_stage(int rank) const { return stage_of(rank) == 0; }
  bool is_last_stage(int rank) const { return stage_of(rank) == stages_ - 1; }
  // The world rank of the same replica's previous / next stage; -1 when
  // `rank` is on the first / last stage.
  int prev_rank(int rank) const;
  int next_rank(int rank) const;

  // The data-parallel group of `rank`'s stage: its D replicas, the group rank
  // being the replica ({color: stage, key: replica}).
  SplitKey data_parallel_split(int rank) const;
  // The pipeline of `rank`'s replica: its P stages in order, the group rank
  // being the stage ({color: replica, key: stage}). A stage's neighbours are
  // group ranks stage - 1 and stage + 1.
  SplitKey pipeline_split(int rank) const;

 private:
  void check_rank(int rank) const;

  int stages_ = 1;
  int replicas_ = 1;
};

}  // namespace fd::pipe
