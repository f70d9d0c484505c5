//! An endpoint id (a node's public key) read from text: one reader for every place that takes
//! one — `[peers]` in config, the CLI, the org roster, invites, gossip notices.

use iroh::EndpointId;

/// Reads an endpoint id as this project and iroh write them: 64 hex digits (either case) or
/// iroh's base32 form, with or without the `eid:` prefix principals name a key by, blanks
/// around it ignored. `None` when it is none of these, or not a valid key.
pub fn parse(text: &str) -> Option<EndpointId> {
    let text = text.trim();
    let text = text.strip_prefix("eid:").unwrap_or(text);
    let hex: Option<[u8; 32]> = data_encoding::HEXLOWER_PERMISSIVE
        .decode(text.as_bytes())
        .ok()
        .and_then(|bytes| bytes.try_into().ok());
    match hex {
        Some(bytes) => EndpointId::from_bytes(&bytes).ok(),
        None => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_a_key_is_written_in_reads_as_that_key() {
        let id = iroh::SecretKey::from_bytes(&[7; 32]).public();
        let hex = data_encoding::HEXLOWER.encode(id.as_bytes());
        let base32 = data_encoding::BASE32_NOPAD
            .encode(id.as_bytes())
            .to_ascii_lowercase();
        for text in [
            hex.clone(),
            hex.to_ascii_uppercase(),
            format!("eid:{hex}"),
            format!("  {hex}\n"),
            id.to_string(),
            base32,
        ] {
            assert_eq!(parse(&text), Some(id), "{text:?}");
        }
        for bad in ["", "eid:", "abc", &hex[..62], &format!("{hex}00"), "eid:zz"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
