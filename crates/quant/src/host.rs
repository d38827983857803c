//! Host-side weight quantization and int4 packing.
//!
//! Weights arrive as float `[N, K]` (PyTorch's `Linear` layout: output channels by input
//! features) and are quantized per output channel (one scale per row of `w`), or for int4
//! optionally per group of `g` consecutive input features. This runs once at load, so it is
//! written for clarity, in f32 with the same rules as the activation kernels (see
//! [`crate::format`]).

use cubecl::prelude::*;
use ops::{DType, DeviceTensor, OpsError, Result};

use crate::format::{int4_encode, row_pitch, scale_for, QuantFormat, INT4_QMAX};

/// An 8-bit matrix `[rows, cols]` on the host whose rows are padded to [`row_pitch`] bytes
/// (zeros in the padding): the layout every 8-bit GEMM of this crate reads.
#[derive(Debug, Clone, PartialEq)]
pub struct ByteMatrix {
    pub rows: usize,
    pub cols: usize,
    pub pitch: usize,
    pub bytes: Vec<u8>,
}

impl ByteMatrix {
    /// A zero matrix. Panics, as `vec!` does, when `rows * pitch` bytes overflow `usize`.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        let pitch = row_pitch(cols);
        let len = rows
            .checked_mul(pitch)
            .expect("ByteMatrix::zeros: rows * pitch overflows usize");
        Self {
            rows,
            cols,
            pitch,
            bytes: vec![0; len],
        }
    }

    /// Packs a dense row-major `[rows, cols]` byte matrix into the padded layout.
    pub fn from_dense(rows: usize, cols: usize, dense: &[u8]) -> Result<Self> {
        const OP: &str = "ByteMatrix::from_dense";
        if rows.checked_mul(cols) != Some(dense.len()) {
            return Err(OpsError::shape(
                OP,
                format!("{} bytes for [{rows}, {cols}]", dense.len()),
            ));
        }
        // With no columns, rows*cols says nothing about rows; the padded rows must still fit.
        let padded = cols.div_ceil(16).max(1).checked_mul(16);
        if padded.and_then(|pitch| rows.checked_mul(pitch)).is_none() {
            return Err(OpsError::shape(
                OP,
                format!("[{rows}, {cols}] padded to 16-byte rows overflows usize"),
            ));
        }
        let mut m = Self::zeros(rows, cols);
        for r in 0..rows {
            m.bytes[r * m.pitch..r * m.pitch + cols].copy_from_slice(&dense[r * cols..][..cols]);
        }
        Ok(m)
    }

    pub fn get(&self, r: usize, c: usize) -> u8 {
        self.bytes[r * self.pitch + c]
    }

    /// The logical `[rows, cols]` bytes without padding.
    pub fn dense(&self) -> Vec<u8> {
        (0..self.rows)
            .flat_map(|r| self.bytes[r * self.pitch..][..self.cols].iter().copied())
            .collect()
    }

    /// Uploads as a `[rows, cols]` tensor of `dtype` (i8 or f8e4m3) with strides `[pitch, 1]`.
    pub fn upload<R: Runtime>(&self, client: &ComputeClient<R>, dtype: DType) -> DeviceTensor<R> {
        let bytes = if self.bytes.is_empty() {
            vec![0u8; 16]
        } else {
            self.bytes.clone()
        };
        let handle = client.create_from_slice(&bytes);
        DeviceTensor::from_parts(handle, &[self.rows, self.cols], &[self.pitch, 1], dtype)
    }
}

/// A weight quantized to 8 bits per output channel: `w[n, k] ≈ decode(q[n, k]) * scales[n]`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedWeight8 {
    pub format: QuantFormat,
    /// `[N, K]`, rows padded to 16 bytes.
    pub q: ByteMatrix,
    /// `[N]`.
    pub scales: Vec<f32>,
}

impl QuantizedWeight8 {
    /// The dequantized weight `[N, K]` in f64 (what the quantized GEMMs multiply by).
    pub fn dequantize(&self) -> Vec<f64> {
        let (n, k) = (self.q.rows, self.q.cols);
        let mut out = Vec::with_capacity(n * k);
        for r in 0..n {
            for c in 0..k {
                out.push(self.format.decode(self.q.get(r, c)) * self.scales[r] as f64);
            }
        }
        out
    }
}

fn check_weight(op: &'static str, w: &[f32], n: usize, k: usize) -> Result<()> {
    if n == 0 || k == 0 || n.checked_mul(k) != Some(w.len()) {
        return Err(OpsError::shape(
            op,
            format!("{} values for a [{n}, {k}] weight", w.len()),
        ));
    }
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(OpsError::invalid(
            op,
            format!("weight element {i} is {} (weights must be finite)", w[i]),
        ));
    }
    Ok(())
}

/// Threads for quantizing `elements` weights on the host: one below 2^20 (spawning would cost
/// more than it saves), else up to the machine's parallelism (a model's load quantizes about a
/// billion weights; every row or group is computed alike on any thread, so the result does not
/// depend on the count).
fn threads_for(elements: usize) -> usize {
    if elements < 1 << 20 {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(16))
    }
}

fn amax(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Quantizes a float weight `[N, K]` to int8 or fp8 e4m3, one scale per output channel (row).
pub fn quantize_weight_8bit(
    w: &[f32],
    n: usize,
    k: usize,
    format: QuantFormat,
) -> Result<QuantizedWeight8> {
    check_weight("quantize_weight_8bit", w, n, k)?;
    let mut q = ByteMatrix::zeros(n, k);
    let mut scales = vec![0f32; n];
    let pitch = q.pitch;
    // Runs of rows on threads, each writing its own rows of codes and scales.
    let rows = n.div_ceil(threads_for(n * k));
    std::thread::scope(|scope| {
        let runs = q
            .bytes
            .chunks_mut(rows * pitch)
            .zip(scales.chunks_mut(rows));
        for ((codes, run_scales), run) in runs.zip(w.chunks(rows * k)) {
            scope.spawn(move || {
                for (r, (scale, row)) in run_scales.iter_mut().zip(run.chunks(k)).enumerate() {
                    let s = scale_for(amax(row.iter().copied()), format.qmax());
                    for (c, &v) in row.iter().enumerate() {
                        codes[r * pitch + c] = format.encode(v / s);
                    }
                    *scale = s;
                }
            });
        }
    });
    Ok(QuantizedWeight8 { format, q, scales })
}

/// A weight quantized to int4 and packed for [`crate::w4a16`]: `packed[K/8, N]` holds in each
/// i32 the 8 signed nibbles of one column `n` at `k = 8*kw .. 8*kw + 8`, low nibble first;
/// `scales` is `[N]` (per channel) or `[K/g, N]` (group-wise along K).
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Weight {
    pub k: usize,
    pub n: usize,
    pub group_size: Option<usize>,
    pub packed: Vec<i32>,
    pub scales: Vec<f32>,
}

impl Int4Weight {
    /// The scale of `(k, n)`.
    pub fn scale(&self, k: usize, n: usize) -> f32 {
        match self.group_size {
            None => self.scales[n],
            Some(g) => self.scales[(k / g) * self.n + n],
        }
    }

    /// The dequantized weight as `[N, K]` f64 (PyTorch's layout, to compare with the input).
    pub fn dequantize(&self) -> Vec<f64> {
        let q = unpack_int4(&self.packed, self.k, self.n).expect("consistent by construction");
        let mut out = vec![0.0; self.n * self.k];
        for kk in 0..self.k {
            for nn in 0..self.n {
                out[nn * self.k + kk] = q[kk * self.n + nn] as f64 * self.scale(kk, nn) as f64;
            }
        }
        out
    }

    /// Bytes on the device (packed weights + f32 scales).
    pub fn bytes(&self) -> usize {
        4 * (self.packed.len() + self.scales.len())
    }
}

/// Checks the int4 shape rules: K a multiple of 8 (8 nibbles per i32) and of the group size,
/// and a group size that is a positive multiple of 8.
pub fn check_int4_shape(
    op: &'static str,
    k: usize,
    n: usize,
    group_size: Option<usize>,
) -> Result<()> {
    if k == 0 || n == 0 {
        return Err(OpsError::shape(
            op,
            format!("empty int4 weight K={k}, N={n}"),
        ));
    }
    if !k.is_multiple_of(8) {
        return Err(OpsError::shape(
            op,
            format!("K={k} is not a multiple of 8: int4 packs 8 values of K per i32"),
        ));
    }
    if let Some(g) = group_size {
        if g == 0 || g % 8 != 0 {
            return Err(OpsError::invalid(
                op,
                format!("group size {g} must be a positive multiple of 8 (64 or 128 are usual)"),
            ));
        }
        if !k.is_multiple_of(g) {
            return Err(OpsError::shape(
                op,
                format!("K={k} is not a multiple of the group size {g}"),
            ));
        }
    }
    Ok(())
}

/// Quantizes a float weight `[N, K]` to int4 (symmetric, `s = amax / 7`, codes clamped to
/// -8..=7) per output channel (`group_size = None`) or per group of `g` along K, and packs it.
pub fn quantize_weight_int4(
    w: &[f32],
    n: usize,
    k: usize,
    group_size: Option<usize>,
) -> Result<Int4Weight> {
    const OP: &str = "quantize_weight_int4";
    check_weight(OP, w, n, k)?;
    check_int4_shape(OP, k, n, group_size)?;
    let g = group_size.unwrap_or(k);
    let groups = k / g;
    let mut scales = vec![0f32; groups * n];
    let mut q = vec![0i8; k * n];
    // Runs of groups along K on threads: `q` is `[K, N]` and `scales` `[K / g, N]`, so each
    // run writes its own rows of both.
    let per = groups.div_ceil(threads_for(n * k));
    std::thread::scope(|scope| {
        let runs = q.chunks_mut(per * g * n).zip(scales.chunks_mut(per * n));
        for (t, (codes, run_scales)) in runs.enumerate() {
            scope.spawn(move || {
                for (lg, group_scales) in run_scales.chunks_mut(n).enumerate() {
                    let gi = t * per + lg;
                    for (nn, scale) in group_scales.iter_mut().enumerate() {
                        let part = &w[nn * k + gi * g..nn * k + (gi + 1) * g];
                        let s = scale_for(amax(part.iter().copied()), INT4_QMAX);
                        *scale = s;
                        for (j, &v) in part.iter().enumerate() {
                            codes[(lg * g + j) * n + nn] = int4_encode(v / s);
                        }
                    }
                }
            });
        }
    });
    Ok(Int4Weight {
        k,
        n,
        group_size,
        packed: pack_int4(&q, k, n)?,
        scales,
    })
}

/// Packs int4 codes `q[K, N]` (row-major, values in -8..=7) into `[K/8, N]` i32 words: word
/// `(kw, n)` holds `q[8kw + j, n]` in bits `4j..4j+4` (low nibble first, two's complement).
pub fn pack_int4(q: &[i8], k: usize, n: usize) -> Result<Vec<i32>> {
    const OP: &str = "pack_int4";
    check_int4_shape(OP, k, n, None)?;
    if k.checked_mul(n) != Some(q.len()) {
        return Err(OpsError::shape(
            OP,
            format!("{} codes for [{k}, {n}]", q.len()),
        ));
    }
    if let Some(i) = q.iter().position(|v| !(-8..=7).contains(v)) {
        return Err(OpsError::invalid(
            OP,
            format!("code {i} is {} (int4 codes are -8..=7)", q[i]),
        ));
    }
    let mut out = vec![0i32; k / 8 * n];
    for kw in 0..k / 8 {
        for nn in 0..n {
            let mut word = 0u32;
            for j in 0..8 {
                word |= ((q[(8 * kw + j) * n + nn] as u32) & 0xF) << (4 * j);
            }
            out[kw * n + nn] = word as i32;
        }
    }
    Ok(out)
}

/// Unpacks `[K/8, N]` words into codes `q[K, N]`, sign-extending each nibble (`(w << (28 - 4j))
/// >> 28` with an arithmetic shift; `(w >> 4j) & 0xF` would be unsigned and wrong).
pub fn unpack_int4(packed: &[i32], k: usize, n: usize) -> Result<Vec<i8>> {
    const OP: &str = "unpack_int4";
    check_int4_shape(OP, k, n, None)?;
    if (k / 8).checked_mul(n) != Some(packed.len()) {
        return Err(OpsError::shape(
            OP,
            format!(
                "{} words for K={k}, N={n} (needs {} x {n})",
                packed.len(),
                k / 8
            ),
        ));
    }
    let mut q = vec![0i8; k * n];
    for kw in 0..k / 8 {
        for nn in 0..n {
            let w = packed[kw * n + nn];
            for j in 0..8 {
                q[(8 * kw + j) * n + nn] = (w.wrapping_shl(28 - 4 * j as u32) >> 28) as i8;
            }
        }
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights of about 1.2 M elements (past the threshold where the work spreads over
    /// threads), with rows and groups of different magnitudes.
    fn weights(n: usize, k: usize) -> Vec<f32> {
        (0..n * k)
            .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
            .map(|v| v * (1 + (v.to_bits() % 7)) as f32)
            .collect()
    }

    /// The threaded 8-bit quantization gives each row what a serial pass gives it.
    #[test]
    fn threaded_8bit_matches_a_serial_pass() {
        let (n, k) = (1100, 1050);
        let w = weights(n, k);
        assert!(n * k >= 1 << 20);
        for format in [QuantFormat::Int8, QuantFormat::Fp8E4M3] {
            let got = quantize_weight_8bit(&w, n, k, format).unwrap();
            for r in 0..n {
                let row = &w[r * k..(r + 1) * k];
                let s = scale_for(amax(row.iter().copied()), format.qmax());
                assert_eq!(got.scales[r].to_bits(), s.to_bits(), "{format:?} row {r}");
                for (c, &v) in row.iter().enumerate() {
                    assert_eq!(
                        got.q.get(r, c),
                        format.encode(v / s),
                        "{format:?} ({r}, {c})"
                    );
                }
            }
        }
    }

    /// The threaded int4 quantization gives each group what a serial pass gives it.
    #[test]
    fn threaded_int4_matches_a_serial_pass() {
        let (n, k, g) = (800, 1536, 128);
        let w = weights(n, k);
        let got = quantize_weight_int4(&w, n, k, Some(g)).unwrap();
        let codes = unpack_int4(&got.packed, k, n).unwrap();
        for nn in 0..n {
            for gi in 0..k / g {
                let part = &w[nn * k + gi * g..nn * k + (gi + 1) * g];
                let s = scale_for(amax(part.iter().copied()), INT4_QMAX);
                assert_eq!(got.scales[gi * n + nn].to_bits(), s.to_bits());
                for (j, &v) in part.iter().enumerate() {
                    assert_eq!(codes[(gi * g + j) * n + nn], int4_encode(v / s));
                }
            }
        }
    }
}
