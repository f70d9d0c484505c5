//! What a call costs in datagrams between two endpoints built as the nodes build theirs: a
//! request one way and its answer the other, and the acknowledgements QUIC owes for them. The
//! transport puts an acknowledgement into a packet only when one is due, so with its default
//! (acknowledge every second packet at once) each side sent an acknowledgement-only datagram
//! every second call, waking the other side only to read it: 1.5 datagrams per call each way.
//! The endpoints ask each other to acknowledge after more packets, so a call costs each side
//! little more than its one datagram.

use std::time::Duration;

use mcpmesh_net::endpoint::{NetworkConfig, bind};
use mcpmesh_net::transport::FrameReader;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ALPN: &[u8] = b"mcpmesh-test/acks";
const WARM_UP: usize = 50;
const CALLS: usize = 400;

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Answers each line of the first stream with a line of the same length; returns the datagrams
/// this side sent while it answered the calls after the warm-up.
async fn serve(addr_tx: std::sync::mpsc::Sender<iroh::EndpointAddr>) -> Result<u64> {
    let key = iroh::SecretKey::generate();
    let book = iroh::address_lookup::MemoryLookup::new();
    let ep = bind(key, &NetworkConfig::loopback(), vec![ALPN.to_vec()], book).await?;
    addr_tx.send(ep.addr())?;
    let conn = ep.accept().await.ok_or("no connection")?.await?;
    let (mut send, recv) = conn.accept_bi().await?;
    let mut reader = FrameReader::new(recv, 1 << 16);
    let mut before = 0;
    for i in 0..WARM_UP + CALLS {
        if i == WARM_UP {
            before = conn.stats().udp_tx.datagrams;
        }
        let line = reader.next_line().await?.ok_or("the caller stopped")?;
        send.write_all(&line).await?;
        send.write_all(b"\n").await?;
    }
    let sent = conn.stats().udp_tx.datagrams - before;
    // Until the caller has read the last answer.
    let _ = reader.next_line().await;
    Ok(sent)
}

/// Makes the calls one after another; returns the datagrams this side sent for those after
/// the warm-up.
async fn call(addr: iroh::EndpointAddr) -> Result<u64> {
    let book = iroh::address_lookup::MemoryLookup::new();
    book.add_endpoint_info(addr.clone());
    let ep = bind(
        iroh::SecretKey::generate(),
        &NetworkConfig::loopback(),
        vec![],
        book,
    )
    .await?;
    let conn = ep.connect(addr, ALPN).await?;
    let (mut send, recv) = conn.open_bi().await?;
    let mut reader = FrameReader::new(recv, 1 << 16);
    let line = [&[b'x'; 199][..], b"\n"].concat();
    let mut before = 0;
    for i in 0..WARM_UP + CALLS {
        if i == WARM_UP {
            before = conn.stats().udp_tx.datagrams;
        }
        send.write_all(&line).await?;
        reader.next_line().await?.ok_or("the answer did not come")?;
    }
    let sent = conn.stats().udp_tx.datagrams - before;
    send.finish()?;
    ep.close().await;
    Ok(sent)
}

#[test]
fn a_call_costs_each_side_little_more_than_its_one_datagram() -> Result<()> {
    // Two threads with a runtime each, as two nodes are two processes: each side's transport
    // acknowledges what arrives before its own side has answered.
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || -> Result<u64> {
        runtime()?.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), serve(addr_tx)).await?
        })
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(30))?;
    let caller = runtime()?
        .block_on(async { tokio::time::timeout(Duration::from_secs(60), call(addr)).await? })?;
    let server = server.join().map_err(|_| "the serving thread panicked")??;
    // One datagram per call is the floor; an acknowledgement-only datagram after every fourth
    // packet adds a quarter; keep-alives (one a second) and a late acknowledgement or two add a
    // little. Acknowledging every second packet would be 1.5.
    for (side, sent) in [("caller", caller), ("server", server)] {
        let per_call = sent as f64 / CALLS as f64;
        assert!(
            (1.0..=1.38).contains(&per_call),
            "the {side} sent {sent} datagrams for {CALLS} calls ({per_call:.2} a call)"
        );
    }
    Ok(())
}
