//! A scripted OpenAI-compatible model server for the real-Pi tests (issue 15): plain tokio and hand-written
//! HTTP/1.1 on 127.0.0.1:0. It records every request body and answers `POST /v1/chat/completions` with
//! `stream: true` server-sent chunks. By default it echoes the last user text ("echo: <text>") in a few
//! chunks; a test can make one reply slow (chunks with a delay each) or gated (held after its first chunk
//! until the test releases it), and asks which requests arrived so far (the whole conversation is in each),
//! waiting with a deadline. A client that drops the connection mid-reply (Pi's `abort`) is recorded as
//! such; the server keeps serving.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a recorded request's reply went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The reply is being written.
    Streaming,
    /// The first chunk went out; the reply waits for its gate.
    Held,
    /// The whole reply went out, `[DONE]` included.
    Completed,
    /// The client closed the connection before the end of the reply (Pi aborting the request).
    Dropped,
}

/// One `POST /v1/chat/completions` as received, with how its reply went.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub body: Value,
    pub outcome: Outcome,
    /// The text the reply carries (all of it, even when the client dropped the connection early).
    pub reply: String,
}

impl ModelRequest {
    /// `(role, text)` for every message but the system prompt, in order: what the model was shown of the
    /// conversation. Text content parts are joined; a string content is taken as it is.
    pub fn conversation(&self) -> Vec<(String, String)> {
        self.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] != "system" && m["role"] != "developer")
            .map(|m| {
                (
                    m["role"].as_str().unwrap_or_default().to_string(),
                    text_of(&m["content"]),
                )
            })
            .collect()
    }

    /// The text of the last user message (what an echo reply repeats).
    pub fn last_user_text(&self) -> String {
        self.conversation()
            .into_iter()
            .rev()
            .find(|(role, _)| role == "user")
            .map(|(_, text)| text)
            .unwrap_or_default()
    }

    /// Whether any message of the conversation sent holds exactly this text.
    pub fn mentions(&self, text: &str) -> bool {
        self.conversation().iter().any(|(_, t)| t == text)
    }
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Holds a gated reply after its first chunk until `release` (then and for every later reply using it).
#[derive(Debug, Clone)]
pub struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Gate {
        Gate(Arc::new(tokio::sync::watch::channel(false).0))
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    pub fn release(&self) {
        self.0.send_replace(true);
    }

    async fn opened(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// How the server answers one request.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `None`: "echo: <last user text>".
    text: Option<String>,
    chunks: usize,
    delay: Duration,
    gate: Option<Gate>,
}

impl Reply {
    /// "echo: <last user text>" in four chunks, at once.
    pub fn echo() -> Reply {
        Reply {
            text: None,
            chunks: 4,
            delay: Duration::ZERO,
            gate: None,
        }
    }

    /// This text instead of the echo.
    pub fn text(text: &str) -> Reply {
        Reply {
            text: Some(text.to_string()),
            ..Reply::echo()
        }
    }

    /// In `chunks` chunks with `delay` after each but the last (a turn that lasts long enough to act in).
    pub fn slow(self, chunks: usize, delay: Duration) -> Reply {
        Reply {
            chunks: chunks.max(1),
            delay,
            ..self
        }
    }

    /// The first chunk goes out (the agent is streaming), then the reply holds until `gate` is released.
    pub fn gated(self, gate: &Gate) -> Reply {
        Reply {
            gate: Some(gate.clone()),
            ..self
        }
    }
}

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<ModelRequest>>,
    /// One-shot replies for a request whose last user text is exactly the key, first match wins.
    scripted: Mutex<Vec<(String, Reply)>>,
    default: Mutex<Option<Reply>>,
}

pub struct ModelServer {
    port: u16,
    shared: Arc<Shared>,
    accept: tokio::task::AbortHandle,
}

impl ModelServer {
    pub async fn start() -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the model server");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let accept = {
            let shared = shared.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    // One task per connection: a client that drops one never stops the others.
                    tokio::spawn(serve(shared.clone(), stream));
                }
            })
            .abort_handle()
        };
        ModelServer { port, shared, accept }
    }

    /// The OpenAI-compatible base URL (`.../v1`), as a provider's `baseUrl`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The next request whose last user text is exactly `user_text` gets `reply` (once).
    pub fn reply_to(&self, user_text: &str, reply: Reply) {
        self.shared
            .scripted
            .lock()
            .unwrap()
            .push((user_text.to_string(), reply));
    }

    /// Every request without a scripted reply gets this one (instead of `Reply::echo()`).
    pub fn set_default(&self, reply: Reply) {
        *self.shared.default.lock().unwrap() = Some(reply);
    }

    /// The requests received so far, oldest first.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Polls the requests until `pred` holds; panics with `what` and the requests after `within`.
    pub async fn wait_until(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&[ModelRequest]) -> bool,
    ) -> Vec<ModelRequest> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let requests = self.requests();
            if pred(&requests) {
                return requests;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the model server never saw {what}; requests so far: {:#?}",
                requests
                    .iter()
                    .map(|r| (r.outcome, r.conversation()))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for request number `n` (1-based) to reach `outcome` and returns it.
    pub async fn wait_request(&self, n: usize, outcome: Outcome, within: Duration) -> ModelRequest {
        let what = format!("request #{n} {outcome:?}");
        self.wait_until(&what, within, |r| r.len() >= n && r[n - 1].outcome == outcome)
            .await
            .swap_remove(n - 1)
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn choose(shared: &Shared, last_user: &str) -> Reply {
    let mut scripted = shared.scripted.lock().unwrap();
    if let Some(i) = scripted.iter().position(|(text, _)| text == last_user) {
        return scripted.remove(i).1;
    }
    shared.default.lock().unwrap().clone().unwrap_or_else(Reply::echo)
}

const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 32 * 1024 * 1024;

/// One request per connection (answered with `connection: close`).
async fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let (mut rd, mut wr) = stream.into_split();
    let Some((method, path, body)) = read_request(&mut rd).await else {
        return;
    };
    if method != "POST" || path.split('?').next() != Some("/v1/chat/completions") {
        let _ = respond(
            &mut wr,
            "404 Not Found",
            &json!({"error": {"message": "no such route"}}),
        )
        .await;
        return;
    }
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let _ = respond(
                &mut wr,
                "400 Bad Request",
                &json!({"error": {"message": e.to_string()}}),
            )
            .await;
            return;
        }
    };
    if body["stream"] != true {
        // Pi always streams; anything else is a change the tests must hear about.
        let _ = respond(
            &mut wr,
            "400 Bad Request",
            &json!({"error": {"message": "the scripted model server only streams"}}),
        )
        .await;
        return;
    }
    let mut record = ModelRequest {
        body,
        outcome: Outcome::Streaming,
        reply: String::new(),
    };
    let reply = choose(&shared, &record.last_user_text());
    let text = reply
        .text
        .clone()
        .unwrap_or_else(|| format!("echo: {}", record.last_user_text()));
    record.reply = text.clone();
    let model = record.body["model"].as_str().unwrap_or("echo").to_string();
    let index = {
        let mut requests = shared.requests.lock().unwrap();
        requests.push(record);
        requests.len() - 1
    };
    let set = |outcome: Outcome| shared.requests.lock().unwrap()[index].outcome = outcome;
    let outcome = stream_reply(&mut rd, &mut wr, &reply, &text, &model, index, &set).await;
    set(outcome);
    let _ = wr.shutdown().await;
}

async fn stream_reply(
    rd: &mut (impl AsyncRead + Unpin),
    wr: &mut (impl AsyncWriteExt + Unpin),
    reply: &Reply,
    text: &str,
    model: &str,
    index: usize,
    set: &impl Fn(Outcome),
) -> Outcome {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                connection: close\r\n\r\n";
    if wr.write_all(head.as_bytes()).await.is_err() {
        return Outcome::Dropped;
    }
    let id = format!("chatcmpl-{index}");
    let pieces = split(text, reply.chunks);
    for (i, piece) in pieces.iter().enumerate() {
        let mut delta = json!({ "content": piece });
        if i == 0 {
            delta["role"] = json!("assistant");
        }
        let chunk = json!({
            "id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": null}],
        });
        if send(wr, &chunk).await.is_err() {
            return Outcome::Dropped;
        }
        if i == 0
            && let Some(gate) = &reply.gate
        {
            set(Outcome::Held);
            tokio::select! {
                _ = gate.opened() => set(Outcome::Streaming),
                _ = closed(rd) => return Outcome::Dropped,
            }
        }
        if i + 1 < pieces.len() && !reply.delay.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(reply.delay) => {}
                _ = closed(rd) => return Outcome::Dropped,
            }
        }
    }
    let words = text.split_whitespace().count() as u64;
    let last = json!({
        "id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": words, "total_tokens": 10 + words},
    });
    if send(wr, &last).await.is_err() || wr.write_all(b"data: [DONE]\n\n").await.is_err() || wr.flush().await.is_err() {
        return Outcome::Dropped;
    }
    Outcome::Completed
}

async fn send(wr: &mut (impl AsyncWriteExt + Unpin), chunk: &Value) -> std::io::Result<()> {
    wr.write_all(format!("data: {chunk}\n\n").as_bytes()).await?;
    wr.flush().await
}

/// Resolves when the peer closes its side (it sends nothing more after its request).
async fn closed(rd: &mut (impl AsyncRead + Unpin)) {
    let mut buf = [0u8; 512];
    loop {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// `text` in `n` pieces of about equal length (on char boundaries; never an empty piece but for "").
fn split(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    let size = chars.len().div_ceil(n.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

async fn respond(wr: &mut (impl AsyncWriteExt + Unpin), status: &str, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    wr.write_all(head.as_bytes()).await?;
    wr.write_all(body.as_bytes()).await?;
    wr.flush().await
}

/// Reads one request: method, path and body (by `content-length` or chunked). `None` on a broken request.
async fn read_request(rd: &mut (impl AsyncRead + Unpin)) -> Option<(String, String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let n = rd.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut rest = buf.split_off(head_end + 4);
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_string();
    let path = request_line.next()?.to_string();
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse::<usize>().ok(),
            "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
            _ => {}
        }
    }
    let body = if chunked {
        read_chunked(rd, rest).await?
    } else {
        let length = length.unwrap_or(0);
        if length > MAX_BODY {
            return None;
        }
        while rest.len() < length {
            let n = rd.read(&mut tmp).await.ok()?;
            if n == 0 {
                return None;
            }
            rest.extend_from_slice(&tmp[..n]);
        }
        rest.truncate(length);
        rest
    };
    Some((method, path, body))
}

async fn read_chunked(rd: &mut (impl AsyncRead + Unpin), mut buf: Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    let mut tmp = [0u8; 8192];
    let mut pos = 0;
    loop {
        // A size line, then that many bytes and CRLF; size 0 ends the body (trailers are not expected).
        let line_end = loop {
            if let Some(i) = buf[pos..].windows(2).position(|w| w == b"\r\n") {
                break pos + i;
            }
            let n = rd.read(&mut tmp).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..n]);
        };
        let size_text = String::from_utf8_lossy(&buf[pos..line_end]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        if body.len() + size > MAX_BODY {
            return None;
        }
        let data_start = line_end + 2;
        while buf.len() < data_start + size + 2 {
            let n = rd.read(&mut tmp).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..n]);
        }
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(&buf[data_start..data_start + size]);
        pos = data_start + size + 2;
    }
}

/// The server on its own, through a plain HTTP client: the echo streamed in chunks, the scripted, slow and
/// gated replies, requests recorded in order, and a client dropping a gated reply leaves the server serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_server_streams_scripts_and_survives_a_dropped_request() {
    const WAIT: Duration = Duration::from_secs(20);
    let server = ModelServer::start().await;
    let client = crate::helpers::client();
    let url = format!("{}/chat/completions", server.base_url());
    let ask = |text: &str| {
        json!({"model": "echo", "stream": true, "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ]})
    };
    let deltas = |sse: &str| -> (Vec<String>, bool) {
        let mut out = Vec::new();
        let mut done = false;
        for data in sse.split("\n\n").filter_map(|f| f.strip_prefix("data: ")) {
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(data).unwrap();
            if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
                out.push(c.to_string());
            }
        }
        (out, done)
    };

    let r = client.post(&url).json(&ask("hello there")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let (pieces, done) = deltas(&r.text().await.unwrap());
    assert_eq!(pieces.concat(), "echo: hello there");
    assert_eq!(pieces.len(), 4, "streamed in several chunks: {pieces:?}");
    assert!(done);

    server.reply_to(
        "script me",
        Reply::text("scripted answer").slow(3, Duration::from_millis(30)),
    );
    let started = std::time::Instant::now();
    let r = client.post(&url).json(&ask("script me")).send().await.unwrap();
    let (pieces, _) = deltas(&r.text().await.unwrap());
    assert_eq!(pieces.concat(), "scripted answer");
    assert_eq!(pieces.len(), 3);
    assert!(
        started.elapsed() >= Duration::from_millis(60),
        "two delays between three chunks"
    );
    // One-shot: the same text is echoed the next time.
    let r = client.post(&url).json(&ask("script me")).send().await.unwrap();
    assert_eq!(deltas(&r.text().await.unwrap()).0.concat(), "echo: script me");

    // Gated: the first chunk, then nothing until released.
    let gate = Gate::new();
    server.reply_to("wait for it", Reply::echo().gated(&gate));
    let mut r = client.post(&url).json(&ask("wait for it")).send().await.unwrap();
    let first = r.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"role\":\"assistant\""));
    server.wait_request(4, Outcome::Held, WAIT).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), r.chunk())
            .await
            .is_err(),
        "a held reply sends nothing more"
    );
    gate.release();
    let mut rest = String::new();
    while let Some(c) = r.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(rest.contains("[DONE]"));
    server.wait_request(4, Outcome::Completed, WAIT).await;

    // The client drops a held reply (as Pi's abort does): recorded, and the server keeps serving.
    let held = Gate::new();
    server.reply_to("dropped", Reply::echo().gated(&held));
    let mut r = client.post(&url).json(&ask("dropped")).send().await.unwrap();
    r.chunk().await.unwrap().unwrap();
    server.wait_request(5, Outcome::Held, WAIT).await;
    drop(r);
    server.wait_request(5, Outcome::Dropped, WAIT).await;
    let r = client.post(&url).json(&ask("still here")).send().await.unwrap();
    assert_eq!(deltas(&r.text().await.unwrap()).0.concat(), "echo: still here");

    let requests = server.requests();
    let said: Vec<String> = requests.iter().map(ModelRequest::last_user_text).collect();
    assert_eq!(
        said,
        [
            "hello there",
            "script me",
            "script me",
            "wait for it",
            "dropped",
            "still here"
        ]
    );
    assert_eq!(
        requests[0].conversation(),
        [("user".to_string(), "hello there".to_string())],
        "the system prompt is left out of the conversation"
    );
    // Anything but the completions route is a 404; a non-streaming request is refused loudly.
    let r = client
        .get(format!("{}/models", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let mut plain = ask("no stream");
    plain["stream"] = json!(false);
    assert_eq!(client.post(&url).json(&plain).send().await.unwrap().status(), 400);
    assert_eq!(server.requests().len(), 6, "refused requests are not recorded");
    // A default for every request without a scripted reply.
    server.set_default(Reply::text("always this").slow(2, Duration::ZERO));
    let r = client.post(&url).json(&ask("anything")).send().await.unwrap();
    assert_eq!(deltas(&r.text().await.unwrap()).0, ["always", " this"]);
}
