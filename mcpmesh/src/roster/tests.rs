use super::invite::{JoinInvite, JoinInviteError};
use super::*;

const NOW: u64 = 1_800_000_000;

fn eid() -> String {
    SecretKey::generate().public().to_string()
}

fn roster(root: &SecretKey, serial: u64) -> Roster {
    Roster {
        v: 1,
        org: "acme".into(),
        root: root.public().to_string(),
        serial,
        issued_at: NOW,
        expires_at: NOW + DEFAULT_VALIDITY_SECS,
        members: vec![
            Member {
                user: "alice".into(),
                groups: vec!["admin".into()],
                devices: vec![Device {
                    name: "laptop".into(),
                    eid: eid(),
                    addrs: vec!["127.0.0.1:4433".into()],
                    relay: None,
                }],
            },
            Member {
                user: "bob".into(),
                groups: vec!["eng".into()],
                devices: vec![
                    Device {
                        name: "desk".into(),
                        eid: eid(),
                        addrs: vec![],
                        relay: None,
                    },
                    Device {
                        name: "phone".into(),
                        eid: eid(),
                        addrs: vec![],
                        relay: None,
                    },
                ],
            },
        ],
        revoked: vec![eid()],
        removals: vec![],
    }
}

fn signed(r: Roster, root: &SecretKey) -> Vec<u8> {
    SignedRoster::sign(r, root).unwrap().text.into_bytes()
}

#[test]
fn a_signed_roster_opens_under_its_root_and_is_indexed() {
    let root = SecretKey::generate();
    let r = roster(&root, 2);
    let got = SignedRoster::accept(&signed(r.clone(), &root), &root.public(), 1, NOW).unwrap();
    assert_eq!(got.roster, r);
    let view = RosterView::new(got);
    let alice = parse_eid(&r.members[0].devices[0].eid).unwrap();
    let seat = view.seat(&alice).unwrap();
    assert_eq!(
        (seat.user.as_str(), seat.mount.as_str()),
        ("alice", "alice")
    );
    assert_eq!(seat.groups, ["admin"]);
    let phone = parse_eid(&r.members[1].devices[1].eid).unwrap();
    assert_eq!(view.seat(&phone).unwrap().mount, "bob.phone");
    assert!(view.is_revoked(&parse_eid(&r.revoked[0]).unwrap()));
    assert!(!view.is_revoked(&alice));
}

#[test]
fn every_kind_of_bad_roster_is_refused_with_its_reason() {
    let root = SecretKey::generate();
    let other = SecretKey::generate();
    let pinned = root.public();
    let good = roster(&root, 5);
    let kind = |bytes: &[u8], held: u64, now: u64| {
        SignedRoster::accept(bytes, &pinned, held, now)
            .unwrap_err()
            .kind()
    };

    // Signed by another org's root, claiming it or claiming ours.
    assert_eq!(
        kind(&signed(roster(&other, 9), &other), 1, NOW),
        "other_org"
    );
    assert_eq!(kind(&signed(good.clone(), &other), 1, NOW), "bad_signature");
    // One byte of content changed after signing.
    let tampered = String::from_utf8(signed(good.clone(), &root))
        .unwrap()
        .replacen("\"eng\"", "\"ops\"", 1);
    assert_eq!(kind(tampered.as_bytes(), 1, NOW), "bad_signature");
    // Replayed: the serial held already, or an older one.
    assert_eq!(kind(&signed(good.clone(), &root), 5, NOW), "stale");
    assert_eq!(kind(&signed(good.clone(), &root), 7, NOW), "stale");
    // Outside its window, past the skew allowed.
    let late = NOW + DEFAULT_VALIDITY_SECS + CLOCK_SKEW_SECS + 1;
    assert_eq!(kind(&signed(good.clone(), &root), 1, late), "expired");
    let early = NOW - CLOCK_SKEW_SECS - 1;
    assert_eq!(
        kind(&signed(good.clone(), &root), 1, early),
        "not_yet_valid"
    );
    // Within the skew, it is taken.
    assert!(SignedRoster::accept(&signed(good.clone(), &root), &pinned, 1, NOW - 60).is_ok());

    // An endpoint twice: two devices, or a device that is also revoked.
    let mut dup = good.clone();
    dup.members[1].devices[1].eid = dup.members[0].devices[0].eid.clone();
    assert_eq!(kind(&signed(dup, &root), 1, NOW), "invalid");
    let mut both = good.clone();
    both.revoked
        .push(both.members[0].devices[0].eid.to_uppercase());
    assert_eq!(kind(&signed(both, &root), 1, NOW), "invalid");
    // A user id that is also a group name; a bad name; a user twice.
    let mut overlap = good.clone();
    overlap.members[1].groups.push("alice".into());
    assert_eq!(kind(&signed(overlap, &root), 1, NOW), "invalid");
    let mut bad_name = good.clone();
    bad_name.members[0].user = "al ice".into();
    assert_eq!(kind(&signed(bad_name, &root), 1, NOW), "invalid");
    let mut twice = good.clone();
    twice.members[1].user = "alice".into();
    assert_eq!(kind(&signed(twice, &root), 1, NOW), "invalid");

    // Not JSON, not a roster, too big.
    assert_eq!(kind(b"{", 1, NOW), "malformed");
    assert_eq!(
        kind(br#"{"roster": 1, "sig": "00"}"#, 1, NOW),
        "bad_signature"
    );
    assert_eq!(kind(&vec![b' '; MAX_ROSTER_BYTES + 1], 1, NOW), "too_large");
}

#[test]
fn the_signature_is_over_the_canonical_form_so_key_order_and_new_fields_do_not_matter() {
    let root = SecretKey::generate();
    let mut value = serde_json::to_value(roster(&root, 3)).unwrap();
    // A field a later version adds, signed by that version.
    value["motto"] = serde_json::json!("ship it");
    let sig = root.sign(&canonical(&value).unwrap());
    let sig = data_encoding::HEXLOWER.encode(&sig.to_bytes());
    // Written with the keys in reverse order and extra spaces.
    let mut fields: Vec<(String, Value)> = value.as_object().unwrap().clone().into_iter().collect();
    fields.reverse();
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{:?} :  {}", k, v))
        .collect();
    let text = format!(
        r#"{{ "sig": "{sig}", "roster": {{ {} }} }}"#,
        body.join(" , ")
    );
    let got = SignedRoster::accept(text.as_bytes(), &root.public(), 0, NOW).unwrap();
    assert_eq!(got.roster.serial, 3);
}

#[test]
fn a_join_invite_survives_a_mail_client_and_tells_a_pairing_invite_apart() {
    let root = SecretKey::generate();
    let admin = SecretKey::generate();
    let invite = JoinInvite {
        v: 1,
        org: "acme".into(),
        root: root.public().to_string(),
        admin: admin.public().to_string(),
        addrs: vec!["127.0.0.1:1".into()],
        relay: None,
        iid: "0123456789abcdef0123456789abcdef".into(),
        secret: crate::pairing::encode_secret(&[7; 32]),
        user: "bob".into(),
        groups: vec!["eng".into()],
        exp: NOW,
    };
    let line = invite.encode();
    assert!(line.starts_with(invite::JOIN_PREFIX));
    let wrapped: String = line
        .as_bytes()
        .chunks(40)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join("\n  ");
    assert!(JoinInvite::decode(&format!("'{wrapped}'")) == Ok(invite.clone()));
    // One character changed.
    let mut damaged = line.clone().into_bytes();
    let last = damaged.len() - 3;
    damaged[last] = if damaged[last] == b'A' { b'B' } else { b'A' };
    let damaged = String::from_utf8(damaged).unwrap();
    assert!(JoinInvite::decode(&damaged) == Err(JoinInviteError::Damaged));
    let pairing = crate::pairing::encode_line(crate::pairing::INVITE_PREFIX, b"{}");
    assert!(JoinInvite::decode(&pairing) == Err(JoinInviteError::PairingInvite));
    assert!(JoinInvite::decode("hello") == Err(JoinInviteError::NotAnInvite));
}

#[test]
fn the_root_export_round_trips_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let root = SecretKey::generate();
    let signed = SignedRoster::sign(roster(&root, 4), &root).unwrap();
    let path = dir.path().join("acme-root.json");
    root::export(&path, &root, &signed).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(matches!(
        root::export(&path, &root, &signed),
        Err(root::ExportError::Exists(_))
    ));
    let (key, back) = root::import(&path).unwrap();
    assert_eq!(key.public(), root.public());
    assert_eq!(back.roster.serial, 4);
    // Neither secret appears in Debug output.
    let body: root::RootExport =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(!format!("{body:?}").contains(&body.secret));
}

#[test]
fn the_oldest_device_keeps_the_plain_mount_and_the_next_takes_it_when_it_leaves() {
    let root = SecretKey::generate();
    let r = roster(&root, 2);
    let desk = parse_eid(&r.members[1].devices[0].eid).unwrap();
    let phone = parse_eid(&r.members[1].devices[1].eid).unwrap();
    let view = RosterView::new(SignedRoster::sign(r.clone(), &root).unwrap());
    assert_eq!(view.seat(&desk).unwrap().mount, "bob");
    assert_eq!(view.seat(&phone).unwrap().mount, "bob.phone");

    let mut next = successor(&r, NOW, DEFAULT_VALIDITY_SECS);
    let gone = next.members[1].devices.remove(0);
    next.revoked.push(gone.eid);
    let view = RosterView::new(SignedRoster::sign(next, &root).unwrap());
    assert_eq!(view.seat(&phone).unwrap().mount, "bob");
}

#[test]
fn a_removal_notice_must_name_a_revoked_key_once() {
    let root = SecretKey::generate();
    let mut r = roster(&root, 3);
    let revoked = r.revoked[0].clone();
    let notice = Removal::sign("acme", &root, &revoked, "carol", "pc", 3).unwrap();
    r.removals = vec![notice.clone()];
    let view = RosterView::new(
        SignedRoster::accept(&signed(r.clone(), &root), &root.public(), 1, NOW).unwrap(),
    );
    let id = parse_eid(&revoked).unwrap();
    assert_eq!(view.removal(&id), Some(&notice));
    let member = parse_eid(&r.members[0].devices[0].eid).unwrap();
    assert_eq!(view.removal(&member), None);

    let twice = Roster {
        removals: vec![notice.clone(), notice.clone()],
        ..r.clone()
    };
    let of_a_member = Roster {
        removals: vec![Removal {
            eid: r.members[0].devices[0].eid.clone(),
            ..notice.clone()
        }],
        ..r.clone()
    };
    let from_the_future = Roster {
        removals: vec![Removal {
            serial: 4,
            ..notice.clone()
        }],
        ..r
    };
    for bad in [twice, of_a_member, from_the_future] {
        let refused = SignedRoster::accept(&signed(bad, &root), &root.public(), 1, NOW);
        assert!(
            matches!(refused, Err(RosterError::Invalid(_))),
            "{refused:?}"
        );
    }
}
