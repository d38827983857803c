//! W4A16: `y[m, n] = Σ_k x[m, k] · q[k, n] · scale(k, n) (+ bias[n])` with int4 weights packed
//! eight per i32 (see [`crate::host::Int4Weight`]: `qweight[K/8, N]`, one column's consecutive k
//! in one word, low nibble first) and float activations (f16 / bf16, f32 for tests).
//!
//! The weights are never dequantized in memory: each kernel loads whole words, sign-extends the
//! nibbles in registers ([`crate::codec::sext_nibble()`]) and accumulates in f32. Scales are applied
//! once per group (per-channel scales are the case of a single group of K), not once per weight.
//!
//! Two kernels:
//! - **GEMV** (M <= 16, decode): bandwidth-bound on the packed weight, a quarter of the bytes of
//!   an f16 one. Consecutive units along x take consecutive columns `n`, so a plane's loads of one
//!   qweight row `kw` are contiguous (coalesced); each unit handles `cols_per_unit` columns strided
//!   by the cube width (so the x values it loads serve several columns) and the units along y split
//!   K. Because a plane spans columns, not K, there is nothing to reduce inside a plane: the K
//!   slices are summed through shared memory, which every runtime has (no plane ops needed).
//! - **Tiled** (M > 16): a shared-memory tiled GEMM without tensor cores: each cube stages an x
//!   tile and a dequantized weight tile (one word per loading unit, unpacked to f32) and each unit
//!   accumulates a register micro-tile. Correct everywhere; not tuned for large M.

use cubecl::prelude::*;
use ops::gemm::cube_tile_origin;
use ops::launch::{check_same_dtype, cube_count_1d};
use ops::{caps, DType, DeviceTensor, OpsError, Result};

use crate::codec::sext_nibble;
use crate::host::check_int4_shape;
use crate::layout::{check_output, output_shape};

const OP: &str = "w4a16_linear";

/// Largest M the GEMV kernel handles (its rows are unrolled into per-row accumulators).
pub const GEMV_MAX_M: usize = 16;

/// Which kernel runs. [`w4a16_linear`] uses [`W4a16Kernel::Auto`]; the explicit choices exist so
/// that tests and benchmarks can exercise (and time) each path on any shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum W4a16Kernel {
    /// GEMV for M <= 16 (columns per unit picked from N), tiled otherwise.
    Auto,
    /// The GEMV kernel with `cols_per_unit` (1, 2 or 4) columns per unit; M must be <= 16.
    Gemv { cols_per_unit: u32 },
    /// The tiled kernel (any M).
    Tiled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct GemvPlan {
    m: u32,
    /// Units along x (consecutive columns).
    cx: u32,
    /// Units along y (K slices).
    ky: u32,
    /// Columns per unit, `cx` apart.
    cols: u32,
    /// Elements per vector load of x (1, 2, 4 or 8; divides the 8 k of a word).
    vector: u32,
    has_bias: bool,
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn w4a16_gemv_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    qweight: &[i32],
    scales: &[f32],
    bias: &[F],
    out: &mut [F],
    n_cols: usize,
    k: usize,
    words_per_group: usize,
    groups: usize,
    #[comptime] plan: GemvPlan,
    #[define(F)] _dtype: ElemType,
) {
    let m_rows = comptime![plan.m as usize];
    let cols = comptime![plan.cols as usize];
    let cx = comptime![plan.cx as usize];
    let ky = comptime![plan.ky as usize];
    let acc_len = comptime![(plan.m * plan.cols) as usize];
    let vec = comptime![plan.vector as usize];
    let x_vectors_per_word = comptime![8 / plan.vector as usize];
    let col0 = CUBE_POS * comptime![(plan.cx * plan.cols) as usize] + UNIT_POS_X as usize;

    let mut acc = Array::<f32>::new(acc_len);
    let mut part = Array::<f32>::new(acc_len);
    let mut q = Array::<f32>::new(comptime![8 * plan.cols as usize]);
    #[unroll]
    for i in 0..acc_len {
        acc[i] = 0f32;
    }

    for g in 0..groups {
        #[unroll]
        for i in 0..acc_len {
            part[i] = 0f32;
        }
        let first = g * words_per_group;
        for kw in range_stepped(first + UNIT_POS_Y as usize, first + words_per_group, ky) {
            #[unroll]
            for c in 0..cols {
                let col = col0 + c * cx;
                // Columns past N read column 0 (in bounds) and are never written.
                let word = qweight[kw * n_cols + select(col < n_cols, col, 0)];
                #[unroll]
                for j in 0..8 {
                    q[c * 8 + j] = f32::cast_from(sext_nibble(word, j as i32));
                }
            }
            #[unroll]
            for m in 0..m_rows {
                let xbase = (m * k + kw * 8) / vec;
                #[unroll]
                for v in 0..x_vectors_per_word {
                    let xv = x[xbase + v];
                    #[unroll]
                    for l in 0..vec {
                        let xf = f32::cast_from(xv.extract(l));
                        #[unroll]
                        for c in 0..cols {
                            part[m * cols + c] += q[c * 8 + v * vec + l] * xf;
                        }
                    }
                }
            }
        }
        #[unroll]
        for c in 0..cols {
            let col = col0 + c * cx;
            let s = scales[g * n_cols + select(col < n_cols, col, 0)];
            #[unroll]
            for m in 0..m_rows {
                acc[m * cols + c] += part[m * cols + c] * s;
            }
        }
    }

    // Sum the K slices: one row of x at a time through a [ky][cols][cx] shared array.
    let slice = comptime![(plan.cols * plan.cx) as usize];
    let mut shared =
        Shared::<[f32]>::new_slice(comptime![(plan.ky * plan.cols * plan.cx) as usize]);
    let unit = UNIT_POS as usize;
    #[unroll]
    for m in 0..m_rows {
        #[unroll]
        for c in 0..cols {
            shared[UNIT_POS_Y as usize * slice + c * cx + UNIT_POS_X as usize] = acc[m * cols + c];
        }
        sync_cube();
        for o in range_stepped(unit, slice, cx * ky) {
            let col = CUBE_POS * slice + o;
            let mut y = 0f32;
            #[unroll]
            for s in 0..ky {
                y += shared[s * slice + o];
            }
            if col < n_cols {
                if comptime![plan.has_bias] {
                    y += f32::cast_from(bias[col]);
                }
                out[m * n_cols + col] = F::cast_from(y);
            }
        }
        sync_cube();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TilePlan {
    bm: u32,
    bn: u32,
    /// K per stage, a multiple of 8 (whole words).
    bk: u32,
    tm: u32,
    tn: u32,
    has_bias: bool,
}

impl TilePlan {
    fn units(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn w4a16_tiled_kernel<F: Float>(
    x: &[F],
    qweight: &[i32],
    scales: &[f32],
    bias: &[F],
    out: &mut [F],
    m: usize,
    n: usize,
    k: usize,
    group: usize,
    #[comptime] plan: TilePlan,
    #[define(F)] _dtype: ElemType,
) {
    // Row-major tile order (groups of one tile-row).
    let (m0, n0) = cube_tile_origin(m, n, plan.bm, plan.bn, 1u32);
    let units = comptime![plan.units() as usize];
    let bm = comptime![plan.bm as usize];
    let bn = comptime![plan.bn as usize];
    let bk = comptime![plan.bk as usize];
    let tm = comptime![plan.tm as usize];
    let tn = comptime![plan.tn as usize];
    let tx = UNIT_POS as usize % (bn / tn);
    let ty = UNIT_POS as usize / (bn / tn);
    let k_words = k / 8;

    // xs[kk][row] and ws[kk][col], both f32 so that the inner loop reads them with unit stride.
    let mut xs = Shared::<[f32]>::new_slice(comptime![(plan.bk * plan.bm) as usize]);
    let mut ws = Shared::<[f32]>::new_slice(comptime![(plan.bk * plan.bn) as usize]);
    let mut acc = Array::<f32>::new(comptime![(plan.tm * plan.tn) as usize]);
    #[unroll]
    for i in 0..tm * tn {
        acc[i] = 0f32;
    }
    let mut a = Array::<f32>::new(tm);
    let mut b = Array::<f32>::new(tn);

    for k0 in range_stepped(0, k, bk) {
        // x tile, transposed, zero outside x.
        #[unroll]
        for i in 0..comptime![(plan.bm * plan.bk).div_ceil(plan.units()) as usize] {
            let idx = UNIT_POS as usize + i * units;
            if idx < bm * bk {
                let r = idx / bk;
                let c = idx % bk;
                let mut v = 0f32;
                if m0 + r < m && k0 + c < k {
                    v = f32::cast_from(x[(m0 + r) * k + k0 + c]);
                }
                xs[c * bm + r] = v;
            }
        }
        // Weight tile: one packed word (8 consecutive k of one column) per index, dequantized.
        #[unroll]
        for i in 0..comptime![((plan.bk / 8) * plan.bn).div_ceil(plan.units()) as usize] {
            let idx = UNIT_POS as usize + i * units;
            if idx < (bk / 8) * bn {
                let r = idx / bn;
                let c = idx % bn;
                let kw = k0 / 8 + r;
                let col = n0 + c;
                let mut word = 0i32;
                let mut s = 0f32;
                if kw < k_words && col < n {
                    word = qweight[kw * n + col];
                    s = scales[(kw * 8 / group) * n + col];
                }
                #[unroll]
                for j in 0..8 {
                    ws[(r * 8 + j) * bn + c] = f32::cast_from(sext_nibble(word, j as i32)) * s;
                }
            }
        }
        sync_cube();
        #[unroll]
        for kk in 0..bk {
            #[unroll]
            for i in 0..tm {
                a[i] = xs[kk * bm + ty * tm + i];
            }
            #[unroll]
            for j in 0..tn {
                b[j] = ws[kk * bn + tx * tn + j];
            }
            #[unroll]
            for i in 0..tm {
                #[unroll]
                for j in 0..tn {
                    acc[i * tn + j] += a[i] * b[j];
                }
            }
        }
        sync_cube();
    }

    #[unroll]
    for i in 0..tm {
        #[unroll]
        for j in 0..tn {
            let gm = m0 + ty * tm + i;
            let gn = n0 + tx * tn + j;
            if gm < m && gn < n {
                let mut y = acc[i * tn + j];
                if comptime![plan.has_bias] {
                    y += f32::cast_from(bias[gn]);
                }
                out[gm * n + gn] = F::cast_from(y);
            }
        }
    }
}

/// `y[.., N] = x[.., K] · dequant(qweight)ᵀ (+ bias)`: see the module docs. `x` is a contiguous
/// float tensor (f32, f16, bf16 where the runtime has it); `qweight` is i32 `[K/8, N]`; `scales`
/// f32 `[N]` (`group_size = None`) or `[K/g, N]`; `bias` `[N]` of x's dtype. Returns y in x's
/// dtype.
pub fn w4a16_linear<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight: &DeviceTensor<R>,
    scales: &DeviceTensor<R>,
    group_size: Option<usize>,
    bias: Option<&DeviceTensor<R>>,
) -> Result<DeviceTensor<R>> {
    let (_, n) = check_operands(client, x, qweight, scales, group_size, bias)?;
    let out = DeviceTensor::empty(client, &output_shape(x, n), x.dtype());
    w4a16_linear_into_with(
        client,
        x,
        qweight,
        scales,
        group_size,
        bias,
        &out,
        W4a16Kernel::Auto,
    )?;
    Ok(out)
}

/// [`w4a16_linear`] into a preallocated contiguous `out[.., N]` of x's dtype; allocates nothing.
pub fn w4a16_linear_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight: &DeviceTensor<R>,
    scales: &DeviceTensor<R>,
    group_size: Option<usize>,
    bias: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    w4a16_linear_into_with(
        client,
        x,
        qweight,
        scales,
        group_size,
        bias,
        out,
        W4a16Kernel::Auto,
    )
}

/// [`w4a16_linear_into`] with an explicit kernel choice (tests, benchmarks).
#[allow(clippy::too_many_arguments)]
pub fn w4a16_linear_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight: &DeviceTensor<R>,
    scales: &DeviceTensor<R>,
    group_size: Option<usize>,
    bias: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    kernel: W4a16Kernel,
) -> Result<()> {
    let (k, n) = check_operands(client, x, qweight, scales, group_size, bias)?;
    check_same_dtype(OP, x, out)?;
    // The bias was checked with the operands.
    check_output(client, OP, out, &output_shape(x, n), None)?;
    let m = x.rows();
    let kernel = match kernel {
        W4a16Kernel::Auto if m <= GEMV_MAX_M => W4a16Kernel::Gemv {
            cols_per_unit: auto_cols_per_unit(client, n),
        },
        W4a16Kernel::Auto => W4a16Kernel::Tiled,
        other => other,
    };
    // An absent bias is bound to x (same dtype), never read: the comptime flag skips it.
    let bias_arg = bias.unwrap_or(x);
    let group = group_size.unwrap_or(k);
    let dtype = x.dtype().elem_type();
    match kernel {
        W4a16Kernel::Gemv { cols_per_unit } => {
            if m > GEMV_MAX_M {
                return Err(OpsError::invalid(
                    OP,
                    format!("the GEMV kernel takes at most {GEMV_MAX_M} rows, x has {m}"),
                ));
            }
            if ![1, 2, 4].contains(&cols_per_unit) {
                return Err(OpsError::invalid(
                    OP,
                    format!("cols_per_unit must be 1, 2 or 4, got {cols_per_unit}"),
                ));
            }
            let vector = [8usize, 4, 2]
                .into_iter()
                .find(|&v| caps::vector_size_for(client, x.dtype(), v) == v)
                .unwrap_or(1);
            let (cx, ky) = (32u32, 8u32);
            let plan = GemvPlan {
                m: m as u32,
                cx,
                ky,
                cols: cols_per_unit,
                vector: vector as u32,
                has_bias: bias.is_some(),
            };
            let cubes = n.div_ceil((cx * cols_per_unit) as usize) as u32;
            unsafe {
                w4a16_gemv_kernel::launch_unchecked::<R>(
                    client,
                    cube_count_1d(client, cubes),
                    CubeDim::new_2d(cx, ky),
                    vector,
                    x.as_buffer_arg(),
                    qweight.as_buffer_arg(),
                    scales.as_buffer_arg(),
                    bias_arg.as_buffer_arg(),
                    out.as_buffer_arg(),
                    n,
                    k,
                    group / 8,
                    k / group,
                    plan,
                    dtype,
                );
            }
        }
        _ => launch_tiled(client, x, qweight, scales, group, bias, out, [m, n, k]),
    }
    Ok(())
}

/// The tiled kernel on validated operands.
#[allow(clippy::too_many_arguments)]
fn launch_tiled<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight: &DeviceTensor<R>,
    scales: &DeviceTensor<R>,
    group: usize,
    bias: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    [m, n, k]: [usize; 3],
) {
    let plan = TilePlan {
        bm: 64,
        bn: 64,
        bk: 16,
        tm: 4,
        tn: 4,
        has_bias: bias.is_some(),
    };
    let tiles = m.div_ceil(plan.bm as usize) * n.div_ceil(plan.bn as usize);
    // An absent bias is bound to x (same dtype), never read: the comptime flag skips it.
    let bias = bias.unwrap_or(x);
    unsafe {
        w4a16_tiled_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, tiles as u32),
            CubeDim::new_1d(plan.units()),
            x.as_buffer_arg(),
            qweight.as_buffer_arg(),
            scales.as_buffer_arg(),
            bias.as_buffer_arg(),
            out.as_buffer_arg(),
            m,
            n,
            k,
            group,
            plan,
            x.dtype().elem_type(),
        );
    }
}

/// Columns per GEMV unit: more columns reuse each loaded x value more, but fewer cubes then cover
/// N; keep at least one cube per SM.
fn auto_cols_per_unit<R: Runtime>(client: &ComputeClient<R>, n: usize) -> u32 {
    let sms = caps::num_sms(client) as usize;
    [4u32, 2]
        .into_iter()
        .find(|&c| n >= 32 * c as usize * sms)
        .unwrap_or(1)
}

/// Validates x, qweight, scales and bias; returns (K, N).
fn check_operands<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight: &DeviceTensor<R>,
    scales: &DeviceTensor<R>,
    group_size: Option<usize>,
    bias: Option<&DeviceTensor<R>>,
) -> Result<(usize, usize)> {
    caps::check_float_dtype(client, OP, x.dtype())?;
    if x.rank() == 0 || x.numel() == 0 {
        return Err(OpsError::shape(
            OP,
            format!("x must be non-empty with rank >= 1, got {:?}", x.shape()),
        ));
    }
    if !x.is_contiguous() {
        return Err(OpsError::shape(OP, "x must be contiguous"));
    }
    if qweight.dtype() != DType::I32 {
        return Err(OpsError::UnsupportedDType {
            op: OP,
            dtype: qweight.dtype(),
            runtime: "any",
            detail: "qweight must be i32 (8 int4 values per word)".into(),
        });
    }
    if qweight.rank() != 2 || !qweight.is_contiguous() {
        return Err(OpsError::shape(
            OP,
            format!(
                "qweight must be a contiguous [K/8, N] matrix, got {:?}",
                qweight.shape()
            ),
        ));
    }
    let k = x.last_dim();
    let n = qweight.shape()[1];
    check_int4_shape(OP, k, n, group_size)?;
    if qweight.shape()[0] * 8 != k {
        return Err(OpsError::shape(
            OP,
            format!(
                "qweight {:?} does not match K={k} of x (expected [{}, N])",
                qweight.shape(),
                k / 8
            ),
        ));
    }
    if scales.dtype() != DType::F32 {
        return Err(OpsError::UnsupportedDType {
            op: OP,
            dtype: scales.dtype(),
            runtime: "any",
            detail: "scales must be f32".into(),
        });
    }
    let want: Vec<usize> = match group_size {
        None => vec![n],
        Some(g) => vec![k / g, n],
    };
    if scales.shape() != want.as_slice() || !scales.is_contiguous() {
        return Err(OpsError::shape(
            OP,
            format!(
                "scales {:?}, expected a contiguous {want:?} ({})",
                scales.shape(),
                match group_size {
                    None => "per output channel".to_string(),
                    Some(g) => format!("per group of {g} along K"),
                }
            ),
        ));
    }
    if let Some(b) = bias {
        check_same_dtype(OP, x, b)?;
        if b.shape() != [n] || !b.is_contiguous() {
            return Err(OpsError::shape(
                OP,
                format!("bias {:?}, expected a contiguous [{n}]", b.shape()),
            ));
        }
    }
    Ok((k, n))
}
