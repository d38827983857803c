//! Errors of the BSR constructors: one variant per way a matrix can fail to be valid BSR, so that
//! a caller (or a test) can tell exactly what was wrong with arrays it built itself.
//!
//! The launch functions return [`OpsError`] like every other op; a [`SparseError`] converts into
//! one (`?` works in code that speaks `OpsError`).

use ops::OpsError;

/// Why a BSR matrix could not be built.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum SparseError {
    /// The block size is zero.
    #[error("block size must be at least 1, got {block}")]
    BlockSize { block: usize },
    /// A dimension of the dense shape is not a multiple of the block size (or is zero).
    #[error("shape {shape:?} is not made of whole {block}x{block} blocks")]
    ShapeNotMultiple { shape: [usize; 2], block: usize },
    /// A shape with more elements than `usize` counts.
    #[error("shape {shape:?} has more elements than fit in memory")]
    ShapeTooLarge { shape: [usize; 2] },
    /// A dense host matrix whose length does not match its shape.
    #[error("{len} dense values for shape {shape:?}")]
    DenseLength { len: usize, shape: [usize; 2] },
    /// `crow_indices` must have one entry per block-row plus one.
    #[error("crow_indices has {len} entries, expected {expected} (block-rows + 1)")]
    CrowLength { len: usize, expected: usize },
    /// `crow_indices[0]` must be 0.
    #[error("crow_indices must start at 0, got {first}")]
    CrowStart { first: i32 },
    /// `crow_indices` must never decrease.
    #[error("crow_indices decreases at block-row {row}: {from} -> {to}")]
    CrowNotMonotone { row: usize, from: i32, to: i32 },
    /// The last entry of `crow_indices` must equal the number of blocks (`col_indices.len()`).
    #[error("crow_indices ends at {last}, but col_indices has {nnz} blocks")]
    CrowEnd { last: i32, nnz: usize },
    /// A column index outside `0..K/b`.
    #[error("col_indices[{index}] = {col} is outside 0..{block_cols}")]
    ColOutOfRange {
        index: usize,
        col: i32,
        block_cols: usize,
    },
    /// Column indices within a block-row must increase.
    #[error("col_indices of block-row {row} are not sorted ({prev} before {col})")]
    ColUnsorted { row: usize, prev: i32, col: i32 },
    /// The same block appears twice in a block-row.
    #[error("block-row {row} holds block column {col} twice")]
    ColDuplicate { row: usize, col: i32 },
    /// `values` must hold `nnz * b * b` elements.
    #[error("values has {len} elements, expected {expected} (nnz * b * b)")]
    ValuesLength { len: usize, expected: usize },
    /// A pruning target outside `[0, 1]`.
    #[error("target block sparsity must be within [0, 1], got {sparsity}")]
    Sparsity { sparsity: f64 },
    /// The device refused the upload (unsupported dtype, ...).
    #[error(transparent)]
    Ops(#[from] OpsError),
}

impl From<SparseError> for OpsError {
    fn from(e: SparseError) -> Self {
        match e {
            SparseError::Ops(inner) => inner,
            SparseError::ShapeNotMultiple { .. }
            | SparseError::ShapeTooLarge { .. }
            | SparseError::DenseLength { .. } => OpsError::shape("sparse::Bsr", e.to_string()),
            other => OpsError::invalid("sparse::Bsr", other.to_string()),
        }
    }
}
