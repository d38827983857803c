//! Cross-runtime correctness tests of the core ops: every kernel against its CPU f64 reference,
//! on every runtime that is compiled in and present (`testkit`). One binary, one module per
//! kernel family.

mod argmax;
mod attention;
mod burn;
mod elementwise;
mod embedding;
mod matmul;
mod matmul_normed;
mod matmul_tensor_gemv;
mod norm;
mod qkv;
mod rope;
mod sampling;
mod screened_argmax;
mod softmax;
