//! CPU f64 references of every kernel, used by the tests (and handy for users who want to check
//! a result). They take and return f64 so that comparisons are free of rounding of their own.

pub mod attention;
pub mod elementwise;
pub mod matmul;
pub mod norm;
pub mod qkv;
pub mod rope;
pub mod sampling;
