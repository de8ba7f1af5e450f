// out (M, N) = x (M, K) @ w (N, K)^T for decode batches (M <= 16), bf16 in and out, fp32
// accumulation on the tensor cores (mma.sync m16n8k16), launched with programmatic
// dependent launch (PDL) when asked. At these M the GEMM is the weight stream: the kernel
// is built to keep HBM busy, with no split-K pass and no set-up before its first load.
//
// - A CTA owns R tiles of 16 weight rows; its WARPS warps split K and sum their parts in
//   shared memory at the end. Each warp walks its K range in steps of 32: a thread loads 16
//   bytes of two weight rows (g and g + 8 of the tile, g = lane / 4) at k = 8 * (lane % 4),
//   and the 16 bytes of x at the same k for batch rows g (and g + 8 when M > 8). Those
//   registers are the mma's fragments as they are: the sum over k does not care which
//   physical k sits in which logical slot, as long as w and x agree (the permutation below).
// - U steps are in flight a thread: each step's loads are issued U steps before its mma.
// - Under PDL the first U steps of weights are loaded before `griddepcontrol.wait` (they do
//   not depend on the previous kernel) and x only after it; `launch_dependents` follows at
//   once, so the next kernel's own weight stream can start while this one drains.
// - SILU: the gate_up GEMM of a [gate | up] weight with SiLU-and-mul in the epilogue. Its two
//   tiles are gate rows r..r+15 and up rows N/2+r..; out (M, N/2) = silu(gate) * up, both
//   rounded to bf16 first, as the unfused GEMM then silu_and_mul round them.
// - Each output element is summed in an order fixed by K and the configuration alone (not M),
//   so a padded graph batch and an eager one give the same row.
//
// gemv.py compiles this file once per configuration (the GV_* macros), each exporting one
// function named after it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tvm_ffi_utils.h"

namespace {

constexpr int kRows = 16;  // weight rows of one mma tile
constexpr int kStep = 32;  // k of one step: 4 threads x 8 bf16

__device__ __forceinline__ uint4 load_weight(const __nv_bfloat16* p) {
  // Read once: stream past L1.
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 load_x(const __nv_bfloat16* p) {
  // Every CTA reads all of x: keep it in L1.
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// c += a (16 x 16, row) @ b (16 x 8, col). a: rows g and g + 8 at logical k {2t, 2t+1} and
// {2t+8, 2t+9}; b: column g at the same k; c: rows g, g + 8 at columns 2t, 2t + 1.
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One step: w[0] and w[1] hold 8 bf16 of rows g and g + 8 at k = 8t..8t+7, x the same k of
// one batch row. The first mma takes k 8t..8t+3 as logical {2t, 2t+1, 2t+8, 2t+9}, the second
// k 8t+4..8t+7; over t = 0..3 the two cover the step's 32 k once each.
__device__ __forceinline__ void mma_step(float (&c)[4], const uint4 (&w)[2], const uint4& x) {
  mma(c, w[0].x, w[1].x, w[0].y, w[1].y, x.x, x.y);
  mma(c, w[0].z, w[1].z, w[0].w, w[1].w, x.z, x.w);
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

// NT: n8 tiles of the batch (1: M <= 8, 2: M <= 16).
template <int WARPS, int U, int R, int NT, bool SILU>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                __nv_bfloat16* __restrict__ out, int m, int n, int k) {
  static_assert(!SILU || R == 2, "SiLU-and-mul pairs one gate tile with one up tile");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int n_out = SILU ? n / 2 : n;

  int row0[R];  // each tile's first weight row
#pragma unroll
  for (int i = 0; i < R; ++i) {
    row0[i] = SILU ? blockIdx.x * kRows + i * (n / 2) : (blockIdx.x * R + i) * kRows;
  }
  const __nv_bfloat16* wp[R][2];
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) wp[i][h] = w + size_t(row0[i] + g + 8 * h) * k + 8 * t;
  }
  const __nv_bfloat16* xp[NT];  // rows past M read the last row; their sums are not stored
#pragma unroll
  for (int j = 0; j < NT; ++j) xp[j] = x + size_t(min(g + 8 * j, m - 1)) * k + 8 * t;

  // This warp's steps: a contiguous range of K / 32.
  const int steps = k / kStep, per_warp = (steps + WARPS - 1) / WARPS;
  const int begin = warp * per_warp, end = min(steps, begin + per_warp);

  uint4 wb[U][R][2], xb[U][NT];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (begin + u < end) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) wb[u][i][h] = load_weight(wp[i][h] + (begin + u) * kStep);
      }
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (begin + u < end) {
#pragma unroll
      for (int j = 0; j < NT; ++j) xb[u][j] = load_x(xp[j] + (begin + u) * kStep);
    }
  }

  float acc[R][NT][4] = {};
  for (int s = begin; s < end; s += U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int step = s + u;
      if (step < end) {
        uint4 wc[R][2], xc[NT];
#pragma unroll
        for (int i = 0; i < R; ++i) {
          wc[i][0] = wb[u][i][0];
          wc[i][1] = wb[u][i][1];
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) xc[j] = xb[u][j];
        const int next = step + U;
        if (next < end) {
#pragma unroll
          for (int i = 0; i < R; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) wb[u][i][h] = load_weight(wp[i][h] + next * kStep);
          }
#pragma unroll
          for (int j = 0; j < NT; ++j) xb[u][j] = load_x(xp[j] + next * kStep);
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
#pragma unroll
          for (int j = 0; j < NT; ++j) mma_step(acc[i][j], wc[i], xc[j]);
        }
      }
    }
  }

  // The warps' partial sums, in warp order: the same order for every M.
  constexpr int kFrag = R * NT * 32 * 4;
  __shared__ float partial[WARPS][kFrag];
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[warp][((i * NT + j) * 32 + lane) * 4 + c] = acc[i][j][c];
    }
  }
  __syncthreads();
  // Element e of a tile's fragments: lane l = e / 4 % 32, register c = e % 4 -> weight row
  // l / 4 + 8 * (c / 2), batch row 2 * (l % 4) + c % 2 + 8 * j.
  constexpr int kTileFrag = NT * 32 * 4;
  for (int e = threadIdx.x; e < kTileFrag; e += WARPS * 32) {
    const int j = e / 128, l = e / 4 % 32, c = e % 4;
    const int row = l / 4 + 8 * (c / 2), batch = 2 * (l % 4) + c % 2 + 8 * j;
    float sum[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      sum[i] = 0.0f;
      for (int v = 0; v < WARPS; ++v) sum[i] += partial[v][i * kTileFrag + e];
    }
    if (batch >= m) continue;
    if constexpr (SILU) {
      const float gate = __bfloat162float(__float2bfloat16(sum[0]));
      const float up = __bfloat162float(__float2bfloat16(sum[1]));
      out[size_t(batch) * n_out + row0[0] + row] = __float2bfloat16(silu(gate) * up);
    } else {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        out[size_t(batch) * n_out + row0[i] + row] = __float2bfloat16(sum[i]);
      }
    }
  }
}

template <int WARPS, int U, int R, bool SILU>
void launch(TensorView x, TensorView w, TensorView out, bool pdl) {
  CHECK_CUDA(x);
  CHECK_DEVICE(x, w);
  CHECK_DEVICE(x, out);
  CHECK_DIM(2, x);
  CHECK_DIM(2, w);
  CHECK_DIM(2, out);
  TVM_FFI_ICHECK(x.dtype() == dl_bfloat16 && w.dtype() == dl_bfloat16 &&
                 out.dtype() == dl_bfloat16)
      << "bf16 only";
  CHECK_CONTIGUOUS(x);
  CHECK_CONTIGUOUS(w);
  CHECK_CONTIGUOUS(out);
  const int m = x.size(0), n = w.size(0), k = x.size(1);
  TVM_FFI_ICHECK_EQ(w.size(1), k);
  TVM_FFI_ICHECK_EQ(out.size(0), m);
  TVM_FFI_ICHECK_EQ(out.size(1), SILU ? n / 2 : n);
  TVM_FFI_ICHECK(m <= 16) << "GEMV: at most 16 rows, got " << m;
  TVM_FFI_ICHECK(k % kStep == 0) << "GEMV: K a multiple of " << kStep << ", got " << k;
  const int rows_per_cta = kRows * R;
  TVM_FFI_ICHECK((SILU ? (n / 2) % kRows == 0 && n % 2 == 0 : n % rows_per_cta == 0))
      << "GEMV: N = " << n << " does not tile";
  for (const void* p : {x.data_ptr(), w.data_ptr()}) {
    TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0) << "GEMV: 16-byte aligned rows";
  }
  if (m == 0) return;
  const int device = x.device().device_id;
  ffi::CUDADeviceGuard guard(device);

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(SILU ? n / 2 / kRows : n / rows_per_cta);
  config.blockDim = dim3(WARPS * 32);
  config.stream = get_stream(x.device());
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = pdl;
  config.attrs = &attr;
  config.numAttrs = 1;
  auto* xp = static_cast<const __nv_bfloat16*>(x.data_ptr());
  auto* wp = static_cast<const __nv_bfloat16*>(w.data_ptr());
  auto* op = static_cast<__nv_bfloat16*>(out.data_ptr());
  cudaError_t err = m <= 8
      ? cudaLaunchKernelEx(&config, gemv_kernel<WARPS, U, R, 1, SILU>, xp, wp, op, m, n, k)
      : cudaLaunchKernelEx(&config, gemv_kernel<WARPS, U, R, 2, SILU>, xp, wp, op, m, n, k);
  TVM_FFI_ICHECK(err == cudaSuccess) << "GEMV launch failed: " << cudaGetErrorString(err);
}

}  // namespace

#ifndef GV_NAME  // gemv.py defines all of these; this default lets the file compile alone
#define GV_NAME gemv_w8_u4_r1
#define GV_WARPS 8
#define GV_U 4
#define GV_R 1
#define GV_SILU false
#endif

void GV_NAME(TensorView x, TensorView w, TensorView out, bool pdl) {
  launch<GV_WARPS, GV_U, GV_R, GV_SILU>(x, w, out, pdl);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(GV_NAME, GV_NAME);
