// out (M, N) = x (M, K) @ w (N, K)^T in bf16 with fp32 accumulation, by CUTLASS's SM90
// kernels (TMA loads, wgmma, warp-specialized, persistent), launched with programmatic
// dependent launch (PDL) when asked: the kernel's set-up then runs while the previous kernel
// drains, and it waits for that kernel only before its first load. cuBLAS cannot launch so.
//
// "swap" configurations compute D^T (N, M) = w (N, K) @ x^T, as vLLM and TensorRT-LLM do for
// small M: the weight's rows fill the tile's 64 or 128 rows, the batch its 32-256 columns,
// and D^T column-major is `out` row-major. "plain" ones tile x's rows.
//
// gemm.py compiles this file once per configuration (the CFG_* macros below), each
// exporting one function named after it, all in one FlashInfer JIT module.
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "tvm_ffi_utils.h"

namespace {

using namespace cute;
using BF16 = cutlass::bfloat16_t;

// D (rows, cols) = A (rows, K) @ B (cols, K)^T, A and B K-major, D in LayoutD.
template <class Tile, class Schedule, class EpiSchedule, class LayoutD>
struct Config {
  static constexpr int kAlign = 8;  // 16 bytes of bf16
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Shape<_1, _1, _1>,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlign,
      BF16, LayoutD, kAlign, EpiSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, BF16, cutlass::layout::RowMajor,
      kAlign, BF16, cutlass::layout::ColumnMajor, kAlign, float, Tile, Shape<_1, _1, _1>,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

int sm_count(int device) {
  static int count[64] = {};
  if (!count[device]) cudaDeviceGetAttribute(&count[device], cudaDevAttrMultiProcessorCount, device);
  return count[device];
}

template <class Cfg>
void gemm(const void* a, const void* b, void* d, int rows, int cols, int k, bool pdl,
          int device, cudaStream_t stream) {
  using Gemm = typename Cfg::Gemm;
  using Kernel = typename Cfg::Kernel;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sm_count(device);
  auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {rows, cols, 1});
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {rows, cols, k, 1},
      {static_cast<const BF16*>(a),
       cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {rows, k, 1}),
       static_cast<const BF16*>(b),
       cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {cols, k, 1})},
      {{1.0f, 0.0f}, nullptr, stride_d, static_cast<BF16*>(d), stride_d},
      hw};
  Gemm op;
  cutlass::Status status = op.can_implement(args);
  TVM_FFI_ICHECK(status == cutlass::Status::kSuccess)
      << "CUTLASS cannot run this GEMM: " << cutlassGetStatusString(status);
  TVM_FFI_ICHECK_EQ(Gemm::get_workspace_size(args), 0);  // the persistent scheduler needs none
  status = op.initialize(args, nullptr, stream);
  if (status == cutlass::Status::kSuccess) status = op.run(stream, nullptr, pdl);
  TVM_FFI_ICHECK(status == cutlass::Status::kSuccess)
      << "CUTLASS GEMM failed: " << cutlassGetStatusString(status);
}

// Both operands bf16 and contiguous (x's rows may be a prefix of a larger buffer's).
void check(TensorView x, TensorView w, TensorView out) {
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
  TVM_FFI_ICHECK_EQ(x.size(1), w.size(1));
  TVM_FFI_ICHECK_EQ(out.size(0), x.size(0));
  TVM_FFI_ICHECK_EQ(out.size(1), w.size(0));
  TVM_FFI_ICHECK(x.size(1) % 8 == 0 && w.size(0) % 8 == 0) << "K and N: multiples of 8";
}

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using PingEpi = cutlass::epilogue::TmaWarpSpecialized;

}  // namespace

#ifndef CFG_NAME  // gemm.py defines all of these; this default lets the file compile alone
#define CFG_NAME swap_64x32x128_ping
#define CFG_SWAP 1
#define CFG_ROWS 64
#define CFG_COLS 32
#define CFG_K 128
#define CFG_SCHED Ping
#define CFG_EPI PingEpi
#endif

void CFG_NAME(TensorView x, TensorView w, TensorView out, bool pdl) {
  check(x, w, out);
  using Tile = Shape<Int<CFG_ROWS>, Int<CFG_COLS>, Int<CFG_K>>;
  int m = x.size(0), n = w.size(0), k = x.size(1);
  if (m == 0) return;
  int device = x.device().device_id;
  ffi::CUDADeviceGuard guard(device);
  cudaStream_t stream = get_stream(x.device());
  if constexpr (CFG_SWAP) {  // D^T (N, M) column-major = out (M, N) row-major
    using Cfg = Config<Tile, CFG_SCHED, CFG_EPI, cutlass::layout::ColumnMajor>;
    gemm<Cfg>(w.data_ptr(), x.data_ptr(), out.data_ptr(), n, m, k, pdl, device, stream);
  } else {
    using Cfg = Config<Tile, CFG_SCHED, CFG_EPI, cutlass::layout::RowMajor>;
    gemm<Cfg>(x.data_ptr(), w.data_ptr(), out.data_ptr(), m, n, k, pdl, device, stream);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(CFG_NAME, CFG_NAME);
