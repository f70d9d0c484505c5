//! The root's word to one removed device that it was removed: a notice signed when the admin
//! removes it, carried in the roster beside the key it revokes, and the one thing of the
//! roster a member hands to a key the roster revoked.
//!
//! A removed device must learn of its removal from something it can verify under the root it
//! pinned, yet the roster itself names every member, group and address: a removed device gets
//! none of that. The notice says only what the device knows already (its org, its own key,
//! user and device name) and the serial that removed it, signed under a context of its own so
//! that it can never be taken for a roster, nor a roster for it.

use iroh::{EndpointId, PublicKey, SecretKey, Signature};
use serde::{Deserialize, Serialize};

use super::{RosterError, parse_eid};

/// What a removal notice's signature is over: this context, then its canonical form.
const REMOVAL_CONTEXT: &[u8] = b"mcpmesh removal v1\n";
/// Removals a roster carries notices for, the newest kept: a device removed longer ago than
/// that many removals is no longer told (its key stays revoked).
pub const MAX_REMOVALS: usize = 256;
/// Longest notice on the wire.
pub const MAX_NOTICE_BYTES: usize = 1024;

/// One removal as the roster carries it: the revoked key, whose device it was, the serial of
/// the roster that removed it, and the root's signature over the notice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    pub eid: String,
    pub user: String,
    pub device: String,
    pub serial: u64,
    pub sig: String,
}

/// The notice as sent to the removed device: a [`Removal`] and the org it is from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovalNotice {
    pub org: String,
    /// The root's public key (hex).
    pub root: String,
    pub eid: String,
    pub user: String,
    pub device: String,
    pub serial: u64,
    pub sig: String,
}

/// The fields signed, in their canonical form.
#[derive(Serialize)]
struct Signed<'a> {
    org: &'a str,
    root: &'a str,
    eid: &'a str,
    user: &'a str,
    device: &'a str,
    serial: u64,
}

fn message(s: &Signed<'_>) -> Result<Vec<u8>, RosterError> {
    let mut bytes = REMOVAL_CONTEXT.to_vec();
    bytes.extend(serde_jcs::to_vec(s).map_err(|e| RosterError::Malformed(e.to_string()))?);
    Ok(bytes)
}

impl Removal {
    /// Signs the removal of `eid` (`user`'s device `device`) from `org` by roster `serial`.
    pub fn sign(
        org: &str,
        root: &SecretKey,
        eid: &str,
        user: &str,
        device: &str,
        serial: u64,
    ) -> Result<Self, RosterError> {
        let root_hex = root.public().to_string();
        let sig = root.sign(&message(&Signed {
            org,
            root: &root_hex,
            eid,
            user,
            device,
            serial,
        })?);
        Ok(Removal {
            eid: eid.to_owned(),
            user: user.to_owned(),
            device: device.to_owned(),
            serial,
            sig: data_encoding::HEXLOWER.encode(&sig.to_bytes()),
        })
    }

    /// The notice for the removed device, from a roster of `org` under `root` (hex).
    pub fn notice(&self, org: &str, root: &str) -> RemovalNotice {
        RemovalNotice {
            org: org.to_owned(),
            root: root.to_owned(),
            eid: self.eid.clone(),
            user: self.user.clone(),
            device: self.device.clone(),
            serial: self.serial,
            sig: self.sig.clone(),
        }
    }
}

impl RemovalNotice {
    /// Checks a notice as a device receives it: signed by the pinned `root`, about `me`, and
    /// newer than the roster `held` (a removal undone since, by a readmission, is no news).
    pub fn check(&self, root: &PublicKey, me: &EndpointId, held: u64) -> Result<(), RosterError> {
        if !self.root.eq_ignore_ascii_case(&root.to_string()) {
            return Err(RosterError::OtherOrg(self.root.chars().take(16).collect()));
        }
        if parse_eid(&self.eid).as_ref() != Some(me) {
            return Err(RosterError::Invalid(
                "the notice is about another device".into(),
            ));
        }
        let sig: [u8; 64] = data_encoding::HEXLOWER_PERMISSIVE
            .decode(self.sig.as_bytes())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(RosterError::BadSignature)?;
        let root_hex = root.to_string();
        let signed = message(&Signed {
            org: &self.org,
            root: &root_hex,
            eid: &self.eid,
            user: &self.user,
            device: &self.device,
            serial: self.serial,
        })?;
        root.verify(&signed, &Signature::from_bytes(&sig))
            .map_err(|_| RosterError::BadSignature)?;
        if self.serial <= held {
            return Err(RosterError::Stale {
                serial: self.serial,
                held,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_opens_only_for_its_device_under_its_root_and_when_newer() {
        let root = SecretKey::generate();
        let me = SecretKey::generate().public();
        let other = SecretKey::generate().public();
        let r = Removal::sign("acme", &root, &me.to_string(), "bob", "laptop", 7).unwrap();
        let notice = r.notice("acme", &root.public().to_string());
        assert_eq!(notice.check(&root.public(), &me, 6), Ok(()));
        // A removal the device's roster is past (it was readmitted since) is no news.
        assert!(matches!(
            notice.check(&root.public(), &me, 7),
            Err(RosterError::Stale { .. })
        ));
        assert!(matches!(
            notice.check(&root.public(), &other, 6),
            Err(RosterError::Invalid(_))
        ));
        let foreign = SecretKey::generate().public();
        assert!(matches!(
            notice.check(&foreign, &me, 6),
            Err(RosterError::OtherOrg(_))
        ));
        // Every signed field is bound: a changed serial, user or org no longer verifies.
        for altered in [
            RemovalNotice {
                serial: 9,
                ..notice.clone()
            },
            RemovalNotice {
                user: "carol".into(),
                ..notice.clone()
            },
            RemovalNotice {
                org: "evil".into(),
                ..notice.clone()
            },
        ] {
            assert_eq!(
                altered.check(&root.public(), &me, 6),
                Err(RosterError::BadSignature)
            );
        }
    }
}
