// make_gpu_communicator: the communicator for GPU buffers, in any build.
//
// CUDA builds return an NcclCommunicator riding on `host` (nccl_communicator.h;
// cuda/gpu_communicator.cc), or for a host of one rank a LocalCommunicator
// copying with the device's copy (no NCCL for a one-GPU run); builds without
// CUDA throw an fd::Error (usage)
// saying so (cuda_stub.cc). So the trainer needs no #if to set up a GPU run.
#pragma once

#include <memory>

#include "lib/dist/communicator.h"

namespace fd::dist {

// Collective over every rank of `host`, which must outlive the result;
// init_cuda_device must have run. The result counts its traffic in `host`'s family totals
// (Communicator::join_family) and knows `host`'s nodes.
std::unique_ptr<Communicator> make_gpu_communicator(Communicator& host);

}  // namespace fd::dist
