//! Reading a server-sent event stream in tests.
use super::TestApp;

/// One server-sent event frame.
#[derive(Debug, Clone)]
pub struct SseFrame {
    pub id: Option<i64>,
    pub event: String,
    pub data: String,
}

/// A minimal SSE reader over a streaming response.
pub struct Sse {
    resp: reqwest::Response,
    buf: String,
    /// When set, comments (keep-alives) come back as frames with event `comment`.
    pub return_comments: bool,
}

impl Sse {
    pub async fn open(app: &TestApp, token: &str, query: &str, last_event_id: Option<i64>) -> Sse {
        let mut req = app
            .client
            .get(format!("{}/api/v1/events/stream{query}", app.base))
            .bearer_auth(token);
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        Sse::from_response(req.send().await.unwrap())
    }

    pub fn from_response(resp: reqwest::Response) -> Sse {
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        Sse {
            resp,
            buf: String::new(),
            return_comments: false,
        }
    }

    /// The next frame (comments skipped unless `return_comments`), `None` at the end of the stream. Panics after
    /// `within` without one: tests wait on conditions with a deadline, never on fixed sleeps.
    pub async fn next(&mut self, within: std::time::Duration) -> Option<SseFrame> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut frame = SseFrame {
                    id: None,
                    event: "message".into(),
                    data: String::new(),
                };
                let mut any = false;
                for line in block.lines() {
                    if let Some(comment) = line.strip_prefix(':') {
                        if self.return_comments {
                            return Some(SseFrame {
                                id: None,
                                event: "comment".into(),
                                data: comment.trim().to_string(),
                            });
                        }
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        frame.id = v.parse().ok();
                        any = true;
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        frame.event = v.to_string();
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        frame.data.push_str(v);
                        any = true;
                    }
                }
                if any && !frame.data.is_empty() {
                    return Some(frame);
                }
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
                .await
                .expect("no SSE frame before the deadline");
            match chunk.unwrap() {
                Some(bytes) => self.buf.push_str(&String::from_utf8_lossy(&bytes)),
                None => return None,
            }
        }
    }
}
