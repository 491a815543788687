//! Sensitive answers at rest in the fleet: sealed with AES-256-GCM under `DELTA_SECRETS_KEY`.
//!
//! In the fleet an answer must wait somewhere between the person (gateway) and whichever worker
//! resumes the run: Redis. A sensitive one is stored sealed, bound to its request id, under a key
//! that the gateway and the workers hold and Redis never sees; a Redis dump, `MONITOR` or a
//! replica shows only `sealed:v1:<hex>`. The worker opens it in memory for the tool that needs
//! it. Without a key, the fleet refuses sensitive answers rather than store them in clear.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};

/// Sealed by a key named by its id: `sealed:v2:<key id>:<hex>`.
const PREFIX_V2: &str = "sealed:v2:";
/// Sealed before keys had ids: `sealed:v1:<hex>` (still opened, by trying every key).
const PREFIX_V1: &str = "sealed:v1:";

/// The keys sensitive answers are sealed with: `DELTA_SECRETS_KEY`, one or more keys of 32 bytes
/// (64 hex digits each), separated by commas. The first seals; every one opens what it sealed,
/// found by the key id in the sealed value. So a key is rotated without draining the fleet: put
/// the new key first and keep the old one after it until the answers it sealed are applied.
pub struct SecretsKey {
    /// `(key id, key)`, the sealing key first.
    keys: Vec<(String, LessSafeKey)>,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        write!(f, "SecretsKey(ids: {})", ids.join(", "))
    }
}

/// Why a secret could not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "DELTA_SECRETS_KEY must be one or more keys of 64 hex digits (32 bytes) separated by commas, the sealing key first; make one with `openssl rand -hex 32`"
    )]
    BadKey,
    #[error(
        "a sealed answer could not be opened: it was sealed with a DELTA_SECRETS_KEY this process does not hold, or altered"
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

/// A key's id: the first 8 hex digits of the SHA-256 of its bytes (names the key, reveals
/// nothing usable about it).
fn key_id(bytes: &[u8]) -> String {
    hex(&digest::digest(&digest::SHA256, bytes).as_ref()[..4])
}

fn open_with(key: &LessSafeKey, context: &str, raw: &[u8]) -> Result<String, Error> {
    if raw.len() < NONCE_LEN {
        return Err(Error::Open);
    }
    let (nonce, data) = raw.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Error::Open)?;
    let mut data = data.to_vec();
    let plain = key
        .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
        .map_err(|_| Error::Open)?;
    String::from_utf8(plain.to_vec()).map_err(|_| Error::Open)
}

impl SecretsKey {
    /// Parses one or more keys of 64 hex digits, separated by commas; the first seals.
    pub fn from_hex(s: &str) -> Result<SecretsKey, Error> {
        let mut keys = vec![];
        for part in s.split(',') {
            let bytes = unhex(part.trim())
                .filter(|b| b.len() == 32)
                .ok_or(Error::BadKey)?;
            let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| Error::BadKey)?;
            keys.push((key_id(&bytes), LessSafeKey::new(key)));
        }
        Ok(SecretsKey { keys })
    }

    /// The id of the key that seals (for operators: which key a fleet seals with).
    pub fn sealing_key_id(&self) -> &str {
        self.keys.first().map_or("", |(id, _)| id.as_str())
    }

    /// Seals `plain`, bound to `context` (the request id): it opens only for that request.
    pub fn seal(&self, context: &str, plain: &str) -> Result<String, Error> {
        let (id, key) = self.keys.first().ok_or(Error::BadKey)?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::Random)?;
        let mut data = plain.as_bytes().to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(context.as_bytes()),
            &mut data,
        )
        .map_err(|_| Error::Random)?;
        Ok(format!("{PREFIX_V2}{id}:{}{}", hex(&nonce), hex(&data)))
    }

    /// Opens what [`seal`](Self::seal) made for the same `context`, with whichever of the keys
    /// sealed it (a value sealed before keys had ids is tried with each).
    pub fn open(&self, context: &str, sealed: &str) -> Result<String, Error> {
        if let Some(rest) = sealed.strip_prefix(PREFIX_V2) {
            let (id, body) = rest.split_once(':').ok_or(Error::Open)?;
            let raw = unhex(body).ok_or(Error::Open)?;
            let (_, key) = self.keys.iter().find(|(k, _)| k == id).ok_or(Error::Open)?;
            return open_with(key, context, &raw);
        }
        let raw = sealed
            .strip_prefix(PREFIX_V1)
            .and_then(unhex)
            .ok_or(Error::Open)?;
        self.keys
            .iter()
            .find_map(|(_, key)| open_with(key, context, &raw).ok())
            .ok_or(Error::Open)
    }
}

/// Whether a value has the sealed form. Only for what this fleet stored for a sensitive
/// question: anything a person or bot sends may look like this, and is never opened.
pub fn is_sealed(value: &str) -> bool {
    value.starts_with(PREFIX_V2) || value.starts_with(PREFIX_V1)
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
    fn a_second_key_opens_what_it_sealed_so_rotation_needs_no_drain() {
        let old = SecretsKey::from_hex(KEY).expect("key");
        let new_key = KEY.replace("00", "ee");
        let sealed_by_old = old.seal("req-1", "old-secret").expect("seal");
        // Rotation: the new key first (it seals), the old one after it (it still opens).
        let ring = SecretsKey::from_hex(&format!("{new_key}, {KEY}")).expect("keys");
        assert_ne!(ring.sealing_key_id(), old.sealing_key_id());
        assert_eq!(
            ring.open("req-1", &sealed_by_old).expect("open"),
            "old-secret"
        );
        let sealed_by_new = ring.seal("req-1", "new-secret").expect("seal");
        assert!(sealed_by_new.starts_with(&format!("sealed:v2:{}:", ring.sealing_key_id())));
        assert!(
            old.open("req-1", &sealed_by_new).is_err(),
            "the old key alone cannot"
        );
        // A value from before key ids is tried with every key.
        let legacy = format!(
            "sealed:v1:{}",
            &sealed_by_old[sealed_by_old.rfind(':').unwrap_or(0) + 1..]
        );
        assert_eq!(ring.open("req-1", &legacy).expect("open"), "old-secret");
    }

    #[test]
    fn bad_keys_are_refused_with_how_to_make_one() {
        for bad in [
            "",
            "abc",
            &KEY[..62],
            &format!("{}zz", &KEY[..62]),
            &format!("{KEY},"),
        ] {
            let e = SecretsKey::from_hex(bad).expect_err(bad);
            assert!(e.to_string().contains("openssl rand -hex 32"));
        }
    }
}
