//! Bucket and key naming rules (S3's). Keys never become paths: drives name files by version id.

/// Longest key in bytes.
pub const KEY_BYTES_MAX: usize = 1024;

/// Why a bucket name or key is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error(
        "invalid bucket name {name:?}: {reason} (use 3-63 lowercase letters, digits, '.' and '-', starting and ending with a letter or digit)"
    )]
    Bucket { name: String, reason: &'static str },
    #[error("invalid key: {reason}")]
    Key { reason: String },
}

/// S3 bucket naming rules.
pub fn validate_bucket(name: &str) -> Result<(), NameError> {
    let bad = |reason| Err(NameError::Bucket { name: name.to_owned(), reason });
    if !(3..=63).contains(&name.len()) {
        return bad("length must be 3 to 63");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-') {
        return bad("only lowercase letters, digits, '.' and '-' are allowed");
    }
    let first = name.as_bytes()[0];
    let last = name.as_bytes()[name.len() - 1];
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return bad("must start and end with a letter or digit");
    }
    if name.contains("..") || name.contains(".-") || name.contains("-.") {
        return bad("no adjacent periods or period-hyphen pairs");
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return bad("must not look like an IP address");
    }
    Ok(())
}

/// Keys are 1 to [`KEY_BYTES_MAX`] bytes of UTF-8 without NUL.
pub fn validate_key(key: &str) -> Result<(), NameError> {
    if key.is_empty() {
        return Err(NameError::Key { reason: "empty".into() });
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(NameError::Key { reason: format!("{} bytes, the limit is {KEY_BYTES_MAX}", key.len()) });
    }
    if key.contains('\0') {
        return Err(NameError::Key { reason: "contains a NUL byte".into() });
    }
    Ok(())
}
