//! Transposes that put a `[K, N]` operand into the K-contiguous `[N, K]` layout the 8-bit GEMM
//! reads (`fp8_gemm` takes `b[K, N]` like `torch._scaled_mm`).

use cubecl::prelude::*;
use ops::{DType, DeviceTensor};

use crate::format::row_pitch;

const TILE: usize = 32;

/// `out[c, r] = x[r, c]` for a contiguous float `x[rows, cols]`, through a 32×32 shared tile
/// (coalesced reads and writes).
#[cube(launch_unchecked)]
fn transpose_float_kernel<F: Float>(
    x: &[F],
    out: &mut [F],
    rows: usize,
    cols: usize,
    #[define(F)] _dtype: ElemType,
) {
    let mut tile = Shared::<[F]>::new_slice(comptime![TILE * (TILE + 1)]);
    let c0 = CUBE_POS_X as usize * TILE;
    let r0 = CUBE_POS_Y as usize * TILE;
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    #[unroll]
    for i in 0..4usize {
        let r = r0 + ty + 8 * i;
        if r < rows && c0 + tx < cols {
            tile[(ty + 8 * i) * (TILE + 1) + tx] = x[r * cols + c0 + tx];
        }
    }
    sync_cube();
    #[unroll]
    for i in 0..4usize {
        let c = c0 + ty + 8 * i;
        if c < cols && r0 + tx < rows {
            out[c * rows + r0 + tx] = tile[tx * (TILE + 1) + ty + 8 * i];
        }
    }
}

/// Transposes a contiguous float matrix `[rows, cols]` into a new contiguous `[cols, rows]`.
pub(crate) fn transpose_float<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
) -> DeviceTensor<R> {
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    let out = DeviceTensor::empty(client, &[cols, rows], x.dtype());
    unsafe {
        transpose_float_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(cols.div_ceil(TILE) as u32, rows.div_ceil(TILE) as u32, 1),
            CubeDim::new_2d(32, 8),
            x.as_buffer_arg(),
            out.as_buffer_arg(),
            rows,
            cols,
            x.dtype().elem_type(),
        );
    }
    out
}

/// One output word of the byte transpose: bytes `src[4kw + j, n]` of a `[k, n_cols]` byte
/// matrix with row pitch `src_pitch` bytes, for `j` in 0..4 (zero past K).
#[cube(launch_unchecked)]
fn transpose_bytes_kernel(
    src: &[u32],
    dst: &mut [u32],
    k: usize,
    n_cols: usize,
    src_pitch: usize,
    dst_pw: usize,
) {
    let kw = ABSOLUTE_POS_X as usize;
    let n = ABSOLUTE_POS_Y as usize;
    if kw < dst_pw && n < n_cols {
        let mut word = 0u32;
        #[unroll]
        for j in 0..4usize {
            let kk = kw * 4 + j;
            if kk < k {
                let off = kk * src_pitch + n;
                let b = (src[off / 4] >> (8 * (off % 4)) as u32) & 0xFFu32;
                word |= b << comptime![(8 * j) as u32];
            }
        }
        dst[n * dst_pw + kw] = word;
    }
}

/// Transposes an 8-bit `[k, n]` matrix with row pitch `src_pitch` (bytes) into a padded `[n, k]`
/// one.
pub(crate) fn transpose_bytes<R: Runtime>(
    client: &ComputeClient<R>,
    src: &DeviceTensor<R>,
    src_pitch: usize,
    dtype: DType,
) -> DeviceTensor<R> {
    let (k, n) = (src.shape()[0], src.shape()[1]);
    let out = crate::layout::empty_byte_matrix(client, n, k, dtype);
    let dst_pw = row_pitch(k) / 4;
    let src_words = (src.handle().size_in_used() as usize).div_ceil(4);
    unsafe {
        transpose_bytes_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(dst_pw.div_ceil(16) as u32, n.div_ceil(16) as u32, 1),
            CubeDim::new_2d(16, 16),
            BufferArg::from_raw_parts(src.handle().clone(), src_words),
            crate::layout::words_arg(&out),
            k,
            n,
            src_pitch,
            dst_pw,
        );
    }
    out
}
