//! The org invite parser: any text is decoded or refused, never panics; a decoded invite names
//! the admin, the root and the secret, and encodes back to a line that decodes to the same
//! invite.

#![forbid(unsafe_code)]
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh::roster::invite::JoinInvite;

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    if let Ok(invite) = JoinInvite::decode(&text) {
        assert!(invite.admin_id().is_some());
        assert!(invite.root_key().is_some());
        assert!(invite.secret_bytes().is_some());
        assert_eq!(JoinInvite::decode(&invite.encode()), Ok(invite));
    }
});
