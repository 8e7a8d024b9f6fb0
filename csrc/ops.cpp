// Operator schemas of torchsparse_pp. Device implementations register themselves per file
// (cpu/*.cpp, and cuda/*.cu when built with CUDA).
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(torchsparse_pp, m) {
  // Row counts that follow a data-dependent coordinate set are SymInt, so that torch.compile /
  // torch.export can pass the unbacked sizes of traced maps (the kernels take int64_t).
  // Exact hash table of packed (batch, x, y, z) coordinates: a [capacity, 2] int64 tensor of
  // (key, row) slots.
  m.def("hash_build(Tensor coords) -> Tensor table");
  m.def("hash_query(Tensor table, Tensor query) -> Tensor");

  // Kernel maps. out_in[q, k] = input row read by output q through offset k, or -1.
  m.def(
      "kmap_out_in(Tensor table, Tensor out_coords, int[] kernel_size, int[] stride, "
      "int[] dilation, int[] padding, int pad_rows_to, bool submanifold=False) -> Tensor");
  // Submanifold map (Q = coords, stride 1) by sort and merge; no table needed.
  m.def(
      "kmap_submanifold(Tensor coords, int[] kernel_size, int[] dilation, int[] padding, "
      "int pad_rows_to) -> Tensor");
  // New output set ('spconv' or 'minkowski') and its map from coords.
  m.def(
      "kmap_downsample(Tensor coords, int[] kernel_size, int[] stride, int[] dilation, "
      "int[] padding, str mode, int[]? out_range, int pad_rows_to) -> (Tensor out_coords, "
      "Tensor out_in)");
  // Fine set a generative transposed conv writes, and the map from it to coords (rows).
  m.def(
      "kmap_generative(Tensor coords, int[] kernel_size, int[] stride, int[] dilation, "
      "int[] padding, int[]? out_range, int pad_rows_to) -> (Tensor fine_coords, Tensor out_in)");
  m.def(
      "kmap_pairs(Tensor out_in, SymInt num_in, SymInt num_out) -> (Tensor in_idx, Tensor out_idx, "
      "Tensor offsets, Tensor identity)");

  // Output-stationary helpers: the transposed table and execution plans (splits, sorted row
  // orders, per-tile offset bitmasks).
  m.def("kmap_transpose(Tensor out_in, SymInt num_out, SymInt num_in, int pad_rows_to) -> Tensor");
  m.def(
      "kmap_plan(Tensor table, SymInt num_rows, int split_mask_num, int tile_rows, int sort_window=0) -> "
      "(Tensor bounds, Tensor order, Tensor tile_masks)");

  // Dataflows. Forward ops with transpose_weight=True compute the input gradient (dgrad).
  m.def(
      "gather_scatter_forward(Tensor feats, Tensor weight, Tensor src_idx, Tensor dst_idx, "
      "Tensor offsets, Tensor identity, SymInt num_dst, bool transpose_weight, float epsilon=0., "
      "int mm_thresh=0, bool deterministic=False) -> Tensor");
  m.def(
      "gather_scatter_wgrad(Tensor feats, Tensor grad_out, Tensor src_idx, Tensor dst_idx, "
      "Tensor offsets, Tensor identity, bool deterministic=False) -> Tensor");
  // deterministic / allow_tf32 choose among the CUDA kernels (owned-rows forward; TF32 tensor
  // cores); the CPU kernels are deterministic and exact whatever they say.
  m.def(
      "fetch_on_demand_forward(Tensor feats, Tensor weight, Tensor src_idx, Tensor dst_idx, "
      "Tensor offsets, Tensor identity, SymInt num_dst, bool transpose_weight, bool deterministic=False, "
      "bool allow_tf32=False) -> Tensor");
  m.def(
      "fetch_on_demand_wgrad(Tensor feats, Tensor grad_out, Tensor src_idx, Tensor dst_idx, "
      "Tensor offsets, Tensor identity, bool allow_tf32=False) -> Tensor");
  m.def(
      "implicit_gemm_forward(Tensor feats, Tensor weight, Tensor table, SymInt num_dst, "
      "bool transpose_weight, Tensor bounds, Tensor order, Tensor tile_masks, int tile_rows, "
      "bool allow_tf32=False) -> Tensor");
  // The CPU register kernels' operands of a plan (per group of rows: its offsets and sources),
  // built once per map, and the forward that reads them instead of the table.
  m.def(
      "implicit_gemm_row_groups(Tensor table, SymInt num_rows, Tensor bounds, Tensor order, Tensor tile_masks, "
      "int tile_rows) -> (Tensor term_begin, Tensor term_offsets, Tensor term_sources)");
  m.def(
      "implicit_gemm_forward_grouped(Tensor feats, Tensor weight, Tensor table, SymInt num_dst, "
      "bool transpose_weight, Tensor bounds, Tensor order, Tensor tile_masks, int tile_rows, Tensor term_begin, "
      "Tensor term_offsets, Tensor term_sources) -> Tensor");
  m.def(
      "implicit_gemm_wgrad(Tensor feats, Tensor grad_out, Tensor table, Tensor bounds, Tensor order, "
      "Tensor tile_masks, int tile_rows, bool allow_tf32=False) -> Tensor");

  // Eval-time fused forward (CPU): act(conv + bias + residual) with the epilogue applied to each
  // block of output rows while it is in cache.
  m.def(
      "fetch_on_demand_forward_fused(Tensor feats, Tensor weight, Tensor src_idx, Tensor dst_idx, "
      "Tensor offsets, Tensor identity, SymInt num_dst, Tensor? bias, Tensor? residual, bool relu) -> Tensor");
  // BatchNorm over [N, C] features: batch statistics (mean, 1 / sqrt(var + eps), unbiased var),
  // out = act(feats * scale + shift + residual) (the _masked form: act the ReLU, and its mask as
  // bits, int16 [N, ceil(C / 16)]), and the backward of the training form given the statistics
  // (relu_mask when act is the ReLU; the last result is the residual's gradient).
  m.def("batch_norm_stats(Tensor feats, float eps) -> (Tensor mean, Tensor invstd, Tensor var)");
  m.def("batch_norm_apply(Tensor feats, Tensor scale, Tensor shift, Tensor? residual, bool relu) -> Tensor");
  m.def(
      "batch_norm_apply_masked(Tensor feats, Tensor scale, Tensor shift, Tensor? residual) -> (Tensor out, "
      "Tensor relu_mask)");
  m.def(
      "batch_norm_backward(Tensor grad_out, Tensor feats, Tensor mean, Tensor invstd, Tensor? weight, "
      "Tensor? relu_mask, bool residual_grad) -> (Tensor grad_feats, Tensor grad_weight, Tensor grad_bias, "
      "Tensor grad_residual)");
  // Whether this CPU runs the bfloat16 dot-product tile kernels (AVX512-BF16).
  m.def("cpu_bf16_dot() -> bool");
  // Whether this CPU runs the register kernels of fetch_on_demand / implicit GEMM (else float
  // tiles), and their instruction set: 2 AVX-512, 1 AVX2, 0 none (an int: opcheck compares
  // outputs and cannot compare strings).
  m.def("cpu_register_kernels() -> bool");
  m.def("cpu_register_isa() -> int");
  m.def("cpu_set_register_isa(str isa) -> ()");

  // Whether this build has CUDA kernels (they register under the CUDA dispatch key).
  m.def("cuda_built() -> bool");
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CompositeExplicitAutograd, m) {
#ifdef TSPP_WITH_CUDA
  m.impl("cuda_built", []() { return true; });
#else
  m.impl("cuda_built", []() { return false; });
#endif
}

// `import torchsparse_pp._C` loads this library, which registers the operators above.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C",
                                          "torchsparse_pp operator library", -1, nullptr};
  return PyModule_Create(&module_def);
}
