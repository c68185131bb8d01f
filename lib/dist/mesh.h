// Mesh: a run's ranks as a grid of named axes, and every process group a
// split of it (PyTorch's DeviceMesh, with Megatron parallel_state's explicit
// placement). Built once per run (engine::make_mesh, from the recipe's
// `parallel` section and the world size); nothing else does rank arithmetic.
//
// Placement: row-major, the first axis varying slowest and the last fastest:
//
//   rank = sum over axes a of coord(a) * stride(a),  stride(last) = 1,
//                                                    stride(a) = stride(a+1) * size(a+1)
//
// A run's axes are {pp, dp} (pp outermost), {pp, dp, tp} with tensor parallelism: rank = stage * D
// + replica, so a pipeline stage's D data-parallel replicas are consecutive ranks (pp = 2, dp = 3:
// stage 0: ranks 0 1 2,  stage 1: ranks 3 4 5), and replica r's pipeline is ranks r, D + r, 2D + r,
// ... in stage order.
//
// Why this order: mpirun places consecutive ranks on one host (`--map-by
// slot`, `--map-by ppr:N:node` and Open MPI's default fill a node's N slots
// before the next node), so the faster an axis varies, the more of its
// groups stay inside a node. The axes are ordered by traffic, heaviest
// fastest. The data-parallel reductions (the whole gradient, every step)
// outweigh a pipeline's activations (B x T x C per micro-batch between
// neighbours), so dp is inside pp: when D divides the ranks per node (or the
// node's ranks divide D), a stage's reductions stay on the node's links and
// only activations cross nodes. Tensor and sequence parallelism's collectives
// run inside every layer, so they go innermost, Megatron's order (its
// "tp-cp-ep-dp-pp", fastest first): node, pp, dp, sp, tp, a tp group being
// consecutive ranks on one node. `--map-by node` (round robin over nodes)
// inverts all of this: avoid it.
//
// An axis the mesh lacks is an axis of size 1: size("tp") is 1, coord(r,
// "tp") is 0, and naming it in a group changes nothing. A Mesh is a plain
// value; only group() talks to a communicator.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/dist/communicator.h"

namespace fd::dist {

struct MeshAxis {
  std::string name;  // "pp", "dp", later "tp", "sp", "node"
  int size = 1;      // >= 1
};

class Mesh {
 public:
  // Axes slowest first (the placement above). Names unique and non-empty,
  // sizes >= 1 (FD_CHECK); no axes is the world of one.
  explicit Mesh(std::vector<MeshAxis> axes);
  // The mesh of a run of `world` ranks in `stages` pipeline stages: {pp:
  // stages, dp: world / stages}. Throws fd::Error (kUsage) when world < 1,
  // stages < 1 or stages does not divide world (config::check_world_size
  // reports this for a recipe, with its location).
  static Mesh pipeline_data(int world, int stages);
  // With tensor parallelism: {pp: stages, dp: world / (stages * tensor), tp: tensor}, tp
  // fastest (a tp group is `tensor` consecutive ranks); pipeline_data's mesh when tensor is 1.
  // Throws fd::Error (kUsage) when stages * tensor does not divide world.
  // With Ulysses sequence parallelism: {pp, dp, sp: sequence, tp}, sp inside dp and outside tp
  // (Megatron's order); axes of size 1 other than pp and dp are left out.
  static Mesh layout(int world, int stages, int tensor, int sequence = 1);

  const std::vector<MeshAxis>& axes() const { return axes_; }
  int world() const { return world_; }
  int size(std::string_view axis) const;  // 1 when the mesh has no such axis
  // rank in [0, world()) (FD_CHECK): its coordinate on `axis` (0 if absent).
  int coord(int rank, std::string_view axis) const;
  // The rank at `rank`'s coordinates with the one on `axis` moved by
  // `delta`; -1 when that falls outside the axis (a pipeline's neighbours:
  // step(r, "pp", -1) and step(r, "pp", +1)).
  int step(int rank, std::string_view axis, int delta) const;

  // The groups over `axes`: ranks that agree on every other axis form one
  // group, ordered by their coordinates on `axes` in the mesh's order (which
  // is world rank order). {"dp"}: each stage's data-parallel group, ranked by
  // replica; {"pp"}: each replica's pipeline, ranked by stage; {} : every rank
  // alone; all axes: the world. Unknown names count as absent axes.
  SplitPlan plan(const std::vector<std::string_view>& axes) const;
  // The world ranks of `rank`'s group over `axes`, in group order.
  std::vector<int> group_ranks(int rank, const std::vector<std::string_view>& axes) const;
  // `rank`'s group over `axes` as a communicator: world.split(plan(axes)), with its ranks'
  // nodes when `world` knows its own (Communicator::set_nodes).
  // Collective over `world`, whose size must be world().
  std::unique_ptr<Communicator> group(Communicator& world,
                                      const std::vector<std::string_view>& axes) const;

 private:
  int index(std::string_view axis) const;  // -1 when absent
  std::vector<int> coords(int rank) const;

  std::vector<MeshAxis> axes_;
  std::vector<int> strides_;
  int world_ = 1;
};

}  // namespace fd::dist
