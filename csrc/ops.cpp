// Operator schemas of torchsparse_pp. Device implementations register themselves per file
// (cpu/*.cpp, and cuda/*.cu when built with CUDA).
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(torchsparse_pp, m) {
  // Exact hash table of packed (batch, x, y, z) coordinates.
  m.def("hash_build(Tensor coords) -> (Tensor keys, Tensor vals)");
  m.def("hash_query(Tensor keys, Tensor vals, Tensor query) -> Tensor");

  // Kernel maps. mode: 'spconv' | 'minkowski' | 'generative'.
  m.def(
      "kmap_output_coords(Tensor coords, int[] kernel_size, int[] stride, int[] dilation, "
      "int[] padding, str mode, int[]? out_range) -> Tensor");
  m.def(
      "kmap_out_in(Tensor keys, Tensor vals, Tensor out_coords, int[] kernel_size, int[] stride, "
      "int[] dilation, int[] padding, int pad_rows_to, bool submanifold=False) -> Tensor");
  m.def(
      "kmap_pairs(Tensor out_in, int num_in, int num_out) -> (Tensor in_idx, Tensor out_idx, "
      "Tensor offsets, Tensor identity)");

  // Gather-GEMM-scatter dataflow: forward (and dgrad with transpose_weight), wgrad.
  m.def(
      "gather_scatter_forward(Tensor feats, Tensor weight, Tensor src_idx, Tensor dst_idx, "
      "Tensor offsets, Tensor identity, int num_dst, bool transpose_weight) -> Tensor");
  m.def(
      "gather_scatter_wgrad(Tensor feats, Tensor grad_out, Tensor src_idx, Tensor dst_idx, "
      "Tensor offsets, Tensor identity) -> Tensor");
}

// `import torchsparse_pp._C` loads this library, which registers the operators above.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C",
                                          "torchsparse_pp operator library", -1, nullptr};
  return PyModule_Create(&module_def);
}
