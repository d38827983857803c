//! The screened LM head of greedy decoding ([`crate::LoadOptions::screen_lm_head`]): an int8
//! copy of the float head computes approximate logits with half its bytes, and
//! [`ops::argmax::screened`] turns them into the float head's argmax exactly, computing again
//! from the float head only the rows whose bound reaches the best lower bound. Only the decode
//! steps that run on the previous step's argmax (greedy decoding one step ahead of the host) use
//! it; their full logits are computed afterwards only when someone asks for them.

use cubecl::prelude::*;
use ops::argmax::screened::ScreenScratch;
use ops::{DType, DeviceTensor};
use quant::screen::ScreeningHead;

use crate::error::{ModelError, Result};

/// The int8 copy of the head and its bounds.
pub(crate) struct HeadScreen<R: Runtime> {
    pub head: ScreeningHead<R>,
}

impl<R: Runtime> HeadScreen<R> {
    /// The screen of the float head `w` (`[V, H]`, as the device holds it): read back to the
    /// host once, quantized there.
    pub fn build(client: &ComputeClient<R>, w: &DeviceTensor<R>) -> Result<Self> {
        let [v, h] = w.shape()[..] else {
            unreachable!("the LM head is a matrix (checked by plan_weights)")
        };
        if !quant::screen::can_screen(client, w.dtype(), h) {
            return Err(ModelError::param(
                "screen_lm_head",
                format!(
                    "the screened LM head needs a hidden size that is a multiple of 16 (the \
                     8-bit GEMV it runs), not {h}"
                ),
            ));
        }
        let values = w.to_f32_vec(client)?;
        let head = quant::screen::screening_head(client, &values, [v, h], w.dtype())?;
        Ok(Self { head })
    }

    /// Device bytes of the copy and its coefficients.
    pub fn bytes(&self) -> usize {
        use ops::linear::Linear;
        self.head.linear.weight_bytes() + self.head.coef.numel() * 4
    }
}

/// Device bytes a screen of a `[vocab, hidden]` head adds (int8 codes, f32 scales and
/// coefficients), for the memory check before loading.
pub(crate) fn planned_bytes(vocab: usize, hidden: usize) -> u64 {
    (vocab * (quant::format::row_pitch(hidden) + 8)) as u64
}

/// What a decode step's screened argmax writes: the approximate logits and the argmax's scratch.
pub struct ScreenBuffers<R: Runtime> {
    pub approx: DeviceTensor<R>,
    pub scratch: ScreenScratch<R>,
}

impl<R: Runtime> ScreenBuffers<R> {
    pub(crate) fn new(client: &ComputeClient<R>, vocab: usize, dtype: DType) -> Result<Self> {
        Ok(Self {
            approx: DeviceTensor::empty(client, &[1, vocab], dtype),
            scratch: ScreenScratch::new(client, vocab)?,
        })
    }
}
