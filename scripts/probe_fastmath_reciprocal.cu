// probe_fastmath_reciprocal: how often bitsandbytes' reciprocal differs from the correctly
// rounded one lib/quant uses (docs/QUANTIZATION.md, "What fast math means here").
//
// bitsandbytes builds with --use_fast_math, so `1.0f / absmax` in kQuantizeBlockwise compiles to
// rcp.approx.ftz.f32. This probe compiles the same expression the same way and compares it with
// __frcp_rn (IEEE round to nearest) for every float in [1, 2) and in a few other binades. Run it
// on a GPU when one is lent:
//
//   nvcc -O2 --use_fast_math -o probe scripts/probe_fastmath_reciprocal.cu && ./probe
//
// Zero mismatches would make lib/quant's reciprocal exact for normal absmax values; otherwise the
// count and the examples say how far the modelled reciprocal is from the hardware's.
#include <cstdio>
#include <cstring>

__global__ void compare(unsigned base_bits, unsigned count, unsigned long long* mismatches,
                        unsigned* examples) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float x = __uint_as_float(base_bits + i);
  const float fast = 1.0f / x;  // rcp.approx.ftz.f32 under --use_fast_math
  const float exact = __frcp_rn(x);
  if (__float_as_uint(fast) != __float_as_uint(exact)) {
    const unsigned long long k = atomicAdd(mismatches, 1ull);
    if (k < 8) examples[k] = base_bits + i;
  }
}

int main() {
  unsigned long long* d_mismatches;
  unsigned* d_examples;
  cudaMalloc(&d_mismatches, sizeof(unsigned long long));
  cudaMalloc(&d_examples, 8 * sizeof(unsigned));
  const unsigned count = 1u << 23;  // one binade
  // [1, 2), [2^-20, 2^-19), [2^20, 2^21), [2^-126, 2^-125) (the smallest normals), [2^126, 2^127)
  const int exponents[] = {0, -20, 20, -126, 126};
  int status = 0;
  for (int e : exponents) {
    const unsigned base = unsigned(e + 127) << 23;
    cudaMemset(d_mismatches, 0, sizeof(unsigned long long));
    compare<<<(count + 255) / 256, 256>>>(base, count, d_mismatches, d_examples);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
      return 2;
    }
    unsigned long long mismatches = 0;
    unsigned examples[8] = {};
    cudaMemcpy(&mismatches, d_mismatches, sizeof mismatches, cudaMemcpyDeviceToHost);
    cudaMemcpy(examples, d_examples, sizeof examples, cudaMemcpyDeviceToHost);
    std::printf("binade 2^%d: %llu of %u reciprocals differ from round-to-nearest\n", e,
                mismatches, count);
    for (unsigned long long k = 0; k < mismatches && k < 8; ++k) {
      float x;
      std::memcpy(&x, &examples[k], 4);
      std::printf("  x = %.9g (0x%08x)\n", x, examples[k]);
    }
    if (mismatches) status = 1;
  }
  return status;
}
