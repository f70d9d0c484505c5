//! Whether the network servers a node is configured with answer: its relays, its team's pkarr
//! relay and DNS zone. `doctor` reports each as reachable or not, with the error; nothing here
//! changes how the node itself connects.

use std::net::SocketAddr;
use std::time::Duration;

use iroh::dns::{DnsError, DnsResolver, NameserverConfig};
use mcpmesh_net::endpoint::{NetworkConfig, RelayPolicy};

/// How long one server may take to answer a check.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// One server's answer (or its silence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reachability {
    /// What was checked: `relay http://…`, `pkarr relay http://…`, `dns zone example.org`.
    pub server: String,
    /// `Ok(what answered)` or `Err(why nothing did)`.
    pub outcome: Result<String, String>,
}

/// Checks every self-hosted relay and discovery server in `network`, concurrently. Hermetic
/// and default (public) setups have none: the answer is empty.
pub async fn check(network: &NetworkConfig) -> Vec<Reachability> {
    let mut checks = tokio::task::JoinSet::new();
    let mut order = Vec::new();
    if let RelayPolicy::Custom(urls) = &network.relay {
        for url in urls {
            let mut ping: url::Url = (**url).clone();
            ping.set_path("/ping");
            let server = format!("relay {url}");
            order.push(server.clone());
            checks.spawn(async move { (server, http_get(ping).await) });
        }
    }
    if network.relay != RelayPolicy::Disabled {
        if let Some(url) = &network.discovery.pkarr_relay {
            let server = format!("pkarr relay {url}");
            order.push(server.clone());
            let url = url.clone();
            checks.spawn(async move { (server, http_get(url).await) });
        }
        if let Some(origin) = &network.discovery.dns_origin {
            let nameserver = network.discovery.dns_nameserver;
            let server = match nameserver {
                Some(ns) => format!("dns zone {origin} at {ns}"),
                None => format!("dns zone {origin}"),
            };
            order.push(server.clone());
            let origin = origin.clone();
            checks.spawn(async move { (server, dns_query(origin, nameserver).await) });
        }
    }
    let mut done: Vec<Reachability> = checks
        .join_all()
        .await
        .into_iter()
        .map(|(server, outcome)| Reachability { server, outcome })
        .collect();
    done.sort_by_key(|r| order.iter().position(|s| *s == r.server));
    done
}

/// Any HTTP answer means the server is there; only its absence is a failure.
async fn http_get(url: url::Url) -> Result<String, String> {
    let client = crate::backends::url::client()?;
    let response = client
        .get(url)
        .timeout(CHECK_TIMEOUT)
        .send()
        .await
        .map_err(|e| describe(&e))?;
    Ok(format!("answers (HTTP {})", response.status().as_u16()))
}

/// reqwest's error with its causes, which say what actually failed (refused, timed out, TLS).
fn describe(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Asks for the zone's own TXT record: an answer, an empty answer or "no such name" all come
/// from a server that serves the zone; only a timeout or no response means none does.
async fn dns_query(origin: String, nameserver: Option<SocketAddr>) -> Result<String, String> {
    let resolver = match nameserver {
        Some(ns) => DnsResolver::builder()
            .add_nameserver_config(NameserverConfig::udp(ns.ip()).with_port(ns.port()))
            .disable_fallback()
            .build(),
        None => DnsResolver::new(),
    };
    match resolver.lookup_txt(origin, CHECK_TIMEOUT).await {
        Ok(_) => Ok("answers".into()),
        Err(DnsError::NxDomain { .. }) => Ok("answers (no such name at the origin)".into()),
        Err(e @ (DnsError::Timeout { .. } | DnsError::NoResponse { .. })) => Err(e.to_string()),
        Err(e) => {
            let message = describe(&e);
            if message.contains("no record") {
                Ok("answers (no record at the origin)".into())
            } else {
                Err(message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcpmesh_net::endpoint::Discovery;

    fn network(relay: RelayPolicy, discovery: Discovery) -> NetworkConfig {
        NetworkConfig {
            relay,
            bind: Vec::new(),
            discovery,
        }
    }

    #[tokio::test]
    async fn hermetic_and_public_setups_have_nothing_to_ask() {
        let teams = Discovery {
            pkarr_relay: Some("http://127.0.0.1:9/pkarr".parse().unwrap()),
            dns_origin: Some("dns.example.org".into()),
            dns_nameserver: Some("127.0.0.1:9".parse().unwrap()),
        };
        assert!(
            check(&network(RelayPolicy::Disabled, teams))
                .await
                .is_empty()
        );
        let public = network(RelayPolicy::Default, Discovery::default());
        assert!(check(&public).await.is_empty());
    }

    #[tokio::test]
    async fn a_server_that_is_gone_is_reported_with_the_error_and_one_that_answers_is_not() {
        let listening = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone_at = gone.local_addr().unwrap();
        drop(gone);
        let here = listening.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut s, _)) = listening.accept().await {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let relays = [here, gone_at].map(|a| format!("http://{a}").parse().unwrap());
        let checks = check(&network(
            RelayPolicy::Custom(relays.to_vec()),
            Discovery::default(),
        ))
        .await;
        assert_eq!(checks.len(), 2, "{checks:?}");
        assert_eq!(checks[0].server, format!("relay http://{here}/"));
        assert_eq!(checks[0].outcome, Ok("answers (HTTP 200)".into()));
        let why = checks[1].outcome.clone().unwrap_err();
        assert!(why.contains("refused"), "{why}");
    }
}
