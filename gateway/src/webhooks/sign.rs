//! Signatures per the Standard Webhooks specification: `webhook-signature: v1,<base64>` where
//! the base64 is the HMAC-SHA256 of `<webhook-id>.<webhook-timestamp>.<body>` under the secret's
//! bytes (the base64 after `whsec_`). Written on `ring` (already the workspace's crypto) rather
//! than with the `standardwebhooks` crate, which would add a second HMAC implementation and its
//! dependencies for a dozen lines; the tests check every signature with the specification's
//! own Python library and a known vector.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// A secret's prefix.
pub const PREFIX: &str = "whsec_";

/// Why a secret cannot sign.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a webhook secret is `whsec_` and base64")]
    BadSecret,
    #[error("no randomness available to make a webhook secret")]
    Random,
}

/// A new secret: `whsec_` and the base64 of 32 random bytes.
pub fn new_secret() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| Error::Random)?;
    Ok(format!("{PREFIX}{}", STANDARD.encode(bytes)))
}

/// One signature (`v1,<base64>`) of `body` sent as `id` at `timestamp` (seconds) under `secret`.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Result<String, Error> {
    let key = STANDARD
        .decode(secret.strip_prefix(PREFIX).unwrap_or(secret))
        .map_err(|_| Error::BadSecret)?;
    let key = hmac::Key::new(hmac::HMAC_SHA256, &key);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(id.as_bytes());
    ctx.update(b".");
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    Ok(format!("v1,{}", STANDARD.encode(ctx.sign().as_ref())))
}

/// The `webhook-signature` header: one signature per secret, space-separated (the current
/// secret's first; the previous one's during a rotation's grace).
pub fn header(secrets: &[&str], id: &str, timestamp: i64, body: &[u8]) -> Result<String, Error> {
    let sigs: Result<Vec<String>, Error> = secrets
        .iter()
        .map(|s| sign(s, id, timestamp, body))
        .collect();
    Ok(sigs?.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector of the Standard Webhooks reference libraries' tests.
    #[test]
    fn the_specifications_vector() {
        let sig = sign(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        )
        .unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn two_secrets_give_two_signatures_and_a_bad_secret_none() {
        let a = new_secret().unwrap();
        let b = new_secret().unwrap();
        assert!(a.starts_with(PREFIX) && a != b);
        assert_eq!(STANDARD.decode(&a[PREFIX.len()..]).unwrap().len(), 32);
        let h = header(&[&a, &b], "id", 1, b"{}").unwrap();
        let parts: Vec<&str> = h.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], sign(&a, "id", 1, b"{}").unwrap());
        assert_ne!(parts[0], parts[1]);
        assert!(matches!(
            sign("whsec_!!", "id", 1, b""),
            Err(Error::BadSecret)
        ));
    }
}
