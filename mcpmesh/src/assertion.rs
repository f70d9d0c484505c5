//! The signed caller assertion: a compact JWS (EdDSA over the node's own key) that tells a
//! `url` service who is calling, in a form it can verify against the node's JWKS
//! (`mcpmesh id --jwks`) instead of trusting what `_meta` says.
//!
//! A session mints one when it starts and again at half its lifetime, so signing stays off
//! the per-call path and a group change reaches the server within half a lifetime. The JOSE
//! encoding is `jsonwebtoken`'s; the signing behind it is a provider of ours over the
//! `ed25519-dalek` iroh already links (and `p256`, for the ES256 client assertions of an OAuth
//! client registered with a P-256 key), because the crate's own backends bring RSA code (and
//! its advisories) this node never uses.
//!
//! [`client_assertion`] signs the other JWT the node makes: its `private_key_jwt`
//! authentication (RFC 7523) at an authorization server's token endpoint.

use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ed25519_dalek::pkcs8::{self, DecodePrivateKey, EncodePrivateKey};
use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{
    AlgorithmParameters, CommonParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm,
    OctetKeyPairParameters, OctetKeyPairType, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header};
use serde::{Deserialize, Serialize};

use crate::principal::{Held, Principal};

/// The header a `url` service gets the assertion in, unless its config names another.
pub const DEFAULT_HEADER: &str = "Mcpmesh-Caller";
/// How long an assertion is valid; sessions mint the next one at half of it.
pub const LIFETIME: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum AssertionError {
    #[error("the node key cannot sign assertions: {0}")]
    Key(String),
    #[error("cannot sign the caller assertion: {0}")]
    Sign(String),
}

/// What an assertion says. Optional members are left out when the node does not know them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The serving node, `eid:HEX`.
    pub iss: String,
    /// The caller's device key, `eid:HEX`.
    pub sub: String,
    /// The service URL exactly as configured, so two services on one host are told apart.
    pub aud: String,
    /// The name this node gave the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org: Option<String>,
    pub service: String,
    pub iat: u64,
    pub exp: u64,
    /// Unique per assertion (128 random bits), for servers that keep a replay cache.
    pub jti: String,
}

/// Who a session's assertion is about, read when it is minted.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub endpoint: &'a [u8; 32],
    /// The caller's principals as they are now (groups follow a roster change).
    pub held: &'a [Principal],
    pub service: &'a str,
    /// The service URL as configured.
    pub audience: &'a str,
}

/// An assertion and when the session should mint the next one.
#[derive(Debug, Clone)]
pub struct Minted {
    pub token: String,
    pub renew_at: Instant,
}

/// Mints assertions with the node's key.
pub struct Issuer {
    key: EncodingKey,
    kid: String,
    iss: String,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Issuer").field("kid", &self.kid).finish()
    }
}

impl Issuer {
    pub fn new(secret: &iroh::SecretKey) -> Result<Self, AssertionError> {
        install_provider();
        let signing = ed25519_dalek::SigningKey::from_bytes(&secret.to_bytes());
        let der = signing
            .to_pkcs8_der()
            .map_err(|e| AssertionError::Key(e.to_string()))?;
        let public = secret.public();
        Ok(Issuer {
            key: EncodingKey::from_ed_der(der.as_bytes()),
            kid: key_id(&public),
            iss: eid(public.as_bytes()),
        })
    }

    pub fn mint(&self, caller: Caller<'_>) -> Result<Minted, AssertionError> {
        let iat = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| AssertionError::Sign(e.to_string()))?
            .as_secs();
        let mut jti = [0u8; 16];
        getrandom::fill(&mut jti).map_err(|e| AssertionError::Sign(e.to_string()))?;
        let mut claims = Claims {
            iss: self.iss.clone(),
            sub: eid(caller.endpoint),
            aud: caller.audience.to_owned(),
            peer: None,
            user: None,
            groups: Vec::new(),
            org: None,
            service: caller.service.to_owned(),
            iat,
            exp: iat + LIFETIME.as_secs(),
            jti: data_encoding::BASE64URL_NOPAD.encode(&jti),
        };
        for principal in caller.held {
            match principal {
                Principal::Peer(name) if claims.peer.is_none() => claims.peer = Some(name.clone()),
                Principal::User(user) if claims.user.is_none() => claims.user = Some(user.clone()),
                Principal::Group(group) => claims.groups.push(group.clone()),
                Principal::Org(org) if claims.org.is_none() => claims.org = Some(org.clone()),
                _ => {}
            }
        }
        Ok(Minted {
            token: self.sign(&claims)?,
            renew_at: Instant::now() + LIFETIME / 2,
        })
    }

    /// `claims` signed as they are, under this node's `kid` (a session's are made by
    /// [`Issuer::mint`]; tests forge others with it).
    pub fn sign(&self, claims: &Claims) -> Result<String, AssertionError> {
        let mut header = Header::new(Algorithm::EdDSA);
        header.typ = Some("JWT".to_owned());
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.key)
            .map_err(|e| AssertionError::Sign(e.to_string()))
    }
}

/// One session's assertion: minted when first asked for and again once half its lifetime has
/// passed, from the caller's principals as they are then (a group change reaches the server
/// with the next one).
pub struct SessionAssertion {
    issuer: Arc<Issuer>,
    audience: String,
    service: String,
    endpoint: [u8; 32],
    held: Held,
    current: Mutex<Option<(Arc<str>, Instant)>>,
}

impl std::fmt::Debug for SessionAssertion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("SessionAssertion")
            .field("audience", &self.audience)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl SessionAssertion {
    pub fn new(
        issuer: Arc<Issuer>,
        audience: String,
        service: String,
        endpoint: [u8; 32],
        held: Held,
    ) -> Self {
        SessionAssertion {
            issuer,
            audience,
            service,
            endpoint,
            held,
            current: Mutex::new(None),
        }
    }

    /// The assertion to send now. `None` only when signing failed (logged): the request goes
    /// without one, and a server that requires it refuses.
    pub fn token(&self) -> Option<Arc<str>> {
        self.token_at(Instant::now())
    }

    fn token_at(&self, now: Instant) -> Option<Arc<str>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((token, renew_at)) = current.as_ref()
            && now < *renew_at
        {
            return Some(token.clone());
        }
        let held = self.held.current();
        let minted = self.issuer.mint(Caller {
            endpoint: &self.endpoint,
            held: &held,
            service: &self.service,
            audience: &self.audience,
        });
        match minted {
            Ok(minted) => {
                let token: Arc<str> = minted.token.into();
                *current = Some((token.clone(), minted.renew_at));
                Some(token)
            }
            Err(e) => {
                tracing::warn!(service = %self.service, "{e}");
                None
            }
        }
    }
}

/// The JWKS a server pins to verify this node's assertions: its one public key.
pub fn jwks(public: &iroh::PublicKey) -> JwkSet {
    JwkSet {
        keys: vec![Jwk {
            common: CommonParameters {
                public_key_use: Some(PublicKeyUse::Signature),
                key_algorithm: Some(KeyAlgorithm::EdDSA),
                key_id: Some(key_id(public)),
                ..Default::default()
            },
            algorithm: AlgorithmParameters::OctetKeyPair(OctetKeyPairParameters {
                key_type: OctetKeyPairType::OctetKeyPair,
                curve: EllipticCurve::Ed25519,
                x: data_encoding::BASE64URL_NOPAD.encode(public.as_bytes()),
            }),
        }],
    }
}

/// [`jwks`] of the node whose endpoint id is `id` (hex, as `mcpmesh id` prints it).
pub fn jwks_of(id: &str) -> Option<JwkSet> {
    id.parse::<iroh::PublicKey>().ok().map(|key| jwks(&key))
}

/// Verifies `token` against `public` for `audience` and returns what it says (for the node's
/// own checks and tests; servers use their own JOSE library).
pub fn verify(
    token: &str,
    public: &iroh::PublicKey,
    audience: &str,
) -> Result<Claims, jsonwebtoken::errors::Error> {
    install_provider();
    let key =
        DecodingKey::from_ed_components(&data_encoding::BASE64URL_NOPAD.encode(public.as_bytes()))?;
    let mut validation = jsonwebtoken::Validation::new(Algorithm::EdDSA);
    validation.set_audience(&[audience]);
    validation.set_required_spec_claims(&["exp", "iat", "aud", "iss", "sub"]);
    validation.set_issuer(&[eid(public.as_bytes())]);
    Ok(jsonwebtoken::decode::<Claims>(token, &key, &validation)?.claims)
}

/// The key's id in the JWKS: the endpoint id in hex, which is the key itself, so a server can
/// match `kid` against `iss` too.
pub fn key_id(public: &iroh::PublicKey) -> String {
    data_encoding::HEXLOWER.encode(public.as_bytes())
}

fn eid(key: &[u8; 32]) -> String {
    format!("eid:{}", data_encoding::HEXLOWER.encode(key))
}

/// Makes our EdDSA-only provider the process's, once. Another provider installed first (by
/// an application linking this library) is used as it is: any correct one signs the same.
fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = PROVIDER.install_default();
    });
}

static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: signer_for,
    verifier_factory: verifier_for,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(ErrorKind::InvalidAlgorithm.into()),
        rsa_pub_components_from_public_key: |_| Err(ErrorKind::InvalidAlgorithm.into()),
        ec_pub_components_from_private_key: |_, _| Err(ErrorKind::InvalidAlgorithm.into()),
        ed_pub_components_from_private_key: |der, _| {
            let key = ed25519_dalek::SigningKey::from_pkcs8_der(der)
                .map_err(|_| ErrorKind::InvalidEddsaKey)?;
            Ok(key.verifying_key().to_bytes().to_vec())
        },
        compute_digest: |_, _| Err(ErrorKind::InvalidAlgorithm.into()),
    },
};

struct EdSigner(ed25519_dalek::SigningKey);

impl signature::Signer<Vec<u8>> for EdSigner {
    fn try_sign(&self, msg: &[u8]) -> Result<Vec<u8>, signature::Error> {
        Ok(self.0.sign(msg).to_bytes().to_vec())
    }
}

impl JwtSigner for EdSigner {
    fn algorithm(&self) -> Algorithm {
        Algorithm::EdDSA
    }
}

struct EdVerifier(ed25519_dalek::VerifyingKey);

impl signature::Verifier<Vec<u8>> for EdVerifier {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> Result<(), signature::Error> {
        let signature = ed25519_dalek::Signature::from_slice(signature)?;
        self.0.verify_strict(msg, &signature)
    }
}

impl JwtVerifier for EdVerifier {
    fn algorithm(&self) -> Algorithm {
        Algorithm::EdDSA
    }
}

struct EsSigner(p256::ecdsa::SigningKey);

impl signature::Signer<Vec<u8>> for EsSigner {
    fn try_sign(&self, msg: &[u8]) -> Result<Vec<u8>, signature::Error> {
        let signature: p256::ecdsa::Signature = self.0.try_sign(msg)?;
        Ok(signature.to_bytes().to_vec())
    }
}

impl JwtSigner for EsSigner {
    fn algorithm(&self) -> Algorithm {
        Algorithm::ES256
    }
}

fn signer_for(
    algorithm: &Algorithm,
    key: &EncodingKey,
) -> jsonwebtoken::errors::Result<Box<dyn JwtSigner>> {
    match algorithm {
        Algorithm::EdDSA => {
            let key = ed25519_dalek::SigningKey::from_pkcs8_der(key.as_bytes())
                .map_err(|_| ErrorKind::InvalidEddsaKey)?;
            Ok(Box::new(EdSigner(key)))
        }
        Algorithm::ES256 => {
            let key = p256::ecdsa::SigningKey::from_pkcs8_der(key.as_bytes())
                .map_err(|_| ErrorKind::InvalidEcdsaKey)?;
            Ok(Box::new(EsSigner(key)))
        }
        _ => Err(ErrorKind::InvalidAlgorithm.into()),
    }
}

/// How long a client assertion is good for: one token request.
const CLIENT_ASSERTION_FOR: u64 = 60;

/// A `private_key_jwt` client assertion (RFC 7523 §2.2): `iss` and `sub` the client id, `aud`
/// the authorization server's issuer, a minute's lifetime and a unique `jti`, signed with the
/// PKCS#8 PEM `key` — P-256 (ES256) or Ed25519 (EdDSA).
pub fn client_assertion(
    key: &[u8],
    client_id: &str,
    audience: &str,
) -> Result<String, AssertionError> {
    install_provider();
    let pem = std::str::from_utf8(key).map_err(|_| AssertionError::Key("not a PEM file".into()))?;
    let der_of = |der: Result<pkcs8::SecretDocument, pkcs8::Error>| {
        der.map_err(|e| AssertionError::Key(e.to_string()))
    };
    let (algorithm, key) = if let Ok(k) = p256::ecdsa::SigningKey::from_pkcs8_pem(pem) {
        let der = der_of(k.to_pkcs8_der())?;
        (Algorithm::ES256, EncodingKey::from_ec_der(der.as_bytes()))
    } else if let Ok(k) = ed25519_dalek::SigningKey::from_pkcs8_pem(pem) {
        let der = der_of(k.to_pkcs8_der())?;
        (Algorithm::EdDSA, EncodingKey::from_ed_der(der.as_bytes()))
    } else {
        return Err(AssertionError::Key(
            "expected a PKCS#8 PEM private key, P-256 (ES256) or Ed25519 (EdDSA)".into(),
        ));
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| AssertionError::Sign(e.to_string()))?
        .as_secs();
    let mut jti = [0u8; 16];
    getrandom::fill(&mut jti).map_err(|e| AssertionError::Sign(e.to_string()))?;
    let claims = serde_json::json!({
        "iss": client_id, "sub": client_id, "aud": audience,
        "iat": now, "exp": now + CLIENT_ASSERTION_FOR,
        "jti": data_encoding::BASE64URL_NOPAD.encode(&jti),
    });
    jsonwebtoken::encode(&Header::new(algorithm), &claims, &key)
        .map_err(|e| AssertionError::Sign(e.to_string()))
}

fn verifier_for(
    algorithm: &Algorithm,
    key: &DecodingKey,
) -> jsonwebtoken::errors::Result<Box<dyn JwtVerifier>> {
    if *algorithm != Algorithm::EdDSA {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    let bytes: [u8; 32] = key
        .try_get_as_bytes()?
        .try_into()
        .map_err(|_| ErrorKind::InvalidEddsaKey)?;
    let key =
        ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| ErrorKind::InvalidEddsaKey)?;
    Ok(Box::new(EdVerifier(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller<'a>(held: &'a [Principal], endpoint: &'a [u8; 32]) -> Caller<'a> {
        Caller {
            endpoint,
            held,
            service: "notes",
            audience: "http://127.0.0.1:9/mcp",
        }
    }

    #[test]
    fn a_client_assertion_is_signed_es256_or_eddsa_for_the_authorization_server() {
        use p256::pkcs8::{EncodePrivateKey as _, LineEnding};
        use signature::Verifier as _;
        let parts = |jwt: &str| -> (serde_json::Value, serde_json::Value, Vec<u8>, String) {
            let mut it = jwt.split('.');
            let (h, p, sig) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
            let json = |part: &str| {
                serde_json::from_slice(
                    &data_encoding::BASE64URL_NOPAD
                        .decode(part.as_bytes())
                        .unwrap(),
                )
                .unwrap()
            };
            let sig = data_encoding::BASE64URL_NOPAD
                .decode(sig.as_bytes())
                .unwrap();
            (json(h), json(p), sig, format!("{h}.{p}"))
        };
        let es = p256::ecdsa::SigningKey::from_slice(&[9u8; 32]).unwrap();
        let pem = es.to_pkcs8_pem(LineEnding::LF).unwrap();
        let jwt = client_assertion(pem.as_bytes(), "client-1", "http://127.0.0.1:8").unwrap();
        let (header, claims, sig, signed) = parts(&jwt);
        assert_eq!(header["alg"], "ES256");
        assert_eq!(claims["iss"], "client-1");
        assert_eq!(claims["sub"], "client-1");
        assert_eq!(claims["aud"], "http://127.0.0.1:8");
        assert_eq!(
            claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
            60
        );
        let sig = p256::ecdsa::Signature::from_slice(&sig).unwrap();
        es.verifying_key().verify(signed.as_bytes(), &sig).unwrap();
        let again = client_assertion(pem.as_bytes(), "client-1", "http://127.0.0.1:8").unwrap();
        assert_ne!(parts(&again).1["jti"], claims["jti"], "a unique jti");

        let ed = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]);
        let pem = ed
            .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .unwrap();
        let jwt = client_assertion(pem.as_bytes(), "client-2", "http://as").unwrap();
        let (header, claims, sig, signed) = parts(&jwt);
        assert_eq!(header["alg"], "EdDSA");
        assert_eq!(claims["iss"], "client-2");
        let sig = ed25519_dalek::Signature::from_slice(&sig).unwrap();
        ed.verifying_key()
            .verify_strict(signed.as_bytes(), &sig)
            .unwrap();

        for bad in [
            &b"not a key"[..],
            b"\xff\xfe",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        ] {
            let e = client_assertion(bad, "c", "a").unwrap_err();
            assert!(matches!(e, AssertionError::Key(_)), "{e}");
        }
    }

    #[test]
    fn an_assertion_says_who_calls_and_verifies_against_the_nodes_key() {
        let node = iroh::SecretKey::generate();
        let issuer = Issuer::new(&node).unwrap();
        let bob = [7u8; 32];
        let held = vec![
            Principal::Eid(bob),
            Principal::Peer("bob".into()),
            Principal::User("bob".into()),
            Principal::Group("eng".into()),
            Principal::Group("ops".into()),
            Principal::Org("acme".into()),
        ];
        let minted = issuer.mint(caller(&held, &bob)).unwrap();
        let header = jsonwebtoken::decode_header(&minted.token).unwrap();
        assert_eq!(header.alg, Algorithm::EdDSA);
        assert_eq!(header.kid.as_deref(), Some(key_id(&node.public()).as_str()));
        let claims = verify(&minted.token, &node.public(), "http://127.0.0.1:9/mcp").unwrap();
        assert_eq!(claims.sub, format!("eid:{}", "07".repeat(32)));
        assert_eq!(claims.iss, format!("eid:{}", key_id(&node.public())));
        assert_eq!(claims.peer.as_deref(), Some("bob"));
        assert_eq!(claims.user.as_deref(), Some("bob"));
        assert_eq!(claims.groups, ["eng", "ops"]);
        assert_eq!(claims.org.as_deref(), Some("acme"));
        assert_eq!(claims.service, "notes");
        assert_eq!(claims.exp - claims.iat, LIFETIME.as_secs());
        let again = issuer.mint(caller(&held, &bob)).unwrap();
        let other = verify(&again.token, &node.public(), "http://127.0.0.1:9/mcp").unwrap();
        assert_ne!(claims.jti, other.jti, "every assertion has its own id");
    }

    #[test]
    fn an_assertion_is_refused_for_another_audience_another_key_or_a_changed_byte() {
        let node = iroh::SecretKey::generate();
        let issuer = Issuer::new(&node).unwrap();
        let bob = [7u8; 32];
        let held = vec![Principal::Peer("bob".into())];
        let token = issuer.mint(caller(&held, &bob)).unwrap().token;
        assert!(verify(&token, &node.public(), "http://127.0.0.1:9/other").is_err());
        let stranger = iroh::SecretKey::generate().public();
        assert!(verify(&token, &stranger, "http://127.0.0.1:9/mcp").is_err());
        // Claims rewritten (another caller), signature kept.
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let claims = data_encoding::BASE64URL_NOPAD
            .decode(parts[1].as_bytes())
            .unwrap();
        let forged = String::from_utf8(claims)
            .unwrap()
            .replace(&"07".repeat(32), &"08".repeat(32));
        parts[1] = data_encoding::BASE64URL_NOPAD.encode(forged.as_bytes());
        assert!(verify(&parts.join("."), &node.public(), "http://127.0.0.1:9/mcp").is_err());
    }

    /// A peer table with one caller whose groups a test changes.
    #[derive(Debug)]
    struct Table(Mutex<Vec<Principal>>);

    impl crate::principal::PrincipalSource for Table {
        fn principals_of(&self, _: &[u8; 32]) -> Option<Arc<[Principal]>> {
            Some(self.0.lock().unwrap().clone().into())
        }
    }

    #[test]
    fn a_session_keeps_its_assertion_until_half_its_lifetime_then_mints_one_with_the_groups_of_now()
    {
        let node = iroh::SecretKey::generate();
        let table = Arc::new(Table(Mutex::new(vec![
            Principal::Peer("bob".into()),
            Principal::Group("eng".into()),
        ])));
        let audience = "http://127.0.0.1:9/mcp";
        let session = SessionAssertion::new(
            Arc::new(Issuer::new(&node).unwrap()),
            audience.into(),
            "notes".into(),
            [7; 32],
            Held::live(table.clone(), [7; 32]),
        );
        let claims = |token: Arc<str>| verify(&token, &node.public(), audience).unwrap();
        let start = Instant::now();
        let first = session.token_at(start).unwrap();
        *table.0.lock().unwrap() = vec![
            Principal::Peer("bob".into()),
            Principal::Group("sales".into()),
        ];
        let later = start + LIFETIME / 2 - Duration::from_secs(1);
        assert_eq!(
            session.token_at(later).unwrap(),
            first,
            "not minted per call"
        );
        let renewed = session
            .token_at(start + LIFETIME / 2 + Duration::from_secs(1))
            .unwrap();
        assert_ne!(renewed, first);
        assert_eq!(claims(first).groups, ["eng"]);
        let renewed = claims(renewed);
        assert_eq!(renewed.groups, ["sales"]);
        assert_eq!(renewed.peer.as_deref(), Some("bob"));
        assert_eq!(renewed.service, "notes");
    }

    #[test]
    fn the_jwks_names_the_one_public_key() {
        let node = iroh::SecretKey::generate();
        let doc = serde_json::to_value(jwks(&node.public())).unwrap();
        let key = &doc["keys"][0];
        assert_eq!(key["kty"], "OKP");
        assert_eq!(key["crv"], "Ed25519");
        assert_eq!(key["alg"], "EdDSA");
        assert_eq!(key["kid"], key_id(&node.public()));
        let x = data_encoding::BASE64URL_NOPAD
            .decode(key["x"].as_str().unwrap().as_bytes())
            .unwrap();
        assert_eq!(x, node.public().as_bytes());
        assert_eq!(doc["keys"].as_array().unwrap().len(), 1);
    }
}
