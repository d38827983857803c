//! [`W4A16Linear`]: the int4 layer. Its weight is stored column-major (`crate::w4a16_nk`), the
//! layout of its decode GEMVs (on the tensor cores, `crate::w4a16_mma`, where the runtime and
//! shape allow, else on the CUDA cores), which fuse the input norm and the whole epilogue.
//! Prefill on CUDA runs the int4 tensor-core GEMM (`crate::w4a16_gemm`) with the whole epilogue;
//! elsewhere, or where K or the groups are not whole 32-k steps, it dequantizes the weight and
//! runs the dense GEMM.

use cubecl::prelude::*;
use ops::launch::check_same_dtype;
use ops::linear::{unfused_epilogue, Epilogue, Linear, LinearWorkspace, NormedInput};
use ops::matmul::InputNorm;
use ops::{caps, DType, DeviceTensor, OpsError, Result};

use crate::layout::{check_output, output_shape};
use crate::w4a16::GEMV_MAX_M;
use crate::w4a16_nk::NkEpilogue;

/// `y = x · Wᵀ` with `W[out_features, in_features]` quantized to int4 (per output channel, or
/// per group of `group_size` input features) when the layer is built; the bias, residual and
/// gated activation come with the [`Epilogue`], and an input RMSNorm with
/// [`Linear::forward_normed_into`]: up to 16 rows the int4 GEMV applies them all; above, the
/// norm runs before the product, and the int4 GEMM (CUDA) applies the epilogue, else it runs
/// around the dense GEMM.
///
/// The float weight is quantized once in [`W4A16Linear::from_dense`] and not kept, and the layer
/// exposes no way to change its weight: it cannot go stale. A new float weight means a new layer.
pub struct W4A16Linear<R: Runtime> {
    qweight: DeviceTensor<R>,
    scales: DeviceTensor<R>,
    group_size: Option<usize>,
    in_features: usize,
    out_features: usize,
    act_dtype: DType,
}

impl<R: Runtime> Clone for W4A16Linear<R> {
    fn clone(&self) -> Self {
        Self {
            qweight: self.qweight.clone(),
            scales: self.scales.clone(),
            group_size: self.group_size,
            in_features: self.in_features,
            out_features: self.out_features,
            act_dtype: self.act_dtype,
        }
    }
}

impl<R: Runtime> W4A16Linear<R> {
    /// Quantizes a host float weight `[out_features, in_features]` (row-major f32, PyTorch's
    /// layout) with [`crate::host::quantize_weight_int4`]; `act_dtype` is the float dtype of x
    /// and y. `in_features` must be a multiple of 8 and of `group_size` (64 or 128 are usual;
    /// `None` = one scale per output channel).
    pub fn from_dense(
        client: &ComputeClient<R>,
        weight: &[f32],
        shape: [usize; 2],
        act_dtype: DType,
        group_size: Option<usize>,
    ) -> Result<Self> {
        const OP: &str = "W4A16Linear::from_dense";
        caps::check_float_dtype(client, OP, act_dtype)?;
        let [out_features, in_features] = shape;
        if out_features.checked_mul(in_features) != Some(weight.len()) {
            return Err(OpsError::shape(
                OP,
                format!("{} values for a weight of shape {shape:?}", weight.len()),
            ));
        }
        let q = crate::host::quantize_weight_int4(weight, out_features, in_features, group_size)?;
        // Stored column-major (see `crate::w4a16_nk`): the decode GEMV's layout.
        let (packed, scales) = crate::w4a16_nk::transpose_to_nk(&q);
        let groups = scales.len() / out_features;
        let qweight = DeviceTensor::from_slice(client, &packed, &[out_features, in_features / 8])?;
        let scales = DeviceTensor::from_slice(client, &scales, &[out_features, groups])?;
        Ok(Self {
            qweight,
            scales,
            group_size,
            in_features,
            out_features,
            act_dtype,
        })
    }

    /// The group size along K (`None`: per output channel).
    pub fn group_size(&self) -> Option<usize> {
        self.group_size
    }

    /// The float dtype of x and y.
    pub fn act_dtype(&self) -> DType {
        self.act_dtype
    }

    /// Whether a forward pass over `rows` rows runs the int4 GEMV on the tensor cores (CUDA
    /// with the bf16/f16 `mma`, at most 16 rows, in_features a multiple of 32, groups of a
    /// multiple of 128 or one per output channel); otherwise up to 16 rows run the CUDA-core
    /// (portable) GEMV.
    pub fn decodes_on_tensor_cores(&self, client: &ComputeClient<R>, rows: usize) -> bool {
        let k = self.in_features;
        crate::w4a16_mma::can_run(
            client,
            self.act_dtype,
            rows,
            k,
            self.group_size.unwrap_or(k),
        )
    }

    /// Whether a forward pass over more than 16 rows (prefill) runs the int4 tensor-core GEMM
    /// with the epilogue fused (CUDA with the bf16/f16 `mma`, in_features and the group a
    /// multiple of 32); otherwise the weight is dequantized and the dense GEMM runs.
    pub fn prefills_on_tensor_cores(&self, client: &ComputeClient<R>) -> bool {
        let k = self.in_features;
        crate::w4a16_gemm::can_run(client, self.act_dtype, k, self.group_size.unwrap_or(k))
    }

    /// `x · Wᵀ + bias` into `out` for more than 16 rows where the int4 GEMM cannot run: the
    /// weight is dequantized into a temporary `[out, in]` matrix of the activation dtype and the
    /// dense GEMM runs on it, so prefill needs that much transient memory for the largest layer.
    fn product_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        bias: Option<&DeviceTensor<R>>,
        out: &DeviceTensor<R>,
    ) -> Result<()> {
        const OP: &str = "W4A16Linear::forward";
        check_same_dtype(OP, x, out)?;
        check_output(client, OP, out, &output_shape(x, self.out_features), bias)?;
        let (n, k) = (self.out_features, self.in_features);
        let group = self.group_size.unwrap_or(k);
        // On an H100, 4096^3 took 7 ms in the SIMT tiled kernel the free function uses.
        let w = crate::w4a16_nk::dequantize_nk(
            client,
            &self.qweight,
            &self.scales,
            group,
            [n, k],
            x.dtype(),
        );
        ops::matmul::linear_into(client, x, &w, bias, None, out)
    }

    /// Validates the epilogue and the output for a fused product over `x` (and the norm, if
    /// any); returns the output width (half the rows when gated) and what the int4 kernels
    /// apply after the product.
    fn fused_epilogue<'a>(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        norm: Option<InputNorm<'a, R>>,
        epilogue: Epilogue<'a, R>,
        out: &DeviceTensor<R>,
    ) -> Result<(usize, NkEpilogue<'a, R>)> {
        const OP: &str = "W4A16Linear::forward";
        if let Some(nm) = norm {
            ops::norm::check_eps(OP, nm.eps)?;
            ops::norm::check_weight(OP, x, nm.weight)?;
        }
        let n = epilogue.out_width(self.out_features);
        if epilogue.activation.is_some()
            && (!self.out_features.is_multiple_of(2)
                || epilogue.bias.is_some()
                || epilogue.residual.is_some())
        {
            return Err(OpsError::invalid(
                OP,
                "a gated epilogue needs an even row count and takes no bias or residual",
            ));
        }
        check_same_dtype(OP, x, out)?;
        check_output(client, OP, out, &output_shape(x, n), epilogue.bias)?;
        if let Some(r) = epilogue.residual {
            check_same_dtype(OP, x, r)?;
            if r.shape() != out.shape() || !r.is_contiguous() {
                return Err(OpsError::shape(
                    OP,
                    format!("residual {:?}, expected {:?}", r.shape(), out.shape()),
                ));
            }
        }
        let nk = NkEpilogue {
            bias: epilogue.bias,
            residual: epilogue.residual,
            gate: epilogue.activation,
            norm,
        };
        Ok((n, nk))
    }

    /// The decode GEMV (M <= 16) with `epilogue` fused in; allocates nothing (safe inside CUDA
    /// graph capture).
    fn gemv_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        norm: Option<InputNorm<'_, R>>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
    ) -> Result<()> {
        let (n, nk_epilogue) = self.fused_epilogue(client, x, norm, epilogue, out)?;
        let (m, k) = (x.rows(), self.in_features);
        let group = self.group_size.unwrap_or(k);
        let gemv = if crate::w4a16_mma::can_run(client, x.dtype(), m, k, group) {
            crate::w4a16_mma::gemv_mma
        } else {
            crate::w4a16_nk::gemv_nk
        };
        gemv(
            client,
            x,
            &self.qweight,
            &self.scales,
            group,
            nk_epilogue,
            out,
            m,
            k,
            n,
        )
    }

    /// The tensor-core GEMM above 16 rows (prefill) with `epilogue` fused in, the weight read as
    /// it is stored; where the caller gives no workspace, K may be split over a scratch
    /// allocated per call.
    fn gemm_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        may_allocate: bool,
    ) -> Result<()> {
        let (n, nk_epilogue) = self.fused_epilogue(client, x, None, epilogue, out)?;
        let k = self.in_features;
        crate::w4a16_gemm::gemm(
            client,
            x,
            &self.qweight,
            &self.scales,
            self.group_size.unwrap_or(k),
            nk_epilogue,
            out,
            [x.rows(), k, n],
            may_allocate,
        )
    }

    fn check_x(&self, x: &DeviceTensor<R>) -> Result<()> {
        if x.dtype() != self.act_dtype {
            return Err(OpsError::UnsupportedDType {
                op: "W4A16Linear::forward",
                dtype: x.dtype(),
                runtime: "any",
                detail: format!("the layer was built for {} activations", self.act_dtype),
            });
        }
        if x.rank() == 0 || x.numel() == 0 || !x.is_contiguous() {
            return Err(OpsError::shape(
                "W4A16Linear::forward",
                format!(
                    "x must be a non-empty contiguous tensor, got {:?}",
                    x.shape()
                ),
            ));
        }
        if x.last_dim() != self.in_features {
            return Err(OpsError::shape(
                "W4A16Linear::forward",
                format!(
                    "x {:?} does not end in in_features = {}",
                    x.shape(),
                    self.in_features
                ),
            ));
        }
        Ok(())
    }
}

impl<R: Runtime> Linear<R> for W4A16Linear<R> {
    fn shape(&self) -> [usize; 2] {
        [self.out_features, self.in_features]
    }

    fn forward_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()> {
        self.check_x(x)?;
        if x.rows() <= GEMV_MAX_M {
            return self.gemv_into(client, x, None, epilogue, out);
        }
        // x has the layer's dtype (checked above), which is what the choice is made for.
        if self.prefills_on_tensor_cores(client) {
            return self.gemm_into(client, x, epilogue, out, workspace.is_none());
        }
        unfused_epilogue(
            client,
            "W4A16Linear::forward",
            epilogue,
            out,
            workspace,
            |dst, bias| self.product_into(client, x, bias, dst),
        )
    }

    /// Up to 16 rows the norm runs inside the GEMV (each cube reduces x's squares itself).
    fn forward_normed_into(
        &self,
        client: &ComputeClient<R>,
        input: NormedInput<'_, R>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()> {
        self.check_x(input.x)?;
        if input.x.rows() <= GEMV_MAX_M {
            return self.gemv_into(client, input.x, Some(input.norm), epilogue, out);
        }
        let normed = input.unfused(client)?;
        self.forward_into(client, normed, epilogue, out, workspace)
    }

    /// Device bytes of the packed weight and the f32 scales.
    fn weight_bytes(&self) -> usize {
        4 * (self.qweight.numel() + self.scales.numel())
    }

    fn describe(&self) -> String {
        match self.group_size {
            Some(g) => format!("int4, group {g} (W4A16)"),
            None => "int4, per channel (W4A16)".into(),
        }
    }
}
