//! The launch shape of the BSR matmul ([`Blueprint`], the kernels' comptime key), how it is
//! picked per call ([`blueprint()`], overridable through [`Tuning`]) and what shapes the kernels
//! accept.

use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;
use ops::{caps, DType, OpsError, Result};

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

/// Refuses a launch shape the kernel cannot run (only reachable through [`Tuning`]).
pub(super) fn validate_blueprint<R: Runtime>(
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
