// Tensor parallelism's whole model (DESIGN 17): a tensor-parallel rank holds slices
// (nn::Parameter::slice); the end of a run (its weights' digest, its sample) and every
// layout-independent view of its weights need the whole tensors, assembled from the tp group.
#pragma once

#include <memory>

#include "lib/dist/communicator.h"
#include "lib/nn/decoder.h"

namespace fd::engine {

// The unsharded twin of `model` (its config, LoRA and dtype), every parameter (and
// frozen parameter) holding the whole tensor assembled from the slices of every rank of
// `model`'s tp group (on the model's device: the CPU, or meta in the estimate): per parameter one
// all_gather over the group (the slices padded to the longest, as the vocabulary's may differ by a
// row), placed by each rank's slice. The twin's buffers are accounted as MemCategory::kComm (a
// gather, held for the caller's use only). Every parameter of `model` must be resident and current
// (ZeroEngine::with_full_parameters). Collective over the tp group. Without tensor parallelism:
// FD_CHECK failure (use `model`).
std::unique_ptr<nn::Decoder> gather_whole_model(const nn::Decoder& model);

}  // namespace fd::engine
