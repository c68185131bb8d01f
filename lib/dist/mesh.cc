#include "lib/dist/mesh.h"

#include <utility>

#include "lib/base/check.h"
#include "lib/base/error.h"

namespace fd::dist {

Mesh::Mesh(std::vector<MeshAxis> axes) : axes_(std::move(axes)), strides_(axes_.size(), 1) {
  for (size_t a = 0; a < axes_.size(); ++a) {
    FD_CHECK(!axes_[a].name.empty() && axes_[a].size >= 1, "mesh axis '{}' of size {}",
             axes_[a].name, axes_[a].size);
    for (size_t b = 0; b < a; ++b)
      FD_CHECK(axes_[b].name != axes_[a].name, "mesh axis '{}' named twice", axes_[a].name);
  }
  for (size_t a = axes_.size(); a-- > 0;) {
    strides_[a] = world_;
    world_ *= axes_[a].size;
  }
}

Mesh Mesh::layout(int world, int stages, int tensor, int sequence) {
  if (tensor < 1) usage_error("tensor parallelism needs at least one rank, got {}", tensor);
  if (sequence < 1) usage_error("sequence parallelism needs at least one rank, got {}", sequence);
  if (tensor == 1 && sequence == 1) return pipeline_data(world, stages);
  const int64_t unit = int64_t{stages} * tensor * sequence;
  if (world < 1 || stages < 1 || world % unit != 0) {
    if (sequence == 1)
      usage_error(
          "{} pipeline stage(s) x {} tensor-parallel ranks do not divide {} rank(s): the ranks "
          "are stages x data-parallel replicas x tensor-parallel ranks; start a multiple of {} "
          "ranks",
          stages, tensor, world, unit);
    usage_error(
        "{} pipeline stage(s) x {} sequence-parallel x {} tensor-parallel ranks do not divide {} "
        "rank(s): the ranks are stages x data-parallel replicas x sequence-parallel ranks x "
        "tensor-parallel ranks; start a multiple of {} ranks",
        stages, sequence, tensor, world, unit);
  }
  std::vector<MeshAxis> axes = {{"pp", stages}, {"dp", int(world / unit)}};
  if (sequence > 1) axes.push_back({"sp", sequence});
  if (tensor > 1) axes.push_back({"tp", tensor});
  return Mesh(std::move(axes));
}

Mesh Mesh::pipeline_data(int world, int stages) {
  if (world < 1) usage_error("a pipeline layout needs at least one rank, got {}", world);
  if (stages < 1) usage_error("a pipeline needs at least one stage, got {}", stages);
  if (world % stages != 0)
    usage_error(
        "{} pipeline stages do not divide {} rank(s): the ranks are stages x data-parallel "
        "replicas; start a multiple of {} ranks or use a divisor of {} stages",
        stages, world, stages, world);
  return Mesh({{"pp", stages}, {"dp", world / stages}});
}

int Mesh::index(std::string_view axis) const {
  for (size_t a = 0; a < axes_.size(); ++a)
    if (axes_[a].name == axis) return int(a);
  return -1;
}

int Mesh::size(std::string_view axis) const {
  const int a = index(axis);
  return a < 0 ? 1 : axes_[size_t(a)].size;
}

int Mesh::coord(int rank, std::string_view axis) const {
  FD_CHECK(0 <= rank && rank < world_, "rank {} outside a mesh of {}", rank, world_);
  const int a = index(axis);
  return a < 0 ? 0 : rank / strides_[size_t(a)] % axes_[size_t(a)].size;
}

int Mesh::step(int rank, std::string_view axis, int delta) const {
  const int c = coord(rank, axis) + delta;
  if (c < 0 || c >= size(axis)) return -1;
  const int a = index(axis);
  return a < 0 ? rank : rank + delta * strides_[size_t(a)];
}

std::vector<int> Mesh::coords(int rank) const {
  std::vector<int> out(axes_.size());
  for (size_t a = 0; a < axes_.size(); ++a) out[a] = rank / strides_[a] % axes_[a].size;
  return out;
}

SplitPlan Mesh::plan(const std::vector<std::string_view>& axes) const {
  std::vector<bool> in(axes_.size(), false);
  for (std::string_view name : axes)
    if (const int a = index(name); a >= 0) in[size_t(a)] = true;
  std::vector<SplitKey> keys(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    // Row-major over the chosen axes (key) and over the others (color), each
    // in the mesh's order.
    const std::vector<int> c = coords(r);
    SplitKey& k = keys[size_t(r)];
    for (size_t a = 0; a < axes_.size(); ++a) {
      int& v = in[a] ? k.key : k.color;
      v = v * axes_[a].size + c[a];
    }
  }
  return SplitPlan(std::move(keys));
}

std::vector<int> Mesh::group_ranks(int rank, const std::vector<std::string_view>& axes) const {
  // A group's keys rise with the world rank (both row-major in the mesh's order).
  const SplitPlan p = plan(axes);
  std::vector<int> out;
  for (int q = 0; q < world_; ++q)
    if (p.of(q).color == p.of(rank).color) out.push_back(q);
  return out;
}

std::unique_ptr<Communicator> Mesh::group(Communicator& world,
                                          const std::vector<std::string_view>& axes) const {
  FD_CHECK(world.size() == world_, "a mesh of {} ranks over a communicator of {}", world_,
           world.size());
  std::unique_ptr<Communicator> g = world.split(plan(axes));
  g->join_family(world);         // its traffic in the world's totals
  if (!world.nodes().empty()) {  // the group's ranks' nodes
    std::vector<int> nodes;
    for (int r : group_ranks(world.rank(), axes)) nodes.push_back(world.nodes()[size_t(r)]);
    g->set_nodes(std::move(nodes), world.node_names());
  }
  return g;
}

}  // namespace fd::dist
