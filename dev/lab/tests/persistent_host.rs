//! The host side of `lab::persistent_gemv`: the stage lists fit the kernel's shared memory on
//! the SM counts of the GPUs it runs on, a list that does not is refused with the reason, and the
//! stage-by-stage check accepts each kind of stage computed independently in f32 and rejects a
//! wrong output.

use lab::persistent_gemv::{
    bf16_weight_words, gemv_check, gemv_stages, gemv_unfit, layer_stages, GemvStage,
    GEMV_TOLERANCE, KIND_NORM_BIAS, KIND_NORM_SWIGLU, KIND_PLAIN, KIND_RESIDUAL, NORM_EPS,
};

#[test]
fn the_step_fits_h100_and_h200_sm_counts() {
    for sms in [114, 132] {
        for (stages, acts) in [gemv_stages(sms), layer_stages(sms)] {
            assert_eq!(stages.len(), 28 * 5);
            assert_eq!(gemv_unfit(&stages), None, "{sms} SMs");
            for s in &stages {
                assert!((s.y_off + s.outputs()) as usize <= acts.len());
                assert!((s.x_off + s.k) as usize <= acts.len());
                assert_eq!(s.y_off % 32, 0, "outputs start a 128-byte line");
            }
        }
    }
    // Too few cubes: gate-up's rows overflow a cube's row slots.
    let (stages, _) = gemv_stages(16);
    assert!(gemv_unfit(&stages).unwrap().contains("row slots"));
}

/// Stage `s` computed in f32 on the host, written into `acts`.
fn host_stage(s: &GemvStage, weights: &[u32], acts: &mut [f32]) {
    let k = s.k as usize;
    let aux = s.aux as usize;
    let mut x: Vec<f32> = acts[s.x_off as usize..][..k].to_vec();
    if s.kind == KIND_NORM_BIAS || s.kind == KIND_NORM_SWIGLU {
        let mean = x.iter().map(|v| v * v).sum::<f32>() / k as f32;
        let inv = 1.0 / (mean + NORM_EPS).sqrt();
        for (i, v) in x.iter_mut().enumerate() {
            *v *= inv * acts[aux + i];
        }
    }
    let products: Vec<f32> = (0..s.rows as usize)
        .map(|r| {
            let row = &weights[s.first as usize * 4 + r * k / 2..][..k / 2];
            row.iter()
                .enumerate()
                .map(|(i, &w)| {
                    f32::from_bits(w << 16) * x[2 * i]
                        + f32::from_bits(w & 0xffff_0000) * x[2 * i + 1]
                })
                .sum()
        })
        .collect();
    let y = s.y_off as usize;
    for r in 0..s.outputs() as usize {
        acts[y + r] = match s.kind {
            KIND_NORM_BIAS => products[r] + acts[aux + k + r],
            KIND_RESIDUAL => products[r] + acts[aux + r],
            KIND_NORM_SWIGLU => {
                let (g, u) = (products[2 * r], products[2 * r + 1]);
                g / (1.0 + (-g).exp()) * u
            }
            _ => products[r],
        };
    }
}

#[test]
fn the_check_accepts_each_kind_and_rejects_a_wrong_output() {
    // x (512) | norm weights (512) and bias (256) | the four stages' outputs.
    let stage = |first, rows, k, x_off, y_off, kind, aux| GemvStage {
        first,
        rows,
        k,
        cubes: 3,
        x_off,
        y_off,
        kind,
        aux,
    };
    let stages = [
        stage(0, 256, 512, 0, 1280, KIND_NORM_BIAS, 512),
        stage(16384, 256, 256, 1280, 1536, KIND_PLAIN, 0),
        stage(24576, 256, 256, 1536, 1792, KIND_RESIDUAL, 1536),
        stage(32768, 64, 256, 1792, 2048, KIND_NORM_SWIGLU, 512),
    ];
    let words = (256 * 512 + 2 * 256 * 256 + 64 * 256) / 2;
    let weights = bf16_weight_words(&stages, words);
    assert!(weights.iter().all(|&w| w != 0));
    let mut acts = vec![0f32; 2080];
    for (i, v) in acts.iter_mut().take(1280).enumerate() {
        *v = ((i % 13) as f32 - 6.0) / 6.0 + if (512..1024).contains(&i) { 1.5 } else { 0.0 };
    }
    for s in &stages {
        host_stage(s, &weights, &mut acts);
    }
    let worst = gemv_check(&stages, &weights, &acts);
    assert!(worst < 1e-5, "{worst}");
    for s in &stages {
        let mut wrong = acts.clone();
        let y = s.y_off as usize + 1;
        let scale = acts[s.y_off as usize..][..s.outputs() as usize]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        wrong[y] += 0.01 * scale;
        let worst = gemv_check(std::slice::from_ref(s), &weights, &wrong);
        assert!(worst > GEMV_TOLERANCE, "kind {}: {worst}", s.kind);
    }
}
