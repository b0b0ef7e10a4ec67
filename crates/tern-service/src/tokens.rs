//! API tokens: `tern_<id>_<secret>`, stored as SHA-256 of the whole string.
//!
//! The id is in the token so a user can name it (`tern token revoke ID`) without the secret;
//! lookups go by the hash (unique index), so no secret is ever compared byte by byte.

use std::path::{Component, Path};

use sha2::{Digest, Sha256};

use crate::model::Scope;

const PREFIX: &str = "tern_";

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn random<const N: usize>() -> Result<[u8; N], String> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| format!("the OS random source failed: {e}"))?;
    Ok(b)
}

/// A fresh (id, token). The token is shown once and never stored.
pub fn generate() -> Result<(String, String), String> {
    let id = hex(&random::<8>()?);
    let token = format!("{PREFIX}{id}_{}", hex(&random::<32>()?));
    Ok((id, token))
}

pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A quick shape check before touching the database: garbage gets a precise message.
pub fn well_formed(token: &str) -> bool {
    let Some(rest) = token.strip_prefix(PREFIX) else { return false };
    let Some((id, secret)) = rest.split_once('_') else { return false };
    id.len() == 16 && secret.len() == 64 && rest.chars().all(|c| c.is_ascii_hexdigit() || c == '_')
}

/// `90d`, `12h`, `30m`, `3600s`, `never` → seconds (None = never expires).
pub fn parse_expiry(s: &str) -> Result<Option<i64>, String> {
    let s = s.trim();
    if s == "never" {
        return Ok(None);
    }
    let err = || format!("expiry '{s}' is not like 90d, 12h, 30m, 3600s or never");
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num.parse().map_err(|_| err())?;
    let mult = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" | "" => 1,
        _ => return Err(err()),
    };
    let secs = n.checked_mul(mult).filter(|&v| v > 0 && v <= 10 * 365 * 86_400).ok_or_else(|| format!("expiry '{s}' must be between 1 s and 10 years"))?;
    Ok(Some(secs))
}

/// A prefix must be absolute and free of `..`, as must every path checked against it.
pub fn valid_prefix(p: &str) -> Result<(), String> {
    let path = Path::new(p);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("path prefix '{p}' must be absolute and contain no '..'"));
    }
    Ok(())
}

/// Lexically under `prefix` (component-wise: /data/a does not contain /data/ab).
pub fn path_allowed(prefix: &str, path: &str) -> bool {
    let p = Path::new(path);
    p.is_absolute() && !p.components().any(|c| c == Component::ParentDir) && p.starts_with(Path::new(prefix))
}

pub fn scope_allows(have: Scope, need: Scope) -> bool {
    have >= need
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_well_formed_and_hashed() {
        let (id, t) = generate().unwrap();
        let (_, t2) = generate().unwrap();
        assert_ne!(t, t2);
        assert!(well_formed(&t) && t.contains(&id));
        assert!(!well_formed("tern_zz_yy") && !well_formed("Bearer x"));
        assert_ne!(hash(&t), hash(&t2));
    }

    #[test]
    fn expiry_and_prefixes() {
        assert_eq!(parse_expiry("90d").unwrap(), Some(90 * 86_400));
        assert_eq!(parse_expiry("never").unwrap(), None);
        assert!(parse_expiry("soon").is_err() && parse_expiry("0d").is_err() && parse_expiry("99999999999d").is_err());
        assert!(path_allowed("/data/a", "/data/a/x"));
        assert!(!path_allowed("/data/a", "/data/ab"));
        assert!(!path_allowed("/data/a", "/data/a/../b"));
        assert!(!path_allowed("/data/a", "rel"));
    }
}
