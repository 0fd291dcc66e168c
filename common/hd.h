// Markers for functions that the CPU and CUDA units share from one header.
#pragma once

#if defined(__CUDACC__)
#define WM_HD __host__ __device__                   // add `inline` where the header defines it
#define WM_HD_INLINE __host__ __device__ __forceinline__
#else
#define WM_HD
#define WM_HD_INLINE inline
#endif
