//! The block-sparse row (BSR) matrix on the device, in PyTorch's layout.
//!
//! A weight `W[N, K]` (N output features, K input features) is cut into `b x b` blocks. Only the
//! blocks that are present are stored: `crow_indices[N/b + 1]` (i32) delimits the blocks of each
//! block-row, `col_indices[nnz]` (i32) gives their block column (sorted, unique within a row) and
//! `values[nnz, b, b]` their contents, row-major inside each block. This is exactly
//! `torch.Tensor.to_sparse_bsr((b, b))`, so arrays can move between the two unchanged.
//!
//! Besides the format, a [`Bsr`] carries the *work list* the matmul walks (built once here, on the
//! host, because it depends only on the sparsity pattern): one item per block-row, except that a
//! block-row with many more blocks than the average is cut into chunks along K, each chunk its own
//! item with its own slot of f32 partial sums, which a second small kernel adds up. That way a
//! matrix whose blocks all sit in one row does not leave one cube walking the whole row while the
//! others idle, and no atomics are needed (the sum is deterministic). Items are ordered longest
//! first so that the longest cubes start first.

use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor};

use crate::SparseError;

/// A block-row is cut into chunks when it holds more than this many times the mean number of
/// blocks per block-row. Three keeps pruned weights (whose rows differ by a few standard
/// deviations of a binomial) in one pass, and cuts pathological rows.
const SPLIT_FACTOR: usize = 3;
/// Chunks are never shorter than this many blocks: a shorter chunk costs more in partial sums
/// than it saves in balance.
const MIN_CHUNK: usize = 4;

/// A block-sparse matrix `[N, K]` with `b x b` blocks, stored on the device of runtime `R`.
pub struct Bsr<R: Runtime> {
    shape: [usize; 2],
    block: usize,
    dtype: DType,
    crow_host: Vec<i32>,
    col_host: Vec<i32>,
    crow: DeviceTensor<R>,
    col: DeviceTensor<R>,
    values: DeviceTensor<R>,
    pub(crate) plan: WorkPlan<R>,
}

impl<R: Runtime> Clone for Bsr<R> {
    fn clone(&self) -> Self {
        Self {
            shape: self.shape,
            block: self.block,
            dtype: self.dtype,
            crow_host: self.crow_host.clone(),
            col_host: self.col_host.clone(),
            crow: self.crow.clone(),
            col: self.col.clone(),
            values: self.values.clone(),
            plan: self.plan.clone(),
        }
    }
}

impl<R: Runtime> std::fmt::Debug for Bsr<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Bsr {{ shape: {:?}, block: {}, nnz_blocks: {}, density: {:.3}, dtype: {}, items: {}, split_rows: {} }}",
            self.shape,
            self.block,
            self.nnz_blocks(),
            self.density(),
            self.dtype,
            self.plan.n_items,
            self.plan.n_splits
        )
    }
}

/// The work list of the matmul (see the module docs).
pub(crate) struct WorkPlan<R: Runtime> {
    /// i32 `[n_items, 4]`: block-row, first block, end block, partial slot (-1: write `y`).
    pub items: DeviceTensor<R>,
    pub n_items: usize,
    /// i32 `[n_splits, 3]`: block-row, first slot, slot count (a 1-element dummy when none).
    pub splits: DeviceTensor<R>,
    pub n_splits: usize,
    /// Number of partial-sum slots (`[n_slots, M, b]` f32 per call).
    pub n_slots: usize,
    /// Stand-ins bound where the kernel has no bias / no partial buffer (never read).
    pub dummy_bias: DeviceTensor<R>,
    pub dummy_f32: DeviceTensor<R>,
}

impl<R: Runtime> Clone for WorkPlan<R> {
    fn clone(&self) -> Self {
        Self {
            items: self.items.clone(),
            n_items: self.n_items,
            splits: self.splits.clone(),
            n_splits: self.n_splits,
            n_slots: self.n_slots,
            dummy_bias: self.dummy_bias.clone(),
            dummy_f32: self.dummy_f32.clone(),
        }
    }
}

/// The host side of a work list, before upload (public to the crate's tests through
/// [`Bsr::work_items`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkItems {
    /// `(block_row, first_block, end_block, slot)`, slot -1 when the item writes `y` itself.
    pub items: Vec<[i32; 4]>,
    /// `(block_row, first_slot, slot_count)` of the block-rows that were cut.
    pub splits: Vec<[i32; 3]>,
    pub n_slots: usize,
}

/// Builds the work list of a BSR pattern (see the module docs for the policy). `crow` is a
/// valid `crow_indices` ([`validate_bsr`]); one that does not start at 0 or decreases somewhere
/// has no meaningful work list and gets an empty one.
pub fn build_work_items(crow: &[i32]) -> WorkItems {
    let valid = crow.first().is_none_or(|&c| c == 0) && crow.windows(2).all(|w| w[0] <= w[1]);
    if !valid {
        return WorkItems {
            items: Vec::new(),
            splits: Vec::new(),
            n_slots: 0,
        };
    }
    let rows = crow.len().saturating_sub(1);
    let nnz = *crow.last().unwrap_or(&0) as usize;
    let mean = nnz.div_ceil(rows.max(1));
    let cap = (SPLIT_FACTOR * mean).max(MIN_CHUNK);
    let mut items = Vec::with_capacity(rows);
    let mut splits = Vec::new();
    let mut n_slots = 0usize;
    for r in 0..rows {
        let (s, e) = (crow[r] as usize, crow[r + 1] as usize);
        let n = e - s;
        if n <= cap {
            items.push([r as i32, s as i32, e as i32, -1]);
            continue;
        }
        // Even chunks of at most `cap` blocks.
        let chunks = n.div_ceil(cap);
        splits.push([r as i32, n_slots as i32, chunks as i32]);
        for c in 0..chunks {
            let a = s + n * c / chunks;
            let b = s + n * (c + 1) / chunks;
            items.push([r as i32, a as i32, b as i32, (n_slots + c) as i32]);
        }
        n_slots += chunks;
    }
    // Longest first (stable: ties keep block-row order), so that long cubes start early.
    items.sort_by_key(|it| std::cmp::Reverse(it[2] - it[1]));
    WorkItems {
        items,
        splits,
        n_slots,
    }
}

fn check_shape(shape: [usize; 2], block: usize) -> Result<(), SparseError> {
    if block == 0 {
        return Err(SparseError::BlockSize { block });
    }
    if shape[0] == 0
        || shape[1] == 0
        || !shape[0].is_multiple_of(block)
        || !shape[1].is_multiple_of(block)
    {
        return Err(SparseError::ShapeNotMultiple { shape, block });
    }
    // Every count derived from the shape (dense elements, values of all blocks) then fits.
    if shape[0].checked_mul(shape[1]).is_none() {
        return Err(SparseError::ShapeTooLarge { shape });
    }
    Ok(())
}

fn check_dense(dense: &[f32], shape: [usize; 2]) -> Result<(), SparseError> {
    if dense.len() != shape[0] * shape[1] {
        return Err(SparseError::DenseLength {
            len: dense.len(),
            shape,
        });
    }
    Ok(())
}

/// Copies block `(br, bc)` of a dense row-major `[N, K]` matrix, row-major inside the block.
fn copy_block(dense: &[f32], k: usize, b: usize, br: usize, bc: usize, out: &mut Vec<f32>) {
    for i in 0..b {
        let row = (br * b + i) * k + bc * b;
        out.extend_from_slice(&dense[row..row + b]);
    }
}

/// Squared L2 norm of every block, row-major over the block grid.
fn block_norms(dense: &[f32], shape: [usize; 2], b: usize) -> Vec<f64> {
    let (rows, cols) = (shape[0] / b, shape[1] / b);
    let mut norms = vec![0f64; rows * cols];
    for n in 0..shape[0] {
        for kk in 0..shape[1] {
            let v = dense[n * shape[1] + kk] as f64;
            norms[(n / b) * cols + kk / b] += v * v;
        }
    }
    norms
}

/// Checks raw BSR arrays (see [`SparseError`] for each violation). Public so that arrays from
/// elsewhere (e.g. a checkpoint) can be checked without a device.
pub fn validate_bsr(
    crow: &[i32],
    col: &[i32],
    values_len: usize,
    shape: [usize; 2],
    block: usize,
) -> Result<(), SparseError> {
    check_shape(shape, block)?;
    let rows = shape[0] / block;
    let block_cols = shape[1] / block;
    if crow.len().checked_sub(1) != Some(rows) {
        return Err(SparseError::CrowLength {
            len: crow.len(),
            expected: rows.saturating_add(1),
        });
    }
    if crow[0] != 0 {
        return Err(SparseError::CrowStart { first: crow[0] });
    }
    for r in 0..rows {
        if crow[r + 1] < crow[r] {
            return Err(SparseError::CrowNotMonotone {
                row: r,
                from: crow[r],
                to: crow[r + 1],
            });
        }
    }
    let last = crow[rows];
    if last as usize != col.len() {
        return Err(SparseError::CrowEnd {
            last,
            nnz: col.len(),
        });
    }
    for (index, &c) in col.iter().enumerate() {
        if c < 0 || c as usize >= block_cols {
            return Err(SparseError::ColOutOfRange {
                index,
                col: c,
                block_cols,
            });
        }
    }
    for r in 0..rows {
        let row = &col[crow[r] as usize..crow[r + 1] as usize];
        for pair in row.windows(2) {
            if pair[1] == pair[0] {
                return Err(SparseError::ColDuplicate {
                    row: r,
                    col: pair[0],
                });
            }
            if pair[1] < pair[0] {
                return Err(SparseError::ColUnsorted {
                    row: r,
                    prev: pair[0],
                    col: pair[1],
                });
            }
        }
    }
    let expected = col.len() * block * block;
    if values_len != expected {
        return Err(SparseError::ValuesLength {
            len: values_len,
            expected,
        });
    }
    Ok(())
}

impl<R: Runtime> Bsr<R> {
    /// Keeps every block of `dense` (`[N, K]` row-major, f32 on the host) that is not all zero.
    pub fn from_dense(
        client: &ComputeClient<R>,
        dense: &[f32],
        shape: [usize; 2],
        block: usize,
        dtype: DType,
    ) -> Result<Self, SparseError> {
        check_shape(shape, block)?;
        check_dense(dense, shape)?;
        let (rows, cols) = (shape[0] / block, shape[1] / block);
        let mut keep = vec![false; rows * cols];
        for n in 0..shape[0] {
            for kk in 0..shape[1] {
                if dense[n * shape[1] + kk] != 0.0 {
                    keep[(n / block) * cols + kk / block] = true;
                }
            }
        }
        Self::from_mask(client, dense, shape, block, &keep, dtype)
    }

    /// Prunes `dense` to `target_block_sparsity` (the fraction of blocks dropped, in `[0, 1]`):
    /// keeps the `round((1 - s) * blocks)` blocks of largest L2 norm over the whole matrix.
    ///
    /// Ties are broken by position: among blocks of equal norm, the one earlier in row-major block
    /// order (lower block-row, then lower block column) is kept. The count is exact, so the
    /// density is the target even when that means keeping some all-zero blocks.
    pub fn prune_from_dense(
        client: &ComputeClient<R>,
        dense: &[f32],
        shape: [usize; 2],
        block: usize,
        target_block_sparsity: f64,
        dtype: DType,
    ) -> Result<Self, SparseError> {
        check_shape(shape, block)?;
        check_dense(dense, shape)?;
        if !(0.0..=1.0).contains(&target_block_sparsity) {
            return Err(SparseError::Sparsity {
                sparsity: target_block_sparsity,
            });
        }
        let norms = block_norms(dense, shape, block);
        let total = norms.len();
        let kept = (((1.0 - target_block_sparsity) * total as f64).round() as usize).min(total);
        let mut order: Vec<usize> = (0..total).collect();
        // Largest norm first; equal norms in block order (the sort is stable).
        order.sort_by(|&a, &b| norms[b].total_cmp(&norms[a]));
        let mut keep = vec![false; total];
        for &i in &order[..kept] {
            keep[i] = true;
        }
        Self::from_mask(client, dense, shape, block, &keep, dtype)
    }

    /// Builds a matrix from raw PyTorch-layout arrays after checking them ([`validate_bsr`]).
    /// `values` are f32 on the host, converted to `dtype` on upload.
    pub fn from_raw(
        client: &ComputeClient<R>,
        crow_indices: &[i32],
        col_indices: &[i32],
        values: &[f32],
        shape: [usize; 2],
        block: usize,
        dtype: DType,
    ) -> Result<Self, SparseError> {
        validate_bsr(crow_indices, col_indices, values.len(), shape, block)?;
        Self::upload(
            client,
            crow_indices.to_vec(),
            col_indices.to_vec(),
            values,
            shape,
            block,
            dtype,
        )
    }

    fn from_mask(
        client: &ComputeClient<R>,
        dense: &[f32],
        shape: [usize; 2],
        block: usize,
        keep: &[bool],
        dtype: DType,
    ) -> Result<Self, SparseError> {
        let (rows, cols) = (shape[0] / block, shape[1] / block);
        let mut crow = Vec::with_capacity(rows + 1);
        let mut col = Vec::new();
        let mut values = Vec::new();
        crow.push(0i32);
        for br in 0..rows {
            for bc in 0..cols {
                if keep[br * cols + bc] {
                    col.push(bc as i32);
                    copy_block(dense, shape[1], block, br, bc, &mut values);
                }
            }
            crow.push(col.len() as i32);
        }
        Self::upload(client, crow, col, &values, shape, block, dtype)
    }

    fn upload(
        client: &ComputeClient<R>,
        crow: Vec<i32>,
        col: Vec<i32>,
        values: &[f32],
        shape: [usize; 2],
        block: usize,
        dtype: DType,
    ) -> Result<Self, SparseError> {
        caps::check_float_dtype(client, "sparse::Bsr", dtype)?;
        let nnz = col.len();
        let crow_dev = DeviceTensor::from_slice(client, &crow, &[crow.len()])?;
        let col_dev = DeviceTensor::from_slice(client, &col, &[nnz])?;
        let values_dev = if nnz == 0 {
            // Kernels bind `values` as vectors even when they never read it: give the empty
            // matrix one zero block of storage (the shape still says 0 blocks).
            let zeros = DeviceTensor::<R>::from_f32(
                client,
                &vec![0.0; block * block],
                &[block * block],
                dtype,
            )?;
            DeviceTensor::from_handle(zeros.handle().clone(), &[0, block, block], dtype)
        } else {
            DeviceTensor::from_f32(client, values, &[nnz, block, block], dtype)?
        };
        let work = build_work_items(&crow);
        let flat_items: Vec<i32> = work.items.iter().flatten().copied().collect();
        let items = DeviceTensor::from_slice(client, &flat_items, &[work.items.len(), 4])?;
        let splits = if work.splits.is_empty() {
            DeviceTensor::from_slice(client, &[0i32; 3], &[1, 3])?
        } else {
            let flat: Vec<i32> = work.splits.iter().flatten().copied().collect();
            DeviceTensor::from_slice(client, &flat, &[work.splits.len(), 3])?
        };
        let plan = WorkPlan {
            items,
            n_items: work.items.len(),
            splits,
            n_splits: work.splits.len(),
            n_slots: work.n_slots,
            dummy_bias: DeviceTensor::from_f32(client, &[0.0], &[1], dtype)?,
            dummy_f32: DeviceTensor::from_f32(client, &[0.0], &[1], DType::F32)?,
        };
        Ok(Self {
            shape,
            block,
            dtype,
            crow_host: crow,
            col_host: col,
            crow: crow_dev,
            col: col_dev,
            values: values_dev,
            plan,
        })
    }

    /// The dense shape `[N, K]`.
    pub fn shape(&self) -> [usize; 2] {
        self.shape
    }

    /// The block size `b`.
    pub fn block_size(&self) -> usize {
        self.block
    }

    /// The dtype of `values`.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of stored blocks.
    pub fn nnz_blocks(&self) -> usize {
        self.col_host.len()
    }

    /// Stored blocks over all blocks of the dense shape (1.0 for a dense matrix).
    pub fn density(&self) -> f64 {
        let total = (self.shape[0] / self.block) * (self.shape[1] / self.block);
        self.nnz_blocks() as f64 / total as f64
    }

    /// `crow_indices` on the device (i32 `[N/b + 1]`).
    pub fn crow_indices(&self) -> &DeviceTensor<R> {
        &self.crow
    }

    /// `col_indices` on the device (i32 `[nnz]`).
    pub fn col_indices(&self) -> &DeviceTensor<R> {
        &self.col
    }

    /// `values` on the device (`[nnz, b, b]`).
    pub fn values(&self) -> &DeviceTensor<R> {
        &self.values
    }

    /// Host copy of `crow_indices`.
    pub fn crow_indices_host(&self) -> &[i32] {
        &self.crow_host
    }

    /// Host copy of `col_indices`.
    pub fn col_indices_host(&self) -> &[i32] {
        &self.col_host
    }

    /// The work list the matmul walks (see the module docs), rebuilt from the pattern.
    pub fn work_items(&self) -> WorkItems {
        build_work_items(&self.crow_host)
    }

    /// The dense matrix `[N, K]` as f32 on the host (reads `values` back from the device).
    pub fn to_dense(&self, client: &ComputeClient<R>) -> Result<Vec<f32>, SparseError> {
        let b = self.block;
        let k = self.shape[1];
        let values = if self.nnz_blocks() == 0 {
            Vec::new()
        } else {
            self.values.to_f32_vec(client)?
        };
        let mut dense = vec![0f32; self.shape[0] * k];
        for br in 0..self.shape[0] / b {
            for idx in self.crow_host[br] as usize..self.crow_host[br + 1] as usize {
                let bc = self.col_host[idx] as usize;
                for i in 0..b {
                    let src = &values[(idx * b + i) * b..(idx * b + i + 1) * b];
                    let row = (br * b + i) * k + bc * b;
                    dense[row..row + b].copy_from_slice(src);
                }
            }
        }
        Ok(dense)
    }
}
