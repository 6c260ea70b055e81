# The CUDA device's kernel table (worker/cuda/ops/, cuda_ops.h), included
# by worker/cuda/CMakeLists.txt for hpudev_cuda.so and by tests/unit for
# test_cuda_ops (where HPU_HAVE_CUDA): the sources (absolute paths) and
# the libraries they need.
set(HPU_CUDA_OPS_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_core.c    # the base: contexts, stream, errors
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops.c         # the table, its own entries, the release
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_gemm.c    # products on cuBLASLt
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_conv.c    # convolutions on cuDNN
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_kernels.cu # pooling, eltwise, softmax, layer norm, dropout, embedding, losses
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_layers.c  # the layers' own passes: the table's entries
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_layers.cu # their kernels: losses over positions, heads, masks, dropout rows, batch norm
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_more.c    # the shape, sequence and loss layers' entries
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_more.cu   # their kernels
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_flash.cu  # fused attention: worker/ops/flash_rows.h's rows, a thread each
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_flash16.cu # ... under bf16 autocast: flash_tiles.h's tiles on tensor cores
)
# The target compiles CUDA with --fmad=false (no multiply-add contraction,
# as the CPU's sources are built with -ffp-contract=off) and links a cudart
# of its choice (static for the module). Without cuDNN the lists stay
# empty: the module is built without kernels and --device cuda says so.
find_library(HPU_CUDNN_LIBRARY cudnn
  HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES lib64 lib)
find_path(HPU_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(NOT HPU_CUDNN_LIBRARY OR NOT HPU_CUDNN_INCLUDE_DIR)
  message(STATUS "cuDNN (libcudnn, cudnn.h) not found beside the CUDA toolkit: no CUDA kernels")
  set(HPU_CUDA_OPS_SOURCES "")
  return()
endif()
if(NOT TARGET hpu_cudnn)
  add_library(hpu_cudnn SHARED IMPORTED GLOBAL)
  set_target_properties(hpu_cudnn PROPERTIES IMPORTED_LOCATION ${HPU_CUDNN_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${HPU_CUDNN_INCLUDE_DIR})
endif()
set(HPU_CUDA_OPS_LIBS CUDA::cublasLt hpu_cudnn Threads::Threads)
