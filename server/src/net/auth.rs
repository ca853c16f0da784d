//! Who may call the remote listener: bearer tokens (`--token-file`).

/// Who may call the remote listener: the BLAKE3 hashes of the bearer tokens
/// (`--token-file`). A presented token is hashed and compared with each in
/// constant time, so neither its contents nor its length leak through timing.
pub struct Auth {
    pub(crate) tokens: Vec<[u8; 32]>,
}

impl Auth {
    /// Whether `metadata` carries `authorization: Bearer <one of the tokens>`.
    pub fn allows(&self, metadata: &tonic::metadata::MetadataMap) -> bool {
        let Some(token) = metadata.get("authorization").and_then(|v| v.to_str().ok()).and_then(bearer) else {
            return false;
        };
        let presented = blake3::hash(token.as_bytes());
        // Every token is compared (no early exit): the time taken does not say which matched.
        self.tokens.iter().fold(false, |ok, t| ok | constant_time_eq::constant_time_eq_32(t, presented.as_bytes()))
    }
}

fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim()).filter(|t| !t.is_empty())
}
