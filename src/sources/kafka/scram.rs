//! SASL SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677), client side.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{KeyInit, Mac};

use super::config::SaslMechanism;

/// One SCRAM exchange.
pub struct Client {
    mechanism: SaslMechanism,
    password: String,
    nonce: String,
    client_first_bare: String,
    server_signature: Vec<u8>,
}

macro_rules! scram_fns {
    ($hmac:ident, $hash:ident, $digest:ty) => {
        fn $hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
            let mut mac = <hmac::Hmac<$digest> as KeyInit>::new_from_slice(key)
                .expect("HMAC takes keys of any length");
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        fn $hash(data: &[u8]) -> Vec<u8> {
            use sha2::Digest as _;
            <$digest>::digest(data).to_vec()
        }
    };
}
scram_fns!(hmac256, sha256, sha2::Sha256);
scram_fns!(hmac512, sha512, sha2::Sha512);

impl Client {
    pub fn new(mechanism: SaslMechanism, user: &str, password: &str) -> Client {
        let mut raw = [0u8; 24];
        if getrandom::fill(&mut raw).is_err() {
            // No OS randomness: fall back to a non-repeating nonce; SCRAM
            // needs uniqueness, the password never depends on it.
            for (i, b) in raw.iter_mut().enumerate() {
                *b = fastrand::u8(..).wrapping_add(i as u8);
            }
        }
        Client::with_nonce(mechanism, user, password, &B64.encode(raw))
    }

    fn with_nonce(mechanism: SaslMechanism, user: &str, password: &str, nonce: &str) -> Client {
        let name = user.replace('=', "=3D").replace(',', "=2C");
        Client {
            mechanism,
            password: password.to_string(),
            nonce: nonce.to_string(),
            client_first_bare: format!("n={name},r={nonce}"),
            server_signature: Vec::new(),
        }
    }

    fn hmac(&self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self.mechanism {
            SaslMechanism::ScramSha512 => hmac512(key, data),
            _ => hmac256(key, data),
        }
    }

    fn hash(&self, data: &[u8]) -> Vec<u8> {
        match self.mechanism {
            SaslMechanism::ScramSha512 => sha512(data),
            _ => sha256(data),
        }
    }

    /// `n,,n=user,r=nonce`.
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// Answers the server's first message with the proof.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, String> {
        let server_first = std::str::from_utf8(server_first)
            .map_err(|_| "the server's SCRAM message is not UTF-8".to_string())?;
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for part in server_first.split(',') {
            if let Some(v) = part.strip_prefix("r=") {
                nonce = Some(v);
            } else if let Some(v) = part.strip_prefix("s=") {
                salt = Some(B64.decode(v).map_err(|_| "bad SCRAM salt".to_string())?);
            } else if let Some(v) = part.strip_prefix("i=") {
                iterations = v.parse::<u32>().ok();
            } else if let Some(v) = part.strip_prefix("e=") {
                return Err(format!("the server refused: {v}"));
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(format!("unexpected SCRAM message \"{server_first}\""));
        };
        if !nonce.starts_with(&self.nonce) || iterations == 0 {
            return Err("the server's SCRAM nonce or iteration count is invalid".into());
        }
        let salted = self.hi(&salt, iterations);
        let client_key = self.hmac(&salted, b"Client Key");
        let stored_key = self.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = self.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = self.hmac(&salted, b"Server Key");
        self.server_signature = self.hmac(&server_key, auth_message.as_bytes());
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server's signature: the broker knew the password too.
    pub fn verify_server(&self, server_final: &[u8]) -> Result<(), String> {
        let text = String::from_utf8_lossy(server_final);
        if let Some(e) = text.strip_prefix("e=") {
            return Err(format!("the server refused: {e}"));
        }
        let v = text
            .strip_prefix("v=")
            .and_then(|v| B64.decode(v.split(',').next().unwrap_or("")).ok())
            .ok_or_else(|| format!("unexpected SCRAM message \"{text}\""))?;
        if v != self.server_signature {
            return Err("the server's SCRAM signature does not match".into());
        }
        Ok(())
    }

    /// PBKDF2 with the mechanism's HMAC, one block (the digest length).
    fn hi(&self, salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut block = salt.to_vec();
        block.extend_from_slice(&1u32.to_be_bytes());
        let mut u = self.hmac(self.password.as_bytes(), &block);
        let mut out = u.clone();
        for _ in 1..iterations {
            u = self.hmac(self.password.as_bytes(), &u);
            for (o, x) in out.iter_mut().zip(&u) {
                *o ^= x;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exchange of RFC 7677 §3.
    #[test]
    fn rfc7677_sha256_exchange() {
        let mut c = Client::with_nonce(
            SaslMechanism::ScramSha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO",
        );
        assert_eq!(c.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first =
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let fin = c.client_final(server_first).unwrap();
        assert_eq!(
            String::from_utf8(fin).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        c.verify_server(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert!(
            c.verify_server(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
                .is_err()
        );
    }

    #[test]
    fn a_foreign_nonce_is_refused() {
        let mut c = Client::with_nonce(SaslMechanism::ScramSha512, "u", "p", "abc");
        assert!(c.client_final(b"r=xyz,s=QUJD,i=4096").is_err());
        assert!(c.client_final(b"e=invalid-proof").is_err());
    }
}
