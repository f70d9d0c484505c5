//! The invite parser: any text is decoded or refused, never panics; a decoded invite encodes
//! back to a line that decodes to the same invite.

#![forbid(unsafe_code)]
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh::pairing::Invite;

fuzz_target!(|text: &str| {
    if let Ok(invite) = Invite::decode(text) {
        assert!(invite.endpoint().is_some() && invite.secret_bytes().is_some());
        assert_eq!(Invite::decode(&invite.encode()), Ok(invite));
    }
});
