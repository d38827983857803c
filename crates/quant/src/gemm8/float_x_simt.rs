//! The 8-bit decode GEMV on the float activation in f32 on the SIMT cores (every runtime, M <= 16):
//! int8 or e4m3 weights times x, with no activation codes and no f16 staging of x.
//!
//! Why a second float-activation kernel: [`super::float_x`] multiplies on f16 tensor cores, so x
//! must fit f16; each of its cubes first reduces the row's largest magnitude, stages a scaled
//! copy of x and waits at a barrier before its first MMA, at 99 registers a unit (two 256-unit
//! cubes per SM of an H100). On the 1.5B model its gate-up streamed 27.5 MB at 1.8 TB/s, where the
//! bf16 GEMV ([`ops::matmul`]: x read straight from L1, the norm's sum of squares in the same
//! loop as the products, nothing before the first load) streams its 55 MB at about 2.8 TB/s.
//! This kernel is that bf16 GEMV with 8-bit weights: each 16-byte vector of a weight row holds
//! 16 codes, which become exact f32s in two instructions each (int8 on CUDA: one PRMT puts the
//! byte, its sign flipped once per word, under the exponent of 2^23 and one FADD takes the
//! offset off; elsewhere [`byte_exact`]; e4m3: one `cvt.rn.f16x2.e4m3x2` per pair and one
//! conversion to f32 each on CUDA sm_89+, [`decode_e4m3`]'s integer operations elsewhere) and
//! multiply x in f32: no scaling, no staging, no reduction before the loop. In ptxas 12.9's
//! SASS the loop takes 4.8 (down) to 6.8 (the normed gate-up, qkv) instructions per weight byte
//! (3 for the codes, the rest for x, the norm and the addresses), against about 10 that full
//! issue allows per byte at an H100's bandwidth (128 lane instructions and about 12.5 bytes per
//! clock and SM).
//!
//! Layout (the bf16 GEMV's): each group of one or two output columns (weight rows `n`, and rows
//! `N + n` of the up half when gated; two where the product is ungated, see [`columns`])
//! belongs to `splits` plane-sized groups of a cube (or to a half plane where K is short, see
//! [`group_lanes`]), whose lanes stride over its 16-byte weight vectors keeping one f32
//! accumulator per row of x and column (two when gated, and x's sum of squares with the input
//! norm); a plane reduction (shuffles in a half plane) and shared memory sum the groups, and lane 0
//! applies the weight row's scale, the norm's `1 / rms` and the epilogue (bias, residual, the
//! gated activation). Up to two rows of x the launch shape depends on N and K only.
//!
//! The result is the dequantized weight times x in f32, whose only rounding is the output's (and
//! the order of the sums): the codes path rounds x to 8 bits per row, the tensor-core path to
//! f16.

use cubecl::prelude::*;
use ops::gemm::{bias_value, residuals_ahead, write_epilogue_ahead, EpilogueBlueprint, AHEAD_ROWS};
use ops::norm::sum_squares;
use ops::pdl::wait_after;
use ops::{caps, DeviceTensor};

use crate::codec::{byte_exact, decode_e4m3};
use crate::layout::words_arg;
use crate::w4a16_nk::NkEpilogue;

mod epilogue;

use epilogue::{group_sum, group_sums, load_scales};

/// Bytes (codes) per weight vector.
const CODES: usize = 16;

/// Comptime shape of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SimtPlan {
    /// Rows of x (1..=16), unrolled into per-row accumulators.
    m: u32,
    /// Lanes per group: the plane size when plane ops are used, else 32, or fewer where K is
    /// short and the columns alone fill the device (see [`group_lanes`]).
    lanes: u32,
    /// Plane-sized groups per column group, each over an interleaved share of K.
    splits: u32,
    /// Output columns of each column group (one group is `splits` plane-sized groups): 1 or 2.
    /// With 2, x's conversions, its norm weight and its squares serve twice as many codes per k.
    cols: u32,
    /// Column groups per cube.
    groups_per_cube: u32,
    use_plane: bool,
    /// Plane ops with `lanes` below the plane size: several column groups share a plane and
    /// reduce by shuffles ([`lane_group_sum`]); K is then not split.
    sub_plane: bool,
    /// x vectors per 16-code weight vector (16 over x's vector size).
    x_per_w: u32,
    /// x goes through an RMSNorm first (its statistics summed alongside the products).
    norm: bool,
    epilogue: EpilogueBlueprint,
    fp8: bool,
    /// e4m3 pairs decoded by `cvt.rn.f16x2.e4m3x2` (CUDA sm_89+) instead of integer operations.
    cvt_e4m3: bool,
    /// Inline PTX is there (CUDA): int8 codes decoded by PRMT.
    ptx: bool,
    /// Signal `griddepcontrol.launch_dependents` once the weights are read.
    trigger: bool,
    /// Load each unit's first weight vectors before `griddepcontrol.wait`.
    early_wait: bool,
}

/// Whether the kernel takes `m` rows of `k` features: M <= 16 and K a whole number of 16-byte
/// weight vectors (x's dtype is checked by the layer: any float the runtime has).
pub(crate) fn can_run(m: usize, k: usize) -> bool {
    (1..=16).contains(&m) && k > 0 && k.is_multiple_of(CODES)
}

/// Code `j` (0..4) of `word` as an exact f32. With inline PTX (`plan.ptx`) the int8 word comes
/// with its sign bits already flipped (offset binary, `c + 128`).
#[cube]
fn code_value(word: u32, #[comptime] j: u32, #[comptime] plan: SimtPlan) -> f32 {
    let v: f32;
    if comptime![!plan.fp8 && plan.ptx] {
        // One PRMT builds `0x4B0000cc` (byte j of the word, two zero bytes and the top byte of
        // `magic`: 2^23 + c + 128) and one FADD takes 2^23 + 128 off; ptxas makes
        // `byte_exact`'s mask and XOR of two immediates two LOP3s.
        let magic = 0x4B00_0000u32;
        let select = comptime![0x7650u32 | j];
        let d: u32;
        gpu_asm!(
            "prmt.b32 {d}, {a}, {magic}, {sel};",
            a = in(_) word,
            magic = in(_) magic,
            sel = in(_) select,
            d = out(_) d,
            options(pure, nomem),
        );
        v = f32::reinterpret(d) - 8_388_736f32;
    } else if comptime![!plan.fp8] {
        v = byte_exact(i32::reinterpret(word), j);
    } else if comptime![plan.cvt_e4m3] {
        // Bytes 2p and 2p + 1 of the word become the low and high f16 of the pair (every e4m3
        // value is an f16); ptxas shares the pair's conversion between its two codes.
        let half = word >> comptime![16 * (j / 2)];
        if comptime![j.is_multiple_of(2)] {
            gpu_asm!(
                "{{ .reg .b16 h, lo, hi; .reg .b32 p; cvt.u16.u32 h, {w}; cvt.rn.f16x2.e4m3x2 p, h; mov.b32 {{lo, hi}}, p; cvt.f32.f16 {v}, lo; }}",
                w = in(_) half,
                v = out(_) v,
                options(pure, nomem),
            );
        } else {
            gpu_asm!(
                "{{ .reg .b16 h, lo, hi; .reg .b32 p; cvt.u16.u32 h, {w}; cvt.rn.f16x2.e4m3x2 p, h; mov.b32 {{lo, hi}}, p; cvt.f32.f16 {v}, hi; }}",
                w = in(_) half,
                v = out(_) v,
                options(pure, nomem),
            );
        }
    } else {
        v = decode_e4m3((word >> comptime![8 * j]) & 0xFFu32);
    }
    v
}

/// The 16 codes of one weight vector as f32s, into `out[base..base + 16]`.
#[cube]
fn decode_vector(
    v: Vector<i32, Const<4>>,
    out: &mut Array<f32>,
    #[comptime] base: usize,
    #[comptime] plan: SimtPlan,
) {
    #[unroll]
    for w in 0..4usize {
        // Flipped for the PRMT decode; an immutable value, as inline PTX takes a mutable
        // variable by its address.
        let flip = comptime![if !plan.fp8 && plan.ptx {
            0x8080_8080u32
        } else {
            0u32
        }];
        let word = u32::reinterpret(v.extract(w)) ^ flip;
        #[unroll]
        for j in 0..4usize {
            out[base + 4 * w + j] = code_value(word, comptime![j as u32], plan);
        }
    }
}

/// Adds one weight vector of each of the group's columns (`wv[j]`, and the up rows' `wv[cols + j]`
/// when gated) times every row of x to the accumulators (`acc[m * cols + j]`), x scaled on the
/// fly by the norm weight, and x's squares for the norm.
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate_vector<F: Float, N: Size>(
    x: &[Vector<F, N>],
    norm_w: &[Vector<F, N>],
    wv: &Array<Vector<i32, Const<4>>>,
    kv: usize,
    row_vectors: usize,
    acc: &mut Array<f32>,
    acc_up: &mut Array<f32>,
    squares: &mut Array<f32>,
    #[comptime] plan: SimtPlan,
) {
    let per = comptime![plan.x_per_w as usize];
    let width = comptime![CODES / plan.x_per_w as usize];
    let cols = comptime![plan.cols as usize];
    let gated = comptime![plan.epilogue.is_gated()];
    let mut wf = Array::<f32>::new(comptime![CODES * plan.cols as usize]);
    let mut uf = Array::<f32>::new(comptime![CODES * plan.cols as usize]);
    #[unroll]
    for j in 0..cols {
        decode_vector(wv[j], &mut wf, comptime![j * CODES], plan);
        if gated {
            decode_vector(wv[cols + j], &mut uf, comptime![j * CODES], plan);
        }
    }
    let mut gf = Array::<f32>::new(CODES);
    if comptime![plan.norm] {
        #[unroll]
        for t in 0..per {
            let gv = norm_w[kv * per + t];
            #[unroll]
            for e in 0..width {
                gf[t * width + e] = f32::cast_from(gv.extract(e));
            }
        }
    }
    #[unroll]
    for m in 0..comptime![plan.m as usize] {
        // Four partial sums per column and vector: short dependency chains.
        let mut s = Array::<f32>::new(comptime![4 * plan.cols as usize]);
        let mut su = Array::<f32>::new(comptime![4 * plan.cols as usize]);
        #[unroll]
        for i in 0..comptime![4 * plan.cols as usize] {
            s[i] = 0f32;
            su[i] = 0f32;
        }
        #[unroll]
        for t in 0..per {
            let xv = x[m * row_vectors + kv * per + t];
            if comptime![plan.norm] {
                squares[m] += sum_squares(xv);
            }
            #[unroll]
            for e in 0..width {
                let c = t * width + e;
                let mut xe = f32::cast_from(xv.extract(e));
                if comptime![plan.norm] {
                    xe *= gf[c];
                }
                #[unroll]
                for j in 0..cols {
                    s[4 * j + c % 4] += xe * wf[j * CODES + c];
                    if gated {
                        su[4 * j + c % 4] += xe * uf[j * CODES + c];
                    }
                }
            }
        }
        #[unroll]
        for j in 0..cols {
            let i = 4 * j;
            acc[m * cols + j] += (s[i] + s[i + 1]) + (s[i + 2] + s[i + 3]);
            if gated {
                acc_up[m * cols + j] += (su[i] + su[i + 1]) + (su[i + 2] + su[i + 3]);
            }
        }
    }
}

/// The weight row of output column `col`: a column past N reads row 0 (its sums are never
/// written).
#[cube]
fn column_row(col: usize, n_cols: usize) -> usize {
    select(col < n_cols, col, 0)
}

/// The weight vectors `kv` of the group's rows (and up rows when gated) into `wv`.
#[cube]
fn load_vectors(
    w: &[Vector<i32, Const<4>>],
    wv: &mut Array<Vector<i32, Const<4>>>,
    col0: usize,
    kv: usize,
    n_cols: usize,
    pitch_vectors: usize,
    up_offset: usize,
    #[comptime] plan: SimtPlan,
) {
    let cols = comptime![plan.cols as usize];
    #[unroll]
    for j in 0..cols {
        let row = column_row(col0 + j, n_cols);
        wv[j] = w[row * pitch_vectors + kv];
        if comptime![plan.epilogue.is_gated()] {
            wv[cols + j] = w[(up_offset + row) * pitch_vectors + kv];
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn float_x_simt_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    w: &[Vector<i32, Const<4>>],
    w_scale: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    norm_w: &[Vector<F, N>],
    n_cols: usize,
    k_vectors: usize,
    pitch_vectors: usize,
    up_offset: usize,
    inv_k: f32,
    eps: f32,
    #[comptime] plan: SimtPlan,
    #[define(F)] _dtype: ElemType,
) {
    let cols = comptime![plan.cols as usize];
    let col0 = (CUBE_POS * plan.groups_per_cube as usize + UNIT_POS_Y as usize) * cols;
    let m_rows = comptime![plan.m as usize];
    let lanes = comptime![(plan.lanes * plan.splits) as usize];
    let gated = comptime![plan.epilogue.is_gated()];
    let row_vectors = k_vectors * comptime![plan.x_per_w as usize];

    let mut acc = Array::<f32>::new(comptime![(plan.m * plan.cols) as usize]);
    let mut acc_up = Array::<f32>::new(comptime![(plan.m * plan.cols) as usize]);
    let mut squares = Array::<f32>::new(m_rows);
    #[unroll]
    for i in 0..comptime![(plan.m * plan.cols) as usize] {
        acc[i] = 0f32;
        acc_up[i] = 0f32;
    }
    #[unroll]
    for m in 0..m_rows {
        squares[m] = 0f32;
    }
    let mut wv = Array::<Vector<i32, Const<4>>>::new(comptime![2 * plan.cols as usize]);
    let first = UNIT_POS_X as usize;
    let mut start = first;
    // The epilogue's operands ahead of their use: the weight rows' scales and the bias (weights,
    // which no kernel writes) with the first weight vectors, the residual right after the
    // products, before the reductions. Loaded in the epilogue, ptxas issued them after the
    // reductions, one column after the other, and up to three load latencies sat between the
    // last product and the store.
    let preload = comptime![plan.m <= AHEAD_ROWS];
    let writer = UNIT_POS_X == 0;
    let mut scales = Array::<f32>::new(comptime![2 * plan.cols as usize]);
    let mut bias_f = Array::<f32>::new(cols);
    let mut residual_f = Array::<f32>::new(comptime![(plan.m * plan.cols) as usize]);
    load_scales(w_scale, &mut scales, col0, n_cols, up_offset, plan);
    if comptime![preload] && writer {
        #[unroll]
        for j in 0..cols {
            let col = min(col0 + j, n_cols - 1);
            bias_f[j] = bias_value::<F>(bias, col, plan.epilogue);
        }
    }
    if comptime![plan.early_wait] {
        // Weights are never written by a kernel: the first vectors load while the kernel before
        // this one finishes; x and the outputs wait for it.
        #[unroll]
        for i in 0..comptime![2 * plan.cols as usize] {
            wv[i] = Vector::<i32, Const<4>>::new(0i32);
        }
        let has_first = first < k_vectors;
        if has_first {
            load_vectors(
                w,
                &mut wv,
                col0,
                first,
                n_cols,
                pitch_vectors,
                up_offset,
                plan,
            );
        }
        // Pinned below the loads: ptxas scheduled a bare wait above them (see `wait_after`).
        let mut dep = 0u32;
        #[unroll]
        for i in 0..comptime![2 * plan.cols as usize] {
            dep ^= u32::reinterpret(wv[i].extract(0usize));
        }
        #[unroll]
        for j in 0..cols {
            dep ^= u32::reinterpret(scales[j]);
            if gated {
                dep ^= u32::reinterpret(scales[cols + j]);
            }
            if comptime![preload && plan.epilogue.has_bias] {
                dep ^= u32::reinterpret(bias_f[j]);
            }
        }
        // w, w_scale, bias and norm_w: the parameters read before the wait (`ops::pdl`).
        gpu_asm!("// cubellm.early_params 1 2 3 6");
        wait_after(dep);
        if has_first {
            accumulate_vector::<F, N>(
                x,
                norm_w,
                &wv,
                first,
                row_vectors,
                &mut acc,
                &mut acc_up,
                &mut squares,
                plan,
            );
        }
        start = first + lanes;
    }
    for kv in range_stepped(start, k_vectors, lanes) {
        load_vectors(w, &mut wv, col0, kv, n_cols, pitch_vectors, up_offset, plan);
        accumulate_vector::<F, N>(
            x,
            norm_w,
            &wv,
            kv,
            row_vectors,
            &mut acc,
            &mut acc_up,
            &mut squares,
            plan,
        );
    }
    if comptime![preload] && writer {
        residuals_ahead::<F>(
            residual,
            &mut residual_f,
            col0,
            n_cols,
            &acc,
            m_rows,
            cols,
            plan.epilogue,
        );
    }
    if comptime![plan.trigger] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }
    // Out-of-range columns still take part in the (shared-memory) reductions' barriers.
    let mut red = Shared::<[f32]>::new_slice(comptime![plan.shared_len()]);
    // Up to AHEAD_ROWS rows every sum is reduced in one pass (the columns' products, the up
    // products, x's squares: `plan.sums()` values, in that order); above, one value at a time,
    // which keeps fewer of them live in the 16-row kernels.
    let n_acc = comptime![(plan.m * plan.cols) as usize];
    let mut sums = Array::<f32>::new(comptime![plan.sums()]);
    if comptime![preload] {
        #[unroll]
        for i in 0..n_acc {
            sums[i] = acc[i];
            if gated {
                sums[n_acc + i] = acc_up[i];
            }
        }
        if comptime![plan.norm] {
            #[unroll]
            for m in 0..m_rows {
                sums[comptime![plan.sums() - plan.m as usize] + m] = squares[m];
            }
        }
        group_sums(&mut sums, &mut red, plan);
    }
    #[unroll]
    for m in 0..m_rows {
        let mut inv_rms = 1f32;
        if comptime![plan.norm] {
            let sq = if comptime![preload] {
                sums[comptime![plan.sums() - plan.m as usize] + m]
            } else {
                group_sum(squares[m], &mut red, plan)
            };
            inv_rms = f32::inverse_sqrt(sq * inv_k + eps);
        }
        #[unroll]
        for j in 0..cols {
            let col = col0 + j;
            let i = m * cols + j;
            let mut total: f32;
            let mut total_up = 0f32;
            if comptime![preload] {
                total = sums[i];
                if gated {
                    total_up = sums[n_acc + i];
                }
            } else {
                total = group_sum(acc[i], &mut red, plan);
                if gated {
                    total_up = group_sum(acc_up[i], &mut red, plan);
                }
            }
            total *= scales[j] * inv_rms;
            if gated {
                total_up *= scales[cols + j] * inv_rms;
            }
            if col < n_cols && writer {
                write_epilogue_ahead::<F>(
                    out,
                    total,
                    total_up,
                    m,
                    col,
                    n_cols,
                    bias,
                    residual,
                    bias_f[j],
                    residual_f[i],
                    preload,
                    plan.epilogue,
                );
            }
        }
    }
}

/// What a launch plan takes from the device.
#[derive(Clone, Copy, Debug)]
struct SimtDevice {
    sms: u32,
    /// Lanes per plane-sized group, and whether they reduce through plane operations.
    lanes: u32,
    use_plane: bool,
    /// `cvt.rn.f16x2.e4m3x2` is there (CUDA sm_89+).
    cvt_e4m3: bool,
    /// Inline PTX is there (CUDA).
    ptx: bool,
    trigger: bool,
    early_wait: bool,
}

impl SimtDevice {
    fn of<R: Runtime>(client: &ComputeClient<R>) -> Self {
        let (lanes, use_plane) = ops::matmul::gemv_lanes(client);
        Self {
            sms: caps::num_sms(client),
            lanes,
            use_plane,
            cvt_e4m3: super::has_mma8(client, true),
            ptx: caps::runtime_name(client).contains("cuda"),
            trigger: caps::has_launch_dependents(client),
            early_wait: caps::has_pdl(client),
        }
    }

    /// An H100 or H200 (132 SMs, 32-lane planes, programmatic dependent launch).
    #[cfg(test)]
    const SM90: Self = Self {
        sms: 132,
        lanes: 32,
        use_plane: true,
        cvt_e4m3: true,
        ptx: true,
        trigger: true,
        early_wait: true,
    };
}

/// The product's comptime description.
#[derive(Clone, Copy, Debug)]
struct Shape {
    m: usize,
    k: usize,
    /// Output columns (the gated product's half of the weight rows).
    n: usize,
    fp8: bool,
    norm: bool,
    epilogue: EpilogueBlueprint,
    /// x's elements per vector load (divides 16).
    vector: usize,
}

/// Output columns per column group. Two where the product is not gated and x has at most
/// [`TWO_COLUMN_ROWS`] rows: x's conversions (and, behind the norm, its weight and its squares)
/// then serve two codes per k instead of one, which took the loop step of the 1.5B model's qkv
/// from 9.9 to 6.8 instructions per weight byte and down's from 5.9 to 4.8 in sm_90a SASS, at
/// 48 and 40 registers and the same count of units in flight (the splits of K follow the number
/// of column groups). The gated gate-up stays at one: with two its 63 registers leave four
/// 256-unit cubes per SM, and its 560 cubes would take 1.06 waves (at one column, 48 registers
/// and 16 lanes a column, 560 cubes in 0.85 waves).
fn columns(shape: Shape) -> u32 {
    if shape.epilogue.is_gated() || shape.m > TWO_COLUMN_ROWS {
        1
    } else {
        2
    }
}

/// The most rows of x that [`columns`] gives two columns (each row adds two accumulators).
const TWO_COLUMN_ROWS: usize = 2;

/// Lanes per column group where K is not split: the plane's, halved (down to 8) while a lane
/// would load fewer than [`MIN_VECTORS_PER_LANE`] weight vectors and the narrower groups still
/// put at least [`FULL_UNITS_PER_SM`] units on every SM. On the 1.5B model's K of 1 536 a full
/// plane gives a lane three 16-byte vectors of a row and the gate-up launch 1.7 waves of cubes;
/// 16 lanes give six vectors (as the bf16 GEMV's lanes load there) in 0.85 waves. On an H100 that
/// (gate-up and the int8 LM head) decoded W8A8 1.3% faster than 32 lanes (967.7 against 954.9
/// tok/s, with the int8 LM head 1 043.0 against 1 023.6; FP8 +0.5%); 8 lanes (twelve vectors a
/// lane, 0.42 waves) 12% slower, as 16 lanes (twelve vectors) were in the bf16 GEMV.
fn group_lanes(device: SimtDevice, groups: usize, k_vectors: usize) -> u32 {
    let mut lanes = device.lanes;
    let full = device.sms as usize * FULL_UNITS_PER_SM;
    while lanes > 8
        && k_vectors < MIN_VECTORS_PER_LANE * lanes as usize
        && groups * (lanes / 2) as usize >= full
    {
        lanes /= 2;
    }
    lanes
}

/// See [`group_lanes`].
const MIN_VECTORS_PER_LANE: usize = 4;
/// See [`group_lanes`]: four 256-unit cubes.
const FULL_UNITS_PER_SM: usize = 1024;

/// The plan, the cube's shape and the cube count of a launch: the bf16 GEMV's (the same splits
/// of K for the same count of 16-byte weight vectors, 256 units a cube).
fn launch_plan(shape: Shape, device: SimtDevice) -> (SimtPlan, CubeDim, u32) {
    let cols = columns(shape);
    let groups = shape.n.div_ceil(cols as usize);
    let k_vectors = shape.k / CODES;
    let splits = ops::matmul::gemv_splits(device.sms, groups, k_vectors, device.lanes);
    let lanes = if splits == 1 {
        group_lanes(device, groups, k_vectors)
    } else {
        device.lanes
    };
    let groups_per_cube = (256 / (lanes * splits)).max(1);
    let plan = SimtPlan {
        m: shape.m as u32,
        lanes,
        splits,
        cols,
        groups_per_cube,
        use_plane: device.use_plane,
        sub_plane: device.use_plane && lanes < device.lanes,
        x_per_w: (CODES / shape.vector) as u32,
        norm: shape.norm,
        epilogue: shape.epilogue,
        fp8: shape.fp8,
        cvt_e4m3: shape.fp8 && device.cvt_e4m3,
        ptx: device.ptx,
        trigger: device.trigger,
        early_wait: device.early_wait,
    };
    let cubes = groups.div_ceil(groups_per_cube as usize) as u32;
    (
        plan,
        CubeDim::new_2d(lanes * splits, groups_per_cube),
        cubes,
    )
}

/// The GEMV on validated operands where [`can_run`] holds: `x[M, K]` contiguous float, `w` an
/// 8-bit `[N, K]` padded matrix (`[2N, K]`: gate rows then up rows when gated) of row pitch
/// `pitch` bytes with per-row scales `w_scale`, `out[M, N]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_float_x_simt<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    pitch: usize,
    w_scale: &DeviceTensor<R>,
    fp8: bool,
    epilogue: NkEpilogue<'_, R>,
    out: &DeviceTensor<R>,
    [m, k, n]: [usize; 3],
) {
    debug_assert!(can_run(m, k));
    let vector = caps::vector_size_for(client, x.dtype(), CODES);
    let shape = Shape {
        m,
        k,
        n,
        fp8,
        norm: epilogue.norm.is_some(),
        epilogue: epilogue.blueprint(),
        vector,
    };
    let (plan, cube_dim, cubes) = launch_plan(shape, SimtDevice::of(client));
    let (bias, residual, norm_w, eps) = epilogue.operands(x);
    let up_offset = if epilogue.gate.is_some() { n } else { 0 };
    // SAFETY: the operands were validated by the caller against M, N and K (the padded weight
    // rows hold `pitch / 16` vectors, of which the kernel reads the first `K / 16`; every index
    // stays below N rows, or 2N when gated).
    unsafe {
        let words = words_arg(w);
        float_x_simt_kernel::launch_unchecked::<R>(
            client,
            ops::launch::cube_count_1d(client, cubes),
            cube_dim,
            vector,
            x.as_buffer_arg(),
            words,
            w_scale.as_buffer_arg(),
            bias.as_buffer_arg(),
            residual.as_buffer_arg(),
            out.as_buffer_arg(),
            norm_w.as_buffer_arg(),
            n,
            k / CODES,
            pitch / CODES,
            up_offset,
            1.0 / k as f32,
            eps,
            plan,
            x.dtype().elem_type(),
        );
    }
}

#[cfg(test)]
mod cuda_source;

#[cfg(test)]
mod tests {
    use super::{launch_plan, Shape, SimtDevice};
    use ops::gemm::EpilogueBlueprint;
    use ops::matmul::Activation;

    fn shape(m: usize, k: usize, n: usize, gated: bool) -> Shape {
        let epilogue = if gated {
            EpilogueBlueprint::gated(Activation::Silu)
        } else {
            EpilogueBlueprint::linear(true, true)
        };
        Shape {
            m,
            k,
            n,
            fp8: false,
            norm: true,
            epilogue,
            vector: 8,
        }
    }

    /// The 1.5B model's projections at one row on an H100 or H200: gate-up one column per
    /// 16 lanes (six weight vectors a lane, 560 cubes of 16 columns), qkv, o and down two
    /// columns a group with K split so that about 32 planes per SM stream, the int8 LM head two
    /// columns per 16 lanes.
    #[test]
    fn model_projections_launch_as_planned() {
        for (k, n, gated, cols, lanes, splits, cubes) in [
            (1536, 8960, true, 1, 16, 1, 560),
            (1536, 2048, false, 2, 32, 2, 256),
            (1536, 1536, false, 2, 32, 2, 192),
            (8960, 1536, false, 2, 32, 8, 768),
            (1536, 151936, false, 2, 16, 1, 4748),
        ] {
            let (plan, dim, count) = launch_plan(shape(1, k, n, gated), SimtDevice::SM90);
            let what = format!("{k}x{n} gated {gated}");
            assert_eq!(
                (plan.cols, plan.lanes, plan.splits, count),
                (cols, lanes, splits, cubes),
                "{what}"
            );
            assert_eq!(plan.sub_plane, lanes < 32, "{what}");
            assert_eq!(dim.x * dim.y, 256, "{what}");
        }
    }

    /// The kernel tests' shapes take both column counts: two for an ungated product of one or
    /// two rows (N odd too: a group half past N), one when gated or above two rows.
    #[test]
    fn test_shapes_take_both_column_counts() {
        let cols = |m, n, gated| launch_plan(shape(m, 96, n, gated), SimtDevice::SM90).0.cols;
        assert_eq!(cols(1, 40, false), 2);
        assert_eq!(cols(2, 33, false), 2);
        assert_eq!(cols(1, 40, true), 1);
        assert_eq!(cols(3, 33, false), 1);
        assert_eq!(cols(16, 50, false), 1);
    }
}
