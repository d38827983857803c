//! Cases for `ops::attention`: the 1.5B model's heads (12 query / 2 KV heads, head dim 128).
//!
//! - `prefill causal L<L> h12/2 d128`: `L` queries against `L` keys, causal. FLOPs count the
//!   visible pairs only (`4 * D * Hq * L(L+1)/2`: two matmuls of 2 FLOPs per multiply-add);
//!   bytes are q, k, v read once and out written once.
//! - `decode L<L> h12/2 d128`: one query against `L` keys; bytes are the K/V rows read once
//!   (`2 * L * Hkv * D * 2`) plus q and out, the floor a decode step must move.
//! - `decode cached devlen L<L> ...`: the same through [`ops::attention::attention_cached_into`]
//!   with the length in a device buffer (the CUDA-graph form); its split count is sized from
//!   `max_len` (here equal to `L`).
//! - `decode graph L<L> ...` (CUDA only): the cached decode step captured once as a CUDA graph and
//!   replayed, as the model's decode loop runs; this removes the host's launch overhead, which
//!   otherwise dominates a step that moves a few MB.
//!
//! [`cases`] runs the kernels [`AttentionStrategy::Auto`] picks, with the library's default tile
//! shapes. A tile sweep builds an [`AttentionTuning`] (by hand or with [`AttentionTuning::parse`]
//! from `"prefill=WARPS,BK;decode=WARPS,BK,CUBES_PER_SM"`) and calls [`cases_tuned`]: the prefill
//! cases then force the tensor-core prefill kernel with its tiling, the decode cases the
//! tensor-core decode kernel with its (runtimes without tensor cores fail those cases).

use cubecl::prelude::*;
use ops::attention::{
    attention_cached_into_with, attention_into_with, AttentionStrategy, AttentionWorkspace,
    FlashTiling, KvLen, SplitKvTiling,
};
use ops::{caps, DType, DeviceTensor};

use super::Case;

const HQ: usize = 12;
const HKV: usize = 2;
const D: usize = 128;

fn filled<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &[usize],
    dtype: DType,
    seed: u32,
) -> DeviceTensor<R> {
    let n: usize = shape.iter().product();
    // Deterministic values in [-1, 1] with some spread, so the softmax is not flat.
    let data: Vec<f32> = (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97));
            (x >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect();
    DeviceTensor::from_f32(client, &data, shape, dtype).unwrap()
}

/// Tile shapes a benchmark sweep forces on the tensor-core kernels (`None`: the automatic choice
/// with the library's defaults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionTuning {
    pub prefill: Option<FlashTiling>,
    pub decode: Option<SplitKvTiling>,
}

impl AttentionTuning {
    /// Parses `"prefill=WARPS,BK;decode=WARPS,BK,CUBES_PER_SM"` (either part may be left out).
    /// The values themselves are checked by the library when a case runs.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut tuning = Self::default();
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, vals) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}` is not KEY=VALUES"))?;
            let v = vals
                .split(',')
                .map(|x| x.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("`{part}`: {e}"))?;
            match (key.trim(), v.as_slice()) {
                ("prefill", &[warps, bk]) => tuning.prefill = Some(FlashTiling { warps, bk }),
                ("decode", &[warps, bk, cubes_per_sm]) => {
                    tuning.decode = Some(SplitKvTiling {
                        warps,
                        bk,
                        cubes_per_sm,
                    })
                }
                _ => {
                    return Err(format!(
                        "`{part}`: expected prefill=WARPS,BK or decode=WARPS,BK,CUBES_PER_SM"
                    ))
                }
            }
        }
        Ok(tuning)
    }

    fn prefill_strategy(&self) -> AttentionStrategy {
        self.prefill
            .map_or(AttentionStrategy::Auto, AttentionStrategy::TensorCore)
    }

    fn decode_strategy(&self) -> AttentionStrategy {
        self.decode
            .map_or(AttentionStrategy::Auto, AttentionStrategy::TensorCoreDecode)
    }

    /// What the case names say about the forced tiles (nothing for the defaults).
    fn suffix(tiling: Option<String>) -> String {
        tiling.map_or(String::new(), |t| format!(" [{t}]"))
    }
}

/// The cases with the automatic kernel choice and the default tile shapes.
pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    cases_tuned(client, &AttentionTuning::default())
}

/// The cases with the tensor-core tile shapes of `tuning` forced where it gives them.
pub fn cases_tuned<'a, R: Runtime>(
    client: &'a ComputeClient<R>,
    tuning: &AttentionTuning,
) -> Vec<Case<'a>> {
    let mut out = Vec::new();
    let (prefill, decode) = (tuning.prefill_strategy(), tuning.decode_strategy());
    let prefill_tag = AttentionTuning::suffix(
        tuning
            .prefill
            .map(|t| format!("warps {} bk {}", t.warps, t.bk)),
    );
    let decode_tag = AttentionTuning::suffix(
        tuning
            .decode
            .map(|t| format!("warps {} bk {} cubes/SM {}", t.warps, t.bk, t.cubes_per_sm)),
    );
    let scale = 1.0 / (D as f32).sqrt();
    for dtype in [DType::BF16, DType::F16] {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        let e = dtype.size() as f64;
        let prefill_lens: &[usize] = if dtype == DType::BF16 {
            &[512, 2048, 8192]
        } else {
            &[2048]
        };
        for &l in prefill_lens {
            let q = filled(client, &[l, HQ, D], dtype, 1);
            let k = filled(client, &[l, HKV, D], dtype, 2);
            let v = filled(client, &[l, HKV, D], dtype, 3);
            let o = DeviceTensor::empty(client, &[l, HQ, D], dtype);
            let pairs = (l * (l + 1) / 2) as f64;
            out.push(Case {
                name: format!("prefill causal L{l} h{HQ}/{HKV} d{D}{prefill_tag}"),
                dtype,
                bytes: e * (2 * l * HQ * D + 2 * l * HKV * D) as f64,
                flops: 4.0 * (D * HQ) as f64 * pairs,
                run: Box::new(move || {
                    attention_into_with(client, &q, &k, &v, scale, true, &o, prefill).unwrap()
                }),
            });
        }
        let decode_lens: &[usize] = if dtype == DType::BF16 {
            &[1024, 4096, 32768]
        } else {
            &[4096]
        };
        for &l in decode_lens {
            let q = filled(client, &[1, HQ, D], dtype, 4);
            let k = filled(client, &[l, HKV, D], dtype, 5);
            let v = filled(client, &[l, HKV, D], dtype, 6);
            let o = DeviceTensor::empty(client, &[1, HQ, D], dtype);
            let bytes = e * (2 * l * HKV * D + 2 * HQ * D) as f64;
            let flops = 4.0 * (l * D * HQ) as f64;
            let (q2, k2, v2, o2) = (q.clone(), k.clone(), v.clone(), o.clone());
            out.push(Case {
                name: format!("decode L{l} h{HQ}/{HKV} d{D}{decode_tag}"),
                dtype,
                bytes,
                flops,
                run: Box::new(move || {
                    attention_into_with(client, &q2, &k2, &v2, scale, false, &o2, decode).unwrap()
                }),
            });
            if l == 32768 && caps::has_plane_ops(client) {
                // The plane-shuffle decode kernel on the same problem, for comparison.
                let (q2, k2, v2, o2) = (q.clone(), k.clone(), v.clone(), o.clone());
                out.push(Case {
                    name: format!("decode plane-kernel L{l} h{HQ}/{HKV} d{D}"),
                    dtype,
                    bytes,
                    flops,
                    run: Box::new(move || {
                        attention_into_with(
                            client,
                            &q2,
                            &k2,
                            &v2,
                            scale,
                            false,
                            &o2,
                            AttentionStrategy::Decode,
                        )
                        .unwrap()
                    }),
                });
            }
            let len = DeviceTensor::from_slice(client, &[l as u32], &[1]).unwrap();
            // The model's decode step passes a preallocated workspace (nothing is allocated
            // inside the graph).
            let ws = std::rc::Rc::new(match tuning.decode {
                // `for_shapes` has room for up to 2 cubes per SM.
                Some(t) if t.cubes_per_sm > 2 => {
                    let splits = t.cubes_per_sm * caps::num_sms(client) as usize;
                    AttentionWorkspace::new(client, splits * HQ, D)
                }
                _ => AttentionWorkspace::for_shapes(client, 1, HQ, HKV, D, l),
            });
            // One decode step; the graph case captures a copy of it.
            let step = move || {
                attention_cached_into_with(
                    client,
                    &q,
                    &k,
                    &v,
                    KvLen::Device(&len),
                    scale,
                    &o,
                    Some(&ws),
                    decode,
                )
                .unwrap()
            };
            if let Some(graph) = super::capture(client, step.clone()) {
                out.push(Case {
                    name: format!("decode graph L{l} h{HQ}/{HKV} d{D}{decode_tag}"),
                    dtype,
                    bytes,
                    flops,
                    // SAFETY: every buffer the graph uses is owned by the closure's captures
                    // (kept alive by the graph's retained handles) and nothing reallocates them.
                    run: Box::new(move || unsafe { graph.replay() }),
                });
            }
            out.push(Case {
                name: format!("decode cached devlen L{l} h{HQ}/{HKV} d{D}{decode_tag}"),
                dtype,
                bytes,
                flops,
                run: Box::new(step),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::AttentionTuning;
    use ops::attention::{FlashTiling, SplitKvTiling};

    /// Either part, both, spaces, and the errors that name the part at fault.
    #[test]
    fn tuning_specs_parse() {
        let both = AttentionTuning::parse(" prefill=4,64 ; decode=8,128,1 ").unwrap();
        assert_eq!(both.prefill, Some(FlashTiling { warps: 4, bk: 64 }));
        assert_eq!(
            both.decode,
            Some(SplitKvTiling {
                warps: 8,
                bk: 128,
                cubes_per_sm: 1
            })
        );
        let decode = AttentionTuning::parse("decode=2,64,2").unwrap();
        assert_eq!(decode.prefill, None);
        assert_eq!(
            AttentionTuning::parse("").unwrap(),
            AttentionTuning::default()
        );
        for bad in [
            "decode=8,128",
            "prefill=4",
            "decode=a,1,1",
            "tile=1,2",
            "decode",
        ] {
            let e = AttentionTuning::parse(bad).unwrap_err();
            assert!(e.contains('`'), "{bad}: {e}");
        }
    }
}
