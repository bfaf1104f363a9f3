//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256 of
//! "<webhook-id>.<webhook-timestamp>.<body>">`, keyed with the secret's bytes (`whsec_<base64>`). While a
//! rotated-out secret still signs, the header carries both signatures, space-separated, as the
//! specification allows, so a receiver holding either secret verifies.
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

const PREFIX: &str = "whsec_";

/// A new secret: 32 random bytes.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    format!("{PREFIX}{}", STANDARD.encode(bytes))
}

/// `v1,<signature>` of one message with one secret (`None`: not a secret berth made).
fn signature(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = STANDARD.decode(secret.strip_prefix(PREFIX)?).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())))
}

/// The `webhook-signature` header: one signature per secret that signs now.
pub fn header(secrets: &[&str], id: &str, timestamp: i64, body: &[u8]) -> String {
    let all: Vec<String> = secrets
        .iter()
        .filter_map(|s| signature(s, id, timestamp, body))
        .collect();
    all.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's own example (standard-webhooks, `spec/standard-webhooks.md`).
    #[test]
    fn signs_as_the_specification_example() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            header(&[secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn two_secrets_sign_twice_and_a_foreign_one_not_at_all() {
        let (a, b) = (new_secret(), new_secret());
        let h = header(&[&a, &b, "not-a-secret"], "m", 1, b"{}");
        assert_eq!(h.split(' ').count(), 2);
        assert!(h.split(' ').all(|s| s.starts_with("v1,")));
    }
}
