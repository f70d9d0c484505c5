//! The signed roster reader: any bytes are opened or refused under the pinned root, never a
//! panic, and `accept` is exactly `open` then `check_fresh`. A roster that opens signs again
//! to one that opens equal, and indexes into one seat per device, each mounted by a valid name.

#![forbid(unsafe_code)]
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh::roster::{RosterView, SignedRoster};
use mcpmesh_net::SecretKey;
use mcpmesh_net::session::valid_service_name;

/// The root the seeds in `seeds/roster/` are signed with: a fixed key, so seeds (and their
/// mutations that keep the canonical form) verify and the fuzzer reaches the checks past the
/// signature.
const ROOT_SECRET: [u8; 32] = [0x5a; 32];
/// The serial held and the clock `accept` runs at; the seeds are fresh there.
const HELD: u64 = 1;
const NOW: u64 = 1_800_000_000;

fuzz_target!(|bytes: &[u8]| {
    let root = SecretKey::from_bytes(&ROOT_SECRET);
    let pinned = root.public();
    let opened = SignedRoster::open(bytes, &pinned);
    let fresh = opened
        .clone()
        .and_then(|s| s.check_fresh(HELD, NOW).map(|()| s));
    assert_eq!(SignedRoster::accept(bytes, &pinned, HELD, NOW), fresh);
    let Ok(signed) = opened else {
        return;
    };
    let again = SignedRoster::sign(signed.roster.clone(), &root).expect("an opened roster signs");
    assert_eq!(
        SignedRoster::open(again.text.as_bytes(), &pinned).map(|s| s.roster),
        Ok(signed.roster.clone())
    );
    let devices: usize = signed.roster.members.iter().map(|m| m.devices.len()).sum();
    let view = RosterView::new(signed);
    let seats = view.seats();
    assert_eq!(seats.len(), devices);
    for seat in seats {
        assert!(valid_service_name(&seat.mount), "mount {:?}", seat.mount);
        assert!(!view.is_revoked(&seat.id));
    }
});
