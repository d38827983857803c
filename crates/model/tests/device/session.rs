//! The KV cache, the decode buffers and sessions: limits, validation and the CUDA-graph option.

use cubecl::prelude::*;
use model::{
    CausalLm, DecodeBuffers, GenerateOptions, Generator, KvCache, LoadOptions, ModelError, Prompt,
    Session, SessionOptions, Tokenizer,
};
use ops::{caps, DType};
use testkit::on_each_runtime_one_cuda_at_a_time;

use crate::{fixture, load, reference, worst_row_error, Demo};

fn cache_and_buffers<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let (m, _) = load(
        client,
        &demo.0,
        &LoadOptions {
            dtype: None,
            max_len: Some(10),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let c = m.config().clone();
    let mut cache = m.new_cache().unwrap();
    assert_eq!(cache.layers().len(), c.num_hidden_layers);
    assert_eq!(
        cache.layer(0).k.shape(),
        &[10, c.num_key_value_heads, c.head_dim]
    );
    assert_eq!(cache.layer(1).v.dtype(), m.dtype());
    assert_eq!(
        KvCache::<R>::bytes_for(&c, 10, DType::F32),
        2 * c.num_hidden_layers * 10 * c.kv_dim() * 4
    );
    // The host length is the one source of truth: an append writes the device copies the
    // kernels read (start, end) and counts only once committed.
    let device = |t: &ops::DeviceTensor<R>| t.to_vec::<u32>(client).unwrap();
    cache.begin_append(client, 7).unwrap();
    assert_eq!(
        (device(cache.start()), device(cache.end())),
        (vec![0], vec![7])
    );
    assert_eq!((cache.len(), cache.pending()), (0, Some(7)));
    cache.commit_append().unwrap();
    assert_eq!((cache.len(), cache.pending()), (7, None));
    assert_eq!(cache.commit_append().unwrap_err().kind(), "parameter");
    // Views of the first rows: only where the written rows fit, and never past the cache.
    let first = cache.first_rows(8).unwrap();
    assert_eq!(first.len(), c.num_hidden_layers);
    assert_eq!(first[1].v.shape(), &[8, c.num_key_value_heads, c.head_dim]);
    assert_eq!(cache.first_rows(6).unwrap_err().kind(), "parameter");
    assert_eq!(cache.first_rows(11).unwrap_err().kind(), "parameter");
    let err = cache.begin_append(client, 4).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::ContextOverflow {
                needed: 11,
                max_len: 10
            }
        ),
        "{err}"
    );
    assert_eq!(
        (cache.len(), cache.pending()),
        (7, None),
        "a refused append changes nothing"
    );
    cache.begin_append(client, 3).unwrap();
    assert_eq!(
        (device(cache.start()), device(cache.end())),
        (vec![7], vec![10])
    );
    cache.commit_append().unwrap();
    assert_eq!(cache.remaining(), 0);
    cache.reset();
    assert!(cache.is_empty() && cache.pending().is_none());

    let step = DecodeBuffers::<R>::new(client, &c, m.dtype(), 10).unwrap();
    step.write_token(client, 42).unwrap();
    assert_eq!(step.token.to_vec::<u32>(client).unwrap(), vec![42]);
    assert_eq!(step.logits.shape(), &[1, c.vocab_size]);
    assert_eq!(step.act.q.shape(), &[1, c.num_attention_heads, c.head_dim]);
    assert_eq!(step.act.tokens(), 1);
    // The decode step reads its position from an append the cache has begun.
    let err = m.decode_step(&cache, &step).unwrap_err();
    assert_eq!(err.kind(), "parameter", "{err}");
    cache.begin_append(client, 1).unwrap();
    m.decode_step(&cache, &step).unwrap();
    cache.commit_append().unwrap();
    assert_eq!(cache.len(), 1);
    // The step advances the device copies to the next step's values itself; committed as a
    // step, the next one-position append writes nothing, and the copies stay right.
    assert_eq!(
        (device(cache.start()), device(cache.end())),
        (vec![1], vec![2])
    );
    assert!(
        !cache.device_advanced(),
        "a plain commit forgets the advance"
    );
    cache.begin_append(client, 1).unwrap();
    m.decode_step(&cache, &step).unwrap();
    cache.commit_step().unwrap();
    assert!(cache.device_advanced());
    for len in 2..4 {
        assert_eq!(
            (device(cache.start()), device(cache.end())),
            (vec![len], vec![len + 1]),
            "the device positions after {len} positions"
        );
        cache.begin_append(client, 1).unwrap();
        m.decode_step(&cache, &step).unwrap();
        cache.commit_step().unwrap();
    }
    assert_eq!(cache.len(), 4);
    // A truncation forgets the advance: the next append writes the copies.
    cache.truncate(2);
    assert!(!cache.device_advanced());
    cache.begin_append(client, 1).unwrap();
    assert_eq!(
        (device(cache.start()), device(cache.end())),
        (vec![2], vec![3])
    );
    // Only an append of one position is a step's.
    cache.commit_append().unwrap();
    cache.begin_append(client, 2).unwrap();
    assert_eq!(cache.commit_step().unwrap_err().kind(), "parameter");
}

#[test]
fn kv_cache_and_decode_buffers() {
    on_each_runtime_one_cuda_at_a_time!(cache_and_buffers);
}

fn session_limits<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let (m, _) = load(
        client,
        &demo.0,
        &LoadOptions {
            dtype: None,
            max_len: Some(8),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let config = m.config().clone();
    let tok = Tokenizer::from_dir(&demo.0, &config, m.generation_config()).unwrap();
    let session = Session::new(m).unwrap();
    assert_eq!(
        (session.max_len(), session.vocab_size()),
        (8, config.vocab_size)
    );
    let mut g = Generator::new(session, tok);
    // A prompt longer than the context: a clear error, nothing runs.
    let long = Prompt::Tokens((0..9).collect());
    let err = g
        .generate(&long, &GenerateOptions::default(), |_| {
            std::ops::ControlFlow::Continue(())
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::ContextOverflow {
                needed: 9,
                max_len: 8
            }
        ),
        "{err}"
    );
    // Token ids outside the vocabulary never reach a kernel.
    let err = g
        .model_mut()
        .prefill(&[config.vocab_size as u32])
        .unwrap_err();
    assert_eq!(err.kind(), "parameter");
    let err = g.model_mut().decode(u32::MAX).unwrap_err();
    assert_eq!(err.kind(), "parameter");
    // Generation that fills the context stops cleanly at it, with text streamed.
    let mut streamed = String::new();
    let out = g
        .generate(
            &Prompt::Text("Hello".into()),
            &GenerateOptions {
                max_new_tokens: 100,
                ..GenerateOptions::default()
            },
            |t| {
                streamed.push_str(t);
                std::ops::ControlFlow::Continue(())
            },
        )
        .unwrap();
    // The last token is sampled from the final logits and never fed back: one past the cache.
    assert_eq!(
        out.prompt_tokens.len() + out.tokens.len(),
        9,
        "stops at the context length"
    );
    assert_eq!(out.text, streamed);
}

#[test]
fn session_validates_before_the_forward_pass() {
    on_each_runtime_one_cuda_at_a_time!(session_limits);
}

/// Decoding with and without CUDA graphs gives the same tokens and logits; graphs are used on
/// CUDA unless the options turn them off, never elsewhere.
fn graph_option<R: Runtime>(client: &ComputeClient<R>) {
    let dir = fixture("qwen3-gqa-tied");
    let r = reference(&dir);
    let opts = LoadOptions {
        dtype: Some(DType::F32),
        max_len: Some(64),
        ..LoadOptions::default()
    };
    let cuda = caps::runtime_name(client) == "cuda";
    let mut runs = Vec::new();
    for cuda_graphs in [true, false] {
        let (m, _) = load(client, &dir, &opts).unwrap();
        let mut session = Session::with_options(
            m,
            SessionOptions {
                cuda_graphs,
                ..SessionOptions::default()
            },
        )
        .unwrap();
        session.prefill(&r.prompt).unwrap();
        let (mut tokens, mut logits, mut row) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..6 {
            let next = session.argmax().unwrap();
            tokens.push(next);
            session.decode(next).unwrap();
            session.logits(&mut row).unwrap();
            logits.extend_from_slice(&row);
        }
        assert_eq!(
            session.uses_graph(),
            cuda && cuda_graphs,
            "graphs {cuda_graphs}"
        );
        runs.push((tokens, logits));
    }
    assert_eq!(runs[0].0, runs[1].0);
    let err = worst_row_error(&runs[0].1, &runs[1].1, r.vocab);
    assert!(
        err < 1e-5,
        "graph replay differs from eager decoding by {err:.2e}"
    );
}

#[test]
fn cuda_graphs_are_an_explicit_option() {
    on_each_runtime_one_cuda_at_a_time!(graph_option);
}

/// Greedy tokens of one session on the demo model, and whether it replayed a graph.
fn greedy_run<R: Runtime>(client: &ComputeClient<R>, dir: &std::path::Path) -> (Vec<u32>, bool) {
    let (m, _) = load(
        client,
        dir,
        &LoadOptions {
            max_len: Some(96),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let mut session = Session::new(m).unwrap();
    session.prefill(&[5, 80, 300, 17, 999, 42]).unwrap();
    let mut tokens = Vec::new();
    for _ in 0..40 {
        let next = session.argmax().unwrap();
        tokens.push(next);
        session.decode(next).unwrap();
    }
    (tokens, session.uses_graph())
}

/// Sessions on several threads of one process, each capturing its decode step while the others
/// load, prefill, read and replay: every one gives the tokens of a session run alone, and on
/// CUDA every one replays its graph (a capture broken by another thread would fall back to
/// eager steps).
fn concurrent_sessions<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let alone = greedy_run(client, &demo.0);
    let cuda = caps::runtime_name(client) == "cuda";
    assert_eq!(alone.1, cuda);
    for round in 0..3 {
        let runs: Vec<(Vec<u32>, bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let client = client.clone();
                    let dir = demo.0.clone();
                    s.spawn(move || greedy_run(&client, &dir))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, run) in runs.iter().enumerate() {
            assert_eq!(run, &alone, "round {round}, thread {i}");
        }
    }
}

#[test]
fn sessions_on_several_threads_of_one_process() {
    on_each_runtime_one_cuda_at_a_time!(concurrent_sessions);
}

/// Keeping a prefix of the cache: prefilling a prompt in two parts, and prefilling it after a
/// longer sequence was truncated back to its first part, give the logits of one whole prefill
/// (within the dtype's rounding; a truncation that kept the stale tail would shift every
/// position after it).
fn prefix_kept<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let dtype = if caps::supports_dtype(client, DType::F16) {
        DType::F16
    } else {
        DType::F32
    };
    for dtype in [DType::F32, dtype] {
        let options = LoadOptions {
            dtype: Some(dtype),
            max_len: Some(64),
            ..LoadOptions::default()
        };
        let (m, _) = load(client, &demo.0, &options).unwrap();
        let vocab = m.config().vocab_size;
        let mut s = Session::with_options(
            m,
            SessionOptions {
                cuda_graphs: false,
                ..SessionOptions::default()
            },
        )
        .unwrap();
        let prompt: Vec<u32> = (0..23).map(|i| (i * 37 % 300) as u32 + 5).collect();
        let logits = |s: &mut Session<R>| {
            let mut out = Vec::new();
            s.logits(&mut out).unwrap();
            out
        };
        s.prefill(&prompt).unwrap();
        let whole = logits(&mut s);

        s.reset().unwrap();
        s.prefill(&prompt[..17]).unwrap();
        s.prefill(&prompt[17..]).unwrap();
        let split = logits(&mut s);

        s.reset().unwrap();
        s.prefill(&prompt[..17]).unwrap();
        s.decode(7).unwrap();
        s.decode(8).unwrap();
        assert!(s.truncate(17).unwrap());
        assert_eq!(s.len(), 17);
        s.prefill(&prompt[17..]).unwrap();
        let truncated = logits(&mut s);

        let tol = if dtype == DType::F32 { 1e-4 } else { 5e-3 };
        for (what, got) in [("split", &split), ("truncated", &truncated)] {
            let err = worst_row_error(got, &whole, vocab);
            assert!(err < tol, "{dtype} {what}: relative error {err:.2e}");
        }
    }
}

#[test]
fn a_kept_prefix_gives_the_logits_of_a_whole_prefill() {
    on_each_runtime_one_cuda_at_a_time!(prefix_kept);
}

/// Greedy decoding one step ahead of the host (each step fed the previous step's argmax on the
/// device before the host reads it back) chooses the tokens of host-fed steps and leaves the
/// same logits, stops launching where the cache is full, and a generation that ends on an eos or
/// its token budget keeps exactly the decoded tokens in the cache (the step launched on the last
/// token is truncated away).
fn greedy_ahead<R: Runtime>(client: &ComputeClient<R>) {
    for screen in [false, true] {
        greedy_ahead_with(client, screen);
    }
}

/// Greedy decoding one step ahead of the host against steps the host feeds, the steps ahead
/// with the LM head screened or not (`screen`: the same tokens, and the logits, computed when
/// asked for, the same too).
fn greedy_ahead_with<R: Runtime>(client: &ComputeClient<R>, screen: bool) {
    const MAX_LEN: usize = 40;
    let demo = Demo::new();
    let prompt = [5u32, 80, 300, 17, 999, 42];
    let load_session = |screen_lm_head| {
        let options = LoadOptions {
            max_len: Some(MAX_LEN),
            screen_lm_head,
            ..LoadOptions::default()
        };
        Session::new(load(client, &demo.0, &options).unwrap().0).unwrap()
    };
    let session = || load_session(screen);

    let mut host = load_session(false);
    let vocab = host.vocab_size();
    host.prefill(&prompt).unwrap();
    let mut tokens = Vec::new();
    while host.len() < MAX_LEN {
        let next = host.argmax().unwrap();
        tokens.push(next);
        host.decode(next).unwrap();
    }
    let (mut want, mut got) = (Vec::new(), Vec::new());
    host.logits(&mut want).unwrap();

    let mut ahead = session();
    ahead.prefill(&prompt).unwrap();
    // Before any decode step there is no device choice to run on.
    assert_eq!(ahead.decode_argmax_ahead().unwrap(), None);
    let first = ahead.argmax().unwrap();
    ahead.decode(first).unwrap();
    let mut chosen = vec![first];
    while let Some(token) = ahead.decode_argmax_ahead().unwrap() {
        chosen.push(token);
    }
    assert_eq!(ahead.len(), MAX_LEN, "a full cache stops the steps ahead");
    assert_eq!(ahead.model().screens_lm_head(), screen);
    assert_eq!(chosen, tokens, "screened: {screen}");
    ahead.logits(&mut got).unwrap();
    let err = worst_row_error(&got, &want, vocab);
    assert!(
        err < 1e-6,
        "logits after steps ahead differ by {err:.2e} (screened: {screen})"
    );
    assert_eq!(ahead.argmax().unwrap(), host.argmax().unwrap());

    let config = ahead.model().config().clone();
    let tok = Tokenizer::from_dir(&demo.0, &config, ahead.model().generation_config()).unwrap();
    let mut g = Generator::new(session(), tok);
    g.set_prefix_reuse(false);
    let mut generate = |max_new_tokens, eos: Vec<u32>| {
        let options = GenerateOptions {
            max_new_tokens,
            eos_token_ids: Some(eos),
            ..GenerateOptions::default()
        };
        let prompt = Prompt::Tokens(prompt.to_vec());
        let out = g
            .generate(&prompt, &options, |_| std::ops::ControlFlow::Continue(()))
            .unwrap();
        (out.tokens, g.model().len())
    };
    // The token budget: every chosen token but the last was decoded.
    assert_eq!(
        generate(20, Vec::new()),
        (tokens[..20].to_vec(), prompt.len() + 19)
    );
    // An eos: the first token that has not occurred before it.
    let j = (1..20)
        .find(|&j| !tokens[..j].contains(&tokens[j]))
        .expect("the demo's greedy tokens vary");
    assert_eq!(
        generate(30, vec![tokens[j]]),
        (tokens[..=j].to_vec(), prompt.len() + j)
    );
}

#[test]
fn greedy_decoding_one_step_ahead_of_the_host() {
    on_each_runtime_one_cuda_at_a_time!(greedy_ahead);
}

/// A screened LM head on an untied checkpoint and on the demo's tied one: greedy tokens one step
/// ahead as without it, and a step ahead followed by a draw (which needs the logits the screened
/// step did not write) draws what the unscreened session draws, on the device and from the
/// logits copied to the host.
fn screened_head<R: Runtime>(client: &ComputeClient<R>) {
    use model::SamplingParams;
    let demo = Demo::new();
    for dir in [fixture("qwen2-gqa-untied"), demo.0.clone()] {
        let session = |screen_lm_head| {
            let options = LoadOptions {
                dtype: Some(DType::F32),
                max_len: Some(24),
                screen_lm_head,
                ..LoadOptions::default()
            };
            Session::new(load(client, &dir, &options).unwrap().0).unwrap()
        };
        let (mut plain, mut screened) = (session(false), session(true));
        assert!(screened.model().screens_lm_head() && !plain.model().screens_lm_head());
        let prompt = [3u32, 14, 15, 9, 2, 6];
        let params = SamplingParams {
            temperature: 0.9,
            top_k: 20,
            ..SamplingParams::default()
        };
        let run = |s: &mut Session<R>| {
            s.prefill(&prompt).unwrap();
            let first = s.argmax().unwrap();
            s.decode(first).unwrap();
            let mut tokens = vec![first];
            for _ in 0..6 {
                tokens.push(s.decode_argmax_ahead().unwrap().unwrap());
            }
            let drawn = s.sample_on_device(&params, &tokens, 0.37).unwrap();
            tokens.push(s.decode_argmax_ahead().unwrap().unwrap());
            let mut logits = Vec::new();
            s.logits(&mut logits).unwrap();
            (tokens, drawn, logits)
        };
        let (want, got) = (run(&mut plain), run(&mut screened));
        let what = dir.display();
        assert_eq!(got.0, want.0, "{what}: greedy tokens");
        assert_eq!(got.1, want.1, "{what}: the draw after a screened step");
        let err = worst_row_error(&got.2, &want.2, plain.vocab_size());
        assert!(
            err < 1e-6,
            "{what}: logits after a screened step differ by {err:.2e}"
        );
    }
    // A quantized LM head has nothing to screen.
    let options = LoadOptions {
        screen_lm_head: true,
        compression: model::Compression::Quant {
            mode: model::QuantMode::W8A8,
            lm_head: true,
            decode: model::Decode8::Auto,
        },
        ..LoadOptions::default()
    };
    let err = model::Model::<R>::load(client, &demo.0, &options, &mut |_| {}).unwrap_err();
    assert_eq!(err.kind(), "parameter", "{err}");
}

#[test]
fn a_screened_lm_head_decodes_the_same_tokens() {
    on_each_runtime_one_cuda_at_a_time!(screened_head);
}
