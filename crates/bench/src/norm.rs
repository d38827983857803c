//! Cases for `ops::norm`: a 4096 x 4096 tensor and the 1.5B
//! model's hidden size at decode (1 row) and prefill (512 rows).

use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor};

use super::Case;

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        for (rows, n) in [(4096usize, 4096usize), (512, 1536), (1, 1536)] {
            // Random operands like PyTorch's `randn` (see `super::randn`).
            let x = super::randn_tensor(client, &[rows, n], dtype, 1.0, 1);
            let r = super::randn_tensor(client, &[rows, n], dtype, 1.0, 2);
            let w = super::randn_tensor(client, &[n], dtype, 1.0, 3);
            let o = DeviceTensor::empty(client, &[rows, n], dtype);
            let s = DeviceTensor::empty(client, &[rows, n], dtype);
            let e = dtype.size() as f64;
            let (x2, w2, o2) = (x.clone(), w.clone(), o.clone());
            out.push(Case {
                name: format!("rms_norm {rows}x{n}"),
                dtype,
                bytes: e * (2 * rows * n + n) as f64,
                flops: 0.0,
                run: Box::new(move || {
                    ops::norm::rms_norm_into(client, &x2, &w2, 1e-6, &o2).unwrap()
                }),
            });
            out.push(Case {
                name: format!("rms_norm_residual {rows}x{n}"),
                dtype,
                bytes: e * (4 * rows * n + n) as f64,
                flops: 0.0,
                run: Box::new(move || {
                    ops::norm::rms_norm_residual_into(client, &x, &r, &w, 1e-6, &o, &s).unwrap()
                }),
            });
        }
    }
    out
}
