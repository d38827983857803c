//! The host side of `lab::persistent_gemv`: the stage list fits the kernel's shared memory on
//! the SM counts of the GPUs it runs on, a list that does not is refused with the reason, and the
//! stage-by-stage check accepts the products of the stage's weights and rejects a wrong output.

use lab::persistent_gemv::{
    bf16_weight_words, gemv_check, gemv_stages, gemv_unfit, GemvStage, GEMV_TOLERANCE,
};

#[test]
fn the_step_fits_h100_and_h200_sm_counts() {
    for sms in [114, 132] {
        let (stages, acts) = gemv_stages(sms);
        assert_eq!(stages.len(), 28 * 5);
        assert_eq!(gemv_unfit(&stages), None, "{sms} SMs");
        let last = stages.last().unwrap();
        assert!(last.y_off + last.rows <= acts);
    }
    // Too few cubes: gate-up's rows overflow a cube's row slots.
    let (stages, _) = gemv_stages(16);
    assert!(gemv_unfit(&stages).unwrap().contains("row slots"));
}

/// The products of `stages` computed in f32 on the host from `input` (the first stage's x).
fn host_chain(stages: &[GemvStage], weights: &[u32], acts_len: usize, input: &[f32]) -> Vec<f32> {
    let mut acts = vec![0f32; acts_len];
    acts[..input.len()].copy_from_slice(input);
    for s in stages {
        for r in 0..s.rows as usize {
            let row = &weights[s.first as usize * 4 + r * s.k as usize / 2..][..s.k as usize / 2];
            let mut acc = 0f32;
            for (i, &w) in row.iter().enumerate() {
                acc += f32::from_bits(w << 16) * acts[s.x_off as usize + 2 * i];
                acc += f32::from_bits(w & 0xffff_0000) * acts[s.x_off as usize + 2 * i + 1];
            }
            acts[s.y_off as usize + r] = acc;
        }
    }
    acts
}

#[test]
fn the_check_accepts_the_products_and_rejects_a_wrong_output() {
    let stages = [
        GemvStage {
            first: 0,
            rows: 256,
            k: 512,
            cubes: 2,
            x_off: 0,
            y_off: 512,
        },
        GemvStage {
            first: 256 * 512 / 8,
            rows: 3,
            k: 256,
            cubes: 2,
            x_off: 512,
            y_off: 768,
        },
    ];
    let words = (256 * 512 + 3 * 256) / 2;
    let weights = bf16_weight_words(&stages, words);
    assert!(weights.iter().all(|&w| w != 0));
    let input: Vec<f32> = (0..512).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
    let mut acts = host_chain(&stages, &weights, 800, &input);
    let worst = gemv_check(&stages, &weights, &acts);
    assert!(worst < 1e-6, "{worst}");
    acts[769] += 0.01 * acts[768..771].iter().map(|v| v.abs()).fold(0f32, f32::max);
    let worst = gemv_check(&stages, &weights, &acts);
    assert!(worst > GEMV_TOLERANCE, "{worst}");
}
