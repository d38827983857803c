//! The generation loop on a scripted host model (the real model plugs into the same trait).

mod common;

use std::ops::ControlFlow;

use model::{
    CausalLm, GenerateOptions, GenerationConfig, Generator, ModelConfig, ModelError, Prompt,
    SamplingParams, StopReason, Tokenizer,
};

/// A model that emits a fixed continuation: after any prompt, the i-th generated token is
/// `script[i]` (by a margin of 10 in the logits), and every call is recorded.
struct Scripted {
    vocab: usize,
    max_len: usize,
    len: usize,
    prompt_len: usize,
    script: Vec<u32>,
    prefills: Vec<Vec<u32>>,
    decoded: Vec<u32>,
    argmax_calls: usize,
    logits_calls: usize,
    /// Pseudo-random logits (for sampling tests) instead of the script.
    noisy: bool,
    /// Whether `truncate` keeps a prefix (as a session does) or refuses (the trait's default).
    truncates: bool,
    /// Samples "on the device" ([`CausalLm::sample_on_device`], here the host sampler on its
    /// own logits) instead of returning `None`; records the uniforms and contexts it was given.
    samples: bool,
    uniforms: Vec<f64>,
    contexts: Vec<Vec<u32>>,
}

impl Scripted {
    fn new(vocab: usize, max_len: usize, script: Vec<u32>) -> Self {
        Self {
            vocab,
            max_len,
            len: 0,
            prompt_len: 0,
            script,
            prefills: Vec::new(),
            decoded: Vec::new(),
            argmax_calls: 0,
            logits_calls: 0,
            noisy: false,
            truncates: false,
            samples: false,
            uniforms: Vec::new(),
            contexts: Vec::new(),
        }
    }
    fn current_logits(&self) -> Vec<f32> {
        if self.noisy {
            let mut rng = model::sampling::Rng::new(self.len as u64);
            (0..self.vocab).map(|_| rng.next_signed_f32()).collect()
        } else {
            let mut out = vec![0.0; self.vocab];
            out[self.script[self.step() % self.script.len()] as usize] = 10.0;
            out
        }
    }
    fn step(&self) -> usize {
        self.len - self.prompt_len
    }
}

impl CausalLm for Scripted {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn max_len(&self) -> usize {
        self.max_len
    }
    fn len(&self) -> usize {
        self.len
    }
    fn reset(&mut self) -> model::Result<()> {
        self.len = 0;
        Ok(())
    }
    fn truncate(&mut self, len: usize) -> model::Result<bool> {
        if self.truncates {
            self.len = self.len.min(len);
        }
        Ok(self.truncates)
    }
    fn prefill(&mut self, tokens: &[u32]) -> model::Result<()> {
        assert!(
            self.len + tokens.len() <= self.max_len,
            "prefill past the context"
        );
        self.prefills.push(tokens.to_vec());
        self.len += tokens.len();
        self.prompt_len = self.len;
        Ok(())
    }
    fn decode(&mut self, token: u32) -> model::Result<()> {
        assert!(self.len < self.max_len, "decode past the context");
        self.decoded.push(token);
        self.len += 1;
        Ok(())
    }
    fn logits(&mut self, out: &mut Vec<f32>) -> model::Result<()> {
        self.logits_calls += 1;
        *out = self.current_logits();
        Ok(())
    }
    fn sample_on_device(
        &mut self,
        params: &SamplingParams,
        context: &[u32],
        u: f64,
    ) -> model::Result<Option<u32>> {
        if !self.samples {
            return Ok(None);
        }
        self.uniforms.push(u);
        self.contexts.push(context.to_vec());
        let mut logits = self.current_logits();
        model::Sampler::new(*params)?
            .sample_with(&mut logits, context, u)
            .map(Some)
    }
    fn argmax(&mut self) -> model::Result<u32> {
        self.argmax_calls += 1;
        Ok(self.script[self.step() % self.script.len()])
    }
}

struct Setup {
    _dir: common::TempDir,
    tokenizer: Tokenizer,
}

fn setup() -> Setup {
    let dir = common::demo_model();
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let gen = GenerationConfig::from_dir(dir.path()).unwrap();
    let tokenizer = Tokenizer::from_dir(dir.path(), &config, &gen).unwrap();
    Setup {
        _dir: dir,
        tokenizer,
    }
}

fn clone_tokenizer(t: &Tokenizer) -> Tokenizer {
    Tokenizer::from_parts(
        t.inner().clone(),
        None,
        t.bos_token_id(),
        t.eos_token_ids().to_vec(),
    )
}

/// Runs a generation, returning the output and the streamed pieces.
fn gen(
    generator: &mut Generator<Scripted>,
    prompt: &Prompt,
    options: &GenerateOptions,
) -> (model::Result<model::GenerateOutput>, Vec<String>) {
    let mut pieces = Vec::new();
    let out = generator.generate(prompt, options, |p| {
        pieces.push(p.to_string());
        ControlFlow::Continue(())
    });
    (out, pieces)
}

fn opts(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        eos_token_ids: Some(vec![]),
        ..Default::default()
    }
}

#[test]
fn streams_text_and_stops_at_max_new_tokens() {
    let s = setup();
    let target = "Hello, world! Grüße 水🙂 and more text here.";
    let script = s.tokenizer.encode(target, false).unwrap();
    let n = script.len();
    let model = Scripted::new(1024, 512, script.clone());
    let mut g = Generator::new(model, clone_tokenizer(&s.tokenizer));
    let prompt = Prompt::Text("Once upon a time".into());
    let (out, pieces) = gen(&mut g, &prompt, &opts(n));
    let out = out.unwrap();
    assert_eq!(out.text, target);
    assert_eq!(pieces.concat(), target);
    assert!(pieces.len() > 1, "text was not streamed");
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
    assert_eq!(out.tokens, script);
    assert_eq!(out.stats.stop_reason, StopReason::MaxNewTokens);
    assert_eq!(out.stats.generated_tokens, n);
    let prompt_ids = s.tokenizer.encode("Once upon a time", true).unwrap();
    assert_eq!(out.prompt_tokens, prompt_ids);
    assert_eq!(out.stats.prompt_tokens, prompt_ids.len());
    // One prefill of the whole prompt, then one decode per token after the first.
    let m = g.model();
    assert_eq!(m.prefills, vec![prompt_ids.clone()]);
    assert_eq!(m.decoded, script[..n - 1].to_vec());
    assert_eq!(m.len, prompt_ids.len() + n - 1);
    // Greedy without penalty takes the device argmax path, never reading logits.
    assert_eq!((m.argmax_calls, m.logits_calls), (n, 0));
    assert!(out.stats.time_to_first_token >= out.stats.prefill_time);
    assert!(out.stats.decode_tokens_per_sec() > 0.0 && out.stats.prefill_tokens_per_sec() > 0.0);
    assert!(out
        .stats
        .summary()
        .contains(&format!("prompt {} tokens", prompt_ids.len())));
    // A second generation starts from an empty cache.
    let (out2, _) = gen(&mut g, &prompt, &opts(3));
    assert_eq!(out2.unwrap().tokens, script[..3].to_vec());
    assert_eq!(g.model().prefills.len(), 2);
}

#[test]
fn stops_on_any_eos_id_without_printing_it() {
    let s = setup();
    let im_end = s.tokenizer.token_to_id("<|im_end|>").unwrap();
    let eot = s.tokenizer.token_to_id("<|endoftext|>").unwrap();
    for eos in [im_end, eot] {
        let mut script = s.tokenizer.encode("Short answer.", false).unwrap();
        script.push(eos);
        script.extend(s.tokenizer.encode(" never shown", false).unwrap());
        let mut g = Generator::new(
            Scripted::new(1024, 512, script.clone()),
            clone_tokenizer(&s.tokenizer),
        );
        let options = GenerateOptions {
            max_new_tokens: 100,
            ..Default::default()
        }; // tokenizer's eos ids
        let (out, pieces) = gen(&mut g, &Prompt::Text("Q:".into()), &options);
        let out = out.unwrap();
        assert_eq!(out.text, "Short answer.");
        assert_eq!(pieces.concat(), "Short answer.");
        assert_eq!(out.stats.stop_reason, StopReason::Eos(eos));
        assert_eq!(*out.tokens.last().unwrap(), eos);
        assert_eq!(
            out.tokens.len(),
            script.iter().position(|&t| t == eos).unwrap() + 1
        );
    }
}

#[test]
fn stop_strings_end_generation_and_are_never_streamed() {
    let s = setup();
    let script = s
        .tokenizer
        .encode("The answer is 42.\nUser: and then more", false)
        .unwrap();
    for stop in ["\nUser:", "User", "42.\nU", "r: and"] {
        let mut g = Generator::new(
            Scripted::new(1024, 512, script.clone()),
            clone_tokenizer(&s.tokenizer),
        );
        let options = GenerateOptions {
            stop_strings: vec![stop.into(), "never".into()],
            ..opts(200)
        };
        let (out, pieces) = gen(&mut g, &Prompt::Text("Q".into()), &options);
        let out = out.unwrap();
        let full = "The answer is 42.\nUser: and then more";
        let want = &full[..full.find(stop).unwrap()];
        assert_eq!(out.text, want, "stop {stop:?}");
        assert_eq!(pieces.concat(), want, "stop {stop:?}: streamed {pieces:?}");
        assert_eq!(
            out.stats.stop_reason,
            StopReason::StopString(stop.to_string())
        );
        assert!(out.tokens.len() < script.len());
    }
    // Held-back text that turns out not to be a stop string is still emitted, at the end too.
    let mut g = Generator::new(
        Scripted::new(1024, 512, script.clone()),
        clone_tokenizer(&s.tokenizer),
    );
    let options = GenerateOptions {
        stop_strings: vec!["morel".into()],
        ..opts(script.len())
    };
    let (out, pieces) = gen(&mut g, &Prompt::Text("Q".into()), &options);
    let out = out.unwrap();
    assert_eq!(out.text, "The answer is 42.\nUser: and then more");
    assert_eq!(pieces.concat(), out.text);
    assert_eq!(out.stats.stop_reason, StopReason::MaxNewTokens);
}

#[test]
fn a_full_context_stops_generation_and_a_too_long_prompt_is_an_error() {
    let s = setup();
    let script = s
        .tokenizer
        .encode("abc def ghi jkl mno pqr stu", false)
        .unwrap();
    let prompt_ids: Vec<u32> = vec![5, 6, 7, 8];
    let mut g = Generator::new(
        Scripted::new(1024, 6, script.clone()),
        clone_tokenizer(&s.tokenizer),
    );
    let (out, _) = gen(&mut g, &Prompt::Tokens(prompt_ids.clone()), &opts(100));
    let out = out.unwrap();
    assert_eq!(out.stats.stop_reason, StopReason::ContextFull);
    // 4 prompt positions + 2 decoded = 6 = max_len; the third token came from the last decode.
    assert_eq!(out.tokens.len(), 3);
    assert_eq!(g.model().len, 6);

    // A prompt that fills the context exactly still gives one token; one more is an error.
    let mut g = Generator::new(
        Scripted::new(1024, 4, script.clone()),
        clone_tokenizer(&s.tokenizer),
    );
    let (out, _) = gen(&mut g, &Prompt::Tokens(prompt_ids.clone()), &opts(100));
    assert_eq!(out.unwrap().tokens.len(), 1);
    let mut g = Generator::new(
        Scripted::new(1024, 3, script),
        clone_tokenizer(&s.tokenizer),
    );
    let (out, pieces) = gen(&mut g, &Prompt::Tokens(prompt_ids), &opts(100));
    match out {
        Err(e @ ModelError::ContextOverflow { .. }) => {
            assert!(
                e.to_string().contains("4 tokens") && e.to_string().contains("--max-len"),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(pieces.is_empty());
    assert!(
        g.model().prefills.is_empty(),
        "the model ran despite the overflow"
    );
}

#[test]
fn bad_inputs_fail_before_the_model_runs() {
    let s = setup();
    let mut g = Generator::new(
        Scripted::new(1024, 64, vec![1]),
        clone_tokenizer(&s.tokenizer),
    );
    let bad_params = GenerateOptions {
        sampling: SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        ..opts(4)
    };
    let (out, _) = gen(&mut g, &Prompt::Text("x".into()), &bad_params);
    assert_eq!(out.unwrap_err().kind(), "parameter");
    let (out, _) = gen(&mut g, &Prompt::Tokens(vec![]), &opts(4));
    assert!(out.unwrap_err().to_string().contains("prompt"));
    let (out, _) = gen(&mut g, &Prompt::Tokens(vec![3, 1024]), &opts(4));
    assert!(out.unwrap_err().to_string().contains("1024"));
    // No chat template on this tokenizer: chat prompts are refused.
    let (out, _) = gen(
        &mut g,
        &Prompt::Chat(vec![model::ChatMessage::user("hi")]),
        &opts(4),
    );
    assert_eq!(out.unwrap_err().kind(), "chat-template");
    assert!(g.model().prefills.is_empty());
    // max_new_tokens 0 generates nothing and does not run the model.
    let (out, _) = gen(&mut g, &Prompt::Text("x".into()), &opts(0));
    assert!(out.unwrap().tokens.is_empty());
    assert!(g.model().prefills.is_empty());
}

#[test]
fn chat_prompts_use_the_template() {
    let s = setup();
    let mut g = Generator::new(Scripted::new(1024, 512, vec![40]), s.tokenizer);
    let messages = vec![model::ChatMessage::user("Hello")];
    let (out, _) = gen(&mut g, &Prompt::Chat(messages.clone()), &opts(1));
    let rendered = g.tokenizer().apply_chat_template(&messages, true).unwrap();
    let want = g.tokenizer().encode(&rendered, false).unwrap();
    assert_eq!(out.unwrap().prompt_tokens, want);
    assert_eq!(g.model().prefills[0], want);
}

#[test]
fn the_callback_can_cancel() {
    let s = setup();
    let script = s
        .tokenizer
        .encode("one two three four five six", false)
        .unwrap();
    let mut g = Generator::new(
        Scripted::new(1024, 512, script),
        clone_tokenizer(&s.tokenizer),
    );
    let mut seen = 0;
    let out = g
        .generate(&Prompt::Text("x".into()), &opts(100), |_| {
            seen += 1;
            if seen == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(out.stats.stop_reason, StopReason::Cancelled);
    assert_eq!(seen, 2);
}

#[test]
fn sampling_through_the_generator_is_deterministic_for_a_seed() {
    let s = setup();
    let run = |seed: u64| {
        let mut m = Scripted::new(1024, 512, vec![0]);
        m.noisy = true;
        let mut g = Generator::new(m, clone_tokenizer(&s.tokenizer));
        let options = GenerateOptions {
            sampling: SamplingParams {
                temperature: 0.8,
                top_k: 50,
                top_p: 0.95,
                repetition_penalty: 1.1,
                seed,
            },
            ..opts(40)
        };
        let (out, pieces) = gen(&mut g, &Prompt::Text("seeded".into()), &options);
        let out = out.unwrap();
        assert_eq!(g.model().argmax_calls, 0, "sampling must read the logits");
        (out.tokens, out.text, pieces.concat())
    };
    let a = run(5);
    assert_eq!(a, run(5));
    assert_eq!(a.1, a.2);
    assert_ne!(a.0, run(6).0);
}

/// A model that samples on its device gets the draws of the host sampler's seeded stream (one
/// uniform per sampled token, none at temperature 0) and the context so far, never has its
/// logits read, and gives the tokens the host sampler gives for the same seed.
#[test]
fn sampling_on_the_device_takes_the_seeded_uniforms() {
    let s = setup();
    let run = |samples: bool, sampling: SamplingParams| {
        let mut m = Scripted::new(1024, 512, vec![0]);
        m.noisy = true;
        m.samples = samples;
        let mut g = Generator::new(m, clone_tokenizer(&s.tokenizer));
        let options = GenerateOptions {
            sampling,
            ..opts(30)
        };
        let out = gen(&mut g, &Prompt::Text("seeded".into()), &options)
            .0
            .unwrap();
        let (m, _) = g.into_parts();
        (out, m)
    };
    let sampled = SamplingParams {
        temperature: 0.8,
        top_k: 50,
        top_p: 0.95,
        repetition_penalty: 1.1,
        seed: 9,
    };
    let greedy_penalised = SamplingParams {
        temperature: 0.0,
        repetition_penalty: 1.3,
        ..sampled
    };
    for params in [sampled, greedy_penalised] {
        let (device, dm) = run(true, params);
        let (host, hm) = run(false, params);
        assert_eq!(device.tokens, host.tokens, "{params:?}");
        assert_eq!((dm.logits_calls, dm.argmax_calls), (0, 0));
        assert_eq!(hm.logits_calls, host.tokens.len());
        let mut rng = model::sampling::Rng::new(params.seed);
        let want: Vec<f64> = (0..device.tokens.len())
            .map(|_| {
                if params.temperature == 0.0 {
                    0.0
                } else {
                    rng.next_f64()
                }
            })
            .collect();
        assert_eq!(dm.uniforms, want);
        // The context of the i-th draw: the prompt and the tokens before it.
        for (i, ctx) in dm.contexts.iter().enumerate() {
            let mut expected = device.prompt_tokens.clone();
            expected.extend_from_slice(&device.tokens[..i]);
            assert_eq!(ctx, &expected, "draw {i}");
        }
    }
}

/// With prefix reuse on, a prompt that starts with the previous prompt and its answer is
/// prefilled only from where it differs (at least its last token, whose logits choose the
/// first new token); off (the default), after `forget_prefix`, or with a model that cannot
/// truncate its cache, every prompt is prefilled whole.
#[test]
fn prefix_reuse_prefills_only_what_changed() {
    let s = setup();
    let toks = |v: &[u32]| Prompt::Tokens(v.to_vec());
    let mut model = Scripted::new(1024, 64, vec![50, 51, 52]);
    model.truncates = true;
    let mut g = Generator::new(model, clone_tokenizer(&s.tokenizer));

    // Off by default.
    gen(&mut g, &toks(&[1, 2, 3, 4]), &opts(3)).0.unwrap();
    let out = gen(&mut g, &toks(&[1, 2, 3, 4]), &opts(3)).0.unwrap();
    assert_eq!(out.stats.cached_prompt_tokens, 0);
    assert_eq!(g.model().prefills, vec![vec![1, 2, 3, 4], vec![1, 2, 3, 4]]);

    g.set_prefix_reuse(true);
    g.model_mut().prefills.clear();
    // The first generation with reuse on has nothing it knows to be cached.
    gen(&mut g, &toks(&[1, 2, 3, 4]), &opts(3)).0.unwrap();
    // The cache now holds the prompt and the two answer tokens that were fed back (50, 51).
    let out = gen(&mut g, &toks(&[1, 2, 3, 4, 50, 51, 7, 9]), &opts(3))
        .0
        .unwrap();
    assert_eq!(out.stats.cached_prompt_tokens, 6);
    assert_eq!(out.stats.prompt_tokens, 8);
    assert!(out.stats.summary().contains("prompt 8 tokens (6 cached)"));
    // The same prompt again: everything but its last token is reused.
    let again = gen(&mut g, &toks(&[1, 2, 3, 4, 50, 51, 7, 9]), &opts(3))
        .0
        .unwrap();
    assert_eq!(again.stats.cached_prompt_tokens, 7);
    assert_eq!(again.tokens, out.tokens);
    // A prompt that differs from the first token on shares nothing.
    let other = gen(&mut g, &toks(&[8, 2, 3]), &opts(3)).0.unwrap();
    assert_eq!(other.stats.cached_prompt_tokens, 0);
    // Forgotten: whole again.
    g.forget_prefix();
    gen(&mut g, &toks(&[8, 2, 3]), &opts(3)).0.unwrap();
    assert_eq!(
        g.model().prefills,
        vec![
            vec![1, 2, 3, 4],
            vec![7, 9],
            vec![9],
            vec![8, 2, 3],
            vec![8, 2, 3],
        ]
    );

    // A model that cannot truncate is reset and prefilled whole.
    let mut g = Generator::new(
        Scripted::new(1024, 64, vec![50, 51, 52]),
        clone_tokenizer(&s.tokenizer),
    );
    g.set_prefix_reuse(true);
    gen(&mut g, &toks(&[1, 2, 3, 4]), &opts(3)).0.unwrap();
    let out = gen(&mut g, &toks(&[1, 2, 3, 4, 50, 51, 7]), &opts(3))
        .0
        .unwrap();
    assert_eq!(out.stats.cached_prompt_tokens, 0);
    assert_eq!(
        g.model().prefills,
        vec![vec![1, 2, 3, 4], vec![1, 2, 3, 4, 50, 51, 7]]
    );
}
