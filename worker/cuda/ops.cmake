# The CUDA device's kernel table (worker/cuda/ops/, cuda_ops.h), included
# by worker/cuda/CMakeLists.txt for hpudev_cuda.so and by tests/unit for
# test_cuda_ops (where HPU_HAVE_CUDA): the sources (absolute paths) and
# the libraries they need.
set(HPU_CUDA_OPS_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops.c         # contexts, stream, the table, own-kernel entries
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_gemm.c    # products on cuBLASLt
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_conv.c    # convolutions on cuDNN
  ${CMAKE_CURRENT_LIST_DIR}/ops/cuops_kernels.cu # pooling, eltwise, softmax, layer norm, dropout, embedding, losses
)
# No multiply-add contraction in our kernels, as the CPU's sources are
# built with -ffp-contract=off (set in the including directory's scope).
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/ops/cuops_kernels.cu
  PROPERTIES COMPILE_OPTIONS "--fmad=false")
find_library(HPU_CUDNN_LIBRARY cudnn
  HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES lib64 lib)
if(NOT HPU_CUDNN_LIBRARY)
  message(FATAL_ERROR "the CUDA toolkit was found, but not cuDNN (libcudnn) beside it")
endif()
set(HPU_CUDA_OPS_LIBS CUDA::cublasLt CUDA::cudart ${HPU_CUDNN_LIBRARY} hpucommon
    Threads::Threads)
