//! The gateway's bearer token: minted once per profile (32 random bytes, URL-safe base64) and
//! kept `0600` beside the device key, so it stays the same across gateway restarts and the
//! clients configured with it keep working. Never logged. And the policy around it: a token
//! unless waived on loopback, never waived beyond it. The status page keeps a token of its own
//! the same way ([`load_or_mint`] with its own file).

use std::net::SocketAddr;
use std::path::Path;

use super::GatewayError;
use crate::paths::Profile;

/// The shortest token a user may give: 22 base64url characters carry 128 bits.
pub const MIN_GIVEN_LEN: usize = 22;

/// Longer than any token this module mints or a person would write.
const MAX_LEN: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot store a new token in {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    /// A link, another user's file, or a file others may read: never used.
    #[error("{0} (if the token may have leaked, delete the file: a new one is minted)")]
    Unsafe(#[from] crate::files::Untrusted),
    #[error("the token {path} is damaged: delete it and a new one is minted")]
    Malformed { path: String },
    #[error("no randomness for a token: {0}")]
    Random(String),
}

/// The token in `path`, minted and stored (`0600`) if there is none yet.
pub fn load_or_mint(path: &Path) -> Result<String, TokenError> {
    match read(path)? {
        Some(token) => Ok(token),
        None => mint(path),
    }
}

/// The token kept as a secret in `path`; `None` when there is no file.
fn read(path: &Path) -> Result<Option<String>, TokenError> {
    let Some(bytes) = crate::files::read_secret(path, MAX_LEN)? else {
        return Ok(None);
    };
    let malformed = || TokenError::Malformed {
        path: path.display().to_string(),
    };
    let text = String::from_utf8(bytes).map_err(|_| malformed())?;
    let token = text.trim();
    // What goes in an `Authorization` header as it is: visible ASCII, no spaces.
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(malformed());
    }
    Ok(Some(token.to_owned()))
}

fn mint(path: &Path) -> Result<String, TokenError> {
    let failed = |source| TokenError::Create {
        path: path.display().to_string(),
        source,
    };
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| TokenError::Random(e.to_string()))?;
    let token = data_encoding::BASE64URL_NOPAD.encode(&raw);
    // Of two minting at once (a gateway and `mcpmesh use`) the first wins and the other reads
    // what it wrote.
    if crate::files::create_private_once(path, format!("{token}\n").as_bytes()).map_err(failed)? {
        return Ok(token);
    }
    read(path)?.ok_or_else(|| failed(std::io::Error::from(std::io::ErrorKind::NotFound)))
}

/// Where the gateway's bearer token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenChoice {
    /// The profile's token file, minted on first use: the default.
    Profile,
    /// A token given with `--token` (or `MCPMESH_GATEWAY_TOKEN`).
    Given(String),
    /// `--no-token`: every local user may act as this node through the gateway.
    Waived,
}

/// Checks the bind policy: a token (a given one at least [`MIN_GIVEN_LEN`] characters) unless
/// waived on loopback; beyond loopback, `--allow-remote`, a token and TLS.
pub fn check_bind(
    listen: SocketAddr,
    allow_remote: bool,
    token: &TokenChoice,
    tls: bool,
) -> Result<(), GatewayError> {
    if matches!(token, TokenChoice::Given(t) if t.is_empty()) {
        return Err(GatewayError::EmptyToken);
    }
    if matches!(token, TokenChoice::Given(t) if t.len() < MIN_GIVEN_LEN) {
        return Err(GatewayError::ShortToken);
    }
    if listen.ip().is_loopback() {
        return Ok(());
    }
    if !allow_remote || *token == TokenChoice::Waived {
        return Err(GatewayError::NotLoopback(listen));
    }
    if !tls {
        return Err(GatewayError::NeedsTls(listen));
    }
    Ok(())
}

/// The token requests must carry: given, or the profile's (minted if it has none yet); `None`
/// when waived.
pub fn resolve_token(
    choice: TokenChoice,
    profile: &Profile,
) -> Result<Option<String>, GatewayError> {
    match choice {
        TokenChoice::Given(t) => Ok(Some(t)),
        TokenChoice::Waived => Ok(None),
        TokenChoice::Profile => {
            profile.create_dirs().map_err(GatewayError::Dirs)?;
            Ok(Some(load_or_mint(&profile.gateway_token_file())?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_token_is_minted_private_and_kept_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.token");
        let token = load_or_mint(&path).unwrap();
        assert_eq!(token.len(), 43, "{token}");
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load_or_mint(&path).unwrap(), token);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no draft left"
        );
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_mint(&other.path().join("t")).unwrap(), token);
    }

    #[test]
    fn a_token_others_can_read_or_a_damaged_one_is_refused_without_showing_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.token");
        let token = load_or_mint(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_mint(&path).unwrap_err().to_string();
        assert!(
            e.contains("readable by others") && e.contains("chmod 600"),
            "{e}"
        );
        assert!(!e.contains(&token), "{e}");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "two words\n").unwrap();
        let e = load_or_mint(&path).unwrap_err().to_string();
        assert!(e.contains("damaged") && !e.contains("words"), "{e}");
    }

    #[test]
    fn a_link_planted_at_the_token_path_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere.token");
        let theirs = load_or_mint(&elsewhere).unwrap();
        let path = dir.path().join("gateway.token");
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let e = load_or_mint(&path).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(!e.contains(&theirs), "{e}");
    }

    #[test]
    fn a_token_is_required_unless_waived_on_loopback_and_remote_needs_allow_remote_too() {
        use TokenChoice::{Given, Profile, Waived};
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let lo6: SocketAddr = "[::1]:0".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let given = || Given("a-user-chosen-token-long-enough".into());
        for (listen, allow_remote, token, tls, ok) in [
            (lo, false, Profile, false, true),
            (lo, false, given(), false, true),
            (lo6, false, Waived, false, true),
            (lo, false, Given(String::new()), false, false),
            (any, false, Profile, true, false),
            (any, false, given(), true, false),
            (any, true, Waived, true, false),
            (any, true, Given(String::new()), true, false),
            (any, true, Profile, false, false),
            (any, true, given(), false, false),
            (any, true, Profile, true, true),
            (any, true, given(), true, true),
        ] {
            let verdict = check_bind(listen, allow_remote, &token, tls);
            assert_eq!(
                verdict.is_ok(),
                ok,
                "{listen} {allow_remote} {token:?} {tls}: {verdict:?}"
            );
            if let Err(GatewayError::NeedsTls(_)) = &verdict {
                let e = verdict.unwrap_err().to_string();
                assert!(e.contains("--tls-cert") && e.contains("--tls-key"), "{e}");
            }
        }
    }

    #[test]
    fn a_given_token_shorter_than_128_bits_is_refused_clearly() {
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for short in ["t", "s3cret-t0ken", "abcdefghijklmnopqrstu"] {
            let e = check_bind(lo, false, &TokenChoice::Given(short.into()), false)
                .unwrap_err()
                .to_string();
            assert!(e.contains("too short") && e.contains("22"), "{e}");
            assert!(
                short.len() < 2 || !e.contains(short),
                "the refusal shows the token: {e}"
            );
        }
        let just_enough = "abcdefghijklmnopqrstuv";
        assert!(check_bind(lo, false, &TokenChoice::Given(just_enough.into()), false).is_ok());
    }

    #[test]
    fn the_profiles_token_is_minted_once_and_a_waived_one_is_none() {
        let home = tempfile::tempdir().unwrap();
        let profile = Profile::at(home.path().join("node"));
        let first = resolve_token(TokenChoice::Profile, &profile).unwrap();
        assert!(first.as_ref().is_some_and(|t| t.len() == 43), "{first:?}");
        assert_eq!(
            resolve_token(TokenChoice::Profile, &profile).unwrap(),
            first
        );
        assert_eq!(resolve_token(TokenChoice::Waived, &profile).unwrap(), None);
        let given = resolve_token(
            TokenChoice::Given("mine-and-long-enough-too".into()),
            &profile,
        )
        .unwrap();
        assert_eq!(given.as_deref(), Some("mine-and-long-enough-too"));
    }
}
