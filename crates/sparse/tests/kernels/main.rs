//! Cross-runtime correctness tests of the block-sparse (BSR) crate against its CPU f64
//! reference on every runtime present (`testkit`).

mod bsr;
