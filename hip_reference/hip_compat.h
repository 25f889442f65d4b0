// Portability header: the HIP API under hipcc, the same names mapped to CUDA under nvcc.
// Only the handful of calls softmax.hip uses are mapped. Nothing here assumes a warp size.
#pragma once

#include <cstdio>
#include <cstdlib>

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#define SOFTMAX_REF_COMPILER "hipcc"
#else
#include <cuda_runtime.h>
#define SOFTMAX_REF_COMPILER "nvcc"
typedef cudaError_t hipError_t;
typedef cudaEvent_t hipEvent_t;
typedef cudaDeviceProp hipDeviceProp_t;
#define hipSuccess cudaSuccess
#define hipGetErrorString cudaGetErrorString
#define hipGetLastError cudaGetLastError
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemcpy cudaMemcpy
#define hipMemset cudaMemset
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#endif

// Every runtime call goes through this: a failure names the call and exits with status 3.
#define HIP_CHECK(call)                                                                        \
    do {                                                                                       \
        hipError_t err_ = (call);                                                              \
        if (err_ != hipSuccess) {                                                              \
            std::fprintf(stderr, "error: %s failed: %s (%s:%d)\n", #call, hipGetErrorString(err_), \
                         __FILE__, __LINE__);                                                  \
            std::exit(3);                                                                      \
        }                                                                                      \
    } while (0)

// After a kernel launch: a bad launch configuration is reported with the kernel's name.
#define HIP_CHECK_LAUNCH(what)                                                                 \
    do {                                                                                       \
        hipError_t err_ = hipGetLastError();                                                   \
        if (err_ != hipSuccess) {                                                              \
            std::fprintf(stderr, "error: launch of %s failed: %s\n", (what), hipGetErrorString(err_)); \
            std::exit(3);                                                                      \
        }                                                                                      \
    } while (0)
