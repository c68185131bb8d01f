// make_gpu_communicator in CUDA builds: NCCL, or at world 1 a local
// communicator whose copies are device copies on the compute stream (no NCCL
// set-up, no communication stream, nothing to wait for).
#include "lib/dist/gpu_communicator.h"

#include "kernels/kernels.h"
#include "lib/dist/local_communicator.h"
#include "lib/dist/nccl_communicator.h"

namespace fd::dist {

std::unique_ptr<Communicator> make_gpu_communicator(Communicator& host) {
  std::unique_ptr<Communicator> c;
  if (host.size() == 1)
    c = std::make_unique<LocalCommunicator>(&kernels::copy_device);
  else
    c = std::make_unique<NcclCommunicator>(host);
  // The device traffic is the host group's: in the world's totals, on the host's nodes.
  c->join_family(host);
  if (!host.nodes().empty()) c->set_nodes(host.nodes(), host.node_names());
  return c;
}

}  // namespace fd::dist
