// What cudaOccupancyMaxPotentialClusterSize answers for the allreduce-fusion kernels patch
// 0004 asks about, at the block sizes their launchers use (before the patch rounds the answer
// down to a power of two). Patch 0004 leaves sm_90/sm_100 launches unchanged only if the
// answer is at least 8 there. Built and run on the device:
//   nvcc -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -I include -I spdlog/include \
//     cluster_size.cu -o cluster_size
#include <cstdio>

#include "flashinfer/comm/trtllm_allreduce_fusion.cuh"

using namespace flashinfer::trtllm_allreduce_fusion;

template <typename T>
void report(const char* name, T* kernel) {
  for (int block = 32; block <= 1024; block *= 2) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(8);
    config.blockDim = dim3(block);
    int supported = 0;
    cudaError_t status =
        cudaOccupancyMaxPotentialClusterSize(&supported, (const void*)kernel, &config);
    std::printf("%-48s block %4d: %s %d\n", name, block,
                status == cudaSuccess ? "max cluster" : cudaGetErrorString(status), supported);
  }
}

int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s, sm_%d%d\n", prop.name, prop.major, prop.minor);
  constexpr auto kNorm = AllReduceFusionPattern::kARResidualRMSNorm;
  report("oneshot_lamport<kARResidualRMSNorm, bf16, 2>",
         allreduce_fusion_kernel_oneshot_lamport<kNorm, __nv_bfloat16, 2, true, true>);
  report("oneshot_lamport<kARResidualRMSNorm, bf16, 8>",
         allreduce_fusion_kernel_oneshot_lamport<kNorm, __nv_bfloat16, 8, true, true>);
  report("twoshot_sync<kARResidualRMSNorm, bf16, 2>",
         allreduce_fusion_kernel_twoshot_sync<kNorm, __nv_bfloat16, 2, true>);
  report("twoshot_sync<kARResidualRMSNorm, bf16, 8>",
         allreduce_fusion_kernel_twoshot_sync<kNorm, __nv_bfloat16, 8, true>);
  return 0;
}
