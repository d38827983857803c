//! The server over HTTP with a real client (ureq), on the demo model, on the first runtime the
//! test kit finds (wgpu's software Vulkan in CI): the OpenAI endpoints whole and streamed,
//! concurrent clients, a client that leaves mid-stream, bad requests, a full queue and a
//! graceful shutdown. After every error the server must keep serving.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cubecl::prelude::*;
use model::{BatchSession, GenerationConfig, LoadOptions, Model, ModelConfig, Tokenizer};
use serde_json::{json, Value};
use server::{Engine, EngineOptions};

const MODEL: &str = "cubellm-demo";

/// A server on a free loopback port, serving until `stop` is sent.
struct TestServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Asks for a graceful shutdown and waits until the server has drained and stopped.
    fn shut_down(mut self) -> std::io::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap()
    }
}

fn engine_on<R: Runtime>(
    client: ComputeClient<R>,
    max_waiting: usize,
    max_batch: usize,
) -> Arc<Engine> {
    let dir = model::demo::ensure_demo_model().unwrap();
    let config = ModelConfig::from_dir(&dir).unwrap();
    let generation = GenerationConfig::from_dir(&dir).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir, &config, &generation).unwrap();
    Engine::start(
        EngineOptions {
            model_id: MODEL.into(),
            max_waiting,
        },
        tokenizer,
        generation,
        move || {
            let (model, _) = Model::<R>::load(&client, &dir, &LoadOptions::default(), &mut |_| {})?;
            BatchSession::new(model, max_batch, true)
        },
    )
    .unwrap()
}

/// A server whose engine decodes up to `max_batch` requests together, with `max_waiting` more
/// allowed to wait for a slot.
fn start(max_waiting: usize, max_batch: usize) -> TestServer {
    let backend = testkit::backends()[0];
    let engine = testkit::runtime::with_runtime!(backend, |client: R| engine_on::<R>(
        client,
        max_waiting,
        max_batch
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        rt.block_on(server::serve(listener, engine, async {
            let _ = stopped.await;
        }))
    });
    TestServer {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    }
}

/// The server most tests share (8 requests decoded together, a queue of 64).
fn shared() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start(64, 8))
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(300))
        .build()
}

/// POSTs `body` (raw text) and returns the status and the parsed JSON answer.
fn post_raw(url: &str, body: &str) -> (u16, Value) {
    let response = match agent()
        .post(url)
        .set("Content-Type", "application/json")
        .send_string(body)
    {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    let status = response.status();
    let text = response.into_string().unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    (status, value)
}

fn post(url: &str, body: &Value) -> (u16, Value) {
    post_raw(url, &body.to_string())
}

fn get(url: &str) -> (u16, String) {
    match agent().get(url).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// The `data:` payloads of a streamed answer, read to the end.
fn stream(url: &str, body: &Value) -> Vec<String> {
    let response = agent()
        .post(url)
        .send_string(&body.to_string())
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    assert_eq!(response.status(), 200);
    assert!(response
        .header("content-type")
        .unwrap_or_default()
        .starts_with("text/event-stream"));
    BufReader::new(response.into_reader())
        .lines()
        .map(Result::unwrap)
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

/// The text of a streamed answer, checking the stream's framing on the way: JSON chunks, one
/// finish reason on the last choice, `[DONE]` last.
fn streamed_text(events: &[String], chat: bool) -> (String, String) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let mut text = String::new();
    let mut finish = None;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        let Some(choice) = v["choices"].get(0) else {
            continue; // the usage chunk
        };
        assert!(
            finish.is_none(),
            "a chunk after the finish reason: {events:?}"
        );
        let piece = if chat {
            assert_eq!(v["object"], "chat.completion.chunk");
            &choice["delta"]["content"]
        } else {
            assert_eq!(v["object"], "text_completion");
            &choice["text"]
        };
        text.push_str(piece.as_str().unwrap_or_default());
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    (text, finish.expect("a finish reason"))
}

fn chat_body(content: &str, seed: u64, max_tokens: u32) -> Value {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": content}
        ],
        "max_tokens": max_tokens,
        "temperature": 0.9,
        "top_p": 0.95,
        "top_k": 40,
        "seed": seed,
    })
}

fn metric(server: &TestServer, line_start: &str) -> f64 {
    let (_, text) = get(&server.url("/metrics"));
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in {text}"))
}

#[test]
fn models_health_and_unknown_paths() {
    let s = shared();
    let (status, body) = get(&s.url("/v1/models"));
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(get(&s.url(&format!("/v1/models/{MODEL}"))).0, 200);
    let (status, body) = get(&s.url("/v1/models/gpt-4"));
    assert_eq!(status, 404);
    assert!(body.contains("model_not_found"), "{body}");
    assert_eq!(get(&s.url("/health")).0, 200);
    let (status, body) = get(&s.url("/v1/nothing"));
    assert_eq!(status, 404);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

#[test]
fn chat_completion_whole_and_streamed_agree() {
    let s = shared();
    let url = s.url("/v1/chat/completions");
    let body = chat_body("Say something.", 7, 12);
    let (status, whole) = post(&url, &body);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], MODEL);
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let text = choice["message"]["content"].as_str().unwrap().to_string();
    let finish = choice["finish_reason"].as_str().unwrap();
    assert!(finish == "stop" || finish == "length", "{whole}");
    let usage = &whole["usage"];
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    assert!(prompt > 5 && (1..=12).contains(&completion), "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt + completion);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = stream(&url, &streamed);
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let (streamed_text, streamed_finish) = streamed_text(&events, true);
    assert_eq!(
        streamed_text, text,
        "same seed, same text, whole or streamed"
    );
    assert_eq!(streamed_finish, finish);
    let usage_chunk: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], *usage);
}

#[test]
fn text_completion_whole_and_streamed_agree_and_stop_strings_cut() {
    let s = shared();
    let url = s.url("/v1/completions");
    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 16,
                      "temperature": 0, "ignore_eos": true});
    let (status, whole) = post(&url, &body);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 16);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (streamed_text, finish) = streamed_text(&stream(&url, &streamed), false);
    assert_eq!(streamed_text, text);
    assert_eq!(finish, "length");

    // A stop string taken from the greedy text ends the answer before it, with "stop".
    let cut = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map(|(i, _)| i);
    if let Some(at) = cut.filter(|&i| i > 0) {
        let stop: String = text[at..].chars().take(3).collect();
        let mut stopped = body.clone();
        stopped["stop"] = json!([stop]);
        let (status, v) = post(&url, &stopped);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let got = v["choices"][0]["text"].as_str().unwrap();
        assert_eq!(got, &text[..text.find(&stop).unwrap()]);
    }
}

#[test]
fn eight_concurrent_clients_get_what_each_gets_alone() {
    let s = shared();
    let url = s.url("/v1/chat/completions");
    let bodies: Vec<Value> = (0..8)
        .map(|i| chat_body(&format!("Question number {i}?"), 100 + i, 10))
        .collect();
    let alone: Vec<Value> = bodies
        .iter()
        .map(|b| post(&url, b).1["choices"][0]["message"]["content"].clone())
        .collect();
    let together: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|b| {
                let url = url.clone();
                scope.spawn(move || {
                    let (status, v) = post(&url, b);
                    assert_eq!(status, 200, "{v}");
                    v["choices"][0]["message"]["content"].clone()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    // They were decoded together, not one after the other.
    let batch = metric(s, "cubellm_decode_batch_max");
    assert!(batch > 1.0, "the most sequences in one step: {batch}");
}

#[test]
fn bad_requests_are_clear_errors_and_the_server_keeps_serving() {
    let s = shared();
    let chat = s.url("/v1/chat/completions");
    let completions = s.url("/v1/completions");
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("malformed JSON", r#"{"messages": [}"#.into(), 400, None),
        ("not an object", "[1, 2]".into(), 400, None),
        (
            "unknown model",
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            404,
            Some("model"),
        ),
        (
            "no messages",
            json!({"model": MODEL}).to_string(),
            400,
            Some("messages"),
        ),
        (
            "empty messages",
            json!({"messages": []}).to_string(),
            400,
            Some("messages"),
        ),
        (
            "bad role",
            json!({"messages": [{"role": "wizard", "content": "hi"}]}).to_string(),
            400,
            Some("messages[0].role"),
        ),
        (
            "negative temperature",
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}).to_string(),
            400,
            Some("temperature"),
        ),
        (
            "top_p above 1",
            json!({"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}).to_string(),
            400,
            Some("top_p"),
        ),
        (
            "max_tokens as text",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"})
                .to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "zero max_tokens",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "n = 2",
            json!({"messages": [{"role": "user", "content": "hi"}], "n": 2}).to_string(),
            400,
            Some("n"),
        ),
        (
            "over-long prompt",
            json!({"messages": [{"role": "user", "content": "word ".repeat(4000)}]}).to_string(),
            400,
            Some("messages"),
        ),
    ];
    for (what, body, status, param) in cases {
        let (got, v) = post_raw(&chat, &body);
        assert_eq!(got, status, "{what}: {v}");
        let error = &v["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        assert!(error["type"].is_string(), "{what}: {v}");
        if let Some(p) = param {
            assert_eq!(error["param"], p, "{what}: {v}");
        }
    }
    let (status, v) = post(&completions, &json!({"prompt": "word ".repeat(4000)}));
    assert_eq!(status, 400);
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let (status, v) = post(&completions, &json!({"prompt": ["a", "b"]}));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "prompt");

    // Still serving.
    let (status, v) = post(&chat, &chat_body("Still there?", 1, 4));
    assert_eq!(status, 200, "{v}");
    assert!(metric(s, "cubellm_requests_total{outcome=\"rejected\"}") >= 14.0);
}

/// A client that disconnects (waiting for a whole answer, or mid-stream) cancels its generation
/// (the engine moves on long before the 400 tokens it asked for), and the server keeps serving; and a request beyond the queue is
/// refused with 503 while the others complete. Its own server, with one request decoded at a
/// time and a queue of one.
#[test]
fn disconnects_cancel_and_a_full_queue_refuses() {
    let s = start(1, 1);
    let url = s.url("/v1/completions");
    let long = json!({"prompt": "Tell a long story", "max_tokens": 400, "ignore_eos": true,
                      "temperature": 0, "stream": true});

    let cancelled_reaches = |n: f64| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while metric(&s, "cubellm_requests_total{outcome=\"cancelled\"}") < n {
            assert!(
                Instant::now() < deadline,
                "the disconnect never cancelled the generation"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    // A stream left after two chunks.
    let response = agent().post(&url).send_string(&long.to_string()).unwrap();
    let mut lines = BufReader::new(response.into_reader()).lines();
    let mut seen = 0;
    while seen < 2 {
        if lines.next().unwrap().unwrap().starts_with("data: ") {
            seen += 1;
        }
    }
    drop(lines);
    cancelled_reaches(1.0);
    assert_eq!(
        metric(&s, "cubellm_requests_total{outcome=\"completed\"}"),
        0.0
    );
    let generated = metric(&s, "cubellm_generated_tokens_total");
    assert!(
        generated < 400.0,
        "{generated} tokens generated for a client that left"
    );

    // A whole (not streamed) answer whose client stops waiting: timed against the same request
    // answered in full, so that there is something left to cancel (a fast device answers 400
    // tokens of the demo model before a client's patience runs out).
    let mut whole = long.clone();
    whole["stream"] = json!(false);
    // Timed on its second run: the first one may still compile kernels or capture a graph.
    let (status, v) = post(&url, &whole);
    assert_eq!(status, 200, "{v}");
    let started = Instant::now();
    let (status, v) = post(&url, &whole);
    assert_eq!(status, 200, "{v}");
    let patience = Duration::from_millis(500);
    if started.elapsed() > 4 * patience {
        let impatient = ureq::AgentBuilder::new().timeout(patience).build();
        assert!(impatient
            .post(&url)
            .send_string(&whole.to_string())
            .is_err());
        cancelled_reaches(2.0);
        assert_eq!(
            metric(&s, "cubellm_requests_total{outcome=\"completed\"}"),
            2.0
        );
    }

    // One request running (reading its stream slowly), one waiting: the third is refused.
    let running = agent().post(&url).send_string(&long.to_string()).unwrap();
    let mut running = BufReader::new(running.into_reader()).lines();
    assert!(running.next().unwrap().unwrap().starts_with("data: "));
    let waiting_url = url.clone();
    let waiting = std::thread::spawn(move || {
        post(
            &waiting_url,
            &json!({"prompt": "Hi", "max_tokens": 3, "ignore_eos": true}),
        )
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&s, "cubellm_queue_depth") < 1.0 {
        assert!(Instant::now() < deadline, "the second request never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, v) = post(&url, &json!({"prompt": "Hi", "max_tokens": 3}));
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    drop(running);
    let (status, v) = waiting.join().unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(
        metric(&s, "cubellm_requests_total{outcome=\"overloaded\"}"),
        1.0
    );
    s.shut_down().unwrap();
}

/// A shutdown lets the request in flight finish (its stream ends with `[DONE]`), then the
/// server stops accepting connections and `serve` returns.
#[test]
fn shutdown_drains_the_request_in_flight() {
    let s = start(4, 4);
    let url = s.url("/v1/completions");
    let body = json!({"prompt": "Count", "max_tokens": 40, "ignore_eos": true, "stream": true,
                      "temperature": 0});
    let response = agent().post(&url).send_string(&body.to_string()).unwrap();
    let mut lines = BufReader::new(response.into_reader()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("data: "));
    let addr = s.addr;
    let stopper = std::thread::spawn(move || s.shut_down());
    let rest: Vec<String> = lines
        .map(Result::unwrap)
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect();
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"));
    stopper.join().unwrap().unwrap();
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still accepting after shutdown"
    );
}
