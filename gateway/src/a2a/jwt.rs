//! The gateway's signing key for A2A push notifications, its JWKS, and the JWTs that sign each
//! delivery (docs/protocols.md "A2A push notifications").
//!
//! The key is an Ed25519 private key in a PKCS#8 file (PEM or DER), `DELTA_A2A_SIGNING_KEY`:
//! every gateway of a fleet is given the same file, so that a notification signed by any of them
//! verifies against the JWKS any of them serves. Its `kid` is the key's RFC 7638 thumbprint, the
//! same on every gateway and changing with the key. Without the setting, push notifications are
//! off (the card says so and a config is refused with `PushNotificationNotSupported`).

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};

/// The gateway's Ed25519 signing key.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    /// The key's id: its RFC 7638 thumbprint (base64url SHA-256 of its canonical JWK).
    kid: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey(kid {})", self.kid)
    }
}

/// How long a notification's JWT is valid.
const JWT_LIFETIME_S: i64 = 300;

impl SigningKey {
    /// Reads a PKCS#8 Ed25519 key: PEM (`-----BEGIN PRIVATE KEY-----`) or DER.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let der = if bytes.starts_with(b"-----BEGIN") {
            let text = std::str::from_utf8(bytes).map_err(|_| "the PEM file is not text")?;
            if !text.contains("-----BEGIN PRIVATE KEY-----") {
                return Err(
                    "the PEM file holds no `PRIVATE KEY` (PKCS#8); make one with `openssl genpkey -algorithm ed25519`"
                        .into(),
                );
            }
            // Every whitespace goes (CRLF line ends, indentation), not only the line breaks.
            let body: String = text
                .lines()
                .map(str::trim)
                .skip_while(|l| !l.starts_with("-----BEGIN PRIVATE KEY-----"))
                .skip(1)
                .take_while(|l| !l.starts_with("-----END"))
                .flat_map(str::chars)
                .filter(|c| !c.is_whitespace())
                .collect();
            STANDARD
                .decode(body)
                .map_err(|_| "the PEM file's body is not base64")?
        } else {
            bytes.to_vec()
        };
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|_| {
            "not a PKCS#8 Ed25519 private key (make one with `openssl genpkey -algorithm ed25519`)"
                .to_owned()
        })?;
        let x = URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
        // RFC 7638: the required members, in lexicographic order, without whitespace.
        let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
        let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes());
        let kid = URL_SAFE_NO_PAD.encode(digest.as_ref());
        Ok(SigningKey { pair, kid })
    }

    /// The key's id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Value {
        json!({
            "kty": "OKP",
            "crv": "Ed25519",
            "x": URL_SAFE_NO_PAD.encode(self.pair.public_key().as_ref()),
            "kid": self.kid,
            "alg": "EdDSA",
            "use": "sig",
        })
    }

    /// A JWT for a notification whose body is `body`, about `task_id`, posted to a receiver
    /// whose URL's origin is `aud`, issued at `iat` (Unix seconds): `iss`, `aud`, `iat`, `exp`,
    /// `jti`, `task_id` and `request_body_sha256` (hex), signed EdDSA with `kid` in the header.
    pub fn notification_jwt(
        &self,
        issuer: &str,
        aud: &str,
        task_id: &str,
        body: &[u8],
        iat: i64,
    ) -> String {
        let header = json!({"alg": "EdDSA", "typ": "JWT", "kid": self.kid});
        let digest = ring::digest::digest(&ring::digest::SHA256, body);
        let claims = json!({
            "iss": issuer,
            "aud": aud,
            "iat": iat,
            "exp": iat + JWT_LIFETIME_S,
            "jti": uuid::Uuid::new_v4().to_string(),
            "task_id": task_id,
            "request_body_sha256": hex(digest.as_ref()),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self.pair.sign(signing_input.as_bytes());
        format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The JWKS of `key` (no keys without one).
pub fn jwks(key: Option<&SigningKey>) -> Value {
    json!({"keys": key.map(|k| vec![k.jwk()]).unwrap_or_default()})
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ED25519, UnparsedPublicKey};

    fn key() -> SigningKey {
        let der = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
        SigningKey::from_bytes(der.as_ref()).unwrap()
    }

    #[test]
    fn a_jwt_verifies_with_the_jwk_and_carries_the_body_hash_and_kid() {
        let k = key();
        let body = br#"{"statusUpdate":{}}"#;
        let jwt = k.notification_jwt("delta", "https://r.example", "t1", body, 1_700_000_000);
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header["kid"], k.kid());
        assert_eq!(header["alg"], "EdDSA");
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["iat"], 1_700_000_000);
        assert_eq!(claims["aud"], "https://r.example");
        let digest = ring::digest::digest(&ring::digest::SHA256, body);
        assert_eq!(claims["request_body_sha256"], hex(digest.as_ref()));
        let x = URL_SAFE_NO_PAD
            .decode(k.jwk()["x"].as_str().unwrap())
            .unwrap();
        UnparsedPublicKey::new(&ED25519, x)
            .verify(
                format!("{}.{}", parts[0], parts[1]).as_bytes(),
                &URL_SAFE_NO_PAD.decode(parts[2]).unwrap(),
            )
            .expect("signature");
    }

    #[test]
    fn a_pem_key_loads_and_garbage_is_refused() {
        let der = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            STANDARD.encode(der.as_ref())
        );
        let a = SigningKey::from_bytes(pem.as_bytes()).unwrap();
        let b = SigningKey::from_bytes(der.as_ref()).unwrap();
        assert_eq!(a.kid(), b.kid());
        // CRLF line ends and 64-column lines, as Windows tools write PEM files.
        let wrapped: Vec<String> = STANDARD
            .encode(der.as_ref())
            .as_bytes()
            .chunks(64)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        let crlf = format!(
            "-----BEGIN PRIVATE KEY-----\r\n{}\r\n-----END PRIVATE KEY-----\r\n",
            wrapped.join("\r\n")
        );
        assert_eq!(
            SigningKey::from_bytes(crlf.as_bytes()).unwrap().kid(),
            b.kid()
        );
        assert!(SigningKey::from_bytes(b"nonsense").is_err());
        assert!(
            SigningKey::from_bytes(b"-----BEGIN PRIVATE KEY-----\n!!\n-----END PRIVATE KEY-----")
                .is_err()
        );
        assert!(SigningKey::from_bytes(b"-----BEGIN RSA PRIVATE KEY-----\n").is_err());
    }
}
