//! Sensitive answers at rest in the fleet: sealed with AES-256-GCM under `DELTA_SECRETS_KEY`.
//!
//! In the fleet an answer must wait somewhere between the person (gateway) and whichever worker
//! resumes the run: Redis. A sensitive one is stored sealed, bound to its request id, under a key
//! that the gateway and the workers hold and Redis never sees; a Redis dump, `MONITOR` or a
//! replica shows only `sealed:v1:<hex>`. The worker opens it in memory for the tool that needs
//! it. Without a key, the fleet refuses sensitive answers rather than store them in clear.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

const PREFIX: &str = "sealed:v1:";

/// The key sensitive answers are sealed with (32 bytes, given as 64 hex digits).
pub struct SecretsKey(LessSafeKey);

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(…)")
    }
}

/// Why a secret could not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("DELTA_SECRETS_KEY must be 64 hex digits (32 bytes), e.g. from `openssl rand -hex 32`")]
    BadKey,
    #[error(
        "a sealed answer could not be opened: it was sealed with another DELTA_SECRETS_KEY, or altered"
    )]
    Open,
    #[error("no randomness available to seal a secret")]
    Random,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

impl SecretsKey {
    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Result<SecretsKey, Error> {
        let bytes = unhex(s.trim())
            .filter(|b| b.len() == 32)
            .ok_or(Error::BadKey)?;
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| Error::BadKey)?;
        Ok(SecretsKey(LessSafeKey::new(key)))
    }

    /// Seals `plain`, bound to `context` (the request id): it opens only for that request.
    pub fn seal(&self, context: &str, plain: &str) -> Result<String, Error> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::Random)?;
        let mut data = plain.as_bytes().to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut data,
            )
            .map_err(|_| Error::Random)?;
        Ok(format!("{PREFIX}{}{}", hex(&nonce), hex(&data)))
    }

    /// Opens what [`seal`](Self::seal) made for the same `context`.
    pub fn open(&self, context: &str, sealed: &str) -> Result<String, Error> {
        let raw = sealed
            .strip_prefix(PREFIX)
            .and_then(unhex)
            .filter(|r| r.len() >= NONCE_LEN)
            .ok_or(Error::Open)?;
        let (nonce, data) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Error::Open)?;
        let mut data = data.to_vec();
        let plain = self
            .0
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
            .map_err(|_| Error::Open)?;
        String::from_utf8(plain.to_vec()).map_err(|_| Error::Open)
    }
}

/// Whether a stored value is a sealed secret.
pub fn is_sealed(value: &str) -> bool {
    value.starts_with(PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn a_sealed_secret_opens_only_with_its_key_and_request() {
        let key = SecretsKey::from_hex(KEY).expect("key");
        let sealed = key.seal("req-1", "hunter2-canary").expect("seal");
        assert!(is_sealed(&sealed) && !sealed.contains("hunter2"));
        assert_ne!(sealed, key.seal("req-1", "hunter2-canary").expect("seal"));
        assert_eq!(key.open("req-1", &sealed).expect("open"), "hunter2-canary");
        assert!(matches!(key.open("req-2", &sealed), Err(Error::Open)));
        let other = SecretsKey::from_hex(&KEY.replace("1f", "ff")).expect("key");
        assert!(matches!(other.open("req-1", &sealed), Err(Error::Open)));
        let mut tampered = sealed.clone();
        let last = tampered.pop();
        tampered.push(if last == Some('0') { '1' } else { '0' });
        assert!(key.open("req-1", &tampered).is_err());
        assert!(key.open("req-1", "plain").is_err());
    }

    #[test]
    fn bad_keys_are_refused_with_how_to_make_one() {
        for bad in ["", "abc", &KEY[..62], &format!("{}zz", &KEY[..62])] {
            let e = SecretsKey::from_hex(bad).expect_err(bad);
            assert!(e.to_string().contains("openssl rand -hex 32"));
        }
    }
}
