//! 8-bit linear layers: W8A8 (int8 weights and activations, exact i32 accumulation) and FP8
//! (e4m3 weights and activations, f32 accumulation), both as
//! `y = (q_x · q_wᵀ) · s_x[m] · s_w[n] (+ b)` with per-token activation scales and per-output-
//! channel weight scales.
//!
//! The activation is quantized by a pre-pass ([`crate::rowquant`]: one launch, `M·K` bytes out):
//! a per-row scale needs the whole row's maximum before the first code can be written, which a
//! GEMM tile loader does not have. At decode (M <= 16, CUDA) the input RMSNorm of a
//! `forward_normed_into` goes into that pre-pass, and where the row is short and the skinny
//! tensor-core GEMM's cubes few (at most 4 KB of codes per row, 512K element encodes over all
//! cubes) the GEMM quantizes x itself instead: every cube computes the row scales and stages the
//! codes in shared memory with the pre-pass's own function (the same bytes), which saves a
//! launch per projection for `N / 8` redundant passes over a few KB.
//!
//! With [`KernelChoice::FloatActivations`] a decode-sized product on CUDA skips the codes: the
//! 8-bit weights multiply the float activation on f16 tensor cores
//! (`gemm8/float_x.rs`), the input norm and the epilogue fused as in the bf16 GEMV. With
//! [`KernelChoice::FloatActivationsSimt`] they multiply it in f32 on the SIMT cores, on every
//! runtime (`gemm8/float_x_simt.rs`).

use cubecl::prelude::*;
use ops::launch::check_same_dtype;
use ops::linear::{unfused_epilogue, Epilogue, Linear, LinearWorkspace, NormedInput};
use ops::matmul::{Activation, InputNorm};
use ops::{caps, DType, DeviceTensor, OpsError, Result};

use crate::format::QuantFormat;
use crate::gemm8::{float_x, float_x_simt, Gemm8, KernelChoice, XSource};
use crate::host::{quantize_weight_8bit, QuantizedWeight8};
use crate::layout::{
    check_byte_matrix, check_output, check_scales, empty_byte_matrix, output_shape,
};
use crate::w4a16_nk::NkEpilogue;

/// `out[M, N] = (A · Bᵀ) · sa · sb (+ bias)` for 8-bit matrices `a[M, K]` and `b[N, K]` of the
/// same format (int8 or fp8 e4m3) in the padded layout of [`crate::layout`]. `sa` is `[M]` or a
/// single scale, `sb` `[N]` or a single scale (f32); `bias` `[N]` and `out` `[M, N]` are float
/// of one dtype. Above 16 rows on CUDA, where the output tiles are too few to fill the GPU, it
/// allocates a scratch for the partial sums of a K split (not in a captured CUDA graph, then).
#[allow(clippy::too_many_arguments)]
pub fn gemm8_into<R: Runtime>(
    client: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    sa: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
    sb: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    choice: KernelChoice,
) -> Result<()> {
    const OP: &str = "gemm8";
    let format = match a.dtype() {
        DType::I8 => QuantFormat::Int8,
        DType::F8E4M3 => QuantFormat::Fp8E4M3,
        other => {
            return Err(OpsError::UnsupportedDType {
                op: OP,
                dtype: other,
                runtime: "any",
                detail: "a must be i8 or f8e4m3".into(),
            })
        }
    };
    let a_pitch = check_byte_matrix(OP, "a", a, format.dtype())?;
    let b_pitch = check_byte_matrix(OP, "b", b, format.dtype())?;
    let (m, k) = (a.shape()[0], a.shape()[1]);
    let n = b.shape()[0];
    if b.shape()[1] != k {
        return Err(OpsError::shape(
            OP,
            format!("a {:?} and b {:?} differ in K", a.shape(), b.shape()),
        ));
    }
    let sa_scalar = check_scales(OP, "sa", sa, m, true)?;
    let sb_scalar = check_scales(OP, "sb", sb, n, true)?;
    check_output(client, OP, out, &[m, n], bias)?;
    Gemm8 {
        a,
        a_pitch,
        b,
        b_pitch,
        sa,
        sa_scalar,
        sb,
        sb_scalar,
        bias,
        residual: None,
        out,
        m,
        n,
        k,
        fp8: format == QuantFormat::Fp8E4M3,
        gate: None,
        norm: None,
        may_allocate: true,
    }
    .launch(client, choice);
    Ok(())
}

/// The quantized activation of an 8-bit linear layer: codes `[max_rows, K]` and scales
/// `[max_rows]`, allocated once so that the `_into` forms allocate nothing (CUDA graphs).
pub struct ActScratch<R: Runtime> {
    format: QuantFormat,
    q: DeviceTensor<R>,
    scales: DeviceTensor<R>,
}

impl<R: Runtime> ActScratch<R> {
    /// Room for up to `max_rows` rows of `k` features in `format`.
    pub fn new(client: &ComputeClient<R>, max_rows: usize, k: usize, format: QuantFormat) -> Self {
        let rows = max_rows.max(1);
        Self {
            format,
            q: empty_byte_matrix(client, rows, k.max(1), format.dtype()),
            scales: DeviceTensor::empty(client, &[rows], DType::F32),
        }
    }

    pub fn max_rows(&self) -> usize {
        self.q.shape()[0]
    }

    pub fn max_k(&self) -> usize {
        self.q.shape()[1]
    }

    /// Views of the first `rows` rows for `k` features (the pitch is that of `k`'s padded rows,
    /// so the scratch serves any `k <= max_k`).
    fn views(
        &self,
        op: &'static str,
        rows: usize,
        k: usize,
    ) -> Result<(DeviceTensor<R>, DeviceTensor<R>)> {
        let pitch = crate::format::row_pitch(k);
        let needed = rows * pitch;
        let have = self.max_rows() * crate::format::row_pitch(self.max_k());
        if rows > self.max_rows() || k > self.max_k() || needed > have {
            return Err(OpsError::shape(
                op,
                format!(
                    "the activation scratch holds [{}, {}], the input needs [{rows}, {k}]",
                    self.max_rows(),
                    self.max_k()
                ),
            ));
        }
        let q = DeviceTensor::from_parts(
            self.q.handle().clone(),
            &[rows, k],
            &[pitch, 1],
            self.format.dtype(),
        );
        let s = DeviceTensor::from_parts(self.scales.handle().clone(), &[rows], &[1], DType::F32);
        Ok((q, s))
    }
}

/// An 8-bit quantized weight on the device: codes `[N, K]` and per-channel scales `[N]`.
struct Weight8<R: Runtime> {
    format: QuantFormat,
    q: DeviceTensor<R>,
    scales: DeviceTensor<R>,
    choice: KernelChoice,
}

impl<R: Runtime> Weight8<R> {
    fn from_dense(
        client: &ComputeClient<R>,
        weight: &[f32],
        shape: [usize; 2],
        act_dtype: DType,
        format: QuantFormat,
    ) -> Result<Self> {
        caps::check_float_dtype(client, "quantized linear", act_dtype)?;
        let [n, k] = shape;
        let w = quantize_weight_8bit(weight, n, k, format)?;
        Self::upload(client, &w)
    }

    fn upload(client: &ComputeClient<R>, w: &QuantizedWeight8) -> Result<Self> {
        Ok(Self {
            format: w.format,
            q: w.q.upload(client, w.format.dtype()),
            scales: DeviceTensor::from_f32(client, &w.scales, &[w.q.rows], DType::F32)?,
            choice: KernelChoice::default(),
        })
    }

    fn bytes(&self) -> usize {
        self.q.handle().size_in_used() as usize + self.scales.numel() * 4
    }

    /// The product with bias and residual in the GEMM's epilogue; a gated epilogue runs in the
    /// skinny kernel's epilogue at decode sizes on CUDA, else writes the product into the
    /// workspace and applies SwiGLU after ([`unfused_epilogue`]). With `norm`, x is normalized
    /// by the decode kernels (only where [`Gemm8::decode_source`] has one).
    fn run(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        norm: Option<InputNorm<'_, R>>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()> {
        const OP: &str = "quantized linear";
        let (rows, k) = (x.rows(), x.last_dim());
        let own;
        let (q, s) = match workspace {
            Some(w) => w.codes(OP, rows, k, self.format.dtype())?,
            None => {
                own = ActScratch::new(client, rows, k, self.format);
                own.views(OP, rows, k)?
            }
        };
        let (w, ws, choice) = (&self.q, &self.scales, self.choice);
        let (bias, residual) = (epilogue.bias, epilogue.residual);
        let fp8 = self.format == QuantFormat::Fp8E4M3;
        let float_x = self.runs_float_x(client, x.dtype(), rows, k, workspace);
        let call = |bias, residual, out, gate| Call {
            x,
            qweight: w,
            w_scale: ws,
            bias,
            residual,
            act: (&q, &s),
            out,
            choice,
            gate,
            norm,
            may_allocate: workspace.is_none(),
            float_x,
        };
        if epilogue.activation.is_none() {
            return linear8_into(client, call(bias, residual, out, None));
        }
        if choice != KernelChoice::Portable
            && bias.is_none()
            && residual.is_none()
            && (float_x || Gemm8::<R>::can_gate(client, fp8, rows))
        {
            // Decode: SiLU(gate) * up in the skinny kernel's epilogue.
            return linear8_into(client, call(None, None, out, epilogue.activation));
        }
        unfused_epilogue(client, OP, epilogue, out, workspace, |dst, bias| {
            let call = Call {
                x,
                qweight: w,
                w_scale: ws,
                bias,
                residual: None,
                act: (&q, &s),
                out: dst,
                choice,
                gate: None,
                norm,
                may_allocate: workspace.is_none(),
                float_x,
            };
            linear8_into(client, call)
        })
    }

    /// Whether a product of `rows` rows of `dtype` runs on the float-activation decode kernel:
    /// asked for ([`KernelChoice::FloatActivations`] or [`KernelChoice::FloatActivationsSimt`]),
    /// not row-invariant, and runnable here.
    fn runs_float_x(
        &self,
        client: &ComputeClient<R>,
        dtype: DType,
        rows: usize,
        k: usize,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> bool {
        !workspace.is_some_and(LinearWorkspace::is_rows_invariant)
            && crate::gemm8::runs_float_activations(
                client,
                self.choice,
                self.format,
                dtype,
                rows,
                k,
            )
    }

    /// [`Self::run`] on `rms_norm(x)`: inside the fused decode kernel where it runs, else the
    /// norm into `normed` first.
    fn run_normed(
        &self,
        client: &ComputeClient<R>,
        input: NormedInput<'_, R>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()> {
        let fp8 = self.format == QuantFormat::Fp8E4M3;
        let x = input.x;
        let (rows, k, n) = (x.rows(), x.last_dim(), self.q.shape()[0]);
        let decode_kernel = match self.choice {
            KernelChoice::Portable => false,
            _ => Gemm8::<R>::decode_source(client, fp8, rows, k, n).is_some(),
        };
        if decode_kernel || self.runs_float_x(client, x.dtype(), rows, k, workspace) {
            return self.run(client, x, Some(input.norm), epilogue, out, workspace);
        }
        let normed = input.unfused(client)?;
        self.run(client, normed, None, epilogue, out, workspace)
    }
}

/// One call of [`linear8_into`]: the float activation, the 8-bit weight and its scales, the
/// epilogue operands, the activation scratch (codes, scales), the output, and the options.
struct Call<'a, R: Runtime> {
    x: &'a DeviceTensor<R>,
    qweight: &'a DeviceTensor<R>,
    w_scale: &'a DeviceTensor<R>,
    bias: Option<&'a DeviceTensor<R>>,
    residual: Option<&'a DeviceTensor<R>>,
    act: (&'a DeviceTensor<R>, &'a DeviceTensor<R>),
    out: &'a DeviceTensor<R>,
    choice: KernelChoice,
    gate: Option<Activation>,
    norm: Option<InputNorm<'a, R>>,
    /// The call may allocate (no workspace was given): see [`Gemm8::may_allocate`].
    may_allocate: bool,
    /// Run on the float-activation decode kernel (the caller checked that it can).
    float_x: bool,
}

/// The shared body of [`w8a8_linear_into`] and the FP8 layer: quantize `x` per row in the
/// weight's format into `scratch`, then the 8-bit GEMM with the dequantizing epilogue.
fn linear8_into<R: Runtime>(client: &ComputeClient<R>, call: Call<'_, R>) -> Result<()> {
    const OP: &str = "quantized linear";
    let Call {
        x,
        qweight,
        w_scale,
        bias,
        residual,
        act: (q, s),
        out,
        choice,
        gate,
        norm,
        may_allocate,
        float_x,
    } = call;
    let format = match qweight.dtype() {
        DType::I8 => QuantFormat::Int8,
        _ => QuantFormat::Fp8E4M3,
    };
    if q.dtype() != qweight.dtype() {
        return Err(OpsError::invalid(
            OP,
            format!(
                "the activation codes are {}, the weight is {}",
                q.dtype(),
                qweight.dtype()
            ),
        ));
    }
    caps::check_float_dtype(client, OP, x.dtype())?;
    if x.rank() == 0 || x.numel() == 0 || !x.is_contiguous() {
        return Err(OpsError::shape(
            OP,
            format!(
                "x must be a non-empty contiguous tensor, got {:?}",
                x.shape()
            ),
        ));
    }
    let (rows, k) = (x.rows(), x.last_dim());
    let w_pitch = check_byte_matrix(OP, "qweight", qweight, format.dtype())?;
    let n = qweight.shape()[0];
    if qweight.shape()[1] != k {
        return Err(OpsError::shape(
            OP,
            format!("x {:?} for a weight {:?}", x.shape(), qweight.shape()),
        ));
    }
    // Gated, the weight holds the gate rows then the up rows and the output is half as wide.
    let width = if gate.is_some() { n / 2 } else { n };
    if gate.is_some() && (!n.is_multiple_of(2) || bias.is_some() || residual.is_some()) {
        return Err(OpsError::invalid(
            OP,
            "a gated product needs an even row count and takes no bias or residual",
        ));
    }
    check_output(client, OP, out, &output_shape(x, width), bias)?;
    let residual = match residual {
        Some(r) => {
            check_same_dtype(OP, out, r)?;
            if r.shape() != out.shape() || !r.is_contiguous() {
                return Err(OpsError::shape(
                    OP,
                    format!(
                        "residual {:?} must be contiguous and shaped like the output {:?}",
                        r.shape(),
                        out.shape()
                    ),
                ));
            }
            Some(r.reshape(&[rows, n])?)
        }
        None => None,
    };
    let x2 = x.reshape(&[rows, k])?;
    let out2 = out.reshape(&[rows, width])?;
    let fp8 = format == QuantFormat::Fp8E4M3;
    let gemm = Gemm8 {
        a: q,
        a_pitch: crate::format::row_pitch(k),
        b: qweight,
        b_pitch: w_pitch,
        sa: s,
        sa_scalar: false,
        sb: w_scale,
        sb_scalar: check_scales(OP, "w_scale", w_scale, n, true)?,
        bias,
        residual: residual.as_ref(),
        out: &out2,
        m: rows,
        n,
        k,
        fp8,
        gate,
        norm,
        may_allocate,
    };
    let source = match choice {
        KernelChoice::Portable => None,
        _ => Gemm8::<R>::decode_source(client, fp8, rows, k, n),
    };
    // Per-channel weight scales (a single scale goes the codes path).
    let float_x = float_x && w_scale.numel() == n;
    if let Some(nm) = norm {
        ops::norm::check_eps(OP, nm.eps)?;
        ops::norm::check_weight(OP, x, nm.weight)?;
        if source.is_none() && !float_x {
            return Err(OpsError::invalid(
                OP,
                "an input norm is applied only at decode sizes by the tensor-core kernel",
            ));
        }
    }
    if float_x {
        let epilogue = NkEpilogue {
            bias,
            residual: residual.as_ref(),
            gate,
            norm,
        };
        let launch = if choice == KernelChoice::FloatActivationsSimt {
            float_x_simt::gemv_float_x_simt
        } else {
            float_x::gemv_float_x
        };
        launch(
            client,
            &x2,
            qweight,
            w_pitch,
            w_scale,
            fp8,
            epilogue,
            &out2,
            [rows, k, width],
        );
        return Ok(());
    }
    match source {
        // Decode: the GEMM quantizes the activation itself (one launch instead of two; the
        // scratch is not written).
        Some(XSource::Quantize) => gemm.launch_skinny(client, Some(&x2)),
        // The pre-pass (normalizing first where asked: decode sizes only, checked above) into
        // the scratch's views, then the GEMM reading its codes.
        _ => {
            crate::rowquant::launch_rows(client, &x2, norm, format, q, gemm.a_pitch, s);
            Gemm8 { norm: None, ..gemm }.launch(client, choice);
        }
    }
    Ok(())
}

/// W8A8: `y = x · wᵀ (+ b)` with `x[.., K]` float (quantized per row to int8 here), `qweight`
/// an int8 `[N, K]` padded matrix and `w_scale[N]` its per-channel scales.
pub fn w8a8_linear<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight: &DeviceTensor<R>,
    w_scale: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
) -> Result<DeviceTensor<R>> {
    let n = qweight.shape().first().copied().unwrap_or(0);
    let out = DeviceTensor::empty(client, &output_shape(x, n), x.dtype());
    let scratch = ActScratch::new(client, x.rows(), x.last_dim(), QuantFormat::Int8);
    w8a8_linear_into(client, x, qweight, w_scale, bias, &scratch, &out)?;
    Ok(out)
}

/// [`w8a8_linear`] into a preallocated `out`, with the quantized activation in `scratch`
/// (int8, at least `x`'s rows and K): allocates nothing.
pub fn w8a8_linear_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight: &DeviceTensor<R>,
    w_scale: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
    scratch: &ActScratch<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    if scratch.format != QuantFormat::Int8 || qweight.dtype() != DType::I8 {
        return Err(OpsError::invalid(
            "w8a8_linear",
            "the weight and the activation scratch must be int8",
        ));
    }
    let (q, s) = scratch.views("w8a8_linear", x.rows(), x.last_dim())?;
    let call = Call {
        x,
        qweight,
        w_scale,
        bias,
        residual: None,
        act: (&q, &s),
        out,
        choice: KernelChoice::default(),
        gate: None,
        norm: None,
        may_allocate: false,
        float_x: false,
    };
    linear8_into(client, call)
}

macro_rules! linear8_layer {
    ($name:ident, $format:expr, $what:literal) => {
        #[doc = concat!("A linear layer with ", $what, " weights and activations, quantized per output channel at")]
        /// construction from a float weight, which is not kept: there is no way to change the
        /// weight afterwards, so the quantized copy can never go stale. The bias and residual
        /// come with the [`Epilogue`] and are added in the GEMM's epilogue.
        pub struct $name<R: Runtime> {
            inner: Weight8<R>,
        }

        impl<R: Runtime> $name<R> {
            /// Quantizes `weight[out_features, in_features]` (row-major f32); `act_dtype` is the
            /// float dtype of `x` and `y`.
            pub fn from_dense(
                client: &ComputeClient<R>,
                weight: &[f32],
                shape: [usize; 2],
                act_dtype: DType,
            ) -> Result<Self> {
                let inner = Weight8::from_dense(client, weight, shape, act_dtype, $format)?;
                Ok(Self { inner })
            }

            /// The layer of a weight already quantized in this format on the host
            /// ([`crate::host::quantize_weight_8bit`]); `act_dtype` is the float dtype of `x`
            /// and `y`.
            pub fn from_quantized(
                client: &ComputeClient<R>,
                weight: &QuantizedWeight8,
                act_dtype: DType,
            ) -> Result<Self> {
                caps::check_float_dtype(client, "quantized linear", act_dtype)?;
                if weight.format != $format {
                    return Err(OpsError::invalid(
                        "quantized linear",
                        format!("a {:?} weight for a {:?} layer", weight.format, $format),
                    ));
                }
                Ok(Self { inner: Weight8::upload(client, weight)? })
            }

            /// Runs the GEMM with `choice` instead of the default kernel.
            pub fn with_kernel(mut self, choice: KernelChoice) -> Self {
                self.inner.choice = choice;
                self
            }
        }

        impl<R: Runtime> Linear<R> for $name<R> {
            fn shape(&self) -> [usize; 2] {
                [self.inner.q.shape()[0], self.inner.q.shape()[1]]
            }

            fn forward_into(
                &self,
                client: &ComputeClient<R>,
                x: &DeviceTensor<R>,
                epilogue: Epilogue<'_, R>,
                out: &DeviceTensor<R>,
                workspace: Option<&LinearWorkspace<R>>,
            ) -> Result<()> {
                self.inner.run(client, x, None, epilogue, out, workspace)
            }

            /// At decode sizes on CUDA the skinny kernel normalizes x as it quantizes it.
            fn forward_normed_into(
                &self,
                client: &ComputeClient<R>,
                input: NormedInput<'_, R>,
                epilogue: Epilogue<'_, R>,
                out: &DeviceTensor<R>,
                workspace: Option<&LinearWorkspace<R>>,
            ) -> Result<()> {
                self.inner
                    .run_normed(client, input, epilogue, out, workspace)
            }

            /// Device bytes of the codes (rows padded to 16 bytes) and scales.
            fn weight_bytes(&self) -> usize {
                self.inner.bytes()
            }

            fn describe(&self) -> String {
                $what.into()
            }
        }
    };
}

linear8_layer!(W8A8Linear, QuantFormat::Int8, "int8 (W8A8)");
linear8_layer!(Fp8Linear, QuantFormat::Fp8E4M3, "fp8 e4m3");
