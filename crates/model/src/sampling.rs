//! Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus),
//! repetition penalty, with a seeded generator so that a seed always gives the same text.
//!
//! The order is transformers': repetition penalty, then temperature, top-k, top-p, then a draw
//! from the renormalised distribution. The draw walks the kept ids in ascending id order and
//! takes the first whose cumulative probability exceeds a uniform `u` of the seeded stream (one
//! per sampled token): the order `ops::sampling` draws in on the device, so that the host and
//! the device choose the same token for the same `u` (up to rounding: f64 here, f32 weights and
//! fixed-point sums there).
//!
//! [`crate::Session`] samples on the device and reads back one id
//! ([`crate::CausalLm::sample_on_device`]); [`Sampler`] is the host fallback for models that do
//! not, and the server's batched decode samples its sampled requests here from the logits.
//!
//! - `temperature == 0` means greedy (argmax; transformers calls that `do_sample=False`).
//! - `top_k == 0` disables top-k (as in transformers); `top_p == 1` disables top-p.
//! - The repetition penalty (CTRL paper, as transformers implements it) divides positive and
//!   multiplies negative logits of every token already in the context — prompt included — by
//!   `penalty`; `1` disables it.
//!
//! The random generator is xoshiro256** seeded through splitmix64, written here rather than
//! taken from `rand` so that the stream for a seed is fixed by this crate and cannot change with
//! a dependency update.

use crate::config::GenerationConfig;
use crate::error::{ModelError, Result};

/// Sampling parameters; see the module docs for their meaning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Greedy decoding.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Errors on values that have no meaning: a negative or NaN temperature, a top-p outside
    /// (0, 1], a repetition penalty that is not a positive finite number.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ModelError::param(
                "temperature",
                format!(
                    "{} (must be a finite number >= 0; 0 means greedy)",
                    self.temperature
                ),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ModelError::param(
                "top_p",
                format!("{} (must be in (0, 1]; 1 disables top-p)", self.top_p),
            ));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(ModelError::param(
                "repetition_penalty",
                format!(
                    "{} (must be a finite number > 0; 1 disables it)",
                    self.repetition_penalty
                ),
            ));
        }
        Ok(())
    }

    /// True when the choice is the plain argmax of the logits (no penalty, no randomness): the
    /// decode step's own device argmax makes it. Other parameters sample on the device where the
    /// model offers it ([`crate::CausalLm::sample_on_device`]), else on the host.
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature == 0.0 && self.repetition_penalty == 1.0
    }

    /// The parameters of `ops::sampling` (a top-k beyond u32 keeps everything, as it does here).
    pub fn row_params(&self) -> ops::sampling::RowParams {
        ops::sampling::RowParams {
            temperature: self.temperature,
            top_k: u32::try_from(self.top_k).unwrap_or(0),
            top_p: self.top_p,
            repetition_penalty: self.repetition_penalty,
        }
    }
}

/// Sampling values a caller asked for; `None` leaves the choice to [`resolve`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingOverrides {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

/// The parameters of one generation: what the caller asked for, else the model's
/// `generation_config.json` where it asks for sampling (`do_sample: true`), else greedy. Asking
/// for top-k or top-p without a temperature samples at the config's temperature (else 1). The
/// result is not validated ([`SamplingParams::validate`]).
pub fn resolve(asked: &SamplingOverrides, gc: &GenerationConfig, seed: u64) -> SamplingParams {
    let from_config = gc.do_sample == Some(true);
    let wants_sampling = from_config || asked.top_k.is_some() || asked.top_p.is_some();
    let temperature = asked.temperature.unwrap_or(if wants_sampling {
        gc.temperature.map(|t| t as f32).unwrap_or(1.0)
    } else {
        0.0
    });
    SamplingParams {
        temperature,
        top_k: asked
            .top_k
            .or(if from_config { gc.top_k } else { None })
            .unwrap_or(0),
        top_p: asked
            .top_p
            .or(if from_config {
                gc.top_p.map(|p| p as f32)
            } else {
                None
            })
            .unwrap_or(1.0),
        repetition_penalty: asked
            .repetition_penalty
            .or(gc.repetition_penalty.map(|p| p as f32))
            .unwrap_or(1.0),
        seed,
    }
}

/// xoshiro256** (Blackman & Vigna), seeded with splitmix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [-1, 1) (used by the demo model's weights: exact arithmetic, so the same
    /// bytes on every platform).
    pub fn next_signed_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32) * (1.0 / (1u64 << 23) as f32) - 1.0
    }
}

/// Index of the largest value (the first on ties); NaN values are never chosen. `None` when
/// there is no non-NaN value.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// Applies the repetition penalty in place to every distinct id of `context` inside the vocabulary.
pub fn apply_repetition_penalty(logits: &mut [f32], context: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut seen = vec![false; logits.len()];
    for &id in context {
        let i = id as usize;
        if i < logits.len() && !seen[i] {
            seen[i] = true;
            let l = &mut logits[i];
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// A sort key whose ascending order is the candidates' order: value descending (as
/// `f32::total_cmp` orders values), then id ascending (how ties are broken). Sorting plain
/// integers instead of ids compared through the logits is several times faster on a 150k
/// vocabulary (no indirect loads in the comparisons).
fn desc_key(value: f32, id: u32) -> u64 {
    let b = value.to_bits();
    // total_cmp's order as an unsigned integer: negative values have every bit flipped, the
    // others only the sign bit.
    let ascending = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    (u64::from(!ascending) << 32) | u64::from(id)
}

fn key_id(key: u64) -> u32 {
    key as u32
}

/// The ids that survive top-k and top-p on (temperature-scaled) logits.
///
/// With neither mask active every id with a logit above `-inf` is returned in ascending id
/// order; otherwise the kept ids come in (logit desc, id asc) order. Top-p keeps the smallest
/// such prefix whose probability (renormalised after top-k) reaches `top_p`, and at least one id.
/// It sorts only as much of the vocabulary as it needs: the candidates are partitioned around
/// the 64 (then 256, 1024, ...) largest until the prefix reaches `top_p`, so a 150k vocabulary
/// costs a few linear passes per token instead of a full sort.
pub fn candidates(logits: &[f32], top_k: usize, top_p: f32) -> Vec<u32> {
    let finite = |i: usize| logits[i] > f32::NEG_INFINITY;
    if top_k == 0 && top_p >= 1.0 {
        return (0..logits.len())
            .filter(|&i| finite(i))
            .map(|i| i as u32)
            .collect();
    }
    let mut keys: Vec<u64> = (0..logits.len())
        .filter(|&i| finite(i))
        .map(|i| desc_key(logits[i], i as u32))
        .collect();
    if top_k > 0 && top_k < keys.len() {
        keys.select_nth_unstable(top_k - 1);
        keys.truncate(top_k);
    }
    if top_p >= 1.0 || keys.is_empty() {
        keys.sort_unstable();
        return keys.into_iter().map(key_id).collect();
    }
    let value = |k: u64| logits[key_id(k) as usize] as f64;
    let max = keys
        .iter()
        .map(|&k| value(k))
        .fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = keys.iter().map(|&k| (value(k) - max).exp()).sum();
    let mut k = keys.len().min(64);
    loop {
        if k < keys.len() {
            keys.select_nth_unstable(k - 1);
        }
        keys[..k].sort_unstable();
        let mut cum = 0.0;
        for j in 0..k {
            cum += (value(keys[j]) - max).exp() / z;
            if cum >= top_p as f64 {
                keys.truncate(j + 1);
                return keys.into_iter().map(key_id).collect();
            }
        }
        if k == keys.len() {
            return keys.into_iter().map(key_id).collect();
        }
        k = (k * 4).min(keys.len());
    }
}

/// Softmax (in f64) over the candidate ids, in their order.
pub fn softmax_of(logits: &[f32], ids: &[u32]) -> Vec<f64> {
    let max = ids
        .iter()
        .map(|&i| logits[i as usize] as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut p: Vec<f64> = ids
        .iter()
        .map(|&i| (logits[i as usize] as f64 - max).exp())
        .collect();
    let sum: f64 = p.iter().sum();
    for v in &mut p {
        *v /= sum;
    }
    p
}

/// Picks next tokens according to [`SamplingParams`], deterministically for a seed.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    step: usize,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Self {
            params,
            rng: Rng::new(params.seed),
            step: 0,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The uniform of the next draw, from the seeded stream: one value per sampled token, none
    /// (0) when the temperature is 0 (greedy, with or without the penalty, draws nothing).
    pub fn next_uniform(&mut self) -> f64 {
        if self.params.temperature == 0.0 {
            0.0
        } else {
            self.rng.next_f64()
        }
    }

    /// Chooses a token from `logits` (modified in place: penalty, temperature, masks).
    /// `context` is every token the model has seen (prompt and generated), for the penalty.
    pub fn sample(&mut self, logits: &mut [f32], context: &[u32]) -> Result<u32> {
        let u = self.next_uniform();
        self.sample_with(logits, context, u)
    }

    /// [`Self::sample`] with the uniform already drawn ([`Self::next_uniform`]): the host
    /// fallback of a draw first offered to the device.
    pub fn sample_with(&mut self, logits: &mut [f32], context: &[u32], u: f64) -> Result<u32> {
        let step = self.step;
        self.step += 1;
        if logits.is_empty() {
            return Err(ModelError::BadLogits {
                step,
                detail: "empty logits".into(),
            });
        }
        if let Some(i) = logits.iter().position(|v| v.is_nan()) {
            return Err(ModelError::BadLogits {
                step,
                detail: format!("NaN at token id {i}"),
            });
        }
        let p = self.params;
        apply_repetition_penalty(logits, context, p.repetition_penalty);
        if p.temperature == 0.0 {
            return argmax(logits).ok_or(ModelError::BadLogits {
                step,
                detail: "no finite value".into(),
            });
        }
        for l in logits.iter_mut() {
            *l /= p.temperature;
        }
        let mut ids = candidates(logits, p.top_k, p.top_p);
        if ids.is_empty() {
            return Err(ModelError::BadLogits {
                step,
                detail: "every logit is -inf".into(),
            });
        }
        // The draw's order: ascending ids (see the module docs).
        ids.sort_unstable();
        let probs = softmax_of(logits, &ids);
        let mut cum = 0.0;
        for (&id, &prob) in ids.iter().zip(&probs) {
            cum += prob;
            if u < cum {
                return Ok(id);
            }
        }
        // Rounding left the total a hair below 1 and u above it: the last candidate.
        Ok(*ids.last().expect("non-empty"))
    }
}
