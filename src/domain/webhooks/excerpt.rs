//! What berth keeps of a receiver's answer: its status, and at most [`EXCERPT_BYTES`] of its body with
//! anything that looks like a credential replaced, so that a subscription's attempts show why a receiver
//! refused without making berth a way to read what a service behind that URL answers.

/// The most of a receiver's body an attempt keeps.
pub const EXCERPT_BYTES: usize = 100;

/// What replaces a word that looks like a credential.
const REDACTED: &str = "[redacted]";

/// Words after which the next word is a credential's value (`token=...`, `"password": "..."`).
const KEYWORDS: [&str; 10] = [
    "secret",
    "token",
    "password",
    "passwd",
    "key",
    "auth",
    "bearer",
    "cookie",
    "session",
    "credential",
];

/// A credential's characters (base64, hex, JWTs, URL-safe tokens).
fn wordy(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '+' | '=' | '~')
}

/// Long enough and mixed enough to be a generated secret: 16 characters or more, letters and digits.
fn looks_generated(word: &str) -> bool {
    word.len() >= 16 && word.chars().any(|c| c.is_ascii_digit()) && word.chars().any(|c| c.is_ascii_alphabetic())
}

/// Control characters as spaces, runs of whitespace as one, credentials redacted, then at most
/// [`EXCERPT_BYTES`] bytes (cut at a character's boundary, marked with `…`).
pub fn excerpt(body: &[u8]) -> String {
    // Only the start matters; a long body is not scanned whole.
    let text = String::from_utf8_lossy(&body[..body.len().min(4 * 1024)]);
    let mut out = String::new();
    let mut word = String::new();
    let mut after_keyword = false;
    let flush = |word: &mut String, out: &mut String, after_keyword: &mut bool| {
        if word.is_empty() {
            return;
        }
        let lower = word.to_ascii_lowercase();
        let keyword = KEYWORDS.iter().any(|k| lower.contains(k));
        // `token=abc`: the keyword and its value in one word.
        let (name, value) = match word.split_once('=') {
            Some((n, v)) if KEYWORDS.iter().any(|k| n.to_ascii_lowercase().contains(k)) && !v.is_empty() => {
                (Some(n.to_string()), Some(v))
            }
            _ => (None, None),
        };
        if let (Some(name), Some(_)) = (name, value) {
            out.push_str(&name);
            out.push('=');
            out.push_str(REDACTED);
            *after_keyword = false;
        } else if (*after_keyword && !keyword) || looks_generated(word) {
            out.push_str(REDACTED);
            *after_keyword = false;
        } else {
            out.push_str(word);
            *after_keyword = keyword;
        }
        word.clear();
    };
    for c in text.chars() {
        if wordy(c) {
            word.push(c);
            continue;
        }
        flush(&mut word, &mut out, &mut after_keyword);
        let c = if c.is_control() || c.is_whitespace() { ' ' } else { c };
        if !(c == ' ' && (out.is_empty() || out.ends_with(' '))) {
            out.push(c);
        }
    }
    flush(&mut word, &mut out, &mut after_keyword);
    let out = out.trim();
    if out.len() <= EXCERPT_BYTES {
        return out.to_string();
    }
    let mut end = EXCERPT_BYTES;
    while !out.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &out[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_one_line_and_without_credentials() {
        let body = b"{\"error\": \"bad\",\n\t\"token\": \"abc\", \"api_key\": \"xyz\"} Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig password=hunter2";
        let e = excerpt(body);
        assert!(e.len() <= EXCERPT_BYTES + '…'.len_utf8(), "{e}");
        for secret in ["abc", "xyz", "eyJhbGciOiJIUzI1NiJ9", "hunter2"] {
            assert!(!e.contains(secret), "{secret} in {e}");
        }
        assert!(e.starts_with("{\"error\": \"bad\", \"token\": \"[redacted]\""), "{e}");
        assert!(!e.contains('\n') && !e.contains('\t'));
    }

    #[test]
    fn a_generated_looking_word_is_redacted_and_a_long_answer_cut() {
        let e = excerpt(b"internal admin sk_live_0123456789abcdefABCDEF ok");
        assert_eq!(e, "internal admin [redacted] ok");
        let long = "é".repeat(300);
        let e = excerpt(long.as_bytes());
        assert!(e.len() <= EXCERPT_BYTES + '…'.len_utf8() && e.ends_with('…'), "{e}");
        assert_eq!(excerpt(b""), "");
    }
}
