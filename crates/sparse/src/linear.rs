//! Dense x block-sparse matmul: `y[M, N] = x[M, K] · Wᵀ (+ bias)` with `W[N, K]` in BSR.
//!
//! One cube owns an output tile of `tile_m` rows of `x` by one block-row of `W` (`b` output
//! features) and walks that block-row's stored blocks only: for each block it stages the matching
//! `tile_m x b` columns of `x` and the `b x b` weight block through shared memory and accumulates
//! in f32. Absent blocks cost nothing; an empty block-row writes the bias (or zeros).
//!
//! Staging is software-pipelined. Where the runtime has async copies (CUDA sm_80+) the tensor-core
//! kernel fills `stages` shared buffers with `cp.async` copies (default 3; one mbarrier each), so
//! the next stages are in flight while the warps multiply the current one; elsewhere, while the
//! cube multiplies the blocks in one shared buffer, each unit already holds the next stage's
//! global loads in registers and writes them into the other buffer afterwards: one barrier per
//! stage (a single-buffer variant, two barriers per stage, exists for small shared memories).
//! Either way the block columns of a stage are read one stage before its data. A
//! stage is `k_groups` x `group_blocks` blocks: with few rows of `x` (decode, M = 1..16) the warps
//! of a cube work on different blocks of the row at once and their partial tiles are summed at the
//! end, which keeps enough loads in flight to stream the weights. Launch-shape defaults come from
//! a sweep on the H100 (see `crates/sparse/BENCHMARKS.md`).
//!
//! Two inner products, picked at compile time:
//! - tensor cores (CubeCL `cmma`, 16x16x16 fragments, f32 accumulators) for f16/bf16 where the
//!   runtime reports that shape (CUDA);
//! - a vectorised f32 dot product per unit everywhere else (f32, and wgpu/lavapipe, which has
//!   neither tensor cores nor plane ops).
//!
//! Load balance across uneven block-rows comes from the work list built with the matrix (see
//! [`crate::bsr`]): long rows are cut along K into items with their own f32 partial sums, added
//! (with the bias) by a second kernel launched only for matrices that have such rows.

use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;
use ops::launch::check_same_dtype;
use ops::reduce::vector_sum;
use ops::{caps, DType, DeviceTensor, OpsError, Result};

use crate::Bsr;

/// Block sizes the kernel is compiled for (the model prunes to 32x32 blocks where the shapes
/// allow, else 16x16).
pub const SUPPORTED_BLOCKS: [usize; 3] = [16, 32, 64];

/// Padding (elements) of each staged row in shared memory: keeps tensor-core fragment rows off
/// the same banks, and is a multiple of every vector width.
const PAD: usize = 8;
/// Padding (f32) of each row of the staged output tile.
const OUT_PAD: usize = 4;
/// Tensor-core fragment edge.
pub(crate) const FRAG: usize = 16;
/// Bytes of one pipeline stage we aim for when picking `k_groups` for short tiles.
const STAGE_BYTES: usize = 32 * 1024;
/// `cp.async` pipeline depth of the tensor-core path where the runtime has async copies.
const DEFAULT_STAGES: usize = 3;

/// The compile-time shape of one launch (the kernel's cache key); runtime sizes are arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Blueprint {
    /// Block size `b`.
    pub block: usize,
    /// Rows of `x` per cube.
    pub tile_m: usize,
    /// Groups of warps that multiply different blocks of a stage (their tiles are summed at
    /// the end).
    pub k_groups: usize,
    /// Blocks each group multiplies per stage (a stage is `k_groups * group_blocks` blocks).
    pub group_blocks: usize,
    /// Units per cube.
    pub units: usize,
    /// Vector width of the global and shared loads.
    pub vector: usize,
    /// Tensor cores (else the vectorised dot product).
    pub use_cmma: bool,
    /// Plane (warp) size assumed by the tensor-core path.
    pub plane: usize,
    /// Two shared buffers (load the next stage while multiplying this one) or one (for devices
    /// with little shared memory: the next stage waits in registers). Register staging only.
    pub double_buffer: bool,
    /// Tensor-core path: `0` stages through registers (above); `2..=4` is a `cp.async`
    /// pipeline of that many shared buffers with one mbarrier each (CUDA sm_80+), so the
    /// copies of `stages - 1` stages are in flight while one is multiplied.
    pub stages: usize,
    pub has_bias: bool,
}

impl Blueprint {
    pub(crate) fn bv(&self) -> usize {
        self.block / self.vector
    }
    pub(crate) fn x_stride(&self) -> usize {
        self.block + PAD
    }
    pub(crate) fn xsv(&self) -> usize {
        self.x_stride() / self.vector
    }
    pub(crate) fn w_stride(&self) -> usize {
        self.block + PAD
    }
    pub(crate) fn wsv(&self) -> usize {
        self.w_stride() / self.vector
    }
    /// Blocks per pipeline stage.
    pub(crate) fn stage_blocks(&self) -> usize {
        self.k_groups * self.group_blocks
    }
    /// Shared vectors of one stage of `x` / of `W`.
    pub(crate) fn x_stage(&self) -> usize {
        self.stage_blocks() * self.tile_m * self.xsv()
    }
    pub(crate) fn w_stage(&self) -> usize {
        self.stage_blocks() * self.block * self.wsv()
    }
    /// Global vectors loaded per stage.
    pub(crate) fn x_loads(&self) -> usize {
        self.stage_blocks() * self.tile_m * self.bv()
    }
    pub(crate) fn total_loads(&self) -> usize {
        self.x_loads() + self.stage_blocks() * self.block * self.bv()
    }
    pub(crate) fn loads_per_unit(&self) -> usize {
        self.total_loads().div_ceil(self.units)
    }
    pub(crate) fn out_stride(&self) -> usize {
        self.block + OUT_PAD
    }
    pub(crate) fn out_len(&self) -> usize {
        self.k_groups * self.tile_m * self.out_stride()
    }
    pub(crate) fn outputs_per_unit(&self) -> usize {
        self.tile_m * self.block / self.units
    }
    // Tensor-core path.
    pub(crate) fn warps(&self) -> usize {
        self.units / self.plane
    }
    pub(crate) fn warps_per_group(&self) -> usize {
        self.warps() / self.k_groups
    }
    pub(crate) fn frag_rows(&self) -> usize {
        self.tile_m / self.warps_per_group() / FRAG
    }
    pub(crate) fn frag_cols(&self) -> usize {
        self.block / FRAG
    }
    // Scalar path: unit u owns column u % b and rows u / b + i * rows_per_pass.
    pub(crate) fn rows_per_pass(&self) -> usize {
        self.units / self.block
    }

    pub(crate) fn buffers(&self) -> usize {
        if self.stages >= 2 {
            self.stages
        } else if self.double_buffer {
            2
        } else {
            1
        }
    }

    /// Shared memory the kernel declares, in bytes (the portable kernel writes its outputs
    /// straight from registers; the tensor-core one stages them).
    pub fn shared_bytes(&self, dtype: DType) -> usize {
        let stages =
            self.buffers() * (self.x_stage() + self.w_stage()) * self.vector * dtype.size();
        if self.use_cmma {
            stages + self.out_len() * 4
        } else {
            stages
        }
    }
}

/// Optional overrides of the launch shape (for tuning sweeps; `None` picks the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    pub tile_m: Option<usize>,
    pub k_groups: Option<usize>,
    pub group_blocks: Option<usize>,
    pub double_buffer: Option<bool>,
    /// `cp.async` pipeline depth of the tensor-core path (`0` = register staging).
    pub stages: Option<usize>,
}

/// Whether the tensor-core path applies: f16/bf16 with 16x16x16 fragments accumulating in f32,
/// on a runtime whose planes are 32 wide.
pub fn uses_tensor_cores<R: Runtime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    let kind = match dtype {
        DType::F16 => FloatKind::F16,
        DType::BF16 => FloatKind::BF16,
        _ => return false,
    };
    let cfg = MmaConfig {
        a_type: ElemType::Float(kind),
        b_type: ElemType::Float(kind),
        cd_type: ElemType::Float(FloatKind::F32),
        m: FRAG as u32,
        k: FRAG as u32,
        n: FRAG as u32,
    };
    let props = client.properties();
    client.features().matmul.cmma.contains(&cfg)
        && props.hardware.plane_size_min == 32
        && props.hardware.plane_size_max == 32
}

/// Picks the launch shape for `m` rows of `x` (see the module docs for the reasoning).
pub fn blueprint<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: DType,
    block: usize,
    m: usize,
    n_items: usize,
    has_bias: bool,
    tuning: Tuning,
) -> Blueprint {
    let use_cmma = uses_tensor_cores(client, dtype);
    let vector = caps::vector_size_for(client, dtype, block).min(PAD);
    let sms = caps::num_sms(client) as usize;
    // 64 rows: measured on the H100 (f16, b = 32), 128-row tiles were 10-20 % slower at every M
    // (fewer cubes fit an SM, and the kernel is bound by latency, not by operand traffic).
    let cap = 64;
    // The smallest tile that covers M, then smaller while the grid would leave SMs idle.
    let mut tile_m = 16;
    while tile_m < cap && tile_m < m {
        tile_m *= 2;
    }
    while tile_m > 16 && m.div_ceil(tile_m) * n_items < 2 * sms {
        tile_m /= 2;
    }
    if let Some(t) = tuning.tile_m {
        tile_m = t;
    }
    if use_cmma {
        // Warps split the tile's rows (one 16-row fragment strip each, two for 128 rows); the
        // remaining warps of an 8-warp cube take other blocks of the row when the tile is short.
        let warps_per_group = (tile_m / FRAG).min(4);
        let group_bytes = (tile_m + block) * (block + PAD) * dtype.size();
        let mut k_groups = 1;
        while k_groups * 2 * warps_per_group <= 8 && (k_groups * 2) * group_bytes <= STAGE_BYTES {
            k_groups *= 2;
        }
        if tile_m >= 64 {
            // Two groups while the grid is short of ~32 cubes per SM (H100: 1024x1024 at M=4096
            // and 4096x4096 at M=256 ran 10-30 % faster); one on big grids (4096x4096 at M=4096
            // ran 8 % slower with two).
            let cubes = m.div_ceil(tile_m) * n_items;
            k_groups = if cubes < 32 * sms { 2 } else { 1 };
        }
        if let Some(g) = tuning.k_groups {
            k_groups = g;
        }
        let group_blocks = tuning.group_blocks.unwrap_or(1);
        // cp.async moves 4, 8 or 16 bytes; every supported block is at least 8 f16 wide.
        let pipelined = client.features().copy_async && vector * dtype.size() >= 4;
        let stages = tuning
            .stages
            .unwrap_or(if pipelined { DEFAULT_STAGES } else { 0 });
        Blueprint {
            block,
            tile_m,
            k_groups,
            group_blocks,
            units: 32 * warps_per_group * k_groups,
            vector,
            use_cmma,
            plane: 32,
            double_buffer: tuning.double_buffer.unwrap_or(true),
            stages,
            has_bias,
        }
    } else {
        let mut bp = Blueprint {
            block,
            tile_m,
            k_groups: 1,
            group_blocks: 1,
            units: 128,
            vector,
            use_cmma,
            plane: 32,
            double_buffer: tuning.double_buffer.unwrap_or(true),
            // A pipeline asked for here is refused by the validation (no tensor-core path).
            stages: tuning.stages.unwrap_or(0),
            has_bias,
        };
        // Devices with little shared memory (wgpu commonly guarantees 16-32 KiB): give up the
        // second buffer first, then rows of the tile.
        let max = client.properties().hardware.max_shared_memory_size;
        if bp.shared_bytes(dtype) > max {
            bp.double_buffer = false;
        }
        while tuning.tile_m.is_none() && bp.tile_m > 16 && bp.shared_bytes(dtype) > max {
            bp.tile_m /= 2;
        }
        bp
    }
}

/// Reads the block columns of the stage starting at block `first` that this unit's `x` loads
/// will need (0 where it loads weights or past `end`). Issued one stage ahead of the loads that
/// use them, so that the column index and the data it points to are not two back-to-back
/// memory latencies.
#[cube]
pub(crate) fn load_cols(
    col: &[i32],
    cols: &mut Array<u32>,
    first: usize,
    end: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    let x_tile = comptime![bp.tile_m * bp.bv()];
    let x_loads = comptime![bp.x_loads()];
    #[unroll]
    for i in 0..bp.loads_per_unit() {
        let idx = i * comptime![bp.units] + unit;
        let mut c = 0u32;
        if idx < x_loads {
            let blk = first + idx / x_tile;
            if blk < end {
                c = col[blk] as u32;
            }
        }
        cols[i] = c;
    }
}

/// Where a stage's load slot `idx` (`i * units + unit`) comes from and goes to: whether it is in
/// range (rows past `m` and blocks past `end` read as zero), its global vector index (into `x`
/// for the first `x_loads` slots, with block column `col`; into the weight values after), and
/// its vector index in the padded shared buffer `buf`. Slots past the stage's loads have
/// `ok = false`. The register and the `cp.async` staging both go through here.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_slot(
    idx: usize,
    col: u32,
    buf: usize,
    first: usize,
    end: usize,
    m0: usize,
    m: usize,
    k_vectors: usize,
    #[comptime] bp: Blueprint,
) -> (bool, bool, usize, usize) {
    let bv = comptime![bp.bv()];
    let x_tile = comptime![bp.tile_m * bp.bv()];
    let x_loads = comptime![bp.x_loads()];
    let w_block = comptime![bp.block * bp.bv()];
    let total = comptime![bp.total_loads()];
    let mut is_x = false;
    let mut ok = false;
    let mut src = 0usize;
    let mut dst = 0usize;
    if idx < x_loads {
        let rem = idx % x_tile;
        let r = rem / bv;
        is_x = true;
        ok = first + idx / x_tile < end && m0 + r < m;
        src = (m0 + r) * k_vectors + col as usize * bv + rem % bv;
        // (block, row) pairs are consecutive rows of the staged tile.
        dst = buf * comptime![bp.x_stage()] + (idx / bv) * comptime![bp.xsv()] + idx % bv;
    } else if idx < total {
        let j = idx - x_loads;
        ok = first + j / w_block < end;
        src = first * w_block + j;
        dst = buf * comptime![bp.w_stage()] + (j / bv) * comptime![bp.wsv()] + j % bv;
    }
    (is_x, ok, src, dst)
}

/// Loads the global vectors of the stage's blocks `[first, first + stage_blocks)` (clipped to
/// `end`) that this unit is responsible for into registers, with the block columns `cols` read
/// by [`load_cols`]; out-of-range rows and blocks read as zero.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_stage<F: Float, N: Size>(
    x: &[Vector<F, N>],
    values: &[Vector<F, N>],
    cols: &Array<u32>,
    regs: &mut Array<Vector<F, N>>,
    first: usize,
    end: usize,
    m0: usize,
    m: usize,
    k_vectors: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    #[unroll]
    for i in 0..bp.loads_per_unit() {
        let idx = i * comptime![bp.units] + unit;
        let (is_x, ok, src, _dst) = stage_slot(idx, cols[i], 0, first, end, m0, m, k_vectors, bp);
        let mut v = Vector::<F, N>::from_int(0);
        if ok {
            if is_x {
                v = x[src];
            } else {
                v = values[src];
            }
        }
        regs[i] = v;
    }
}

/// Writes the registers of [`load_stage`] into shared buffer `buf` (padded rows).
#[cube]
pub(crate) fn store_stage<F: Float, N: Size>(
    regs: &Array<Vector<F, N>>,
    x_sh: &mut [Vector<F, N>],
    w_sh: &mut [Vector<F, N>],
    buf: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    let total = comptime![bp.total_loads()];
    #[unroll]
    for i in 0..bp.loads_per_unit() {
        let idx = i * comptime![bp.units] + unit;
        // Only the destination is used: the source arguments are placeholders.
        let (is_x, _ok, _src, dst) = stage_slot(idx, 0, buf, 0, 0, 0, 0, 0, bp);
        if is_x {
            x_sh[dst] = regs[i];
        } else if idx < total {
            w_sh[dst] = regs[i];
        }
    }
}

/// Sums the staged output tile over the k-groups and writes it: to `y` with the bias, or to the
/// item's f32 partial-sum slot when its block-row was cut.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_tile<F: Float>(
    out_sh: &[f32],
    bias: &[F],
    y: &mut [F],
    partial: &mut [f32],
    brow: usize,
    slot: i32,
    m0: usize,
    m: usize,
    n: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    let block = comptime![bp.block];
    let os = comptime![bp.out_stride()];
    #[unroll]
    for i in 0..comptime![bp.tile_m * bp.block / bp.units] {
        let e = i * comptime![bp.units] + unit;
        let r = e / block;
        let c = e % block;
        if m0 + r < m {
            let mut v = 0f32;
            #[unroll]
            for g in 0..bp.k_groups {
                v += out_sh[(g * comptime![bp.tile_m] + r) * os + c];
            }
            if slot < 0 {
                if comptime![bp.has_bias] {
                    v += f32::cast_from(bias[brow * block + c]);
                }
                y[(m0 + r) * n + brow * block + c] = F::cast_from(v);
            } else {
                partial[((slot as usize) * m + m0 + r) * block + c] = v;
            }
        }
    }
}

/// Multiplies one staged block (buffer `buf`) into the unit's accumulators: unit `u` owns output
/// column `u % b` of rows `u / b + i * rows_per_pass`, and reads whole vectors of the block row.
#[cube]
fn dot_stage<F: Float, N: Size>(
    x_sh: &[Vector<F, N>],
    w_sh: &[Vector<F, N>],
    acc: &mut Array<f32>,
    buf: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    let c = unit % comptime![bp.block];
    let r0 = unit / comptime![bp.block];
    let xsv = comptime![bp.xsv()];
    let x_base = buf * comptime![bp.x_stage()];
    let w_row = buf * comptime![bp.w_stage()] + c * comptime![bp.wsv()];
    #[unroll]
    for jv in 0..bp.bv() {
        let wv = Vector::<f32, N>::cast_from(w_sh[w_row + jv]);
        #[unroll]
        for i in 0..bp.outputs_per_unit() {
            let r = r0 + i * comptime![bp.rows_per_pass()];
            let xv = Vector::<f32, N>::cast_from(x_sh[x_base + r * xsv + jv]);
            acc[i] += vector_sum(xv * wv);
        }
    }
}

/// The vectorised-dot-product kernel (f32, and every dtype where tensor cores are absent).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn bsr_linear_scalar_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    values: &[Vector<F, N>],
    col: &[i32],
    items: &[i32],
    bias: &[F],
    y: &mut [F],
    partial: &mut [f32],
    m: usize,
    k_vectors: usize,
    n_out: usize,
    #[comptime] bp: Blueprint,
    #[define(F)] _dtype: ElemType,
) {
    let item = CUBE_POS_X as usize;
    let m0 = CUBE_POS_Y as usize * comptime![bp.tile_m];
    let brow = items[item * 4] as usize;
    let start = items[item * 4 + 1] as usize;
    let end = items[item * 4 + 2] as usize;
    let slot = items[item * 4 + 3];

    let mut x_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
        comptime![bp.buffers() * bp.x_stage()],
        128usize,
    );
    let mut w_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
        comptime![bp.buffers() * bp.w_stage()],
        128usize,
    );
    let mut regs = Array::<Vector<F, N>>::new(comptime![bp.loads_per_unit()]);
    let mut cols = Array::<u32>::new(comptime![bp.loads_per_unit()]);
    let mut acc = Array::<f32>::new(comptime![bp.outputs_per_unit()]);
    #[unroll]
    for i in 0..bp.outputs_per_unit() {
        acc[i] = 0f32;
    }

    let stages = end - start;
    if stages > 0 {
        load_cols(col, &mut cols, start, end, bp);
        load_stage(
            x, values, &cols, &mut regs, start, end, m0, m, k_vectors, bp,
        );
        if comptime![bp.double_buffer] {
            store_stage(&regs, &mut x_sh, &mut w_sh, 0, bp);
            sync_cube();
            for s in 0..stages {
                let next = start + s + 1;
                if s + 1 < stages {
                    load_cols(col, &mut cols, next, end, bp);
                    load_stage(x, values, &cols, &mut regs, next, end, m0, m, k_vectors, bp);
                }
                dot_stage(&x_sh, &w_sh, &mut acc, s % 2, bp);
                if s + 1 < stages {
                    store_stage(&regs, &mut x_sh, &mut w_sh, (s + 1) % 2, bp);
                }
                sync_cube();
            }
        } else {
            for s in 0..stages {
                if s > 0 {
                    sync_cube();
                }
                store_stage(&regs, &mut x_sh, &mut w_sh, 0, bp);
                sync_cube();
                let next = start + s + 1;
                if s + 1 < stages {
                    load_cols(col, &mut cols, next, end, bp);
                    load_stage(x, values, &cols, &mut regs, next, end, m0, m, k_vectors, bp);
                }
                dot_stage(&x_sh, &w_sh, &mut acc, 0, bp);
            }
        }
    }

    let unit = UNIT_POS as usize;
    let block = comptime![bp.block];
    let c = unit % block;
    let r0 = unit / block;
    #[unroll]
    for i in 0..bp.outputs_per_unit() {
        let r = r0 + i * comptime![bp.rows_per_pass()];
        if m0 + r < m {
            let mut v = acc[i];
            if slot < 0 {
                if comptime![bp.has_bias] {
                    v += f32::cast_from(bias[brow * block + c]);
                }
                y[(m0 + r) * n_out + brow * block + c] = F::cast_from(v);
            } else {
                partial[((slot as usize) * m + m0 + r) * block + c] = v;
            }
        }
    }
}

/// Adds the partial sums of the cut block-rows (and the bias) into `y`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn bsr_split_reduce_kernel<F: Float>(
    partial: &[f32],
    splits: &[i32],
    bias: &[F],
    y: &mut [F],
    m: usize,
    n: usize,
    #[comptime] block: usize,
    #[comptime] has_bias: bool,
    #[define(F)] _dtype: ElemType,
) {
    let s = CUBE_POS_X as usize;
    let brow = splits[s * 3] as usize;
    let first = splits[s * 3 + 1] as usize;
    let count = splits[s * 3 + 2] as usize;
    let e = CUBE_POS_Y as usize * CUBE_DIM as usize + UNIT_POS as usize;
    if e < m * block {
        let r = e / block;
        let c = e % block;
        let mut v = 0f32;
        for q in 0..count {
            v += partial[((first + q) * m + r) * block + c];
        }
        if comptime![has_bias] {
            v += f32::cast_from(bias[brow * block + c]);
        }
        y[r * n + brow * block + c] = F::cast_from(v);
    }
}

/// `y = x · Wᵀ (+ bias)` for `x[.., K]` and `W[N, K]` in BSR; returns `y[.., N]`.
pub fn bsr_linear<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &Bsr<R>,
    bias: Option<&DeviceTensor<R>>,
) -> Result<DeviceTensor<R>> {
    let mut shape = x.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = w.shape()[0];
    }
    let out = DeviceTensor::empty(client, &shape, x.dtype());
    bsr_linear_into(client, x, w, bias, &out)?;
    Ok(out)
}

/// [`bsr_linear`] into a preallocated `out[.., N]`. Allocates nothing, except an f32 buffer of
/// partial sums for matrices whose work list cut some block-rows (see [`crate::bsr`]).
pub fn bsr_linear_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &Bsr<R>,
    bias: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    bsr_linear_into_tuned(client, x, w, bias, out, Tuning::default())
}

/// [`bsr_linear_into`] with explicit launch-shape overrides (tuning sweeps).
pub fn bsr_linear_into_tuned<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &Bsr<R>,
    bias: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    tuning: Tuning,
) -> Result<()> {
    const OP: &str = "bsr_linear";
    let dtype = x.dtype();
    caps::check_float_dtype(client, OP, dtype)?;
    if w.dtype() != dtype {
        return Err(OpsError::UnsupportedDType {
            op: OP,
            dtype: w.dtype(),
            runtime: caps::runtime_name(client),
            detail: format!("the weight is {} but the input is {dtype}", w.dtype()),
        });
    }
    check_same_dtype(OP, x, out)?;
    let [n, k] = w.shape();
    let b = w.block_size();
    if !SUPPORTED_BLOCKS.contains(&b) {
        return Err(OpsError::invalid(
            OP,
            format!("block size {b} is not supported (use one of {SUPPORTED_BLOCKS:?})"),
        ));
    }
    if x.rank() == 0 || x.last_dim() != k || x.numel() == 0 {
        return Err(OpsError::shape(
            OP,
            format!("input {:?} for a weight [{n}, {k}]", x.shape()),
        ));
    }
    if !x.is_contiguous() || !out.is_contiguous() {
        return Err(OpsError::shape(OP, "input and output must be contiguous"));
    }
    let m = x.rows();
    let mut want = x.shape().to_vec();
    *want.last_mut().unwrap() = n;
    if out.shape() != want.as_slice() {
        return Err(OpsError::shape(
            OP,
            format!("output {:?}, expected {want:?}", out.shape()),
        ));
    }
    if let Some(bias) = bias {
        check_same_dtype(OP, x, bias)?;
        if bias.shape() != [n] || !bias.is_contiguous() {
            return Err(OpsError::shape(
                OP,
                format!("bias {:?}, expected [{n}]", bias.shape()),
            ));
        }
    }

    let plan = &w.plan;
    let bp = blueprint(client, dtype, b, m, plan.n_items, bias.is_some(), tuning);
    validate_blueprint(client, &bp, dtype)?;
    let m_tiles = m.div_ceil(bp.tile_m);
    let (max_x, max_y, _) = client.properties().hardware.max_cube_count;
    let reduce_y = (m * b).div_ceil(256);
    if plan.n_items > max_x as usize
        || m_tiles > max_y as usize
        || plan.n_splits > max_x as usize
        || reduce_y > max_y as usize
    {
        return Err(OpsError::invalid(
            OP,
            format!(
                "{m} rows x {} work items exceed the launch grid",
                plan.n_items
            ),
        ));
    }
    let partial = if plan.n_slots > 0 {
        DeviceTensor::empty(client, &[plan.n_slots, m, b], DType::F32)
    } else {
        plan.dummy_f32.clone()
    };
    let bias_t = bias.unwrap_or(&plan.dummy_bias);
    let count = CubeCount::Static(plan.n_items as u32, m_tiles as u32, 1);
    unsafe {
        if bp.use_cmma {
            crate::cmma::launch::<R>(
                client,
                count,
                &bp,
                x,
                w,
                bias_t,
                out,
                &partial,
                m,
                k / bp.vector,
                n,
            );
        } else {
            bsr_linear_scalar_kernel::launch_unchecked::<R>(
                client,
                count,
                CubeDim::new_1d(bp.units as u32),
                bp.vector,
                x.as_buffer_arg(),
                w.values().as_buffer_arg(),
                w.col_indices().as_buffer_arg(),
                plan.items.as_buffer_arg(),
                bias_t.as_buffer_arg(),
                out.as_buffer_arg(),
                partial.as_buffer_arg(),
                m,
                k / bp.vector,
                n,
                bp,
                dtype.elem_type(),
            );
        }
        if plan.n_splits > 0 {
            bsr_split_reduce_kernel::launch_unchecked::<R>(
                client,
                CubeCount::Static(plan.n_splits as u32, reduce_y as u32, 1),
                CubeDim::new_1d(256),
                partial.as_buffer_arg(),
                plan.splits.as_buffer_arg(),
                bias_t.as_buffer_arg(),
                out.as_buffer_arg(),
                m,
                n,
                b,
                bias.is_some(),
                dtype.elem_type(),
            );
        }
    }
    Ok(())
}

/// Refuses a launch shape the kernel cannot run (only reachable through [`Tuning`]).
fn validate_blueprint<R: Runtime>(
    client: &ComputeClient<R>,
    bp: &Blueprint,
    dtype: DType,
) -> Result<()> {
    const OP: &str = "bsr_linear";
    let ok_tile = [16, 32, 64, 128, 256].contains(&bp.tile_m);
    let ok_shape = if bp.use_cmma {
        bp.k_groups.is_power_of_two()
            && (1..=8).contains(&bp.group_blocks)
            && bp.units.is_multiple_of(bp.plane * bp.k_groups)
            && bp.warps_per_group() > 0
            && bp.tile_m.is_multiple_of(bp.warps_per_group() * FRAG)
    } else {
        bp.k_groups == 1
            && bp.group_blocks == 1
            && bp.units.is_multiple_of(bp.block)
            && (bp.tile_m * bp.block).is_multiple_of(bp.units)
    };
    let stages_ok = bp.stages == 0
        || (bp.use_cmma && (2..=4).contains(&bp.stages) && client.features().copy_async);
    let units_ok = bp.units <= client.properties().hardware.max_units_per_cube as usize
        && (bp.tile_m * bp.block).is_multiple_of(bp.units);
    if !ok_tile || !ok_shape || !units_ok || !stages_ok {
        return Err(OpsError::invalid(
            OP,
            format!("unusable launch shape {bp:?}"),
        ));
    }
    let shared = bp.shared_bytes(dtype);
    let max = client.properties().hardware.max_shared_memory_size;
    if shared > max {
        return Err(OpsError::invalid(
            OP,
            format!(
                "launch shape {bp:?} needs {shared} bytes of shared memory, the device has {max}"
            ),
        ));
    }
    Ok(())
}
